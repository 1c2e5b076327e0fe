//! Support for the fault-injection and hostile-input tests of this workspace.
//!
//! The tests in `tests/` run a real axum server (on `127.0.0.1:0`) with the real Redis store
//! against real `redis-server` processes started by `redis-harness`, drive it with a real HTTP
//! client, break Redis or the network in the middle, and assert what each route answered and how
//! fast. This library holds what they share:
//!
//! - [`app::TestApp`]: serves a router on a loopback port, with the peer address available to
//!   key extractors;
//! - [`load`]: a bounded load (a fixed number of workers for a fixed time) that records every
//!   response's status, latency and time of sending;
//! - [`observe`]: metrics (a debugging recorder), log lines (a small `tracing` subscriber) and the
//!   resident memory of this process.
//!
//! Run the suite with `cargo test -p ratelimit-e2e`; the 10,000,000-identity key floods with
//! `cargo test --release -p ratelimit-e2e -- --ignored`. `docs/operations.md` lists the scenarios
//! and what they measured.
#![forbid(unsafe_code)]

pub mod app;
pub mod load;
pub mod observe;

use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, Quota, Store};
use ratelimit_redis::{RedisStore, RedisStoreBuilder};
use tower_ratelimit::{CircuitBreaker, FailurePolicy, Policy, RateLimitLayer};

/// A `GET /` from `peer`, as a router served with `into_make_service_with_connect_info` gets it:
/// for calling a layer in process, without a server.
pub fn request_from(peer: std::net::SocketAddr) -> http::Request<axum::body::Body> {
    let mut req = http::Request::get("/")
        .body(axum::body::Body::empty())
        .expect("a valid request");
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req
}

/// A token bucket of `n` per minute (bursts of `n`).
pub fn per_minute(n: u64) -> Limit {
    Limit::single(
        Algorithm::TokenBucket,
        Quota::per_minute(n).expect("a valid quota"),
    )
    .expect("a valid limit")
}

/// The layer of the fault scenarios: policy `name` allows `per_min` a minute (token bucket) and
/// answers `failure` when the store fails; store calls are cut at `timeout`; the circuit breaker
/// opens after 8 consecutive failures and probes again after 200 ms. (8, more than the 2 or 3
/// requests a scenario keeps in flight per route: one stall of the loaded test machine, which
/// times out the checks in flight together, must not open it during a healthy phase.)
pub fn fault_layer<S: Store + Clone>(
    store: &S,
    name: &str,
    per_min: u64,
    failure: FailurePolicy,
    timeout: Duration,
) -> RateLimitLayer<S> {
    RateLimitLayer::builder(
        store.clone(),
        Policy::new(name, per_minute(per_min))
            .expect("policy")
            .failure(failure),
    )
    .timeout(timeout)
    .circuit_breaker(CircuitBreaker::new(8, Duration::from_millis(200)).expect("breaker"))
    .build()
    .expect("layer")
}

/// Store settings for fault tests: short connect and wait timeouts (100 ms), a response timeout of
/// 200 ms (the layer's own timeout, shorter, is what bounds a request), two connections.
pub fn store_builder(url: &str) -> RedisStoreBuilder {
    RedisStore::builder(url)
        .prefix("e2e")
        .pool_size(2)
        .connect_timeout(Duration::from_millis(100))
        .wait_timeout(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(200))
}

/// [`store_builder`] with a response timeout of 2 s: longer than a layer's own, so that the
/// layer's bounds a check, and room for a script's reload (`NOSCRIPT`, `SCRIPT LOAD`, `EVALSHA`
/// again) on a loaded machine.
pub fn patient_store_builder(url: &str) -> RedisStoreBuilder {
    store_builder(url).response_timeout(Duration::from_secs(2))
}

/// `true` if `GET url` answers 200 (used to poll for recovery).
pub async fn answers_ok(client: &reqwest::Client, url: String) -> bool {
    client
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// Polls `f` every 10 ms until it returns `true`, for at most `within`; returns how long it took,
/// or `None` if it never did.
pub async fn wait_until<F, Fut>(within: Duration, mut f: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
