//! The store's own counters, recorded through the `metrics` facade's global recorder (the store
//! records from its connections' tasks, on any thread, so a thread-local recorder would miss
//! them). A test binary of its own: it installs the global recorder.

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::unique_prefix;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::RedisServer;

/// Every counter's total so far. A snapshot takes the counts since the last one (it resets
/// them), so the tests, which run at once, add each snapshot here and read their own counter.
fn counter(name: &str) -> u64 {
    read(name).0
}

/// The total of the counter `name` so far, and its description (the last the recorder was given
/// before a snapshot that saw the counter).
fn read(name: &str) -> (u64, Option<String>) {
    type Totals = Mutex<HashMap<String, (u64, Option<String>)>>;
    static RECORDER: OnceLock<(Snapshotter, Totals)> = OnceLock::new();
    let (snapshotter, totals) = RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
        (snapshotter, Mutex::new(HashMap::new()))
    });
    let mut totals = totals.lock().unwrap();
    for (key, _, help, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let total = totals.entry(key.key().name().to_owned()).or_default();
            total.0 += n;
            if let Some(help) = help {
                total.1 = Some(help.to_string());
            }
        }
    }
    totals.get(name).cloned().unwrap_or_default()
}

/// Held by each test for its whole run: the counters are global, and a test's store could count
/// in another's (a connection replaced under the other's load), so they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `ratelimit_redis_coalesced_checks_total` counts the checks that rode in another's script
/// call: every check of a batch but the first, so the checks made less the calls sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_checks_are_counted() {
    const NAME: &str = "ratelimit_redis_coalesced_checks_total";
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("metrics-coalesce"))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let before = counter(NAME);
    let admitted = common::concurrent_hot_checks(&coalescing, &limit, 500)
        .await
        .iter()
        .filter(|d| d.is_allowed())
        .count();
    assert_eq!(admitted, 100);
    let stats = coalescing.stats();
    assert_eq!(stats.checks, 500);
    assert!(
        stats.largest_batch > 1,
        "some checks were coalesced: {stats:?}"
    );
    assert_eq!(
        counter(NAME) - before,
        stats.checks - stats.store_calls,
        "{stats:?}"
    );
}

/// `ratelimit_redis_coalescing_overflow_total` counts each check that found its key's queue full
/// and was sent on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_past_a_full_queue_are_counted() {
    const NAME: &str = "ratelimit_redis_coalescing_overflow_total";
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("metrics-overflow"))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).max_queue(2);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let before = counter(NAME);
    server.pause();
    // One check out on the frozen server, two queued behind it, three more past the full queue.
    let first = tokio::spawn(coalescing.check(b"k", &limit, 1));
    common::until_sent(&coalescing, 1).await;
    let queued: Vec<_> = (0..2).map(|_| coalescing.check(b"k", &limit, 1)).collect();
    let alone: Vec<_> = (0..3)
        .map(|_| tokio::spawn(coalescing.check(b"k", &limit, 1)))
        .collect();
    server.resume();
    assert!(first.await.unwrap().unwrap().is_allowed());
    for check in futures::future::join_all(queued).await {
        assert!(check.unwrap().is_allowed());
    }
    for check in futures::future::join_all(alone).await {
        assert!(check.unwrap().unwrap().is_allowed());
    }
    assert_eq!(coalescing.stats().overflowed, 3);
    assert_eq!(counter(NAME) - before, 3);
}

/// `ratelimit_redis_connections_replaced_total` counts a connection found broken (the server
/// killed under it), once, and not the checks that fail meanwhile on no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_is_counted_once() {
    const NAME: &str = "ratelimit_redis_connections_replaced_total";
    let _one = ONE_AT_A_TIME.lock().await;
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("metrics-broken"))
        .pool_size(1)
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::Gcra, Quota::per_second(100).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
    let before = counter(NAME);
    server.kill();
    for _ in 0..5 {
        let err = store.check(b"k", &limit, 1).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }
    assert_eq!(counter(NAME) - before, 1, "one connection, broken once");
    server.restart();
    let mut ok = false;
    for _ in 0..20 {
        if store.check(b"k", &limit, 1).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "checks work again once the server is back");
    // A connection opened anew after a break is not a replacement.
    assert_eq!(counter(NAME) - before, 1);
}

/// The counters are described to the recorder when a store is built: a Prometheus exporter's
/// `# HELP` line. (A counter is in a snapshot once it has been registered, at its first event:
/// registered here by hand, as its first event would.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_are_described_when_a_store_is_built() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let _store = RedisStore::builder(server.url())
        .prefix(unique_prefix("metrics-described"))
        .build()
        .await
        .unwrap();
    for name in [
        ratelimit_redis::metrics::CONNECTIONS_REPLACED_TOTAL,
        ratelimit_redis::metrics::COALESCED_CHECKS_TOTAL,
        ratelimit_redis::metrics::COALESCING_OVERFLOW_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
        let help = read(name)
            .1
            .unwrap_or_else(|| panic!("{name} not described"));
        assert!(help.starts_with("Rate-limit "), "{name}: {help}");
    }
}

/// `ratelimit_redis_reset_watch_subscriptions_total` counts each subscription a reset watch
/// makes (first, and again after a restart), and `ratelimit_redis_reset_notices_total` each
/// notice it hears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_watchs_subscriptions_and_notices_are_counted() {
    const SUBSCRIPTIONS: &str = "ratelimit_redis_reset_watch_subscriptions_total";
    const NOTICES: &str = "ratelimit_redis_reset_notices_total";
    let _one = ONE_AT_A_TIME.lock().await;
    // Read first: the recorder is installed before the store describes its counters.
    let (subscribed, notices) = (counter(SUBSCRIPTIONS), counter(NOTICES));
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("metrics-watch"))
        .announce_resets(true)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let _watch = store
        .watch_resets(move |notice| {
            let _ = tx.send(matches!(notice, ratelimit_redis::ResetNotice::Subscribed));
        })
        .unwrap();
    let soon = Duration::from_secs(5);
    assert_eq!(
        tokio::time::timeout(soon, heard.recv()).await.unwrap(),
        Some(true)
    );
    let limit = Limit::single(Algorithm::Gcra, Quota::per_second(100).unwrap()).unwrap();
    for key in [&b"a"[..], b"b"] {
        store.reset(key, &limit).await.unwrap();
        assert_eq!(
            tokio::time::timeout(soon, heard.recv()).await.unwrap(),
            Some(false)
        );
    }
    server.restart();
    assert_eq!(
        tokio::time::timeout(soon, heard.recv()).await.unwrap(),
        Some(true)
    );
    assert_eq!(counter(SUBSCRIPTIONS) - subscribed, 2);
    let (n, help) = read(NOTICES);
    assert_eq!(n - notices, 2);
    assert!(help.is_some_and(|h| h.contains("reset watch heard")));
}
