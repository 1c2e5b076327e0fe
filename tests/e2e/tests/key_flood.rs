//! A flood of distinct client identities: resident memory stays under a bound derived from the
//! store's key cap, for the in-memory store and for the layer's local fallback (the store that
//! counts while Redis is down).
//!
//! The 10,000,000-identity runs take a while in a debug build, so they are `#[ignore]`d; run them
//! in release with `cargo test --release -p ratelimit-e2e --test key_flood -- --ignored`.
//! The default run floods with fewer identities through the same code.
//!
//! The tests of this file run one at a time (a lock), since they measure the resident memory of
//! the whole process.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use http::request::Parts;
use ratelimit_core::{DEFAULT_MAX_KEYS, MemoryStore};
use ratelimit_e2e::observe::rss_bytes;
use ratelimit_e2e::{per_minute, store_builder};
use redis_harness::RedisServer;
use tower::ServiceExt;
use tower_ratelimit::{CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Resident bytes allowed per key the store may hold: the tables measured 32 to 64 bytes per key;
/// twice the upper figure leaves room for the open-addressing table's spare slots.
const BYTES_PER_KEY: u64 = 128;
/// Allocator and runtime noise allowed on top.
const SLACK: u64 = 16 * 1024 * 1024;

/// The `n`-th identity: a distinct IPv4 address (the key a `ClientIp` extractor would give).
fn identity(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000_u32.wrapping_add(n as u32)))
}

fn memory_store_flood(identities: u64, max_keys: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .build()
        .expect("store");
    let limit = per_minute(100);
    let before = rss_bytes();
    let mut peak = before;
    let start = Instant::now();
    let mut key = [0u8; 5];
    key[0] = 4;
    for n in 0..identities {
        if let IpAddr::V4(v4) = identity(n) {
            key[1..].copy_from_slice(&v4.octets());
        }
        assert!(store.check_now(&key, &limit, 1).is_allowed());
        if n % 1_000_000 == 0 {
            peak = peak.max(rss_bytes());
            assert!(store.len() <= max_keys);
        }
    }
    peak = peak.max(rss_bytes());
    let growth = peak.saturating_sub(before);
    let bound = max_keys as u64 * BYTES_PER_KEY + SLACK;
    println!(
        "MemoryStore, max_keys {max_keys}: {identities} identities in {:.1} s, {} held, \
         {} evictions, tables {} bytes, resident growth {} bytes (bound {bound})",
        start.elapsed().as_secs_f64(),
        store.len(),
        store.evictions(),
        store.memory_bytes(),
        growth,
    );
    assert!(store.len() <= max_keys);
    assert!(growth <= bound, "resident growth {growth} over {bound}");
}

async fn fallback_flood(identities: u64) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let layer = RateLimitLayer::builder(
        store,
        Policy::new("flood", per_minute(100))
            .unwrap()
            .key(|parts: &Parts| parts.extensions.get::<IpAddr>().copied())
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
    let mut admitted = 0u64;
    for n in 0..identities {
        let mut req = Request::get("/").body(Body::empty()).unwrap();
        req.extensions_mut().insert(identity(n));
        let res = app.clone().oneshot(req).await.unwrap();
        admitted += u64::from(res.status() == 200);
        if n % 1_000_000 == 0 {
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
    // Every identity is new, so every one is admitted by its own local bucket.
    assert_eq!(admitted, identities);
    assert!(growth <= bound, "resident growth {growth} over {bound}");
}

#[test]
fn memory_store_one_million_identities() {
    memory_store_flood(1_000_000, 100_000);
}

#[test]
#[ignore = "10,000,000 identities: run in release with --ignored"]
fn memory_store_ten_million_identities() {
    memory_store_flood(10_000_000, 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_fallback_two_hundred_thousand_identities() {
    fallback_flood(200_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10,000,000 identities: run in release with --ignored"]
async fn layer_fallback_ten_million_identities() {
    fallback_flood(10_000_000).await;
}
