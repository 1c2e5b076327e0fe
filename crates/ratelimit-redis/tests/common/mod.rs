//! Shared by the integration tests: the conformance table and helpers.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{
    Algorithm, Decision, Limit, ManualClock, MemoryStore, Quota, State, Timestamp,
};
use ratelimit_redis::{RedisStore, RedisStoreBuilder};

/// A prefix no other test of this process uses.
pub fn unique_prefix(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("t{}-{name}", N.fetch_add(1, Ordering::Relaxed))
}

/// Client-clock settings for deterministic tests: the manual clock does not follow real time, so
/// keys get an hour of slack before Redis expires them.
pub fn manual(builder: RedisStoreBuilder, clock: &ManualClock) -> RedisStoreBuilder {
    builder
        .client_clock(clock.clone())
        .expiry_slack(Duration::from_secs(3_600))
        .response_timeout(Duration::from_secs(5))
}

/// One check of a scenario: at time `t` (µs), `key` asks for `cost`.
#[derive(Debug, Clone)]
pub struct Step {
    pub t: u64,
    pub key: Vec<u8>,
    pub cost: u64,
}

/// A named sequence of checks against one limit.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub limit: Limit,
    pub steps: Vec<Step>,
}

fn at(t: u64, key: &[u8], cost: u64, n: usize) -> impl Iterator<Item = Step> + '_ {
    (0..n).map(move |_| Step {
        t,
        key: key.to_vec(),
        cost,
    })
}

/// A small deterministic generator (xorshift64*), so the table is the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Unix time around 2025-11, in µs: large numbers, as in production.
pub const T0: u64 = 1_764_000_000_123_457;

/// Quota sets used with random traffic.
fn random_quota_sets() -> Vec<(&'static str, Vec<Quota>)> {
    vec![
        ("3/s", vec![Quota::per_second(3).unwrap()]),
        (
            "2/s burst 5",
            vec![Quota::per_second(2).unwrap().with_burst(5).unwrap()],
        ),
        ("100/min", vec![Quota::per_minute(100).unwrap()]),
        (
            "7 per 3us",
            vec![Quota::per_period(7, Duration::from_micros(3)).unwrap()],
        ),
        (
            "7/day burst 50k",
            vec![Quota::per_day(7).unwrap().with_burst(50_000).unwrap()],
        ),
        (
            "1M per 2^52/1M us (at the exactness bound)",
            vec![Quota::per_period(1_000_000, Duration::from_micros(4_503_599_627)).unwrap()],
        ),
        (
            "10/s burst 20 + 1000/day",
            vec![
                Quota::per_second(10).unwrap().with_burst(20).unwrap(),
                Quota::per_day(1_000).unwrap(),
            ],
        ),
        (
            "5/s + 8/h + 30/day",
            vec![
                Quota::per_second(5).unwrap(),
                Quota::per_hour(8).unwrap(),
                Quota::per_day(30).unwrap(),
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
    let max_period = quotas.iter().map(Quota::period_micros).max().unwrap();
    let min_period = quotas.iter().map(Quota::period_micros).min().unwrap();
    let max_cost = quotas
        .iter()
        .map(|q| q.burst().max(q.limit()))
        .max()
        .unwrap();
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
            t,
            key: keys[rng.below(keys.len() as u64) as usize].to_vec(),
            cost,
        });
    }
    steps
}

/// The conformance table: seed scenarios, boundary experiment, peeks, oversized costs, multi-quota
/// limits and random traffic, for every algorithm.
pub fn table() -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut rng = Rng::new(0x5eed_2026);
    for alg in Algorithm::ALL {
        let mut push = |name: &str, quotas: Vec<Quota>, steps: Vec<Step>| {
            // A window algorithm takes no burst but the limit: its scenarios run without one.
            let quotas = quotas.into_iter().map(|q| {
                if alg.uses_burst() {
                    q
                } else {
                    q.with_burst(q.limit()).unwrap()
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
        // Seed: capacity 5, refill 2/s: 7 immediate (5 allowed, 2 denied) and one more, then
        // after 1.1 s, 3 (2 allowed, 1 denied) and one more.
        let seed: Vec<Step> = at(T0, b"client", 1, 8)
            .chain(at(T0 + 1_100_000, b"client", 1, 4))
            .collect();
        push(
            "seed 2/s burst 5",
            vec![Quota::per_second(2).unwrap().with_burst(5).unwrap()],
            seed,
        );
        // Boundary experiment: 100/minute, 150 at 59.9 s and 150 at 60.1 s (from the epoch).
        let boundary: Vec<Step> = at(59_900_000, b"client", 1, 150)
            .chain(at(60_100_000, b"client", 1, 150))
            .collect();
        push(
            "boundary 100/min",
            vec![Quota::per_minute(100).unwrap()],
            boundary,
        );
        // Peeks and costs that can never pass.
        let peeks: Vec<Step> = [0, 3, 0, 11, u64::MAX, 0, 10, 7, 0]
            .into_iter()
            .enumerate()
            .map(|(i, cost)| Step {
                t: T0 + i as u64 * 50_000,
                key: b"k".to_vec(),
                cost,
            })
            .collect();
        push(
            "peek and exceeds 10/s",
            vec![Quota::per_second(10).unwrap()],
            peeks,
        );
        // Multi-quota all-or-nothing, as in ratelimit-core's seed tests.
        let multi: Vec<Step> = at(T0, b"k", 1, 11)
            .chain(at(T0 + 2_000_000, b"k", 4, 1))
            .chain(at(T0 + 2_000_000, b"k", 0, 1))
            .chain(at(T0 + 2_000_000, b"k", 3, 1))
            .chain(at(T0 + 2_000_000, b"k", 1, 1))
            .chain(at(T0 + 2_000_000, b"k", 9, 1))
            .collect();
        push(
            "multi 5/s + 8/h",
            vec![Quota::per_second(5).unwrap(), Quota::per_hour(8).unwrap()],
            multi,
        );
        // Time going backwards grants nothing.
        let back: Vec<Step> = at(1_000_000_000, b"k", 1, 4)
            .chain(at(10_000_000, b"k", 1, 1))
            .chain(at(10_000_000, b"k", 0, 1))
            .chain(at(1_000_400_000, b"k", 1, 2))
            .collect();
        push("backwards 3/s", vec![Quota::per_second(3).unwrap()], back);
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

impl Scenario {
    /// `true` if no key's time ever goes backwards.
    pub fn monotone(&self) -> bool {
        let mut last: HashMap<&[u8], u64> = HashMap::new();
        self.steps.iter().all(|s| {
            let prev = last.insert(&s.key, s.t).unwrap_or(0);
            s.t >= prev
        })
    }
}

/// The pure algorithms of ratelimit-core (`Limit::check` on stored states), with the stores' write
/// rule: new states are stored only when the limit allows a cost > 0 (a peek writes nothing).
#[derive(Default)]
pub struct Reference {
    states: HashMap<Vec<u8>, Vec<State>>,
}

impl Reference {
    /// The stored states of `key`, if any.
    pub fn states(&self, key: &[u8]) -> Option<&[State]> {
        self.states.get(key).map(Vec::as_slice)
    }

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

/// What one conformance run compared.
#[derive(Debug, Default, Clone, Copy)]
pub struct Compared {
    /// Decisions compared with the pure algorithms.
    pub with_algorithms: usize,
    /// Decisions compared with `MemoryStore` too (scenarios whose time never goes backwards).
    pub with_memory_store: usize,
    /// Of the decisions compared, denials by more than one quota of their limit.
    pub several_violated: usize,
}

/// Runs every scenario through the pure algorithms, a fresh `MemoryStore` (when time never goes
/// backwards) and `redis` (client-clock mode, on `clock`), asserting identical decisions.
pub async fn run_conformance(
    redis: &RedisStore,
    clock: &ManualClock,
    table: &[Scenario],
) -> Compared {
    let mut compared = Compared::default();
    for (n, sc) in table.iter().enumerate() {
        let memory = MemoryStore::builder().build().unwrap();
        let mut reference = Reference::default();
        let with_memory = sc.monotone();
        // A distinct user-key namespace per scenario: the prefix is shared by the store.
        let tag = format!("s{n}-");
        for (i, step) in sc.steps.iter().enumerate() {
            let mut key = tag.clone().into_bytes();
            key.extend_from_slice(&step.key);
            let now = Timestamp::from_micros(step.t);
            let expected = reference.check(&key, &sc.limit, step.cost, now);
            if with_memory {
                let from_memory = memory.check_at(&key, &sc.limit, step.cost, now);
                assert_eq!(
                    from_memory, expected,
                    "{}: step {i}: MemoryStore != algorithms",
                    sc.name
                );
                compared.with_memory_store += 1;
            }
            clock.set(Timestamp::from_micros(step.t));
            let got = redis
                .check(&key, &sc.limit, step.cost)
                .await
                .unwrap_or_else(|e| panic!("{}: step {i}: {e}", sc.name));
            assert_eq!(
                got, expected,
                "{}: step {i} (t={} key={:?} cost={}): RedisStore != algorithms",
                sc.name, step.t, step.key, step.cost
            );
            compared.with_algorithms += 1;
            if expected.violated_quotas().len() > 1 {
                compared.several_violated += 1;
            }
        }
    }
    compared
}

/// Reads a manual clock in microseconds.
pub trait NowMicros {
    fn now_micros(&self) -> u64;
}

impl NowMicros for ManualClock {
    fn now_micros(&self) -> u64 {
        ratelimit_core::Clock::now(self).as_micros()
    }
}

/// `n` checks of the key `hot` at once, each in a task of its own, through `coalescing`: the
/// decisions, in the order the tasks were made.
pub async fn concurrent_hot_checks<S: ratelimit_redis::ScriptStore>(
    coalescing: &ratelimit_redis::Coalescing<S>,
    limit: &Limit,
    n: usize,
) -> Vec<Decision> {
    let tasks = (0..n).map(|_| {
        let (c, limit) = (coalescing.clone(), limit.clone());
        tokio::spawn(async move { c.check(b"hot", &limit, 1).await.unwrap() })
    });
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// Waits (up to 10 s) until `coalescing` has sent `calls` script calls: a call counts once its
/// batch has left the key's queue, so a check made after this queues behind it. (A sleep would
/// not say so on a loaded machine, where the key's task may not have run yet.)
pub async fn until_sent<S>(coalescing: &ratelimit_redis::Coalescing<S>, calls: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while coalescing.stats().store_calls < calls {
        assert!(
            std::time::Instant::now() < deadline,
            "{calls} calls not sent: {:?}",
            coalescing.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The admitted decisions' `remaining` counts are 0 to `n - 1`, each once: no two admissions
/// took the same unit, and `n` were admitted.
pub fn assert_each_remaining_once(decisions: &[Decision], n: u64, context: &str) {
    let mut remaining: Vec<_> = decisions
        .iter()
        .filter(|d| d.is_allowed())
        .map(|d| d.remaining())
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..n).collect::<Vec<_>>(), "{context}");
}

/// A runtime of two worker threads, for the tests that run checks on more than one runtime.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
