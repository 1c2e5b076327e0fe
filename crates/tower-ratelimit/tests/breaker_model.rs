//! The circuit breaker against a model of its documented state machine, over random outages
//! and clock moves. (A test binary of its own: the breaker logs as it opens and closes, and the
//! tests that capture those lines on their own thread must not race with it for the callsites.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use proptest::prelude::*;
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota};
use tower_ratelimit::{CircuitState, Policy};

fn per_minute(n: u64) -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(n).unwrap()).unwrap()
}

/// The breaker of `closed_with_breaker` (3 failures, 10 s cool-down) as its documentation
/// describes it, for a store whose every answer comes back before the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    /// `failures` in a row, the last at `last_ms`.
    Closed { failures: u32, last_ms: u64 },
    /// Opened (or re-opened by a failed probe) at `since_ms`.
    Open { since_ms: u64 },
}

impl Circuit {
    const THRESHOLD: u32 = 3;
    const COOL_DOWN_MS: u64 = 10_000;

    /// Whether a request at `now_ms` asks the store.
    fn asks(&self, now_ms: u64) -> bool {
        match *self {
            Circuit::Closed { .. } => true,
            Circuit::Open { since_ms } => now_ms - since_ms >= Self::COOL_DOWN_MS,
        }
    }

    /// The circuit after a request at `now_ms` that asked the store, which failed or not.
    fn answered(self, now_ms: u64, failed: bool) -> Circuit {
        match (self, failed) {
            (_, false) => Circuit::Closed {
                failures: 0,
                last_ms: 0,
            },
            // A failed probe opens the circuit again for another cool-down.
            (Circuit::Open { .. }, true) => Circuit::Open { since_ms: now_ms },
            (Circuit::Closed { failures, last_ms }, true) => {
                // Failures in a row, each within a cool-down of the one before.
                let failures = if failures > 0 && now_ms - last_ms <= Self::COOL_DOWN_MS {
                    failures + 1
                } else {
                    1
                };
                if failures >= Self::THRESHOLD {
                    Circuit::Open { since_ms: now_ms }
                } else {
                    Circuit::Closed {
                        failures,
                        last_ms: now_ms,
                    }
                }
            }
        }
    }
}

/// A step: the clock moved on by whole milliseconds (often to either side of the cool-down),
/// the store up or down, then one request.
fn steps() -> impl Strategy<Value = Vec<(u64, bool)>> {
    let dt = prop_oneof![
        3 => Just(0u64),
        2 => 1u64..=1_000,
        1 => proptest::sample::select(&[9_999u64, 10_000, 10_001][..]),
        1 => 1_000u64..=30_000,
    ];
    proptest::collection::vec((dt, proptest::bool::weighted(0.6)), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whether each request asks the store, what it answers, and the circuit's state after it
    /// are what the documented state machine says, for any sequence of outages and times:
    /// closed until three failures in a row (each within a cool-down of the one before),
    /// open for a cool-down, then one probe whose answer closes the circuit or opens it again.
    #[test]
    fn the_breaker_follows_its_documented_state_machine(steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = ManualClock::new();
        let (_store_clock, memory) = store();
        let store = Arc::new(SwitchStore::new(memory));
        let layer = closed_with_breaker(
            store.clone(),
            Policy::new("model", per_minute(1_000_000)).unwrap(),
            &clock,
        );
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone());
        let mut model = Circuit::Closed { failures: 0, last_ms: 0 };
        let mut now_ms = 0u64;
        for (i, &(dt, down)) in steps.iter().enumerate() {
            clock.advance(Duration::from_millis(dt));
            now_ms += dt;
            store.set_down(down);
            let calls = store.calls();
            let status = rt.block_on(send(&app, request("/"))).status();
            let asked = store.calls() - calls == 1;
            prop_assert_eq!(asked, model.asks(now_ms), "step {}: {:?} at {} ms", i, model, now_ms);
            if asked {
                model = model.answered(now_ms, down);
            }
            prop_assert_eq!(status, if asked && !down { 200 } else { 503 }, "step {}", i);
            let state = match model {
                Circuit::Closed { .. } => CircuitState::Closed,
                Circuit::Open { .. } => CircuitState::Open,
            };
            prop_assert_eq!(layer.circuit_state(), Some(state), "step {}: {:?}", i, model);
        }
    }
}
