//! On a real 3-master Redis Cluster: the same conformance table and the same distributed race,
//! with keys spread over every master.

mod common;

use common::{evalsha_stats, manual, run_conformance, script_loads, table, unique_prefix};
use futures::future::join_all;
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota};
use ratelimit_redis::RedisStore;
use redis_harness::RedisCluster;
use redis_harness::proxy::Proxy;
use std::time::Duration;

/// One cluster at a time: each test starts 3 to 6 `redis-server` processes and times its checks;
/// on a 2-core machine, five clusters side by side starve each other into timeouts.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A response timeout for tests that check decisions, not latency: generous, so that a loaded
/// machine does not turn a slow answer into a failure.
const PATIENT: Duration = Duration::from_secs(5);

/// The port of the master that holds `user`'s state under `limit`.
fn master_of(cluster: &RedisCluster, store: &RedisStore, limit: &Limit, user: &str) -> u16 {
    cluster
        .node_for(&store.state_keys(user.as_bytes(), limit)[0])
        .port()
}

/// A store on every node of `cluster`, its keys under a prefix made from `name`.
async fn store_on(cluster: &RedisCluster, name: &str, response_timeout: Duration) -> RedisStore {
    RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix(name))
        .response_timeout(response_timeout)
        .build()
        .await
        .unwrap()
}

/// The port of the master of the user `victim`, and a user (a bystander) whose master is another.
fn victim_and_bystander(
    cluster: &RedisCluster,
    store: &RedisStore,
    limit: &Limit,
) -> (u16, String) {
    let owner = |user: &str| master_of(cluster, store, limit, user);
    let victim = owner("victim");
    let bystander = (0..)
        .map(|i| format!("bystander-{i}"))
        .find(|u| owner(u) != victim)
        .unwrap();
    (victim, bystander)
}

/// A cluster of 3 masters without replicas that serves while one is lost
/// (`cluster-require-full-coverage no`), a store on it, a limit, and the master of the user
/// `victim` and a user (a bystander) of another master, each checked once.
async fn victim_to_lose(
    name: &str,
    response_timeout: Duration,
) -> (RedisCluster, RedisStore, Limit, u16, String) {
    let cluster = RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let store = store_on(&cluster, name, response_timeout).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100_000).unwrap()).unwrap();
    let (victim, bystander) = victim_and_bystander(&cluster, &store, &limit);
    store.check(b"victim", &limit, 1).await.unwrap();
    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    (cluster, store, limit, victim, bystander)
}

fn dbsize(node: &redis_harness::RedisServer) -> u64 {
    node.cli(&["dbsize"]).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_race_and_noscript_on_a_three_master_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);

    // Conformance: identical decisions, client-clock mode, through one node's URL (the others
    // are discovered; MOVED redirections are followed by the client).
    let clock = ManualClock::new();
    let store = manual(RedisStore::cluster([cluster.urls()[0].clone()]), &clock)
        .prefix(unique_prefix("cconf"))
        .build()
        .await
        .unwrap();
    let table = table();
    let compared = run_conformance(&store, &clock, &table).await;
    println!("cluster: {} scenarios, {compared:?}", table.len());
    assert!(compared.with_algorithms > 10_000);
    // The table's keys landed on every master.
    for node in cluster.nodes() {
        assert!(dbsize(node) > 0, "node {} holds keys", node.port());
    }

    // Multi-key scripts (sliding log: a hash and one list per quota) stay in one slot.
    let log = Limit::new(
        Algorithm::SlidingLog,
        [Quota::per_second(5).unwrap(), Quota::per_hour(50).unwrap()],
    )
    .unwrap();
    for i in 0..30 {
        let key = format!("user-{i}");
        assert!(
            store
                .check(key.as_bytes(), &log, 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }

    // The race: 20 gateways, each its own cluster store, on one hot key per algorithm.
    let prefix = unique_prefix("crace");
    let mut gateways = Vec::new();
    for _ in 0..20 {
        gateways.push(
            RedisStore::cluster(cluster.urls())
                .prefix(prefix.clone())
                .pool_size(1)
                .response_timeout(PATIENT)
                .build()
                .await
                .unwrap(),
        );
    }
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_day(100).unwrap()).unwrap();
        let key = format!("hot-{alg}");
        let tasks = gateways.iter().map(|g| {
            let g = g.clone();
            let (key, limit) = (key.clone(), limit.clone());
            tokio::spawn(async move {
                let checks = (0..150).map(|_| g.check(key.as_bytes(), &limit, 1));
                join_all(checks)
                    .await
                    .into_iter()
                    .filter(|r| r.as_ref().expect("check").is_allowed())
                    .count()
            })
        });
        let admitted: usize = join_all(tasks).await.into_iter().map(|r| r.unwrap()).sum();
        assert_eq!(
            admitted, 100,
            "{alg}: 3000 requests from 20 gateways on a cluster"
        );
    }
    // Hot keys of different users are spread over the masters too.
    let owners: std::collections::HashSet<u16> = Algorithm::ALL
        .iter()
        .map(|alg| {
            let limit = Limit::single(*alg, Quota::per_day(100).unwrap()).unwrap();
            let k = &gateways[0].state_keys(format!("hot-{alg}").as_bytes(), &limit)[0];
            cluster.node_for(k).port()
        })
        .collect();
    println!("race keys on {} masters", owners.len());
    assert!(owners.len() >= 2, "hot keys spread over the masters");

    // NOSCRIPT on a cluster: flush the scripts everywhere; the next check loads and counts once.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    let g = &gateways[0];
    assert_eq!(g.check(b"ns", &limit, 1).await.unwrap().remaining(), 9);
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["script", "flush"]), "OK");
    }
    assert_eq!(g.check(b"ns", &limit, 1).await.unwrap().remaining(), 8);
    assert_eq!(g.check(b"ns", &limit, 0).await.unwrap().remaining(), 8);
}

/// A slot moves between masters while checks run: the store follows ASK (during the migration)
/// and MOVED (after it), and the count goes on exactly, with the state that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_follow_a_slot_migration_with_ask_and_moved() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let store = store_on(&cluster, "migrate", PATIENT).await;
    migrate_while_checking(&cluster, &store, None).await;
}

/// The same, to a master added after the store connected, which owns no slot when the migration
/// starts (the client has no connection to it): ASK and MOVED are followed there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_follow_a_slot_migration_to_a_new_master() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = RedisCluster::start(3);
    let store = store_on(&cluster, "grow", PATIENT).await;
    let added = cluster.add_empty_master().port();
    migrate_while_checking(&cluster, &store, Some(added)).await;
}

/// A cluster whose nodes do not know their endpoint (`cluster-preferred-endpoint-type
/// unknown-endpoint`, for nodes behind an address they cannot see): `CLUSTER SLOTS` names no
/// host, and a redirection names only a port (`MOVED 3999 :6381`: the host the command went to).
/// A slot moves (its state with it); the next check is redirected so and is still answered,
/// from the moved state, by the slot's new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirection_to_an_unknown_endpoint_is_followed_on_the_same_host() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start_with_replicas(
        3,
        0,
        &["cluster-preferred-endpoint-type unknown-endpoint"],
    );
    let store = store_on(&cluster, "unknown-endpoint", PATIENT).await;
    let bucket = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    let key = &store.state_keys(b"mover", &bucket)[0];
    for left in (995..1_000).rev() {
        assert_eq!(
            store.check(b"mover", &bucket, 1).await.unwrap().remaining(),
            left
        );
    }

    // The slot and its one key move to another master, with no check in between.
    let slot = cluster.nodes()[0].cli(&["cluster", "keyslot", key]);
    let source = cluster.node_for(key);
    let (target, target_id) = start_migration(&cluster, &slot, source, None);
    let port = target.port().to_string();
    assert_eq!(
        source.cli(&["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS", key]),
        "OK"
    );
    for node in cluster.nodes() {
        assert_eq!(
            node.cli(&["cluster", "setslot", &slot, "node", &target_id]),
            "OK"
        );
    }
    // What Redis answers for the slot now: its new owner's port, and no host.
    let moved = source.cli(&["exists", key]);
    assert!(moved.contains(&format!("MOVED {slot} :{port}")), "{moved}");

    let before = moved_answers(source);
    // The store's client still sends the slot's checks to the source, which redirects them.
    for left in (990..995).rev() {
        let d = store.check(b"mover", &bucket, 1).await;
        assert_eq!(
            d.unwrap().remaining(),
            left,
            "counted on from the moved state"
        );
    }
    assert!(moved_answers(source) > before, "the checks were redirected");
    assert_eq!(target.cli(&["exists", key]), "1");
}

/// The `MOVED` answers `node` has given (`INFO errorstats`).
fn moved_answers(node: &redis_harness::RedisServer) -> u64 {
    node.cli(&["info", "errorstats"])
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_MOVED:count="))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Starts moving `slot` from `source` to the node on port `to` (by default another master):
/// `IMPORTING` on the target, `MIGRATING` on the source. Returns the target and its node id.
fn start_migration<'a>(
    cluster: &'a RedisCluster,
    slot: &str,
    source: &redis_harness::RedisServer,
    to: Option<u16>,
) -> (&'a redis_harness::RedisServer, String) {
    let target = cluster
        .nodes()
        .iter()
        .find(|n| to.map_or(n.port() != source.port(), |p| n.port() == p))
        .unwrap();
    let source_id = source.cli(&["cluster", "myid"]);
    let target_id = target.cli(&["cluster", "myid"]);
    assert_eq!(
        target.cli(&["cluster", "setslot", slot, "importing", &source_id]),
        "OK"
    );
    assert_eq!(
        source.cli(&["cluster", "setslot", slot, "migrating", &target_id]),
        "OK"
    );
    (target, target_id)
}

/// The keys of `slot` that `node` holds.
fn keys_in_slot(node: &redis_harness::RedisServer, slot: &str) -> u32 {
    node.cli(&["cluster", "countkeysinslot", slot])
        .parse()
        .unwrap()
}

/// Moves the slot of the user `mover` to the node on port `to` (by default another master)
/// while checking, and checks the counts and where the state is.
async fn migrate_while_checking(cluster: &RedisCluster, store: &RedisStore, to: Option<u16>) {
    let bucket = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    let gcra = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let key = &store.state_keys(b"mover", &bucket)[0];
    let gcra_key = &store.state_keys(b"mover", &gcra)[0];
    let slot = cluster.nodes()[0].cli(&["cluster", "keyslot", key]);
    assert_eq!(
        slot,
        cluster.nodes()[0].cli(&["cluster", "keyslot", gcra_key])
    );

    let mut expected = 1_000;
    let check = async |limit: &Limit| store.check(b"mover", limit, 1).await.unwrap();
    for _ in 0..5 {
        expected -= 1;
        assert_eq!(check(&bucket).await.remaining(), expected);
    }

    let source = cluster.node_for(key);
    let (target, target_id) = start_migration(cluster, &slot, source, to);
    // Keys of the slot each node holds (an importing node answers MOVED to a plain EXISTS).
    let count = |node: &redis_harness::RedisServer| keys_in_slot(node, &slot);
    assert_eq!((count(source), count(target)), (1, 0));

    // A key of the slot that the source does not hold: the source answers ASK, the client asks
    // the target, and the state is created there.
    assert_eq!(check(&gcra).await.remaining(), 999);
    assert_eq!((count(source), count(target)), (1, 1));

    // The bucket's state moves; checks follow it (ASK) and keep counting from where it was.
    let port = target.port().to_string();
    assert_eq!(
        source.cli(&["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS", key]),
        "OK"
    );
    for _ in 0..3 {
        expected -= 1;
        assert_eq!(check(&bucket).await.remaining(), expected);
    }
    assert_eq!((count(source), count(target)), (0, 2));

    // The migration ends: the slot belongs to the target (MOVED from now on).
    for node in cluster.nodes() {
        assert_eq!(
            node.cli(&["cluster", "setslot", &slot, "node", &target_id]),
            "OK"
        );
    }
    for _ in 0..3 {
        expected -= 1;
        assert_eq!(check(&bucket).await.remaining(), expected);
    }
    assert_eq!(check(&gcra).await.remaining(), 998);
    assert_eq!(target.cli(&["exists", key]), "1");
    assert_eq!((count(source), count(target)), (0, 2));

    // The MOVED answers made the client refresh its slot map: later checks go straight to the
    // new owner, not through a redirection each.
    let moved = moved_answers;
    let before = moved(source);
    for _ in 0..20 {
        expected -= 1;
        assert_eq!(check(&bucket).await.remaining(), expected);
    }
    println!(
        "MOVED answers: {before} before, {} after 20 more checks",
        moved(source)
    );
    assert_eq!(moved(source), before, "checks go to the slot's new owner");
}

/// The sliding log, whose state is several keys (a hash and a list per quota), while its slot
/// migrates. A check whose every entry of a list has slid out admits on the source with its keys
/// intact: the script writes the list before it trims it, so that the list is never empty, and so
/// never deleted, mid-script (a migrating node refuses a script's command on a key it does not
/// hold, which cut the write phase in two and left the user's keys split until the migration
/// ended). A user with no state in the slot cannot be checked until the migration ends, as Redis
/// answers `TRYAGAIN` to a command on several keys that the importing node does not all hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_keys_stay_whole_through_a_slot_migration() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let clock = ManualClock::new();
    let store = manual(RedisStore::cluster(cluster.urls()), &clock)
        .prefix(unique_prefix("logmove"))
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let log = Limit::new(
        Algorithm::SlidingLog,
        [
            Quota::per_second(10).unwrap(),
            Quota::per_hour(1_000).unwrap(),
        ],
    )
    .unwrap();
    let keys = store.state_keys(b"mover", &log);
    assert_eq!(keys.len(), 3, "the hash and one list per quota");
    let check = async |limit: &Limit| store.check(b"mover", limit, 1).await;
    for _ in 0..3 {
        assert!(check(&log).await.unwrap().is_allowed());
    }

    let slot = cluster.nodes()[0].cli(&["cluster", "keyslot", &keys[0]]);
    let source = cluster.node_for(&keys[0]);
    let (target, target_id) = start_migration(&cluster, &slot, source, None);
    let count = |node: &redis_harness::RedisServer| keys_in_slot(node, &slot);
    assert_eq!((count(source), count(target)), (3, 0));

    // Every entry of the per-second list has slid out; the hourly list and the hash live on.
    clock.advance(Duration::from_secs(2));
    let d = check(&log).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!((count(source), count(target)), (3, 0), "no key lost");
    let hourly = source.cli(&["llen", &keys[2]]);
    assert_eq!(
        hourly, "2",
        "the hourly list: the first three merged, then this one"
    );

    // The keys move together; checks follow them (ASK) and count on from where they were.
    let port = target.port().to_string();
    let mut migrate = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(source.cli(&migrate), "OK");
    assert_eq!((count(source), count(target)), (0, 3));
    clock.advance(Duration::from_secs(2));
    assert!(check(&log).await.unwrap().is_allowed());

    // A user with no state in the slot (here, `mover` under another limit): the source answers
    // ASK, the importing target TRYAGAIN (it holds none of the keys), until the check's timeout.
    let other = Limit::new(
        Algorithm::SlidingLog,
        [Quota::per_second(5).unwrap(), Quota::per_hour(500).unwrap()],
    )
    .unwrap();
    assert_eq!(
        cluster.nodes()[0].cli(&["cluster", "keyslot", &store.state_keys(b"mover", &other)[0]]),
        slot
    );
    let err = check(&other).await.unwrap_err();
    assert!(err.is_unavailable(), "TRYAGAIN until the timeout: {err:?}");

    for node in cluster.nodes() {
        assert_eq!(
            node.cli(&["cluster", "setslot", &slot, "node", &target_id]),
            "OK"
        );
    }
    assert!(check(&other).await.unwrap().is_allowed(), "after the move");
    // The count went on across the move: one admitted at this instant already, so 9 more of the
    // per-second quota's 10.
    let mut allowed = 0;
    for _ in 0..20 {
        if check(&log).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 9, "the per-second quota, counted on the target");
    assert_eq!((count(source), count(target)), (0, 6));
}

/// A proxy in front of `node`, whose port the node announces: clients reach that master only
/// through the proxy once every node of `cluster` has learnt the port.
async fn proxied(cluster: &RedisCluster, node: &redis_harness::RedisServer) -> Proxy {
    let proxy = Proxy::start(node.port());
    let bus = (node.port() + 10_000).to_string();
    assert_eq!(
        node.cli(&["config", "set", "cluster-announce-bus-port", &bus]),
        "OK"
    );
    let announced = proxy.port().to_string();
    assert_eq!(
        node.cli(&["config", "set", "cluster-announce-port", &announced]),
        "OK"
    );
    let id = node.cli(&["cluster", "myid"]);
    let through_proxy = format!("127.0.0.1:{announced}@");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cluster.nodes().iter().all(|n| {
        n.cli(&["cluster", "nodes"])
            .lines()
            .any(|l| l.starts_with(&id) && l.contains(&through_proxy))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "every node learns the new port"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy
}

/// A store on `cluster` seeded by its second node (not the first, which [`proxied`] puts behind
/// a proxy), with a 10 s response timeout, its keys under a prefix made from `name`.
async fn seeded_past(cluster: &RedisCluster, name: &str) -> RedisStore {
    RedisStore::cluster([cluster.urls()[1].clone()])
        .prefix(unique_prefix(name))
        .response_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap()
}

/// A user whose state under `limit` lives on the master `node`.
fn user_of(
    cluster: &RedisCluster,
    store: &RedisStore,
    limit: &Limit,
    node: &redis_harness::RedisServer,
) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|u| {
            cluster
                .node_for(&store.state_keys(u.as_bytes(), limit)[0])
                .port()
                == node.port()
        })
        .unwrap()
}

/// Scripts flushed again on a master while a check reloads its script there: each `NOSCRIPT`
/// proves the script did not run, so the check loads it again on that master and is answered,
/// counted once, as on a standalone server (`noscript.rs`). Through a proxy in front of the
/// master that delays every chunk by 100 ms, so that a flush lands after each load has run and
/// before the check sent after it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_flushed_again_on_a_master_during_a_reload_are_loaded_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = std::sync::Arc::new(RedisCluster::start(3));
    let node = &cluster.nodes()[0];
    let proxy = proxied(&cluster, node).await;
    let store = seeded_past(&cluster, "noscript-again").await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    let user = user_of(&cluster, &store, &limit, node);
    assert_eq!(
        store
            .check(user.as_bytes(), &limit, 1)
            .await
            .unwrap()
            .remaining(),
        9
    );
    assert_eq!(node.cli(&["script", "flush"]), "OK");
    let loads = script_loads(node);
    proxy.set_latency(Duration::from_millis(100));
    // After each of the check's first two loads on the master, a flush there.
    let flusher = std::thread::spawn({
        let cluster = std::sync::Arc::clone(&cluster);
        move || {
            let node = &cluster.nodes()[0];
            for n in 1..=2 {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while script_loads(node) < loads + n {
                    assert!(std::time::Instant::now() < deadline, "load {n} never came");
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(node.cli(&["script", "flush"]), "OK");
            }
        }
    });
    let before = evalsha_stats(node);
    let d = store.check(user.as_bytes(), &limit, 1).await;
    flusher.join().unwrap();
    let d = d.unwrap();
    assert_eq!(d.remaining(), 8, "counted exactly once: {d:?}");
    assert_eq!(script_loads(node), loads + 3, "three loads");
    let after = evalsha_stats(node);
    assert_eq!(after.2 - before.2, 3, "three NOSCRIPT answers");
    assert_eq!(after.0 - before.0, 4, "and the one that ran");
}

/// One check loads its script at most `MAX_LOADS` (3) times in all, on its slot's master and on
/// the node a redirection sends it to together. Here its slot's master has lost its scripts; the
/// slot moves to another master right after the check loaded the script there, and that master's
/// scripts are flushed after each of the check's loads on it: the third load is the last, and
/// the check then fails with `NOSCRIPT`, nothing counted. (The side connection to the new owner
/// kept a count of its own, and the check made a fourth load there and was answered.) Through
/// proxies that delay every chunk by 100 ms, so that each flush lands between a load and the
/// check sent after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_check_loads_its_script_at_most_three_times_across_a_redirection() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = std::sync::Arc::new(RedisCluster::start(3));
    let (a, b) = (&cluster.nodes()[0], &cluster.nodes()[1]);
    let proxy_a = proxied(&cluster, a).await;
    let proxy_b = proxied(&cluster, b).await;
    let store = store_on(&cluster, "loads-across", Duration::from_secs(10)).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    // A user with no state yet, so that its slot can be handed over as it is.
    let user = user_of(&cluster, &store, &limit, a);
    let slot = a.cli(&[
        "cluster",
        "keyslot",
        &store.state_keys(user.as_bytes(), &limit)[0],
    ]);
    assert_eq!(a.cli(&["script", "flush"]), "OK");
    assert_eq!(b.cli(&["script", "flush"]), "OK");
    let (loads_a, loads_b) = (script_loads(a), script_loads(b));
    proxy_a.set_latency(Duration::from_millis(100));
    proxy_b.set_latency(Duration::from_millis(100));
    let mover = std::thread::spawn({
        let cluster = std::sync::Arc::clone(&cluster);
        move || {
            let (a, b) = (&cluster.nodes()[0], &cluster.nodes()[1]);
            let wait_for = |node: &redis_harness::RedisServer, loads: u64| {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while script_loads(node) < loads {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "load {loads} never came"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            wait_for(a, loads_a + 1);
            give_slot(&cluster, &slot, b);
            for n in 1..=2 {
                wait_for(b, loads_b + n);
                assert_eq!(b.cli(&["script", "flush"]), "OK");
            }
        }
    });
    let failed = store.check(user.as_bytes(), &limit, 1).await;
    mover.join().unwrap();
    let loads = (script_loads(a) - loads_a, script_loads(b) - loads_b);
    assert_eq!(loads, (1, 2), "loads on the old and the new owner");
    assert!(
        matches!(&failed, Err(e) if e.to_string().contains("NoScript")),
        "{failed:?}"
    );
    proxy_a.set_latency(Duration::ZERO);
    proxy_b.set_latency(Duration::ZERO);
    let d = store.check(user.as_bytes(), &limit, 1).await.unwrap();
    assert_eq!(d.remaining(), 9, "the failed check counted nothing: {d:?}");
}

/// A check whose reply is lost after its script ran on the master (the connection drops while
/// the reply is on its way) fails, and is not sent again: the master counted it once, and once
/// only. A client that re-sent it on the new connection would spend two tokens for one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_is_lost_fails_and_counts_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let node = &cluster.nodes()[0];
    let proxy = proxied(&cluster, node).await;
    let store = seeded_past(&cluster, "lost").await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let user = user_of(&cluster, &store, &limit, node);
    let check = |cost| store.check(user.as_bytes(), &limit, cost);
    assert_eq!(check(1).await.unwrap().remaining(), 99);

    // The master's replies now wait in the proxy. Once the script has run on the master (its
    // call count moves), its reply is held there: cut the connection, and the reply is lost.
    let before = node.script_calls();
    proxy.set_hold_replies(true);
    let lost = tokio::spawn(check(1));
    let deadline = std::time::Instant::now() + Duration::from_secs(9);
    while node.script_calls() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the check reaches the master"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.drop_connections();
    proxy.set_hold_replies(false);
    let outcome = lost.await.unwrap();
    assert!(
        outcome.is_err(),
        "the reply was lost, so the check cannot know its decision: {outcome:?}"
    );

    // The master ran that check once: one token spent, not two.
    let peek = loop {
        match check(0).await {
            Ok(d) => break d,
            // The connection to the proxied master is being re-opened.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert_eq!(peek.remaining(), 98);
    assert_eq!(
        node.script_calls(),
        before + 1 + 1,
        "the lost check and the peek"
    );
}

/// A master dies and its replica takes over: checks of its slots fail (the failure policy decides
/// those requests) until the cluster has failed over, then succeed by themselves, and the count
/// goes on from the state the replica had (acknowledged by the replica before the kill), once per
/// check. Checks of other masters' slots go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_recover_after_a_master_fails_over_to_its_replica() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = RedisCluster::start_with_replicas(3, 1, &["cluster-node-timeout 1000"]);
    let store = store_on(&cluster, "failover", Duration::from_secs(2)).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let owner = |cluster: &RedisCluster, user: &str| master_of(cluster, &store, &limit, user);
    let victim = owner(&cluster, "victim");
    let bystander = (0..)
        .map(|i| format!("bystander-{i}"))
        .find(|u| owner(&cluster, u) != victim)
        .unwrap();
    for i in 1..=10 {
        let d = store.check(b"victim", &limit, 1).await.unwrap();
        assert_eq!(d.remaining(), 100 - i);
        store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    }
    let master = cluster.nodes().iter().find(|n| n.port() == victim).unwrap();
    // The replica has the writes.
    master.wait_replicated();

    cluster.kill_node(victim);
    let killed = std::time::Instant::now();
    let mut failed = 0;
    let recovered = loop {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "checks recover after the failover"
        );
        match store.check(b"victim", &limit, 1).await {
            Ok(d) => break d,
            Err(e) => {
                failed += 1;
                assert!(
                    e.is_unavailable() || matches!(e, ratelimit_redis::RedisStoreError::Redis(_)),
                    "{e}"
                );
                // Another master's users are served meanwhile.
                if failed == 1 {
                    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(failed > 0, "the master's death is visible, not hidden");
    // A failed check may or may not have run on the new master before its reply was lost, but
    // none of them ran twice: the count goes on from the replica's state, at most one per check.
    let spent = 100 - 10 - recovered.remaining();
    println!(
        "recovered {:?} after the kill, {failed} checks failed meanwhile, {spent} tokens spent",
        killed.elapsed()
    );
    assert!(
        (1..=failed + 1).contains(&spent),
        "{spent} tokens for 1 answered and {failed} failed checks"
    );
    let new_owner = owner(&cluster, "victim");
    assert_ne!(new_owner, victim);
    for i in 1..=5 {
        let d = store.check(b"victim", &limit, 1).await.unwrap();
        assert_eq!(d.remaining(), recovered.remaining() - i);
    }
}

/// A store given one seed node whose master then dies: the other masters' keys stay served
/// throughout (the cluster client mends its link to the dead node by itself), and the dead
/// master's keys come back once its replica takes over. Replacing the whole connection on the
/// first I/O error would make a new one from the seed list alone, all dead, and leave every key
/// of every master without a connection until the seed came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_seed_master_leaves_the_other_masters_served() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = RedisCluster::start_with_replicas(3, 1, &["cluster-node-timeout 1000"]);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    // The seed: a master, found through a store that knows every node.
    let probe = store_on(&cluster, "seed-probe", PATIENT).await;
    let seed = master_of(&cluster, &probe, &limit, "victim");
    let seed_url = cluster
        .nodes()
        .iter()
        .find(|n| n.port() == seed)
        .unwrap()
        .url();
    let store = RedisStore::cluster([seed_url])
        .prefix(unique_prefix("one-seed"))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let owner = |cluster: &RedisCluster, user: &str| master_of(cluster, &store, &limit, user);
    assert_eq!(owner(&cluster, "victim"), seed);
    let bystanders: Vec<String> = (0..)
        .map(|i| format!("bystander-{i}"))
        .filter(|u| owner(&cluster, u) != seed)
        .take(4)
        .collect();
    for _ in 0..5 {
        store.check(b"victim", &limit, 1).await.unwrap();
        for b in &bystanders {
            store.check(b.as_bytes(), &limit, 1).await.unwrap();
        }
    }
    let master = cluster.nodes().iter().find(|n| n.port() == seed).unwrap();
    master.wait_replicated();

    cluster.kill_node(seed);
    let killed = std::time::Instant::now();
    let (mut victim_failed, mut bystander_failed, mut bystander_checks) = (0, 0, 0);
    loop {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the dead master's keys come back after the failover"
        );
        let victim = store.check(b"victim", &limit, 1).await;
        for b in &bystanders {
            bystander_checks += 1;
            if let Err(e) = store.check(b.as_bytes(), &limit, 1).await {
                bystander_failed += 1;
                println!("bystander {b}: {e}");
            }
        }
        match victim {
            Ok(_) => break,
            Err(_) => victim_failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "recovered {:?} after the kill; {victim_failed} of the dead master's checks failed, \
         {bystander_failed} of {bystander_checks} of the other masters'",
        killed.elapsed()
    );
    assert!(victim_failed > 0, "the master's death is visible");
    assert_eq!(
        bystander_failed, 0,
        "the other masters' keys were not served throughout"
    );
    // Served after the failover too, by the connection made from one dead seed.
    for b in &bystanders {
        store.check(b.as_bytes(), &limit, 1).await.unwrap();
    }
    for _ in 0..3 {
        store.check(b"victim", &limit, 1).await.unwrap();
    }
}

/// A master that lost its scripts (restarted, failed over) answers `NOSCRIPT`; the script is
/// loaded on that master alone, not on every node, so one shard being down (a cluster serving
/// without full coverage) does not keep the healthy master from answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_on_the_master_that_lost_them_while_another_is_down() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster =
        RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let store = store_on(&cluster, "noscript-partial", PATIENT).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    let owner = |cluster: &RedisCluster, user: &str| master_of(cluster, &store, &limit, user);
    let alive = owner(&cluster, "alive");
    let down = cluster
        .nodes()
        .iter()
        .map(|n| n.port())
        .find(|&p| p != alive)
        .unwrap();
    assert_eq!(
        store.check(b"alive", &limit, 1).await.unwrap().remaining(),
        9
    );
    cluster.kill_node(down);
    let master = cluster.nodes().iter().find(|n| n.port() == alive).unwrap();
    assert_eq!(master.cli(&["script", "flush"]), "OK");
    let d = store.check(b"alive", &limit, 1).await.unwrap();
    assert_eq!(d.remaining(), 8, "loaded on its master and counted once");
    assert_eq!(
        store.check(b"alive", &limit, 0).await.unwrap().remaining(),
        8
    );
}

/// More checks of a silent master's keys waiting at once than there are turns into the cluster
/// client (16), each for up to its response timeout, do not keep the other masters' checks out:
/// a bystander's check takes a scout's turn after 5 ms, and its answer lets go the turns of the
/// victim's checks sent before it. (With each turn held until the answer, the bystander's first
/// check waited behind 16 of the victim's until their timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_waiting_on_a_silent_master_leave_the_others_served() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start_with_replicas(3, 0, &["cluster-node-timeout 30000"]);
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix("silent-many"))
        .pool_size(1)
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    let (victim, bystander) = victim_and_bystander(&cluster, &store, &limit);
    store.check(b"victim", &limit, 1).await.unwrap();
    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    let master = cluster.nodes().iter().find(|n| n.port() == victim).unwrap();
    master.pause();
    let waiting: Vec<_> = (0..20)
        .map(|_| {
            let (store, limit) = (store.clone(), limit.clone());
            tokio::spawn(async move { store.check(b"victim", &limit, 1).await })
        })
        .collect();
    // Time for the victim's checks to be sent (the last 4 after 5 ms, as scouts), well within
    // their response timeout.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..20 {
        let answer = tokio::time::timeout(
            Duration::from_millis(500),
            store.check(bystander.as_bytes(), &limit, 1),
        )
        .await;
        assert!(
            matches!(answer, Ok(Ok(_))),
            "bystander check {i}, with 20 of the silent master's in flight: {answer:?}"
        );
    }
    let still_waiting = waiting.iter().filter(|w| !w.is_finished()).count();
    master.resume();
    assert_eq!(
        still_waiting, 20,
        "the victim's checks waited for the paused master"
    );
    for w in waiting {
        let answer = w.await.unwrap();
        assert!(answer.is_ok(), "once the master answered again: {answer:?}");
    }
}

/// A master that goes silent without closing its connections (SIGSTOP here; power loss or a
/// partition in production) while the other masters answer: the answers from the others must not
/// hide it. A new cluster connection is tried (the `PING` probe, to every master, gets no answer),
/// so that it can find a new topology; while the master is silent and still a master, a new one
/// cannot reach it and is not installed, and the old one is kept: checks of the other masters are
/// answered all along, and the silent master's come back once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_gets_a_new_connection_tried_while_the_others_stay_served() {
    let _one = ONE_AT_A_TIME.lock().await;
    // A node timeout far above the 4 s pause: the other masters must not mark the paused one as
    // failed (a failure mark lifts only after twice the node timeout, and its checks would not
    // come back within the test's 10 s).
    let cluster = RedisCluster::start_with_replicas(3, 0, &["cluster-node-timeout 30000"]);
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix("silent-master"))
        .pool_size(1)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    let (victim, bystander) = victim_and_bystander(&cluster, &store, &limit);
    let other = cluster
        .nodes()
        .iter()
        .find(|n| n.port() == master_of(&cluster, &store, &limit, &bystander))
        .unwrap();
    let received = || connections_received(other);
    store.check(b"victim", &limit, 1).await.unwrap();
    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    let before = received();
    let master = cluster.nodes().iter().find(|n| n.port() == victim).unwrap();
    master.pause();
    // Four seconds of checks of both users, the victim's given up after 50 ms as the tower layer
    // does; the bystander's answers arrive all along, and still in the last 1.5 s, well after
    // the silent connection was probed (300 ms of silence, then a `PING` unanswered for 300 ms)
    // and a new connection tried (which cannot be made while a node is silent, within the
    // connect timeout of 1 s).
    let started = std::time::Instant::now();
    let (mut asked, mut answered, mut answered_late) = (0, 0, 0);
    // Misses in a row, and the most of them: a stall of a second (a new connection's connect
    // timeout) would cost two or more in a row; a passing hiccup of a loaded machine, one.
    let (mut missed_in_a_row, mut most_in_a_row) = (0, 0);
    while started.elapsed() < Duration::from_secs(4) {
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), store.check(b"victim", &limit, 1))
                .await;
        assert!(!matches!(gave_up, Ok(Ok(_))), "a paused master answered");
        asked += 1;
        if let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_millis(300),
            store.check(bystander.as_bytes(), &limit, 1),
        )
        .await
        {
            answered += 1;
            missed_in_a_row = 0;
            if started.elapsed() > Duration::from_millis(2_500) {
                answered_late += 1;
            }
        } else {
            missed_in_a_row += 1;
            most_in_a_row = most_in_a_row.max(missed_in_a_row);
        }
    }
    master.resume();
    println!(
        "{answered} of {asked} bystander checks answered within 300 ms while the master was \
         paused, {answered_late} in the last 1.5 s"
    );
    // All answered within 300 ms in every run here (77 of 77, in about 2 ms each).
    assert!(
        most_in_a_row <= 1,
        "the other masters were served all along: {answered} of {asked} within 300 ms, \
         {most_in_a_row} missed in a row"
    );
    assert!(
        answered_late > 0,
        "the other masters were still served once a new connection could not be made"
    );
    // `redis-cli` counts too: one connection per call of `received`.
    assert!(
        received() > before + 1,
        "a new cluster connection was tried (a new connection to the other master)"
    );
    // Back: the victim's checks are answered again.
    let back = std::time::Instant::now();
    while store.check(b"victim", &limit, 1).await.is_err() {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the master's checks came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Connections a node has accepted so far (`redis-cli` counts one for each call).
fn connections_received(node: &redis_harness::RedisServer) -> u64 {
    common::connections_received(&node.cli(&["info", "stats"]))
}

/// A dead master, not failed over: its keys' checks fail, at once, and cost the other masters
/// nothing. A check of its keys reaches another node (the client has no connection to the dead
/// one), which redirects it (`MOVED`) to the dead master. Following that redirection through
/// the cluster client, which has no connection to the node, made the client rebuild every
/// connection from its seed list, at every such check: a storm of new connections to every
/// healthy node, and every key of the gateway stalled while each rebuild ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_masters_checks_do_not_reconnect_the_whole_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (mut cluster, store, limit, victim, bystander) =
        victim_to_lose("dead-master-storm", Duration::from_secs(2)).await;
    let other = master_of(&cluster, &store, &limit, &bystander);

    cluster.kill_node(victim);
    let other = cluster.nodes().iter().find(|n| n.port() == other).unwrap();
    let before = connections_received(other);
    let (mut victim_failed, mut bystander_answered) = (0, 0);
    let (mut slowest, mut slowest_failure) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..200 {
        let started = std::time::Instant::now();
        if store.check(b"victim", &limit, 1).await.is_err() {
            victim_failed += 1;
        }
        slowest_failure = slowest_failure.max(started.elapsed());
        let started = std::time::Instant::now();
        store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
        slowest = slowest.max(started.elapsed());
        bystander_answered += 1;
    }
    // Less one for the `redis-cli` call that reads the count.
    let made = connections_received(other) - before - 1;
    println!(
        "{victim_failed} of 200 checks of the dead master's key failed, the slowest in \
         {slowest_failure:?}; {bystander_answered} of the other master's answered, the slowest \
         in {slowest:?}; {made} new connections to it"
    );
    assert_eq!(victim_failed, 200, "the dead master's checks fail");
    assert!(
        made <= 4,
        "{made} new connections to a healthy master while another was dead: the cluster \
         connection was rebuilt from its seeds"
    );
    // At once, not at the 2 s response timeout (a few milliseconds here; the bound leaves room
    // for a loaded machine): neither the dead master's checks nor the others' waited on it.
    let at_once = Duration::from_millis(500);
    assert!(
        slowest_failure < at_once,
        "a dead master's check failed in {slowest_failure:?}"
    );
    assert!(slowest < at_once, "a bystander's check took {slowest:?}");
}

/// A master that goes silent (SIGSTOP here; a partition or a frozen VM in production) and stays
/// so while its replica takes over: its keys come back on the new master. Nothing redirects them
/// (the silent node answers nothing), so only a new cluster connection, whose slot map comes from
/// the nodes that answer, finds the new master; it must be made while the old master is still
/// silent. The other masters' keys are served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_masters_keys_come_back_once_its_replica_takes_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start_with_replicas(3, 1, &["cluster-node-timeout 1000"]);
    let store = store_on(&cluster, "silent-failover", Duration::from_millis(300)).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(1_000).unwrap()).unwrap();
    let (victim, bystander) = victim_and_bystander(&cluster, &store, &limit);
    store.check(b"victim", &limit, 1).await.unwrap();
    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    let master = cluster.nodes().iter().find(|n| n.port() == victim).unwrap();
    master.wait_replicated();

    master.pause();
    let paused = std::time::Instant::now();
    let (mut victim_failed, mut bystander_failed, mut bystander_checks) = (0, 0, 0);
    let back = loop {
        if paused.elapsed() > Duration::from_secs(20) {
            break None;
        }
        let victim = store.check(b"victim", &limit, 1).await;
        for _ in 0..5 {
            bystander_checks += 1;
            if let Err(e) = store.check(bystander.as_bytes(), &limit, 1).await {
                bystander_failed += 1;
                println!("bystander at {:?}: {e}", paused.elapsed());
            }
        }
        match victim {
            Ok(d) => break Some((paused.elapsed(), d)),
            Err(_) => victim_failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    master.resume();
    println!(
        "victim back after {:?} ({victim_failed} checks failed); {bystander_failed} of \
         {bystander_checks} bystander checks failed",
        back.as_ref().map(|b| b.0)
    );
    let (_, d) = back.expect("the silent master's keys came back on its replica within 20 s");
    assert_eq!(d.remaining(), 998, "the replica had the master's writes");
    assert!(victim_failed > 0, "the master's silence is visible");
    // A few may time out as the cluster fails over (the nodes' gossip and election, on two
    // cores shared with six servers): most are answered.
    assert!(
        bystander_failed * 4 <= bystander_checks,
        "{bystander_failed} of {bystander_checks} of the other masters' checks failed"
    );
    for _ in 0..3 {
        store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
        store.check(b"victim", &limit, 1).await.unwrap();
    }
}

/// A master down for good, and not failed over (it has no replica): the cluster still names it,
/// so no new connection can reach it, and each replacement tried is let go. They are spaced out
/// (a response timeout, then three, then seven...), rather than one whole new cluster connection
/// every two response timeouts for as long as the master stays down, while the other masters'
/// keys are served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacements_that_cannot_reach_a_dead_master_are_spaced_out() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster =
        RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let store = store_on(&cluster, "dead-master-backoff", Duration::from_millis(200)).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100_000).unwrap()).unwrap();
    let (victim, bystander) = victim_and_bystander(&cluster, &store, &limit);
    let other = master_of(&cluster, &store, &limit, &bystander);
    store.check(bystander.as_bytes(), &limit, 1).await.unwrap();
    cluster.kill_node(victim);
    let other = cluster.nodes().iter().find(|n| n.port() == other).unwrap();
    let before = connections_received(other);
    let started = std::time::Instant::now();
    let (mut answered, mut failed) = (0, 0);
    while started.elapsed() < Duration::from_secs(6) {
        match store.check(bystander.as_bytes(), &limit, 1).await {
            Ok(_) => answered += 1,
            Err(_) => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let made = connections_received(other) - before - 1;
    println!(
        "{made} new connections to a healthy master in 6 s; {answered} bystander checks \
         answered, {failed} failed"
    );
    // Tried at about 0.4, 1.0, 2.0, 3.8 s (and 7.2): five in one run. Without the spacing, 27.
    assert!(made <= 8, "{made} replacements tried in 6 s");
    assert!(made >= 1, "a replacement was tried");
    assert_eq!(failed, 0, "the other masters' keys were served throughout");
}

/// A 3-master cluster, a store on it, a token bucket of `per_day`, and the state key of the user
/// `mover` under it (which holds no key yet).
async fn mover(name: &str, per_day: u64) -> (RedisCluster, RedisStore, Limit, String) {
    let cluster = RedisCluster::start(3);
    let store = store_on(&cluster, name, PATIENT).await;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(per_day).unwrap()).unwrap();
    let key = store.state_keys(b"mover", &limit)[0].clone();
    (cluster, store, limit, key)
}

/// Gives the slot of `key` (which holds no key) to a master other than its own, and returns that
/// master.
fn give_mover_away<'a>(cluster: &'a RedisCluster, key: &str) -> &'a redis_harness::RedisServer {
    let slot = cluster.nodes()[0].cli(&["cluster", "keyslot", key]);
    let source = cluster.node_for(key);
    let target = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != source.port())
        .unwrap();
    give_slot(cluster, &slot, target);
    target
}

/// Gives `slot`, which holds no key, to `target`: its config epoch made the cluster's highest
/// first, so that no node takes the slot back on a late message from its old owner (with the
/// epochs left as they were, a check was once redirected back and forth between the two until it
/// gave up, under CPU load).
fn give_slot(cluster: &RedisCluster, slot: &str, target: &redis_harness::RedisServer) {
    let bumped = target.cli(&["cluster", "bumpepoch"]);
    assert!(
        bumped.starts_with("BUMPED") || bumped.starts_with("STILL"),
        "{bumped}"
    );
    let target_id = target.cli(&["cluster", "myid"]);
    let others = cluster.nodes().iter().filter(|n| n.port() != target.port());
    for node in std::iter::once(target).chain(others) {
        assert_eq!(
            node.cli(&["cluster", "setslot", slot, "node", &target_id]),
            "OK"
        );
    }
}

/// A slot moves to another master while many checks of it are in flight: every one is
/// redirected (`MOVED`) before the client's slot map catches up, and each goes over the store's
/// side connection to the new owner. One connection is made for them all, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_redirected_at_once_share_one_new_connection() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, store, limit, key) = mover("redirect-burst", 1_000).await;
    let key = &key;
    // The slot holds no key yet: it can be given to the target at once.
    let target = give_mover_away(&cluster, key);
    let before = connections_received(target);
    let checks = (0..64).map(|_| store.check(b"mover", &limit, 1));
    let decisions = join_all(checks).await;
    let made = connections_received(target) - before - 1;
    let mut remaining: Vec<u64> = decisions
        .into_iter()
        .map(|d| d.unwrap().remaining())
        .collect();
    remaining.sort_unstable();
    println!("{made} new connections to the slot's new owner for 64 redirected checks");
    assert_eq!(
        remaining,
        (936..1_000).collect::<Vec<u64>>(),
        "each counted once"
    );
    assert_eq!(target.cli(&["exists", key]), "1");
    assert_eq!(made, 1, "connections made for the redirected checks");
}

/// A burst of checks larger than the cluster client's task can poll in one go (its cooperative
/// budget), sent as a slot has just moved: every check is answered. Without the store's limit on
/// the commands in the client at once, the `MOVED` answers started a slot-map refresh that waited
/// for a lock held by commands the client would not poll until the refresh ended; all but about
/// 20 of the 256 checks timed out, in every run (see `src/turns.rs`). On a
/// current-thread runtime every check is queued before the client's task runs, which makes the
/// burst arrive at once every time.
#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_redirected_checks_does_not_stall_the_cluster_client() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, store, limit, key) = mover("redirect-stall", 10_000).await;
    let source = cluster.node_for(&key);
    let target = give_mover_away(&cluster, &key);
    let checks = (0..256).map(|_| store.check(b"mover", &limit, 1));
    let decisions = join_all(checks).await;
    let failed: Vec<String> = decisions
        .iter()
        .filter_map(|d| d.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 256 checks failed, the first with {:?}",
        failed.len(),
        failed.first()
    );
    let mut remaining: Vec<u64> = decisions
        .into_iter()
        .map(|d| d.unwrap().remaining())
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (10_000 - 256..10_000).collect::<Vec<u64>>(),
        "each counted once"
    );
    // And the connection serves the next check over the refreshed slot map: straight to the new
    // owner, not redirected by the old one (whose `MOVED` counts as a rejected call).
    let evalsha = |node: &redis_harness::RedisServer| {
        let stats = node.cli(&["info", "commandstats"]);
        let line = stats.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
        line.unwrap_or_default().to_owned()
    };
    let (at_source, at_target) = (evalsha(source), evalsha(target));
    let next = store.check(b"mover", &limit, 1).await.unwrap();
    assert_eq!(next.remaining(), 10_000 - 257);
    assert_eq!(evalsha(source), at_source, "the old owner was asked");
    assert_ne!(evalsha(target), at_target, "the new owner was not asked");
}

/// A master gone from the network (its host down: connection attempts get no answer, where a
/// killed process on a live host refuses them at once). Until its replica takes over, every check
/// of its keys is redirected to it, and each redirection makes the cluster client refresh its
/// slot map, holding every other command while it tries to connect to that master. The other
/// masters' checks must still be answered: the client's connect timeout is kept to a third of
/// the response timeout (with the default 1 s, above the 500 ms here, 3 of 7 of them failed). A
/// check may wait for two refreshes, the one under way and the next, started by a `MOVED`
/// answered before its own: at half the response timeout, with four of the dead master's checks
/// at a time (a master has many users), 2 checks failed in each of four runs, and one in 291 with
/// one at a time, in CI. (At a response timeout of 1.5 s, tried on 2026-12-06, each bystander's
/// check waited its two refreshes, 1 s, and too few were made in 3 s to tell.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_gone_from_the_network_leaves_the_other_masters_answering() {
    let _one = ONE_AT_A_TIME.lock().await;
    // The default connect timeout (1 s), longer than the response timeout.
    let (mut cluster, store, limit, victim, bystander) =
        victim_to_lose("unreachable-master", Duration::from_millis(500)).await;
    cluster.kill_node(victim);
    // The master's port swallows connection attempts, as a host gone from the network does.
    let hole = redis_harness::blackhole::Blackhole::on(victim);
    let start = std::time::Instant::now();
    let during = Duration::from_secs(3);
    // Four of its users at a time, each checking again once answered.
    let victims: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            let limit = limit.clone();
            tokio::spawn(async move {
                let mut failed = 0;
                while start.elapsed() < during {
                    failed += usize::from(store.check(b"victim", &limit, 1).await.is_err());
                }
                failed
            })
        })
        .collect();
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    while start.elapsed() < during {
        let sent = std::time::Instant::now();
        match store.check(bystander.as_bytes(), &limit, 1).await {
            Ok(_) => answered.push(sent.elapsed()),
            Err(e) => failed.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut victims_failed = 0;
    for victim in victims {
        victims_failed += victim.await.unwrap();
    }
    answered.sort_unstable();
    println!(
        "other master: {} answered (median {:?}, slowest {:?}), {} failed; dead master: {} \
         checks failed",
        answered.len(),
        answered.get(answered.len() / 2),
        answered.last(),
        failed.len(),
        victims_failed
    );
    assert!(victims_failed > 0, "the dead master's checks fail");
    assert!(
        failed.is_empty(),
        "{} of the other master's checks failed, the first with {:?}",
        failed.len(),
        failed.first()
    );
    assert!(answered.len() > 10);
    drop(hole);
}

/// A cluster store's failure domains are ranges of 256 hash slots, computed from the key as the
/// cluster computes the slot of every Redis key of its checks (`CLUSTER KEYSLOT`); a lazy store
/// knows them before it is built, and `Coalescing` passes them on. A standalone store has one.
#[tokio::test]
async fn failure_domains_are_ranges_of_the_keys_hash_slots() {
    use ratelimit_core::Store;
    use ratelimit_redis::CLUSTER_FAILURE_DOMAINS;

    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let store = store_on(&cluster, "domains", PATIENT).await;
    let lazy = RedisStore::cluster(cluster.urls())
        .build_lazy(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(store.failure_domains(), CLUSTER_FAILURE_DOMAINS);
    assert_eq!(lazy.failure_domains(), CLUSTER_FAILURE_DOMAINS);
    let log = Limit::new(
        Algorithm::SlidingLog,
        [
            Quota::per_second(5).unwrap(),
            Quota::per_minute(50).unwrap(),
        ],
    )
    .unwrap();
    let mut keys: Vec<Vec<u8>> = [
        &b"user:1"[..],
        b"10.0.0.1",
        b"",
        b"{braces}",
        b"api\x00client-7",
        "clé".as_bytes(),
        &[b'x'; 500],
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    keys.extend((0..200).map(|i| format!("k{i}").into_bytes()));
    let mut seen = std::collections::HashSet::new();
    for key in &keys {
        let key = key.as_slice();
        let domain = store.failure_domain(key);
        assert_eq!(lazy.failure_domain(key), domain, "{key:?}");
        for state_key in store.state_keys(key, &log) {
            let slot: usize = cluster.nodes()[0]
                .cli(&["cluster", "keyslot", &state_key])
                .parse()
                .unwrap();
            assert_eq!(domain, slot / 256, "{key:?}: {state_key}");
        }
        seen.insert(domain);
    }
    assert!(
        seen.len() > 40,
        "keys spread over the domains: {}",
        seen.len()
    );

    // A lazy store not built yet (nothing listens on its seed) already has the cluster's
    // domains, and gives each key the built store's; so does `Coalescing`, over the store.
    let unbuilt = RedisStore::cluster(["redis://127.0.0.1:1"])
        .build_lazy(Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!unbuilt.is_connected());
    let coalescing = ratelimit_redis::Coalescing::new(store.clone());
    assert_eq!(unbuilt.failure_domains(), CLUSTER_FAILURE_DOMAINS);
    assert_eq!(coalescing.failure_domains(), CLUSTER_FAILURE_DOMAINS);
    for key in &keys {
        let domain = store.failure_domain(key);
        assert_eq!(unbuilt.failure_domain(key), domain);
        assert_eq!(coalescing.failure_domain(key), domain);
    }

    let standalone = redis_harness::RedisServer::start();
    let single = RedisStore::builder(standalone.url()).build().await.unwrap();
    assert_eq!(single.failure_domains(), 1);
    assert_eq!(single.failure_domain(b"user:1"), 0);
}

/// Credentials a cluster refuses are a wrong setting, told apart from a cluster that cannot be
/// reached (`is_refused_credentials`, which the gateway turns into exit status 2 and a lazy store
/// into an error at once instead of retries). The cluster client reports a wrong password in its
/// own words (redis-rs 1.8: "Failed to create initial connections - Io: Password authentication
/// failed - AuthenticationFailed", of kind `Io`), which only the error's text tells apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_on_a_cluster_are_told_apart() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start_with_replicas(3, 0, &["requirepass right"]);
    let with_password = |password: &str| -> Vec<String> {
        cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://:{password}@127.0.0.1:{}", n.port()))
            .collect()
    };
    let err = RedisStore::cluster(with_password("n0t-the-pa55"))
        .prefix(unique_prefix("cluster-auth"))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_refused_credentials(), "{err:?}");
    assert!(
        !format!("{err} {err:?}").contains("pa55"),
        "not echoed: {err:?}"
    );
    let lazy = RedisStore::cluster(with_password("n0t-the-pa55"))
        .prefix(unique_prefix("cluster-auth"))
        .build_lazy(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(lazy.is_refused_credentials(), "{lazy:?}");
    assert!(
        !format!("{lazy} {lazy:?}").contains("pa55"),
        "not echoed: {lazy:?}"
    );
    // No password at all: refused too (`NOAUTH`).
    let none = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix("cluster-auth"))
        .build()
        .await
        .unwrap_err();
    assert!(none.is_refused_credentials(), "{none:?}");
    // The right one serves.
    let store = RedisStore::cluster(with_password("right"))
        .prefix(unique_prefix("cluster-auth"))
        .response_timeout(PATIENT)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"k", &limit, 1).await.unwrap().is_allowed());
}

/// Links the nodes closed while they were idle (their `timeout` setting, `CLIENT KILL`, a proxy's
/// idle limit) fail no check: every master's keys are answered, and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_closed_while_idle_fail_no_check() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix("idle-closed"))
        .response_timeout(PATIENT)
        .ping_after_idle(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    // A day's quota: nothing refills while the test runs (a minute's would give a unit back
    // every 600 ms, which the redis-cli calls below can take on a loaded machine).
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    // One user per master.
    let mut users = Vec::new();
    for node in cluster.nodes() {
        let user = (0..)
            .map(|i| format!("user-{i}"))
            .find(|u| master_of(&cluster, &store, &limit, u) == node.port())
            .unwrap();
        assert!(
            store
                .check(user.as_bytes(), &limit, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        users.push(user);
    }
    for node in cluster.nodes() {
        // Every client but the nodes' links to each other and redis-cli's own.
        node.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for user in &users {
        let d = store
            .check(user.as_bytes(), &limit, 1)
            .await
            .unwrap_or_else(|e| panic!("{user}'s check after the links were closed: {e}"));
        assert_eq!(d.remaining(), 98, "{user}'s check counted once");
    }
}

/// A cluster node given to `RedisStore::builder` (a standalone server's settings) is refused at
/// `build`, naming `RedisStore::cluster`, rather than built to fail with `MOVED` at the checks of
/// every key another master holds; `build_lazy` returns it at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_given_as_a_standalone_server_is_refused() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    common::assert_refused_as_wrong_server(
        &cluster.urls()[0],
        "not-standalone",
        "RedisStore::cluster",
    )
    .await;
}

/// A cluster that is down (a slot left without a master, under Redis's default
/// `cluster-require-full-coverage yes`) answers every check `CLUSTERDOWN`, which a slot's new
/// master mends: the check fails as unavailable whether the client's resends or the response
/// timeout end it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_is_down_is_unavailable() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
    // A timeout far past the client's resends (about 2 s of pauses), and the default one.
    let patient = store_on(&cluster, "down", PATIENT).await;
    let prompt = store_on(&cluster, "down", Duration::from_millis(500)).await;
    assert!(
        patient
            .check(b"user", &limit, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    let key = &patient.state_keys(b"user", &limit)[0];
    let slot: u16 = cluster.nodes()[0]
        .cli(&["cluster", "keyslot", key])
        .parse()
        .unwrap();
    let unassigned = ((slot + 100) % 16_384).to_string();
    for node in cluster.nodes() {
        node.cli(&["cluster", "delslots", &unassigned]);
    }
    // Each node's `CLUSTER INFO` says `state` within 10 s.
    let all_say = async |state: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cluster
            .nodes()
            .iter()
            .all(|n| n.cli(&["cluster", "info"]).contains(state))
        {
            assert!(std::time::Instant::now() < deadline, "not yet {state}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    all_say("cluster_state:fail").await;
    let owner = cluster.node_for(key);
    assert!(owner.cli(&["get", key]).starts_with("CLUSTERDOWN"));

    let resent = patient.check(b"user", &limit, 1).await.unwrap_err();
    assert!(
        matches!(resent, ratelimit_redis::RedisStoreError::Redis(_)),
        "the resends ended it: {resent:?}"
    );
    assert!(resent.is_unavailable(), "{resent:?}");
    let timed_out = prompt.check(b"user", &limit, 1).await.unwrap_err();
    assert!(timed_out.is_unavailable(), "{timed_out:?}");

    // The slot given a master again, the cluster serves.
    let id = owner.cli(&["cluster", "myid"]);
    for node in cluster.nodes() {
        node.cli(&["cluster", "setslot", &unassigned, "node", &id]);
    }
    all_say("cluster_state:ok").await;
    assert!(
        patient
            .check(b"user", &limit, 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

/// A password set on a master while the store runs (a rotation done server first, the store's
/// URLs not yet given it): the cluster client opens its link to that node again by itself after
/// each refusal, so without a hold every second check of its keys made a connection. The store
/// holds the checks of the failure domains that were refused (or found the link broken while
/// refusals go on) for the reconnect gap after each such failure, but for one check of each a
/// second: the master's keys, spread over all its domains, make a few connections a second, and
/// the other masters' keys are served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_set_on_a_master_while_running_waits_the_reconnect_gap() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, store, limit, victim, bystander) =
        victim_to_lose("cluster-requirepass-gap", PATIENT).await;
    let node = cluster.nodes().iter().find(|n| n.port() == victim).unwrap();
    // One key in each failure domain (found here, without a server), then those of the victim's.
    let mut by_domain = std::collections::BTreeMap::new();
    for i in 0.. {
        let user = format!("victim-{i}");
        by_domain
            .entry(ratelimit_core::Store::failure_domain(
                &store,
                user.as_bytes(),
            ))
            .or_insert(user);
        if by_domain.len() == ratelimit_redis::CLUSTER_FAILURE_DOMAINS {
            break;
        }
    }
    let mut users: Vec<String> = by_domain
        .into_values()
        .filter(|u| master_of(&cluster, &store, &limit, u) == victim)
        .collect();
    assert!(users.len() >= 15, "{} domains", users.len());
    // A failure domain at the edge of the victim's slots, shared with another master (about 1 %
    // of the keys): a key of each master in it, the victim's checked with the others.
    let domain = |u: &str| ratelimit_core::Store::failure_domain(&store, u.as_bytes());
    let (first, last) = (domain(&users[0]), domain(users.last().unwrap()));
    let edges = [first.saturating_sub(1), first, last, last + 1];
    let mut found: std::collections::HashMap<(usize, bool), String> = Default::default();
    let neighbour = (0..2_000)
        .map(|i| format!("edge-{i}"))
        .filter(|u| edges.contains(&domain(u)))
        .find_map(|u| {
            let d = domain(&u);
            let mine = master_of(&cluster, &store, &limit, &u) == victim;
            found.entry((d, mine)).or_insert(u);
            let pair = (found.get(&(d, true))?, found.get(&(d, false))?);
            Some((pair.0.clone(), pair.1.clone()))
        });
    let (edge_victim, neighbour) = neighbour.expect("a domain shared with another master");
    users.push(edge_victim);
    store.check(neighbour.as_bytes(), &limit, 1).await.unwrap();
    node.cli(&["config", "set", "requirepass", "rotated"]);
    let connections =
        || common::connections_received(&node.cli_with_password("rotated", &["info", "stats"]));
    node.cli_with_password("rotated", &["client", "kill", "type", "normal"]);
    let before = connections();
    let started = std::time::Instant::now();
    let (mut refused, mut unavailable) = (0, 0);
    // A check each millisecond for a second and a half at least, so that many gaps pass.
    let mut i = 0;
    while i < 300 || started.elapsed() < Duration::from_millis(1_500) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let user = &users[i % users.len()];
        i += 1;
        let err = store.check(user.as_bytes(), &limit, 1).await.unwrap_err();
        if err.is_refused_credentials() {
            refused += 1;
        } else {
            assert!(err.is_unavailable(), "check {i}: {err}");
            unavailable += 1;
        }
        // The other masters' keys are not held, even in a failure domain the victim shares.
        for other in [&bystander, &neighbour] {
            let d = store.check(other.as_bytes(), &limit, 1).await;
            assert!(d.unwrap().is_allowed(), "{other}");
        }
    }
    let elapsed = started.elapsed();
    // Less the `redis-cli` connection that counts them.
    let opened = connections() - before - 1;
    // At most one for each key's slot at first; then one each gap (100 ms), and one for each
    // slot's retry each second, and one more for the edges. (Without the hold: one every second
    // check.)
    let domains = users.len() as u128;
    let most =
        domains + 2 + elapsed.as_millis() / 100 + domains * (1 + elapsed.as_millis() / 1_000);
    println!(
        "{refused} refused and {unavailable} unavailable of {i} checks over {domains} domains; \
         {opened} connections opened in {elapsed:?} (at most {most})"
    );
    assert!(refused > 0, "no refusal in {i} checks");
    assert!(
        u128::from(opened) <= most,
        "{opened} connections opened in {elapsed:?} (at most {most})"
    );
    // Another master's link broken while the refusals go on: its domain is a suspect too, until
    // its retry (a second) is answered; then served again. (Its checks meanwhile fail as an
    // unavailable store's.)
    let other = master_of(&cluster, &store, &limit, &bystander);
    let other = cluster.nodes().iter().find(|n| n.port() == other).unwrap();
    other.cli(&["client", "kill", "type", "normal"]);
    let broke = std::time::Instant::now();
    let mut served_again = None;
    while broke.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let user = &users[i % users.len()];
        i += 1;
        assert!(store.check(user.as_bytes(), &limit, 1).await.is_err());
        match store.check(bystander.as_bytes(), &limit, 1).await {
            Ok(d) => {
                assert!(d.is_allowed());
                served_again.get_or_insert(broke.elapsed());
            }
            Err(e) => {
                // Its own master never refused: told as unavailable, not as refused credentials.
                assert!(e.is_unavailable() && !e.is_refused_credentials(), "{e}");
                assert!(
                    served_again.is_none(),
                    "the bystander failed after it was served again: {e}"
                );
            }
        }
    }
    println!("the other master's key served again after {served_again:?}");
    assert!(
        served_again.is_some_and(|t| t < Duration::from_secs(2)),
        "{served_again:?}"
    );
    // The password taken off again, and a second and more without a check: every key of the
    // master is served again, none failing with a refusal (a check may find its link broken).
    node.cli_with_password("rotated", &["config", "set", "requirepass", ""]);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let back = std::time::Instant::now();
    for user in &users {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            match store.check(user.as_bytes(), &limit, 1).await {
                Ok(d) => {
                    assert!(d.is_allowed());
                    break;
                }
                Err(e) => assert!(
                    !e.is_refused_credentials() && back.elapsed() < Duration::from_secs(5),
                    "{user} fails {:?} after the password was taken off: {e}",
                    back.elapsed()
                ),
            }
        }
    }
    println!("every domain served again in {:?}", back.elapsed());
}

/// A 3-master cluster that serves while a master is lost, a store on it with four pooled
/// connections (its keys under a prefix made from `name`), a day's limit that nothing here
/// spends, and 400 users, each checked once.
async fn four_connections_and_400_users(
    name: &str,
) -> (RedisCluster, RedisStore, Limit, Vec<String>) {
    let cluster = RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let store = RedisStore::cluster(cluster.urls())
        .prefix(unique_prefix(name))
        .pool_size(4)
        .response_timeout(PATIENT)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(10_000_000).unwrap()).unwrap();
    let users: Vec<String> = (0..400).map(|i| format!("user-{i}")).collect();
    for u in &users {
        store.check(u.as_bytes(), &limit, 1).await.unwrap();
    }
    (cluster, store, limit, users)
}

/// The same refusals under concurrent checks over four pooled connections, then the password
/// taken off and the store left idle a second and a half: no check after gets the refusal (the
/// master no longer refuses). Before, a check that found its link broken after the idle spell
/// held every slot refused before, which answered the stale refusal without being sent (49
/// refusals in a run; a review's runs: 16 to 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_refusal_is_told_once_the_master_accepts_the_store_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, store, limit, users) = four_connections_and_400_users("refusals-over").await;
    let node = &cluster.nodes()[0];
    node.cli(&["config", "set", "requirepass", "rotated"]);
    node.cli_with_password("rotated", &["client", "kill", "type", "normal"]);
    // Sixteen tasks checking the users for `run`; what they got: (refused, other errors).
    let checks = |run: Duration| {
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let (store, limit, users) = (store.clone(), limit.clone(), users.clone());
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let (mut refused, mut other, mut i) = (0u64, 0u64, t);
                    while started.elapsed() < run {
                        match store
                            .check(users[i % users.len()].as_bytes(), &limit, 1)
                            .await
                        {
                            Err(e) if e.is_refused_credentials() => refused += 1,
                            Err(_) => other += 1,
                            Ok(_) => {}
                        }
                        i += 16;
                    }
                    (refused, other)
                })
            })
            .collect();
        async move {
            let mut sum = (0, 0);
            for t in tasks {
                let (r, o) = t.await.unwrap();
                sum = (sum.0 + r, sum.1 + o);
            }
            sum
        }
    };
    let (refused, _) = checks(Duration::from_secs(2)).await;
    assert!(refused > 0, "no refusal while the password was set");
    node.cli_with_password("rotated", &["config", "set", "requirepass", ""]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (refused, other) = checks(Duration::from_secs(1)).await;
    println!("after the password was taken off: {refused} refused, {other} other errors");
    assert_eq!(
        refused, 0,
        "refusals told after the master accepted the store again"
    );
}

/// Two masters refuse the store; one of them accepts it again while the other goes on refusing:
/// the first one's keys are served again from their slots' next retry, within a second or so,
/// under sixteen tasks over four pooled connections. (A slot refused once was held for as long
/// as any master refused: a review's run told 16,395 refusals of a master that had accepted the
/// store 1.5 s before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_accepts_the_store_again_is_served_while_another_refuses() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (cluster, store, limit, users) = four_connections_and_400_users("refusals-one-back").await;
    let (back, still) = (&cluster.nodes()[0], &cluster.nodes()[1]);
    // The users whose failure domain lies whole in `back`'s slots (found without a server).
    let ranges = cluster.slots_of(back);
    let inside = |d: usize| {
        let (from, to) = ((d * 256) as u16, (d * 256 + 255) as u16);
        ranges.iter().any(|r| r.contains(&from) && r.contains(&to))
    };
    let backs: std::collections::HashSet<String> = users
        .iter()
        .filter(|u| inside(ratelimit_core::Store::failure_domain(&store, u.as_bytes())))
        .cloned()
        .collect();
    assert!(backs.len() > 50, "{} users", backs.len());
    for n in [back, still] {
        n.cli(&["config", "set", "requirepass", "rotated"]);
        n.cli_with_password("rotated", &["client", "kill", "type", "normal"]);
    }
    let started = std::time::Instant::now();
    let accepted_at = Duration::from_secs(2);
    // Sixteen tasks for 6 s; the refusals of `back`'s keys told after `accepted_at` plus
    // `late`, and those of the other refusing master's keys.
    let late = Duration::from_millis(1_500);
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (store, limit, users, backs) =
                (store.clone(), limit.clone(), users.clone(), backs.clone());
            tokio::spawn(async move {
                let (mut back_late, mut others, mut i) = (0u64, 0u64, t);
                while started.elapsed() < Duration::from_secs(6) {
                    let user = &users[i % users.len()];
                    i += 16;
                    match store.check(user.as_bytes(), &limit, 1).await {
                        Err(e) if e.is_refused_credentials() => {
                            if !backs.contains(user) {
                                others += 1;
                            } else if started.elapsed() > accepted_at + late {
                                back_late += 1;
                            }
                        }
                        _ => {}
                    }
                }
                (back_late, others)
            })
        })
        .collect();
    tokio::time::sleep(accepted_at).await;
    back.cli_with_password("rotated", &["config", "set", "requirepass", ""]);
    let (mut back_late, mut others) = (0, 0);
    for t in tasks {
        let (b, o) = t.await.unwrap();
        back_late += b;
        others += o;
    }
    println!(
        "refusals of the master that accepted the store again, later than {late:?} after: \
         {back_late}; of the other masters' keys: {others}"
    );
    assert!(others > 0, "the other master's refusals were told");
    assert_eq!(
        back_late, 0,
        "a master that accepts the store again is still held"
    );
}
