//! The app with the Redis store over `rediss://`, against a real TLS-only `redis-server` whose
//! certificate is signed by a CA the test makes (`redis_harness::tls`). The store verifies the
//! server against that CA; a store that trusts another CA cannot connect, and the route's policy
//! answers.
#![cfg(feature = "tls")]

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load;
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::{per_minute, store_builder};
use ratelimit_redis::RedisStore;
use redis_harness::tls::TlsRedisServer;
use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer};

/// Generous: this scenario is about TLS, not latency; a loaded machine must not turn a slow
/// check into a 503 (the store's own response timeout is longer still: see `store`).
const TIMEOUT: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(1);

/// `/api`: 5 per minute per `x-api-key`; `/load`: 100,000 per minute per peer address.
fn app(store: RedisStore, metrics: &Metrics) -> Router {
    let (layer, load) = metrics.register(|| {
        let api = RateLimitLayer::builder(
            store.clone(),
            Policy::new("tls", per_minute(5))
                .unwrap()
                .key(tower_ratelimit::key::ApiKeyHeader::new("x-api-key").unwrap())
                .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
        )
        .timeout(TIMEOUT)
        .build()
        .unwrap();
        let load = RateLimitLayer::builder(
            store,
            Policy::new("tls-load", per_minute(100_000))
                .unwrap()
                .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
        )
        .timeout(TIMEOUT)
        .build()
        .unwrap();
        (api, load)
    });
    Router::new()
        .route("/api", get(|| async { "ok" }).route_layer(layer))
        .route("/load", get(|| async { "ok" }).route_layer(load))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_limits_over_rediss_with_a_private_ca() {
    let server = TlsRedisServer::start();
    let store = store_builder(&server.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .tls_root_certificate(server.ca_pem())
        .build()
        .await
        .expect("a store over rediss:// verified against the test CA");
    let metrics = Metrics::new();
    let app = TestApp::serve(app(store, &metrics)).await;
    let client = load::client();

    let mut statuses = Vec::new();
    for _ in 0..8 {
        let res = client
            .get(app.url("/api"))
            .header("x-api-key", "tls-client")
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(metrics.decisions("tls", "allowed"), 5);
    assert_eq!(metrics.decisions("tls", "denied"), 3);
    // The state is in the TLS server.
    let keys = server.cli(&["--scan", "--pattern", "e2e:*"]);
    assert_eq!(keys.lines().count(), 1, "one client, one state: {keys}");

    // A bounded load over TLS, all allowed.
    let samples = load::run(
        &client,
        &[("tls", app.url("/load"))],
        2,
        Duration::from_millis(800),
        Duration::from_millis(5),
        Instant::now(),
    )
    .await;
    println!("over TLS: {samples}");
    assert!(samples.share(200) >= 0.98, "{samples}");
    assert!(
        samples.max() <= TIMEOUT + MARGIN,
        "worst {:?}",
        samples.max()
    );
    assert_eq!(metrics.store_errors("tls-load", "error"), 0);
    assert_eq!(metrics.store_errors("tls-load", "timeout"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_another_ca_is_refused() {
    let server = TlsRedisServer::start();
    let other = TlsRedisServer::start();
    let started = Instant::now();
    let err = store_builder(&server.url())
        .connect_timeout(Duration::from_secs(2))
        .tls_root_certificate(other.ca_pem())
        .build()
        .await
        .expect_err("the server's certificate is not signed by the trusted CA");
    println!("another CA: {err} (after {:?})", started.elapsed());
    assert!(err.is_unavailable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Nothing was written on the server.
    assert_eq!(server.cli(&["dbsize"]), "0");
}
