//! The round-trip saving store wrappers of ratelimit-core (`DenialCache`, `Leasing`) plug into the
//! layer unchanged: the same statuses as over the plain store, and under `DenialCache` the same
//! fields (under `Leasing`, a bucket's `t` may be later: docs/round-trips.md).

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use ratelimit_core::{
    Algorithm, DenialCache, Leasing, Limit, ManualClock, MemoryStore, Quota, Store,
};
use tower_ratelimit::{Policy, RateLimitLayer};

fn app<S: Store + Clone>(store: S, limit: Limit) -> Router
where
    S::Future: Unpin,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, Policy::new("api", limit).unwrap()).unwrap())
}

/// Status, `Retry-After` and `RateLimit` of each response to `n` requests, one every `step`.
async fn responses(app: &Router, clock: &ManualClock, n: usize, step: Duration) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let res = send(app, request("/")).await;
        out.push(format!(
            "{} {:?} {:?}",
            res.status(),
            header(&res, "retry-after"),
            header(&res, "ratelimit")
        ));
        clock.advance(step);
    }
    out
}

fn memory(clock: &ManualClock) -> Arc<MemoryStore<ManualClock>> {
    Arc::new(
        MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap(),
    )
}

fn five_a_minute() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(5).unwrap()).unwrap()
}

#[tokio::test]
async fn denial_cache_gives_the_same_responses_with_fewer_store_calls() {
    let step = Duration::from_millis(700);
    let clock = ManualClock::new();
    let plain = responses(&app(memory(&clock), five_a_minute()), &clock, 60, step).await;

    let clock = ManualClock::new();
    let cached = Arc::new(DenialCache::new(memory(&clock), clock.clone()));
    let with_cache = responses(&app(Arc::clone(&cached), five_a_minute()), &clock, 60, step).await;
    assert_eq!(plain, with_cache);
    let denied = plain.iter().filter(|r| r.starts_with("429")).count() as u64;
    assert!(denied > 40, "{denied}");
    // Only admissions reach the store: every denial was cached or implied.
    assert_eq!(
        cached.stats().store_calls,
        60 - denied,
        "{:?}",
        cached.stats()
    );
}

#[tokio::test]
async fn leasing_admits_the_same_requests_with_fewer_store_calls() {
    let limit = Limit::single(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    // 20 a second against 10 a second: half denied, by the store (a lease is not asked for again
    // once it was refused: about every request goes to the store); 10 a second: a busy key at
    // its limit's rate, which leasing is for; then about 6.7 a second, below it, where a lease
    // would expire part unused (taking units from the store at the limit's rate while the key
    // spends less), so none is taken.
    for (step_ms, most_calls, leases) in [(50, 200, None), (100, 40, None), (150, 200, Some(0))] {
        let step = Duration::from_millis(step_ms);
        let clock = ManualClock::new();
        let plain = responses(&app(memory(&clock), limit.clone()), &clock, 200, step).await;

        let clock = ManualClock::new();
        let leasing = Arc::new(Leasing::new(memory(&clock), clock.clone()));
        let leased = responses(&app(Arc::clone(&leasing), limit.clone()), &clock, 200, step).await;
        // Same statuses: the same requests admitted.
        let status = |v: &[String]| v.iter().map(|r| r[..3].to_owned()).collect::<Vec<_>>();
        assert_eq!(status(&plain), status(&leased), "every {step_ms} ms");
        // Above the limit's rate the plain store denies, and the same requests are denied with
        // leases; at it and below, none is.
        let denied = plain.iter().filter(|r| r.starts_with("429")).count();
        assert_eq!(
            denied > 0,
            step_ms < 100,
            "every {step_ms} ms: {denied} denied"
        );
        let s = leasing.stats();
        println!("every {step_ms} ms: {s:?}");
        assert!(s.store_calls <= most_calls, "every {step_ms} ms: {s:?}");
        assert_eq!(s.wasted_units, 0, "every {step_ms} ms: {s:?}");
        match leases {
            // Below the limit's rate no lease is taken: every request asks the store.
            Some(n) => {
                assert_eq!(s.leases, n, "every {step_ms} ms: {s:?}");
                assert_eq!(s.store_calls, 200, "every {step_ms} ms: {s:?}");
            }
            None => assert!(s.leases > 0, "every {step_ms} ms: {s:?}"),
        }
    }
}
