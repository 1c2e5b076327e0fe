//! The client's IP address, taking trusted reverse proxies into account.
//!
//! A rate limiter keyed by IP must know *whose* address to count. Behind a
//! load balancer the TCP peer is the proxy, and the client's address is in a
//! header that the proxy appends to: `X-Forwarded-For` or the standard
//! `Forwarded` (RFC 7239). Anything in those headers *left* of what your own
//! proxies wrote was sent by the client and can be anything, so [`ClientIp`]
//! reads the list **right to left** and trusts only the proxies you configure:
//!
//! 1. If the TCP peer is not a trusted proxy, the answer is the peer. The
//!    headers are not even looked at, so a client talking to you directly
//!    cannot spoof its address.
//! 2. Otherwise the hops are read from the right (the nearest proxy's entry
//!    first). Hops that are trusted proxies are skipped; the first hop that is
//!    not a trusted proxy is the client.
//!
//! Taking the *leftmost* entry instead (as some extractors do) lets every
//! client choose its own key by sending `X-Forwarded-For: 1.2.3.4`.
//!
//! # The documented answers
//!
//! [`ClientIp::resolve`] never fails and never panics; every input has one of
//! these answers. "Last trusted" means the last trusted address the walk has
//! seen: the peer itself, or the furthest trusted hop examined so far. It is
//! the furthest address that the configuration lets us vouch for.
//!
//! | Situation | Answer |
//! |---|---|
//! | The peer is not a trusted proxy | The peer; headers are ignored |
//! | The peer is trusted, the configured header is absent or empty | The peer |
//! | Hops read from the right reach an address that is not trusted | That address |
//! | Every hop is a trusted proxy | The leftmost (furthest) hop |
//! | A hop is not an IP address: `unknown`, an obfuscated identifier such as `_hidden`, garbage, non-UTF-8 bytes, control characters, a `Forwarded` element without `for=` or with broken syntax | Last trusted: the walk stops there, because nothing beyond it can be vouched for |
//! | More than [`max_hops`](ClientIp::max_hops) hops are trusted | Last trusted, i.e. the `max_hops`-th hop from the right; nothing further left is read |
//! | Empty list elements (`a,,b`) | Skipped; they are not hops |
//!
//! A request whose headers are broken *by the client* therefore still gets the
//! client's real address, because the trusted proxy appends that address to
//! the right of the broken part, and the list is split from the right: in
//! `X-Forwarded-For` at every comma, in `Forwarded` at the commas outside
//! quoted strings as read from the right end, so that a quoted string the
//! client leaves open cannot swallow, or be closed by, an element a proxy
//! appends to the same line. Broken input never lets a client pick the
//! answer, nor choose between its own address and its proxy's, as long as
//! the header read is the one the proxies append to: with
//! [`ForwardedHeader::Both`], a client's own `Forwarded` header (even an
//! empty one) is read in place of the `X-Forwarded-For` a proxy wrote, unless
//! every proxy appends to both or strips `Forwarded` (see there).
//!
//! Trust only the addresses of your proxies. A client whose own address is
//! trusted is treated as a proxy, so its header is believed: trusting a whole
//! network that also has clients in it (such as `10.0.0.0/8` in an office)
//! lets those clients choose their key.
//!
//! Trust every address your proxies *write*, too, not only those they connect
//! from. Most append one entry, the address they received the request from.
//! Some append more: Google Cloud's global external Application Load Balancer
//! documents `X-Forwarded-For: <client>, <load balancer's own address>`, the
//! last being the forwarding rule's external IP, so list that address among the
//! trusted ones as well. Otherwise the walk stops at it and every client is
//! keyed by the load balancer's one address, sharing one limit. Check what
//! yours writes by logging the header once before relying on it.
//!
//! An IPv6 address written with a port must be in brackets
//! (`[2001:db8::1]:4711`), as common proxies write it. Without them the port
//! cannot be told from the address's groups. `2001:db8::5:4711` is read as
//! the address `2001:db8::5:4711`: a client in a group of its own for each
//! source port under a `/128` prefix, or in the wrong `/64` when the `::`
//! stands in its first half: one the client chooses, as the groups after the
//! `::` shift into the prefix (`2001:db8::1:2:3:4:4711` is read in
//! `2001:db8:0:1::/64`, and each value of that `1` is another group, up to
//! 65,536 for one client). A proxy that writes such addresses leaves its IPv6
//! clients their choice of key: have it write brackets (or no port). A full
//! address with a port
//! (`2001:db8:1:2:3:4:5:6:4711`) does not parse at all, which stops the walk
//! there: every such client is keyed by that proxy's address.
//!
//! Work is bounded: at most `max_hops` hops are parsed and checked against the
//! trusted list, each header line is scanned from the right in time linear in
//! its length (empty elements, which are not hops, are skipped, so a line of
//! commas is read to its end: the server's limit on header size bounds it),
//! and nothing is allocated.
//!
//! # Which header
//!
//! By default only `X-Forwarded-For` is read ([`ForwardedHeader::XForwardedFor`]).
//! A header that your proxy does not write is under the client's control, so
//! read only the header your proxies append to: a client can send a
//! `Forwarded` header that an `X-Forwarded-For`-only proxy passes along
//! untouched. See [`ForwardedHeader`].
//!
//! # Address normalization and grouping
//!
//! IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`, as reported by dual-stack
//! sockets) are turned into IPv4 before anything else, for the peer and for
//! every hop. The result of [`ClientIp::resolve`] is then masked to a prefix:
//! `/32` for IPv4 and `/64` for IPv6 by default. An IPv6 client is usually
//! handed a whole `/64`, and without grouping it could use a fresh address,
//! and so a fresh rate-limit bucket, for every request. Many providers
//! delegate a `/56` or a `/48` to each customer (RIPE-690 recommends those
//! sizes), which such a customer can spread over 256 or 65,536 groups of
//! `/64`: where that matters, a shorter prefix ([`ClientIp::ipv6_prefix`])
//! groups each delegation as one client, at the cost of grouping the
//! customers of a provider that hands out `/64`s more coarsely.
//!
//! An address of the NAT64 well-known prefix `64:ff9b::/96` (RFC 6052: an
//! IPv4 client seen through a translator, such as SIIT-DC in front of an
//! IPv6-only service) is grouped as the IPv4 address it carries, not by its
//! `/64`, which would put every IPv4 client in one group. A translator with a
//! network-specific prefix needs its own setting: group by `/128` there
//! ([`ClientIp::ipv6_prefix`]). Trust is not translated: a proxy seen
//! through the translator is trusted only if its `64:ff9b::` address is listed
//! (the whole prefix, which would trust every client of the translator, is
//! refused).
//!
//! The deprecated IPv4-compatible form (`::192.0.2.1`) and SIIT's
//! `::ffff:0:a.b.c.d` are not turned into IPv4: they are grouped by their
//! `/64`, which is `::/64` for all of them, one group. Clients cannot choose
//! these forms; only a proxy or translator that writes them would produce
//! them. Link-local peers (`fe80::/10`) are grouped by their `/64` too,
//! whatever interface they come from (the scope id is not part of the key).
//!
//! Two deprecated transition mechanisms are grouped like any other IPv6
//! address, by their `/64`: Teredo (`2001::/32`), where every client of one
//! Teredo server shares a `/64` and so one group, and 6to4 (`2002::/16`, RFC
//! 7526 deprecated its anycast relays), where each IPv4 host holds a whole
//! `/48`, 65,536 groups. Both are rare today; where 6to4 clients are common,
//! a `/48` prefix ([`ClientIp::ipv6_prefix`]) makes each such host one group,
//! at the cost of grouping native IPv6 clients by their site.
//!
//! # Examples
//!
//! A spoof attempt from a client that connects directly is ignored:
//!
//! ```
//! use std::net::IpAddr;
//! use tower_ratelimit::http::HeaderMap;
//! use tower_ratelimit::client_ip::ClientIp;
//!
//! // Our two load balancers: their own addresses, not a network that has clients in it.
//! let client_ip = ClientIp::behind_proxies(["10.0.0.10/32", "10.0.0.11/32"])?;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("x-forwarded-for", "1.2.3.4".parse()?);
//! let peer: IpAddr = "203.0.113.9".parse()?;
//!
//! // The peer is not one of our proxies: its header is not believed.
//! assert_eq!(client_ip.resolve(peer, &headers), peer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Behind a trusted proxy, the entry the proxy appended is used, and whatever
//! the client put to its left is not:
//!
//! ```
//! use std::net::IpAddr;
//! use tower_ratelimit::http::HeaderMap;
//! use tower_ratelimit::client_ip::ClientIp;
//!
//! let client_ip = ClientIp::behind_proxies(["10.0.0.10/32", "10.0.0.11/32"])?;
//!
//! // The client sent `X-Forwarded-For: 1.2.3.4`; our proxy at 10.0.0.10
//! // appended the address it saw the connection come from.
//! let mut headers = HeaderMap::new();
//! headers.insert("x-forwarded-for", "1.2.3.4, 198.51.100.7".parse()?);
//! let peer: IpAddr = "10.0.0.10".parse()?;
//!
//! assert_eq!(client_ip.resolve(peer, &headers), "198.51.100.7".parse::<IpAddr>()?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! IPv6 clients are grouped by their `/64` unless configured otherwise:
//!
//! ```
//! use std::net::IpAddr;
//! use tower_ratelimit::http::HeaderMap;
//! use tower_ratelimit::client_ip::{key_bytes, ClientIp};
//!
//! let headers = HeaderMap::new();
//! let by_64 = ClientIp::peer();
//! let a: IpAddr = "2001:db8:1:2::a".parse()?;
//! let b: IpAddr = "2001:db8:1:2:ffff::b".parse()?;
//! assert_eq!(by_64.resolve(a, &headers), "2001:db8:1:2::".parse::<IpAddr>()?);
//! assert_eq!(key_bytes(by_64.resolve(a, &headers)), key_bytes(by_64.resolve(b, &headers)));
//!
//! let exact = ClientIp::peer().ipv6_prefix(128)?;
//! assert_ne!(exact.resolve(a, &headers), exact.resolve(b, &headers));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Deref;
use std::sync::Arc;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

/// The `X-Forwarded-For` header name (lowercase, as `http` stores it).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Default for [`ClientIp::max_hops`].
const DEFAULT_MAX_HOPS: usize = 32;

/// Longest quoted `for=` value read: `[` + a 45-character IPv6 address +
/// `]:65535` is 53 bytes. A longer one is read as unreadable, which stops the
/// walk at the last trusted address (failing safe). RFC 7239 sets no length
/// to an obfuscated port (`"192.0.2.1:_a1b2..."`), so a proxy that wrote a
/// quoted value longer than 64 bytes, address and port together (so the
/// longest port read depends on the address's length), would have its clients
/// keyed by its own address; no proxy is known to.
const MAX_NODE_LEN: usize = 64;

/// Which header(s) [`ClientIp`] reads the proxy chain from.
///
/// Choose the header your trusted proxies append to. A header they do not
/// touch is passed through from the client as-is, and its right end is then
/// whatever the client wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`. The default: it is what
    /// nginx, HAProxy, AWS and GCP load balancers and most others write (see
    /// the [module docs](self) on proxies that append more than one entry).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239). Use it only if every
    /// trusted proxy appends to it.
    Forwarded,
    /// `Forwarded` if the request has that header at all, otherwise
    /// `X-Forwarded-For`. The two lists are never merged.
    ///
    /// Use this only if every trusted proxy either appends to both headers
    /// or removes `Forwarded` from incoming requests: otherwise a client can
    /// send its own `Forwarded` header and it will be read instead of the
    /// `X-Forwarded-For` your proxy wrote.
    Both,
}

/// An error in the configuration of a [`ClientIp`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientIpError {
    /// A trusted-proxy entry is neither an IP address nor a CIDR block.
    #[error(
        "invalid trusted proxy {input:?}: expected an IP address or a CIDR block such as \
         10.0.0.0/8 or fd00::/8"
    )]
    InvalidProxy {
        /// The entry as it was given.
        input: String,
    },
    /// A trusted-proxy entry of prefix length 0 (`0.0.0.0/0`, `::/0`), or an IPv6 block that
    /// holds every IPv4-mapped address (`::ffff:0:0/96`, `::/64`) or every address of the NAT64
    /// well-known prefix (`64:ff9b::/96`); or entries that together hold every public IPv4 address
    /// (`0.0.0.0/1` and `128.0.0.0/1`, or `0.0.0.0/1`, `128.0.0.0/2` and `192.0.0.0/3`, which
    /// leave out only the multicast and reserved `224.0.0.0/3`), every public address of the NAT64
    /// prefix (`64:ff9b::/97` and `64:ff9b::8000:0/97`, or `64:ff9b::/97`, `64:ff9b::8000:0/98`
    /// and `64:ff9b::c000:0/99`) or every public global unicast IPv6 address (`2000::/3`, its
    /// documentation and benchmarking blocks left out or not): every
    /// address (every IPv4 address, every client of a translator) would be a proxy, and any
    /// client could choose its own address with a forwarding header. `input` names the entry, or
    /// every entry when they do it together.
    #[error(
        "{input:?} trusts every address as a proxy: any client could then choose its own \
         address with a forwarding header; list the proxies' own addresses"
    )]
    TrustsEveryAddress {
        /// The entry as it was given.
        input: String,
    },
    /// A trusted-proxy block written with an address that is not its first (`10.0.0.10/8`): most
    /// likely a typo for the one address (`10.0.0.10/32`, or `10.0.0.10` alone), which trusting
    /// the whole block (`10.0.0.0/8`) would make millions of addresses proxies.
    #[error(
        "trusted proxy {input:?} has address bits set past its prefix: write {network} for the \
         whole block, or the address alone for one proxy"
    )]
    HostBitsSet {
        /// The entry as it was given.
        input: String,
        /// The block it names, written from its first address.
        network: String,
    },
    /// An IPv4 prefix length above 32.
    #[error("IPv4 prefix length {0} is out of range (0 to 32)")]
    Ipv4PrefixOutOfRange(u8),
    /// An IPv6 prefix length above 128.
    #[error("IPv6 prefix length {0} is out of range (0 to 128)")]
    Ipv6PrefixOutOfRange(u8),
}

/// How to find the client's IP address: which proxies are trusted, which
/// header they write, and how addresses are grouped.
///
/// Cheap to clone (the proxy list is shared). The documentation of the
/// `client_ip` module lists the rules and the answer to every kind of input.
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    /// The IPv4 grouping prefix as a mask (`255.255.255.0` for /24): made when the prefix is
    /// set, not worked out per request.
    ipv4_mask: Ipv4Addr,
    ipv6_prefix: u8,
    max_hops: usize,
}

impl Default for ClientIp {
    /// Same as [`ClientIp::peer`].
    fn default() -> Self {
        Self::peer()
    }
}

impl ClientIp {
    /// Trust no proxy: the answer is always the TCP peer's address (masked to
    /// the configured prefix). Use this when clients connect directly.
    #[must_use]
    pub fn peer() -> Self {
        Self {
            trusted: Arc::from(Vec::new()),
            header: ForwardedHeader::XForwardedFor,
            ipv4_mask: Ipv4Addr::BROADCAST,
            ipv6_prefix: 64,
            max_hops: DEFAULT_MAX_HOPS,
        }
    }

    /// Trust the given proxies: each entry is a CIDR block (`"10.0.0.0/8"`,
    /// `"fd00::/8"`) or a single address (`"10.1.2.3"` meaning `/32`,
    /// `"::1"` meaning `/128`). Surrounding whitespace is ignored. A block
    /// written from an address that is not its first (`10.1.2.3/8`) is refused
    /// ([`ClientIpError::HostBitsSet`]): it is most likely one proxy's address
    /// with a wrong prefix, and would trust the whole `10.0.0.0/8`.
    ///
    /// An IPv6 block also covers the IPv4 addresses mapped into it (so
    /// `::ffff:10.0.0.0/104` trusts `10.0.0.0/8`). An empty list trusts
    /// nothing, like [`ClientIp::peer`].
    ///
    /// # Errors
    ///
    /// [`ClientIpError::InvalidProxy`] naming the first entry that does not
    /// parse; [`ClientIpError::TrustsEveryAddress`] for `0.0.0.0/0`, `::/0`,
    /// an IPv6 block holding all of `::ffff:0:0/96` (which would trust
    /// every IPv4 address) or all of `64:ff9b::/96` (every client of a NAT64
    /// translator), or entries that together trust every public IPv4 address
    /// (`0.0.0.0/1` and `128.0.0.0/1`; or `0.0.0.0/1`, `128.0.0.0/2` and
    /// `192.0.0.0/3`: the private, loopback, link-local, documentation,
    /// multicast and reserved blocks, which no client on the internet
    /// connects from, need not be among them), every public address of
    /// `64:ff9b::/96` (the NAT64 forms of the same blocks need not be among
    /// them) or every global unicast IPv6 address (`2000::/3`; the
    /// documentation and benchmarking blocks `2001:db8::/32`, `3fff::/20`
    /// and `2001:2::/48` need not be among them).
    pub fn behind_proxies(
        trusted: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<Self, ClientIpError> {
        let mut inputs = Vec::new();
        let nets = trusted
            .into_iter()
            .map(|entry| {
                inputs.push(entry.as_ref().trim().to_owned());
                parse_trusted(entry.as_ref())
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Blocks that together trust every address, none of them alone (`0.0.0.0/1` and
        // `128.0.0.0/1`), are refused as one that does would be.
        if covers_every_ipv4(&nets)
            || covers_every_global_ipv6(&nets)
            || covers_every_nat64_address(&nets)
        {
            return Err(ClientIpError::TrustsEveryAddress {
                input: inputs.join(", "),
            });
        }
        Ok(Self {
            trusted: Arc::from(nets),
            ..Self::peer()
        })
    }

    /// Which header to read the proxy chain from. Default:
    /// [`ForwardedHeader::XForwardedFor`].
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Group IPv6 clients by this prefix length (default 64). `128` keeps
    /// every address apart; `48` groups a whole site.
    ///
    /// # Errors
    ///
    /// [`ClientIpError::Ipv6PrefixOutOfRange`] if `len` is above 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Result<Self, ClientIpError> {
        if len > 128 {
            return Err(ClientIpError::Ipv6PrefixOutOfRange(len));
        }
        self.ipv6_prefix = len;
        Ok(self)
    }

    /// Group IPv4 clients by this prefix length (default 32: every address
    /// on its own).
    ///
    /// # Errors
    ///
    /// [`ClientIpError::Ipv4PrefixOutOfRange`] if `len` is above 32.
    pub fn ipv4_prefix(mut self, len: u8) -> Result<Self, ClientIpError> {
        if len > 32 {
            return Err(ClientIpError::Ipv4PrefixOutOfRange(len));
        }
        self.ipv4_mask = Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0));
        Ok(self)
    }

    /// Read at most `n` hops from the right (default 32). If the first `n`
    /// hops are all trusted proxies, the answer is the `n`-th one and the
    /// rest of the header is not read. `0` means the headers are never read:
    /// the answer is the peer even when it is trusted.
    ///
    /// Empty list elements are not hops and do not count.
    #[must_use]
    pub fn max_hops(mut self, n: usize) -> Self {
        self.max_hops = n;
        self
    }

    /// Whether `ip` is in the trusted-proxy list (after turning an
    /// IPv4-mapped IPv6 address into IPv4).
    #[must_use]
    #[inline]
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        // A proxy seen through a NAT64 translator is trusted only by its `64:ff9b::` form, as
        // listed: trust is never widened by a translation (which RFC 6052 forbids for the
        // private addresses proxies usually have, so a peer showing one is not a translator's).
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let mapped = IpAddr::V6(v4.to_ipv6_mapped());
                self.trusted
                    .iter()
                    .any(|net| net.contains(&IpAddr::V4(v4)) || net.contains(&mapped))
            }
            v6 => self.trusted.iter().any(|net| net.contains(&v6)),
        }
    }

    /// The client's address, masked to the configured prefix (`/32` for
    /// IPv4 and `/64` for IPv6 by default): the value to rate-limit by.
    ///
    /// `peer` is the address of the TCP connection. The documentation of the
    /// `client_ip` module gives the answer to every kind of input; this never
    /// fails and never panics.
    #[must_use]
    #[inline]
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        self.mask(self.resolve_unmasked(peer, headers))
    }

    /// The client's address as found, not masked to a prefix (but with
    /// IPv4-mapped IPv6 turned into IPv4). For logs; rate-limit by
    /// [`resolve`](Self::resolve).
    #[must_use]
    #[inline]
    pub fn resolve_unmasked(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if self.trusts_none() || !self.is_trusted(peer) {
            return peer;
        }
        self.forwarded_client(peer, headers)
    }

    /// No proxy is trusted ([`ClientIp::peer`]): the answer is always the peer's address.
    #[inline]
    pub(crate) fn trusts_none(&self) -> bool {
        self.trusted.is_empty()
    }

    /// The client's address from the forwarding headers, `peer` being a trusted proxy.
    fn forwarded_client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let use_forwarded = match self.header {
            ForwardedHeader::XForwardedFor => false,
            ForwardedHeader::Forwarded => true,
            ForwardedHeader::Both => headers.contains_key(FORWARDED),
        };
        if use_forwarded {
            let hops = headers
                .get_all(FORWARDED)
                .iter()
                .rev()
                .flat_map(|line| forwarded_line_rtl(line.as_bytes()));
            self.walk(peer, hops)
        } else {
            let hops = headers
                .get_all(X_FORWARDED_FOR)
                .iter()
                .rev()
                .flat_map(|line| xff_line_rtl(line.as_bytes()));
            self.walk(peer, hops)
        }
    }

    /// [`key_bytes`] of [`resolve`](Self::resolve): the store key part for
    /// this request.
    #[must_use]
    #[inline]
    pub fn key(&self, peer: IpAddr, headers: &HeaderMap) -> IpKey {
        key_bytes(self.resolve(peer, headers))
    }

    /// `ip` with the bits beyond the configured prefix cleared, after turning an IPv4-mapped
    /// address into IPv4. An address of the NAT64 well-known prefix `64:ff9b::/96` becomes the
    /// IPv4 address it carries, masked by the IPv4 prefix (see the module docs).
    ///
    /// Masking a masked address changes nothing, but for one case: an IPv6 address of
    /// `64:ff9b::/64` outside the `/96` (no translator's: RFC 6052 keeps bits 64 to 71 zero) whose
    /// group falls inside it. `64:ff9b::1:0:0:0` at `/64` is grouped as the IPv6 `64:ff9b::`,
    /// with the rest of its `/64`; that group, masked again, would be read as a NAT64 address
    /// and become the IPv4 `0.0.0.0`. The layer masks each address once.
    #[must_use]
    #[inline]
    pub fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(self.mask_v4(v4)),
            IpAddr::V6(v6) if u128::from(v6) >> 32 == NAT64_WELL_KNOWN => {
                IpAddr::V4(self.mask_v4(Ipv4Addr::from(u128::from(v6) as u32)))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }

    /// The IPv4 part of [`mask`](Self::mask) (also of IPv4 addresses carried in the NAT64
    /// well-known prefix).
    #[inline]
    pub(crate) fn mask_v4(&self, v4: Ipv4Addr) -> Ipv4Addr {
        Ipv4Addr::from(v4.to_bits() & self.ipv4_mask.to_bits())
    }

    /// The right-to-left walk over hops (nearest proxy's entry first), from
    /// a trusted peer.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Hop>) -> IpAddr {
        let mut last_trusted = peer;
        for hop in hops.take(self.max_hops) {
            match hop {
                Hop::Addr(ip) => {
                    let ip = ip.to_canonical();
                    if self.is_trusted(ip) {
                        last_trusted = ip;
                    } else {
                        return ip;
                    }
                }
                Hop::Opaque => break,
            }
        }
        last_trusted
    }
}

/// Parses one trusted-proxy entry: a CIDR block or a bare address. The address is read by std's
/// parser in both (ipnet's own reads `010.0.0.8/32` as 10.0.0.8, where `inet_aton`, curl and
/// browsers read the octal 8.0.0.8; std refuses such parts, in a bare entry as in a hop), and
/// the prefix length is decimal digits only.
fn parse_trusted(input: &str) -> Result<IpNet, ClientIpError> {
    let s = input.trim();
    let net = match s.split_once('/') {
        Some((addr, len)) => {
            let len =
                (!len.is_empty() && len.len() <= 3 && len.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| len.parse::<u8>().ok())
                    .flatten();
            match (addr.parse::<IpAddr>(), len) {
                (Ok(addr), Some(len)) => IpNet::new(addr, len).ok(),
                _ => None,
            }
        }
        None => s.parse::<IpAddr>().ok().map(IpNet::from),
    };
    let Some(written) = net else {
        return Err(ClientIpError::InvalidProxy {
            input: input.to_owned(),
        });
    };
    let net = written.trunc();
    if net.prefix_len() == 0 || holds_every_ipv4_mapped(&net) || holds_every_nat64_address(&net) {
        Err(ClientIpError::TrustsEveryAddress {
            input: input.to_owned(),
        })
    } else if net != written {
        Err(ClientIpError::HostBitsSet {
            input: input.to_owned(),
            network: net.to_string(),
        })
    } else {
        Ok(net)
    }
}

/// Whether `ranges` (first and last of each) cover every value from `lo` to `hi`.
fn cover(mut ranges: Vec<(u128, u128)>, lo: u128, hi: u128) -> bool {
    ranges.sort_unstable();
    let mut next = lo;
    for (first, last) in ranges {
        if first > next {
            return false;
        }
        if last >= hi {
            return true;
        }
        next = next.max(last + 1);
    }
    false
}

/// The IPv4 blocks no client on the internet connects from (RFC 6890's blocks that are not
/// globally reachable, and multicast, reserved and broadcast, `224.0.0.0/3`), each as its first
/// and last address. Trusted blocks that hold every other address trust every client as much as
/// `0.0.0.0/0` does.
const IPV4_NOT_PUBLIC: [(u32, u32); 13] = [
    (0x0000_0000, 0x00ff_ffff), // 0.0.0.0/8, "this network"
    (0x0a00_0000, 0x0aff_ffff), // 10.0.0.0/8, private
    (0x6440_0000, 0x647f_ffff), // 100.64.0.0/10, shared address space (carrier-grade NAT)
    (0x7f00_0000, 0x7fff_ffff), // 127.0.0.0/8, loopback
    (0xa9fe_0000, 0xa9fe_ffff), // 169.254.0.0/16, link-local
    (0xac10_0000, 0xac1f_ffff), // 172.16.0.0/12, private
    (0xc000_0000, 0xc000_00ff), // 192.0.0.0/24, IETF protocol assignments
    (0xc000_0200, 0xc000_02ff), // 192.0.2.0/24, documentation
    (0xc0a8_0000, 0xc0a8_ffff), // 192.168.0.0/16, private
    (0xc612_0000, 0xc613_ffff), // 198.18.0.0/15, benchmarking
    (0xc633_6400, 0xc633_64ff), // 198.51.100.0/24, documentation
    (0xcb00_7100, 0xcb00_71ff), // 203.0.113.0/24, documentation
    (0xe000_0000, 0xffff_ffff), // 224.0.0.0/3, multicast, reserved and broadcast
];

/// Whether the trusted blocks together hold every public IPv4 address (every address but those
/// of [`IPV4_NOT_PUBLIC`], which no client on the internet connects from), in its own form or
/// mapped into IPv6 (`::ffff:a.b.c.d`, as [`ClientIp::is_trusted`] checks it): `0.0.0.0/1`,
/// `128.0.0.0/2` and `192.0.0.0/3` leave out only `224.0.0.0/3`, and trust every client as
/// `0.0.0.0/0` would.
fn covers_every_ipv4(nets: &[IpNet]) -> bool {
    let mapped = u128::from(Ipv4Addr::UNSPECIFIED.to_ipv6_mapped());
    let ranges = nets
        .iter()
        .filter_map(|net| match net {
            IpNet::V4(v4) => Some((
                u128::from(u32::from(v4.network())),
                u128::from(u32::from(v4.broadcast())),
            )),
            IpNet::V6(v6) => {
                let (first, last) = (u128::from(v6.network()), u128::from(v6.broadcast()));
                // A block inside the mapped range (one holding all of it is refused alone).
                (first >= mapped && last <= mapped + u128::from(u32::MAX))
                    .then(|| (first - mapped, last - mapped))
            }
        })
        .chain(
            IPV4_NOT_PUBLIC
                .iter()
                .map(|&(first, last)| (u128::from(first), u128::from(last))),
        )
        .collect();
    cover(ranges, 0, u128::from(u32::MAX))
}

/// The IPv6 blocks among `nets`, each as its first and last address.
fn ipv6_ranges(nets: &[IpNet]) -> Vec<(u128, u128)> {
    nets.iter()
        .filter_map(|net| match net {
            IpNet::V6(v6) => Some((u128::from(v6.network()), u128::from(v6.broadcast()))),
            IpNet::V4(_) => None,
        })
        .collect()
}

/// The blocks of global unicast IPv6 (`2000::/3`) that no client on the internet connects from
/// (RFC 6890's registry: documentation and benchmarking), each as its first and last address.
const IPV6_GLOBAL_NOT_PUBLIC: [(u128, u128); 3] = [
    // 2001:2::/48, benchmarking.
    (0x2001_0002 << 96, (0x2001_0002 << 96) | ((1 << 80) - 1)),
    // 2001:db8::/32, documentation.
    (0x2001_0db8 << 96, (0x2001_0db8 << 96) | ((1 << 96) - 1)),
    // 3fff::/20, documentation.
    (0x3fff << 112, (0x3fff << 112) | ((1 << 108) - 1)),
];

/// Whether the trusted blocks together hold every global unicast IPv6 address (`2000::/3`, the
/// whole IPv6 internet), alone (`2000::/3`) or together; as for IPv4, the blocks no client
/// connects from ([`IPV6_GLOBAL_NOT_PUBLIC`]) need not be among them.
fn covers_every_global_ipv6(nets: &[IpNet]) -> bool {
    let first = 0x2000_u128 << 112;
    let mut ranges = ipv6_ranges(nets);
    ranges.extend(IPV6_GLOBAL_NOT_PUBLIC);
    cover(ranges, first, first + (1 << 125) - 1)
}

/// Whether the trusted blocks together hold every address of the NAT64 well-known prefix
/// `64:ff9b::/96` (`64:ff9b::/97` and `64:ff9b::8000:0/97`), as one block holding it would (see
/// [`holds_every_nat64_address`]); as for IPv4, the NAT64 forms of the blocks no client connects
/// from ([`IPV4_NOT_PUBLIC`]) need not be among them: `64:ff9b::/97`, `64:ff9b::8000:0/98` and
/// `64:ff9b::c000:0/99` hold every client of a translator.
fn covers_every_nat64_address(nets: &[IpNet]) -> bool {
    let first = NAT64_WELL_KNOWN << 32;
    let mut ranges = ipv6_ranges(nets);
    ranges.extend(
        IPV4_NOT_PUBLIC
            .iter()
            .map(|&(lo, hi)| (first + u128::from(lo), first + u128::from(hi))),
    );
    cover(ranges, first, first + u128::from(u32::MAX))
}

/// Whether `net` is an IPv6 block holding all of `::ffff:0:0/96`, the
/// IPv4-mapped addresses: it would trust every IPv4 address, since
/// [`ClientIp::is_trusted`] checks an IPv4 address in its mapped form too.
/// (Blocks are aligned: one of prefix 96 or less that holds the first mapped
/// address holds them all.)
fn holds_every_ipv4_mapped(net: &IpNet) -> bool {
    match net {
        IpNet::V6(v6) => {
            v6.prefix_len() <= 96 && v6.contains(&Ipv4Addr::UNSPECIFIED.to_ipv6_mapped())
        }
        IpNet::V4(_) => false,
    }
}

/// Whether `net` is an IPv6 block holding all of the NAT64 well-known prefix `64:ff9b::/96`: every
/// IPv4 client of a translator in front of the service would be a proxy, free to choose its
/// address with a forwarding header (a translator keeps each client's own IPv4 address in the
/// low bits: it is not a proxy). A proxy seen through a translator is listed by its address.
fn holds_every_nat64_address(net: &IpNet) -> bool {
    match net {
        IpNet::V6(v6) => {
            v6.prefix_len() <= 96 && v6.contains(&Ipv6Addr::from(NAT64_WELL_KNOWN << 32))
        }
        IpNet::V4(_) => false,
    }
}

/// The compact, unambiguous store-key encoding of an address; see
/// [`key_bytes`].
///
/// Dereferences to the bytes: 5 bytes for IPv4 (tag `4`, then the address)
/// and 17 bytes for IPv6 (tag `6`, then the address). No allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpKey {
    buf: [u8; 17],
    len: u8,
}

impl IpKey {
    /// The tag byte of an IPv4 key.
    pub const V4_TAG: u8 = 4;
    /// The tag byte of an IPv6 key.
    pub const V6_TAG: u8 = 6;

    /// The key bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The address this key was made from (IPv4 if it was IPv4-mapped).
    #[must_use]
    pub fn ip(&self) -> IpAddr {
        // A key is only built by `key_bytes`, so it always decodes.
        Self::decode(self.as_bytes()).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    /// Decodes key bytes made by [`key_bytes`]. `None` if `bytes` is not
    /// exactly such an encoding: wrong tag or length, or an IPv6 tag on an
    /// IPv4-mapped address (which `key_bytes` encodes as IPv4). So decoding
    /// and encoding are inverse: every key decodes to one address and back.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<IpAddr> {
        match bytes.split_first()? {
            (&Self::V4_TAG, rest) => {
                let octets: [u8; 4] = rest.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(octets)))
            }
            (&Self::V6_TAG, rest) => {
                let octets: [u8; 16] = rest.try_into().ok()?;
                let v6 = Ipv6Addr::from(octets);
                v6.to_ipv4_mapped().is_none().then_some(IpAddr::V6(v6))
            }
            _ => None,
        }
    }
}

impl Deref for IpKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for IpKey {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<IpAddr> for IpKey {
    fn from(ip: IpAddr) -> Self {
        key_bytes(ip)
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IpKey").field(&self.ip()).finish()
    }
}

/// Encodes an address as a store key: a tag byte ([`IpKey::V4_TAG`] or
/// [`IpKey::V6_TAG`]) followed by the address's octets in network order.
///
/// The tag fixes the length (5 or 17 bytes), so no key is a prefix of
/// another and an IPv4 key never equals an IPv6 key. IPv4-mapped IPv6
/// addresses are encoded as IPv4, so `::ffff:192.0.2.1` and `192.0.2.1` share
/// a key. The address is not masked here: pass the result of
/// [`ClientIp::resolve`].
///
/// ```
/// use std::net::IpAddr;
/// use tower_ratelimit::client_ip::{key_bytes, IpKey};
///
/// let ip: IpAddr = "192.0.2.1".parse()?;
/// let key = key_bytes(ip);
/// assert_eq!(&*key, &[IpKey::V4_TAG, 192, 0, 2, 1]);
/// assert_eq!(IpKey::decode(&key), Some(ip));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
#[inline]
pub fn key_bytes(ip: IpAddr) -> IpKey {
    let mut buf = [0u8; 17];
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            buf[0] = IpKey::V4_TAG;
            buf[1..5].copy_from_slice(&v4.octets());
            IpKey { buf, len: 5 }
        }
        IpAddr::V6(v6) => {
            buf[0] = IpKey::V6_TAG;
            buf[1..17].copy_from_slice(&v6.octets());
            IpKey { buf, len: 17 }
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing. Everything below works on raw header bytes: `HeaderValue` may hold
// bytes that are not UTF-8, and nothing here assumes it does not.

/// One hop of a forwarding list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    /// An IP address (not yet normalized).
    Addr(IpAddr),
    /// Anything that is not an IP address: `unknown`, an obfuscated
    /// identifier, garbage, broken syntax. The walk stops here.
    Opaque,
}

/// Optional whitespace (RFC 9110 `OWS`).
fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_ows(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|&b| !is_ows(b)).map_or(start, |i| i + 1);
    &s[start..end]
}

/// The hops of one `X-Forwarded-For` line, right to left, empty elements
/// skipped.
fn xff_line_rtl(line: &[u8]) -> impl Iterator<Item = Hop> + '_ {
    line.rsplit(|&b| b == b',')
        .map(trim_ows)
        .filter(|element| !element.is_empty())
        .map(parse_xff_element)
}

/// One `X-Forwarded-For` element: `192.0.2.1`, `192.0.2.1:8080`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:8080`. An IPv6 address
/// with a port but no brackets cannot be told apart from an address: a proxy
/// that writes `2001:db8::5:4711` has it read as the address `2001:db8::5:4711`
/// (see the module docs).
fn parse_xff_element(element: &[u8]) -> Hop {
    let Ok(s) = std::str::from_utf8(element) else {
        return Hop::Opaque;
    };
    if s.starts_with('[') {
        return parse_bracketed(element, false);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Hop::Addr(ip);
    }
    match s.rsplit_once(':') {
        Some((host, port)) if is_port(port.as_bytes()) => match host.parse::<Ipv4Addr>() {
            Ok(v4) => Hop::Addr(IpAddr::V4(v4)),
            Err(_) => Hop::Opaque,
        },
        _ => Hop::Opaque,
    }
}

/// `[v6]` optionally followed by `:port` (or an RFC 7239 obfuscated port if
/// `obfport` is set).
fn parse_bracketed(s: &[u8], obfport: bool) -> Hop {
    let Some(close) = s.iter().position(|&b| b == b']') else {
        return Hop::Opaque;
    };
    let inner = &s[1..close];
    let rest = &s[close + 1..];
    let port_ok = match rest {
        [] => true,
        [b':', port @ ..] => is_port(port) || (obfport && is_obfport(port)),
        _ => false,
    };
    let addr = std::str::from_utf8(inner)
        .ok()
        .and_then(|a| a.parse::<Ipv6Addr>().ok());
    match addr {
        Some(v6) if port_ok => Hop::Addr(IpAddr::V6(v6)),
        _ => Hop::Opaque,
    }
}

/// A decimal port number, 0 to 65535.
fn is_port(s: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= 5
        && s.iter().all(u8::is_ascii_digit)
        && s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')) <= 65535
}

/// RFC 7239 `obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn is_obfport(s: &[u8]) -> bool {
    match s {
        [b'_', rest @ ..] => !rest.is_empty() && rest.iter().all(|&b| is_obf_char(b)),
        _ => false,
    }
}

fn is_obf_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

/// An RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte of an unquoted parameter value. Stricter RFC 7239 would allow only
/// `tchar`, which excludes the `:` and brackets of `for=[2001:db8::1]:80`;
/// some proxies send that unquoted, and accepting it is harmless.
fn is_value_char(b: u8) -> bool {
    is_tchar(b) || b == b':' || b == b'[' || b == b']'
}

/// The NAT64 well-known prefix `64:ff9b::/96` (RFC 6052), as the top 96 bits of an address.
const NAT64_WELL_KNOWN: u128 = 0x0064_ff9b_0000_0000_0000_0000;

/// An RFC 7239 `node` (the value of `for=`), already unquoted.
fn parse_node(node: &[u8]) -> Hop {
    // `unknown` and obfuscated identifiers (`_hidden`) are not addresses.
    if node.first() == Some(&b'[') {
        return parse_bracketed(node, true);
    }
    // RFC 7239 wants an IPv6 node in brackets (and the value quoted), but some proxies write the
    // bare address (nginx's `for=$remote_addr`). One that parses whole as IPv6 cannot be read as
    // anything else (a port needs the brackets): read it, rather than stop the walk at the proxy
    // and give every IPv6 client the proxy's key.
    if node.iter().filter(|&&b| b == b':').nth(1).is_some() {
        return match std::str::from_utf8(node)
            .ok()
            .and_then(|h| h.parse::<Ipv6Addr>().ok())
        {
            Some(v6) => Hop::Addr(IpAddr::V6(v6)),
            None => Hop::Opaque,
        };
    }
    let (host, port_ok) = match node.iter().position(|&b| b == b':') {
        None => (node, true),
        Some(colon) => {
            let port = &node[colon + 1..];
            (&node[..colon], is_port(port) || is_obfport(port))
        }
    };
    let addr = std::str::from_utf8(host)
        .ok()
        .and_then(|h| h.parse::<Ipv4Addr>().ok());
    match addr {
        Some(v4) if port_ok => Hop::Addr(IpAddr::V4(v4)),
        _ => Hop::Opaque,
    }
}

/// The hops of one `Forwarded` line, right to left, empty elements skipped;
/// lazily, so the walk reads no further than it needs.
///
/// The line is split at the commas outside quoted strings, found from the
/// right. A proxy appends its element at the right end of the line, so
/// nothing a client wrote to the left of it (a quoted string left open, a
/// stray backslash) can change where that element starts or how it is read,
/// which a split found from the left cannot promise: there, the client's
/// open quote would be closed by the first quote of the proxy's element.
/// Each element is then parsed on its own, left to right (see
/// [`ForwardedElement`]); one whose quotes do not pair up is
/// [`Hop::Opaque`].
fn forwarded_line_rtl(line: &[u8]) -> ForwardedRtl<'_> {
    ForwardedRtl { rest: Some(line) }
}

/// The iterator of [`forwarded_line_rtl`]: `rest` is the part of the line
/// left of the elements already read (`None` once it is all read).
#[derive(Debug)]
struct ForwardedRtl<'a> {
    rest: Option<&'a [u8]>,
}

impl Iterator for ForwardedRtl<'_> {
    type Item = Hop;

    fn next(&mut self) -> Option<Hop> {
        loop {
            let rest = self.rest?;
            let (element, balanced) = match last_comma(rest) {
                Ok(comma) => {
                    self.rest = Some(&rest[..comma]);
                    (&rest[comma + 1..], true)
                }
                Err(balanced) => {
                    self.rest = None;
                    (rest, balanced)
                }
            };
            let element = trim_ows(element);
            if element.is_empty() {
                continue;
            }
            if !balanced {
                return Some(Hop::Opaque);
            }
            if let Some(hop) = ForwardedElement::parse(element) {
                return Some(hop);
            }
        }
    }
}

/// The last comma of `line` outside quoted strings, read from the right: a
/// quote opens a string (read backwards) and the next unescaped quote closes
/// it. Without one, `Err` says whether the quotes read paired up (`false`: a
/// string is still open at the start of the line).
fn last_comma(line: &[u8]) -> Result<usize, bool> {
    let mut quoted = false;
    for i in (0..line.len()).rev() {
        match line[i] {
            b'"' if !quoted => quoted = true,
            b'"' if !is_escaped(line, i) => quoted = false,
            b',' if !quoted => return Ok(i),
            _ => {}
        }
    }
    Err(!quoted)
}

/// Whether the byte at `i` is escaped: preceded by an odd run of
/// backslashes. Each run is counted for at most one quote, the one right
/// after it, so a scan stays linear.
fn is_escaped(line: &[u8], i: usize) -> bool {
    line[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// The parser of one `Forwarded` element, left to right, yielding its
/// `for=` node.
///
/// Answers: an element with a valid `for=` address yields it; an element
/// without `for=`, with `for=` twice, with a `for=` that is not an address,
/// or with any syntax error yields [`Hop::Opaque`]; an element of only `;`
/// separators yields nothing (it is skipped, as an empty one is).
#[derive(Debug)]
struct ForwardedElement<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> ForwardedElement<'a> {
    /// `element` (with no comma outside its quoted strings) parsed whole: a
    /// comma the parser finds outside them after all, or anything it leaves
    /// unread, makes it [`Hop::Opaque`].
    fn parse(element: &'a [u8]) -> Option<Hop> {
        let mut parser = Self {
            line: element,
            pos: 0,
        };
        let hop = parser.element();
        if parser.pos < element.len() {
            return Some(Hop::Opaque);
        }
        hop
    }

    fn peek(&self) -> Option<u8> {
        self.line.get(self.pos).copied()
    }

    fn skip_ows(&mut self) {
        while self.peek().is_some_and(is_ows) {
            self.pos += 1;
        }
    }

    /// Error recovery: skips past the next comma, returns `Hop::Opaque`.
    fn malformed(&mut self) -> Hop {
        match self.line[self.pos.min(self.line.len())..]
            .iter()
            .position(|&b| b == b',')
        {
            Some(offset) => self.pos += offset + 1,
            None => self.pos = self.line.len(),
        }
        Hop::Opaque
    }

    /// Reads a quoted string starting at the opening quote. Returns the
    /// unescaped content if it fits in `MAX_NODE_LEN` bytes (`Some(None)` if
    /// it does not), `None` if it is unterminated, with `pos` back on the
    /// opening quote.
    fn quoted(&mut self) -> Option<Option<([u8; MAX_NODE_LEN], usize)>> {
        let open = self.pos;
        let mut buf = [0u8; MAX_NODE_LEN];
        let mut len = 0usize;
        let mut overflow = false;
        self.pos += 1; // opening quote
        loop {
            let Some(mut b) = self.peek() else {
                self.pos = open;
                return None;
            };
            self.pos += 1;
            match b {
                b'"' => return Some((!overflow).then_some((buf, len))),
                b'\\' => {
                    let Some(escaped) = self.peek() else {
                        self.pos = open;
                        return None;
                    };
                    b = escaped;
                    self.pos += 1;
                }
                _ => {}
            }
            match buf.get_mut(len) {
                Some(slot) => {
                    *slot = b;
                    len += 1;
                }
                None => overflow = true,
            }
        }
    }

    /// Parses one element starting at `pos` and consumes its terminating
    /// comma. `None` for an empty element.
    fn element(&mut self) -> Option<Hop> {
        let mut node: Option<Hop> = None;
        let mut pairs = 0usize;
        loop {
            self.skip_ows();
            match self.peek() {
                None => break,
                Some(b',') => {
                    self.pos += 1;
                    break;
                }
                Some(b';') => {
                    self.pos += 1;
                    continue;
                }
                Some(_) => {}
            }
            pairs += 1;
            let name_start = self.pos;
            while self.peek().is_some_and(is_tchar) {
                self.pos += 1;
            }
            let name = &self.line[name_start..self.pos];
            if name.is_empty() || self.peek() != Some(b'=') {
                return Some(self.malformed());
            }
            self.pos += 1;
            let is_for = name.eq_ignore_ascii_case(b"for");
            let value = if self.peek() == Some(b'"') {
                match self.quoted() {
                    None => return Some(self.malformed()),
                    Some(Some((buf, len))) => parse_node(&buf[..len]),
                    Some(None) => Hop::Opaque,
                }
            } else {
                let start = self.pos;
                while self.peek().is_some_and(is_value_char) {
                    self.pos += 1;
                }
                if start == self.pos {
                    return Some(self.malformed());
                }
                parse_node(&self.line[start..self.pos])
            };
            if is_for {
                if node.is_some() {
                    // RFC 7239: a parameter must not occur twice in one element.
                    return Some(self.malformed());
                }
                node = Some(value);
            }
            self.skip_ows();
            if !matches!(self.peek(), None | Some(b';' | b',')) {
                return Some(self.malformed());
            }
        }
        (pairs > 0).then(|| node.unwrap_or(Hop::Opaque))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    /// Whether `ip` is an IPv6 address of the NAT64 well-known prefix `64:ff9b::/96`: as a group
    /// that [`ClientIp::mask`] made from an address outside it, the one that masking again
    /// changes (see there).
    fn lands_in_nat64(ip: IpAddr) -> bool {
        matches!(ip, IpAddr::V6(v6) if u128::from(v6) >> 32 == NAT64_WELL_KNOWN)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, lines: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
        for line in lines {
            map.append(name.clone(), HeaderValue::from_str(line).unwrap());
        }
        map
    }

    fn xff(lines: &[&str]) -> HeaderMap {
        headers("x-forwarded-for", lines)
    }

    fn fwd(lines: &[&str]) -> HeaderMap {
        headers("forwarded", lines)
    }

    fn proxies() -> ClientIp {
        ClientIp::behind_proxies(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap()
    }

    const PROXY: &str = "10.0.0.1";

    #[test]
    fn spoof_from_untrusted_peer_is_ignored() {
        let c = proxies();
        let h = xff(&["1.2.3.4"]);
        assert_eq!(c.resolve(ip("203.0.113.9"), &h), ip("203.0.113.9"));
        let h = fwd(&["for=1.2.3.4"]);
        let c = c.header(ForwardedHeader::Forwarded);
        assert_eq!(c.resolve(ip("203.0.113.9"), &h), ip("203.0.113.9"));
    }

    #[test]
    fn peer_mode_ignores_headers() {
        let c = ClientIp::peer();
        assert_eq!(c.resolve(ip(PROXY), &xff(&["1.2.3.4"])), ip(PROXY));
        assert_eq!(
            ClientIp::default().resolve(ip("1.1.1.1"), &xff(&["2.2.2.2"])),
            ip("1.1.1.1")
        );
    }

    #[test]
    fn trusted_proxy_without_header_is_the_answer() {
        assert_eq!(proxies().resolve(ip(PROXY), &HeaderMap::new()), ip(PROXY));
        assert_eq!(proxies().resolve(ip(PROXY), &xff(&[""])), ip(PROXY));
        assert_eq!(proxies().resolve(ip(PROXY), &xff(&[" , ,"])), ip(PROXY));
    }

    #[test]
    fn single_trusted_proxy_uses_its_appended_hop() {
        let h = xff(&["198.51.100.7"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
    }

    #[test]
    fn chain_of_two_trusted_proxies() {
        // client -> 10.0.0.5 (edge) -> 10.0.0.1 (inner) -> us
        let h = xff(&["198.51.100.7, 10.0.0.5"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
    }

    #[test]
    fn client_supplied_leftmost_entries_are_ignored() {
        let h = xff(&["1.1.1.1, 10.0.0.3, 198.51.100.7, 10.0.0.5"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
        // Even a fake "trusted" entry to the left of the real client.
        let h = xff(&["10.9.9.9, 198.51.100.7"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
    }

    /// A load balancer that appends the client and then its own public address (Google Cloud's
    /// global external Application Load Balancer): trusting only the ranges it connects from
    /// keys every client by that address; trusting the address too finds the client.
    #[test]
    fn a_proxy_appending_its_own_address_must_have_it_trusted() {
        let h = xff(&["6.6.6.6, 198.51.100.7, 203.0.113.80"]);
        let peer = ip("35.191.1.2");
        let frontends = ClientIp::behind_proxies(["35.191.0.0/16"]).unwrap();
        assert_eq!(frontends.resolve(peer, &h), ip("203.0.113.80"));
        let with_rule = ClientIp::behind_proxies(["35.191.0.0/16", "203.0.113.80"]).unwrap();
        assert_eq!(with_rule.resolve(peer, &h), ip("198.51.100.7"));
    }

    #[test]
    fn all_trusted_hops_give_the_leftmost() {
        let h = xff(&["10.0.0.9, 10.0.0.5"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("10.0.0.9"));
    }

    #[test]
    fn multiple_header_lines_are_one_list_last_line_nearest() {
        // Client sent a line, the proxy added its own line after it.
        let h = xff(&["6.6.6.6", "198.51.100.7"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
        let h = xff(&["6.6.6.6, 198.51.100.7", "10.0.0.5"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
        let h = xff(&["6.6.6.6", "198.51.100.7, 10.0.0.5", "10.0.0.6"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
        let c = proxies().header(ForwardedHeader::Forwarded);
        let h = fwd(&["for=6.6.6.6", "for=198.51.100.7", "for=10.0.0.5"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
    }

    #[test]
    fn xff_element_forms() {
        let c = proxies().ipv6_prefix(128).unwrap();
        for (value, want) in [
            ("198.51.100.7:8080", "198.51.100.7"),
            ("  198.51.100.7\t", "198.51.100.7"),
            ("2001:db8::7", "2001:db8::7"),
            ("[2001:db8::7]", "2001:db8::7"),
            ("[2001:db8::7]:443", "2001:db8::7"),
            ("198.51.100.7,,", "198.51.100.7"),
        ] {
            assert_eq!(c.resolve(ip(PROXY), &xff(&[value])), ip(want), "{value}");
        }
    }

    /// An IPv6 node without its brackets (nginx's `for=$remote_addr`), quoted or not, is read:
    /// it cannot be anything else.
    #[test]
    fn forwarded_bare_ipv6_is_read() {
        let c = proxies()
            .header(ForwardedHeader::Forwarded)
            .ipv6_prefix(128)
            .unwrap();
        for value in [r#"for="2001:db8::1""#, "for=2001:db8::1"] {
            assert_eq!(
                c.resolve(ip(PROXY), &fwd(&[value])),
                ip("2001:db8::1"),
                "{value}"
            );
            let line = format!("for=192.0.2.9, {value}");
            assert_eq!(
                c.resolve(ip(PROXY), &fwd(&[&line])),
                ip("2001:db8::1"),
                "{value}"
            );
        }
        // A trusted proxy's bare address is skipped like any other.
        let h = fwd(&["for=192.0.2.9, for=::ffff:10.0.0.5"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("192.0.2.9"));
    }

    /// IPv4 clients seen through a NAT64 translator's well-known prefix are grouped by their IPv4
    /// address, not all into the translator's /64; other IPv6 addresses are grouped as before.
    #[test]
    fn nat64_well_known_prefix_is_grouped_as_ipv4() {
        let c = ClientIp::peer();
        let h = HeaderMap::new();
        assert_eq!(c.resolve(ip("64:ff9b::c000:201"), &h), ip("192.0.2.1"));
        assert_eq!(c.resolve(ip("64:ff9b::c000:202"), &h), ip("192.0.2.2"));
        assert_eq!(
            c.resolve(ip("64:ff9b:0:1::c000:201"), &h),
            ip("64:ff9b:0:1::")
        );
        let by_24 = ClientIp::peer().ipv4_prefix(24).unwrap();
        assert_eq!(by_24.resolve(ip("64:ff9b::c000:2ff"), &h), ip("192.0.2.0"));
        // An address of `64:ff9b::/64` outside the `/96` is IPv6, grouped by its `/64` as any
        // other; that group, inside the `/96`, is the one address that masking again changes
        // (documented on `mask`; the fuzz targets and the property below allow for it).
        for addr in ["64:ff9b::1:0:0:0", "64:ff9b::1:0:0", "64:ff9b::ff00:0:0"] {
            let once = c.mask(ip(addr));
            assert_eq!(once, ip("64:ff9b::"), "{addr}");
            assert!(lands_in_nat64(once), "{addr}");
            assert_eq!(c.mask(once), ip("0.0.0.0"), "{addr}");
        }
        // Trust is not widened by the translation: a proxy seen through it is trusted only by
        // its `64:ff9b::` form, as listed.
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "192.0.2.7".parse().unwrap());
        let by_v4 = ClientIp::behind_proxies(["10.0.0.2"]).unwrap();
        assert_eq!(by_v4.resolve(ip("64:ff9b::a00:2"), &h), ip("10.0.0.2"));
        let by_v6 = ClientIp::behind_proxies(["64:ff9b::a00:2/128"]).unwrap();
        assert_eq!(by_v6.resolve(ip("64:ff9b::a00:2"), &h), ip("192.0.2.7"));
        let h = HeaderMap::new();
        // Unmasked (for logs), the address is as it came.
        assert_eq!(
            c.resolve_unmasked(ip("64:ff9b::c000:201"), &h),
            ip("64:ff9b::c000:201")
        );
    }

    /// A quoted value is read up to `MAX_NODE_LEN` (64) bytes, address and port together; a
    /// longer one stops the walk at the proxy.
    #[test]
    fn forwarded_quoted_value_is_read_up_to_64_bytes() {
        let c = proxies().header(ForwardedHeader::Forwarded);
        let fits = format!(r#"for="1.2.3.4:_{}""#, "a".repeat(55));
        assert_eq!(fits.len() - r#"for="""#.len(), 64);
        assert_eq!(c.resolve(ip(PROXY), &fwd(&[&fits])), ip("1.2.3.4"));
        let over = format!(r#"for="1.2.3.4:_{}""#, "a".repeat(56));
        assert_eq!(c.resolve(ip(PROXY), &fwd(&[&over])), ip(PROXY));
    }

    #[test]
    fn forwarded_quoted_ipv6_with_port() {
        let c = proxies()
            .header(ForwardedHeader::Forwarded)
            .ipv6_prefix(128)
            .unwrap();
        let h = fwd(&[r#"for="[2001:db8:cafe::17]:4711""#]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("2001:db8:cafe::17"));
        let h = fwd(&[
            r#"for=192.0.2.43, For="[2001:db8:cafe::17]";proto=https;by=10.0.0.1, FOR=10.0.0.5"#,
        ]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("2001:db8:cafe::17"));
        let h = fwd(&[r#"proto=http;for="192.0.2.60:_port" ; by=203.0.113.43"#]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("192.0.2.60"));
        // Escapes in a quoted string; a quoted comma does not split elements.
        let h = fwd(&[r#"for="\1\92.0.2.61";ext="a,b\"c", for=10.0.0.5"#]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("192.0.2.61"));
        // Lenient: unquoted brackets and port.
        let h = fwd(&["for=[2001:db8::9]:80"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("2001:db8::9"));
    }

    #[test]
    fn both_prefers_forwarded_when_present() {
        let c = proxies().header(ForwardedHeader::Both);
        let mut h = xff(&["198.51.100.7"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
        h.insert(FORWARDED, HeaderValue::from_static("for=192.0.2.1"));
        assert_eq!(c.resolve(ip(PROXY), &h), ip("192.0.2.1"));
        // The default reads only X-Forwarded-For.
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("198.51.100.7"));
        let only_fwd = proxies().header(ForwardedHeader::Forwarded);
        assert_eq!(only_fwd.resolve(ip(PROXY), &xff(&["1.2.3.4"])), ip(PROXY));
    }

    #[test]
    fn unparseable_hop_gives_last_trusted() {
        let c = proxies();
        for bad in [
            "garbage",
            "unknown",
            "_hidden",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.4:99999",
            "1.2.3.4:",
            "[2001:db8::1",
            "[1.2.3.4]",
            "fe80::1%eth0",
            "\"1.2.3.4\"",
            "1.2.3.4\t5",
            "for=1.2.3.4",
        ] {
            // The nearest hop is broken: the answer is the trusted peer.
            assert_eq!(c.resolve(ip(PROXY), &xff(&[bad])), ip(PROXY), "{bad:?}");
            // Broken behind a trusted hop: that hop.
            let line = format!("{bad}, 10.0.0.5");
            assert_eq!(
                c.resolve(ip(PROXY), &xff(&[&line])),
                ip("10.0.0.5"),
                "{bad:?}"
            );
            // Broken *left* of the client's entry: irrelevant.
            let line = format!("{bad}, 198.51.100.7");
            assert_eq!(
                c.resolve(ip(PROXY), &xff(&[&line])),
                ip("198.51.100.7"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn forwarded_non_addresses_give_last_trusted() {
        let c = proxies().header(ForwardedHeader::Forwarded);
        for bad in [
            "for=unknown",
            "for=UNKNOWN",
            "for=_hidden",
            r#"for="_gazonk""#,
            "for=garbage",
            "proto=https",
            "for=1.2.3.4;for=5.6.7.8",
            "for",
            "for=",
            "=1.2.3.4",
            r#"for="1.2.3.4"#,
            r#"for="1.2.3.4"x"#,
            "for=1.2.3.4 x",
            r#"for="fe80::1%eth0""#,
            "for=2001:db8::1::2",
            "for=1.2.3.4:_",
            "for=1.2.3.4:_a/b",
            "for = 1.2.3.4",
        ] {
            assert_eq!(c.resolve(ip(PROXY), &fwd(&[bad])), ip(PROXY), "{bad:?}");
            let h = fwd(&[bad, "for=10.0.0.5"]);
            assert_eq!(c.resolve(ip(PROXY), &h), ip("10.0.0.5"), "{bad:?}");
            // In the same line too.
            let line = format!("{bad}, for=10.0.0.5");
            assert_eq!(
                c.resolve(ip(PROXY), &fwd(&[&line])),
                ip("10.0.0.5"),
                "{bad:?}"
            );
        }
        // Broken left of the client's element, in the same line (what a proxy
        // that appends produces) or in an earlier line.
        let h = fwd(&["for=_x;;garbage=\", for=198.51.100.7"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
        // The client's unterminated quote (or stray backslash) does not hide
        // or break what the proxy appends, quoted or not: elements are found
        // from the right.
        for client in [
            r#"for=6.6.6.6;x="a"#,
            r#"a=""#,
            r#"a="\"#,
            r#"a="\""#,
            "\\",
            r#"""#,
        ] {
            for (proxy, want) in [
                ("for=198.51.100.7", "198.51.100.7"),
                (r#"for="[2001:db8::7]""#, "2001:db8::7"),
                (r#"for="198.51.100.7:4711""#, "198.51.100.7"),
                (r#"for=198.51.100.7;by="_lb1""#, "198.51.100.7"),
                (r#"for="198.51.100.7";host="a,b""#, "198.51.100.7"),
            ] {
                let line = format!("{client}, {proxy}");
                let want = c.mask(ip(want));
                assert_eq!(c.resolve(ip(PROXY), &fwd(&[&line])), want, "{line}");
                // Behind a second trusted proxy's element as well.
                let line = format!("{client}, {proxy}, for=10.0.0.5");
                assert_eq!(c.resolve(ip(PROXY), &fwd(&[&line])), want, "{line}");
            }
        }
        // A proxy's element whose quotes do not pair up is broken: the answer
        // is the last trusted address.
        let h = fwd(&[r#"for=198.51.100.7, for="10.0.0.5"#]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip(PROXY));
        let h = fwd(&[r#"for=198.51.100.7, for="10.0.0.5\", for=10.0.0.6"#]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("10.0.0.6"));
        let h = fwd(&["for=\"x", "for=198.51.100.7"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
        let h = fwd(&["for=[bad, for=198.51.100.7"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
        // Empty elements and pairs are skipped.
        let h = fwd(&[" , ;; ,for=198.51.100.7;, ,"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
    }

    #[test]
    fn non_utf8_bytes_give_last_trusted() {
        let bad = HeaderValue::from_bytes(b"198.51.100.\xff").unwrap();
        for (name, cfg) in [
            (X_FORWARDED_FOR, proxies()),
            (FORWARDED, proxies().header(ForwardedHeader::Forwarded)),
        ] {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), bad.clone());
            assert_eq!(cfg.resolve(ip(PROXY), &h), ip(PROXY));
        }
        let mut h = HeaderMap::new();
        h.insert(
            X_FORWARDED_FOR,
            HeaderValue::from_bytes(b"\xc3\xa9, 10.0.0.5").unwrap(),
        );
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("10.0.0.5"));
        let mut h = HeaderMap::new();
        h.insert(
            FORWARDED,
            HeaderValue::from_bytes(b"for=\"\xff\xfe\", for=10.0.0.5").unwrap(),
        );
        let c = proxies().header(ForwardedHeader::Forwarded);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("10.0.0.5"));
    }

    /// What the module docs say of an IPv6 address written with a port but no
    /// brackets: read as an address when it parses as one, else the walk stops
    /// at the proxy that wrote it.
    #[test]
    fn unbracketed_ipv6_with_a_port_is_read_as_documented() {
        assert_eq!(
            parse_xff_element(b"2001:db8::5:4711"),
            Hop::Addr(ip("2001:db8::5:4711"))
        );
        let h = xff(&["2001:db8:1:2:3:4:5:6:4711"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip(PROXY));
        // Bracketed, the port is told apart (and the address grouped by its /64).
        let h = xff(&["[2001:db8:1:2:3:4:5:6]:4711"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("2001:db8:1:2::"));
    }

    #[test]
    fn control_characters_give_last_trusted() {
        // `HeaderValue` refuses most control characters, so the parsers are
        // checked on raw bytes too.
        assert!(HeaderValue::from_bytes(b"1.2.3.4\0").is_err());
        for bad in [
            &b"198.51.100.7\0"[..],
            b"\x00",
            b"198.51\r\n.100.7",
            b"\x7f198.51.100.7",
            b"\x1b[31m198.51.100.7",
        ] {
            assert_eq!(parse_xff_element(trim_ows(bad)), Hop::Opaque, "{bad:?}");
            let mut line = b"for=".to_vec();
            line.extend_from_slice(bad);
            assert_eq!(
                forwarded_line_rtl(&line).collect::<Vec<_>>(),
                [Hop::Opaque],
                "{bad:?}"
            );
        }
        // A tab inside an element (tab is allowed in header values).
        let h = xff(&["198.51.\t100.7"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip(PROXY));
    }

    #[test]
    fn ten_thousand_hops_are_bounded() {
        let c = proxies();
        // All trusted: stop after max_hops and answer the last one examined.
        let hops: Vec<String> = (0..10_000)
            .map(|i| format!("10.0.{}.{}", i / 256 % 256, i % 256))
            .collect();
        let line = hops.join(", ");
        let h = xff(&[&line]);
        // The 32nd hop from the right is hops[10_000 - 32].
        assert_eq!(c.resolve(ip(PROXY), &h), ip(&hops[10_000 - 32]));
        assert_eq!(
            c.clone().max_hops(3).resolve(ip(PROXY), &h),
            ip(&hops[10_000 - 3])
        );
        assert_eq!(c.clone().max_hops(0).resolve(ip(PROXY), &h), ip(PROXY));
        // As 10,000 separate lines.
        let lines: Vec<&str> = hops.iter().map(String::as_str).collect();
        assert_eq!(c.resolve(ip(PROXY), &xff(&lines)), ip(&hops[10_000 - 32]));
        // Forwarded.
        let line = hops
            .iter()
            .map(|h| format!("for={h}"))
            .collect::<Vec<_>>()
            .join(",");
        let f = c.clone().header(ForwardedHeader::Forwarded);
        assert_eq!(f.resolve(ip(PROXY), &fwd(&[&line])), ip(&hops[10_000 - 32]));
        // Client spoofing 10,000 entries left of the real one changes nothing.
        let line = format!("{}, 198.51.100.7", vec!["1.2.3.4"; 10_000].join(","));
        assert_eq!(c.resolve(ip(PROXY), &xff(&[&line])), ip("198.51.100.7"));
        // A Forwarded line is read lazily from the right.
        let line = vec!["for=1.2.3.4"; 10_000].join(",");
        let mut hops = forwarded_line_rtl(line.as_bytes());
        assert_eq!(hops.next(), Some(Hop::Addr(ip("1.2.3.4"))));
        assert_eq!(hops.rest.map(<[u8]>::len), Some(line.len() - 12));
        // Garbage of the same size.
        let line = ",".repeat(10_000) + &"x".repeat(10_000);
        assert_eq!(c.resolve(ip(PROXY), &xff(&[&line])), ip(PROXY));
        let f = c.header(ForwardedHeader::Forwarded);
        assert_eq!(f.resolve(ip(PROXY), &fwd(&[&line])), ip(PROXY));
    }

    #[test]
    fn pathological_lines_parse_in_linear_time() {
        // Each is about 1 MB; a quadratic parser would not finish.
        let c = proxies().header(ForwardedHeader::Forwarded);
        for unit in [
            r#"for="\","#,
            r#"a="\"#,
            r#"x="a\""#,
            "for=10.0.0.1;",
            ";",
            ",",
            "\"",
            "for=",
            r#"for="[2001:db8:ffff::1]:_x","#,
        ] {
            let line = unit.repeat(1_000_000 / unit.len());
            let h = fwd(&[&line]);
            let got = c.resolve(ip(PROXY), &h);
            assert!(got == ip(PROXY) || c.is_trusted(got), "{unit:?}: {got}");
            let _ = forwarded_line_rtl(line.as_bytes()).count();
        }
        for unit in [",", " ", "10.0.0.1,", "[", "[::1]:", "x"] {
            let line = unit.repeat(1_000_000 / unit.len());
            let got = proxies().resolve(ip(PROXY), &xff(&[&line]));
            assert!(
                got == ip(PROXY) || proxies().is_trusted(got),
                "{unit:?}: {got}"
            );
        }
    }

    #[test]
    fn ipv6_grouping() {
        let c = ClientIp::peer();
        let a = ip("2001:db8:1:2:3:4:5:6");
        assert_eq!(c.resolve(a, &HeaderMap::new()), ip("2001:db8:1:2::"));
        assert_eq!(
            c.resolve(ip("2001:db8:1:2:ffff::"), &HeaderMap::new()),
            c.resolve(a, &HeaderMap::new())
        );
        let exact = c.clone().ipv6_prefix(128).unwrap();
        assert_eq!(exact.resolve(a, &HeaderMap::new()), a);
        let site = c.clone().ipv6_prefix(48).unwrap();
        assert_eq!(site.resolve(a, &HeaderMap::new()), ip("2001:db8:1::"));
        let all = c.clone().ipv6_prefix(0).unwrap();
        assert_eq!(all.resolve(a, &HeaderMap::new()), ip("::"));
        // IPv4 untouched by default, groupable.
        let v4 = ip("192.0.2.77");
        assert_eq!(c.resolve(v4, &HeaderMap::new()), v4);
        let c24 = c.clone().ipv4_prefix(24).unwrap();
        assert_eq!(c24.resolve(v4, &HeaderMap::new()), ip("192.0.2.0"));
        let c0 = c.clone().ipv4_prefix(0).unwrap();
        assert_eq!(c0.resolve(v4, &HeaderMap::new()), ip("0.0.0.0"));
        // Every prefix keeps exactly its leading bits (the mask is set when the prefix is).
        for len in 0..=32u8 {
            let kept = u32::from(
                c.clone()
                    .ipv4_prefix(len)
                    .unwrap()
                    .mask_v4(Ipv4Addr::BROADCAST),
            );
            assert_eq!(
                (kept.leading_ones(), kept.count_ones()),
                (len.into(), len.into())
            );
        }
        // Trust is checked on the exact address, before grouping.
        let one = ClientIp::behind_proxies(["2001:db8:1:2::1", PROXY]).unwrap();
        let h = xff(&["2001:db8:1:2::2, 2001:db8:1:2::1"]);
        assert_eq!(one.resolve(ip(PROXY), &h), ip("2001:db8:1:2::"));
        assert_eq!(one.resolve_unmasked(ip(PROXY), &h), ip("2001:db8:1:2::2"));
        // Grouping applies to addresses from headers.
        let h = xff(&["2001:db8:1:2:3:4:5:6"]);
        assert_eq!(proxies().resolve(ip(PROXY), &h), ip("2001:db8:1:2::"));
        assert_eq!(proxies().resolve_unmasked(ip(PROXY), &h), a);
    }

    #[test]
    fn ipv4_mapped_addresses_are_normalized() {
        let c = proxies();
        // A mapped trusted peer is trusted; a mapped hop comes out as IPv4.
        let h = xff(&["::ffff:198.51.100.7"]);
        assert_eq!(c.resolve(ip("::ffff:10.0.0.1"), &h), ip("198.51.100.7"));
        let h = xff(&["[::ffff:198.51.100.7]:1234, ::ffff:10.0.0.5"]);
        assert_eq!(c.resolve(ip(PROXY), &h), ip("198.51.100.7"));
        assert_eq!(
            ClientIp::peer().resolve(ip("::ffff:192.0.2.1"), &HeaderMap::new()),
            ip("192.0.2.1")
        );
        // Trusted blocks given in mapped form cover the IPv4 addresses.
        let m = ClientIp::behind_proxies(["::ffff:10.0.0.0/104"]).unwrap();
        assert!(m.is_trusted(ip("10.1.2.3")));
        assert!(m.is_trusted(ip("::ffff:10.1.2.3")));
        assert!(!m.is_trusted(ip("11.0.0.1")));
        assert_eq!(
            key_bytes(ip("::ffff:192.0.2.1")),
            key_bytes(ip("192.0.2.1"))
        );
    }

    #[test]
    fn config_errors() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "",
            "10.0.0",
            "example.com",
            "10.0.0.0/8/8",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0.0/",
            // Zero-padded parts, which many tools read as octal (8.0.0.8): refused with a
            // prefix as without one (ipnet's parser read them as decimal).
            "010.0.0.8",
            "010.0.0.8/32",
            "10.0.0.010/32",
            "::ffff:010.0.0.1/128",
        ] {
            let err = ClientIp::behind_proxies(["127.0.0.1", bad]).unwrap_err();
            assert_eq!(
                err,
                ClientIpError::InvalidProxy {
                    input: bad.to_owned()
                }
            );
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        for every in [
            "0.0.0.0/0",
            " ::/0",
            "10.0.0.0/0",
            "::ffff:0:0/96",
            "::ffff:10.0.0.0/96",
            "::/64",
            "::/1",
            // Every client of a NAT64 translator.
            "64:ff9b::/96",
            "64:ff9b::/64",
            "64::/16",
        ] {
            let err = ClientIp::behind_proxies(["127.0.0.1", every]).unwrap_err();
            assert_eq!(
                err,
                ClientIpError::TrustsEveryAddress {
                    input: every.to_owned()
                }
            );
        }
        // Together, none alone: refused, naming them all.
        for together in [
            &["0.0.0.0/1", "128.0.0.0/1"][..],
            // Every address a client can connect from: only multicast and reserved left out.
            &["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3"][..],
            &["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4"][..],
            &["::ffff:0.0.0.0/97", "::ffff:128.0.0.0/98", "192.0.0.0/3"][..],
            // Every public address, the private and loopback blocks (10/8, 127/8) left out.
            &[
                "0.0.0.0/5",
                "8.0.0.0/7",
                "11.0.0.0/8",
                "12.0.0.0/6",
                "16.0.0.0/4",
                "32.0.0.0/3",
                "64.0.0.0/3",
                "96.0.0.0/4",
                "112.0.0.0/5",
                "120.0.0.0/6",
                "124.0.0.0/7",
                "126.0.0.0/8",
                "128.0.0.0/2",
                "192.0.0.0/3",
            ][..],
            &[
                "0.0.0.0/2",
                "::ffff:64.0.0.0/98",
                "128.0.0.0/2",
                "192.0.0.0/2",
            ][..],
            &["2000::/3"][..],
            &["2000::/4", "3000::/4"][..],
            &["2000::/3", "2001:db8::1"][..],
            &["64:ff9b::/97", "64:ff9b::8000:0/97"][..],
            &["64:ff9b::/98", "64:ff9b::4000:0/98", "64:ff9b::8000:0/97"][..],
            // Every client of a translator, as for IPv4: only the NAT64 forms of multicast and
            // reserved (`224.0.0.0/3`) left out.
            &["64:ff9b::/97", "64:ff9b::8000:0/98", "64:ff9b::c000:0/99"][..],
            // Every global unicast address but the documentation block `3fff::/20`.
            &[
                "2000::/4",
                "3000::/5",
                "3800::/6",
                "3c00::/7",
                "3e00::/8",
                "3f00::/9",
                "3f80::/10",
                "3fc0::/11",
                "3fe0::/12",
                "3ff0::/13",
                "3ff8::/14",
                "3ffc::/15",
                "3ffe::/16",
                "3fff:1000::/20",
                "3fff:2000::/19",
                "3fff:4000::/18",
                "3fff:8000::/17",
            ][..],
        ] {
            let err = ClientIp::behind_proxies(together).unwrap_err();
            assert_eq!(
                err,
                ClientIpError::TrustsEveryAddress {
                    input: together.join(", ")
                },
                "{together:?}"
            );
        }
        // Half of each, or all of it but some public addresses: not every client.
        for fine in [
            &["0.0.0.0/1"][..],
            // 216.0.0.0 to 223.255.255.255 left out.
            &["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/4", "208.0.0.0/5"][..],
            // All but one public address (8.8.8.8).
            &[
                "0.0.0.0/5",
                "8.0.0.0/13",
                "8.8.0.0/21",
                "8.8.8.0/29",
                "8.8.8.9/32",
                "8.8.8.10/31",
                "8.8.8.12/30",
                "8.8.8.16/28",
                "8.8.8.32/27",
                "8.8.8.64/26",
                "8.8.8.128/25",
                "8.8.9.0/24",
                "8.8.10.0/23",
                "8.8.12.0/22",
                "8.8.16.0/20",
                "8.8.32.0/19",
                "8.8.64.0/18",
                "8.8.128.0/17",
                "8.9.0.0/16",
                "8.10.0.0/15",
                "8.12.0.0/14",
                "8.16.0.0/12",
                "8.32.0.0/11",
                "8.64.0.0/10",
                "8.128.0.0/9",
                "9.0.0.0/8",
                "10.0.0.0/7",
                "12.0.0.0/6",
                "16.0.0.0/4",
                "32.0.0.0/3",
                "64.0.0.0/2",
                "128.0.0.0/1",
            ][..],
            &["2000::/4"][..],
            &["fd00::/8", "10.0.0.0/8"][..],
            &["64:ff9b::/97", "64:ff9b::c000:0/98"][..],
        ] {
            assert!(ClientIp::behind_proxies(fine).is_ok(), "{fine:?}");
        }
        // A block written from an address inside it: one proxy with a wrong prefix, refused
        // rather than trusting the block.
        for (typo, network) in [
            ("10.1.2.3/8", "10.0.0.0/8"),
            (" 10.0.0.10/24", "10.0.0.0/24"),
            ("fd00::1/64", "fd00::/64"),
            ("::ffff:10.0.0.1/104", "::ffff:10.0.0.0/104"),
        ] {
            assert_eq!(
                ClientIp::behind_proxies(["192.0.2.1", typo]).unwrap_err(),
                ClientIpError::HostBitsSet {
                    input: typo.to_owned(),
                    network: network.to_owned(),
                },
                "{typo}"
            );
        }
        let c =
            ClientIp::behind_proxies([" 10.0.0.0/8 ", "::1", "192.0.2.1", "10.9.9.9/32"]).unwrap();
        assert!(c.is_trusted(ip("10.200.0.1")));
        assert!(c.is_trusted(ip("::1")));
        assert!(c.is_trusted(ip("192.0.2.1")));
        assert!(!c.is_trusted(ip("192.0.2.2")));
        assert!(!c.is_trusted(ip("::2")));
        let none: [&str; 0] = [];
        assert!(
            !ClientIp::behind_proxies(none)
                .unwrap()
                .is_trusted(ip("10.0.0.1"))
        );
        assert_eq!(
            ClientIp::peer().ipv6_prefix(129).unwrap_err(),
            ClientIpError::Ipv6PrefixOutOfRange(129)
        );
        assert_eq!(
            ClientIp::peer().ipv4_prefix(33).unwrap_err(),
            ClientIpError::Ipv4PrefixOutOfRange(33)
        );
        assert!(ClientIp::peer().ipv6_prefix(128).is_ok());
        assert!(ClientIp::peer().ipv4_prefix(32).is_ok());
    }

    #[test]
    fn key_encoding() {
        let k4 = key_bytes(ip("192.0.2.1"));
        assert_eq!(k4.as_bytes(), [IpKey::V4_TAG, 192, 0, 2, 1]);
        let k6 = key_bytes(ip("2001:db8::1"));
        assert_eq!(k6.len(), 17);
        assert_eq!(k6[0], IpKey::V6_TAG);
        assert_eq!(k6.ip(), ip("2001:db8::1"));
        // `0.0.0.0` and `::` do not collide.
        assert_ne!(&*key_bytes(ip("0.0.0.0")), &*key_bytes(ip("::")));
        assert_eq!(IpKey::decode(&[]), None);
        assert_eq!(IpKey::decode(&[IpKey::V4_TAG, 1, 2, 3]), None);
        assert_eq!(IpKey::decode(&[5, 1, 2, 3, 4]), None);
        assert_eq!(format!("{k4:?}"), "IpKey(192.0.2.1)");
        let c = proxies();
        assert_eq!(
            c.key(ip(PROXY), &xff(&["198.51.100.7"])),
            key_bytes(ip("198.51.100.7"))
        );
    }

    #[test]
    fn client_ip_is_send_sync_clone() {
        fn check<T: Clone + fmt::Debug + Send + Sync + 'static>() {}
        check::<ClientIp>();
        check::<ClientIpError>();
        check::<IpKey>();
    }

    // ---- property tests ----

    /// Addresses the generated headers are built from: some trusted by
    /// `proxies()`, some not.
    const POOL: &[&str] = &[
        "10.0.0.1",
        "10.0.0.5",
        "10.255.0.9",
        "198.51.100.7",
        "192.0.2.1",
        "2001:db8:ffff::1",
        "2001:db8:ffff:1::2",
        "2001:db8::7",
        "::ffff:10.0.0.5",
        "::ffff:203.0.113.3",
    ];

    /// Ways to write an address: mostly valid for the header being built
    /// (`forwarded`), sometimes in the other header's syntax.
    fn format_ip(addr: &str, style: u8, forwarded: bool) -> String {
        let v6 = addr.contains(':');
        if forwarded && style % 5 != 4 {
            return match (style % 5, v6) {
                (0, false) => format!("for={addr}"),
                (0, true) => format!("for=\"[{addr}]\""),
                (1, false) => format!("For=\"{addr}:_p\""),
                (1, true) => format!("FOR=\"[{}]:4711\"", addr.to_uppercase()),
                (2, false) => format!("proto=https;for={addr}:80 ;by=_x"),
                (2, true) => format!("proto=https;for=\"[{addr}]\";by=\"_x\""),
                (_, false) => format!("by=_a;for=\"{addr}\""),
                (_, true) => format!("for=[{addr}]:8"),
            };
        }
        match (style % 6, v6) {
            (0, _) => addr.to_owned(),
            (1, false) => format!("{addr}:8080"),
            (1, true) => format!("[{addr}]:443"),
            (2, _) => addr.to_uppercase(),
            (3, true) => format!("[{addr}]"),
            (3, false) => format!("for={addr}"),
            (4, _) => format!(" {addr}\t"),
            _ => format!("for=\"[{addr}]\""),
        }
    }

    #[derive(Clone, Debug)]
    enum Piece {
        Ip(usize, u8),
        Garbage(Vec<u8>),
        Literal(&'static str),
    }

    fn piece() -> impl Strategy<Value = Piece> {
        // Garbage has no hex digits, dots or colons, so it cannot extend an
        // address into another one. Control bytes make `HeaderValue` refuse
        // the whole line, so they are rarer.
        let garbage_byte = prop_oneof![
            6 => prop::sample::select(b"ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ_=;\"\\[]/ \t".to_vec()),
            2 => 0x80u8..=0xff,
            1 => 0u8..0x20,
        ];
        prop_oneof![
            6 => (0..POOL.len(), any::<u8>()).prop_map(|(i, s)| Piece::Ip(i, s)),
            1 => prop::collection::vec(garbage_byte, 1..8).prop_map(Piece::Garbage),
            1 => prop::sample::select(vec!["for=", "unknown", "_hidden", "for=unknown", "for=_x", "\""])
                .prop_map(Piece::Literal),
        ]
    }

    /// Mostly list separators (`\n` starts a new header line), sometimes
    /// bytes that break the syntax.
    fn separator() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            6 => prop::sample::select(vec![",", ", ", " ,\t"]),
            2 => Just("\n"),
            2 => prop::sample::select(vec![",,", ";", " ", "\"", "=", "[", "]"]),
        ]
    }

    /// Header lines built from pieces, for `Forwarded` or `X-Forwarded-For`;
    /// returns the lines and the pool addresses written into them
    /// (normalized).
    fn lines(forwarded: bool) -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<IpAddr>)> {
        prop::collection::vec((piece(), separator()), 0..12).prop_map(move |items| {
            let mut lines = vec![Vec::new()];
            let mut written = Vec::new();
            for (piece, sep) in items {
                let line = lines.last_mut().unwrap();
                match piece {
                    Piece::Ip(i, style) => {
                        line.extend_from_slice(format_ip(POOL[i], style, forwarded).as_bytes());
                        written.push(ip(POOL[i]).to_canonical());
                    }
                    Piece::Garbage(bytes) => line.extend_from_slice(&bytes),
                    Piece::Literal(s) => line.extend_from_slice(s.as_bytes()),
                }
                if sep == "\n" {
                    lines.push(Vec::new());
                } else {
                    line.extend_from_slice(sep.as_bytes());
                }
            }
            (lines, written)
        })
    }

    proptest! {
        #[test]
        fn prop_answer_is_peer_trusted_or_written(
            (forwarded, (lines, written)) in any::<bool>().prop_flat_map(|f| (Just(f), lines(f))),
            peer in prop::sample::select(POOL.to_vec()),
            both in any::<bool>(),
            decoy in any::<bool>(),
            max_hops in 0usize..8,
        ) {
            let header = match (forwarded, both) {
                (_, true) => ForwardedHeader::Both,
                (true, false) => ForwardedHeader::Forwarded,
                (false, false) => ForwardedHeader::XForwardedFor,
            };
            let c = proxies().header(header).max_hops(max_hops).ipv6_prefix(128).unwrap();
            let (name, other) = if forwarded {
                (FORWARDED, X_FORWARDED_FOR)
            } else {
                (X_FORWARDED_FOR, FORWARDED)
            };
            let peer = ip(peer);
            let mut h = HeaderMap::new();
            for line in &lines {
                // Lines `HeaderValue` refuses cannot reach us; check them raw.
                let _ = forwarded_line_rtl(line).count();
                let _ = xff_line_rtl(line).count();
                if let Ok(value) = HeaderValue::from_bytes(line) {
                    h.append(name.clone(), value.clone());
                    if decoy {
                        h.append(other.clone(), value);
                    }
                }
            }
            let got = c.resolve(peer, &h);
            prop_assert_eq!(got, c.resolve_unmasked(peer, &h));
            let peer = peer.to_canonical();
            if !c.is_trusted(peer) {
                prop_assert_eq!(got, peer);
            }
            prop_assert!(
                got == peer || c.is_trusted(got) || written.contains(&got),
                "got {} from {:?}", got, lines
            );
        }

        #[test]
        fn prop_random_bytes_never_panic(
            lines in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..4),
            max_hops in 0usize..40,
        ) {
            // Every IPv4 address and most IPv6 ones trusted, so that the
            // headers are read to their end: built past `behind_proxies`,
            // which refuses such a list (a /0 entry, or one holding the
            // IPv4-mapped block, is refused by the parse too).
            let every = ["0.0.0.0/1", "128.0.0.0/1", "2000::/3", "4000::/2", "8000::/1"];
            let nets: Vec<IpNet> = every.iter().map(|e| parse_trusted(e).unwrap()).collect();
            let c = ClientIp {
                trusted: Arc::from(nets),
                ..ClientIp::peer()
            }
            .max_hops(max_hops);
            let mut h = HeaderMap::new();
            for line in &lines {
                let _ = forwarded_line_rtl(line).take(max_hops).count();
                let _ = xff_line_rtl(line).count();
                if let Ok(v) = HeaderValue::from_bytes(line) {
                    h.append(X_FORWARDED_FOR, v.clone());
                    h.append(FORWARDED, v);
                }
            }
            for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
                let _ = c.clone().header(header).key(ip("10.0.0.1"), &h);
            }
        }

        #[test]
        fn prop_clean_lists_match_a_simple_model(
            chain in prop::collection::vec(0..POOL.len(), 0..10),
            per_line in 1usize..4,
            forwarded in any::<bool>(),
            max_hops in 0usize..12,
        ) {
            let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
            let c = proxies().header(header).max_hops(max_hops);
            let addrs: Vec<IpAddr> = chain.iter().map(|&i| ip(POOL[i])).collect();
            let mut h = HeaderMap::new();
            for group in chain.chunks(per_line) {
                let line = group.iter().map(|&i| if forwarded {
                    format_ip(POOL[i], 0, true)
                } else {
                    POOL[i].to_owned()
                }).collect::<Vec<_>>().join(", ");
                h.append(if forwarded { FORWARDED } else { X_FORWARDED_FOR },
                         HeaderValue::from_str(&line).unwrap());
            }
            // Model: from the right, skip trusted, take the first untrusted.
            let mut want = ip(PROXY);
            for a in addrs.iter().rev().take(max_hops) {
                let a = a.to_canonical();
                want = a;
                if !c.is_trusted(a) {
                    break;
                }
            }
            prop_assert_eq!(c.resolve_unmasked(ip(PROXY), &h), want);
        }

        #[test]
        fn prop_key_without_trusted_proxies_is_the_masked_peer(
            v6 in any::<[u8; 16]>(),
            v4 in any::<[u8; 4]>(),
            form in 0u8..3,
            v4_prefix in 0u8..=32,
            v6_prefix in 0u8..=128,
            line in prop::sample::select(vec!["203.0.113.7", "for=198.51.100.1", "2001:db8::1, 10.0.0.1"]),
        ) {
            // With no proxy trusted, the key is the masked peer whatever the headers say, for
            // IPv4, IPv6 and IPv4-mapped IPv6 peers and any prefix.
            let peer = match form {
                0 => IpAddr::V4(Ipv4Addr::from(v4)),
                1 => IpAddr::V6(Ipv6Addr::from(v6)),
                _ => IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_mapped()),
            };
            let mut h = HeaderMap::new();
            h.append(X_FORWARDED_FOR, HeaderValue::from_static(line));
            h.append(FORWARDED, HeaderValue::from_static(line));
            let none: [&str; 0] = [];
            for c in [ClientIp::peer(), ClientIp::behind_proxies(none).unwrap()] {
                let c = c.ipv4_prefix(v4_prefix).unwrap().ipv6_prefix(v6_prefix).unwrap();
                prop_assert_eq!(c.key(peer, &h).to_vec(), key_bytes(c.resolve(peer, &h)).to_vec());
                prop_assert_eq!(c.key(peer, &h).to_vec(), key_bytes(c.mask(peer)).to_vec());
            }
        }

        /// Grouping is idempotent and keeps the family, except for the NAT64 well-known prefix,
        /// whose addresses are grouped as the IPv4 address they carry (the invariant the
        /// `key_encoding` fuzz target checks, here where CI runs it).
        #[test]
        fn prop_masking_is_idempotent_and_keeps_the_family_but_for_nat64(
            v6 in any::<[u8; 16]>(),
            v4 in any::<[u8; 4]>(),
            form in 0u8..4,
            v4_prefix in 0u8..=32,
            v6_prefix in 0u8..=128,
        ) {
            let carried = Ipv4Addr::from(v4);
            let addr = match form {
                0 => IpAddr::V4(carried),
                1 => IpAddr::V6(Ipv6Addr::from(v6)),
                2 => IpAddr::V6(carried.to_ipv6_mapped()),
                _ => IpAddr::V6(Ipv6Addr::from((NAT64_WELL_KNOWN << 32) | u128::from(carried.to_bits()))),
            };
            let c = ClientIp::peer().ipv4_prefix(v4_prefix).unwrap().ipv6_prefix(v6_prefix).unwrap();
            let masked = c.mask(addr);
            if !lands_in_nat64(masked) {
                prop_assert_eq!(c.mask(masked), masked);
            }
            if form == 3 {
                prop_assert_eq!(masked, c.mask(IpAddr::V4(carried)));
            } else {
                prop_assert_eq!(masked.is_ipv4(), addr.to_canonical().is_ipv4());
            }
        }

        /// Whatever a client writes in its `Forwarded` header (any printable
        /// bytes, quotes and backslashes included), the elements that trusted
        /// proxies append to the same line decide the answer: the client's
        /// address, as the nearest untrusted hop they wrote.
        #[test]
        fn prop_client_text_cannot_change_appended_elements(
            client in prop::collection::vec(
                prop::sample::select(vec![
                    "a=\"", "for=\"", "for=", "\"", "\\", ",", ";", " ", "=", "[", "]:", "_x",
                    "1.2.3.4", "x=\"a\\\"", "for=6.6.6.6",
                ]),
                0..8,
            ).prop_map(|parts| parts.concat().into_bytes()),
            addr in prop::sample::select(vec!["198.51.100.7", "192.0.2.1", "2001:db8::7", "::ffff:203.0.113.3"]),
            style in 0u8..4,
            proxies_behind in 0usize..3,
        ) {
            let c = proxies().header(ForwardedHeader::Forwarded).ipv6_prefix(128).unwrap();
            let mut line = client.clone();
            line.extend_from_slice(b", ");
            line.extend_from_slice(format_ip(addr, style, true).as_bytes());
            for hop in ["10.0.0.5", "10.255.0.9"].iter().take(proxies_behind) {
                line.extend_from_slice(format!(", for={hop}").as_bytes());
            }
            let h = fwd(&[std::str::from_utf8(&line).unwrap()]);
            prop_assert_eq!(c.resolve(ip(PROXY), &h), ip(addr).to_canonical(), "{:?}", String::from_utf8_lossy(&line));
        }

        /// The key encoding round-trips for every kind of address (IPv4, IPv6, IPv4-mapped IPv6,
        /// which is keyed as its IPv4 address), and decoding is exact: bytes that decode are
        /// those the address encodes to. The bytes are mostly a tag and a body of the right
        /// length (a mapped address under the IPv6 tag included, which must not decode), some
        /// a wrong length or tag.
        #[test]
        fn prop_key_roundtrip(
            tag in prop::sample::select(vec![IpKey::V4_TAG, IpKey::V6_TAG, 0u8, 0xff]),
            len in prop::sample::select(vec![4usize, 16, 16, 0, 3, 5, 15, 17]),
            body in any::<[u8; 17]>(),
            mapped_body in any::<bool>(),
            v4 in any::<u32>(),
            v6 in any::<u128>(),
        ) {
            let mut bytes = vec![tag];
            if mapped_body && len == 16 {
                bytes.extend_from_slice(&Ipv4Addr::from(v4).to_ipv6_mapped().octets());
            } else {
                bytes.extend_from_slice(&body[..len]);
            }
            let valid = match (tag, len) {
                (IpKey::V4_TAG, 4) => true,
                (IpKey::V6_TAG, 16) => {
                    let octets = <[u8; 16]>::try_from(&bytes[1..]).unwrap();
                    Ipv6Addr::from(octets).to_ipv4_mapped().is_none()
                }
                _ => false,
            };
            match IpKey::decode(&bytes) {
                Some(addr) => prop_assert_eq!(key_bytes(addr).to_vec(), bytes),
                None => prop_assert!(!valid, "a valid encoding refused: {:?}", bytes),
            }
            let mapped = IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_mapped());
            for addr in [IpAddr::V4(Ipv4Addr::from(v4)), IpAddr::V6(Ipv6Addr::from(v6)), mapped] {
                prop_assert_eq!(IpKey::decode(&key_bytes(addr)), Some(addr.to_canonical()));
            }
            prop_assert_eq!(key_bytes(mapped).to_vec(), key_bytes(IpAddr::V4(Ipv4Addr::from(v4))).to_vec());
        }
    }
}
