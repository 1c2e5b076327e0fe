//! Run with: cargo run --release -p ratelimit-redis --example round_trips
//!
//! Measures Redis calls per 1,000 decisions, and admitted against the exact count, for three
//! traffic shapes with each round-trip saving mode off and on. Starts its own redis-server (the
//! test harness's) on a free loopback port; time is simulated (a manual client clock), so every
//! figure is reproducible. The exact count is a `MemoryStore` replay of the same checks at the
//! same instants; Redis calls are read from the server's own `INFO commandstats`.

use std::time::Duration;

use futures::future::join_all;
use ratelimit_core::{
    Algorithm, DenialCache, Leasing, Limit, ManualClock, MemoryStore, Quota, Store, Timestamp,
};
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::RedisServer;

/// Unix time around 2025-11, in µs.
const T0: u64 = 1_764_000_000_000_000;

struct Scenario {
    name: &'static str,
    limit: Limit,
    ticks: usize,
    tick: Duration,
    /// The keys checked (concurrently, cost 1 each) at tick `i`.
    keys: fn(usize) -> Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    DenialCache,
    Coalescing,
    Leasing,
    All,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Off,
        Mode::DenialCache,
        Mode::Coalescing,
        Mode::Leasing,
        Mode::All,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::DenialCache => "denial cache",
            Mode::Coalescing => "coalescing (200 µs window)",
            Mode::Leasing => "leasing (adaptive, ≤ 64)",
            Mode::All => "all three",
        }
    }
}

fn scenarios() -> Vec<Scenario> {
    let q = |limit: u64, period: Duration| Quota::per_period(limit, period).unwrap();
    vec![
        Scenario {
            name: "(a) abusive key, 100x its limit: 10/s asked 1,000/s, token bucket",
            limit: Limit::single(Algorithm::TokenBucket, q(10, Duration::from_secs(1))).unwrap(),
            ticks: 10_000,
            tick: Duration::from_millis(1),
            keys: |_| vec![b"abuser".to_vec()],
        },
        Scenario {
            name: "(a') abusive key, 100x its limit: 10/s asked 1,000/s, fixed window",
            limit: Limit::single(Algorithm::FixedWindow, q(10, Duration::from_secs(1))).unwrap(),
            ticks: 10_000,
            tick: Duration::from_millis(1),
            keys: |_| vec![b"abuser".to_vec()],
        },
        Scenario {
            name: "(b) hot key at its limit: 1,000/s asked by 20 callers every 20 ms",
            limit: Limit::single(Algorithm::TokenBucket, q(1_000, Duration::from_secs(1))).unwrap(),
            ticks: 500,
            tick: Duration::from_millis(20),
            keys: |_| vec![b"hot".to_vec(); 20],
        },
        Scenario {
            name: "(b') hot key, 1.25x its limit: 1,000/s asked by 20 callers every 16 ms",
            limit: Limit::single(Algorithm::TokenBucket, q(1_000, Duration::from_secs(1))).unwrap(),
            ticks: 625,
            tick: Duration::from_millis(16),
            keys: |_| vec![b"hot".to_vec(); 20],
        },
        Scenario {
            name: "(c) 100,000 users at an even rate: 10/min each, one check per user per 5 s",
            limit: Limit::single(Algorithm::TokenBucket, q(10, Duration::from_secs(60))).unwrap(),
            ticks: 200,
            tick: Duration::from_millis(50),
            keys: |i| {
                (0..1_000)
                    .map(|j| format!("user:{}", (i * 1_000 + j) % 100_000).into_bytes())
                    .collect()
            },
        },
    ]
}

/// Runs the scenario through `store`; returns (decisions, admitted).
async fn run<S: Store>(store: &S, sc: &Scenario, clock: &ManualClock) -> (u64, u64)
where
    S::Error: std::fmt::Debug,
{
    clock.set(Timestamp::from_micros(T0));
    let (mut decisions, mut admitted) = (0, 0);
    for i in 0..sc.ticks {
        let keys = (sc.keys)(i);
        let checks = keys.iter().map(|k| store.check(k, &sc.limit, 1));
        for r in join_all(checks).await {
            decisions += 1;
            admitted += u64::from(r.expect("check failed").is_allowed());
        }
        clock.advance(sc.tick);
    }
    (decisions, admitted)
}

/// The exact admitted count: the same checks, at the same instants, on a `MemoryStore`.
fn exact(sc: &Scenario) -> u64 {
    let memory = MemoryStore::builder().max_keys(1 << 20).build().unwrap();
    let mut now = T0;
    let mut admitted = 0;
    for i in 0..sc.ticks {
        for k in (sc.keys)(i) {
            admitted += u64::from(
                memory
                    .check_at(&k, &sc.limit, 1, Timestamp::from_micros(now))
                    .is_allowed(),
            );
        }
        now += sc.tick.as_micros() as u64;
    }
    admitted
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = RedisServer::start();
    println!(
        "| scenario | mode | decisions | Redis calls | calls per 1,000 | admitted | exact | \
         over-admission | shortfall |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (n, sc) in scenarios().iter().enumerate() {
        let exact = exact(sc);
        for mode in Mode::ALL {
            let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
            let redis = RedisStore::builder(server.url())
                .prefix(format!("rt{n}-{mode:?}"))
                .client_clock(clock.clone())
                .expiry_slack(Duration::from_secs(3_600))
                .response_timeout(Duration::from_secs(5))
                .build()
                .await
                .expect("connect to the harness's redis-server");
            let window = Duration::from_micros(200);
            assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
            let (decisions, admitted) = match mode {
                Mode::Off => run(&redis, sc, &clock).await,
                Mode::DenialCache => run(&DenialCache::new(redis, clock.clone()), sc, &clock).await,
                Mode::Coalescing => {
                    run(&Coalescing::new(redis).batch_window(window), sc, &clock).await
                }
                Mode::Leasing => run(&Leasing::new(redis, clock.clone()), sc, &clock).await,
                Mode::All => {
                    let stack = DenialCache::new(
                        Leasing::new(Coalescing::new(redis).batch_window(window), clock.clone()),
                        clock.clone(),
                    );
                    run(&stack, sc, &clock).await
                }
            };
            let calls = server.script_calls();
            let per_1000 = calls as f64 * 1_000.0 / decisions as f64;
            let over = admitted.saturating_sub(exact);
            let short = exact.saturating_sub(admitted);
            let name = if mode == Mode::Off { sc.name } else { "" };
            println!(
                "| {name} | {} | {decisions} | {calls} | {per_1000:.1} | {admitted} | {exact} | \
                 {over} | {short} |",
                mode.name()
            );
        }
    }
}
