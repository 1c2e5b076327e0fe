//! `Reset` on a real Redis server and a real 3-master cluster: every key of the (key, limit)
//! deleted in one step, the key deciding as a new key's afterwards, no other key touched.

mod common;

use std::time::Duration;

use common::{NowMicros, Reference, T0, unique_prefix};
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota, Reset, Timestamp};
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::{RedisCluster, RedisServer};

fn two_quotas(alg: Algorithm) -> Limit {
    Limit::new(
        alg,
        [Quota::per_second(3).unwrap(), Quota::per_hour(20).unwrap()],
    )
    .unwrap()
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cli(&["exists", key]) == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_key_decides_as_a_new_key_for_every_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("reset"))
        .client_clock(clock.clone())
        .build()
        .await
        .unwrap();
    let other = Limit::single(Algorithm::TokenBucket, Quota::per_minute(9).unwrap()).unwrap();
    for alg in Algorithm::ALL {
        let limit = two_quotas(alg);
        while store.check(b"alice", &limit, 1).await.unwrap().is_allowed() {}
        store.check(b"bob", &limit, 1).await.unwrap();
        store.check(b"alice", &other, 1).await.unwrap();
        clock.advance(Duration::from_millis(10));
        let keys = store.state_keys(b"alice", &limit);
        assert!(keys.iter().all(|k| exists(&server, k)), "{alg}: {keys:?}");

        Reset::reset(&store, b"alice", &limit).await.unwrap();
        assert!(keys.iter().all(|k| !exists(&server, k)), "{alg}: {keys:?}");
        // Bob's state, and Alice's under another limit, are where they were.
        for k in store
            .state_keys(b"bob", &limit)
            .into_iter()
            .chain(store.state_keys(b"alice", &other))
        {
            assert!(exists(&server, &k), "{alg}: {k}");
        }
        // The same decisions as for a key never seen, at the same instants.
        let mut fresh = Reference::default();
        loop {
            let now = Timestamp::from_micros(clock.now_micros());
            let d = store.check(b"alice", &limit, 1).await.unwrap();
            assert_eq!(d, fresh.check(b"alice", &limit, 1, now), "{alg}");
            if !d.is_allowed() {
                break;
            }
        }
        // Resetting a key that holds nothing succeeds.
        store.reset(b"carol", &limit).await.unwrap();
    }
}

/// The reset script is loaded at start like the checks'; a server that lost it (a restart, a
/// `SCRIPT FLUSH`) gets it again at the `NOSCRIPT`, as for a check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reloads_its_script_after_a_flush() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("reset-flush"))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::Gcra, Quota::per_minute(1).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"k", &limit, 1).await.unwrap().is_allowed());
    server.cli(&["script", "flush"]);
    // Through the coalescing wrapper, which sends the reset at once.
    let coalescing = Coalescing::new(store.clone());
    Reset::reset(&coalescing, b"k", &limit).await.unwrap();
    assert!(
        coalescing
            .check(b"k", &limit, 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

/// On a cluster, keys spread over every master: each reset's keys (a sliding log's state and
/// its lists) are in one slot, deleted on the master that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_a_cluster_deletes_on_each_keys_master() {
    let cluster = RedisCluster::start(3);
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix("reset-cluster"))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // Periods long against the test's real time (the cluster counts on its own clocks).
    let limit = Limit::new(
        Algorithm::SlidingLog,
        [Quota::per_minute(3).unwrap(), Quota::per_hour(20).unwrap()],
    )
    .unwrap();
    let users: Vec<String> = (0..24).map(|i| format!("user-{i}")).collect();
    let mut masters = std::collections::HashSet::new();
    for u in &users {
        while store
            .check(u.as_bytes(), &limit, 1)
            .await
            .unwrap()
            .is_allowed()
        {}
        masters.insert(
            cluster
                .node_for(&store.state_keys(u.as_bytes(), &limit)[0])
                .port(),
        );
    }
    assert_eq!(masters.len(), 3, "the users' keys are on every master");
    for u in &users[..12] {
        store.reset(u.as_bytes(), &limit).await.unwrap();
    }
    for (i, u) in users.iter().enumerate() {
        let keys = store.state_keys(u.as_bytes(), &limit);
        assert_eq!(keys.len(), 3);
        let node = cluster.node_for(&keys[0]);
        for k in &keys {
            assert_eq!(
                node.cli(&["exists", k]),
                if i < 12 { "0" } else { "1" },
                "{k}"
            );
        }
        let d = store.check(u.as_bytes(), &limit, 1).await.unwrap();
        assert_eq!(d.is_allowed(), i < 12, "{u}");
    }
}
