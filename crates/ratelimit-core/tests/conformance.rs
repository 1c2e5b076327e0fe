//! The conformance kit: the in-memory store passes it, and a store that rounds a field, or
//! fails, is caught at the first step that shows it.

use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratelimit_core::conformance::{Mismatch, Report, check_scenario, check_store, scenarios};
use ratelimit_core::{Decision, Limit, ManualClock, MemoryStore, NoError, Outcome, Store};

fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn the_memory_store_decides_as_the_algorithms_in_every_monotone_scenario() {
    let all = scenarios();
    let monotone: Vec<_> = all.iter().filter(|s| s.monotone()).cloned().collect();
    assert!(monotone.len() < all.len(), "some scenarios go back in time");
    let clock = ManualClock::new();
    let mut report = Report::default();
    for scenario in &monotone {
        let one = block_on(check_scenario(&memory(&clock), &clock, b"", scenario)).unwrap();
        report.scenarios += one.scenarios;
        report.decisions += one.decisions;
        report.several_violated += one.several_violated;
    }
    assert_eq!(report.scenarios, monotone.len());
    assert!(report.decisions > 7_000, "{report:?}");
    assert!(report.several_violated > 50, "{report:?}");
    // The same table every time, each scenario named apart (its keys are under its name).
    let again = scenarios();
    assert_eq!(all.len(), again.len());
    assert!(all.iter().zip(&again).all(|(a, b)| a.steps == b.steps));
    let names: std::collections::HashSet<_> = all.iter().map(|s| &s.name).collect();
    assert_eq!(names.len(), all.len());
}

/// A memory store whose denials say to retry in whole seconds, rounded up, as a store keeping
/// second-granular TTLs might.
struct WholeSeconds(MemoryStore<ManualClock>);

impl Store for WholeSeconds {
    type Error = NoError;
    type Future = Ready<Result<Decision, NoError>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let d = self.0.check_now(key, limit, cost);
        let d = match d.outcome() {
            Outcome::Denied { retry_after } => Decision::new(
                Outcome::Denied {
                    retry_after: Duration::from_secs(
                        retry_after.as_micros().div_ceil(1_000_000) as u64
                    ),
                },
                d.limit(),
                d.remaining(),
                d.reset_after(),
                d.quota_index(),
            ),
            _ => d,
        };
        ready(Ok(d))
    }
}

#[test]
fn a_rounded_field_is_caught_at_its_first_step() {
    let clock = ManualClock::new();
    let first_caught = scenarios()
        .iter()
        .filter(|s| s.monotone())
        .map(|s| {
            block_on(check_scenario(
                &WholeSeconds(memory(&clock)),
                &clock,
                b"",
                s,
            ))
        })
        .find(Result::is_err)
        .expect("a scenario catches it");
    match first_caught {
        Err(Mismatch::Decision(m)) => {
            assert_eq!(
                m.expected.is_allowed(),
                m.got.is_allowed(),
                "{}",
                m.scenario
            );
            assert_ne!(
                m.expected.retry_after(),
                m.got.retry_after(),
                "{}",
                m.scenario
            );
        }
        other => panic!("not caught: {other:?}"),
    }
}

/// A store that fails at its third check.
struct FailsThird(MemoryStore<ManualClock>, std::sync::atomic::AtomicU64);

#[derive(Debug, thiserror::Error)]
#[error("down")]
struct Down;

impl Store for FailsThird {
    type Error = Down;
    type Future = Ready<Result<Decision, Down>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let n = self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ready(if n == 2 {
            Err(Down)
        } else {
            Ok(self.0.check_now(key, limit, cost))
        })
    }
}

#[test]
fn a_failure_is_reported_with_its_step() {
    let clock = ManualClock::new();
    let store = FailsThird(memory(&clock), 0.into());
    let err = block_on(check_store(&store, &clock, b"", &scenarios())).unwrap_err();
    assert!(
        matches!(
            &err,
            Mismatch::Store {
                step: 2,
                error: Down,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().ends_with("step 2: the store failed: down"),
        "{err}"
    );
}
