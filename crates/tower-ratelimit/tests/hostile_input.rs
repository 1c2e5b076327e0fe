//! Hostile input from the network, through real axum `Router`s: generated requests (odd methods
//! and paths, header values of any legal bytes up to 64 KiB, repeated and malformed `Forwarded` /
//! `X-Forwarded-For` lines, gRPC content types, missing `ConnectInfo`) against layers of many
//! configurations. Every answer must be one the docs name: the inner handler's 200, a 429, the
//! configured missing-key answer, a 401 with its challenge, a 503 only when failing closed, or
//! their gRPC forms; with well-formed `Retry-After` and `RateLimit` / `RateLimit-Policy` fields
//! (draft-ietf-httpapi-ratelimit-headers-10), bodies that match their content type, a
//! [`Verdict`] when the policy asks for one, and every decision counted. And spoofed forwarding
//! headers never multiply a client's quota.

// The peer-address extractors these tests use come with the default `axum` feature.
#![cfg(feature = "axum")]

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing;
use common::*;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use proptest::prelude::*;
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota};
use tower::ServiceExt;
use tower_ratelimit::key::{self, ApiKeyHeader, ClientIpKey, PeerIp, RouteKey};
use tower_ratelimit::response::QUOTA_EXCEEDED_TYPE;
use tower_ratelimit::{
    ClientIp, DenialBody, FailurePolicy, ForwardedHeader, Headers, MissingKey, Policy,
    RateLimitLayer, RequestHead, Verdict, VerdictKind,
};

// ---------------------------------------------------------------------------------------------
// Checkers: structured fields (RFC 9651) and JSON, written out here so that they share nothing
// with the code under test.

/// One item of a structured-field list: a string and its integer parameters.
#[derive(Debug)]
struct SfItem {
    name: String,
    params: Vec<(String, i64)>,
}

/// Parses the field lines `lines` (joined with `, ` as RFC 9651 says) as a list whose every member
/// is a string with integer parameters; `Err` says what is wrong.
fn parse_sf_list(lines: &[&[u8]]) -> Result<Vec<SfItem>, String> {
    parse_list(lines, false)
}

/// As [`parse_sf_list`], members also taken as Tokens (`up;r=1`: a letter or `*`, then token
/// characters, `:` or `/`), as an upstream may name its items.
fn parse_sf_list_with_tokens(lines: &[&[u8]]) -> Result<Vec<SfItem>, String> {
    parse_list(lines, true)
}

fn parse_list(lines: &[&[u8]], tokens: bool) -> Result<Vec<SfItem>, String> {
    let joined = lines.join(&b", "[..]);
    let s = &joined[..];
    let mut i = 0;
    let sp = |i: &mut usize| {
        while s.get(*i) == Some(&b' ') {
            *i += 1;
        }
    };
    let ows = |i: &mut usize| {
        while matches!(s.get(*i), Some(b' ' | b'\t')) {
            *i += 1;
        }
    };
    sp(&mut i);
    let mut items = Vec::new();
    if i == s.len() {
        return Err("empty list".into());
    }
    loop {
        let mut name = String::new();
        if tokens
            && s.get(i)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'*')
        {
            // sf-token
            let start = i;
            while s
                .get(i)
                .is_some_and(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(c))
            {
                i += 1;
            }
            name = String::from_utf8(s[start..i].to_vec()).unwrap();
        } else {
            // sf-string
            if s.get(i) != Some(&b'"') {
                return Err(format!("member at {i} is not a string"));
            }
            i += 1;
            loop {
                match s.get(i) {
                    None => return Err("unterminated string".into()),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') => match s.get(i + 1) {
                        Some(&c @ (b'"' | b'\\')) => {
                            name.push(char::from(c));
                            i += 2;
                        }
                        _ => return Err("bad escape".into()),
                    },
                    Some(&c) if (0x20..0x7f).contains(&c) => {
                        name.push(char::from(c));
                        i += 1;
                    }
                    Some(c) => return Err(format!("byte {c:#x} in a string")),
                }
            }
        }
        // parameters
        let mut params = Vec::new();
        while s.get(i) == Some(&b';') {
            i += 1;
            sp(&mut i);
            let start = i;
            match s.get(i) {
                Some(c) if c.is_ascii_lowercase() || *c == b'*' => i += 1,
                _ => return Err("bad parameter key".into()),
            }
            while s.get(i).is_some_and(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c)
            }) {
                i += 1;
            }
            let key = String::from_utf8(s[start..i].to_vec()).unwrap();
            if s.get(i) != Some(&b'=') {
                return Err(format!("parameter {key} has no integer value"));
            }
            i += 1;
            let num_start = i;
            if s.get(i) == Some(&b'-') {
                i += 1;
            }
            let digits = s[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 || digits > 15 {
                return Err(format!("parameter {key}: {digits} digits"));
            }
            i += digits;
            let n: i64 = std::str::from_utf8(&s[num_start..i])
                .unwrap()
                .parse()
                .unwrap();
            if params.iter().any(|(k, _)| *k == key) {
                return Err(format!("parameter {key} twice"));
            }
            params.push((key, n));
        }
        items.push(SfItem { name, params });
        ows(&mut i);
        match s.get(i) {
            None => return Ok(items),
            Some(b',') => {
                i += 1;
                ows(&mut i);
                if i == s.len() {
                    return Err("trailing comma".into());
                }
            }
            Some(c) => return Err(format!("unexpected byte {c:#x} at {i}")),
        }
    }
}

fn param(item: &SfItem, key: &str) -> Option<i64> {
    item.params.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// A JSON value, as much of it as the checks need.
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Parses `s` as one JSON text (RFC 8259), strictly.
fn parse_json(s: &[u8]) -> Result<Json, String> {
    struct P<'a> {
        s: &'a [u8],
        i: usize,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }
        fn lit(&mut self, l: &[u8], v: Json) -> Result<Json, String> {
            if self.s[self.i..].starts_with(l) {
                self.i += l.len();
                Ok(v)
            } else {
                Err(format!("bad literal at {}", self.i))
            }
        }
        fn string(&mut self) -> Result<String, String> {
            self.i += 1;
            let mut out = Vec::new();
            loop {
                match self.s.get(self.i) {
                    None => return Err("unterminated string".into()),
                    Some(b'"') => {
                        self.i += 1;
                        return String::from_utf8(out).map_err(|e| e.to_string());
                    }
                    Some(b'\\') => {
                        let c = *self.s.get(self.i + 1).ok_or("bad escape")?;
                        match c {
                            b'"' | b'\\' | b'/' => out.push(c),
                            b'b' | b'f' | b'n' | b'r' | b't' => out.push(b' '),
                            b'u' => {
                                let hex = self.s.get(self.i + 2..self.i + 6).ok_or("bad \\u")?;
                                if !hex.iter().all(u8::is_ascii_hexdigit) {
                                    return Err("bad \\u".into());
                                }
                                out.push(b'?');
                                self.i += 4;
                            }
                            _ => return Err("bad escape".into()),
                        }
                        self.i += 2;
                    }
                    Some(&c) if c < 0x20 => return Err("control byte in a string".into()),
                    Some(&c) => {
                        out.push(c);
                        self.i += 1;
                    }
                }
            }
        }
        fn value(&mut self) -> Result<Json, String> {
            self.ws();
            let v = match self.s.get(self.i) {
                None => return Err("no value".into()),
                Some(b'n') => self.lit(b"null", Json::Null)?,
                Some(b't') => self.lit(b"true", Json::Bool(true))?,
                Some(b'f') => self.lit(b"false", Json::Bool(false))?,
                Some(b'"') => Json::Str(self.string()?),
                Some(b'[') => {
                    self.i += 1;
                    let mut items = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b']') {
                        self.i += 1;
                    } else {
                        loop {
                            items.push(self.value()?);
                            self.ws();
                            match self.s.get(self.i) {
                                Some(b',') => self.i += 1,
                                Some(b']') => {
                                    self.i += 1;
                                    break;
                                }
                                _ => return Err("bad array".into()),
                            }
                        }
                    }
                    Json::Arr(items)
                }
                Some(b'{') => {
                    self.i += 1;
                    let mut members = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b'}') {
                        self.i += 1;
                    } else {
                        loop {
                            self.ws();
                            if self.s.get(self.i) != Some(&b'"') {
                                return Err("object key is not a string".into());
                            }
                            let k = self.string()?;
                            self.ws();
                            if self.s.get(self.i) != Some(&b':') {
                                return Err("no colon".into());
                            }
                            self.i += 1;
                            let v = self.value()?;
                            if members.iter().any(|(m, _): &(String, Json)| *m == k) {
                                return Err(format!("duplicate key {k}"));
                            }
                            members.push((k, v));
                            self.ws();
                            match self.s.get(self.i) {
                                Some(b',') => self.i += 1,
                                Some(b'}') => {
                                    self.i += 1;
                                    break;
                                }
                                _ => return Err("bad object".into()),
                            }
                        }
                    }
                    Json::Obj(members)
                }
                Some(c) if *c == b'-' || c.is_ascii_digit() => {
                    let start = self.i;
                    while self
                        .s
                        .get(self.i)
                        .is_some_and(|c| c.is_ascii_digit() || b"-+.eE".contains(c))
                    {
                        self.i += 1;
                    }
                    let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                    Json::Num(text.parse().map_err(|_| format!("bad number {text}"))?)
                }
                Some(c) => return Err(format!("unexpected byte {c:#x}")),
            };
            Ok(v)
        }
    }
    let mut p = P { s, i: 0 };
    let v = p.value()?;
    p.ws();
    if p.i != s.len() {
        return Err(format!("trailing bytes at {}", p.i));
    }
    Ok(v)
}

#[test]
fn the_checkers_accept_and_refuse_what_they_should() {
    let ok = parse_sf_list(&[b"\"a\\\"b\";q=10;w=1, \"c\";q=2;w=60", b"\"d\";r=0;t=3"]).unwrap();
    assert_eq!(ok.len(), 3);
    assert_eq!(ok[0].name, "a\"b");
    assert_eq!(param(&ok[2], "t"), Some(3));
    for bad in [
        &b""[..],
        b"a;q=1",
        b"\"a\";q=1,",
        b"\"a\";Q=1",
        b"\"a\";q=1.5",
        b"\"a\";q=1234567890123456",
        b"\"a\";q",
        b"\"a\";q=1;q=2",
        b"\"a\" \"b\"",
        b"\"a\\x\"",
        b"\"\xff\"",
    ] {
        assert!(
            parse_sf_list(&[bad]).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let j = parse_json(br#"{"a":[1,"x",{"b":null}],"status":429}"#).unwrap();
    assert_eq!(j.get("status"), Some(&Json::Num(429.0)));
    for bad in [
        &b"{"[..],
        b"{\"a\":1,}",
        b"{\"a\" 1}",
        b"\"\x01\"",
        b"{} x",
        b"{\"a\":1,\"a\":2}",
    ] {
        assert!(parse_json(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

// ---------------------------------------------------------------------------------------------
// Configurations.

/// What a request without a key is answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Missing {
    Reject(u16),
    Unauthorized,
    Shared,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum BodyKind {
    Plain,
    Problem,
    Grpc,
}

/// A router with one layer, and what its policy says it answers.
struct Setup {
    app: Router,
    clock: ManualClock,
    name: &'static str,
    /// The `RateLimit-Policy` item names, in order.
    items: Vec<String>,
    missing: Missing,
    body: BodyKind,
    verdict: bool,
    ietf: bool,
    legacy: bool,
    on_allowed: bool,
    dry_run: bool,
    /// The store always fails: `Some(fail-closed Retry-After)`, or `None` for the fallback.
    failing: Option<Option<u64>>,
    /// The memory store behind a `SwitchStore` that answers after a yield (the layer's path for
    /// a store that has to wait), up (`Some(false)`) or down (`Some(true)`).
    switch: Option<bool>,
    snapshotter: metrics_util::debugging::Snapshotter,
}

const CONFIGS: usize = 13;
const PROXY_V4: &str = "10.0.0.10";
const PROXY_V6: &str = "2001:db8:ffff::10";

/// A cost read from the client's own `x-cost` header (any number, or 1).
fn cost_from_header(req: &RequestHead<'_>) -> u64 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1)
}

fn ok_router() -> Router {
    let ok = || async { "ok" };
    Router::new()
        .route("/", routing::any(ok))
        .route("/users/{id}", routing::any(ok))
        .fallback(ok)
}

fn setup(config: usize, algorithm: Algorithm) -> Setup {
    setup_with(
        config,
        algorithm,
        Limit::single(algorithm, Quota::per_minute(3).unwrap()).unwrap(),
    )
}

/// Configuration `config` with `three` in place of its 3 a minute (the configurations with
/// limits of their own keep them).
fn setup_with(config: usize, algorithm: Algorithm, three: Limit) -> Setup {
    let clock = ManualClock::new();
    let store = std::sync::Arc::new(
        ratelimit_core::MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap(),
    );
    let proxies = || ClientIp::behind_proxies([PROXY_V4, PROXY_V6]).unwrap();
    let mut s = Setup {
        app: Router::new(),
        clock,
        name: "",
        items: Vec::new(),
        missing: Missing::Reject(400),
        body: BodyKind::Plain,
        verdict: true,
        ietf: true,
        legacy: false,
        on_allowed: true,
        dry_run: false,
        failing: None,
        switch: None,
        snapshotter: metrics_util::debugging::DebuggingRecorder::new().snapshotter(),
    };
    let policy = match config {
        0 => {
            s.name = "api";
            Policy::new(s.name, three)
                .unwrap()
                .key(ApiKeyHeader::new("x-api-key").unwrap())
        }
        1 => {
            s.name = "xff";
            s.body = BodyKind::Problem;
            s.missing = Missing::Reject(403);
            s.legacy = true;
            Policy::new(s.name, three)
                .unwrap()
                .key(ClientIpKey::new(proxies()))
                .body(DenialBody::ProblemJson)
                .missing_key(MissingKey::reject(403).unwrap())
                .headers(Headers::ietf().legacy(true))
        }
        2 => {
            s.name = "fwd";
            s.body = BodyKind::Grpc;
            s.missing = Missing::Unauthorized;
            s.on_allowed = false;
            Policy::new(s.name, three)
                .unwrap()
                .key(ClientIpKey::new(
                    proxies().header(ForwardedHeader::Forwarded),
                ))
                .body(DenialBody::Grpc)
                .missing_key(MissingKey::unauthorized("Bearer realm=\"api\"").unwrap())
                .headers(Headers::ietf().on_allowed(false))
        }
        3 => {
            s.name = "both";
            s.missing = Missing::Shared;
            s.verdict = false;
            s.ietf = false;
            Policy::new(s.name, three)
                .unwrap()
                .key(ClientIpKey::new(
                    proxies()
                        .header(ForwardedHeader::Both)
                        .max_hops(4)
                        .ipv4_prefix(24)
                        .unwrap(),
                ))
                .missing_key(MissingKey::shared_key("anon"))
                .headers(Headers::none())
                .verdict(false)
        }
        4 => {
            // A name with the structured fields' separators (`;`, `,`, `=`, a space), which must
            // stay inside its string. (`"` and `\`, which would need escaping, are refused: a
            // Prometheus exporter would not tell `a"b` from `a\"b` in the metrics' label.)
            s.name = "we'ird name;q=1,x";
            s.ietf = false;
            s.legacy = true;
            let limit = Limit::new(
                algorithm,
                [Quota::per_second(2).unwrap(), Quota::per_hour(5).unwrap()],
            )
            .unwrap();
            Policy::new(s.name, limit)
                .unwrap()
                .key(PeerIp::new())
                .cost(cost_from_header)
                .headers(Headers::none().legacy(true))
        }
        5 => {
            s.name = "or";
            s.body = BodyKind::Grpc;
            Policy::new(s.name, three)
                .unwrap()
                .key(key::or(
                    ApiKeyHeader::new("authorization").unwrap(),
                    PeerIp::new().ipv6_prefix(56).unwrap(),
                ))
                .body(DenialBody::Grpc)
        }
        6 => {
            s.name = "route+user";
            s.body = BodyKind::Problem;
            s.dry_run = true;
            Policy::new(s.name, three)
                .unwrap()
                .key((RouteKey::new(), ApiKeyHeader::new("x-user").unwrap()))
                .body(DenialBody::ProblemJson)
                .dry_run(true)
        }
        7 => {
            s.name = "closed";
            s.body = BodyKind::Grpc;
            s.missing = Missing::Reject(404);
            s.failing = Some(Some(2));
            Policy::new(s.name, three)
                .unwrap()
                .key(ApiKeyHeader::new("x-api-key").unwrap())
                .missing_key(MissingKey::reject(404).unwrap())
                .body(DenialBody::Grpc)
                .failure(FailurePolicy::fail_closed(Duration::from_millis(1_500)))
        }
        8 => {
            s.name = "tiers";
            s.body = BodyKind::Problem;
            // The tier named by the client's own header; unknown names get the base limit.
            // (The same limit as the base: the fields name one set of items, whichever tier.)
            Policy::new(s.name, three.clone())
                .unwrap()
                .key(ApiKeyHeader::new("x-api-key").unwrap())
                .tier("pro", three)
                .unwrap()
                .resolve_tier(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
                .allow(|req| req.uri().path() == "/health")
                .cost(cost_from_header)
                .body(DenialBody::ProblemJson)
        }
        9 => {
            s.name = "triple";
            s.ietf = true;
            s.legacy = true;
            s.on_allowed = false;
            let tenant = |req: &RequestHead<'_>| req.headers().get("x-tenant").cloned();
            Policy::new(s.name, three)
                .unwrap()
                .key((tenant, RouteKey::new(), PeerIp::new()))
                .headers(Headers::ietf().legacy(true).on_allowed(false))
        }
        10 => {
            s.name = "fallback";
            s.failing = Some(None);
            // Two gateways: each counts half of 4 a minute while the store is down, and a cost
            // of 3 or 4 (the client's own `x-cost`) waits for the store, not forever.
            let four = Limit::single(algorithm, Quota::per_minute(4).unwrap()).unwrap();
            Policy::new(s.name, four)
                .unwrap()
                .key(ClientIpKey::new(proxies()))
                .cost(cost_from_header)
                .failure(FailurePolicy::fallback(2).unwrap())
        }
        11 => {
            s.name = "async";
            s.body = BodyKind::Grpc;
            s.legacy = true;
            s.switch = Some(false);
            Policy::new(s.name, three)
                .unwrap()
                .key(PeerIp::new())
                .cost(cost_from_header)
                .body(DenialBody::Grpc)
                .headers(Headers::ietf().legacy(true))
        }
        12 => {
            s.name = "async-down";
            s.body = BodyKind::Problem;
            s.failing = Some(Some(2));
            s.switch = Some(true);
            Policy::new(s.name, three)
                .unwrap()
                .key(ApiKeyHeader::new("x-api-key").unwrap())
                .body(DenialBody::ProblemJson)
                .failure(FailurePolicy::fail_closed(Duration::from_millis(1_500)))
        }
        _ => unreachable!(),
    };
    s.items = {
        let n = policy.limit().quotas().len();
        if n == 1 {
            vec![s.name.to_owned()]
        } else {
            (0..n).map(|i| format!("{}.{i}", s.name)).collect()
        }
    };
    let (app, snapshotter) = if let Some(down) = s.switch {
        let switch = SwitchStore::new(store);
        switch.set_down(down);
        recorded(|| ok_router().layer(RateLimitLayer::new(switch, policy).unwrap()))
    } else if s.failing.is_some() {
        recorded(|| {
            ok_router().layer(RateLimitLayer::new(FailingStore::default(), policy).unwrap())
        })
    } else {
        recorded(|| ok_router().layer(RateLimitLayer::new(store, policy).unwrap()))
    };
    s.app = app;
    s.snapshotter = snapshotter;
    s
}

// ---------------------------------------------------------------------------------------------
// Hostile requests.

fn legal_byte() -> impl Strategy<Value = u8> {
    prop_oneof![6 => 0x20u8..0x7f, 2 => 0x80u8..=0xff, 1 => Just(b'\t')]
}

/// Nodes and elements of forwarding lists, good and broken.
const NODES: &[&str] = &[
    "unknown",
    "UNKNOWN",
    "_hidden",
    "_a.b-c_9",
    "192.0.2.1",
    "192.0.2.1:80",
    "192.0.2.1:65536",
    "192.0.2.1:_obf",
    "192.0.2.1:",
    "198.51.100.7",
    "10.0.0.10",
    "10.0.0.10:443",
    "[2001:db8::1]",
    "[2001:db8::1]:4711",
    "[2001:db8::1]:_p",
    "[2001:db8:ffff::10]",
    "2001:db8:ffff::10",
    "2001:db8::1",
    "2001:db8::5:4711",
    "2001:db8:1:2:3:4:5:6:4711",
    "[fe80::1%eth0]",
    "[fe80::1%25eth0]:80",
    "fe80::1%eth0",
    "::ffff:10.0.0.10",
    "[::ffff:10.0.0.10]",
    "::ffff:203.0.113.9",
    "64:ff9b::c000:201",
    "::",
    "[::]",
    "0.0.0.0",
    "255.255.255.255",
    "1.2.3",
    "01.02.03.04",
    "999.1.1.1",
    "1.2.3.4.5",
    "[::1",
    "::1]",
    "[]",
    "[[::1]]",
    "[::1]x",
    "[::1]:99999",
    "",
    " ",
    "\"",
    "\\",
    "\\\"",
    "\"192.0.2.1",
    "192.0.2.1\"",
    "\"[2001:db8::1]:4711\"",
    "\"_hidden\"",
    "\"unknown\"",
    "\"\\\"\"",
    "\u{e9}t\u{e9}",
    ";",
    ",",
    "=",
    "for=",
    "for=for=1.2.3.4",
];

fn node() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(NODES).prop_map(str::to_owned),
        1 => any::<u32>().prop_map(|v| Ipv4Addr::from(v).to_string()),
        1 => (any::<u32>(), any::<u16>()).prop_map(|(v, p)| format!("{}:{p}", Ipv4Addr::from(v))),
        1 => any::<u128>().prop_map(|v| Ipv6Addr::from(v).to_string()),
        1 => (any::<u128>(), any::<u16>()).prop_map(|(v, p)| format!("[{}]:{p}", Ipv6Addr::from(v))),
        1 => proptest::collection::vec(legal_byte(), 0..12)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// An `X-Forwarded-For`-like line: nodes joined by commas and spaces.
fn xff_line() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        (
            node(),
            proptest::sample::select(&[",", ", ", ",,", " , ", ",\t", ""][..]),
        ),
        0..8,
    )
    .prop_map(|parts| {
        parts
            .into_iter()
            .flat_map(|(n, sep)| [n, sep.to_owned()])
            .collect::<String>()
            .into_bytes()
    })
}

/// A `Forwarded`-like line: pairs of parameters, quoted or not, between `;` and `,`.
fn forwarded_line() -> impl Strategy<Value = Vec<u8>> {
    let key = proptest::sample::select(&["for", "FOR", "For", "by", "proto", "host", "x", ""][..]);
    let sep = proptest::sample::select(&[";", ",", ", ", ";;", ",,", " ; ", " ", ""][..]);
    proptest::collection::vec((key, any::<bool>(), node(), sep), 0..8).prop_map(|parts| {
        let mut out = String::new();
        for (key, quote, node, sep) in parts {
            out.push_str(key);
            out.push('=');
            if quote {
                out.push('"');
                for c in node.chars() {
                    if c == '"' || c == '\\' {
                        out.push('\\');
                    }
                    out.push(c);
                }
                out.push('"');
            } else {
                out.push_str(&node);
            }
            out.push_str(sep);
        }
        out.into_bytes()
    })
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(legal_byte(), 0..40),
        3 => xff_line(),
        3 => forwarded_line(),
        1 => (proptest::collection::vec(legal_byte(), 1..8), 1_000usize..=65_536)
            .prop_map(|(p, n)| p.iter().cycle().take(n).copied().collect()),
        1 => (proptest::sample::select(&["10.0.0.10, ", "for=10.0.0.10, ", ",", "\"", "_x,"][..]), 10usize..2_000)
            .prop_map(|(p, n)| p.repeat(n).into_bytes()),
        2 => proptest::sample::select(&[
            "application/grpc", "application/grpc+proto", "APPLICATION/GRPC-WEB", "application/grpcx",
            "application/grp", "application/json", "text/plain", "application/grpc; charset=\u{ff}",
        ][..]).prop_map(|s| s.as_bytes().to_vec()),
        2 => proptest::sample::select(&[
            "0", "1", "2", "3", "4", "5", "6", "1000", "18446744073709551615", "18446744073709551616", "-1",
            "1e9", "4503599627370496", " 3 ", "pro", "Pro", "", "k1", "k2",
        ][..]).prop_map(|s| s.as_bytes().to_vec()),
    ]
}

const HEADER_NAMES: &[&str] = &[
    "x-api-key",
    "authorization",
    "x-user",
    "x-tenant",
    "x-forwarded-for",
    "forwarded",
    "content-type",
    "x-cost",
    "x-plan",
    "retry-after",
    "ratelimit",
];

#[derive(Debug, Clone)]
struct Hostile {
    method: Method,
    uri: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    peer: Option<SocketAddr>,
    advance_ms: u64,
}

fn peer() -> impl Strategy<Value = Option<SocketAddr>> {
    let fixed = proptest::sample::select(
        &[
            "10.0.0.10:443",
            "[::ffff:10.0.0.10]:443",
            "[2001:db8:ffff::10]:443",
            "203.0.113.9:5000",
            "[::ffff:203.0.113.9]:5001",
            "[2001:db8:1:2::99]:80",
            "0.0.0.0:0",
            "[::]:0",
            "255.255.255.255:65535",
            "[64:ff9b::c000:201]:1",
        ][..],
    )
    .prop_map(|s| Some(s.parse::<SocketAddr>().unwrap()));
    prop_oneof![
        10 => fixed,
        1 => Just(None),
        1 => (any::<u32>(), any::<u16>())
            .prop_map(|(ip, port)| Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))),
        1 => (any::<u128>(), any::<u16>(), any::<u32>()).prop_map(|(ip, port, scope)| {
            Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope)))
        }),
    ]
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        8 => proptest::sample::select(&[
            Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE, Method::PATCH,
            Method::OPTIONS, Method::TRACE,
        ][..]),
        1 => "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}"
            .prop_filter_map("a method", |m| Method::from_bytes(m.as_bytes()).ok()),
    ]
}

fn uri() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(&[
            "/", "/health", "/users/1", "/users/%ff%fe", "//", "/%00", "/a/../../b", "/?q=%ZZ",
            "/health?x", "/HEALTH", "/health/", "http://evil.example/health", "*",
            "/users/{id}", "/users/",
        ][..]).prop_map(str::to_owned),
        2 => "/[a-zA-Z0-9/%._~!$&'()*+,;=:@?-]{0,60}",
        1 => "/[a-z]{1,8}".prop_map(|s| s.repeat(200)),
    ]
    .prop_filter("a URI http accepts", |u| u.parse::<http::Uri>().is_ok())
}

fn header() -> impl Strategy<Value = Vec<(HeaderName, HeaderValue)>> {
    (
        proptest::sample::select(HEADER_NAMES),
        header_value(),
        prop_oneof![6 => Just(1usize), 1 => 2usize..4, 1 => 10usize..200],
    )
        .prop_map(|(name, value, times)| {
            let name = HeaderName::from_static(name);
            let value = HeaderValue::from_bytes(&value).expect("legal bytes");
            vec![(name, value); times]
        })
}

/// A request: its key headers, most of the time, from a small pool (so that a run's requests
/// share keys and reach the limit), a gRPC content type or not, then hostile headers.
fn hostile() -> impl Strategy<Value = Hostile> {
    let key = proptest::option::weighted(0.7, proptest::sample::select(&["k1", "k2"][..]));
    let grpc = proptest::option::weighted(
        0.4,
        proptest::sample::select(
            &[
                "application/grpc",
                "application/grpc+proto",
                "application/grpc-web-text",
                // Not gRPC's: answered as any other request.
                "application/grpcx",
            ][..],
        ),
    );
    (
        method(),
        uri(),
        key,
        grpc,
        prop_oneof![1 => Just(Vec::new()), 1 => proptest::collection::vec(header(), 0..8)],
        peer(),
        prop_oneof![6 => Just(0u64), 1 => 0u64..120_000],
    )
        .prop_map(|(method, uri, key, grpc, extra, peer, advance_ms)| {
            let mut headers = Vec::new();
            if let Some(k) = key {
                for name in ["x-api-key", "authorization", "x-user", "x-tenant"] {
                    headers.push((HeaderName::from_static(name), HeaderValue::from_static(k)));
                }
            }
            if let Some(ct) = grpc {
                headers.push((http::header::CONTENT_TYPE, HeaderValue::from_static(ct)));
            }
            headers.extend(extra.into_iter().flatten());
            Hostile {
                method,
                uri,
                headers,
                peer,
                advance_ms,
            }
        })
}

impl Hostile {
    fn request(&self) -> Request<Body> {
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(&self.uri)
            .body(Body::empty())
            .unwrap();
        for (name, value) in &self.headers {
            req.headers_mut().append(name.clone(), value.clone());
        }
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        req
    }

    /// Whether the layer answers this request in gRPC's form (as `DenialBody::Grpc` documents).
    fn is_grpc(&self) -> Option<&HeaderValue> {
        self.headers
            .iter()
            .find(|(n, _)| n == http::header::CONTENT_TYPE)
            .map(|(_, v)| v)
            .filter(|v| {
                // gRPC's types, as documented: `application/grpc`, `-web` or `-web-text`, then a
                // `+` suffix, parameters or the end; not another type that starts the same.
                let v = v.as_bytes().to_ascii_lowercase();
                [
                    "application/grpc-web-text",
                    "application/grpc-web",
                    "application/grpc",
                ]
                .iter()
                .find_map(|t| v.strip_prefix(t.as_bytes()))
                .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';' | b' ' | b'\t')))
            })
    }
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    proptest::sample::select(&Algorithm::ALL[..])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The answer to one request, checked against the docs.

/// How the layer answered, as the response shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The inner handler's 200.
    Inner,
    /// A 429 (or `RESOURCE_EXHAUSTED` to a gRPC call).
    Denied,
    /// The missing-key answer.
    NoKey,
    /// A fail-closed 503 (or `UNAVAILABLE`).
    Closed,
}

fn text<'a>(res: &'a Response<Body>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| {
        v.to_str()
            .unwrap_or_else(|_| panic!("{name} is not visible ASCII: {v:?}"))
    })
}

fn positive_int(res: &Response<Body>, name: &str) -> u64 {
    let v = text(res, name).unwrap_or_else(|| panic!("no {name}"));
    assert!(
        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()),
        "{name}: {v:?}"
    );
    let n: u64 = v.parse().unwrap();
    assert!(n > 0, "{name}: {v}");
    n
}

const GRPC_CODES: &[(&str, u16)] = &[
    ("3", 400),
    ("16", 401),
    ("7", 403),
    ("5", 404),
    ("8", 429),
    ("14", 503),
];

async fn check(s: &Setup, h: &Hostile, res: Response<Body>) -> Answer {
    let status = res.status();
    let head = h.method == Method::HEAD;
    // A gRPC call is a `POST` (a `GET` of gRPC's type gets the plain answer, not a cacheable 200).
    let grpc_form = s.body == BodyKind::Grpc && h.method == Method::POST && h.is_grpc().is_some();
    // The status in HTTP terms: a gRPC-form answer says it in `grpc-status`.
    let grpc_status = res.headers().get("grpc-status").cloned();
    let effective = match &grpc_status {
        Some(code) => {
            assert!(
                grpc_form,
                "a gRPC status to a request that is not a gRPC call: {code:?}"
            );
            assert_eq!(status, StatusCode::OK, "a gRPC-form answer is HTTP 200");
            let code = code.to_str().unwrap();
            let http = GRPC_CODES
                .iter()
                .find(|(c, _)| *c == code)
                .unwrap_or_else(|| panic!("undocumented grpc-status {code}"))
                .1;
            StatusCode::from_u16(http).unwrap()
        }
        None => status,
    };
    if grpc_form && status != StatusCode::OK {
        panic!("a gRPC call answered HTTP {status} instead of a gRPC status");
    }
    let answer = match effective.as_u16() {
        200 if grpc_status.is_none() => Answer::Inner,
        429 => Answer::Denied,
        503 if s.failing == Some(Some(2)) => Answer::Closed,
        401 if s.missing == Missing::Unauthorized => Answer::NoKey,
        code if s.missing == Missing::Reject(code) => Answer::NoKey,
        other => panic!(
            "undocumented status {other} (HTTP {status}) from {}",
            s.name
        ),
    };
    if s.dry_run {
        assert_eq!(
            answer,
            Answer::Inner,
            "a dry run never answers in place of the handler"
        );
    }
    if matches!(answer, Answer::NoKey) {
        assert_ne!(s.missing, Missing::Shared, "a shared key never rejects");
    }
    if effective == StatusCode::UNAUTHORIZED {
        assert_eq!(text(&res, "www-authenticate"), Some("Bearer realm=\"api\""));
    }

    // Retry-After: on a 429 (unless the cost can never pass) and a fail-closed 503.
    let retry_after = match answer {
        Answer::Denied | Answer::Closed => res
            .headers()
            .contains_key("retry-after")
            .then(|| positive_int(&res, "retry-after")),
        _ => None,
    };
    if answer == Answer::Closed {
        assert_eq!(
            retry_after,
            Some(2),
            "fail-closed Retry-After (1.5 s rounded up)"
        );
    }

    // The IETF fields.
    let policy_lines: Vec<&[u8]> = res
        .headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let limit_lines: Vec<&[u8]> = res
        .headers()
        .get_all("ratelimit")
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    assert_eq!(
        policy_lines.is_empty(),
        limit_lines.is_empty(),
        "RateLimit and RateLimit-Policy go together"
    );
    let kind = res.extensions().get::<Verdict>().map(Verdict::kind);
    let decided = matches!(
        kind,
        Some(VerdictKind::Allowed | VerdictKind::FallbackAllowed)
    );
    let want_ietf = s.ietf
        && !s.dry_run
        && (answer == Answer::Denied || (answer == Answer::Inner && s.on_allowed && decided));
    let want_legacy = s.legacy
        && !s.dry_run
        && (answer == Answer::Denied || (answer == Answer::Inner && s.on_allowed && decided));
    if !policy_lines.is_empty() {
        assert!(
            s.ietf && !s.dry_run,
            "IETF fields that the policy does not send"
        );
        assert!(matches!(answer, Answer::Denied | Answer::Inner));
        let policies = parse_sf_list(&policy_lines)
            .unwrap_or_else(|e| panic!("RateLimit-Policy {policy_lines:?}: {e}"));
        let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, s.items, "RateLimit-Policy items");
        for p in &policies {
            let keys: Vec<&str> = p.params.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["q", "w"], "{p:?}");
            assert!(
                param(p, "q").unwrap() >= 1 && param(p, "w").unwrap() >= 1,
                "{p:?}"
            );
        }
        let limits = parse_sf_list(&limit_lines)
            .unwrap_or_else(|e| panic!("RateLimit {limit_lines:?}: {e}"));
        assert_eq!(limits.len(), 1, "one RateLimit item: {limits:?}");
        let l = &limits[0];
        assert!(s.items.contains(&l.name), "RateLimit names {:?}", l.name);
        let keys: Vec<&str> = l.params.iter().map(|(k, _)| k.as_str()).collect();
        // `t` is left out when nothing more is coming (a full quota), else at least 1 s.
        assert!(keys == ["r", "t"] || keys == ["r"], "{l:?}");
        assert!(
            param(l, "r").unwrap() >= 0 && param(l, "t").is_none_or(|t| t >= 1),
            "{l:?}"
        );
        if let Some(wait) = retry_after {
            assert_eq!(
                param(l, "t"),
                Some(wait as i64),
                "t says what Retry-After says"
            );
        }
    }
    assert_eq!(
        !policy_lines.is_empty(),
        want_ietf,
        "IETF fields on {answer:?} ({kind:?})"
    );

    // The legacy fields: all three or none, decimal integers.
    let legacy: Vec<Option<&str>> = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ]
    .iter()
    .map(|n| text(&res, n))
    .collect();
    assert!(
        legacy.iter().all(Option::is_some) || legacy.iter().all(Option::is_none),
        "{legacy:?}"
    );
    assert_eq!(
        legacy[0].is_some(),
        want_legacy,
        "legacy fields on {answer:?}"
    );
    if let [Some(limit), Some(remaining), Some(reset)] = legacy[..] {
        let n = |v: &str| -> u64 {
            assert!(
                v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty(),
                "{v:?}"
            );
            v.parse().unwrap()
        };
        let (limit, remaining, _) = (n(limit), n(remaining), n(reset));
        assert!(limit >= 1 && remaining <= limit, "{legacy:?}");
        if let Some(wait) = retry_after {
            assert_eq!(
                n(legacy[2].unwrap()),
                wait,
                "X-RateLimit-Reset says Retry-After"
            );
        }
    }

    // The verdict.
    match (s.verdict, kind) {
        (false, None) => {}
        (false, Some(k)) => panic!("a verdict ({k:?}) from a policy that turned it off"),
        (true, None) => panic!("no verdict on a {answer:?} answer"),
        (true, Some(k)) => {
            let v = res.extensions().get::<Verdict>().unwrap();
            assert_eq!(v.policy(), s.name);
            let ok = match answer {
                Answer::Inner => match k {
                    VerdictKind::Allowed | VerdictKind::FallbackAllowed => {
                        v.decision().is_some_and(|d| d.is_allowed())
                    }
                    VerdictKind::AllowListed => v.decision().is_none(),
                    VerdictKind::ShadowDenied => s.dry_run,
                    _ => false,
                },
                Answer::Denied => match k {
                    VerdictKind::Denied | VerdictKind::FallbackDenied => {
                        v.decision().is_some_and(|d| !d.is_allowed())
                    }
                    _ => false,
                },
                Answer::NoKey => k == VerdictKind::NoKey,
                Answer::Closed => k == VerdictKind::FailedClosed,
            };
            assert!(ok, "verdict {v:?} on {answer:?}");
        }
    }

    // The body, as its content type says.
    // Bytes: a gRPC-form answer carries the call's own content type, whatever bytes it has.
    let content_type = res
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec());
    let never = answer == Answer::Denied && retry_after.is_none();
    let headers = res.headers().clone();
    let header = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().expect("visible ASCII"))
    };
    let body = body_bytes(res).await;
    if head {
        return answer;
    }
    if grpc_status.is_some() {
        assert!(body.is_empty(), "a gRPC-form answer has no body");
        assert_eq!(
            content_type.as_deref(),
            h.is_grpc().map(HeaderValue::as_bytes),
            "the call's own content type"
        );
        let message = header("grpc-message").expect("a grpc-message");
        assert!(!message.is_empty() && !message.contains('%'), "{message:?}");
        let pushback = header("grpc-retry-pushback-ms").expect("a pushback");
        assert!(
            pushback == "-1" || pushback.parse::<i32>().is_ok_and(|n| n > 0),
            "{pushback:?}"
        );
        // `-1`, "do not retry", for a cost that can never pass and for a wait past what a
        // pushback can say (2^31 - 1 ms: `DenialBody::Grpc`), which `Retry-After` still tells
        // (in whole seconds: a wait of 2,147,484 s may fall on either side).
        if answer == Answer::Denied {
            let wait = retry_after.unwrap_or(0);
            if pushback == "-1" {
                assert!(
                    never || wait >= 2_147_484,
                    "-1 for a wait of {wait} s: {message}"
                );
            } else {
                assert!(
                    !never && wait <= 2_147_484,
                    "{pushback} ms for {wait} s: {message}"
                );
            }
        }
        return answer;
    }
    match answer {
        Answer::Inner => assert_eq!(&body[..], b"ok"),
        _ => match content_type.as_deref() {
            Some(b"text/plain; charset=utf-8") => {
                assert_ne!(
                    s.body,
                    BodyKind::Problem,
                    "plain text from a problem policy"
                );
                let t = std::str::from_utf8(&body).expect("UTF-8 text");
                assert!(t.ends_with('\n') && t.len() > 1, "{t:?}");
                if answer == Answer::Denied {
                    assert!(t.starts_with("Too Many Requests"), "{t:?}");
                    assert_eq!(never, t.contains("can ever admit"), "{t:?}");
                }
            }
            Some(b"application/problem+json") => {
                assert_eq!(s.body, BodyKind::Problem);
                let j = parse_json(&body)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
                assert_eq!(
                    j.get("status"),
                    Some(&Json::Num(f64::from(effective.as_u16()))),
                    "{j:?}"
                );
                assert!(matches!(j.get("title"), Some(Json::Str(_))), "{j:?}");
                if answer == Answer::Denied {
                    assert_eq!(j.get("type"), Some(&Json::Str(QUOTA_EXCEEDED_TYPE.into())));
                    let Some(Json::Arr(violated)) = j.get("violated-policies") else {
                        panic!("no violated-policies: {j:?}")
                    };
                    assert!(!violated.is_empty());
                    for v in violated {
                        assert!(
                            matches!(v, Json::Str(n) if s.items.contains(n)),
                            "{v:?} is not an item of {:?}",
                            s.items
                        );
                    }
                    assert_eq!(never, j.get("detail").is_some(), "{j:?}");
                } else {
                    assert_eq!(j.get("type"), Some(&Json::Str("about:blank".into())));
                }
            }
            other => panic!("layer answer with content type {other:?}"),
        },
    }
    answer
}

async fn body_bytes(res: Response<Body>) -> bytes::Bytes {
    http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes()
}

/// Every decision counted once: the outcome counters add up to the requests sent, and (with
/// verdicts) match the verdicts seen.
fn check_counted(s: &Setup, sent: usize, kinds: &[VerdictKind]) {
    let recorded = Recorded::take(&s.snapshotter);
    let counted: u64 = VerdictKind::ALL
        .iter()
        .map(|k| recorded.outcome(s.name, k.as_str()))
        .sum();
    assert_eq!(counted, sent as u64, "decisions counted");
    if s.verdict {
        for k in VerdictKind::ALL {
            let seen = kinds.iter().filter(|&&x| x == k).count() as u64;
            assert_eq!(recorded.outcome(s.name, k.as_str()), seen, "{k:?}");
        }
    }
}

/// A fixed script through every configuration reaches each answer the configuration can give
/// (so that the checks of `check` are known to run on each), plain and as gRPC calls.
#[test]
fn each_configuration_gives_each_of_its_answers() {
    let keyed = |grpc: bool, cost: Option<&'static str>| {
        let mut headers = Vec::new();
        for name in ["x-api-key", "authorization", "x-user", "x-tenant"] {
            headers.push((
                HeaderName::from_static(name),
                HeaderValue::from_static("k1"),
            ));
        }
        if grpc {
            headers.push((
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            ));
        }
        if let Some(cost) = cost {
            headers.push((
                HeaderName::from_static("x-cost"),
                HeaderValue::from_static(cost),
            ));
        }
        Hostile {
            method: Method::GET,
            uri: "/users/7".into(),
            headers,
            peer: Some("203.0.113.9:5000".parse().unwrap()),
            advance_ms: 0,
        }
    };
    for config in 0..CONFIGS {
        for grpc in [false, true] {
            let s = setup(config, Algorithm::TokenBucket);
            let mut script: Vec<Hostile> = (0..5).map(|_| keyed(grpc, None)).collect();
            let mut keyless = keyed(grpc, None);
            keyless
                .headers
                .retain(|(n, _)| n == http::header::CONTENT_TYPE);
            keyless.peer = None;
            script.push(keyless);
            script.push(keyed(grpc, Some("1000")));
            let (answers, kinds) = runtime().block_on(async {
                let mut answers = Vec::new();
                let mut kinds = Vec::new();
                for h in &script {
                    let res = s.app.clone().oneshot(h.request()).await.unwrap();
                    if let Some(v) = res.extensions().get::<Verdict>() {
                        kinds.push(v.kind());
                    }
                    answers.push(check(&s, h, res).await);
                }
                (answers, kinds)
            });
            check_counted(&s, script.len(), &kinds);
            let has = |a: Answer| answers.contains(&a);
            let (name, dry, closed) = (s.name, s.dry_run, s.failing == Some(Some(2)));
            assert_eq!(has(Answer::Denied), !dry && !closed, "{name}: {answers:?}");
            assert_eq!(has(Answer::Closed), closed, "{name}: {answers:?}");
            assert_eq!(
                has(Answer::NoKey),
                !dry && s.missing != Missing::Shared,
                "{name}: {answers:?}"
            );
            assert_eq!(has(Answer::Inner), !closed, "{name}: {answers:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any request to any configuration gets a documented answer, well formed, with its verdict,
    /// and is counted.
    #[test]
    fn every_hostile_request_gets_a_documented_answer(
        config in 0..CONFIGS,
        algorithm in algorithm(),
        case_peer in peer(),
        requests in proptest::collection::vec((hostile(), proptest::bool::weighted(0.25)), 1..16),
    ) {
        let s = setup(config, algorithm);
        // Most requests of a run come from one peer, so that they share a key.
        let requests: Vec<Hostile> = requests
            .into_iter()
            .map(|(mut h, own_peer)| {
                if !own_peer {
                    h.peer = case_peer;
                }
                h
            })
            .collect();
        runtime().block_on(async {
            let mut kinds = Vec::new();
            for h in &requests {
                s.clock.advance(Duration::from_millis(h.advance_ms));
                let res = s.app.clone().oneshot(h.request()).await.unwrap();
                if let Some(v) = res.extensions().get::<Verdict>() {
                    kinds.push(v.kind());
                }
                check(&s, h, res).await;
            }
            check_counted(&s, requests.len(), &kinds);
        });
    }
}

/// A limit anywhere in what `Limit` accepts: any algorithm, one or two quotas, limits and bursts
/// from 1 to 2^52, periods from 1 µs to 2^52 µs.
fn any_limit() -> impl Strategy<Value = Limit> {
    let n = prop_oneof![1u64..=10, 1u64..=1 << 20, (1u64 << 49)..=1 << 52];
    let period = prop_oneof![
        1u64..=3,
        1u64..=10_000_000,
        Just(60_000_000u64),
        (1u64 << 40)..=1 << 52,
    ];
    let quota = (n.clone(), period, n).prop_filter_map("a quota", |(limit, period, burst)| {
        Quota::per_period(limit, Duration::from_micros(period))
            .ok()?
            .with_burst(burst)
            .ok()
    });
    (algorithm(), proptest::collection::vec(quota, 1..=2))
        .prop_filter_map("a limit", |(algorithm, quotas)| {
            fitted_limit(algorithm, quotas)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_local_rejects: u32::MAX,
        ..ProptestConfig::default()
    })]

    /// The same checks of every answer under limits anywhere in what `Limit` accepts (numbers
    /// past what a structured field may carry, periods of a microsecond and of 142 years, waits
    /// of under a second and of a century), with costs around the limit's own numbers in the
    /// client's `x-cost` (read by the configurations that take a cost from it), and time moving
    /// by fractions of the limit's period.
    #[test]
    fn every_answer_is_well_formed_under_any_limit(
        config in 0..CONFIGS,
        limit in any_limit(),
        requests in proptest::collection::vec(
            (hostile(), 0u64..=1_100, 0u64..=2_000, proptest::bool::weighted(0.3)),
            1..16,
        ),
    ) {
        let s = setup_with(config, limit.algorithm(), limit.clone());
        let quota = &limit.quotas()[0];
        let share = |of: u64, thousandths: u64| {
            u64::try_from(u128::from(of) * u128::from(thousandths) / 1_000).unwrap()
        };
        runtime().block_on(async {
            let mut kinds = Vec::new();
            for (h, cost, step, costed) in &requests {
                let mut h = h.clone();
                // Most requests from one peer, so that they share a key.
                h.peer = Some("203.0.113.9:5000".parse().unwrap());
                h.advance_ms = 0;
                if *costed {
                    h.headers.retain(|(n, _)| n != "x-cost");
                    let cost = share(quota.burst().max(quota.limit()), *cost);
                    h.headers.push((
                        HeaderName::from_static("x-cost"),
                        HeaderValue::from(cost),
                    ));
                }
                s.clock.advance(Duration::from_micros(share(quota.period_micros(), *step)));
                let res = s.app.clone().oneshot(h.request()).await.unwrap();
                if let Some(v) = res.extensions().get::<Verdict>() {
                    kinds.push(v.kind());
                }
                check(&s, &h, res).await;
            }
            check_counted(&s, requests.len(), &kinds);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Spoofing does not multiply a quota.

/// A client's hostile forwarding headers: lines of either kind, some repeated.
fn spoof_lines() -> impl Strategy<Value = Vec<(HeaderName, Vec<u8>)>> {
    proptest::collection::vec(
        prop_oneof![
            xff_line().prop_map(|l| (HeaderName::from_static("x-forwarded-for"), l)),
            forwarded_line().prop_map(|l| (http::header::FORWARDED, l)),
            header_value().prop_map(|l| (HeaderName::from_static("x-forwarded-for"), l)),
            header_value().prop_map(|l| (http::header::FORWARDED, l)),
        ],
        0..5,
    )
}

fn spoof_app(algorithm: Algorithm, header: ForwardedHeader) -> Router {
    let (_clock, store) = store();
    let limit = Limit::single(algorithm, Quota::per_minute(3).unwrap()).unwrap();
    let client_ip = ClientIp::behind_proxies([PROXY_V4, PROXY_V6])
        .unwrap()
        .header(header);
    let policy = Policy::new("spoof", limit)
        .unwrap()
        .key(ClientIpKey::new(client_ip));
    ok_router().layer(RateLimitLayer::new(store, policy).unwrap())
}

fn forwarded_header() -> impl Strategy<Value = ForwardedHeader> {
    proptest::sample::select(
        &[
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::Both,
        ][..],
    )
}

async fn passed(app: &Router, reqs: Vec<Request<Body>>) -> usize {
    let mut n = 0;
    for req in reqs {
        let res = app.clone().oneshot(req).await.unwrap();
        match res.status().as_u16() {
            200 => n += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A client that connects directly (an untrusted peer, in its IPv4 or IPv4-mapped form, from
    /// any port) gets its quota and no more, whatever forwarding headers it sends.
    #[test]
    fn spoofed_headers_from_an_untrusted_peer_do_not_multiply_the_quota(
        algorithm in algorithm(),
        header in forwarded_header(),
        requests in proptest::collection::vec((spoof_lines(), any::<bool>(), any::<u16>()), 4..16),
    ) {
        let app = spoof_app(algorithm, header);
        let n = requests.len();
        let reqs = requests
            .into_iter()
            .map(|(lines, mapped, port)| {
                let peer = if mapped { "::ffff:203.0.113.9" } else { "203.0.113.9" };
                let mut req = request_from("/", &SocketAddr::new(peer.parse().unwrap(), port).to_string());
                for (name, line) in lines {
                    req.headers_mut().append(name, HeaderValue::from_bytes(&line).unwrap());
                }
                req
            })
            .collect();
        let passed = runtime().block_on(passed(&app, reqs));
        prop_assert_eq!(passed, 3.min(n), "of {} requests", n);
    }

    /// Behind the trusted proxy, whatever the client wrote left of what the proxy appends (on the
    /// client's last line, or a line of its own) does not change whose quota a request spends:
    /// the client's, found by the proxy. A second client behind the same proxy keeps its own.
    #[test]
    fn a_client_behind_a_trusted_proxy_cannot_shed_its_address(
        algorithm in algorithm(),
        forwarded in any::<bool>(),
        requests in proptest::collection::vec((spoof_lines(), any::<bool>(), 0usize..4), 4..12),
        v6_proxy in any::<bool>(),
    ) {
        let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
        let app = spoof_app(algorithm, header);
        let proxy = if v6_proxy { "[2001:db8:ffff::10]:443" } else { "10.0.0.10:443" };
        let appended = |client: &str, form: usize| -> String {
            match (forwarded, form) {
                (false, 0 | 1) => client.to_owned(),
                (false, _) => format!("{client}:4711"),
                (true, 0) => format!("for={client}"),
                (true, 1) => format!("for=\"{client}:4711\";proto=https"),
                (true, _) => format!("for=\"{client}\";by=_lb"),
            }
        };
        let name = if forwarded { http::header::FORWARDED } else { HeaderName::from_static("x-forwarded-for") };
        let make = |lines: &[(HeaderName, Vec<u8>)], own_line: bool, form: usize, client: &str| {
            let mut req = request_from("/", proxy);
            let ours: Vec<_> = lines.iter().filter(|(n, _)| *n == name).collect();
            let others = lines.iter().filter(|(n, _)| *n != name);
            for (n, line) in others {
                req.headers_mut().append(n.clone(), HeaderValue::from_bytes(line).unwrap());
            }
            let entry = appended(client, form);
            let last = ours.len().checked_sub(1).filter(|_| !own_line);
            for (i, (n, line)) in ours.iter().enumerate() {
                let mut line = line.clone();
                if Some(i) == last {
                    line.extend_from_slice(b", ");
                    line.extend_from_slice(entry.as_bytes());
                }
                req.headers_mut().append(n.clone(), HeaderValue::from_bytes(&line).unwrap());
            }
            if last.is_none() {
                req.headers_mut().append(name.clone(), HeaderValue::from_str(&entry).unwrap());
            }
            req
        };
        let n = requests.len();
        let reqs = requests
            .iter()
            .map(|(lines, own_line, form)| make(lines, *own_line, *form, "198.51.100.7"))
            .collect();
        let (first, second) = runtime().block_on(async {
            let first = passed(&app, reqs).await;
            let (lines, own_line, form) = &requests[0];
            let other = make(lines, *own_line, *form, "198.51.100.8");
            (first, passed(&app, vec![other]).await)
        });
        prop_assert_eq!(first, 3.min(n), "of {} requests", n);
        prop_assert_eq!(second, 1, "the second client has its own quota");
    }

    /// IPv6 peers of one /64, from any address in it and any port, share one quota.
    #[test]
    fn one_ipv6_64_is_one_client(
        algorithm in algorithm(),
        peers in proptest::collection::vec((any::<u64>(), any::<u16>(), any::<u32>()), 4..16),
    ) {
        let app = spoof_app(algorithm, ForwardedHeader::XForwardedFor);
        let n = peers.len();
        let reqs = peers
            .into_iter()
            .map(|(low, port, scope)| {
                let ip = Ipv6Addr::from((0x2001_0db8_0001_0002_u128 << 64) | u128::from(low));
                let mut req = Request::get("/")
                    .header("x-forwarded-for", "198.51.100.1")
                    .body(Body::empty())
                    .unwrap();
                req.extensions_mut()
                    .insert(ConnectInfo(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))));
                req
            })
            .collect();
        let passed = runtime().block_on(passed(&app, reqs));
        prop_assert_eq!(passed, 3.min(n), "of {} requests", n);
    }
}

// ---------------------------------------------------------------------------------------------
// A hostile upstream: an inner service (a proxy) whose response carries rate-limit fields of
// whatever its upstream sent. They are kept as they are; this layer's own items are added as
// lines of their own (or not at all when the upstream's name this policy), never merged into
// or written over the upstream's.

/// The inner service: copies `x-up-<field>` request lines into the response's `<field>` lines.
fn echo_router(legacy: bool) -> Router {
    let (_clock, store) = store();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    let policy = Policy::new("up", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .headers(Headers::ietf().legacy(legacy));
    let echo = |req: Request<Body>| async move {
        let mut res = Response::new(Body::from("ok"));
        for field in UPSTREAM_FIELDS {
            for v in req.headers().get_all(format!("x-up-{field}")) {
                res.headers_mut()
                    .append(HeaderName::from_static(field), v.clone());
            }
        }
        res
    };
    Router::new()
        .route("/", routing::any(echo))
        .layer(RateLimitLayer::new(store, policy).unwrap())
}

const UPSTREAM_FIELDS: [&str; 5] = [
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

fn upstream_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => proptest::sample::select(&[
            "\"up\";r=1;t=2", "\"up\";q=9;w=9", "\"other\";r=0;t=1", "\"other\";q=1;w=1",
            "\"a\\\"up\";q=1;w=1", "\"up.0\";q=1;w=1", "up;r=1", "", "\"", "\"up\"", "7",
        ][..]).prop_map(|s| s.as_bytes().to_vec()),
        1 => proptest::collection::vec(legal_byte(), 0..30),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn an_upstreams_fields_are_kept_and_ours_stand_apart(
        legacy in any::<bool>(),
        lines in proptest::collection::vec((0..UPSTREAM_FIELDS.len(), upstream_value()), 0..6),
        n in 1usize..5,
    ) {
        let app = echo_router(legacy);
        let ours_policy: &[u8] = b"\"up\";q=3;w=60";
        runtime().block_on(async {
            for _ in 0..n {
                let mut req = Request::get("/").header("x-api-key", "k").body(Body::empty()).unwrap();
                for (field, value) in &lines {
                    req.headers_mut().append(
                        HeaderName::try_from(format!("x-up-{}", UPSTREAM_FIELDS[*field])).unwrap(),
                        HeaderValue::from_bytes(value).unwrap(),
                    );
                }
                let res = app.clone().oneshot(req).await.unwrap();
                let status = res.status().as_u16();
                assert!(status == 200 || status == 429, "{status}");
                let sent = |field: &str| -> Vec<&[u8]> {
                    lines
                        .iter()
                        .filter(|(f, _)| UPSTREAM_FIELDS[*f] == field)
                        .map(|(_, v)| &v[..])
                        .collect()
                };
                let got = |field: &str| -> Vec<Vec<u8>> {
                    res.headers().get_all(field).iter().map(|v| v.as_bytes().to_vec()).collect()
                };
                if status == 429 {
                    // The layer's own answer: its own fields only.
                    let p = got("ratelimit-policy");
                    assert_eq!(p, vec![ours_policy.to_vec()]);
                    continue;
                }
                let (up_p, up_r) = (sent("ratelimit-policy"), sent("ratelimit"));
                let (p, r) = (got("ratelimit-policy"), got("ratelimit"));
                // The upstream's lines first, unchanged.
                assert!(p.len() >= up_p.len() && r.len() >= up_r.len(), "{p:?} {r:?}");
                assert_eq!(p[..up_p.len()].iter().map(|v| &v[..]).collect::<Vec<_>>(), up_p);
                assert_eq!(r[..up_r.len()].iter().map(|v| &v[..]).collect::<Vec<_>>(), up_r);
                let added_p = &p[up_p.len()..];
                let added_r = &r[up_r.len()..];
                assert!(added_p.len() <= 1 && added_r.len() <= 1, "{added_p:?} {added_r:?}");
                // Our two lines go together, and are left out exactly when an upstream line of either
                // field names an item `up` already, as the String `"up"` or the Token `up` (with
                // parameters or without): an item of the list, not text inside another item's
                // string (`"a\"up";` names `a"up`). A line that does not parse is read
                // tolerantly: it may name us only if `"up"` is in it at all, or `up` where an item
                // may start, followed by what may follow an item's name.
                assert_eq!(added_p.len(), added_r.len(), "{p:?} {r:?}");
                let names_us: Vec<Option<bool>> = up_p
                    .iter()
                    .chain(&up_r)
                    .map(|v| {
                        parse_sf_list_with_tokens(&[v]).ok().map(|items| {
                            items.iter().any(|it| it.name == "up")
                        })
                    })
                    .collect();
                let maybe = up_p
                    .iter()
                    .chain(&up_r)
                    .any(|v| {
                        let ends = |at: usize| {
                            matches!(v.get(at), None | Some(b';' | b',' | b' ' | b'\t'))
                        };
                        let item_start = |at: usize| {
                            v[..at].iter().rev().find(|c| !matches!(c, b' ' | b'\t'))
                                .is_none_or(|c| *c == b',')
                        };
                        v.windows(4).enumerate().any(|(i, w)| w == b"\"up\"" && ends(i + 4))
                            || v.windows(2)
                                .enumerate()
                                .any(|(i, w)| w == b"up" && item_start(i) && ends(i + 2))
                    });
                if names_us.contains(&Some(true)) {
                    assert!(added_p.is_empty(), "{p:?} {r:?}");
                } else if names_us.iter().all(Option::is_some) || !maybe {
                    assert!(!added_p.is_empty(), "{p:?} {r:?}");
                }
                if let (Some(ap), Some(ar)) = (added_p.first(), added_r.first()) {
                    assert_eq!(&ap[..], ours_policy);
                    let item = parse_sf_list(&[&ar[..]]).unwrap();
                    assert_eq!(item.len(), 1);
                    assert_eq!(item[0].name, "up");
                }
                let up_legacy = UPSTREAM_FIELDS[2..].iter().any(|f| !sent(f).is_empty());
                for f in &UPSTREAM_FIELDS[2..] {
                    if up_legacy || !legacy {
                        assert_eq!(got(f).iter().map(|v| &v[..]).collect::<Vec<_>>(), sent(f), "{f}");
                    } else {
                        let v = got(f);
                        assert_eq!(v.len(), 1, "{f}");
                        assert!(v[0].iter().all(u8::is_ascii_digit) && !v[0].is_empty());
                    }
                }
            }
        });
    }
}
