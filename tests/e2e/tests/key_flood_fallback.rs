//! A flood of distinct client identities against the layer's local fallback (the in-memory store
//! that counts while Redis is down): resident memory stays under a bound derived from its key cap
//! (`ratelimit_core::DEFAULT_MAX_KEYS`, 1,000,000; the layer does not make it configurable).
//!
//! Redis is killed after the store is built; the circuit opens on the first failure and every
//! request after it is decided by the fallback, through the real router and layer (no HTTP, to
//! push 10,000,000 requests through in half a minute in release).
//!
//! The 10,000,000-identity run is `#[ignore]`d; run it with
//! `cargo test --release -p ratelimit-e2e -- --ignored`. The default run sends 200,000.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratelimit_core::DEFAULT_MAX_KEYS;
use ratelimit_e2e::observe::rss_bytes;
use ratelimit_e2e::{per_minute, store_builder};
use redis_harness::RedisServer;
use tower::ServiceExt;
use tower_ratelimit::{
    CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer, RequestHead, Verdict,
    VerdictKind,
};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Resident bytes allowed per key the store may hold (see `key_flood.rs`).
const BYTES_PER_KEY: u64 = 128;
/// Allocator and runtime noise allowed on top.
const SLACK: u64 = 16 * 1024 * 1024;

/// How often (in identities) the flood samples the resident size and the store's key count.
const SAMPLE_EVERY: u64 = 50_000;

/// The `n`-th identity: a distinct IPv4 address.
fn identity(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000_u32.wrapping_add(n as u32)))
}

fn fallback_flood(identities: u64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(fallback_flood_on_runtime(identities));
}

async fn fallback_flood_on_runtime(identities: u64) {
    let mut redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let layer = RateLimitLayer::builder(
        store,
        Policy::new("flood", per_minute(100))
            .unwrap()
            .key(|req: &RequestHead<'_>| req.extensions().get::<IpAddr>().copied())
            .failure(FailurePolicy::fallback(1).unwrap()),
    )
    .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(60)).unwrap())
    .build()
    .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer.clone());
    // Redis goes away: the first failure opens the circuit and every request after it is
    // counted by the local fallback.
    redis.kill();

    let before = rss_bytes();
    let mut peak = before;
    let start = Instant::now();
    let (mut admitted, mut by_fallback) = (0u64, 0u64);
    for n in 0..identities {
        let mut req = Request::get("/").body(Body::empty()).unwrap();
        req.extensions_mut().insert(identity(n));
        let res = app.clone().oneshot(req).await.unwrap();
        admitted += u64::from(res.status() == 200);
        let kind = res.extensions().get::<Verdict>().map(Verdict::kind);
        by_fallback += u64::from(kind == Some(VerdictKind::FallbackAllowed));
        if n % SAMPLE_EVERY == 0 {
            peak = peak.max(rss_bytes());
        }
    }
    peak = peak.max(rss_bytes());
    let growth = peak.saturating_sub(before);
    // The fallback store holds at most DEFAULT_MAX_KEYS keys (and never more than were sent).
    let bound = (DEFAULT_MAX_KEYS as u64).min(identities) * BYTES_PER_KEY + SLACK;
    println!(
        "layer fallback (max_keys {DEFAULT_MAX_KEYS}): {identities} identities in {:.1} s, \
         {admitted} admitted, resident growth {growth} bytes (bound {bound})",
        start.elapsed().as_secs_f64(),
    );
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // Every identity is new, so every one is admitted by its own local bucket: by the fallback
    // (not failed open, which would admit as many and hold nothing).
    assert_eq!(admitted, identities);
    assert_eq!(by_fallback, identities);
    assert!(growth <= bound, "resident growth {growth} over {bound}");
}

#[test]
fn layer_fallback_two_hundred_thousand_identities() {
    fallback_flood(200_000);
}

#[test]
#[ignore = "10,000,000 identities: run in release with --ignored"]
fn layer_fallback_ten_million_identities() {
    fallback_flood(10_000_000);
}
