//! Announced resets (`RedisStoreBuilder::announce_resets`, `RedisStore::watch_resets`) on real
//! Redis servers and a real 3-master cluster: a watch hears every reset a store of its prefix
//! announces, nothing else, and subscribes again (and says so) after a restart or a freeze.

mod common;

use std::time::Duration;

use common::{LEAST_PRIVILEGE, unique_prefix};
use ratelimit_core::{Algorithm, DenialCache, Limit, Quota, Store, SystemClock};
use ratelimit_redis::{RedisStore, ResetNotice, ResetWatch};
use redis_harness::proxy::Proxy;
use redis_harness::{RedisCluster, RedisServer};
use tokio::sync::mpsc;

/// A notice, owned.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Reset(Vec<u8>, u64),
    Subscribed,
}

/// A watch on `store` and what it hears, in order.
fn watch(store: &RedisStore) -> (ResetWatch, mpsc::UnboundedReceiver<Heard>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let watch = store
        .watch_resets(move |notice| {
            let heard = match notice {
                ResetNotice::Reset {
                    key,
                    limit_fingerprint,
                } => Heard::Reset(key.to_vec(), limit_fingerprint),
                _ => Heard::Subscribed,
            };
            let _ = tx.send(heard);
        })
        .unwrap();
    (watch, rx)
}

/// The next notice heard, within `within` (a real server's delivery, not a timing).
async fn next(rx: &mut mpsc::UnboundedReceiver<Heard>, within: Duration) -> Heard {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("no notice in time")
        .expect("the watch ended")
}

fn limit() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap()
}

async fn store(url: &str, prefix: &str, announce: bool) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .announce_resets(announce)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

const SOON: Duration = Duration::from_secs(5);

/// A store on the cluster whose seed nodes are `urls`, announcing its resets under `prefix`.
async fn cluster_store(urls: Vec<String>, prefix: &str) -> RedisStore {
    RedisStore::cluster(urls)
        .prefix(prefix)
        .announce_resets(true)
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// Heard: the resets of every announcing store of the prefix (its own included), with the key
/// and the limit's fingerprint, in order. Not heard: a store that does not announce, and one of
/// another prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_hears_the_resets_announced_under_its_prefix_only() {
    let server = RedisServer::start();
    let prefix = unique_prefix("watch");
    let a = store(&server.url(), &prefix, true).await;
    let quiet = store(&server.url(), &prefix, false).await;
    let elsewhere = store(&server.url(), &unique_prefix("watch-other"), true).await;
    let (w, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    assert!(w.is_subscribed());

    let (limit, other) = (
        limit(),
        Limit::single(Algorithm::Gcra, Quota::per_hour(5).unwrap()).unwrap(),
    );
    a.reset(b"login\0alice", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"login\0alice".to_vec(), limit.fingerprint())
    );
    // Not announced: a store without the setting, and one of another prefix. The reset after
    // them is the next notice heard (Redis delivers a channel's messages in order).
    quiet.reset(b"bob", &limit).await.unwrap();
    elsewhere.reset(b"carol", &limit).await.unwrap();
    a.reset(b"dave", &other).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"dave".to_vec(), other.fingerprint())
    );
    // The announcing store's reset still deletes as before.
    a.check(b"erin", &limit, 1).await.unwrap();
    let keys = a.state_keys(b"erin", &limit);
    assert_eq!(server.cli(&["exists", &keys[0]]), "1");
    a.reset(b"erin", &limit).await.unwrap();
    assert_eq!(server.cli(&["exists", &keys[0]]), "0");
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"erin".to_vec(), limit.fingerprint())
    );
}

/// A subscription that hears nothing for a while is kept: the `PING`s sent after each second of
/// silence are answered, and the watch neither subscribes again nor says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_subscription_is_kept() {
    let server = RedisServer::start();
    let a = store(&server.url(), &unique_prefix("watch-quiet"), true).await;
    let (w, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    // Three seconds of silence: two or three PINGs (the behaviour under test is the watch's
    // real-time keep-alive, so real time passes).
    let pings_before = ping_calls(&server);
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert!(ping_calls(&server) - pings_before >= 2, "the watch pinged");
    assert!(w.is_subscribed());
    let limit = limit();
    a.reset(b"alice", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"alice".to_vec(), limit.fingerprint()),
        "no second subscription before it"
    );
}

/// `PING`s the server has run, from `INFO commandstats`.
fn ping_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Redis restarted: the watch finds its connection closed, subscribes again once the server is
/// back, says so (what it may have missed meanwhile is unknown), and hears the resets after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_subscribes_again_after_a_restart_and_says_so() {
    let mut server = RedisServer::start();
    let prefix = unique_prefix("watch-restart");
    let a = store(&server.url(), &prefix, true).await;
    let (w, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    server.restart();
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    assert!(w.is_subscribed());
    // The store's own connection comes back by itself too (a check or two may fail first).
    let limit = limit();
    let deadline = tokio::time::Instant::now() + SOON;
    while a.reset(b"alice", &limit).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reset after the restart"
        );
    }
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"alice".to_vec(), limit.fingerprint())
    );
}

/// A frozen server (SIGSTOP) closes nothing: the watch's `PING` goes unanswered, the watch gives
/// the subscription up, and subscribes again (and says so) once the server is thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscription_is_given_up_and_made_again() {
    let server = RedisServer::start();
    let a = store(&server.url(), &unique_prefix("watch-frozen"), true).await;
    let (w, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    server.pause();
    let deadline = tokio::time::Instant::now() + SOON;
    while w.is_subscribed() {
        assert!(tokio::time::Instant::now() < deadline, "still subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.resume();
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    let limit = limit();
    a.reset(b"alice", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"alice".to_vec(), limit.fingerprint())
    );
}

/// Two gateways' denial caches over one Redis: a reset through B ends A's cached denial of the
/// client as soon as A's watch hears it, not at the denial's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_one_gateway_ends_anothers_cached_denial() {
    let server = RedisServer::start();
    let prefix = unique_prefix("watch-cache");
    let redis_a = store(&server.url(), &prefix, true).await;
    let redis_b = store(&server.url(), &prefix, true).await;
    let a = DenialCache::new(redis_a.clone(), SystemClock::new());
    let b = DenialCache::new(redis_b, SystemClock::new());
    let (tx, mut heard) = mpsc::unbounded_channel();
    let heard_by = a.clone();
    let _watch = redis_a
        .watch_resets(move |notice| {
            notice.apply(&heard_by);
            let _ = tx.send(());
        })
        .unwrap();
    tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    // Alice spends her quota through A; A caches her denial (a minute long).
    let limit = limit();
    while a.check(b"alice", &limit, 1).await.unwrap().is_allowed() {}
    assert!(a.check(b"alice", &limit, 1).await.unwrap().is_cached());
    // Support resets her through B.
    ratelimit_core::Reset::reset(&b, b"alice", &limit)
        .await
        .unwrap();
    tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    let d = a.check(b"alice", &limit, 1).await.unwrap();
    assert!(d.is_allowed() && !d.is_cached(), "{d:?}");
}

/// On a cluster, each reset runs on its key's master, which publishes it: a watch subscribed
/// to one node hears the resets made on every master (a cluster delivers a publication to
/// every node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_cluster_hears_the_resets_of_every_master() {
    let cluster = RedisCluster::start(3);
    let store = cluster_store(cluster.urls(), &unique_prefix("watch-cluster")).await;
    let (_w, mut heard) = watch(&store);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    let limit = limit();
    let users: Vec<String> = (0..24).map(|i| format!("user-{i}")).collect();
    let mut masters = std::collections::HashSet::new();
    for u in &users {
        store.check(u.as_bytes(), &limit, 1).await.unwrap();
        masters.insert(
            cluster
                .node_for(&store.state_keys(u.as_bytes(), &limit)[0])
                .port(),
        );
    }
    assert_eq!(masters.len(), 3, "the users' keys are on every master");
    for u in &users {
        store.reset(u.as_bytes(), &limit).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in &users {
        got.push(next(&mut heard, SOON).await);
    }
    got.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    let mut want: Vec<Heard> = users
        .iter()
        .map(|u| Heard::Reset(u.as_bytes().to_vec(), limit.fingerprint()))
        .collect();
    want.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    assert_eq!(got, want);
}

/// A cluster behind one address that leads to any of its nodes (a load balancer, a DNS name
/// with every node's address): the watch's subscription on one node hears every reset, so the
/// address leading to another node is no failover, and the watch stays subscribed. (It took it
/// as one, asked every 5 s: it subscribed again, and each `Subscribed` made a gateway's
/// `DenialCache` forget every denial, so that each abusive client cost the store a call again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_cluster_behind_one_address_stays_subscribed_as_the_address_moves() {
    let cluster = RedisCluster::start(3);
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    let proxy = Proxy::start(ports[0]);
    let store = cluster_store(vec![proxy.url()], &unique_prefix("watch-cluster-lb")).await;
    let (_w, mut heard) = watch(&store);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    // The address leads to another node, then to the third, past the watch's 5 s check.
    proxy.set_upstream(ports[1]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set_upstream(ports[2]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let limit = limit();
    store.reset(b"alice", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"alice".to_vec(), limit.fingerprint()),
        "the watch subscribed again (or heard nothing) as its address moved"
    );
}

/// A cluster store given one seed node goes on serving the other masters' keys once that node
/// is gone, and so does its watch: it learns the cluster's nodes as it subscribes, and subscribes
/// on another once its seed is gone. (It tried the dead seed alone, for as long as it was gone,
/// while other gateways' resets went unheard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_given_one_seed_subscribes_on_another_node_once_the_seed_is_gone() {
    let mut cluster =
        RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let seed = cluster.nodes()[0].port();
    let prefix = unique_prefix("watch-one-seed");
    let a = cluster_store(vec![cluster.nodes()[0].url()], &prefix).await;
    let b = cluster_store(cluster.urls(), &prefix).await;
    let (watch_a, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    cluster.kill_node(seed);
    // A user whose key is on a master still up.
    let limit = limit();
    let user = (0..)
        .map(|i| format!("user-{i}"))
        .find(|u| {
            cluster
                .node_for(&b.state_keys(u.as_bytes(), &limit)[0])
                .port()
                != seed
        })
        .unwrap();
    let got = next(&mut heard, Duration::from_secs(15)).await;
    assert_eq!(
        got,
        Heard::Subscribed,
        "subscribed: {}",
        watch_a.is_subscribed()
    );
    let deadline = tokio::time::Instant::now() + SOON;
    while b.reset(user.as_bytes(), &limit).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no reset");
    }
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(user.into_bytes(), limit.fingerprint())
    );
}

/// A cluster node that leaves the cluster (`CLUSTER RESET HARD`, forgotten by the others) but
/// runs on hears no publication: a watch does not stay subscribed there. Its seed, the master of
/// slot 0, names its replica first among the nodes the watch learns; every replica leaves the
/// cluster, then the masters drop the watch's subscriptions, round after round. The watch tries
/// the replicas that left, finds them serving no slot, and subscribes on a node of the cluster,
/// where it hears the resets. (It subscribed on a node that left and heard nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_does_not_stay_on_a_node_that_left_the_cluster() {
    let cluster = RedisCluster::start_with_replicas(3, 1, &[]);
    let role = |n: &RedisServer, role: &str| {
        n.cli(&["cluster", "nodes"])
            .lines()
            .any(|l| l.contains("myself") && l.contains(role))
    };
    // Every replica named by the seed's `CLUSTER SLOTS` (once each has synced), so that the
    // watch learns them.
    let seed = cluster
        .nodes()
        .iter()
        .find(|n| cluster.slots_of(n).iter().any(|r| r.contains(&0)))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seed.cli(&["cluster", "slots"]).matches("127.0.0.1").count() < 6 {
        assert!(std::time::Instant::now() < deadline, "replicas not known");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prefix = unique_prefix("watch-left");
    let a = cluster_store(vec![seed.url()], &prefix).await;
    let b = cluster_store(cluster.urls(), &prefix).await;
    let (_w, mut heard) = watch(&a);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    let (replicas, masters): (Vec<_>, Vec<_>) =
        cluster.nodes().iter().partition(|n| role(n, "slave"));
    for r in &replicas {
        let id = r.cli(&["cluster", "myid"]);
        r.cli(&["cluster", "reset", "hard"]);
        for m in &masters {
            m.cli(&["cluster", "forget", id.trim()]);
        }
    }
    // Subscriptions on the cluster's nodes dropped, round after round: the watch goes through
    // the nodes it knows, and each time subscribes where it hears the resets.
    let limit = limit();
    for round in 0..6 {
        for m in &masters {
            m.cli(&["client", "kill", "type", "pubsub"]);
        }
        assert_eq!(
            next(&mut heard, Duration::from_secs(15)).await,
            Heard::Subscribed
        );
        let user = format!("user-{round}");
        b.reset(user.as_bytes(), &limit).await.unwrap();
        assert_eq!(
            next(&mut heard, SOON).await,
            Heard::Reset(user.into_bytes(), limit.fingerprint()),
            "round {round}: the watch subscribed where resets are not heard"
        );
    }
}

/// A cluster that announces unknown endpoints (`cluster-preferred-endpoint-type
/// unknown-endpoint`, for nodes behind one address): its `CLUSTER SLOTS` names slot ranges with
/// no usable address. The watch subscribes and hears the resets; it learns no node from it. (It
/// took the node for one that serves no slot, and never subscribed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_cluster_announcing_unknown_endpoints_subscribes() {
    let cluster = RedisCluster::start(3);
    for n in cluster.nodes() {
        n.cli(&[
            "config",
            "set",
            "cluster-preferred-endpoint-type",
            "unknown-endpoint",
        ]);
    }
    let store = cluster_store(cluster.urls(), &unique_prefix("watch-unknown-endpoints")).await;
    let (_w, mut heard) = watch(&store);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    let limit = limit();
    store.reset(b"alice", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"alice".to_vec(), limit.fingerprint())
    );
}

/// A lazy store's watch starts while Redis cannot be reached (a proxy refusing connections),
/// and subscribes once it can, without waiting for a check to build the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_stores_watch_subscribes_once_redis_is_reachable() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let lazy = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("watch-lazy"))
        .announce_resets(true)
        .build_lazy(Duration::from_millis(50))
        .await
        .unwrap();
    let (tx, mut heard) = mpsc::unbounded_channel();
    let w = lazy
        .watch_resets(move |notice| {
            let _ = tx.send(matches!(notice, ResetNotice::Subscribed));
        })
        .unwrap();
    assert!(!w.is_subscribed());
    proxy.set_refuse(false);
    let subscribed = tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    assert_eq!(subscribed, Some(true));
    assert!(w.is_subscribed());
    // Its resets, once built, are announced.
    let limit = limit();
    let deadline = tokio::time::Instant::now() + SOON;
    while ratelimit_core::Reset::reset(&lazy, b"alice", &limit)
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "never built");
        tokio::task::yield_now().await;
    }
    let reset = tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    assert_eq!(reset, Some(false));
}

/// Outside a Tokio runtime there is nothing to run the watch on: a typed error, not a panic.
#[test]
fn a_watch_needs_a_runtime() {
    let server = RedisServer::start();
    let runtime = common::runtime();
    let store = runtime.block_on(store(&server.url(), "rl", true));
    let err = store.watch_resets(|_| {}).unwrap_err();
    assert!(err.to_string().contains("Tokio runtime"), "{err}");
}

/// A restricted Redis user (docs/redis.md, "Access control"): announcing needs `+publish` and
/// the channel on top of `+del`, or the reset is refused with the state kept (the script
/// publishes before it deletes); watching needs `+subscribe` and the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcing_and_watching_need_the_channel() {
    let server = RedisServer::builder()
        .config(format!(
            "user resetter on >r3setter resetkeys ~acl-rl:* -@all {LEAST_PRIVILEGE} +del"
        ))
        .config(format!(
            "user announcer on >ann0uncer resetkeys ~acl-rl:* resetchannels &acl-rl:resets \
             -@all {LEAST_PRIVILEGE} +del +publish +subscribe"
        ))
        .start();
    let store = |user: &str, password: &str| {
        common::acl_store(server.port(), user, password)
            .announce_resets(true)
            .build()
    };
    let resetter = store("resetter", "r3setter").await.unwrap();
    let announcer = store("announcer", "ann0uncer").await.unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    assert!(resetter.check(b"u", &limit, 1).await.unwrap().is_allowed());
    let err = resetter.reset(b"u", &limit).await.unwrap_err();
    assert!(err.is_refused_credentials(), "{err:?}");
    assert!(resetter.check(b"u", &limit, 1).await.unwrap().is_denied());

    let (w, mut heard) = watch(&announcer);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    assert!(w.is_subscribed());
    announcer.reset(b"u", &limit).await.unwrap();
    assert_eq!(
        next(&mut heard, SOON).await,
        Heard::Reset(b"u".to_vec(), limit.fingerprint())
    );
    assert!(resetter.check(b"u", &limit, 1).await.unwrap().is_allowed());
}

/// A handler that panics ends the watch's task: the watch then says it is not subscribed,
/// rather than claiming a subscription nothing reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_handler_panicked_is_not_subscribed() {
    let server = RedisServer::start();
    let a = store(&server.url(), &unique_prefix("watch-panic"), true).await;
    let (tx, mut heard) = mpsc::unbounded_channel();
    let w = a
        .watch_resets(move |notice| {
            let _ = tx.send(());
            if let ResetNotice::Reset { .. } = notice {
                panic!("a handler's bug");
            }
        })
        .unwrap();
    tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    assert!(w.is_subscribed());
    a.reset(b"alice", &limit()).await.unwrap();
    tokio::time::timeout(SOON, heard.recv()).await.unwrap();
    let deadline = tokio::time::Instant::now() + SOON;
    while w.is_subscribed() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still said to be subscribed"
        );
        tokio::task::yield_now().await;
    }
}

/// A primary demoted to a replica behind the same address (a failover behind a DNS name or a
/// virtual IP) refuses an announced reset's delete: nothing may be announced then, or the
/// gateways watching it would end their cached denials of a client whose count stands. The
/// script deletes first, and publishes only once the delete is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_refused_by_a_demoted_primary_announces_nothing() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let a = store(&old.url(), &unique_prefix("demoted"), true).await;
    assert!(a.check(b"alice", &limit(), 1).await.unwrap().is_allowed());
    old.cli(&["REPLICAOF", "127.0.0.1", &new.port().to_string()]);
    let err = a.reset(b"alice", &limit()).await.unwrap_err();
    assert!(err.to_string().contains("ReadOnly"), "{err:?}");
    let stats = old.cli(&["INFO", "commandstats"]);
    assert!(
        !stats.lines().any(|l| l.starts_with("cmdstat_publish:")),
        "published on the replica:\n{stats}"
    );
}

/// A failover behind one address (a proxy, a DNS name, a virtual IP): the old primary is made a
/// replica of the new one, and the address now leads to the new primary. The watch's connection
/// to the old server neither closes nor goes silent (the replica answers its `PING`s), and a
/// notice published on the new primary before the replica has synced never reaches it. The
/// watch finds that the address leads to another server, subscribes there, and says so: the
/// other gateway's cached denial of a client reset meanwhile ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_follows_a_failover_behind_its_address() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let proxy = Proxy::start(old.port());
    let prefix = unique_prefix("watch-failover");
    let redis_a = store(&proxy.url(), &prefix, true).await;
    let redis_b = store(&proxy.url(), &prefix, true).await;
    let b = DenialCache::new(redis_b.clone(), SystemClock::new());
    let (tx, mut heard) = mpsc::unbounded_channel();
    let heard_by = b.clone();
    let watch = redis_b
        .watch_resets(move |notice| {
            notice.apply(&heard_by);
            let _ = tx.send(matches!(notice, ResetNotice::Subscribed));
        })
        .unwrap();
    assert_eq!(
        tokio::time::timeout(SOON, heard.recv()).await.unwrap(),
        Some(true)
    );
    // An hour-long quota: B's cached denial would stand for most of it.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(2).unwrap()).unwrap();
    while b.check(b"alice", &limit, 1).await.unwrap().is_allowed() {}
    assert!(b.check(b"alice", &limit, 1).await.unwrap().is_cached());

    // The failover, then a reset through A on the new primary.
    old.cli(&["REPLICAOF", "127.0.0.1", &new.port().to_string()]);
    proxy.set_upstream(new.port());
    let deadline = tokio::time::Instant::now() + SOON;
    while redis_a.reset(b"alice", &limit).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no reset");
    }
    // B's watch subscribes on the new primary and says so (its cache then drops its denials),
    // within the watch's check of where its address leads, plus the subscription.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, heard.recv()).await {
            Ok(Some(true)) => break,
            Ok(Some(false)) => continue,
            Ok(None) => panic!("the watch ended"),
            Err(_) => panic!(
                "no new subscription within 15 s of the failover (subscribed: {})",
                watch.is_subscribed()
            ),
        }
    }
    // B's own store connection still leads to the old server: its first write there fails
    // (`READONLY`), and the store connects again. Once the old server has synced from the new
    // one: until then it still holds alice's spent quota, and a denial writes nothing, so it
    // answered B's check from that (Redis 7 starts a replica's sync about 5 s after it asks;
    // the watch may subscribe again sooner).
    tokio::task::block_in_place(|| new.wait_replicated());
    let deadline = tokio::time::Instant::now() + SOON;
    let d = loop {
        match b.check(b"alice", &limit, 1).await {
            Ok(d) => break d,
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e:?}"),
        }
    };
    assert!(d.is_allowed() && !d.is_cached(), "{d:?}");
    // And it hears the resets made after.
    redis_a.reset(b"bob", &limit).await.unwrap();
    assert_eq!(
        tokio::time::timeout(SOON, heard.recv()).await.unwrap(),
        Some(false)
    );
}

/// The same failover, on a watch whose first question of where its address leads went
/// unanswered (the server's replies held in the proxy until the watch's second connection, its
/// `SUBSCRIBE`'s, is accepted: the `INFO server` before it times out). The watch asks again while
/// subscribed, and follows the failover all the same. (It took the one unanswered question as
/// "not to be checked", as for a user without `+info`, and never asked again: the address led
/// to the new server, and the watch stayed subscribed on the old one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_first_question_went_unanswered_still_follows_a_failover() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let proxy = std::sync::Arc::new(Proxy::start(old.port()));
    let prefix = unique_prefix("watch-failover-unanswered");
    let redis_a = store(&new.url(), &prefix, true).await;
    let redis_b = store(&proxy.url(), &prefix, true).await;
    let accepted = proxy.accepted();
    proxy.set_hold_replies(true);
    let released = std::thread::spawn({
        let proxy = std::sync::Arc::clone(&proxy);
        move || {
            let started = std::time::Instant::now();
            while proxy.accepted() < accepted + 2 && started.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
            proxy.set_hold_replies(false);
        }
    });
    let (watch, mut heard) = watch(&redis_b);
    assert_eq!(next(&mut heard, SOON * 2).await, Heard::Subscribed);
    released.join().unwrap();
    // The failover: the address leads to the new server from now on, where A resets a client.
    proxy.set_upstream(new.port());
    redis_a.reset(b"alice", &limit()).await.unwrap();
    // Nothing is heard on the old server meanwhile (A's reset was published on the new one).
    match tokio::time::timeout(Duration::from_secs(15), heard.recv()).await {
        Ok(Some(Heard::Subscribed)) => {}
        Ok(Some(other)) => panic!("heard {other:?} on the old server"),
        Ok(None) => panic!("the watch ended"),
        Err(_) => panic!(
            "no new subscription within 15 s of the failover (subscribed: {})",
            watch.is_subscribed()
        ),
    }
    // Subscribed where the address leads now: it hears the resets made there.
    redis_a.reset(b"bob", &limit()).await.unwrap();
    assert!(matches!(next(&mut heard, SOON).await, Heard::Reset(key, _) if key.ends_with(b"bob")));
}

/// Where a subscription was made after an unanswered question is not known, even if the
/// address led to one server at every answer before: here it leads to A, then to B (the watch
/// follows), then back to A for a moment, as the subscription is lost and made again with the
/// question before it refused, then to B again. The first answer after that makes the watch
/// subscribe again, and it hears the resets published on B. (A version of 2026-12-06 took such a
/// subscription to be where the latest answer said, to spare a server that answers only every
/// other question a new subscription every 5 s: this watch stayed on A, hearing nothing, for as
/// long as the subscription lasted; found by a review and taken back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_subscribed_where_its_address_led_for_a_moment_follows_it_back() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let proxy = Proxy::start(a.port());
    let prefix = unique_prefix("watch-flap");
    let watched = store(&proxy.url(), &prefix, true).await;
    let on_b = store(&b.url(), &prefix, true).await;
    let (watch, mut heard) = watch(&watched);
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    proxy.set_upstream(b.port());
    assert_eq!(next(&mut heard, SOON * 2).await, Heard::Subscribed);
    // Back to A for a moment: the subscription is lost, the question before the next is refused,
    // and the next is made on A.
    proxy.set_upstream(a.port());
    let accepted = proxy.accepted();
    proxy.refuse_next(1);
    proxy.drop_connections();
    assert_eq!(next(&mut heard, SOON).await, Heard::Subscribed);
    assert_eq!(
        proxy.accepted(),
        accepted + 2,
        "the refused question and the subscription"
    );
    proxy.set_upstream(b.port());
    // Resets on B, until one is heard (within the next question, 5 s, and a subscription).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        on_b.reset(b"alice", &limit()).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), heard.recv()).await {
            Ok(Some(Heard::Reset(key, _))) if key.ends_with(b"alice") => break,
            Ok(Some(_)) | Err(_) => {}
            Ok(None) => panic!("the watch ended"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reset made on B heard within 15 s (subscribed: {})",
            watch.is_subscribed()
        );
    }
}

/// A notice handed to a `DenialCache` over a `Leasing` innermost first (the lease ended, then
/// the cache's denials): a check between the two goes past the lease to the store, which admits
/// the reset client, and no denial outlives the reset. (Outer first, a check between the two
/// spent a unit of the old lease, which left none, and the cache held that denial for 15
/// minutes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_applied_innermost_first_leaves_no_denial_behind() {
    use ratelimit_core::Leasing;
    let server = RedisServer::start();
    let prefix = unique_prefix("watch-stack");
    let a = store(&server.url(), &prefix, true).await;
    let b = store(&server.url(), &prefix, true).await;
    let leasing = Leasing::builder(b.clone(), SystemClock::new())
        .lease_size(4)
        .build()
        .unwrap();
    let cache = DenialCache::new(leasing.clone(), SystemClock::new());
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(4).unwrap()).unwrap();
    for _ in 0..3 {
        assert!(cache.check(b"alice", &limit, 1).await.unwrap().is_allowed());
    }
    // Reset through another gateway; its notice, applied in the documented order, with a check
    // of this gateway's between the two.
    a.reset(b"alice", &limit).await.unwrap();
    let notice = ResetNotice::Reset {
        key: b"alice",
        limit_fingerprint: limit.fingerprint(),
    };
    notice.apply(&leasing);
    let between = cache.check(b"alice", &limit, 1).await.unwrap();
    assert!(between.is_allowed(), "{between:?}");
    notice.apply(&cache);
    for i in 0..3 {
        let d = cache.check(b"alice", &limit, 1).await.unwrap();
        assert!(d.is_allowed(), "check {i} after the reset: {d:?}");
    }
}
