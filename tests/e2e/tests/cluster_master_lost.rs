//! A Redis Cluster master killed under a fail-closed route: its keys fail, and only its keys.
//!
//! The layer's circuit breaker keeps a circuit per failure domain of the store (a cluster store's
//! domains are ranges of 256 hash slots, which masters own whole). A single circuit for the whole
//! store opens on the lost master's failures and then answers every client with the failure
//! policy, though the other masters answer: on a fail-closed route, a 503 for every client for the
//! whole cool-down, over and over for as long as the master is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use ratelimit_core::{Limit, Store};
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

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.note(key)
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_master_fails_its_own_keys_and_no_other() {
    // The other masters serve on once the lost one is marked failed (by default a cluster that
    // has lost a slot stops serving every slot until a replica takes over).
    let mut cluster =
        RedisCluster::start_with_replicas(3, 0, &["cluster-require-full-coverage no"]);
    let store = RedisStore::cluster(cluster.urls())
        .prefix("e2e")
        .connect_timeout(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .expect("store");
    assert_eq!(store.failure_domains(), CLUSTER_FAILURE_DOMAINS);
    let domains = Domains {
        inner: store,
        seen: Arc::default(),
    };
    let layer = RateLimitLayer::builder(
        domains.clone(),
        Policy::new("api", per_minute(10_000))
            .expect("policy")
            .key(ApiKeyHeader::new("x-api-key").expect("header name"))
            .failure(FailurePolicy::fail_closed(Duration::from_secs(2))),
    )
    .timeout(Duration::from_millis(50))
    // A cool-down longer than the test: an open circuit stays open to the end.
    .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(60)).expect("breaker"))
    .build()
    .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());

    let clients: Vec<String> = (0..96).map(|i| format!("client-{i}")).collect();
    for client in &clients {
        assert_eq!(status(&app, client).await, 200, "{client}, all masters up");
    }

    let victim = cluster.nodes()[0].port();
    let lost = cluster.slots_of(&cluster.nodes()[0]);
    cluster.kill_node(victim);
    let width = (16_384 / CLUSTER_FAILURE_DOMAINS) as u16;
    let range = |d: usize| (d as u16 * width)..=(d as u16 * width + width - 1);
    // Domains all of whose slots were the lost master's, and those with none of them.
    let dead = |d: usize| range(d).all(|s| lost.iter().any(|r| r.contains(&s)));
    let healthy = |d: usize| range(d).all(|s| !lost.iter().any(|r| r.contains(&s)));

    let mut answers: HashMap<&str, Vec<u16>> = HashMap::new();
    for _round in 0..6 {
        for client in &clients {
            let status = status(&app, client).await;
            answers.entry(client).or_default().push(status);
        }
    }

    let (mut on_dead, mut on_healthy) = (0, 0);
    for client in &clients {
        let domain = domains.of(client);
        let got = &answers[client.as_str()];
        if dead(domain) {
            on_dead += 1;
            assert!(
                got.iter().all(|&s| s == 503),
                "{client} (domain {domain}, the lost master's): {got:?}"
            );
        } else if healthy(domain) {
            on_healthy += 1;
            assert!(
                got.iter().all(|&s| s == 200),
                "{client} (domain {domain}, served by a master that answers): {got:?}"
            );
        }
    }
    println!("{on_dead} clients on the lost master's domains, {on_healthy} on the others'");
    assert!(on_dead >= 10 && on_healthy >= 40, "{on_dead}, {on_healthy}");
    // The lost master's circuits opened (the layer's state is the worst of its parts').
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}
