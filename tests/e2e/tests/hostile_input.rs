//! Hostile input through the real server and the real Redis store: spoofed and malformed
//! `X-Forwarded-For` / `Forwarded`, thousands of hops, non-UTF-8 bytes, control characters, huge
//! and binary API keys, an API key sent twice under `key::or` or a shared key, costs of 0 and
//! `u64::MAX`, and invalid configuration. Each gets its documented answer; none lets a client
//! pick a fresh bucket, and nothing panics.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::HeaderValue;
use ratelimit_core::{Algorithm, ConfigError, Limit, MemoryStore, Quota};
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, ms};
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::{patient_store_builder, per_minute};
use ratelimit_redis::{RedisStore, RedisStoreError};
use redis_harness::RedisServer;
use tower_ratelimit::client_ip::{ClientIp, ClientIpError, ForwardedHeader};
use tower_ratelimit::key::{self, ApiKeyHeader, ClientIpKey};
use tower_ratelimit::{
    CircuitBreaker, Error, FailurePolicy, MissingKey, Policy, RateLimitLayer, RequestHead,
};

/// Every answer to a hostile request must come within this (a hang would not; a loaded machine
/// may well take a few hundred milliseconds).
const BOUND: Duration = Duration::from_secs(2);

fn layer(store: &RedisStore, policy: Policy) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder(
        store.clone(),
        policy.failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
    )
    // Generous: these tests are about answers, and a loaded machine must not turn a slow check
    // into a 503.
    .timeout(Duration::from_secs(1))
    .build()
    .expect("layer")
}

fn cost_of(req: &RequestHead<'_>) -> u64 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The app: `/xff` keys on the client address from `X-Forwarded-For` (peer 127.0.0.1 trusted),
/// `/fwd` the same from `Forwarded`; `/key` on `x-api-key`; `/cost` on `x-api-key` with the cost
/// from `x-cost`; `/either` on `x-api-key`, else the client address as `/xff`; `/anon` on
/// `x-api-key`, keyless requests sharing one key. 3 per minute each (2 for `/key`, `/either` and
/// `/anon`).
async fn start() -> (RedisServer, TestApp, Metrics) {
    let redis = RedisServer::start();
    // The store's response timeout longer than the layer's, so that the layer's bounds a check.
    let store = patient_store_builder(&redis.url())
        .build()
        .await
        .expect("store");
    let trusted = || ClientIp::behind_proxies(["127.0.0.1"]).expect("trusted proxies");
    let metrics = Metrics::new();
    let (xff, fwd, key, cost, either, anon) = metrics.register(|| {
        (
            layer(
                &store,
                Policy::new("xff", per_minute(3))
                    .unwrap()
                    .key(ClientIpKey::new(trusted())),
            ),
            layer(
                &store,
                Policy::new("fwd", per_minute(3))
                    .unwrap()
                    .key(ClientIpKey::new(
                        trusted().header(ForwardedHeader::Forwarded),
                    )),
            ),
            layer(
                &store,
                Policy::new("key", per_minute(2))
                    .unwrap()
                    .key(ApiKeyHeader::new("x-api-key").unwrap()),
            ),
            layer(
                &store,
                Policy::new("cost", per_minute(3))
                    .unwrap()
                    .key(ApiKeyHeader::new("x-api-key").unwrap())
                    .cost(cost_of),
            ),
            layer(
                &store,
                Policy::new("either", per_minute(2)).unwrap().key(key::or(
                    ApiKeyHeader::new("x-api-key").unwrap(),
                    ClientIpKey::new(trusted()),
                )),
            ),
            layer(
                &store,
                Policy::new("anon", per_minute(2))
                    .unwrap()
                    .key(ApiKeyHeader::new("x-api-key").unwrap())
                    .missing_key(MissingKey::shared_key("anonymous")),
            ),
        )
    });
    let app = Router::new()
        .route("/xff", get(|| async { "ok" }).route_layer(xff))
        .route("/fwd", get(|| async { "ok" }).route_layer(fwd))
        .route("/key", get(|| async { "ok" }).route_layer(key))
        .route("/cost", get(|| async { "ok" }).route_layer(cost))
        .route("/either", get(|| async { "ok" }).route_layer(either))
        .route("/anon", get(|| async { "ok" }).route_layer(anon));
    (redis, TestApp::serve(app).await, metrics)
}

/// Sends GET `path` with one header (raw bytes allowed), returns the status and `Retry-After`.
async fn send(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    header: Option<(&str, &[u8])>,
) -> (u16, Option<String>) {
    let mut req = client.get(app.url(path));
    if let Some((name, value)) = header {
        req = req.header(
            name,
            HeaderValue::from_bytes(value).expect("a valid header value"),
        );
    }
    let start = Instant::now();
    let res = req.send().await.expect("a response");
    let took = start.elapsed();
    assert!(took <= BOUND, "{path} took {took:?}");
    let ra = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (res.status().as_u16(), ra)
}

async fn status(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    header: Option<(&str, &[u8])>,
) -> u16 {
    send(client, app, path, header).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_cannot_choose_the_key() {
    let (_redis, app, _metrics) = start().await;
    let c = load::client();
    let xff = |v: &'static [u8]| Some(("x-forwarded-for", v));

    // Exhaust the client 203.0.113.7 (as our trusted proxy at 127.0.0.1 reports it).
    for _ in 0..3 {
        assert_eq!(status(&c, &app, "/xff", xff(b"203.0.113.7")).await, 200);
    }
    assert_eq!(status(&c, &app, "/xff", xff(b"203.0.113.7")).await, 429);
    // Spoofed entries to the left of what the proxy appended change nothing.
    for spoof in [
        &b"6.6.6.6, 203.0.113.7"[..],
        b"1.1.1.1, 2.2.2.2, 203.0.113.7",
        b"garbage, 203.0.113.7",
        b"\xff\xfe\x80, 203.0.113.7",
        b"127.0.0.1, 203.0.113.7",
    ] {
        assert_eq!(
            status(&c, &app, "/xff", Some(("x-forwarded-for", spoof))).await,
            429
        );
    }
    // 10,000 hops, the proxy's entry last: still that client, answered in bounded time.
    let mut long = "10.9.8.7, ".repeat(9_999);
    long.push_str("203.0.113.7");
    let t = Instant::now();
    assert_eq!(
        status(&c, &app, "/xff", Some(("x-forwarded-for", long.as_bytes()))).await,
        429
    );
    println!(
        "10,000 hops ({} bytes): {:.1} ms",
        long.len(),
        ms(t.elapsed())
    );
    // A different client behind the proxy has its own bucket.
    assert_eq!(status(&c, &app, "/xff", xff(b"203.0.113.99")).await, 200);

    // Exhaust the peer itself (no header): the answer for anything that is not an address.
    for _ in 0..3 {
        assert_eq!(status(&c, &app, "/xff", None).await, 200);
    }
    for garbage in [
        &b"garbage"[..],
        b"unknown",
        b"_hidden",
        b"1.2.3.4.5",
        b"203.0.113.50, not-an-ip",
        b"203.0.113.51, \xff\xfe",
        b"\xc3\x28",
        b"[::1",
        b",,,,",
        b"300.1.1.1",
    ] {
        let got = status(&c, &app, "/xff", Some(("x-forwarded-for", garbage))).await;
        assert_eq!(
            got,
            429,
            "{:?} counts against the peer",
            String::from_utf8_lossy(garbage)
        );
    }
    // 10,000 hops that are all trusted: the walk stops after max_hops (32): the peer's bucket.
    let trusted = "127.0.0.1, ".repeat(10_000);
    assert_eq!(
        status(
            &c,
            &app,
            "/xff",
            Some(("x-forwarded-for", trusted.as_bytes()))
        )
        .await,
        429
    );

    // `Forwarded` (RFC 7239) on the route that reads it.
    let fwd = |v: &'static [u8]| Some(("forwarded", v));
    for _ in 0..3 {
        assert_eq!(
            status(&c, &app, "/fwd", fwd(b"for=198.51.100.9")).await,
            200
        );
    }
    for spoof in [
        &b"for=1.1.1.1, for=198.51.100.9"[..],
        b"for=\"[2001:db8::1]\";proto=https, for=198.51.100.9",
        b"for=\"unterminated, for=198.51.100.9;by=x",
        b"for=_hidden;;;==, for=198.51.100.9",
    ] {
        assert_eq!(
            status(&c, &app, "/fwd", Some(("forwarded", spoof))).await,
            429
        );
    }
    let mut many = "for=10.1.1.1;proto=http, ".repeat(5_000);
    many.push_str("for=198.51.100.9");
    assert_eq!(
        status(&c, &app, "/fwd", Some(("forwarded", many.as_bytes()))).await,
        429
    );
    // `X-Forwarded-For` is not read by the `Forwarded` route: the peer's bucket.
    for _ in 0..3 {
        assert_eq!(status(&c, &app, "/fwd", None).await, 200);
    }
    assert_eq!(status(&c, &app, "/fwd", xff(b"198.51.100.200")).await, 429);
    assert_eq!(status(&c, &app, "/fwd", fwd(b"for=garbage")).await, 429);
}

/// Writes a raw request and returns the status line the server sent (or what happened).
fn raw_status(app: &TestApp, request: &[u8]) -> String {
    let mut s = TcpStream::connect(app.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let start = Instant::now();
    if let Err(e) = s.write_all(request) {
        return format!("write failed: {e}");
    }
    let mut buf = vec![0u8; 256];
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return format!("read failed: {e}"),
        }
    }
    assert!(
        start.elapsed() <= Duration::from_secs(1),
        "raw answer took {:?}",
        start.elapsed()
    );
    let line = String::from_utf8_lossy(&got);
    line.lines()
        .next()
        .unwrap_or("connection closed, no answer")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_headers_are_refused_by_the_server() {
    let (_redis, app, metrics) = start().await;
    for (what, value) in [
        ("NUL", &b"1.2.3.4\x00"[..]),
        ("SOH", b"1.2.3.4\x01"),
        ("ESC", b"\x1b[31m1.2.3.4"),
        ("bare CR", b"1.2.3.4\r5.6.7.8"),
        ("DEL", b"1.2.3.4\x7f"),
    ] {
        let mut req = b"GET /xff HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: ".to_vec();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let line = raw_status(&app, &req);
        println!("X-Forwarded-For with {what}: {line}");
        assert!(line.starts_with("HTTP/1.1 400"), "{what}: {line}");
    }
    // A header line folded onto the next (obsolete line folding) is refused too.
    let folded = raw_status(
        &app,
        b"GET /xff HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: 1.2.3.4\r\n 5.6.7.8\r\nConnection: close\r\n\r\n",
    );
    println!("folded X-Forwarded-For: {folded}");
    assert!(folded.starts_with("HTTP/1.1 400"), "{folded}");
    // Nothing refused by the HTTP parser reached the limiter.
    let reached = ["allowed", "denied", "failed_closed"]
        .iter()
        .map(|o| metrics.decisions("xff", o))
        .sum::<u64>();
    assert_eq!(reached, 0, "requests that reached the limiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_binary_and_empty_api_keys() {
    let (redis, app, _metrics) = start().await;
    let c = load::client();

    // 64 KiB keys: limited per key; two keys differing in their last byte are two clients.
    let a = vec![b'k'; 64 * 1024];
    let mut b = a.clone();
    *b.last_mut().unwrap() = b'j';
    for _ in 0..2 {
        assert_eq!(status(&c, &app, "/key", Some(("x-api-key", &a))).await, 200);
    }
    assert_eq!(status(&c, &app, "/key", Some(("x-api-key", &a))).await, 429);
    assert_eq!(status(&c, &app, "/key", Some(("x-api-key", &b))).await, 200);
    // The Redis keys stay bounded whatever the client sends.
    let keys = redis.cli(&["--scan", "--pattern", "e2e:*"]);
    let longest = keys.lines().map(str::len).max().unwrap_or(0);
    println!("longest Redis key for a 64 KiB API key: {longest} bytes");
    assert!(longest <= 200, "{keys}");

    // Binary keys (obs-text bytes): each its own client.
    let bin1: Vec<u8> = (0x80..=0xff).collect();
    let mut bin2 = bin1.clone();
    bin2[0] = 0x81;
    for _ in 0..2 {
        assert_eq!(
            status(&c, &app, "/key", Some(("x-api-key", &bin1))).await,
            200
        );
    }
    assert_eq!(
        status(&c, &app, "/key", Some(("x-api-key", &bin1))).await,
        429
    );
    assert_eq!(
        status(&c, &app, "/key", Some(("x-api-key", &bin2))).await,
        200
    );

    // Control characters in a key (0x1f, say) never reach it: the HTTP server refuses them.
    let line = raw_status(
        &app,
        b"GET /key HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: \x1fcost\x1f\r\nConnection: close\r\n\r\n",
    );
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");

    // No key, or an empty one: the documented 400.
    assert_eq!(status(&c, &app, "/key", None).await, 400);
    assert_eq!(
        status(&c, &app, "/key", Some(("x-api-key", b""))).await,
        400
    );

    // 1 MiB: over the HTTP server's header limit, refused before the limiter.
    let huge = vec![b'x'; 1024 * 1024];
    let start = Instant::now();
    let answer = match c
        .get(app.url("/key"))
        .header("x-api-key", HeaderValue::from_bytes(&huge).unwrap())
        .send()
        .await
    {
        Ok(r) => format!("status {}", r.status().as_u16()),
        // The client sends the header as it is (a builder error would be the client's refusal,
        // not the server's), and the server closes the connection without an answer.
        Err(e) if e.is_builder() => format!("refused by the client: {e}"),
        Err(e) => format!("connection closed by the server: {e}"),
    };
    println!(
        "1 MiB API key: {answer} after {:.1} ms",
        ms(start.elapsed())
    );
    assert!(
        answer == "status 431" || answer.starts_with("connection closed"),
        "{answer}"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A request that sends its API key twice (or empty) is not an anonymous one: an authentication
/// layer reading the first value may serve it as the key. Under `key::or` it does not get the
/// client address's bucket, nor under a shared key the anonymous clients' one: it gets `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_sent_twice_gets_no_other_bucket() {
    let (_redis, app, _metrics) = start().await;
    let c = load::client();
    // One request with `x-api-key: good` twice (and `X-Forwarded-For: from`, which 127.0.0.1,
    // trusted, passes on).
    let twice = |path: &str, from: &str| {
        c.get(app.url(path))
            .header("x-api-key", "good")
            .header("x-api-key", "good")
            .header("x-forwarded-for", from)
            .send()
    };
    for path in ["/either", "/anon"] {
        for _ in 0..2 {
            assert_eq!(
                status(&c, &app, path, Some(("x-api-key", b"good"))).await,
                200
            );
        }
        assert_eq!(
            status(&c, &app, path, Some(("x-api-key", b"good"))).await,
            429,
            "{path}"
        );
        // The key's quota is spent; sent twice, from any address, it is refused, not counted
        // elsewhere.
        for from in ["198.51.100.1", "198.51.100.2", "203.0.113.9"] {
            let res = twice(path, from).await.expect("a response");
            assert_eq!(res.status().as_u16(), 400, "{path} from {from}");
        }
        assert_eq!(
            status(&c, &app, path, Some(("x-api-key", b" "))).await,
            400,
            "{path}"
        );
    }
    // Those addresses' buckets, and the anonymous one, are whole.
    let from = |ip: &'static [u8]| Some(("x-forwarded-for", ip));
    for ip in [&b"198.51.100.1"[..], b"198.51.100.2"] {
        for _ in 0..2 {
            assert_eq!(status(&c, &app, "/either", from(ip)).await, 200);
        }
        assert_eq!(status(&c, &app, "/either", from(ip)).await, 429);
    }
    for expected in [200, 200, 429] {
        assert_eq!(status(&c, &app, "/anon", None).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_of_zero_and_u64_max() {
    let (_redis, app, metrics) = start().await;
    let c = load::client();
    let url = app.url("/cost");
    let key = |cost: &'static [u8]| cost_request(&c, &url, cost);

    // u64::MAX can never fit: 429 without Retry-After, and it consumes nothing.
    for _ in 0..3 {
        let (s, ra, _) = key(b"18446744073709551615").await;
        assert_eq!((s, ra), (429, None), "a cost that can never pass");
    }
    // A cost above the limit but far below u64::MAX: the same answer.
    assert_eq!(key(b"4").await.0, 429);
    assert_eq!(key(b"4").await.1, None);
    // Cost 0 is a peek: allowed, consumes nothing.
    for _ in 0..10 {
        let (s, _, rl) = key(b"0").await;
        assert_eq!(s, 200);
        assert!(rl.as_deref().is_some_and(|h| h.contains("r=3")), "{rl:?}");
    }
    // So the full limit of 3 is still there.
    for _ in 0..3 {
        assert_eq!(key(b"1").await.0, 200);
    }
    let (s, ra, _) = key(b"1").await;
    assert_eq!(s, 429);
    assert!(ra.is_some(), "an ordinary denial says when to retry");
    // A peek once empty: it reports the state; documented as allowed (it consumes nothing).
    let (s, _, rl) = key(b"0").await;
    println!("cost 0 on an exhausted key: {s}, RateLimit: {rl:?}");
    assert_eq!(s, 200);
    assert!(rl.as_deref().is_some_and(|h| h.contains("r=0")), "{rl:?}");
    assert!(metrics.decisions("cost", "denied") >= 5);
}

/// GET `/cost` as the client `cost-client` with `x-cost: <cost>`: status, `Retry-After`,
/// `RateLimit`.
async fn cost_request(
    client: &reqwest::Client,
    url: &str,
    cost: &[u8],
) -> (u16, Option<String>, Option<String>) {
    let res = client
        .get(url)
        .header("x-api-key", "cost-client")
        .header("x-cost", HeaderValue::from_bytes(cost).unwrap())
        .send()
        .await
        .unwrap();
    let header = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
    (
        res.status().as_u16(),
        header("retry-after"),
        header("ratelimit"),
    )
}

#[tokio::test]
async fn invalid_configuration_gets_typed_errors() {
    // ratelimit-core
    assert_eq!(Quota::per_second(0).unwrap_err(), ConfigError::ZeroLimit);
    assert_eq!(
        Quota::per_second(1).unwrap().with_burst(0).unwrap_err(),
        ConfigError::ZeroBurst
    );
    assert!(matches!(
        Quota::per_period(1, Duration::from_nanos(10)),
        Err(ConfigError::PeriodTooShort { .. })
    ));
    assert_eq!(
        Limit::new(Algorithm::TokenBucket, []).unwrap_err(),
        ConfigError::NoQuota
    );
    assert!(matches!(
        MemoryStore::builder().max_keys(0).build(),
        Err(ConfigError::InvalidSetting {
            name: "max_keys",
            ..
        })
    ));
    // tower-ratelimit
    let limit = per_minute(3);
    assert!(matches!(
        Policy::new("", limit.clone()),
        Err(Error::InvalidPolicyName { .. })
    ));
    assert!(matches!(
        Policy::new("caf\u{e9}", limit.clone()),
        Err(Error::InvalidPolicyName { .. })
    ));
    assert!(matches!(
        ApiKeyHeader::new("bad header"),
        Err(Error::InvalidHeaderName { .. })
    ));
    assert_eq!(
        MissingKey::reject(200),
        Err(Error::InvalidStatus { status: 200 })
    );
    assert!(matches!(
        FailurePolicy::fallback(0),
        Err(Error::InvalidSetting {
            name: "gateways",
            ..
        })
    ));
    assert!(matches!(
        CircuitBreaker::new(0, Duration::from_secs(1)),
        Err(Error::InvalidSetting {
            name: "failure_threshold",
            ..
        })
    ));
    assert!(matches!(
        CircuitBreaker::new(1, Duration::ZERO),
        Err(Error::InvalidSetting {
            name: "cool_down",
            ..
        })
    ));
    assert!(matches!(
        RateLimitLayer::builder(MemoryStore::new(), Policy::new("p", limit.clone()).unwrap())
            .timeout(Duration::ZERO)
            .build(),
        Err(Error::InvalidSetting {
            name: "timeout",
            ..
        })
    ));
    assert!(matches!(
        ClientIp::behind_proxies(["10.0.0.0/8", "not-an-ip"]),
        Err(ClientIpError::InvalidProxy { input }) if input == "not-an-ip"
    ));
    assert!(matches!(
        ClientIp::behind_proxies(["10.0.0.10/8"]),
        Err(ClientIpError::HostBitsSet { network, .. }) if network == "10.0.0.0/8"
    ));
    assert_eq!(
        ClientIp::peer().ipv4_prefix(33).unwrap_err(),
        ClientIpError::Ipv4PrefixOutOfRange(33)
    );
    assert_eq!(
        ClientIp::peer().ipv6_prefix(129).unwrap_err(),
        ClientIpError::Ipv6PrefixOutOfRange(129)
    );
    // A fallback share of more gateways than the limit allows: each gets at least 1.
    let layer = RateLimitLayer::new(
        MemoryStore::new(),
        Policy::new("tiny", per_minute(3))
            .unwrap()
            .failure(FailurePolicy::fallback(10).unwrap()),
    );
    assert!(layer.is_ok(), "a share below 1 is accepted: {layer:?}");
    let share = per_minute(3).divided(10).unwrap();
    assert_eq!(
        (share.quotas()[0].limit(), share.quotas()[0].burst()),
        (1, 1),
        "and rounded up to 1"
    );
    // ratelimit-redis: refused before any connection is tried.
    for (builder, name) in [
        (
            RedisStore::builder("redis://127.0.0.1:1").prefix("a{b"),
            "prefix",
        ),
        (
            RedisStore::builder("redis://127.0.0.1:1").prefix(""),
            "prefix",
        ),
        (
            RedisStore::builder("redis://127.0.0.1:1").pool_size(0),
            "pool_size",
        ),
        (
            RedisStore::builder("redis://127.0.0.1:1").response_timeout(Duration::ZERO),
            "response_timeout",
        ),
        (RedisStore::builder("not a url"), "url"),
    ] {
        match builder.build().await {
            Err(RedisStoreError::Config { name: got, reason }) => {
                assert_eq!(got, name, "{reason}");
            }
            other => panic!("{name}: expected a Config error, got {other:?}"),
        }
    }
}
