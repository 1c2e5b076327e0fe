//! Shared by the integration tests: the conformance table and helpers.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{Decision, Limit, ManualClock, MemoryStore};
use ratelimit_redis::{RedisStore, RedisStoreBuilder};

/// The commands of the least-privilege user of docs/redis.md ("Access control").
pub const LEAST_PRIVILEGE: &str = "+evalsha +script|load +ping +time +get +set +hmget +hset \
    +lindex +llen +lrange +lset +ltrim +rpush +pexpire";

/// Settings for a store on the server at `port` as the ACL user `user`, under the prefix
/// `acl-rl` that the ACL tests' users are given.
pub fn acl_store(port: u16, user: &str, password: &str) -> RedisStoreBuilder {
    RedisStore::builder(format!("redis://{user}:{password}@127.0.0.1:{port}")).prefix("acl-rl")
}

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

/// The conformance table, its steps and the algorithms' decisions: ratelimit-core's kit.
pub use ratelimit_core::conformance::{Reference, Scenario, scenarios as table};

/// Unix time around 2025-11, in µs: large numbers, as in production.
pub const T0: u64 = 1_764_000_000_123_457;

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
            let now = step.at;
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
            clock.set(step.at);
            let got = redis
                .check(&key, &sc.limit, step.cost)
                .await
                .unwrap_or_else(|e| panic!("{}: step {i}: {e}", sc.name));
            assert_eq!(
                got,
                expected,
                "{}: step {i} (t={} key={:?} cost={}): RedisStore != algorithms",
                sc.name,
                step.at.as_micros(),
                step.key,
                step.cost
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

/// A current-thread runtime, with its drivers: runs its tasks only inside its `block_on`.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime of two worker threads, for the tests that run checks on more than one runtime.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `build` and `build_lazy` of a standalone store on `url` both fail at once as a wrong server
/// (not an unavailable one), the error naming the URL and saying `says`.
pub async fn assert_refused_as_wrong_server(url: &str, name: &str, says: &str) {
    let builder = || RedisStore::builder(url).prefix(unique_prefix(name));
    let err = builder().build().await.unwrap_err();
    assert!(err.is_wrong_server(), "{err:?}");
    assert!(!err.is_unavailable(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(url) && text.contains(says), "{text}");
    let lazy = builder()
        .build_lazy(std::time::Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(lazy.is_wrong_server(), "{lazy:?}");
}

/// (calls, rejected_calls, failed_calls) of EVALSHA, from INFO commandstats. A call that ran and
/// failed counts in both `calls` and `failed_calls`; one refused before running only in
/// `rejected_calls`.
pub fn evalsha_stats(server: &redis_harness::RedisServer) -> (u64, u64, u64) {
    let info = server.cli(&["info", "commandstats"]);
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("cmdstat_evalsha:calls=0,rejected_calls=0,failed_calls=0");
    let field = |name: &str| -> u64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map_or(0, |v| v.parse().unwrap())
    };
    (
        field("calls"),
        field("rejected_calls"),
        field("failed_calls"),
    )
}

/// `SCRIPT LOAD` calls the server has run, from INFO commandstats.
pub fn script_loads(server: &redis_harness::RedisServer) -> u64 {
    server
        .cli(&["info", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Connections a server has accepted so far, from the text of its `INFO stats` (`redis-cli`
/// counts one for each call).
pub fn connections_received(info_stats: &str) -> u64 {
    info_stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
