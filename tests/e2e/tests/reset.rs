//! A client reset across a fleet: two gateways (real servers on loopback ports) share one real
//! Redis; gateway A holds a `DenialCache` in front of its store and serves an admin route that
//! resets a user through the login layer's `Resetter`; gateway B has no cache. After the reset
//! both admit the user again (A's cached denial ended with the reset, the shared state is gone),
//! and another user's count is untouched.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use ratelimit_core::{DenialCache, Reset, SystemClock};
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::{per_minute, store_builder};
use redis_harness::RedisServer;
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{Policy, RateLimitLayer, RequestHead, ResetError, Resetter};

fn login_layer<S: ratelimit_core::Store>(store: S) -> RateLimitLayer<S> {
    let policy = Policy::new("login", per_minute(3))
        .expect("policy")
        .key(ApiKeyHeader::new("x-user").expect("header"));
    RateLimitLayer::builder(store, policy)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("layer")
}

async fn unblock<S: Reset>(State(limits): State<Resetter<S>>, req: Request) -> StatusCode {
    match limits.reset(&RequestHead::of(&req)).await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(ResetError::NoKey) => StatusCode::BAD_REQUEST,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_gateway_lets_the_user_in_on_every_gateway() {
    let redis = RedisServer::start();
    let patient = |url: &str| store_builder(url).response_timeout(Duration::from_secs(2));
    let cached = Arc::new(DenialCache::new(
        patient(&redis.url()).build().await.expect("store a"),
        SystemClock::new(),
    ));
    let plain = patient(&redis.url()).build().await.expect("store b");
    let a_layer = login_layer(cached.clone());
    let a = TestApp::serve(
        Router::new()
            .route(
                "/login",
                get(|| async { "ok" }).route_layer(a_layer.clone()),
            )
            .route("/admin/unblock", post(unblock::<Arc<_>>))
            .with_state(a_layer.resetter()),
    )
    .await;
    let b = TestApp::serve(Router::new().route(
        "/login",
        get(|| async { "ok" }).route_layer(login_layer(plain.clone())),
    ))
    .await;
    let client = reqwest::Client::new();
    let login =
        |app: &TestApp, user: &str| client.get(app.url("/login")).header("x-user", user).send();
    let status = |r: reqwest::Response| r.status().as_u16();

    // Alice spends her three tries across the fleet, then is denied by both (A from its cache
    // the second time).
    let mut seen = Vec::new();
    for app in [&a, &b, &a, &b, &a, &a] {
        seen.push(status(login(app, "alice").await.expect("request")));
    }
    assert_eq!(seen, [200, 200, 200, 429, 429, 429]);
    assert!(cached.stats().hits >= 1, "{:?}", cached.stats());
    // Bob spends one.
    assert_eq!(status(login(&b, "bob").await.expect("request")), 200);

    // The layer's key: the policy's name, a 0 byte, and the header's value.
    let alice_keys = plain.state_keys(b"login\0alice", &per_minute(3));
    for key in &alice_keys {
        assert_eq!(redis.cli(&["exists", key]), "1", "{key}");
    }
    let unblocked = client
        .post(a.url("/admin/unblock"))
        .header("x-user", "alice")
        .send()
        .await
        .expect("request");
    assert_eq!(unblocked.status().as_u16(), 204);
    for key in &alice_keys {
        assert_eq!(redis.cli(&["exists", key]), "0", "{key}");
    }
    // Alice again has three, wherever she goes; Bob still has two.
    let mut seen = Vec::new();
    for app in [&a, &b, &a, &b] {
        seen.push(status(login(app, "alice").await.expect("request")));
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(status(login(&b, "bob").await.expect("request")));
    }
    assert_eq!(seen, [200, 200, 429]);
    // A request without the key resets nothing.
    let no_key = client
        .post(a.url("/admin/unblock"))
        .send()
        .await
        .expect("request");
    assert_eq!(no_key.status().as_u16(), 400);
}
