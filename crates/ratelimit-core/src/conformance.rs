//! A conformance kit for stores: a table of scenarios for every
//! algorithm, the decisions the pure algorithms make for them, and [`check_store`], which runs a
//! [`Store`] through the table and reports the first decision that differs.
//!
//! A store of another crate (over a database, say) that follows
//! [Writing a store](Store#writing-a-store) makes exactly the decisions of this crate's
//! algorithms; this is how to show it in its tests.
//! The example store of those docs passes the whole table, the Redis store of `ratelimit-redis`
//! too (in its own tests), and the in-memory store here its monotone scenarios.
//!
//! What the kit needs of the store:
//! - **Its clock, set by the test.** It must read its time from the [`ManualClock`] given to
//!   [`check_store`], which sets it before each check. A store that reads its backend's clock
//!   (the database's `now()`, Redis `TIME`) in production needs a setting that makes it read a
//!   given clock in tests, as the Redis store's `client_clock`. The times jump from one scenario
//!   to the next (Unix times of 2025, then times near 1970): a backend that expires state by
//!   its own real clock must expire it relative to the times given (a TTL of `fresh_at − now`,
//!   as the Redis store sets), not at an absolute instant.
//! - **No state for the keys.** Each check's key is the `prefix` given, the scenario's name,
//!   `": "` and the step's key: a fresh store, or a prefix no earlier run used.
//! - **Which scenarios.** Some scenarios go back in time, within themselves, and from one to the
//!   next: a store that counts each check at the time it is given (the example store, the Redis
//!   store on a client clock) runs them all on one store with [`check_store`]; a store that
//!   never counts at a time before one it counted at (the in-memory store) runs the
//!   [`monotone`](Scenario::monotone) ones, each on a fresh store, with [`check_scenario`]. So
//!   does a store that drops a key's state once it is fresh (at [`Limit::fresh_at`]) by the
//!   time its checks are given: where time goes back, the algorithms still count a state it
//!   dropped at a later time.
//!
//! Beside the table, [`check_limits_apart`] checks one key under several limits (a store keeps
//! a state per key and limit), and [`check_reset`] a store's [`Reset`](crate::Reset) (one key
//! under one limit forgotten, nothing else). What the kit cannot show: that a check is one
//! atomic step (it checks one at a time, so a store that reads, decides and writes in three
//! steps passes it; run checks of one key side by side in a test of your own, and count the
//! admissions, as this workspace's `concurrency.rs` and the Redis store's `race.rs` do).
//!
//! ```
//! use ratelimit_core::conformance::{check_scenario, scenarios};
//! use ratelimit_core::{ManualClock, MemoryStore};
//!
//! # fn block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     loop {
//! #         if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
//! #             return out;
//! #         }
//! #     }
//! # }
//! let clock = ManualClock::new();
//! let mut decisions = 0;
//! for scenario in scenarios().iter().filter(|s| s.monotone()) {
//!     // The memory store never counts at a time before one it counted at: a fresh one for
//!     // each scenario whose time never goes back.
//!     let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
//!     let report = block_on(check_scenario(&store, &clock, b"", scenario))
//!         .expect("the same decisions");
//!     decisions += report.decisions;
//! }
//! assert!(decisions > 7_000);
//! # Ok::<(), ratelimit_core::ConfigError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::{Algorithm, Decision, Limit, ManualClock, Quota, State, Store, Timestamp};

/// One check of a scenario: at `at`, `key` asks for `cost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The time of the check.
    pub at: Timestamp,
    /// The client's key (before the scenario's own prefix).
    pub key: Vec<u8>,
    /// The cost asked for: 0 (a peek) and costs that can never pass included.
    pub cost: u64,
}

/// A named sequence of checks against one limit.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What it tests, and of which algorithm.
    pub name: String,
    /// The limit every step is checked against.
    pub limit: Limit,
    /// The checks, in order.
    pub steps: Vec<Step>,
}

impl Scenario {
    /// `true` if its time never goes back, from one step to the next, whatever their keys. A
    /// store that never counts at a time before one it counted at (as
    /// [`MemoryStore`](crate::MemoryStore), whose keys share the latest time of their shard)
    /// makes the algorithms' decisions only in these, each run on a fresh store; the others test
    /// a store that counts each check at the time it is given.
    pub fn monotone(&self) -> bool {
        self.steps.windows(2).all(|w| w[0].at <= w[1].at)
    }
}

/// Unix time around 2025-11, in µs: large numbers, as in production.
const T0: u64 = 1_764_000_000_123_457;

/// The table: the seed scenarios (a 2/s bucket of 5), the fixed window's boundary experiment
/// (150 requests at 59.9 s and 150 at 60.1 s under 100 a minute), peeks and costs that can never
/// pass, several quotas all-or-nothing, time going back, and random traffic over eight quota
/// sets (up to three quotas, periods from 3 µs to a day, a quota at the exactness bound) from Unix
/// times and from the epoch, for every algorithm: 142 scenarios and 19,275 checks (a quota set
/// that an algorithm does not accept is left out: the sliding log's million per period, above
/// [`MAX_SLIDING_LOG_LIMIT`](crate::MAX_SLIDING_LOG_LIMIT)). The same on every call (a fixed
/// seed).
pub fn scenarios() -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut rng = Rng::new(0x5eed_2026);
    for alg in Algorithm::ALL {
        let mut push = |name: &str, quotas: Vec<Quota>, steps: Vec<Step>| {
            // A window algorithm takes no burst but the limit: its scenarios run without one.
            let quotas = quotas.into_iter().map(|q| {
                if alg.uses_burst() {
                    q
                } else {
                    q.with_burst(q.limit()).expect("the limit is a valid burst")
                }
            });
            if let Ok(limit) = Limit::new(alg, quotas) {
                out.push(Scenario {
                    name: format!("{alg} / {name}"),
                    limit,
                    steps,
                });
            }
        };
        let quota = |q: Result<Quota, crate::ConfigError>| q.expect("a valid quota");
        // Seed: capacity 5, refill 2/s: 7 immediate (5 allowed, 2 denied) and one more, then
        // after 1.1 s, 3 (2 allowed, 1 denied) and one more.
        let seed: Vec<Step> = at(T0, b"client", 1, 8)
            .chain(at(T0 + 1_100_000, b"client", 1, 4))
            .collect();
        push(
            "seed 2/s burst 5",
            vec![quota(quota(Quota::per_second(2)).with_burst(5))],
            seed,
        );
        // Boundary experiment: 100/minute, 150 at 59.9 s and 150 at 60.1 s (from the epoch).
        let boundary: Vec<Step> = at(59_900_000, b"client", 1, 150)
            .chain(at(60_100_000, b"client", 1, 150))
            .collect();
        push(
            "boundary 100/min",
            vec![quota(Quota::per_minute(100))],
            boundary,
        );
        // Peeks and costs that can never pass.
        let peeks: Vec<Step> = [0, 3, 0, 11, u64::MAX, 0, 10, 7, 0]
            .into_iter()
            .enumerate()
            .map(|(i, cost)| Step {
                at: Timestamp::from_micros(T0 + i as u64 * 50_000),
                key: b"k".to_vec(),
                cost,
            })
            .collect();
        push(
            "peek and exceeds 10/s",
            vec![quota(Quota::per_second(10))],
            peeks,
        );
        // Several quotas, all-or-nothing.
        let multi: Vec<Step> = at(T0, b"k", 1, 11)
            .chain(at(T0 + 2_000_000, b"k", 4, 1))
            .chain(at(T0 + 2_000_000, b"k", 0, 1))
            .chain(at(T0 + 2_000_000, b"k", 3, 1))
            .chain(at(T0 + 2_000_000, b"k", 1, 1))
            .chain(at(T0 + 2_000_000, b"k", 9, 1))
            .collect();
        push(
            "multi 5/s + 8/h",
            vec![quota(Quota::per_second(5)), quota(Quota::per_hour(8))],
            multi,
        );
        // Time going backwards grants nothing.
        let back: Vec<Step> = at(1_000_000_000, b"k", 1, 4)
            .chain(at(10_000_000, b"k", 1, 1))
            .chain(at(10_000_000, b"k", 0, 1))
            .chain(at(1_000_400_000, b"k", 1, 2))
            .collect();
        push("backwards 3/s", vec![quota(Quota::per_second(3))], back);
        // Random traffic, at Unix-like times and near the epoch.
        for (name, quotas) in random_quota_sets() {
            for (start, label) in [(T0, "unix"), (0, "epoch")] {
                let steps = random_steps(&mut rng, &quotas, start, 150, false);
                push(
                    &format!("random {name} from {label}"),
                    quotas.clone(),
                    steps,
                );
            }
            let steps = random_steps(&mut rng, &quotas, T0, 150, true);
            push(
                &format!("random {name}, clock going back"),
                quotas.clone(),
                steps,
            );
        }
    }
    out
}

/// `n` checks of `cost` for `key` at `t` µs.
fn at(t: u64, key: &[u8], cost: u64, n: usize) -> impl Iterator<Item = Step> + '_ {
    (0..n).map(move |_| Step {
        at: Timestamp::from_micros(t),
        key: key.to_vec(),
        cost,
    })
}

/// A small deterministic generator (xorshift64*), so the table is the same on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Quota sets used with random traffic.
fn random_quota_sets() -> Vec<(&'static str, Vec<Quota>)> {
    let q = |q: Result<Quota, crate::ConfigError>| q.expect("a valid quota");
    vec![
        ("3/s", vec![q(Quota::per_second(3))]),
        (
            "2/s burst 5",
            vec![q(q(Quota::per_second(2)).with_burst(5))],
        ),
        ("100/min", vec![q(Quota::per_minute(100))]),
        (
            "7 per 3us",
            vec![q(Quota::per_period(7, Duration::from_micros(3)))],
        ),
        (
            "7/day burst 50k",
            vec![q(q(Quota::per_day(7)).with_burst(50_000))],
        ),
        (
            "1M per 2^52/1M us (at the exactness bound)",
            vec![q(Quota::per_period(
                1_000_000,
                Duration::from_micros(4_503_599_627),
            ))],
        ),
        (
            "10/s burst 20 + 1000/day",
            vec![
                q(q(Quota::per_second(10)).with_burst(20)),
                q(Quota::per_day(1_000)),
            ],
        ),
        (
            "5/s + 8/h + 30/day",
            vec![
                q(Quota::per_second(5)),
                q(Quota::per_hour(8)),
                q(Quota::per_day(30)),
            ],
        ),
    ]
}

fn random_steps(
    rng: &mut Rng,
    quotas: &[Quota],
    start: u64,
    n: usize,
    backwards: bool,
) -> Vec<Step> {
    let keys: [&[u8]; 4] = [b"alice", b"{bob}", b"\x00\xffbinary", b"user:carol"];
    let max_period = quotas.iter().map(Quota::period_micros).max().unwrap_or(1);
    let min_period = quotas.iter().map(Quota::period_micros).min().unwrap_or(1);
    let max_cost = quotas
        .iter()
        .map(|q| q.burst().max(q.limit()))
        .max()
        .unwrap_or(1);
    let mut t = start;
    let mut steps = Vec::with_capacity(n);
    for _ in 0..n {
        match rng.below(10) {
            0..=3 => {}                                  // same instant
            4..=6 => t += rng.below(min_period / 2 + 2), // small step
            7 => t += rng.below(max_period + 2),         // up to a long period
            8 => t += rng.below(2 * min_period + 2),
            _ if backwards => t = t.saturating_sub(rng.below(min_period + 2)), // clock goes back
            _ => {}
        }
        let cost = match rng.below(20) {
            0 => 0,
            1 => max_cost + 1 + rng.below(3),
            2 => u64::MAX,
            3 => rng.below(max_cost + 1),
            _ => 1 + rng.below(3.min(max_cost)),
        };
        steps.push(Step {
            at: Timestamp::from_micros(t),
            key: keys[rng.below(keys.len() as u64) as usize].to_vec(),
            cost,
        });
    }
    steps
}

/// The decisions a store must make: the pure algorithms ([`Limit::check`] on the stored
/// states), with the stores' write rule (the new states are stored only when the limit allows a
/// cost above 0: a peek and a denial write nothing).
#[derive(Debug, Default)]
pub struct Reference {
    states: HashMap<Vec<u8>, Vec<State>>,
}

impl Reference {
    /// The stored states of `key`, if any.
    pub fn states(&self, key: &[u8]) -> Option<&[State]> {
        self.states.get(key).map(Vec::as_slice)
    }

    /// Checks `cost` for `key` against `limit` at `now`, storing the new states if allowed.
    pub fn check(&mut self, key: &[u8], limit: &Limit, cost: u64, now: Timestamp) -> Decision {
        if let Some(stored) = self.states.get_mut(key) {
            let mut states = stored.clone();
            let d = limit.check(&mut states, now, cost);
            if d.is_allowed() && cost > 0 {
                *stored = states;
            }
            return d;
        }
        let mut states = limit.fresh_states(now);
        let d = limit.check(&mut states, now, cost);
        if d.is_allowed() && cost > 0 {
            self.states.insert(key.to_vec(), states);
        }
        d
    }
}

/// What [`check_store`] compared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Scenarios run.
    pub scenarios: usize,
    /// Decisions compared, every field of each.
    pub decisions: usize,
    /// Of those, denials by more than one quota of their limit.
    pub several_violated: usize,
}

/// A decision of the store that differs from the algorithms'.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DecisionMismatch {
    /// The scenario's name.
    pub scenario: String,
    /// The step's index in the scenario.
    pub step: usize,
    /// The step itself (its key as given to the store, with the scenario's prefix).
    pub check: Step,
    /// The algorithms' decision.
    pub expected: Decision,
    /// The store's.
    pub got: Decision,
}

/// Why [`check_store`] stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum Mismatch<E> {
    /// The store's decision differs from the algorithms'.
    Decision(Box<DecisionMismatch>),
    /// The store failed.
    Store {
        /// The scenario's name.
        scenario: String,
        /// The step's index in the scenario.
        step: usize,
        /// The store's error.
        error: E,
    },
}

impl<E: fmt::Display> fmt::Display for Mismatch<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Decision(m) => write!(
                f,
                "{}: step {} (at {} µs, key {:?}, cost {}): the store decided {:?}, the \
                 algorithms {:?}",
                m.scenario,
                m.step,
                m.check.at.as_micros(),
                String::from_utf8_lossy(&m.check.key),
                m.check.cost,
                m.got,
                m.expected
            ),
            Mismatch::Store {
                scenario,
                step,
                error,
            } => write!(f, "{scenario}: step {step}: the store failed: {error}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Mismatch<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Mismatch::Store { error, .. } => Some(error),
            Mismatch::Decision(_) => None,
        }
    }
}

/// Runs `store` through `scenarios` ([`scenarios`] or a part of it), one after the other, with
/// [`check_scenario`]. Returns what it compared, or the first difference or failure.
pub async fn check_store<S: Store>(
    store: &S,
    clock: &ManualClock,
    prefix: &[u8],
    scenarios: &[Scenario],
) -> Result<Report, Mismatch<S::Error>> {
    let mut report = Report::default();
    for sc in scenarios {
        let one = check_scenario(store, clock, prefix, sc).await?;
        report.scenarios += one.scenarios;
        report.decisions += one.decisions;
        report.several_violated += one.several_violated;
    }
    Ok(report)
}

/// Runs `store` through one scenario, setting `clock` (the clock the store reads) to each step's
/// time before its check, and compares each decision with the algorithms' ([`Reference`]), every
/// field of it. The keys checked are `prefix`, the scenario's name, `": "` and each step's key.
/// Returns what it compared, or the first difference or failure.
pub async fn check_scenario<S: Store>(
    store: &S,
    clock: &ManualClock,
    prefix: &[u8],
    sc: &Scenario,
) -> Result<Report, Mismatch<S::Error>> {
    let mut report = Report::default();
    let mut kit = Kit::new(store, clock, prefix, &sc.name, &mut report);
    for step in &sc.steps {
        kit.check(&step.key, &sc.limit, step.cost, step.at).await?;
    }
    Ok(report)
}

/// Runs `store` through one key checked under several limits in turn, and compares each decision
/// with the algorithms': a store keeps a state per key *and limit* (`Limit::fingerprint` in its
/// key, as [Writing a store](Store#writing-a-store) says), so that a key's count under one limit
/// is not read under another (a client moved to another tier, two policies keying on the same
/// value). [`check_store`]'s scenarios each check their keys under one limit, and do not show it.
///
/// For every algorithm, at one instant then a second later (each algorithm ten seconds after the
/// one before: time never goes back), a client spends a strict limit (3 a minute) and is denied,
/// while under a looser one (1,000 an hour, and that with a second quota of 10 a second) its
/// checks go on being admitted from that limit's own count; then a peek under each. The keys are
/// `prefix`, `"limits apart: "`, the algorithm's name and `": client"`; the clock is set as by
/// [`check_scenario`].
pub async fn check_limits_apart<S: Store>(
    store: &S,
    clock: &ManualClock,
    prefix: &[u8],
) -> Result<Report, Mismatch<S::Error>> {
    let mut report = Report::default();
    for (i, alg) in Algorithm::ALL.into_iter().enumerate() {
        let limits = three_limits(alg);
        let name = format!("limits apart: {alg}");
        let mut kit = Kit::new(store, clock, prefix, &name, &mut report);
        // Time never goes back, from one algorithm to the next either: a store that never counts
        // at a time before one it counted at (the in-memory store) passes too.
        let start = T0 + i as u64 * 10_000_000;
        for second in [0, 1] {
            let at = Timestamp::from_micros(start + second * 1_000_000);
            for (l, cost) in [(0, 1), (1, 1), (0, 2), (2, 3), (0, 1), (1, 4), (2, 1)] {
                kit.check(b"client", &limits[l], cost, at).await?;
            }
            for limit in &limits {
                kit.check(b"client", limit, 0, at).await?;
            }
        }
    }
    Ok(report)
}

/// Runs `store`'s [`Reset`](crate::Reset) through the resets a store must make: for every
/// algorithm, a client that spent a limit (3 a minute) and was denied is reset under it and
/// admitted from a full quota again, while its count under another limit (1,000 an hour) and
/// another client's count under the same limit stand; a reset of a key with no state succeeds
/// and changes nothing. Each decision, before and after the resets, is compared with the
/// algorithms'. The keys are `prefix`, `"reset: "`, the algorithm's name and `": "` with
/// `client` or `other`; the clock is set as by [`check_scenario`], and time never goes back.
pub async fn check_reset<S: crate::Reset>(
    store: &S,
    clock: &ManualClock,
    prefix: &[u8],
) -> Result<Report, Mismatch<S::Error>> {
    let mut report = Report::default();
    for (i, alg) in Algorithm::ALL.into_iter().enumerate() {
        let [strict, loose, _] = three_limits(alg);
        let name = format!("reset: {alg}");
        let mut kit = Kit::new(store, clock, prefix, &name, &mut report);
        let at = Timestamp::from_micros(T0 + 100_000_000 + i as u64 * 10_000_000);
        for _ in 0..4 {
            kit.check(b"client", &strict, 1, at).await?;
        }
        kit.check(b"other", &strict, 2, at).await?;
        kit.check(b"client", &loose, 5, at).await?;
        kit.reset(b"client", &strict).await?;
        kit.reset(b"nobody", &strict).await?;
        for _ in 0..4 {
            kit.check(b"client", &strict, 1, at).await?;
        }
        for (key, limit) in [(&b"other"[..], &strict), (&b"client"[..], &loose)] {
            kit.check(key, limit, 0, at).await?;
        }
        kit.check(b"nobody", &strict, 0, at).await?;
    }
    Ok(report)
}

/// A strict limit, a looser one, and the looser one with a second quota, of `alg`.
fn three_limits(alg: Algorithm) -> [Limit; 3] {
    let quota = |n, per_secs| {
        Quota::per_period(n, Duration::from_secs(per_secs))
            .unwrap_or_else(|_| unreachable!("a valid quota"))
    };
    [
        Limit::single(alg, quota(3, 60)),
        Limit::single(alg, quota(1_000, 3_600)),
        Limit::new(alg, [quota(1_000, 3_600), quota(10, 1)]),
    ]
    .map(|l| l.unwrap_or_else(|_| unreachable!("limits every algorithm accepts")))
}

/// One named run of the kit's checks (a scenario of the table, or the checks beyond it): each
/// check of the store compared with the algorithms' on a state per key and limit, counted in
/// `report`.
struct Kit<'a, S> {
    store: &'a S,
    clock: &'a ManualClock,
    prefix: &'a [u8],
    name: &'a str,
    reference: Reference,
    step: usize,
    report: &'a mut Report,
}

impl<'a, S: Store> Kit<'a, S> {
    fn new(
        store: &'a S,
        clock: &'a ManualClock,
        prefix: &'a [u8],
        name: &'a str,
        report: &'a mut Report,
    ) -> Self {
        report.scenarios += 1;
        Kit {
            store,
            clock,
            prefix,
            name,
            reference: Reference::default(),
            step: 0,
            report,
        }
    }

    /// The store's key for `key`, and the reference's (with the limit's fingerprint).
    fn keys(&self, key: &[u8], limit: &Limit) -> (Vec<u8>, Vec<u8>) {
        let mut full = self.prefix.to_vec();
        full.extend_from_slice(self.name.as_bytes());
        full.extend_from_slice(b": ");
        full.extend_from_slice(key);
        let mut apart = full.clone();
        apart.extend_from_slice(&limit.fingerprint().to_le_bytes());
        (full, apart)
    }

    async fn check(
        &mut self,
        key: &[u8],
        limit: &Limit,
        cost: u64,
        at: Timestamp,
    ) -> Result<(), Mismatch<S::Error>> {
        let (full, apart) = self.keys(key, limit);
        let step = self.step;
        self.step += 1;
        let expected = self.reference.check(&apart, limit, cost, at);
        self.clock.set(at);
        let got = self
            .store
            .check(&full, limit, cost)
            .await
            .map_err(|error| Mismatch::Store {
                scenario: self.name.to_owned(),
                step,
                error,
            })?;
        if got != expected {
            return Err(Mismatch::Decision(Box::new(DecisionMismatch {
                scenario: format!(
                    "{} (limit of {} quota(s), fingerprint {:x})",
                    self.name,
                    limit.quotas().len(),
                    limit.fingerprint()
                ),
                step,
                check: Step {
                    at,
                    key: full,
                    cost,
                },
                expected,
                got,
            })));
        }
        self.report.decisions += 1;
        if expected.violated_quotas().len() > 1 {
            self.report.several_violated += 1;
        }
        Ok(())
    }
}

impl<S: crate::Reset> Kit<'_, S> {
    async fn reset(&mut self, key: &[u8], limit: &Limit) -> Result<(), Mismatch<S::Error>> {
        let (full, apart) = self.keys(key, limit);
        let step = self.step;
        self.step += 1;
        self.reference.states.remove(&apart);
        self.store
            .reset(&full, limit)
            .await
            .map_err(|error| Mismatch::Store {
                scenario: self.name.to_owned(),
                step,
                error,
            })
    }
}
