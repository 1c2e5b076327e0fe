//! A Redis Cluster master killed under a fail-closed route: its keys fail, and only its keys.
//!
//! The layer's circuit breaker keeps a circuit per failure domain of the store (a cluster store's
//! domains are ranges of 256 hash slots, which masters own whole). A single circuit for the whole
//! store either opens on the lost master's failures, and then answers every client with the
//! failure policy though the other masters answer (on a fail-closed route, a 503 for every client
//! for the whole cool-down), or is kept closed by the other masters' successes, and then every
//! check of the lost master's keys waits out the layer's timeout.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use ratelimit_core::{Limit, Store};
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::per_minute;
use ratelimit_redis::{CLUSTER_FAILURE_DOMAINS, RedisStore};
use redis_harness::RedisCluster;
use tower::ServiceExt;
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer};

/// The store, with the failure domain of every key the layer asked about written down (by the
/// layer's own key, whatever its layout).
#[derive(Clone)]
struct Domains<S> {
    inner: S,
    seen: Arc<Mutex<HashMap<Vec<u8>, usize>>>,
}

impl<S: Store> Domains<S> {
    fn note(&self, key: &[u8]) -> usize {
        let domain = self.inner.failure_domain(key);
        self.seen
            .lock()
            .expect("not poisoned")
            .insert(key.to_vec(), domain);
        domain
    }

    /// The domain of the layer key that ends with `client`.
    fn of(&self, client: &str) -> usize {
        let seen = self.seen.lock().expect("not poisoned");
        let mut found = seen
            .iter()
            .filter(|(k, _)| k.ends_with(client.as_bytes()))
            .map(|(_, d)| *d);
        let domain = found.next().expect("the layer checked this client");
        assert!(found.next().is_none(), "one key per client");
        domain
    }
}

impl<S: Store> Store for Domains<S> {
    type Error = S::Error;
    type Future = S::Future;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.note(key);
        self.inner.check(key, limit, cost)
    }

    fn failure_domains(&self) -> usize {
        self.inner.failure_domains()
    }

    fn response_timeout(&self) -> Option<std::time::Duration> {
        self.inner.response_timeout()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.note(key)
    }
}

/// Checks `clients` in turn, pausing `pause` after each, for `during` from `start`: the time
/// (from `start`) each request was sent, its status and its latency.
async fn load(
    app: Router,
    clients: Vec<String>,
    (start, during): (Instant, Duration),
    pause: Duration,
) -> Vec<(Duration, u16, Duration)> {
    let mut answers = Vec::new();
    loop {
        for client in &clients {
            if start.elapsed() >= during {
                return answers;
            }
            let sent = start.elapsed();
            let status = status(&app, client).await;
            answers.push((sent, status, start.elapsed() - sent));
            tokio::time::sleep(pause).await;
        }
    }
}

/// The latencies of the requests of `answers` (as [`load`] gives them) sent from `from` on,
/// sorted; there must be some.
fn latencies_from(answers: &[(Duration, u16, Duration)], from: Duration) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = answers
        .iter()
        .filter(|(sent, _, _)| *sent >= from)
        .map(|(_, _, l)| *l)
        .collect();
    assert!(!latencies.is_empty(), "no request sent after {from:?}");
    latencies.sort_unstable();
    latencies
}

async fn status(app: &Router, client: &str) -> u16 {
    let req = http::Request::get("/")
        .header("x-api-key", client)
        .body(Body::empty())
        .expect("a valid request");
    app.clone()
        .oneshot(req)
        .await
        .expect("infallible")
        .status()
        .as_u16()
}

/// One cluster at a time: each test starts 3 `redis-server` processes and loads them; on a
/// 2-core machine two side by side starve each other into timeouts.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A 3-master cluster that serves on without a master (`cluster-require-full-coverage no`: by
/// default a cluster that has lost a slot stops serving every slot until a replica takes over), a
/// router whose one route fails closed (503) behind a layer with a circuit breaker of 3 failures
/// and `cool_down`, over a store with `response_timeout`, and 96 API keys, each checked once.
struct Lost {
    cluster: RedisCluster,
    domains: Domains<RedisStore>,
    layer: RateLimitLayer<Domains<RedisStore>>,
    app: Router,
    clients: Vec<String>,
    /// The layer's metrics: its store errors by kind tell a check answered by an open circuit
    /// from one that waited for the store.
    metrics: Arc<Metrics>,
}

/// A circuit per failure domain of the store (the default), or one for the whole store
/// (`CircuitBreaker::single_circuit`), as every layer had before failure domains.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Circuits {
    PerDomain,
    Single,
}

impl Lost {
    async fn new(
        response_timeout: Duration,
        layer_timeout: Duration,
        cool_down: Duration,
        circuits: Circuits,
    ) -> Lost {
        let cluster =
            RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
        let store = RedisStore::cluster(cluster.urls())
            .prefix("e2e")
            .response_timeout(response_timeout)
            .build()
            .await
            .expect("store");
        assert_eq!(store.failure_domains(), CLUSTER_FAILURE_DOMAINS);
        let domains = Domains {
            inner: store,
            seen: Arc::default(),
        };
        let metrics = Arc::new(Metrics::new());
        let layer = metrics.register(|| {
            RateLimitLayer::builder(
                domains.clone(),
                Policy::new("api", per_minute(100_000))
                    .expect("policy")
                    .key(ApiKeyHeader::new("x-api-key").expect("header name"))
                    .failure(FailurePolicy::fail_closed(Duration::from_secs(2))),
            )
            .timeout(layer_timeout)
            .circuit_breaker({
                let breaker = CircuitBreaker::new(3, cool_down).expect("breaker");
                match circuits {
                    Circuits::PerDomain => breaker,
                    Circuits::Single => breaker.single_circuit(),
                }
            })
            .build()
            .expect("layer")
        });
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone());
        let clients: Vec<String> = (0..96).map(|i| format!("client-{i}")).collect();
        for client in &clients {
            assert_eq!(status(&app, client).await, 200, "{client}, all masters up");
        }
        Lost {
            cluster,
            domains,
            layer,
            app,
            clients,
            metrics,
        }
    }

    /// Kills the first node (SIGKILL); returns its port and the clients whose domains were all
    /// its slots, and those whose domains had none of them.
    fn kill_a_master(&mut self) -> (u16, Vec<String>, Vec<String>) {
        let victim = self.cluster.nodes()[0].port();
        let lost = self.cluster.slots_of(&self.cluster.nodes()[0]);
        self.cluster.kill_node(victim);
        let width = (16_384 / CLUSTER_FAILURE_DOMAINS) as u16;
        let range = |d: usize| (d as u16 * width)..=(d as u16 * width + width - 1);
        let on_lost = |s: u16| lost.iter().any(|r| r.contains(&s));
        let (mut dead, mut healthy) = (Vec::new(), Vec::new());
        for client in &self.clients {
            let d = self.domains.of(client);
            if range(d).all(on_lost) {
                dead.push(client.clone());
            } else if !range(d).any(on_lost) {
                healthy.push(client.clone());
            }
        }
        println!(
            "{} clients on the lost master's domains, {} on the others'",
            dead.len(),
            healthy.len()
        );
        assert!(
            dead.len() >= 10 && healthy.len() >= 40,
            "{}, {}",
            dead.len(),
            healthy.len()
        );
        (victim, dead, healthy)
    }
}

/// A master killed (SIGKILL) and six rounds of checks of every client after it: the lost
/// master's clients, those of the others (whose domains hold none of its slots), and each
/// client's answers.
async fn killed(circuits: Circuits) -> (Lost, Vec<String>, Vec<String>, HashMap<String, Vec<u16>>) {
    // A cool-down longer than the test: an open circuit stays open to the end. The lost master
    // refuses connections, so its checks fail at once; the layer's timeout, far above what a
    // check takes here, is not what is tested, and every other master's check must be answered
    // (none of them is let fail, where a stall of a loaded machine could cut one at 50 ms).
    let mut lost = Lost::new(
        Duration::from_millis(200),
        Duration::from_millis(500),
        Duration::from_secs(60),
        circuits,
    )
    .await;
    let (_victim, dead, healthy) = lost.kill_a_master();
    let mut answers: HashMap<String, Vec<u16>> = HashMap::new();
    for _round in 0..6 {
        for client in &lost.clients {
            let status = status(&lost.app, client).await;
            answers.entry(client.clone()).or_default().push(status);
        }
    }
    (lost, dead, healthy, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_master_fails_its_own_keys_and_no_other() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (lost, dead, healthy, answers) = killed(Circuits::PerDomain).await;
    for client in &dead {
        let got = &answers[client];
        assert!(
            got.iter().all(|&s| s == 503),
            "{client} (the lost master's): {got:?}"
        );
    }
    for client in &healthy {
        let got = &answers[client];
        assert!(
            got.iter().all(|&s| s == 200),
            "{client} (served by a master that answers): {got:?}"
        );
    }
    // The lost master's circuits opened (the layer's state is the worst of its circuits').
    assert_eq!(lost.layer.circuit_state(), Some(CircuitState::Open));
}

/// The same with one circuit for the whole store: the lost master's failures come three in a
/// row and open it for every client, the other masters' too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_circuit_a_lost_master_fails_every_key() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (lost, _dead, healthy, answers) = killed(Circuits::Single).await;
    let failed_rounds: usize = healthy
        .iter()
        .map(|c| answers[c].iter().filter(|&&s| s == 503).count())
        .sum();
    println!(
        "one circuit: the other masters' {} clients got 503 in {failed_rounds} of {} answers",
        healthy.len(),
        healthy.len() * 6
    );
    assert!(
        failed_rounds > healthy.len() * 3,
        "the other masters' clients failed in most rounds: {failed_rounds}"
    );
    assert_eq!(lost.layer.circuit_state(), Some(CircuitState::Open));
}

/// What the checks got while a master was gone from the network.
struct Gone {
    /// The lost master's clients' checks after the first second, all answered 503.
    victims: u64,
    /// The checks answered by an open circuit after the first second, without asking the store
    /// (any client's).
    by_open_circuit: u64,
    /// The most checks of the lost master's clients after the first second that may wait for
    /// the store while its circuits work: per domain, the failures in a row that open it (the
    /// victims' loop waits out each, so the last domains open after the first second) and one
    /// probe per cool-down; and the one check under way at the first second.
    may_wait: u64,
    /// The other masters' clients' checks after the first second, and how many failed.
    then: usize,
    then_failed: usize,
}

/// A master gone from the network (its port swallowing connection attempts) for 4 s of load on
/// every client, with the settings of the environment (LOST_MASTER_RESPONSE_TIMEOUT_MS, 60 by
/// default; LOST_MASTER_COOL_DOWN_MS, 1000), for the figures in docs/operations.md.
async fn gone(circuits: Circuits) -> Gone {
    let ms = |name: &str, default: u64| {
        Duration::from_millis(
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default),
        )
    };
    let response_timeout = ms("LOST_MASTER_RESPONSE_TIMEOUT_MS", 60);
    let cool_down = ms("LOST_MASTER_COOL_DOWN_MS", 1_000);
    // The layer's timeout of the README's setting, under the store's (60 ms).
    let mut lost = Lost::new(
        response_timeout,
        Duration::from_millis(50),
        cool_down,
        circuits,
    )
    .await;
    let (victim, dead, healthy) = lost.kill_a_master();
    let _hole = redis_harness::blackhole::Blackhole::on(victim);
    let victim_domains: HashSet<usize> = dead.iter().map(|c| lost.domains.of(c)).collect();

    let start = Instant::now();
    let during = Duration::from_secs(4);
    let settled = Duration::from_secs(1);
    // The checks answered by an open circuit up to about the first second, not counted, and
    // when that count was read (on a loaded machine, some time after): the victims' checks are
    // counted from then on.
    let by_open_circuit_settled = {
        let metrics = lost.metrics.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((start + settled).into()).await;
            let read_at = start.elapsed();
            (metrics.store_errors("api", "circuit_open"), read_at)
        })
    };
    // An open circuit answers at once: without a pause the victims' loop would never yield, and
    // hold one of the two workers.
    let victims = tokio::spawn(load(
        lost.app.clone(),
        dead,
        (start, during),
        Duration::from_millis(1),
    ));
    let answers = load(
        lost.app.clone(),
        healthy,
        (start, during),
        Duration::from_millis(2),
    )
    .await;
    let victims = victims.await.expect("the victims' load");
    assert!(!victims.is_empty() && victims.iter().all(|(_, s, _)| *s == 503));
    let (before, read_at) = by_open_circuit_settled
        .await
        .expect("the count at the first second");
    let by_open_circuit = lost.metrics.store_errors("api", "circuit_open") - before;
    let cool_downs = (during - settled)
        .as_millis()
        .div_ceil(cool_down.as_millis().max(1)) as u64;
    let may_wait = victim_domains.len() as u64 * (3 + cool_downs) + 1;
    let victims_settled = latencies_from(&victims, read_at);
    let victims_median = victims_settled[victims_settled.len() / 2];
    let failed = |from: Duration, to: Duration| {
        let window: Vec<_> = answers
            .iter()
            .filter(|(sent, _, _)| (from..to).contains(sent))
            .collect();
        let failed = window.iter().filter(|(_, s, _)| *s != 200).count();
        (window.len(), failed)
    };
    let (first, first_failed) = failed(Duration::ZERO, settled);
    let (then, then_failed) = failed(settled, during);
    let latencies = latencies_from(&answers, settled);
    println!(
        "{circuits:?}, store timeout {response_timeout:?}, cool-down {cool_down:?}: the lost \
         master's clients: {} checks, all 503 (after {settled:?}: median {victims_median:?}, \
         {by_open_circuit} of {} by an open circuit); the others': {first_failed} of {first} failed in the first {settled:?}, {then_failed} \
         of {then} after, latency after it median {:?}, p99 {:?}, slowest {:?}",
        victims.len(),
        victims_settled.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        latencies[latencies.len() - 1],
    );
    Gone {
        victims: victims_settled.len() as u64,
        by_open_circuit,
        may_wait,
        then,
        then_failed,
    }
}

/// A master gone from the network: every check of its keys makes the cluster client refresh its
/// slot map, holding every other master's checks while it tries to connect to it. Once the lost
/// master's circuits are open, only their probes (one per domain per cool-down) reach the store;
/// with the store's response timeout a little above the layer's (README's setting: 60 ms), the
/// cluster client's connect timeout is capped at a third of it, 20 ms, so that the two refreshes a
/// check may wait for (the one under way, then the next) take 40 ms, under the layer's 50 ms, and
/// the other masters' clients are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_gone_from_the_network_stops_only_its_own_keys() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Gone {
        victims,
        by_open_circuit,
        may_wait,
        then,
        then_failed,
    } = gone(Circuits::PerDomain).await;
    // The lost master's keys are answered by their open circuits, without waiting for the
    // layer's timeout (50 ms) as they would behind a circuit that the other masters' successes
    // keep closed: all but each domain's first failures and probes.
    assert!(
        victims > may_wait && by_open_circuit + may_wait >= victims,
        "{by_open_circuit} of {victims} answered by an open circuit (at most {may_wait} may wait)"
    );
    assert!(
        then > 100,
        "the other masters' clients were checked: {then}"
    );
    // None failed in any run on this machine; a stall of a loaded one may cut a check or two.
    assert!(
        then_failed * 100 <= then,
        "{then_failed} of {then} of the other masters' clients failed once the lost master's \
         circuits were open"
    );
}

/// The same with one circuit for the whole store, which cannot do both: either the other
/// masters' successes keep it closed and the lost master's clients wait out the layer's timeout
/// (what this machine shows), or it opens and the other masters' clients fail too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_circuit_a_master_gone_from_the_network_costs_every_key() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Gone {
        victims,
        by_open_circuit,
        then_failed,
        ..
    } = gone(Circuits::Single).await;
    // Most of the lost master's checks waited for the store (the circuit kept closed), or the
    // other masters' clients failed (it opened).
    assert!(
        by_open_circuit * 2 < victims || then_failed > 0,
        "{by_open_circuit} of {victims} answered by an open circuit, {then_failed} others failed"
    );
}
