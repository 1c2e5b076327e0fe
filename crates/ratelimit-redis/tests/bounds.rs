//! Random limits anywhere in what `Quota` and `Limit` accept (limits, bursts and periods up to
//! 2^52, prime periods, up to three quotas), random costs (0, 1, the burst and around it, up to
//! `u64::MAX`) and random times from the epoch to the end of the algorithms' time (2^52 µs):
//! the Lua scripts, whose numbers are doubles, decide exactly as the Rust algorithms, field by
//! field, on a real `redis-server`. The fixed conformance table has eight quota sets; this is the
//! rest of the space, at its edges.
//!
//! 256 cases by default; `PROPTEST_CASES=20000 cargo test -p ratelimit-redis --test bounds` for a
//! longer search. Failing cases are saved in `bounds.proptest-regressions` and replayed first.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::{manual, unique_prefix};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota, Timestamp};
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::RedisServer;

/// The end of the algorithms' time (`ratelimit_core`'s `MAX_TIME`), which a client clock may
/// not pass.
const END: u64 = 1 << 52;

/// A quota anywhere in what `Quota` accepts, often at its edges.
fn any_quota() -> impl Strategy<Value = Quota> {
    let big = prop_oneof![
        1u64..=10,
        1u64..=1_000,
        1u64..=1 << 20,
        (1u64 << 50)..=1 << 52,
        Just(1u64 << 52),
    ];
    let period = prop_oneof![
        1u64..=3,
        1u64..=10_000_000,
        1u64..=1 << 52,
        Just(1_000_000u64),
        Just(86_400_000_000u64),
        Just(95_000_011u64),
        Just(4_503_599_627_370_449u64), // the largest prime below 2^52
        Just(1u64 << 52),
    ];
    (big.clone(), period, big).prop_filter_map("a quota", |(limit, period_us, burst)| {
        Quota::per_period(limit, Duration::from_micros(period_us))
            .ok()?
            .with_burst(burst)
            .ok()
    })
}

/// A limit of a random algorithm over one to three quotas (window algorithms take their
/// quotas' limits as bursts), if `Limit::new` accepts it.
fn any_limit() -> impl Strategy<Value = Limit> {
    (0usize..5, prop::collection::vec(any_quota(), 1..=3)).prop_filter_map(
        "a limit Limit::new accepts",
        |(alg, quotas)| {
            let algorithm = Algorithm::ALL[alg];
            let quotas: Vec<Quota> = quotas
                .into_iter()
                .map(|q| {
                    if algorithm.uses_burst() {
                        Some(q)
                    } else {
                        q.with_burst(q.limit()).ok()
                    }
                })
                .collect::<Option<_>>()?;
            Limit::new(algorithm, quotas).ok()
        },
    )
}

/// A step's move in time, its key (one of three) and its cost, as choices resolved against the
/// limit by [`resolve`].
#[derive(Debug, Clone)]
struct Move {
    dt: Dt,
    key: u8,
    cost: Cost,
}

#[derive(Debug, Clone)]
enum Dt {
    Same,
    Micros(u64),
    /// A share (in 1/1000ths) of one of the quotas' periods.
    PeriodShare(usize, u64),
    Back(u64),
}

#[derive(Debug, Clone)]
enum Cost {
    Exact(u64),
    /// Near one quota's burst (burst - 2 ..= burst + 2).
    NearBurst(usize, i8),
    /// A share (in 1/1000ths) of one quota's burst.
    BurstShare(usize, u64),
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    let dt = prop_oneof![
        3 => Just(Dt::Same),
        3 => (0u64..=3).prop_map(Dt::Micros),
        2 => (0usize..3, 0u64..=2_000).prop_map(|(q, s)| Dt::PeriodShare(q, s)),
        1 => (0u64..=1 << 51).prop_map(Dt::Micros),
        1 => (0u64..=1_000_000).prop_map(Dt::Back),
    ];
    let cost = prop_oneof![
        4 => Just(Cost::Exact(1)),
        1 => Just(Cost::Exact(0)),
        1 => Just(Cost::Exact(u64::MAX)),
        1 => prop_oneof![Just((1u64 << 52) + 1), Just(1u64 << 52), Just((1u64 << 53) + 1)]
            .prop_map(Cost::Exact),
        2 => (0usize..3, -2i8..=2).prop_map(|(q, d)| Cost::NearBurst(q, d)),
        2 => (0usize..3, 0u64..=1_000).prop_map(|(q, s)| Cost::BurstShare(q, s)),
    ];
    prop::collection::vec(
        (dt, 0u8..3, cost).prop_map(|(dt, key, cost)| Move { dt, key, cost }),
        1..40,
    )
}

/// Where a scenario's time starts: the epoch, production Unix times, or near the end of time.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..=10,
        Just(1_764_000_000_123_457u64),
        (END - 1_000_000)..END,
        0u64..END,
    ]
}

/// The steps `(at, key, cost)` that `moves` make against `limit` from `start`, times kept below
/// the end of time.
fn resolve(limit: &Limit, start: u64, moves: &[Move]) -> Vec<(u64, u8, u64)> {
    let quotas = limit.quotas();
    let quota = |i: usize| &quotas[i % quotas.len()];
    let mut t = start;
    moves
        .iter()
        .map(|m| {
            t = match m.dt {
                Dt::Same => t,
                Dt::Micros(d) => t.saturating_add(d),
                Dt::PeriodShare(q, s) => {
                    let p = u128::from(quota(q).period_micros());
                    t.saturating_add(u64::try_from(p * u128::from(s) / 1000).unwrap_or(u64::MAX))
                }
                Dt::Back(d) => t.saturating_sub(d),
            }
            .min(END - 1);
            let cost = match m.cost {
                Cost::Exact(c) => c,
                Cost::NearBurst(q, d) => quota(q).burst().saturating_add_signed(i64::from(d)),
                Cost::BurstShare(q, s) => {
                    u64::try_from(u128::from(quota(q).burst()) * u128::from(s) / 1000)
                        .unwrap_or(u64::MAX)
                }
            };
            (t, m.key, cost)
        })
        .collect()
}

/// A server, a runtime to wait on it, and a store on `clock` under a prefix of its own.
struct Setup {
    /// Bound by the tests for as long as they run: its drop stops the server.
    _server: RedisServer,
    rt: tokio::runtime::Runtime,
    clock: ManualClock,
    store: RedisStore,
}

fn setup(name: &str) -> Setup {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let store = rt
        .block_on(
            manual(RedisStore::builder(server.url()), &clock)
                .prefix(unique_prefix(name))
                .build(),
        )
        .unwrap();
    Setup {
        _server: server,
        rt,
        clock,
        store,
    }
}

/// The runner: `PROPTEST_CASES` cases (256 by default), failures saved beside this file, and
/// limits that `Limit::new` refuses drawn again.
fn runner() -> TestRunner {
    TestRunner::new(Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        max_local_rejects: u32::MAX,
        ..Config::default()
    })
}

#[test]
fn redis_decides_as_the_algorithms_anywhere_in_the_limits_accepted() {
    let Setup {
        _server,
        rt,
        clock,
        store,
    } = setup("bounds");
    let mut runner = runner();
    let (scenario, checks, denied) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    let batched = Cell::new(0u64);
    let result = runner.run(&(any_limit(), start(), moves()), |(limit, start, moves)| {
        scenario.set(scenario.get() + 1);
        let steps = resolve(&limit, start, &moves);
        let memory = MemoryStore::builder().build().unwrap();
        let mut reference = common::Reference::default();
        let monotone = steps.windows(2).all(|w| w[0].0 <= w[1].0);
        for (i, &(at, k, cost)) in steps.iter().enumerate() {
            // A key of its own per scenario: the store's prefix is shared by all of them.
            let key = format!("s{}-k{k}", scenario.get()).into_bytes();
            let now = Timestamp::from_micros(at);
            let expected = reference.check(&key, &limit, cost, now);
            if monotone {
                let got = memory.check_at(&key, &limit, cost, now);
                prop_assert_eq!(&got, &expected, "step {}: MemoryStore", i);
            }
            clock.set(now);
            let got = rt
                .block_on(store.check(&key, &limit, cost))
                .map_err(|e| TestCaseError::fail(format!("step {i}: {e}")))?;
            prop_assert_eq!(
                &got,
                &expected,
                "step {} (t={}, key {}, cost {}): RedisStore",
                i,
                at,
                k,
                cost
            );
            checks.set(checks.get() + 1);
            denied.set(denied.get() + u64::from(!got.is_allowed()));
        }
        // The same steps again under other keys, each run of checks of one key at one
        // instant sent as one multi-cost call (what `Coalescing` sends).
        let mut reference = common::Reference::default();
        let mut i = 0;
        while i < steps.len() {
            let (at, k, _) = steps[i];
            let mut j = i + 1;
            while j < steps.len() && steps[j].0 == at && steps[j].1 == k {
                j += 1;
            }
            let key = format!("m{}-k{k}", scenario.get()).into_bytes();
            let now = Timestamp::from_micros(at);
            let costs: Vec<u64> = steps[i..j].iter().map(|s| s.2).collect();
            let expected: Vec<_> = costs
                .iter()
                .map(|&c| reference.check(&key, &limit, c, now))
                .collect();
            clock.set(now);
            let got = rt
                .block_on(store.check_many(&key, &limit, &costs))
                .map_err(|e| TestCaseError::fail(format!("steps {i}..{j}: {e}")))?;
            prop_assert_eq!(
                got,
                expected,
                "steps {}..{} (t={}, costs {:?}): check_many",
                i,
                j,
                at,
                &costs
            );
            batched.set(batched.get() + u64::from(j - i > 1) * (j - i) as u64);
            i = j;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (scenario, checks, denied) = (scenario.get(), checks.get(), denied.get());
    let batched = batched.get();
    println!(
        "{scenario} scenarios, {checks} checks, {denied} denied, {batched} in multi-cost calls"
    );
    // The strategy reaches both answers, and multi-cost calls of several checks.
    assert!(
        checks > 1_000 && denied > 100,
        "{checks} checks, {denied} denied"
    );
    assert!(batched > 300, "{batched} checks in multi-cost calls");
}

/// Concurrent checks through `Coalescing` (a few keys, random costs, rounds at instants moved by
/// fractions of a period) under the same random limits: a key's checks that queue behind its call
/// in flight ride in multi-cost calls, and each check's decision is, field by field, the one the
/// algorithms make for the checks taken one after another in the order they were made (the
/// order they queue in).
#[test]
fn coalesced_checks_decide_as_the_same_checks_one_after_another() {
    let Setup {
        _server,
        rt,
        clock,
        store,
    } = setup("bounds-coalesce");
    let store = Coalescing::new(store).max_batch(8);
    let mut runner = runner();
    let scenario = Cell::new(0u64);
    let rounds = prop::collection::vec(
        (
            0u64..=1_500,
            prop::collection::vec((0u8..3, 0u64..=1_200, any::<bool>()), 1..40),
        ),
        1..6,
    );
    let result = runner.run(&(any_limit(), start(), rounds), |(limit, start, rounds)| {
        scenario.set(scenario.get() + 1);
        let quota = &limit.quotas()[0];
        let share = |of: u64, s: u64| {
            u64::try_from(u128::from(of) * u128::from(s) / 1_000).unwrap_or(u64::MAX)
        };
        let mut reference = common::Reference::default();
        let mut now = start;
        for (r, (step, checks)) in rounds.iter().enumerate() {
            now = now
                .saturating_add(share(quota.period_micros(), *step))
                .min(END - 1);
            let at = Timestamp::from_micros(now);
            clock.set(at);
            let checks: Vec<(Vec<u8>, u64)> = checks
                .iter()
                .map(|&(k, c, one)| {
                    let cost = if one { 1 } else { share(quota.burst(), c) };
                    (format!("c{}-k{k}", scenario.get()).into_bytes(), cost)
                })
                .collect();
            let expected: Vec<_> = checks
                .iter()
                .map(|(key, cost)| reference.check(key, &limit, *cost, at))
                .collect();
            // Made inside the runtime, as a gateway's checks are (made outside one, a check is
            // sent on its own).
            let got = rt.block_on(async {
                futures::future::join_all(
                    checks
                        .iter()
                        .map(|(key, cost)| store.check(key, &limit, *cost)),
                )
                .await
            });
            for (i, (got, want)) in got.into_iter().zip(expected).enumerate() {
                let got =
                    got.map_err(|e| TestCaseError::fail(format!("round {r} check {i}: {e}")))?;
                prop_assert_eq!(got, want, "round {} check {} ({:?})", r, i, &checks[i]);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let stats = store.stats();
    println!("{} scenarios, {stats:?}", scenario.get());
    // Checks did queue and ride together.
    assert!(stats.store_calls < stats.checks / 2, "{stats:?}");
    assert!(stats.largest_batch > 1, "{stats:?}");
}
