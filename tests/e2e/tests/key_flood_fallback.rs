//! A flood of distinct client identities against the layer's local fallback (the in-memory store
//! that counts while Redis is down): the store never holds more keys than its cap
//! (`RateLimitLayerBuilder::fallback_max_keys`), it makes room for each new identity by evicting
//! one, and resident memory stays under a bound derived from the cap.
//!
//! Redis is killed after the store is built; the circuit opens on the first failure and every
//! request after it is decided by the fallback, through the real router and layer (no HTTP, to
//! push 10,000,000 requests through in half a minute in release).
//!
//! The 10,000,000-identity run, through the default cap (`ratelimit_core::DEFAULT_MAX_KEYS`,
//! 1,000,000), is `#[ignore]`d; run it with `cargo test --release -p ratelimit-e2e -- --ignored`.
//! The default run sends 200,000 through a cap of 20,000.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratelimit_core::DEFAULT_MAX_KEYS;
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_e2e::observe::rss_bytes;
use ratelimit_e2e::store_builder;
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
const SAMPLE_EVERY: u64 = 10_000;

/// The `n`-th identity: a distinct IPv4 address.
fn identity(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000_u32.wrapping_add(n as u32)))
}

fn fallback_flood(identities: u64, max_keys: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(fallback_flood_on_runtime(identities, max_keys));
}

async fn fallback_flood_on_runtime(identities: u64, max_keys: usize) {
    let mut redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    // A day's quota: no identity's bucket is full again (and so droppable by a sweep) within the
    // run, so each identity past the cap has to evict one.
    let per_day = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let layer = RateLimitLayer::builder(
        store,
        Policy::new("flood", per_day)
            .unwrap()
            .key(|req: &RequestHead<'_>| req.extensions().get::<IpAddr>().copied())
            .failure(FailurePolicy::fallback(1).unwrap()),
    )
    .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(60)).unwrap())
    .fallback_max_keys(max_keys)
    .build()
    .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer.clone());
    // Redis goes away: the first failure opens the circuit and every request after it is
    // counted by the local fallback.
    redis.kill();

    let stats = || layer.fallback_stats().expect("a fallback store");
    // The cap is split evenly over the store's shards: rounded down to a multiple of them.
    let cap = stats().max_keys;
    assert!(
        cap <= max_keys && cap > max_keys * 99 / 100,
        "{cap} of {max_keys}"
    );
    let before = rss_bytes();
    let mut peak = before;
    let mut most_held = 0;
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
            let held = stats().keys;
            assert!(held <= cap, "{held} keys held after {n} identities");
            most_held = most_held.max(held);
        }
    }
    peak = peak.max(rss_bytes());
    let growth = peak.saturating_sub(before);
    let end = stats();
    let (held, evicted) = (end.keys, end.evictions);
    // The fallback store holds at most its cap of keys (and never more than were sent).
    let bound = (cap as u64).min(identities) * BYTES_PER_KEY + SLACK;
    println!(
        "layer fallback (max_keys {cap}): {identities} identities in {:.1} s, \
         {admitted} admitted, {held} keys held (at most {most_held} sampled), {evicted} evicted, \
         resident growth {growth} bytes (bound {bound})",
        start.elapsed().as_secs_f64(),
    );
    // Every identity's state was kept until evicted: the store filled to its cap, and each of its
    // shards, once full, dropped an eighth of its keys to make room (those nearest to fresh), so
    // that it holds between 7/8 of the cap and the cap; no state was dropped otherwise.
    assert!(
        cap * 7 / 8 <= held && held <= cap,
        "{held} keys held, cap {cap}"
    );
    assert_eq!(held as u64 + evicted, identities);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // Every identity is new, so every one is admitted by its own local bucket: by the fallback
    // (not failed open, which would admit as many and hold nothing).
    assert_eq!(admitted, identities);
    assert_eq!(by_fallback, identities);
    assert!(growth <= bound, "resident growth {growth} over {bound}");
}

#[test]
fn layer_fallback_two_hundred_thousand_identities() {
    fallback_flood(200_000, 20_000);
}

#[test]
#[ignore = "10,000,000 identities: run in release with --ignored"]
fn layer_fallback_ten_million_identities() {
    fallback_flood(10_000_000, DEFAULT_MAX_KEYS);
}
