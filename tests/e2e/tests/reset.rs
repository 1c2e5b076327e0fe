//! A client reset across a fleet: two gateways (real servers on loopback ports) share one real
//! Redis; gateway A holds a `DenialCache` in front of its store and serves an admin route that
//! resets a user through the login layer's `Resetter`; gateway B has no cache. After the reset
//! both admit the user again (A's cached denial ended with the reset, the shared state is gone),
//! and another user's count is untouched. A sign-in handler that resets its own user answers
//! with the full quota in its fields. With resets announced through Redis and watched, a
//! reset through either of two caching gateways ends the other's cached denial at once. And a
//! reset the layer makes itself
//! (`RateLimitLayerBuilder::reset_on`): two gateways in front of a real sign-in service forget a
//! user's count when the service answers a success through either, and while Redis is frozen do
//! not wait for it to reset.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use ratelimit_core::{DenialCache, Reset, SystemClock};
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::{patient_store_builder, per_minute, store_builder};
use ratelimit_redis::ResetNotice;
use redis_harness::RedisServer;
use tokio::sync::Notify;
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{
    CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer, RequestHead, ResetError,
    Resetter,
};

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
    let cached = Arc::new(DenialCache::new(
        patient_store_builder(&redis.url())
            .build()
            .await
            .expect("store a"),
        SystemClock::new(),
    ));
    let plain = patient_store_builder(&redis.url())
        .build()
        .await
        .expect("store b");
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

/// A sign-in handler that resets its own user through the login layer's `Resetter`, over a real
/// Redis (whose checks wait for their answer): the success's response tells the full quota, the
/// user's keys are gone from Redis, and the next attempt counts from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_reset_over_redis_tells_the_full_quota() {
    let redis = RedisServer::start();
    let store = patient_store_builder(&redis.url())
        .build()
        .await
        .expect("store");
    let layer = login_layer(store.clone());
    async fn sign_in(
        State(limits): State<Resetter<ratelimit_redis::RedisStore>>,
        req: Request,
    ) -> StatusCode {
        if req
            .headers()
            .get("x-password")
            .is_none_or(|p| p != "hunter2")
        {
            return StatusCode::UNAUTHORIZED;
        }
        match limits.reset(&RequestHead::of(&req)).await {
            Ok(()) => StatusCode::NO_CONTENT,
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    let app = TestApp::serve(
        Router::new()
            .route("/login", get(sign_in).route_layer(layer.clone()))
            .with_state(layer.resetter()),
    )
    .await;
    let client = reqwest::Client::new();
    let attempt = |password: &str| {
        client
            .get(app.url("/login"))
            .header("x-user", "alice")
            .header("x-password", password)
            .send()
    };
    let field = |r: &reqwest::Response| {
        r.headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    for _ in 0..2 {
        assert_eq!(attempt("guess").await.expect("request").status(), 401);
    }
    let success = attempt("hunter2").await.expect("request");
    assert_eq!(success.status().as_u16(), 204);
    assert_eq!(field(&success).as_deref(), Some("\"login\";r=3"));
    for key in store.state_keys(b"login\0alice", &per_minute(3)) {
        assert_eq!(redis.cli(&["exists", &key]), "0", "{key}");
    }
    let next = attempt("guess").await.expect("request");
    assert_eq!(next.status().as_u16(), 401);
    assert_eq!(field(&next).as_deref(), Some("\"login\";r=2;t=20"));
}

/// Two gateways, each with a `DenialCache` in front of one real Redis and a reset watch: a user
/// denied (and cached) on both is reset through B's admin route; A hears of it from Redis and
/// admits the user at once, where without the watch its cached denial would stand until its
/// deadline (20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_one_gateway_ends_the_cached_denials_of_the_others() {
    let redis = RedisServer::start();
    let (heard, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let mut gateways = Vec::new();
    let mut caches = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..2 {
        let store = patient_store_builder(&redis.url())
            .announce_resets(true)
            .build()
            .await
            .expect("store");
        let cache = Arc::new(DenialCache::new(store.clone(), SystemClock::new()));
        let (heard_by, heard) = (Arc::clone(&cache), heard.clone());
        watches.push(
            store
                .watch_resets(move |notice| {
                    notice.apply(&heard_by);
                    let _ = heard.send(matches!(notice, ResetNotice::Reset { .. }));
                })
                .expect("watch"),
        );
        let layer = login_layer(Arc::clone(&cache));
        gateways.push(
            TestApp::serve(
                Router::new()
                    .route("/login", get(|| async { "ok" }).route_layer(layer.clone()))
                    .route("/admin/unblock", post(unblock::<Arc<_>>))
                    .with_state(layer.resetter()),
            )
            .await,
        );
        caches.push(cache);
    }
    // Both watches subscribed.
    for _ in 0..2 {
        let reset = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await;
        assert_eq!(reset.expect("subscribed in time"), Some(false));
    }
    let (a, b) = (&gateways[0], &gateways[1]);
    let client = reqwest::Client::new();
    let login =
        |app: &TestApp, user: &str| client.get(app.url("/login")).header("x-user", user).send();
    let status = |r: reqwest::Response| r.status().as_u16();
    let mut seen = Vec::new();
    for app in [a, b, a, b, a, b, a] {
        seen.push(status(login(app, "alice").await.expect("request")));
    }
    assert_eq!(seen, [200, 200, 200, 429, 429, 429, 429]);
    assert!(
        caches.iter().all(|c| c.stats().hits >= 1),
        "both answered from their caches"
    );
    let unblocked = client
        .post(b.url("/admin/unblock"))
        .header("x-user", "alice")
        .send()
        .await
        .expect("request");
    assert_eq!(unblocked.status().as_u16(), 204);
    // Both watches hear it (B's own included), and A lets Alice in at once.
    for _ in 0..2 {
        let reset = tokio::time::timeout(Duration::from_secs(5), notices.recv()).await;
        assert_eq!(reset.expect("heard in time"), Some(true));
    }
    let hits = caches[0].stats().hits;
    let mut seen = Vec::new();
    for app in [a, a, a, b] {
        seen.push(status(login(app, "alice").await.expect("request")));
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    assert_eq!(caches[0].stats().hits, hits, "A asked Redis");
    drop(watches);
}

/// The sign-in service behind the gateways: 204 for the right password, 401 for any other.
async fn sign_in(req: Request) -> StatusCode {
    match req.headers().get("x-password") {
        Some(p) if p == "hunter2" => StatusCode::NO_CONTENT,
        _ => StatusCode::UNAUTHORIZED,
    }
}

/// A gateway in front of the sign-in service: it forwards `/login` (the user and password
/// headers, and `x-hold`) and answers with the service's status.
async fn forward(State(upstream): State<(reqwest::Client, String)>, req: Request) -> StatusCode {
    let (client, url) = upstream;
    let mut call = client.get(url);
    for name in ["x-user", "x-password", "x-hold"] {
        if let Some(value) = req.headers().get(name) {
            call = call.header(name, value.as_bytes());
        }
    }
    match call.send().await {
        Ok(res) => StatusCode::from_u16(res.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

/// Two gateways on one real Redis, in front of a sign-in service (all three real servers): each
/// counts every attempt per user name and forgets the count when the service answers a
/// success (`reset_on`), which neither gateway's code decides. A success through one gateway
/// gives the user a full quota on both; another user's count is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_behind_the_gateways_resets_the_users_count_on_every_gateway() {
    let redis = RedisServer::start();
    let service = TestApp::serve(Router::new().route("/login", get(sign_in))).await;
    let gateway = |store| {
        let policy = Policy::new("login", per_minute(3))
            .expect("policy")
            .key(ApiKeyHeader::new("x-user").expect("header"));
        let layer = RateLimitLayer::builder(store, policy)
            .timeout(Duration::from_secs(2))
            .reset_on(|res| res.status().is_success())
            .build()
            .expect("layer");
        Router::new()
            .route("/login", get(forward).route_layer(layer))
            .with_state((reqwest::Client::new(), service.url("/login")))
    };
    let store = patient_store_builder(&redis.url())
        .build()
        .await
        .expect("store");
    let a = TestApp::serve(gateway(store.clone())).await;
    let b = TestApp::serve(gateway(
        patient_store_builder(&redis.url())
            .build()
            .await
            .expect("store"),
    ))
    .await;
    let client = reqwest::Client::new();
    let attempt = |app: &TestApp, user: &str, password: &str| {
        client
            .get(app.url("/login"))
            .header("x-user", user)
            .header("x-password", password)
            .send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();

    let mut seen = Vec::new();
    for (app, user) in [(&a, "alice"), (&b, "alice"), (&b, "bob")] {
        seen.push(status(attempt(app, user, "guess").await.expect("request")));
    }
    assert_eq!(seen, [401, 401, 401]);
    // Alice's third attempt succeeds: her count is gone from Redis, and the response's fields
    // tell her full quota (not the last unit's zero her check left).
    let success = attempt(&a, "alice", "hunter2").await.expect("request");
    assert_eq!(success.status().as_u16(), 204);
    assert_eq!(
        success
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok()),
        Some("\"login\";r=3")
    );
    for key in store.state_keys(b"login\0alice", &per_minute(3)) {
        assert_eq!(redis.cli(&["exists", &key]), "0", "{key}");
    }
    // Three more failures across the fleet, then the limit.
    let mut seen = Vec::new();
    for app in [&b, &a, &b, &a] {
        seen.push(status(
            attempt(app, "alice", "guess").await.expect("request"),
        ));
    }
    assert_eq!(seen, [401, 401, 401, 429]);
    // Bob's failure still counts: two more, then the limit, and his right password too.
    let mut seen = Vec::new();
    for password in ["guess", "guess", "guess", "hunter2"] {
        seen.push(status(attempt(&a, "bob", password).await.expect("request")));
    }
    assert_eq!(seen, [401, 401, 429, 429]);
}

/// During an outage (Redis frozen with SIGSTOP: connections open, nothing answered) a success
/// does not send its reset to the store the circuit breaker has given up on, where it would hold
/// the response for the layer's timeout: not for a request whose check was made before the
/// circuit opened (held in the sign-in service meanwhile), nor for one let through by the
/// fallback. The fallback's local share is reset, the reset is counted as skipped, and the
/// user's count in Redis stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_during_an_outage_does_not_wait_for_the_frozen_store() {
    let redis = RedisServer::start();
    // The sign-in service; a request with `x-hold` waits there until let go.
    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let service = {
        let (entered, go) = (entered.clone(), go.clone());
        TestApp::serve(Router::new().route(
            "/login",
            get(move |req: Request| async move {
                if req.headers().contains_key("x-hold") {
                    entered.notify_one();
                    go.notified().await;
                }
                sign_in(req).await
            }),
        ))
        .await
    };
    let store = store_builder(&redis.url()).build().await.expect("store");
    let metrics = Metrics::new();
    let layer = metrics.register(|| {
        let policy = Policy::new("login", per_minute(3))
            .expect("policy")
            .key(ApiKeyHeader::new("x-user").expect("header"))
            .failure(FailurePolicy::fallback(2).expect("fallback"));
        RateLimitLayer::builder(store.clone(), policy)
            .timeout(Duration::from_millis(100))
            // Open at the first failure, and open for the rest of the test.
            .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(600)).expect("breaker"))
            .reset_on(|res| res.status().is_success())
            .build()
            .expect("layer")
    });
    let gateway = TestApp::serve(
        Router::new()
            .route("/login", get(forward).route_layer(layer.clone()))
            .with_state((reqwest::Client::new(), service.url("/login"))),
    )
    .await;
    let client = reqwest::Client::new();
    let attempt = |user: &str, password: &str| {
        client
            .get(gateway.url("/login"))
            .header("x-user", user)
            .header("x-password", password)
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    let resets = |outcome: &str| {
        metrics.counter(
            tower_ratelimit::metrics::RESETS_TOTAL,
            &[("policy", "login"), ("outcome", outcome)],
        )
    };

    assert_eq!(
        status(attempt("alice", "guess").send().await.expect("request")),
        401
    );
    // Alice's sign-in is counted in Redis, then held in the service.
    let signing_in = tokio::spawn(attempt("alice", "hunter2").header("x-hold", "1").send());
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the sign-in reached the service");
    // Redis freezes; Bob's check times out, opens the circuit, and is counted by the fallback.
    redis.pause();
    assert_eq!(
        status(attempt("bob", "guess").send().await.expect("request")),
        401
    );
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    go.notify_one();
    let signed_in = signing_in.await.expect("task").expect("request");
    assert_eq!(status(signed_in), 204);
    // A success let through by the fallback while the circuit is open.
    assert_eq!(
        status(attempt("alice", "hunter2").send().await.expect("request")),
        204
    );
    assert_eq!(
        [
            resets("skipped"),
            resets("timeout"),
            resets("error"),
            resets("reset")
        ],
        [2, 0, 0, 0]
    );
    // Alice's count in Redis (her failure and her held sign-in) stands.
    redis.resume();
    for key in store.state_keys(b"login\0alice", &per_minute(3)) {
        assert_eq!(redis.cli(&["exists", &key]), "1", "{key}");
    }
}
