//! The fallback failure policy against a model of it, over random limits, gateway counts,
//! costs and clock moves: with the store down, each request is decided as a `MemoryStore` of the
//! limit's share (`Limit::divided`) on the layer's clock decides it, and its status and
//! `Retry-After` are the ones `FailurePolicy::Fallback` documents.

mod common;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use proptest::prelude::*;
use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer};

/// A limit of any algorithm over one or two quotas of up to 50 a period (1 ms to a day), if
/// `Limit::new` takes it.
fn limit() -> impl Strategy<Value = Limit> {
    let quota = (1u64..=50, 1_000u64..=86_400_000_000, 1u64..=60).prop_filter_map(
        "a quota",
        |(limit, period, burst)| {
            Quota::per_period(limit, Duration::from_micros(period))
                .ok()?
                .with_burst(burst)
                .ok()
        },
    );
    (0usize..5, proptest::collection::vec(quota, 1..=2))
        .prop_filter_map("a limit", |(alg, quotas)| {
            fitted_limit(Algorithm::ALL[alg], quotas)
        })
}

/// Steps: the clock moved on (often not at all, or by a fraction of a second, sometimes by
/// minutes), a key of three, and a cost (mostly 1; 0, and up to 70).
fn steps() -> impl Strategy<Value = Vec<(u64, u8, u64)>> {
    let dt = prop_oneof![
        4 => Just(0u64),
        3 => 0u64..=1_000_000,
        1 => 0u64..=600_000_000,
    ];
    let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 0u64..=70];
    proptest::collection::vec((dt, 0u8..3, cost), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_fallback_decides_as_a_store_of_the_limits_share(
        limit in limit(),
        gateways in 1u64..=8,
        steps in steps(),
    ) {
        let clock = ManualClock::new();
        let policy = Policy::new("fb", limit.clone())
            .unwrap()
            .key(ApiKeyHeader::new("x-api-key").unwrap())
            .cost(cost_header)
            .failure(FailurePolicy::fallback(gateways).unwrap());
        let layer = RateLimitLayer::builder(FailingStore::default(), policy)
            .no_circuit_breaker()
            .clock(clock.clone())
            .build()
            .unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
        let share = limit.divided(gateways).unwrap();
        let model = MemoryStore::builder().with_clock(clock.clone()).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for (i, &(dt, key, cost)) in steps.iter().enumerate() {
            clock.advance(Duration::from_micros(dt));
            let key = format!("k{key}");
            let req = with_header(with_header(request("/"), "x-api-key", &key), "x-cost", &cost.to_string());
            let res = rt.block_on(send(&app, req));
            let want = model.check_now(key.as_bytes(), &share, cost);
            let retry_after = header(&res, "retry-after").map(|v| v.parse::<u64>().unwrap());
            let what = format!("step {i}: {key} cost {cost}: {want:?}");
            if want.is_allowed() {
                prop_assert_eq!(res.status().as_u16(), 200, "{}", what);
                continue;
            }
            prop_assert_eq!(res.status().as_u16(), 429, "{}", what);
            let expected = match want.retry_after() {
                // Whole seconds, rounded up, never 0.
                Some(wait) => Some(wait.as_micros().div_ceil(1_000_000).max(1) as u64),
                // A cost the share can never admit but the whole limit can: told when the store
                // is asked again (the next request, with no breaker: 1 s).
                None if cost <= limit.max_cost() => Some(1),
                // One the whole limit cannot either: no wait helps.
                None => None,
            };
            prop_assert_eq!(retry_after, expected, "{}", what);
        }
    }
}
