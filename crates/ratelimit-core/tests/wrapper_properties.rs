//! Property tests of the round-trip wrappers over random limits (quotas from a microsecond to
//! 2^51 µs, bursts to 2^40), costs and times, against a `MemoryStore` on a `ManualClock`:
//!
//! - `DenialCache` changes no decision: its outcomes and retry-afters are the plain store's, and
//!   every field but `remaining` under a single quota, as its documentation says;
//! - `Leasing` gateways sharing one store never admit a unit the store did not grant them, and
//!   account for every granted unit: admitted, held in a lease, or counted as wasted.
//!
//! For the denial cache the clock only moves on: set back, a `MemoryStore` counts at the latest
//! time it saw, which depends on which checks reached it, and the cache answers some (see
//! `DenialCache`'s caveat on a clock set back). The leasing gateways' clock is set back too.
//!
//! Failing cases are saved in `wrapper_properties.proptest-regressions` and replayed first.
#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use ratelimit_core::{
    Algorithm, Clock, Decision, DenialCache, Leasing, Limit, ManualClock, MemoryStore, NoError,
    Quota, Store, Timestamp,
};

/// The answer of a future that is ready at its first poll, as every store here is.
fn now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a memory store's check is ready at once"),
    }
}

/// A quota over a wide range: limit and burst 1 to 2^40, often small, period 1 µs to 2^51 µs.
fn quota() -> impl Strategy<Value = Quota> {
    let n = prop_oneof![1u64..=5, 1u64..=100, 1u64..=1 << 20, 1u64..=1 << 40];
    let period = prop_oneof![
        1u64..=3,
        1u64..=1_000,
        1_000u64..=10_000_000,
        Just(60_000_000u64),
        Just(95_000_011u64),
        (1u64 << 40)..=1 << 51,
    ];
    (n.clone(), period, n).prop_filter_map("a quota", |(limit, period_us, burst)| {
        Quota::per_period(limit, Duration::from_micros(period_us))
            .ok()?
            .with_burst(burst)
            .ok()
    })
}

/// A limit of a random algorithm over one or two quotas, if `Limit::new` takes it.
fn limit() -> impl Strategy<Value = Limit> {
    (0usize..5, prop::collection::vec(quota(), 1..=2)).prop_filter_map(
        "a limit",
        |(alg, quotas)| {
            let algorithm = Algorithm::ALL[alg];
            let quotas = quotas
                .into_iter()
                .map(|q| {
                    if algorithm.uses_burst() {
                        Some(q)
                    } else {
                        q.with_burst(q.limit()).ok()
                    }
                })
                .collect::<Option<Vec<_>>>()?;
            Limit::new(algorithm, quotas).ok()
        },
    )
}

/// One check: time moved on by `dt` (µs, or 1/1000ths of the first quota's period when
/// `share`; back by `dt` µs when `back`), then `cost` (or, when `of_burst`, that many 1/1000ths of the first quota's burst)
/// for key `key` through gateway `gateway`.
#[derive(Debug, Clone)]
struct Step {
    dt: u64,
    share: bool,
    back: bool,
    key: u8,
    cost: u64,
    of_burst: bool,
    gateway: u8,
}

/// Steps; with `back`, the clock is set back now and then (by up to 3 s).
fn steps(back: bool) -> impl Strategy<Value = Vec<Step>> {
    let time = prop_oneof![
        4 => Just((0u64, false, false)),
        2 => (0u64..=5).prop_map(|d| (d, false, false)),
        3 => (0u64..=1_500).prop_map(|s| (s, true, false)),
        1 => (0u64..=1 << 50).prop_map(|d| (d, false, false)),
        u32::from(back) => (0u64..=3_000_000).prop_map(|d| (d, false, true)),
    ];
    let cost = prop_oneof![
        6 => Just((1u64, false)),
        1 => Just((0u64, false)),
        1 => (2u64..=5).prop_map(|c| (c, false)),
        1 => Just((u64::MAX, false)),
        2 => (0u64..=1_200).prop_map(|s| (s, true)),
    ];
    prop::collection::vec(
        (time, 0u8..3, cost, 0u8..4).prop_map(
            |((dt, share, back), key, (cost, of_burst), gateway)| Step {
                dt,
                share,
                back,
                key,
                cost,
                of_burst,
                gateway,
            },
        ),
        1..150,
    )
}

/// Moves `clock` as `step` says, and returns the cost of `step` under `limit`.
fn resolve(clock: &ManualClock, limit: &Limit, step: &Step) -> u64 {
    let q = &limit.quotas()[0];
    let share = |of: u64, s: u64| u64::try_from(u128::from(of) * u128::from(s) / 1000).unwrap();
    let dt = if step.share {
        share(q.period_micros(), step.dt)
    } else {
        step.dt
    };
    if step.back {
        clock.set(Timestamp::from_micros(
            clock.now().as_micros().saturating_sub(dt),
        ));
    } else {
        clock.advance(Duration::from_micros(dt));
    }
    if step.of_burst {
        share(q.burst(), step.cost)
    } else {
        step.cost
    }
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap()
}

/// The clock's start: production Unix times, and the end of the algorithms' time nearer.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_764_000_000_123_457u64), 0u64..=1 << 51]
}

// 256 cases each (proptest's default); `PROPTEST_CASES=20000` for a longer search. About a
// third of the drawn limits are refused by `Limit::new` and drawn again.
proptest! {
    #![proptest_config(ProptestConfig { max_local_rejects: u32::MAX, ..ProptestConfig::default() })]

    /// A cached denial is one the store, asked at the same moment, would give: the outcome and
    /// retry-after are always the plain store's, and so is every field but `remaining` under a
    /// single quota for a cost that can pass (`remaining` is the one reported with the denial,
    /// never more than the store's now); an admission is the store's, field by field.
    #[test]
    fn a_denial_cache_changes_no_decision(limit in limit(), start in start(), steps in steps(false)) {
        let clock = ManualClock::starting_at(Timestamp::from_micros(start));
        let plain = memory(&clock);
        let cached = DenialCache::new(memory(&clock), clock.clone());
        for (i, step) in steps.iter().enumerate() {
            let cost = resolve(&clock, &limit, step);
            let key = [b'k', step.key];
            let want = plain.check_now(&key, &limit, cost);
            let got = now(cached.check(&key, &limit, cost)).unwrap();
            let what = format!("step {i} cost {cost}: {got:?} against {want:?}");
            prop_assert_eq!(got.outcome(), want.outcome(), "{}", what);
            prop_assert_eq!(got.retry_after(), want.retry_after(), "{}", what);
            if got.is_allowed() {
                prop_assert_eq!(got, want, "{}", what);
            } else {
                prop_assert!(got.remaining() <= want.remaining(), "{}", what);
                if limit.quotas().len() == 1 && got.can_ever_pass() {
                    let fields = |d: &Decision| (d.limit(), d.reset_after(), d.quota_index());
                    prop_assert_eq!(fields(&got), fields(&want), "{}", what);
                }
            }
        }
    }

    /// Up to four gateways lease from one store, on a clock set back now and then: each admits
    /// only units the store granted it, and every unit the store granted it is admitted, held in
    /// a lease, or counted as wasted (`LeasingStats::wasted_units`); a unit is never admitted
    /// twice nor lost uncounted.
    #[test]
    fn leasing_gateways_admit_only_what_the_store_granted(
        limit in limit(),
        start in start(),
        steps in steps(true),
        lease in 2u64..=20,
    ) {
        let clock = ManualClock::starting_at(Timestamp::from_micros(start));
        let store = Arc::new(memory(&clock));
        let gateways: Vec<_> = (0..4)
            .map(|_| {
                let counted = Counted { store: Arc::clone(&store), granted: Arc::default() };
                let granted = Arc::clone(&counted.granted);
                let gw = Leasing::builder(counted, clock.clone()).lease_size(lease).build().unwrap();
                (gw, granted)
            })
            .collect();
        let mut admitted = [0u128; 4];
        for (i, step) in steps.iter().enumerate() {
            let cost = resolve(&clock, &limit, step);
            let g = usize::from(step.gateway);
            let d = now(gateways[g].0.check(&[b'k', step.key], &limit, cost)).unwrap();
            if d.is_allowed() {
                admitted[g] += u128::from(cost);
            }
            let (gw, granted) = &gateways[g];
            let granted = u128::from(granted.load(Ordering::Relaxed));
            let held = u128::from(gw.outstanding_units()) + u128::from(gw.stats().wasted_units);
            prop_assert_eq!(
                admitted[g] + held,
                granted,
                "step {}: gateway {} admitted {}, holds or wasted {}, was granted {}",
                i, g, admitted[g], held, granted
            );
        }
    }
}

/// A store that counts the units its memory store granted (costs above 0 admitted).
struct Counted {
    store: Arc<MemoryStore<ManualClock>>,
    granted: Arc<AtomicU64>,
}

impl Store for Counted {
    type Error = NoError;
    type Future = std::future::Ready<Result<Decision, NoError>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let d = self.store.check_now(key, limit, cost);
        if d.is_allowed() {
            self.granted.fetch_add(cost, Ordering::Relaxed);
        }
        std::future::ready(Ok(d))
    }
}

/// A denial cache over a bucket whose refill does not divide its units evenly (2 units every
/// 3 µs) changes no decision: at every microsecond after two checks of 3 (from a burst of 4),
/// each cost answers as the store alone does. (A mutation that rounded such an implied wait
/// instead of skipping it was caught by the random cases only about nine runs in ten.)
#[test]
fn a_denial_cache_over_an_uneven_refill_changes_no_decision() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let quota = Quota::per_period(2, Duration::from_micros(3))
            .unwrap()
            .with_burst(4)
            .unwrap();
        let limit = Limit::single(algorithm, quota).unwrap();
        for later in 1..=4u64 {
            for at in 0..12u64 {
                let clock = ManualClock::starting_at(Timestamp::from_micros(1_000_000));
                let plain = MemoryStore::builder()
                    .with_clock(clock.clone())
                    .build()
                    .unwrap();
                let inner = MemoryStore::builder()
                    .with_clock(clock.clone())
                    .build()
                    .unwrap();
                let cache = DenialCache::new(inner, clock.clone());
                for cost in [3, 3] {
                    let alone = plain.check_now(b"k", &limit, cost);
                    let cached = now(cache.check(b"k", &limit, cost)).unwrap();
                    assert_eq!(alone.is_allowed(), cached.is_allowed(), "{algorithm}");
                }
                clock.advance(Duration::from_micros(at));
                let alone = plain.check_now(b"k", &limit, later);
                let cached = now(cache.check(b"k", &limit, later)).unwrap();
                assert_eq!(
                    alone.is_allowed(),
                    cached.is_allowed(),
                    "{algorithm}: cost {later} at +{at} µs: {cached:?} against {alone:?}"
                );
            }
        }
    }
}
