//! Arbitrary bytes as `X-Forwarded-For` and `Forwarded` header lines, resolved
//! from a trusted and from an untrusted peer, under every header setting.
//!
//! Input layout: byte 0 picks `max_hops` (0 to 63) and the IPv6 prefix,
//! the rest is split on `\n` into header lines. Lines that `http` refuses as
//! header values (control characters) cannot arrive from the network and are
//! skipped. The last line, with a proxy's element appended, must resolve to the address in
//! that element (with `max_hops` of 2 or more).
#![no_main]

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use ratelimit_fuzz::client_ip::{ClientIp, ForwardedHeader};

fuzz_target!(|data: &[u8]| {
    let Some((&config, rest)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    for line in rest.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(HeaderName::from_static("x-forwarded-for"), value.clone());
            headers.append(http::header::FORWARDED, value);
        }
    }
    let base =
        ClientIp::behind_proxies(["10.0.0.0/8", "2001:db8:ffff::/48", "::ffff:192.0.2.0/120"])
            .expect("valid proxies")
            .max_hops(usize::from(config & 0x3f))
            .ipv6_prefix(if config & 0x40 == 0 { 64 } else { 128 })
            .expect("valid prefix");
    let trusted_peer: IpAddr = "10.0.0.1".parse().expect("valid address");
    let untrusted_peer: IpAddr = "203.0.113.9".parse().expect("valid address");
    for header in [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::Both,
    ] {
        let c = base.clone().header(header);
        // A peer that is not a trusted proxy is always the answer.
        assert_eq!(c.resolve(untrusted_peer, &headers), untrusted_peer);
        let exact = c.resolve_unmasked(trusted_peer, &headers);
        let grouped = c.resolve(trusted_peer, &headers);
        assert_eq!(grouped, c.mask(exact));
        if !lands_in_nat64(grouped) {
            assert_eq!(c.mask(grouped), grouped, "masking is idempotent");
        }
        // Never an IPv4-mapped IPv6 address.
        if let IpAddr::V6(v6) = exact {
            assert!(v6.to_ipv4_mapped().is_none(), "{exact}");
        }
        // With no hops allowed, the headers are not read.
        if config & 0x3f == 0 {
            assert_eq!(exact, trusted_peer);
        }
        assert_eq!(
            c.key(trusted_peer, &headers).len(),
            if grouped.is_ipv4() { 5 } else { 17 }
        );
    }

    // Whatever the client wrote, an element a trusted proxy appends to the same `Forwarded`
    // line decides the answer (elements are found from the right).
    if config & 0x3f >= 2 {
        let client = "198.51.100.7".parse::<IpAddr>().expect("valid address");
        let c = base.clone().header(ForwardedHeader::Forwarded);
        for appended in [
            &b", for=198.51.100.7"[..],
            b", for=\"198.51.100.7:4711\";by=\"_lb\"",
            b",for=\"198.51.100.7\" , for=10.0.0.9",
        ] {
            let mut line = rest.rsplit(|&b| b == b'\n').next().unwrap_or_default().to_vec();
            line.extend_from_slice(appended);
            if let Ok(value) = HeaderValue::from_bytes(&line) {
                let mut h = HeaderMap::new();
                h.append(http::header::FORWARDED, value);
                assert_eq!(c.resolve_unmasked(trusted_peer, &h), client, "{line:?}");
            }
        }
    }
});

/// Whether `ip` is an IPv6 address of the NAT64 well-known prefix `64:ff9b::/96`: as a group that
/// `ClientIp::mask` made from an address outside it, the one that masking again changes (see
/// there).
fn lands_in_nat64(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if u128::from(v6) >> 32 == 0x0064_ff9b_0000_0000_0000_0000)
}
