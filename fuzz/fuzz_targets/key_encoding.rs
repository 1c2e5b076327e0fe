//! The store-key encoding: arbitrary bytes never panic `IpKey::decode`, every
//! decodable key re-encodes to the same bytes, and every address round-trips.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use ratelimit_fuzz::client_ip::{ClientIp, IpKey, key_bytes};

fuzz_target!(|data: &[u8]| {
    // Decoding is exact: a key decodes only if it is the encoding of that address.
    if let Some(ip) = IpKey::decode(data) {
        assert_eq!(&*key_bytes(ip), data);
    }

    // Encoding round-trips, and the two families never share a key.
    let mut octets = [0u8; 16];
    let n = data.len().min(16);
    octets[..n].copy_from_slice(&data[..n]);
    let v6 = IpAddr::V6(Ipv6Addr::from(octets));
    let v4 = IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]));
    for ip in [v4, v6] {
        let key = key_bytes(ip);
        assert_eq!(IpKey::decode(&key), Some(ip.to_canonical()));
        assert_eq!(key.ip(), ip.to_canonical());
        assert_eq!(key.len(), if ip.to_canonical().is_ipv4() { 5 } else { 17 });
    }
    if v6.to_canonical().is_ipv6() {
        assert_ne!(key_bytes(v4), key_bytes(v6));
    }

    // Grouping by any valid prefix is idempotent and keeps the family, except that an address
    // of the NAT64 well-known prefix (64:ff9b::/96) is grouped as the IPv4 address it carries.
    let v4_len = data.get(16).map_or(32, |b| b % 33);
    let v6_len = data.get(17).map_or(64, |b| b % 129);
    let c = ClientIp::peer()
        .ipv4_prefix(v4_len)
        .and_then(|c| c.ipv6_prefix(v6_len))
        .expect("prefixes in range");
    for ip in [v4, v6] {
        let masked = c.mask(ip);
        // Idempotent, but for a group that falls in the NAT64 `/96` from outside it (see
        // `ClientIp::mask`).
        if !lands_in_nat64(masked) {
            assert_eq!(c.mask(masked), masked);
        }
        let nat64 = match ip {
            IpAddr::V6(a) => u128::from(a) >> 32 == 0x0064_ff9b_0000_0000_0000_0000,
            IpAddr::V4(_) => false,
        };
        assert_eq!(masked.is_ipv4(), ip.to_canonical().is_ipv4() || nat64);
        if nat64 {
            let carried = Ipv4Addr::from(u128::from(octets_of(ip)) as u32);
            assert_eq!(masked, c.mask(IpAddr::V4(carried)));
        }
    }
});

fn octets_of(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

/// Whether `ip` is an IPv6 address of the NAT64 well-known prefix `64:ff9b::/96`: as a group that
/// `ClientIp::mask` made from an address outside it, the one that masking again changes (see
/// there).
fn lands_in_nat64(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if u128::from(v6) >> 32 == 0x0064_ff9b_0000_0000_0000_0000)
}
