//! `Resetter`: a client's count forgotten through a real axum `Router`, under every limit of the
//! policy, and the answers when it cannot be.

// The peer-address extractors these tests use come with the default `axum` feature.
#![cfg(feature = "axum")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use common::{
    FailingStore, HangingStore, SwitchStore, header, request, send, statuses, store, with_header,
};
use http::HeaderValue;
use ratelimit_core::{Algorithm, DenialCache, Limit, ManualClock, MemoryStore, Quota};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{
    CircuitBreaker, CircuitState, FailurePolicy, Headers, MissingKey, Policy, RateLimitLayer,
    RequestHead, ResetError, Resetter, Store,
};

fn login_limit() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap()
}

fn login_policy() -> Policy {
    Policy::new("login", login_limit())
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap())
}

/// A login route: the right password signs in, and forgets the user's count.
fn login_app<St>(layer: RateLimitLayer<St>) -> Router
where
    St: Store + ratelimit_core::Reset,
{
    async fn login<St: ratelimit_core::Reset>(
        State(limits): State<Resetter<St>>,
        req: Request,
    ) -> StatusCode {
        if req.headers().get("x-password") != Some(&HeaderValue::from_static("hunter2")) {
            return StatusCode::UNAUTHORIZED;
        }
        match limits.reset(&RequestHead::of(&req)).await {
            Ok(()) => StatusCode::NO_CONTENT,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    Router::new()
        .route("/login", get(login::<St>))
        .route_layer(layer.clone())
        .with_state(layer.resetter())
}

/// What a test handler is asked to do: its request's `x-mode` header.
fn x_mode(req: &Request) -> Option<Vec<u8>> {
    req.headers().get("x-mode").map(|v| v.as_bytes().to_vec())
}

fn attempt(user: &str, password: &str) -> http::Request<axum::body::Body> {
    with_header(
        with_header(request("/login"), "x-user", user),
        "x-password",
        password,
    )
}

#[tokio::test]
async fn a_successful_login_forgets_the_users_failed_attempts() {
    let (_clock, store) = store();
    let app = login_app(RateLimitLayer::new(store.clone(), login_policy()).unwrap());
    // Two failures and a success: the count starts again.
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 4).await,
        [401, 401, 401, 429]
    );
    // Mallory guessing Bob's password is held to three tries; Bob's own login is limited too.
    assert_eq!(
        statuses(&app, || attempt("bob", "guess"), 4).await,
        [401, 401, 401, 429]
    );
    assert_eq!(send(&app, attempt("bob", "hunter2")).await.status(), 429);
}

/// An admin route resets a client of a policy keyed by route and user with a request built for
/// it: axum's `MatchedPath` is set only by a router, so the request names its route with
/// `key::ResetRoute`. Without it, the built request names no route (`<unmatched>`), a key that
/// no request to `/login` has, and the client stays limited.
#[tokio::test]
async fn an_admin_resets_a_route_keyed_client_with_a_request_naming_the_route() {
    use tower_ratelimit::key::{ResetRoute, RouteKey};
    async fn unblock<St: ratelimit_core::Reset>(
        State(limits): State<Resetter<St>>,
        req: Request,
    ) -> StatusCode {
        let mut target = attempt("alice", "");
        if req.headers().contains_key("x-name-route") {
            target.extensions_mut().insert(ResetRoute::new("/login"));
        }
        match limits.reset(&RequestHead::of(&target)).await {
            Ok(()) => StatusCode::NO_CONTENT,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    let (_clock, store) = store();
    let policy = Policy::new("login", login_limit())
        .unwrap()
        .key((RouteKey::new(), ApiKeyHeader::new("x-user").unwrap()));
    let layer = RateLimitLayer::new(store, policy).unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }).route_layer(layer.clone()))
        .route("/admin/unblock", get(unblock::<common::TestStore>))
        .with_state(layer.resetter());
    let login = || attempt("alice", "");
    assert_eq!(statuses(&app, login, 4).await, [200, 200, 200, 429]);
    assert_eq!(send(&app, request("/admin/unblock")).await.status(), 204);
    assert_eq!(statuses(&app, login, 1).await, [429], "no route named");
    let named = with_header(request("/admin/unblock"), "x-name-route", "1");
    assert_eq!(send(&app, named).await.status(), 204);
    assert_eq!(statuses(&app, login, 4).await, [200, 200, 200, 429]);
}

/// The response of a handler that reset its own client tells the full quota the client's next
/// request starts from, as a `reset_on` layer's does; its verdict keeps the check's decision.
/// Over a store that answers at once and one that makes the check wait.
#[tokio::test]
async fn a_handlers_reset_response_tells_the_full_quota() {
    let policy = || login_policy().headers(Headers::ietf().legacy(true));
    let (_clock, memory) = store();
    signs_in_after_two_failures(&login_app(
        RateLimitLayer::new(memory.clone(), policy()).unwrap(),
    ))
    .await;
    let (_clock, memory) = store();
    let waits = Arc::new(SwitchStore::new(memory));
    signs_in_after_two_failures(&login_app(RateLimitLayer::new(waits, policy()).unwrap())).await;
}

/// Alice fails twice at `app`'s login (a quota of 3 a minute), then signs in: the response tells
/// the full quota (its one `RateLimit` field), and her next attempt counts from it.
async fn signs_in_after_two_failures(app: &Router) {
    assert_eq!(
        statuses(app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    let res = send(app, attempt("alice", "hunter2")).await;
    assert_eq!(res.status(), 204);
    common::assert_tells_the_full_quota_after_its_last_unit(&res);
    assert_eq!(res.headers().get_all("ratelimit").iter().count(), 1);
    // And so it is.
    let res = send(app, attempt("alice", "guess")).await;
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=2;t=20"));
}

/// A handler that waits before and after its reset (its future pending at the layer's polls)
/// still gets the full quota on its response, and the fields only once: the mark is read when
/// the response comes, not at the first poll.
#[tokio::test]
async fn a_handler_that_waits_around_its_reset_tells_the_full_quota() {
    async fn login(State(limits): State<Resetter<common::TestStore>>, req: Request) -> StatusCode {
        tokio::task::yield_now().await;
        if req.headers().get("x-password") != Some(&HeaderValue::from_static("hunter2")) {
            return StatusCode::UNAUTHORIZED;
        }
        limits.reset(&RequestHead::of(&req)).await.unwrap();
        tokio::task::yield_now().await;
        StatusCode::NO_CONTENT
    }
    let (_clock, memory) = store();
    let policy = login_policy().headers(Headers::ietf().legacy(true));
    let layer = RateLimitLayer::new(memory, policy).unwrap();
    let app = Router::new()
        .route("/login", get(login))
        .route_layer(layer.clone())
        .with_state(layer.resetter());
    signs_in_after_two_failures(&app).await;
}

/// A response tells the full quota only if the handler reset the very client the layer checked,
/// through the store the check asked: not after a reset of another client (even one made from a
/// request carrying this one's extensions), nor after a reset that failed, nor for a request the
/// fallback let through while the store was down (its fields are the local share's).
#[tokio::test]
async fn a_response_tells_the_full_quota_only_after_its_clients_reset() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(6).unwrap()).unwrap();
    let policy = Policy::new("login", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap())
        .failure(FailurePolicy::fallback(2).unwrap());
    let layer = RateLimitLayer::builder(switch.clone(), policy)
        .no_circuit_breaker()
        .build()
        .unwrap();
    let resetter = layer.resetter();
    let store = switch.clone();
    let app = Router::new()
        .route(
            "/login",
            get(move |req: Request| async move {
                match x_mode(&req).as_deref() {
                    Some(b"none") => {}
                    // Bob's request, built with a copy of this one's extensions.
                    Some(b"other") => {
                        let mut bob = attempt("bob", "x");
                        *bob.extensions_mut() = req.extensions().clone();
                        resetter.reset(&RequestHead::of(&bob)).await.unwrap();
                    }
                    Some(b"failing") => {
                        store.set_down(true);
                        let out = resetter.reset(&RequestHead::of(&req)).await;
                        store.set_down(false);
                        assert!(matches!(out, Err(ResetError::Store(_))), "{out:?}");
                    }
                    // The store back between the check and the reset.
                    Some(b"back") => {
                        store.set_down(false);
                        resetter.reset(&RequestHead::of(&req)).await.unwrap();
                    }
                    _ => resetter.reset(&RequestHead::of(&req)).await.unwrap(),
                }
                StatusCode::NO_CONTENT
            }),
        )
        .route_layer(layer);
    let attempt = |user: &str, mode: &str| with_header(attempt(user, "x"), "x-mode", mode);
    let fields = |res: &axum::response::Response| {
        (
            header(res, "ratelimit").map(str::to_owned),
            header(res, "ratelimit-policy").map(str::to_owned),
        )
    };
    let told = |ratelimit: &str, policy: &str| (Some(ratelimit.into()), Some(policy.into()));
    // The client's own reset, for comparison.
    let res = send(&app, attempt("alice", "self")).await;
    assert_eq!(fields(&res), told("\"login\";r=6", "\"login\";q=6;w=60"));
    let res = send(&app, attempt("carol", "other")).await;
    assert_eq!(
        fields(&res),
        told("\"login\";r=5;t=10", "\"login\";q=6;w=60")
    );
    let res = send(&app, attempt("dave", "failing")).await;
    assert_eq!(
        fields(&res),
        told("\"login\";r=5;t=10", "\"login\";q=6;w=60")
    );
    // Let through by the fallback's local share; the reset then made in the store, which the
    // check did not ask.
    switch.set_down(true);
    let reset = send(&app, attempt("erin", "back")).await;
    switch.set_down(true);
    let not_reset = send(&app, attempt("frank", "none")).await;
    switch.set_down(false);
    assert_eq!(reset.status(), 204);
    assert_eq!(fields(&reset), fields(&not_reset));
    assert_eq!(
        fields(&reset),
        told("\"login\";r=2;t=20", "\"login\";q=3;w=60")
    );
}

/// A layer that also resets on a response: the response tells the full quota after either
/// reset, the handler's or the layer's own, and the check's count after neither.
#[tokio::test]
async fn with_reset_on_either_reset_tells_the_full_quota() {
    let (_clock, memory) = store();
    let policy = login_policy().headers(Headers::ietf().legacy(true));
    let layer = RateLimitLayer::builder(memory, policy)
        .reset_on(|res| res.headers().contains_key("x-signed-in"))
        .build()
        .unwrap();
    let resetter = layer.resetter();
    let app = Router::new()
        .route(
            "/login",
            get(move |req: Request| async move {
                match x_mode(&req).as_deref() {
                    Some(b"handler") => {
                        resetter.reset(&RequestHead::of(&req)).await.unwrap();
                        StatusCode::NO_CONTENT.into_response()
                    }
                    Some(b"layer") => {
                        ([("x-signed-in", "1")], StatusCode::NO_CONTENT).into_response()
                    }
                    _ => StatusCode::UNAUTHORIZED.into_response(),
                }
            }),
        )
        .route_layer(layer);
    let attempt = |mode: &str| with_header(attempt("alice", "x"), "x-mode", mode);
    for mode in ["handler", "layer"] {
        assert_eq!(statuses(&app, || attempt("none"), 2).await, [401, 401]);
        let res = send(&app, attempt(mode)).await;
        assert_eq!(res.status(), 204, "{mode}");
        common::assert_tells_the_full_quota_after_its_last_unit(&res);
    }
    let res = send(&app, attempt("none")).await;
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=2;t=20"));
}

/// Of two nested layers each with a `Resetter`, the one whose client the handler reset tells the
/// full quota, the other its own count: whichever of the two it is.
#[tokio::test]
async fn of_nested_layers_only_the_reset_ones_fields_tell_the_full_quota() {
    let (_clock, memory) = store();
    let inner = RateLimitLayer::new(memory.clone(), login_policy()).unwrap();
    let outer_limit =
        Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
    let outer_policy = Policy::new("users", outer_limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap());
    let outer = RateLimitLayer::new(memory, outer_policy).unwrap();
    let resetters = (inner.resetter(), outer.resetter());
    let app = Router::new()
        .route(
            "/login",
            get(move |req: Request| async move {
                let req = RequestHead::of(&req);
                match req.headers().get("x-reset").map(|v| v.as_bytes()) {
                    Some(b"login") => resetters.0.reset(&req).await.unwrap(),
                    Some(b"users") => resetters.1.reset(&req).await.unwrap(),
                    _ => {}
                }
                StatusCode::NO_CONTENT
            }),
        )
        .route_layer(inner)
        .layer(outer);
    let reset = |user: &str, layer: &str| with_header(attempt(user, "x"), "x-reset", layer);
    send(&app, attempt("alice", "x")).await;
    let res = send(&app, reset("alice", "login")).await;
    assert_eq!(
        common::header_lines(&res, "ratelimit"),
        ["\"login\";r=3", "\"users\";r=8;t=6"]
    );
    send(&app, attempt("bob", "x")).await;
    let res = send(&app, reset("bob", "users")).await;
    assert_eq!(
        common::header_lines(&res, "ratelimit"),
        ["\"login\";r=1;t=20", "\"users\";r=10"]
    );
}

#[tokio::test]
async fn every_tier_and_the_fallback_share_are_reset() {
    let (clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory.clone()));
    let pro = Limit::single(Algorithm::Gcra, Quota::per_minute(4).unwrap()).unwrap();
    let policy = login_policy()
        .tier("pro", pro.clone())
        .unwrap()
        .resolve_tier(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
        .failure(FailurePolicy::fallback(2).unwrap());
    let layer = RateLimitLayer::builder(switch.clone(), policy)
        .clock(clock.clone())
        .no_circuit_breaker()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    let plan = |p: &str| with_header(attempt("alice", "x"), "x-plan", p);
    // Alice spends the base limit and the pro tier in the store, and the local share (3 × 1/2,
    // at least 1) while it is down: what she was let through while it was down.
    let spend_all = async || {
        assert_eq!(
            statuses(&app, || attempt("alice", "x"), 4).await,
            [200, 200, 200, 429]
        );
        assert_eq!(
            statuses(&app, || plan("pro"), 5).await,
            [200, 200, 200, 200, 429]
        );
        switch.set_down(true);
        let local = statuses(&app, || attempt("alice", "x"), 3).await;
        switch.set_down(false);
        assert_eq!(local.last(), Some(&429), "{local:?}");
        local
    };
    let local = spend_all().await;
    assert!(local.contains(&200), "{local:?}");
    let req = attempt("alice", "x");
    layer
        .resetter()
        .reset(&RequestHead::of(&req))
        .await
        .unwrap();
    // Everything counts from full again, the local share too.
    assert_eq!(spend_all().await, local);
}

#[tokio::test]
async fn a_request_without_a_key_resets_nothing() {
    let (_clock, store) = store();
    let policy = login_policy().missing_key(MissingKey::shared_key("anonymous"));
    let layer = RateLimitLayer::new(store.clone(), policy).unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    assert_eq!(
        statuses(&app, || request("/login"), 4).await,
        [200, 200, 200, 429]
    );
    let err = layer
        .resetter()
        .reset(&RequestHead::of(&request("/login")))
        .await
        .unwrap_err();
    assert!(matches!(err, ResetError::NoKey), "{err:?}");
    // The key shared by every request without one is left as it was.
    assert_eq!(send(&app, request("/login")).await.status(), 429);
}

/// Alice's reset through `layer`, which fails.
async fn failed_reset<St: tower_ratelimit::Reset>(
    layer: RateLimitLayer<St>,
) -> ResetError<St::Error> {
    let req = attempt("alice", "x");
    layer
        .resetter()
        .reset(&RequestHead::of(&req))
        .await
        .unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_answer_is_cut_at_the_layers_timeout() {
    let layer = RateLimitLayer::builder(HangingStore::default(), login_policy())
        .timeout(Duration::from_millis(40))
        .build()
        .unwrap();
    let err = failed_reset(layer).await;
    assert!(
        matches!(err, ResetError::Timeout(d) if d == Duration::from_millis(40)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_store_failure_is_the_stores_error() {
    let err =
        failed_reset(RateLimitLayer::new(FailingStore::default(), login_policy()).unwrap()).await;
    assert!(
        matches!(err, ResetError::Store(common::StoreDown)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the rate-limit store failed to reset: store is down"
    );
}

/// While the client's circuit is open, the store (taken to be down) is not asked: the reset
/// ends at once and says why, after resetting the fallback's local share, and is counted as
/// skipped.
#[tokio::test]
async fn an_open_circuit_is_not_asked_to_reset() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let policy = common::shared_login_policy();
    let breaker = CircuitBreaker::new(1, Duration::from_secs(600)).unwrap();
    let ((layer, resetter), snapshotter) = common::recorded(|| {
        let layer = RateLimitLayer::builder(switch.clone(), policy)
            .circuit_breaker(breaker)
            .build()
            .unwrap();
        let resetter = layer.resetter();
        (layer, resetter)
    });
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    // Bob's check fails and opens the circuit; Alice is then counted by the local share of
    // three.
    switch.set_down(true);
    assert_eq!(send(&app, attempt("bob", "x")).await.status(), 200);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let alice = || attempt("alice", "x");
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    let err = resetter
        .reset(&RequestHead::of(&alice()))
        .await
        .unwrap_err();
    assert!(matches!(err, ResetError::CircuitOpen), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the rate-limit store's circuit is open: the reset was not sent"
    );
    // Her local share counts from full again.
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    let count = common::resets(&snapshotter, "login");
    assert_eq!(
        [count("skipped"), count("reset"), count("error")],
        [1, 0, 0]
    );
}

/// Once its cool-down is over, an open circuit's store is asked again, by a reset as by a check,
/// though no check has probed it yet (a route without traffic since the outage): the reset is
/// sent, without taking the probe, which stays a check's.
#[tokio::test]
async fn a_cooled_down_circuit_is_asked_to_reset() {
    let (clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let layer = RateLimitLayer::builder(switch.clone(), login_policy())
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(10)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let resetter = layer.resetter();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    let alice = || attempt("alice", "x");
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    // Bob's check fails (failing open) and opens the circuit; the store is back at once.
    switch.set_down(true);
    assert_eq!(send(&app, attempt("bob", "x")).await.status(), 200);
    switch.set_down(false);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let err = resetter
        .reset(&RequestHead::of(&alice()))
        .await
        .unwrap_err();
    assert!(matches!(err, ResetError::CircuitOpen), "{err:?}");
    // After the cool-down, no request having come: the reset reaches the store.
    clock.advance(Duration::from_secs(15));
    resetter.reset(&RequestHead::of(&alice())).await.unwrap();
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // Her count was forgotten (15 s alone gave her back three quarters of one request of
    // three); the first check probes, and closes the circuit.
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
}

/// While the circuit is half-open, its one call to the store is the probe's (a check): a reset
/// is not sent either, and ends at once rather than at the timeout.
#[tokio::test(start_paused = true)]
async fn a_half_open_circuit_is_not_asked_to_reset() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(HangingStore::default(), login_policy())
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(5)).unwrap())
        .timeout(Duration::from_millis(100))
        .clock(clock.clone())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    // A check times out (failing open) and opens the circuit; after the cool-down the next
    // check is the probe, which hangs.
    assert_eq!(send(&app, attempt("bob", "x")).await.status(), 200);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    clock.advance(Duration::from_secs(5));
    let probe = tokio::spawn({
        let app = app.clone();
        async move { send(&app, attempt("bob", "x")).await.status() }
    });
    tokio::task::yield_now().await;
    assert_eq!(layer.circuit_state(), Some(CircuitState::HalfOpen));
    let start = tokio::time::Instant::now();
    let req = attempt("alice", "x");
    let err = layer
        .resetter()
        .reset(&RequestHead::of(&req))
        .await
        .unwrap_err();
    assert!(matches!(err, ResetError::CircuitOpen), "{err:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(probe.await.unwrap(), 200);
}

/// Over a denial cache: its cached denial of the client ends with the reset.
#[tokio::test]
async fn a_cached_denial_ends_with_the_reset() {
    let clock = ManualClock::new();
    let memory = MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let cache = Arc::new(DenialCache::new(memory, clock.clone()));
    let app = login_app(RateLimitLayer::new(cache.clone(), login_policy()).unwrap());
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 5).await,
        [401, 401, 401, 429, 429]
    );
    assert!(cache.stats().hits >= 1, "{:?}", cache.stats());
    // Signing in is itself limited here (the limit counts every attempt): the reset comes from
    // another route sharing the store and policy, as an admin tool's would.
    let req = attempt("alice", "hunter2");
    RateLimitLayer::new(cache.clone(), login_policy())
        .unwrap()
        .resetter()
        .reset(&RequestHead::of(&req))
        .await
        .unwrap();
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
}

/// Resets are counted by how they ended, under the policy's name.
#[tokio::test(start_paused = true)]
async fn resets_are_counted_by_outcome() {
    let (_clock, memory) = store();
    let (resetters, snapshotter) = common::recorded(|| {
        let hanging = RateLimitLayer::builder(HangingStore::default(), login_policy())
            .timeout(Duration::from_millis(40))
            .build()
            .unwrap();
        let failing = RateLimitLayer::new(FailingStore::default(), login_policy()).unwrap();
        (
            RateLimitLayer::new(memory, login_policy())
                .unwrap()
                .resetter(),
            hanging.resetter(),
            failing.resetter(),
        )
    });
    let (ok, hangs, fails) = resetters;
    let alice = attempt("alice", "x");
    let alice = RequestHead::of(&alice);
    for _ in 0..2 {
        ok.reset(&alice).await.unwrap();
    }
    ok.reset(&RequestHead::of(&request("/login")))
        .await
        .unwrap_err();
    hangs.reset(&alice).await.unwrap_err();
    fails.reset(&alice).await.unwrap_err();
    let count = common::resets(&snapshotter, "login");
    assert_eq!(
        [
            count("reset"),
            count("no_key"),
            count("timeout"),
            count("error")
        ],
        [2, 1, 1, 1]
    );
}

/// A client named without a request: the value the policy's single-part extractor reads.
#[tokio::test]
async fn a_client_is_reset_by_the_value_its_key_is_made_of() {
    let (_clock, store) = store();
    let layer = RateLimitLayer::new(store.clone(), login_policy()).unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    let alice = || attempt("alice", "x");
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    assert_eq!(statuses(&app, || attempt("bob", "x"), 1).await, [200]);
    layer.resetter().reset_client("alice").await.unwrap();
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    // Bob's count is his own still: two left.
    assert_eq!(
        statuses(&app, || attempt("bob", "x"), 3).await,
        [200, 200, 429]
    );
}

/// A `from_fn` closure said to write one value ([`FromFn::one_part`]) is reset by that value:
/// `reset_client` writes it as the closure does, and the client is let in again.
#[tokio::test]
async fn a_from_fn_key_said_to_be_one_part_is_reset_by_its_value() {
    use tower_ratelimit::key::{KeyPart, NoKey, from_fn};
    let (_clock, memory) = store();
    let policy = Policy::new("login", login_limit()).unwrap().key(
        from_fn(|req, key| {
            req.headers().get("x-user").ok_or(NoKey)?.write_to(key);
            Ok(())
        })
        .one_part(),
    );
    let layer = RateLimitLayer::new(memory, policy).unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    let alice = || with_header(request("/login"), "x-user", "alice");
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    layer.resetter().reset_client("alice").await.unwrap();
    assert_eq!(statuses(&app, alice, 1).await, [200]);
}

/// A policy whose key is not one client value (several parts, an address, or no client) cannot
/// be reset by a value: `reset_client` answers `NotOneValue` (counted as `no_key`) and the
/// client's count stands. Before, it answered `Ok(())` and reset a key no request has: with the
/// README's `or(user, address)`, an admin tool reported a user unblocked who was still denied.
/// With a request that carries the key, `reset` resets it.
#[tokio::test]
async fn a_key_that_is_not_one_value_is_not_reset_by_a_value() {
    use tower_ratelimit::key::{ClientIpKey, ExtensionKey, GlobalKey, PeerIp, RouteKey, or};
    #[derive(Clone)]
    struct User(&'static str);
    impl tower_ratelimit::key::KeyPart for User {
        fn write_to(&self, key: &mut tower_ratelimit::key::KeyBuf) {
            self.0.write_to(key);
        }
    }
    let header = || ApiKeyHeader::new("x-user").unwrap();
    let policy =
        |key: Box<dyn FnOnce(Policy) -> Policy>| key(Policy::new("login", login_limit()).unwrap());
    let ip = || tower_ratelimit::client_ip::ClientIp::behind_proxies(["10.0.0.1/32"]).unwrap();
    let policies: Vec<(&str, Policy)> = vec![
        (
            "or",
            policy(Box::new(|p| {
                p.key(or(ExtensionKey::<User>::new(), PeerIp::new()))
            })),
        ),
        (
            "tuple",
            policy(Box::new(move |p| p.key((RouteKey::new(), header())))),
        ),
        ("peer ip", policy(Box::new(|p| p.key(PeerIp::new())))),
        (
            "client ip",
            policy(Box::new(move |p| p.key(ClientIpKey::new(ip())))),
        ),
        ("global", policy(Box::new(|p| p.key(GlobalKey)))),
        ("route", policy(Box::new(|p| p.key(RouteKey::new())))),
        // A closure may write anything: here a tenant and a user, as a tuple would.
        (
            "from_fn",
            policy(Box::new(|p| {
                p.key(tower_ratelimit::key::from_fn(|req, key| {
                    use tower_ratelimit::key::{KeyPart, NoKey};
                    req.headers().get("x-tenant").ok_or(NoKey)?.write_to(key);
                    key.push_byte(0);
                    req.headers().get("x-user").ok_or(NoKey)?.write_to(key);
                    Ok(())
                }))
            })),
        ),
    ];
    for (name, policy) in policies {
        let (_clock, store) = store();
        let (resetter, snapshotter) =
            common::recorded(|| RateLimitLayer::new(store, policy).unwrap().resetter());
        let out = resetter.reset_client("alice").await;
        assert!(
            matches!(out, Err(ResetError::NotOneValue)),
            "{name}: {out:?}"
        );
        assert_eq!(common::resets(&snapshotter, "login")("no_key"), 1, "{name}");
    }

    // The `or` of the README, over a user who spent her quota: still denied after the refused
    // reset, let in after a reset with a request that carries her key.
    let (_clock, memory) = store();
    let policy = Policy::new("login", login_limit())
        .unwrap()
        .key(or(ExtensionKey::<User>::new(), PeerIp::new()));
    let layer = RateLimitLayer::new(memory, policy).unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer.clone());
    let alice = || {
        let mut req = request("/login");
        req.extensions_mut().insert(User("alice"));
        req
    };
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    assert!(layer.resetter().reset_client(&User("alice")).await.is_err());
    assert_eq!(statuses(&app, alice, 1).await, [429]);
    let carrier = alice();
    layer
        .resetter()
        .reset(&RequestHead::of(&carrier))
        .await
        .unwrap();
    assert_eq!(statuses(&app, alice, 4).await, [200, 200, 200, 429]);
    // One value: a header's, an extension's, a closure's one part.
    for policy in [
        Policy::new("login", login_limit()).unwrap().key(header()),
        Policy::new("login", login_limit())
            .unwrap()
            .key(ExtensionKey::<User>::new()),
        Policy::new("login", login_limit())
            .unwrap()
            .key(|req: &RequestHead<'_>| req.headers().get("x-user").cloned()),
    ] {
        let (_clock, store) = store();
        let layer = RateLimitLayer::new(store, policy).unwrap();
        layer.resetter().reset_client("alice").await.unwrap();
    }
}

/// Over the in-memory store a reset completes at once: like the layer's checks, it needs no
/// runtime with a timer (a hand-built runtime without `enable_time`), and none at all.
#[test]
fn a_reset_over_the_memory_store_needs_no_timer() {
    let (_clock, store) = store();
    let layer = RateLimitLayer::new(store.clone(), login_policy()).unwrap();
    let req = attempt("alice", "x");
    let without_time = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    without_time
        .block_on(layer.resetter().reset(&RequestHead::of(&req)))
        .unwrap();
    futures_executor_block_on(layer.resetter().reset_client("alice")).unwrap();
}

/// Polls `f` to completion on this thread, outside any runtime.
fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// Over `Leasing`: the lease this gateway holds for the client ends with the reset, so the client
/// gets a full quota again, and not the old lease's units on top.
#[tokio::test]
async fn a_held_lease_ends_with_the_reset() {
    let clock = ManualClock::new();
    let memory = MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let leasing = Arc::new(
        ratelimit_core::Leasing::builder(memory, clock.clone())
            .lease_size(3)
            .build()
            .unwrap(),
    );
    let app = login_app(RateLimitLayer::new(leasing.clone(), login_policy()).unwrap());
    // One failed attempt takes the whole quota as a lease: two units left here, none in the
    // store.
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    assert_eq!(leasing.outstanding_units(), 2);
    // Signing in spends a leased unit, and resets: the last one goes too.
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    assert_eq!(leasing.outstanding_units(), 0);
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 4).await,
        [401, 401, 401, 429]
    );
}

/// A store whose resets are sent when first polled and never answered, counting the sends.
#[derive(Default)]
struct SilentResets {
    sent: Arc<std::sync::atomic::AtomicUsize>,
}

impl Store for SilentResets {
    type Error = common::StoreDown;
    type Future = std::future::Ready<Result<ratelimit_core::Decision, common::StoreDown>>;

    fn check(&self, _key: &[u8], limit: &Limit, _cost: u64) -> Self::Future {
        std::future::ready(Ok(MemoryStore::new().check_now(b"k", limit, 1)))
    }
}

impl ratelimit_core::Reset for SilentResets {
    type ResetFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), common::StoreDown>> + Send>>;

    fn reset(&self, _key: &[u8], _limit: &Limit) -> Self::ResetFuture {
        let sent = self.sent.clone();
        let mut first = true;
        Box::pin(std::future::poll_fn(move |_| {
            if std::mem::take(&mut first) {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            std::task::Poll::Pending
        }))
    }
}

/// A policy with tiers resets under each limit: every call is sent at once and they are waited
/// for together, under one timeout (one round trip on a network store, not one per limit).
#[tokio::test(start_paused = true)]
async fn the_resets_of_every_limit_are_sent_together() {
    let pro = Limit::single(Algorithm::Gcra, Quota::per_minute(4).unwrap()).unwrap();
    let team = Limit::single(Algorithm::Gcra, Quota::per_minute(9).unwrap()).unwrap();
    let policy = login_policy()
        .tier("pro", pro)
        .unwrap()
        .tier("team", team)
        .unwrap()
        .resolve_tier(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()));
    let store = SilentResets::default();
    let sent = store.sent.clone();
    let layer = RateLimitLayer::builder(store, policy)
        .timeout(Duration::from_millis(40))
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let err = failed_reset(layer).await;
    assert!(matches!(err, ResetError::Timeout(_)), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(40));
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// `reset_ip`: a policy keyed by the peer's address forgets one client's count by its address
/// alone (an IPv6 client by its /64, as the limit counts it), and no other client's; behind
/// trusted proxies, the client's address as the proxies report it.
#[tokio::test]
async fn an_ip_client_is_reset_by_its_address() {
    use tower_ratelimit::client_ip::ClientIp;
    use tower_ratelimit::key::{ClientIpKey, PeerIp};
    let limit = || Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap();
    let (_clock, memory) = store();
    let layer = RateLimitLayer::new(
        memory,
        Policy::new("ip", limit()).unwrap().key(PeerIp::new()),
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer.clone());
    let from = |peer: &'static str| move || common::request_from("/", peer);
    for peer in [
        "203.0.113.9:1000",
        "203.0.113.10:1000",
        "[2001:db8::1]:1000",
    ] {
        assert_eq!(
            statuses(&app, from(peer), 3).await,
            [200, 200, 429],
            "{peer}"
        );
    }
    let resetter = layer.resetter();
    resetter
        .reset_ip("203.0.113.9".parse().unwrap())
        .await
        .unwrap();
    // Another address of the same /64.
    resetter
        .reset_ip("2001:db8::ffff".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(
        statuses(&app, from("203.0.113.9:2000"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&app, from("[2001:db8::1]:2000"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(statuses(&app, from("203.0.113.10:2000"), 1).await, [429]);

    // Behind a trusted proxy: the address it reports.
    let (_clock, memory) = store();
    let key = ClientIpKey::new(ClientIp::behind_proxies(["10.0.0.10/32"]).unwrap());
    let layer = RateLimitLayer::new(memory, Policy::new("ip", limit()).unwrap().key(key)).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer.clone());
    let proxied = || {
        with_header(
            common::request_from("/", "10.0.0.10:1000"),
            "x-forwarded-for",
            "198.51.100.7",
        )
    };
    assert_eq!(statuses(&app, proxied, 3).await, [200, 200, 429]);
    layer
        .resetter()
        .reset_ip("198.51.100.7".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(statuses(&app, proxied, 3).await, [200, 200, 429]);
}

/// A key with a part that a bare address does not carry (here a header) is not reset by
/// address: `NoKey`, and nothing is forgotten.
#[tokio::test]
async fn reset_ip_of_a_key_with_other_parts_is_no_key() {
    let (_clock, memory) = store();
    let layer = RateLimitLayer::new(memory, login_policy()).unwrap();
    let result = layer
        .resetter()
        .reset_ip("203.0.113.9".parse().unwrap())
        .await;
    assert!(matches!(result, Err(ResetError::NoKey)), "{result:?}");
    // Nor the route: a request made of an address has none, though a real request that matches
    // no route has `<unmatched>` (the key of the fallback's answers). Answered `NoKey`, not
    // `Ok` for a key no request of the client has, with the client still limited.
    use tower_ratelimit::key::{PeerIp, RouteKey};
    let limit = || Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap();
    let route_first = Policy::new("ip", limit())
        .unwrap()
        .key((RouteKey::new(), PeerIp::new()));
    let route_last = Policy::new("ip", limit())
        .unwrap()
        .key((PeerIp::new(), RouteKey::new()));
    for policy in [route_first, route_last] {
        let (_clock, memory) = store();
        let layer = RateLimitLayer::new(memory, policy).unwrap();
        let app = Router::new()
            .route("/login", get(|| async { "ok" }))
            .route_layer(layer.clone());
        let from = || common::request_from("/login", "203.0.113.9:1000");
        assert_eq!(statuses(&app, from, 3).await, [200, 200, 429]);
        let result = layer
            .resetter()
            .reset_ip("203.0.113.9".parse().unwrap())
            .await;
        assert!(matches!(result, Err(ResetError::NoKey)), "{result:?}");
        assert_eq!(statuses(&app, from, 1).await, [429]);
    }
}
