//! EVALSHA is retried only after NOSCRIPT (the script did not run); any other error is returned
//! without a retry, because replaying a script that may have run would count a request twice.

mod common;

use std::time::Duration;

use common::{evalsha_stats, script_loads, unique_prefix};
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, RedisStoreError, script_sha};
use redis_harness::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_script_flush_the_next_check_succeeds_and_counts_once() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("noscript"))
        .build()
        .await
        .unwrap();
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_hour(10).unwrap()).unwrap();
        let d = store.check(b"k", &limit, 1).await.unwrap();
        assert_eq!(d.remaining(), 9, "{alg}");

        assert_eq!(server.cli(&["script", "flush"]), "OK");
        let sha = script_sha(alg).unwrap();
        assert_eq!(server.cli(&["script", "exists", sha]), "0");
        let before = evalsha_stats(&server);
        let d = store.check(b"k", &limit, 1).await.unwrap();
        assert!(d.is_allowed(), "{alg}");
        assert_eq!(d.remaining(), 8, "{alg}: counted exactly once");
        let after = evalsha_stats(&server);
        // One EVALSHA failed with NOSCRIPT, then one ran successfully: two calls, one failed.
        assert_eq!(after.0 - before.0, 2, "{alg}: two EVALSHA calls");
        assert_eq!(after.2 - before.2, 1, "{alg}: one NOSCRIPT failure");
        assert_eq!(server.cli(&["script", "exists", sha]), "1");
        // And the state agrees: a peek sees 8 left.
        assert_eq!(store.check(b"k", &limit, 0).await.unwrap().remaining(), 8);
    }
}

/// Scripts flushed again while a check reloads its script (an operator's `SCRIPT FLUSH` run
/// twice, a failover to a server that lost them): each `NOSCRIPT` proves the script did not
/// run, so the check loads it again and is answered, counted once. Through a proxy that delays
/// every chunk by 100 ms, so that a flush lands after each load has run and before the check
/// sent after it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_flushed_again_during_a_reload_are_loaded_again() {
    let server = std::sync::Arc::new(RedisServer::start());
    let proxy = redis_harness::proxy::Proxy::start(server.port());
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("noscript-again"))
        .pool_size(1)
        .response_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    assert_eq!(store.check(b"k", &limit, 1).await.unwrap().remaining(), 9);
    assert_eq!(server.cli(&["script", "flush"]), "OK");
    let loads = script_loads(&server);
    proxy.set_latency(Duration::from_millis(100));
    // After each of the check's first two loads, a flush.
    let flusher = std::thread::spawn({
        let server = std::sync::Arc::clone(&server);
        move || {
            for n in 1..=2 {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while script_loads(&server) < loads + n {
                    assert!(std::time::Instant::now() < deadline, "load {n} never came");
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(server.cli(&["script", "flush"]), "OK");
            }
        }
    });
    let before = evalsha_stats(&server);
    let d = store.check(b"k", &limit, 1).await;
    flusher.join().unwrap();
    let d = d.unwrap();
    assert_eq!(d.remaining(), 8, "counted exactly once: {d:?}");
    assert_eq!(script_loads(&server), loads + 3, "three loads");
    let after = evalsha_stats(&server);
    assert_eq!(after.2 - before.2, 3, "three NOSCRIPT answers");
    assert_eq!(after.0 - before.0, 4, "and the one that ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_errors_are_not_retried() {
    // A server that refuses writes once over its memory limit (noeviction): EVALSHA of a script
    // that writes is refused with OOM before it runs.
    let server = RedisServer::builder()
        .maxmemory_noeviction(4 * 1024 * 1024)
        .start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("oom"))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
    // Fill the memory past the limit (DEBUG POPULATE ignores maxmemory).
    server.cli(&["config", "set", "maxmemory", "1"]);
    let before = evalsha_stats(&server);
    let err = store.check(b"k", &limit, 1).await.unwrap_err();
    match &err {
        RedisStoreError::Redis(e) => assert_eq!(e.code(), Some("OOM"), "{err}"),
        other => panic!("expected an OOM reply, got {other:?}"),
    }
    assert!(!err.is_unavailable());
    let after = evalsha_stats(&server);
    assert_eq!(
        (after.0 + after.1) - (before.0 + before.1),
        1,
        "sent once, not retried"
    );
    server.cli(&["config", "set", "maxmemory", "0"]);
    // Nothing was consumed by the refused check.
    assert_eq!(store.check(b"k", &limit, 0).await.unwrap().remaining(), 9);
}
