//! The conformance kit: the in-memory store passes it, and a store that rounds a field, or
//! fails, is caught at the first step that shows it.

use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratelimit_core::conformance::{
    Mismatch, Report, check_limits_apart, check_reset, check_scenario, check_store, scenarios,
};
use ratelimit_core::{Decision, Limit, ManualClock, MemoryStore, NoError, Outcome, State, Store};

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

/// A store that keeps one state per key, whatever the limit: the shape of a store written
/// without `Limit::fingerprint` in its keys. (A state of another number of quotas is taken as
/// none, so that the algorithms are not handed one they cannot read.)
#[derive(Default)]
struct OneStatePerKey(
    std::sync::Mutex<std::collections::HashMap<Vec<u8>, Vec<State>>>,
    ManualClock,
);

impl Store for OneStatePerKey {
    type Error = NoError;
    type Future = Ready<Result<Decision, NoError>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let now = ratelimit_core::Clock::now(&self.1);
        let mut map = self.0.lock().unwrap();
        let mut states = map
            .get(key)
            .filter(|s| s.len() == limit.quotas().len())
            .cloned()
            .unwrap_or_else(|| limit.fresh_states(now));
        let d = limit.check(&mut states, now, cost);
        if d.is_allowed() && cost > 0 {
            map.insert(key.to_vec(), states);
        }
        ready(Ok(d))
    }
}

/// One key under several limits keeps a count under each: the in-memory store passes, a store
/// that keeps one state per key is caught, though it passes every scenario of the table (each of
/// which checks its keys under one limit).
#[test]
fn a_key_under_two_limits_is_counted_apart() {
    let clock = ManualClock::new();
    let report = block_on(check_limits_apart(&memory(&clock), &clock, b"")).unwrap();
    assert_eq!(report.scenarios, 5);
    assert_eq!(report.decisions, 5 * 20);

    let one_state = OneStatePerKey(Default::default(), clock.clone());
    let table = block_on(check_store(&one_state, &clock, b"table ", &scenarios())).unwrap();
    assert_eq!(table.decisions, 19_275, "the table does not see it");
    let err = block_on(check_limits_apart(&one_state, &clock, b"")).unwrap_err();
    match &err {
        Mismatch::Decision(m) => assert!(m.scenario.starts_with("limits apart: "), "{err}"),
        other => panic!("not caught: {other:?}"),
    }
}

/// The memory store with a reset that does too little or too much: none, or one that forgets
/// the key under every limit (as a store keyed without the limit's fingerprint would).
struct OddReset(MemoryStore<ManualClock>, Vec<Limit>, bool);

impl Store for OddReset {
    type Error = NoError;
    type Future = <MemoryStore<ManualClock> as Store>::Future;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.0.check(key, limit, cost)
    }
}

impl ratelimit_core::Reset for OddReset {
    type ResetFuture = Ready<Result<(), NoError>>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        if self.2 {
            for any in &self.1 {
                self.0.reset_now(key, any);
            }
            self.0.reset_now(key, limit);
        }
        ready(Ok(()))
    }
}

/// The memory store's reset forgets a key under one limit, and nothing else; a reset that does
/// nothing, and one that forgets the key under every limit, are caught.
#[test]
fn a_reset_forgets_one_key_under_one_limit() {
    let clock = ManualClock::new();
    let report = block_on(check_reset(&memory(&clock), &clock, b"")).unwrap();
    assert_eq!((report.scenarios, report.decisions), (5, 5 * 13));
    let every_limit: Vec<Limit> = ratelimit_core::Algorithm::ALL
        .into_iter()
        .map(|alg| {
            Limit::single(
                alg,
                ratelimit_core::Quota::per_period(1_000, Duration::from_secs(3_600)).unwrap(),
            )
            .unwrap()
        })
        .collect();
    for (forgets, what) in [(false, "nothing"), (true, "every limit")] {
        let store = OddReset(memory(&clock), every_limit.clone(), forgets);
        let err = block_on(check_reset(&store, &clock, b"")).unwrap_err();
        assert!(
            matches!(&err, Mismatch::Decision(m) if m.scenario.starts_with("reset: ")),
            "a reset of {what} not caught: {err:?}"
        );
    }
}
