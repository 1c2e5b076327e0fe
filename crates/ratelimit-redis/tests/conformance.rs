//! The same sequences through `MemoryStore` and `RedisStore` (client-clock mode) give identical
//! decisions, field by field, for every algorithm.

mod common;

use std::time::Duration;

use common::{T0, manual, run_conformance, table, unique_prefix};
use ratelimit_core::{Algorithm, Limit, ManualClock, Outcome, Quota, Timestamp};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_decides_exactly_as_memory_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = manual(RedisStore::builder(server.url()), &clock)
        .prefix(unique_prefix("conf"))
        .build()
        .await
        .unwrap();
    let table = table();
    let compared = run_conformance(&store, &clock, &table).await;
    println!("{} scenarios, {compared:?}", table.len());
    for alg in Algorithm::ALL {
        assert!(
            table
                .iter()
                .any(|s| s.limit.algorithm() == alg && s.limit.quotas().len() > 1),
            "{alg} has a multi-quota scenario"
        );
    }
    assert!(compared.with_algorithms > 10_000, "{compared:?}");
    assert!(compared.with_memory_store > 7_000, "{compared:?}");
    // Denials by several quotas at once, whose violated quotas must agree too.
    assert!(compared.several_violated > 100, "{compared:?}");
}

/// The seed scenarios, asserted on Redis directly (not only "same as memory").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenarios_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = manual(RedisStore::builder(server.url()), &clock)
        .build()
        .await
        .unwrap();
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let limit =
            Limit::single(alg, Quota::per_second(2).unwrap().with_burst(5).unwrap()).unwrap();
        let key = format!("seed-{alg}");
        let mut first = Vec::new();
        for _ in 0..7 {
            first.push(
                store
                    .check(key.as_bytes(), &limit, 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(first, [true, true, true, true, true, false, false], "{alg}");
        clock.advance(Duration::from_millis(1_100));
        let mut second = Vec::new();
        for _ in 0..3 {
            second.push(
                store
                    .check(key.as_bytes(), &limit, 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(second, [true, true, false], "{alg}");
        let d = store.check(key.as_bytes(), &limit, 1).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(400)), "{alg}");
        clock.advance(Duration::from_secs(100));
    }
    let mut totals = Vec::new();
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_minute(100).unwrap()).unwrap();
        let key = format!("boundary-{alg}");
        let mut passed = [0, 0];
        for (half, t) in [59_900, 60_100].into_iter().enumerate() {
            clock.set(Timestamp::from_millis(t));
            for _ in 0..150 {
                if store
                    .check(key.as_bytes(), &limit, 1)
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    passed[half] += 1;
                }
            }
        }
        totals.push((alg, passed));
    }
    for (alg, passed) in totals {
        let expected = if alg == Algorithm::FixedWindow {
            [100, 100]
        } else {
            [100, 0]
        };
        assert_eq!(passed, expected, "{alg}: 150 at 59.9 s and 150 at 60.1 s");
    }
    // Cost 0 peeks; a cost larger than the quota is Exceeds, not an error.
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_second(10).unwrap()).unwrap();
        let key = format!("peek-{alg}");
        let peek = store.check(key.as_bytes(), &limit, 0).await.unwrap();
        assert!(peek.is_allowed(), "{alg}: {peek:?}");
        assert_eq!(peek.remaining(), 10, "{alg}: a peek spends nothing");
        assert!(
            store
                .check(key.as_bytes(), &limit, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        let peek = store.check(key.as_bytes(), &limit, 0).await.unwrap();
        assert_eq!(
            peek.remaining(),
            9,
            "{alg}: a peek sees the check before it"
        );
        let d = store.check(key.as_bytes(), &limit, u64::MAX).await.unwrap();
        assert_eq!(d.outcome(), Outcome::Exceeds, "{alg}");
        assert_eq!(d.remaining(), 9, "{alg}");
    }
}

/// ratelimit-core's conformance kit, run as a store of another crate would run it: every
/// scenario on one store (on a client clock the store counts each check at the time it is
/// given, back and forth).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_kit_passes_on_one_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = manual(RedisStore::builder(server.url()), &clock)
        .prefix(unique_prefix("kit"))
        .build()
        .await
        .unwrap();
    let table = ratelimit_core::conformance::scenarios();
    let report = ratelimit_core::conformance::check_store(&store, &clock, b"", &table)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.scenarios, table.len());
    assert_eq!(
        report.decisions,
        table.iter().map(|s| s.steps.len()).sum::<usize>()
    );
    println!("{report:?}");
    // One key under several limits: a state per key and limit (the limit's fingerprint is in the
    // Redis key).
    let apart = ratelimit_core::conformance::check_limits_apart(&store, &clock, b"")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((apart.scenarios, apart.decisions), (5, 100));
    // Its resets: one key under one limit, nothing else.
    let reset = ratelimit_core::conformance::check_reset(&store, &clock, b"")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((reset.scenarios, reset.decisions), (5, 65));
}
