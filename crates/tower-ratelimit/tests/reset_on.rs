//! `RateLimitLayerBuilder::reset_on`: the layer forgets a client's count when the inner
//! service's response meets a condition, through a real axum `Router`.

mod common;

use std::future::{Future, Ready, pending, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use common::{
    Lines, StoreDown, SwitchStore, TestStore, header, request, send, statuses, store, with_header,
};
use http::HeaderValue;
use ratelimit_core::{Algorithm, Decision, Limit, Quota, Reset, Store};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{
    FailurePolicy, Headers, MissingKey, Policy, RateLimitLayer, RateLimitLayerBuilder, Verdict,
    VerdictKind,
};

fn login_policy() -> Policy {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    Policy::new("login", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap())
}

/// The login handler: 204 for the right password, 401 for any other; it knows nothing of the
/// limit. A right password sent with `x-remember` also marks its response with `SignedIn`.
async fn login(req: Request) -> Response {
    if req.headers().get("x-password") != Some(&HeaderValue::from_static("hunter2")) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut res = StatusCode::NO_CONTENT.into_response();
    if req.headers().contains_key("x-remember") {
        res.extensions_mut().insert(SignedIn);
    }
    res
}

#[derive(Clone)]
struct SignedIn;

fn app<St: Store + Reset>(builder: RateLimitLayerBuilder<St>) -> Router {
    let layer = builder.reset_on(|res| res.status().is_success()).build();
    Router::new()
        .route("/login", get(login))
        .route_layer(layer.unwrap())
}

/// The login policy's resets recorded so far, by outcome.
fn resets(snapshotter: &metrics_util::debugging::Snapshotter) -> impl Fn(&str) -> u64 {
    common::resets(snapshotter, "login")
}

fn attempt(user: &str, password: &str) -> http::Request<axum::body::Body> {
    with_header(
        with_header(request("/login"), "x-user", user),
        "x-password",
        password,
    )
}

/// `user` fails twice (401s, let through), then signs in (204): the sign-in's response.
async fn signs_in_after_two_failures(app: &Router, user: &str) -> Response {
    assert_eq!(
        statuses(app, || attempt(user, "guess"), 2).await,
        [401, 401]
    );
    let res = send(app, attempt(user, "hunter2")).await;
    assert_eq!(res.status(), 204);
    res
}

/// Alice's count: how many of four failed attempts pass (3 after a reset, fewer before).
async fn failures_let_through(app: &Router, user: &str) -> usize {
    statuses(app, || attempt(user, "guess"), 4)
        .await
        .iter()
        .filter(|&&s| s == 401)
        .count()
}

#[tokio::test]
async fn a_successful_login_resets_only_that_users_count() {
    let (_clock, memory) = store();
    let app = app(RateLimitLayer::builder(memory, login_policy()));
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    assert_eq!(
        statuses(&app, || attempt("bob", "guess"), 2).await,
        [401, 401]
    );
    // Alice's third request, her success, spends her last unit and then forgets them all.
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 4).await,
        [401, 401, 401, 429]
    );
    // Bob's two failures still count.
    assert_eq!(
        statuses(&app, || attempt("bob", "guess"), 2).await,
        [401, 429]
    );
    // A spent quota is not reset by a success: the 429 is the layer's, not the handler's.
    assert_eq!(send(&app, attempt("bob", "hunter2")).await.status(), 429);
    assert_eq!(failures_let_through(&app, "bob").await, 0);
}

/// The response that resets tells the client where its next request starts (a full quota),
/// not what its own check left; its verdict keeps the check's decision.
#[tokio::test]
async fn the_resetting_response_tells_the_full_quota() {
    let (_clock, memory) = store();
    let policy = login_policy().headers(Headers::ietf().legacy(true));
    let app = app(RateLimitLayer::builder(memory, policy));
    let res = signs_in_after_two_failures(&app, "alice").await;
    common::assert_tells_the_full_quota_after_its_last_unit(&res);
    // And so it is.
    let res = send(&app, attempt("alice", "guess")).await;
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=2;t=20"));
}

/// Of a limit of several quotas, the full quota told is the binding one's, as a check's is: the
/// one with the fewest requests.
#[tokio::test]
async fn the_full_quota_told_after_a_reset_is_the_binding_one() {
    let (_clock, memory) = store();
    let limit = Limit::new(
        Algorithm::Gcra,
        vec![Quota::per_minute(10).unwrap(), Quota::per_hour(4).unwrap()],
    )
    .unwrap();
    let policy = Policy::new("login", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap());
    let app = app(RateLimitLayer::builder(memory, policy));
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    let res = send(&app, attempt("alice", "hunter2")).await;
    assert_eq!(res.status(), 204);
    assert_eq!(header(&res, "ratelimit"), Some("\"login.1\";r=4"));
}

/// The condition reads the whole head: here a marker the handler puts in the extensions.
#[tokio::test]
async fn only_a_response_meeting_the_condition_resets() {
    let (_clock, memory) = store();
    let layer = RateLimitLayer::builder(memory, login_policy())
        .reset_on(|res| res.extensions().get::<SignedIn>().is_some())
        .build()
        .unwrap();
    let app = Router::new().route("/login", get(login)).route_layer(layer);
    // 204s without the marker: counted, not reset.
    assert_eq!(
        statuses(&app, || attempt("alice", "hunter2"), 2).await,
        [204, 204]
    );
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 429]
    );
    // With it: reset.
    assert_eq!(
        statuses(&app, || attempt("bob", "guess"), 2).await,
        [401, 401]
    );
    let remember = with_header(attempt("bob", "hunter2"), "x-remember", "1");
    assert_eq!(send(&app, remember).await.status(), 204);
    assert_eq!(failures_let_through(&app, "bob").await, 3);
}

/// Configured as tower_governor is (no verdict, no fields, the inner body type kept), nothing
/// travels with an allowed request on its own: the condition makes the decision travel.
#[tokio::test]
async fn a_layer_with_nothing_to_add_resets_too() {
    let (_clock, memory) = store();
    let policy = login_policy().verdict(false).headers(Headers::none());
    let layer = RateLimitLayer::builder(memory, policy)
        .reset_on(|res| res.status().is_success())
        .build()
        .unwrap()
        .same_body();
    let app = Router::new().route("/login", get(login)).route_layer(layer);
    assert_eq!(failures_let_through(&app, "alice").await, 3);
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 429);
    // What travels with the request to make the reset adds nothing to the response.
    let res = send(&app, attempt("dave", "hunter2")).await;
    assert_eq!(res.status(), 204);
    assert!(res.extensions().get::<Verdict>().is_none());
    assert!(
        res.headers()
            .keys()
            .all(|name| !name.as_str().contains("ratelimit")),
        "{:?}",
        res.headers()
    );
    // Through another user: a success within the quota resets.
    assert_eq!(
        statuses(&app, || attempt("carol", "guess"), 2).await,
        [401, 401]
    );
    assert_eq!(send(&app, attempt("carol", "hunter2")).await.status(), 204);
    assert_eq!(failures_let_through(&app, "carol").await, 3);
}

/// A store that answers after a yield, as a network store does: the check waits, and so does
/// the reset after it.
#[tokio::test]
async fn a_store_that_waits_resets_after_the_response() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let app = app(RateLimitLayer::builder(switch.clone(), login_policy()));
    let res = signs_in_after_two_failures(&app, "alice").await;
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=3"));
    assert_eq!(failures_let_through(&app, "alice").await, 3);
    assert_eq!(switch.calls(), 2 + 1 + 4);
}

/// In a dry run a would-be denial goes through; its success resets, so the next request is no
/// longer a would-be denial.
#[tokio::test]
async fn a_dry_run_resets_as_the_live_layer_would() {
    let (_clock, memory) = store();
    let app = app(RateLimitLayer::builder(
        memory,
        login_policy().dry_run(true),
    ));
    let kinds = |app: Router, password: &'static str, n: usize| async move {
        let mut out = Vec::new();
        for _ in 0..n {
            let res = send(&app, attempt("alice", password)).await;
            out.push(res.extensions().get::<Verdict>().unwrap().kind());
        }
        out
    };
    use VerdictKind::{Allowed, ShadowDenied};
    assert_eq!(
        kinds(app.clone(), "guess", 4).await,
        [Allowed, Allowed, Allowed, ShadowDenied]
    );
    assert_eq!(kinds(app.clone(), "hunter2", 1).await, [ShadowDenied]);
    assert_eq!(
        kinds(app.clone(), "guess", 4).await,
        [Allowed, Allowed, Allowed, ShadowDenied]
    );
}

/// An allow-listed request is not counted, and its success resets nothing.
#[tokio::test]
async fn an_allow_listed_success_resets_nothing() {
    let (_clock, memory) = store();
    let policy = login_policy().allow(|req| req.headers().contains_key("x-internal"));
    let (app, snapshotter) = common::recorded(|| app(RateLimitLayer::builder(memory, policy)));
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    let internal = with_header(attempt("alice", "hunter2"), "x-internal", "1");
    assert_eq!(send(&app, internal).await.status(), 204);
    assert_eq!(failures_let_through(&app, "alice").await, 1);
    assert_eq!(resets(&snapshotter)("reset"), 0);
}

/// Requests without a key share one bucket (`MissingKey::SharedKey`): a keyless success resets
/// nothing, and is counted as `no_key`.
#[tokio::test]
async fn a_success_without_a_key_resets_nothing() {
    let (_clock, memory) = store();
    let policy = login_policy().missing_key(MissingKey::shared_key("anonymous"));
    let (app, snapshotter) = common::recorded(|| app(RateLimitLayer::builder(memory, policy)));
    let keyless = |password: &str| with_header(request("/login"), "x-password", password);
    assert_eq!(send(&app, keyless("guess")).await.status(), 401);
    assert_eq!(send(&app, keyless("hunter2")).await.status(), 204);
    assert_eq!(send(&app, keyless("guess")).await.status(), 401);
    assert_eq!(send(&app, keyless("guess")).await.status(), 429);
    let count = resets(&snapshotter);
    assert_eq!([count("reset"), count("no_key")], [0, 1]);
}

/// A memory store whose resets never complete, fail at once, or are made after a delay of
/// tokio's time (as over a network round trip).
struct OddReset {
    inner: TestStore,
    reset: ResetIs,
}

enum ResetIs {
    Hanging,
    Failing,
    After(Duration),
}

impl Store for OddReset {
    type Error = StoreDown;
    type Future = Ready<Result<Decision, StoreDown>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        ready(Ok(self.inner.check_now(key, limit, cost)))
    }
}

impl Reset for OddReset {
    type ResetFuture = Pin<Box<dyn Future<Output = Result<(), StoreDown>> + Send>>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        match self.reset {
            ResetIs::Hanging => Box::pin(pending()),
            ResetIs::Failing => Box::pin(ready(Err(StoreDown))),
            ResetIs::After(delay) => {
                let (inner, key, limit) = (self.inner.clone(), key.to_vec(), limit.clone());
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    inner.reset_now(&key, &limit);
                    Ok(())
                })
            }
        }
    }
}

/// A reset that does not complete holds the response up to the layer's timeout, no longer; the
/// response goes out, the count stays, and the timeout is counted.
#[tokio::test(start_paused = true)]
async fn a_reset_that_hangs_is_cut_at_the_timeout() {
    let (_clock, memory) = store();
    let (app, snapshotter) = common::recorded(|| {
        let store = OddReset {
            inner: memory,
            reset: ResetIs::Hanging,
        };
        app(RateLimitLayer::builder(store, login_policy()).timeout(Duration::from_millis(40)))
    });
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    let start = tokio::time::Instant::now();
    let res = send(&app, attempt("alice", "hunter2")).await;
    assert_eq!(res.status(), 204);
    assert_eq!(start.elapsed(), Duration::from_millis(40));
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=1;t=20"));
    assert_eq!(failures_let_through(&app, "alice").await, 1);
    assert_eq!(resets(&snapshotter)("timeout"), 1);
}

/// Resets that fail or time out are written at most once a second each per layer (by the
/// layer's clock), with `held_back=` the failures not written, as the check's failures are:
/// resets are no checks, so the breaker never stops them, and a login route whose successes each
/// reset (while resets fail and checks do not: an ACL user without a command a reset needs)
/// wrote a warning per request, as many as its clients made it. Each is counted all the same.
#[tokio::test(start_paused = true)]
async fn failed_resets_are_logged_at_most_once_a_second() {
    for (reset, line) in [
        (ResetIs::Failing, "rate-limit reset failed"),
        (ResetIs::Hanging, "rate-limit reset timed out"),
    ] {
        let (clock, memory) = store();
        let (app, snapshotter) = common::recorded(|| {
            let store = OddReset {
                inner: memory,
                reset,
            };
            app(RateLimitLayer::builder(store, login_policy())
                .timeout(Duration::from_millis(40))
                .clock(clock.clone()))
        });
        let (lines, _guard) = Lines::capture();
        let sign_in = |n: usize| {
            let app = app.clone();
            async move {
                for i in 0..n {
                    let res = send(&app, attempt(&format!("user-{i}"), "hunter2")).await;
                    assert_eq!(res.status(), 204);
                }
            }
        };
        sign_in(50).await;
        let written = |lines: &Lines| lines.text().matches(line).count();
        assert_eq!(written(&lines), 1, "{}", lines.text());
        clock.advance(Duration::from_secs(1));
        sign_in(1).await;
        assert_eq!(written(&lines), 2, "{}", lines.text());
        assert!(lines.text().contains("held_back=49"), "{}", lines.text());
        let outcome = if line.ends_with("failed") {
            "error"
        } else {
            "timeout"
        };
        assert_eq!(resets(&snapshotter)(outcome), 51);
    }
}

/// While the store is down, a request let through by the fallback's local share resets that
/// share, and the store is not asked (which would be a failed reset, counted as an error): the
/// reset is counted as skipped, since the store's count stands.
#[tokio::test]
async fn during_an_outage_only_the_fallback_share_is_reset() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let policy = common::shared_login_policy();
    let (app, snapshotter) = common::recorded(|| {
        app(RateLimitLayer::builder(switch.clone(), policy).no_circuit_breaker())
    });
    switch.set_down(true);
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    assert_eq!(failures_let_through(&app, "alice").await, 3);
    let count = resets(&snapshotter);
    assert_eq!(
        [count("skipped"), count("reset"), count("error")],
        [1, 0, 0]
    );
}

/// In a dry run of a fail-closed policy, a request the store failed on goes through as a
/// would-be denial: its success does not ask the store to reset either.
#[tokio::test]
async fn a_dry_run_during_an_outage_leaves_the_store_alone() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let policy = login_policy()
        .dry_run(true)
        .failure(FailurePolicy::fail_closed(Duration::from_secs(5)));
    let (app, snapshotter) = common::recorded(|| {
        app(RateLimitLayer::builder(switch.clone(), policy).no_circuit_breaker())
    });
    switch.set_down(true);
    let res = send(&app, attempt("alice", "hunter2")).await;
    assert_eq!(res.status(), 204);
    assert_eq!(
        res.extensions().get::<Verdict>().map(Verdict::kind),
        Some(VerdictKind::ShadowDenied)
    );
    let count = resets(&snapshotter);
    assert_eq!(
        [count("skipped"), count("reset"), count("error")],
        [1, 0, 0]
    );
}

/// While the key's circuit is open, a request answered from what a wrapper holds (a lease's
/// units) is let through without the store: its success does not ask the store to reset.
#[tokio::test]
async fn an_answer_held_in_front_of_an_open_circuit_leaves_the_store_alone() {
    let (clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let leasing = Arc::new(
        ratelimit_core::Leasing::builder(switch.clone(), clock)
            .lease_size(3)
            .build()
            .unwrap(),
    );
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(6).unwrap()).unwrap();
    let policy = Policy::new("login", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap());
    let breaker = tower_ratelimit::CircuitBreaker::new(1, Duration::from_secs(60)).unwrap();
    let (layer, snapshotter) = common::recorded(|| {
        RateLimitLayer::builder(leasing.clone(), policy)
            .circuit_breaker(breaker)
            .reset_on(|res| res.status().is_success())
            .build()
            .unwrap()
    });
    let app = Router::new()
        .route("/login", get(login))
        .route_layer(layer.clone());
    // Alice takes a lease of three units and spends one.
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    // The store goes down: Bob's check fails (failing open) and opens the circuit.
    switch.set_down(true);
    assert_eq!(send(&app, attempt("bob", "guess")).await.status(), 401);
    assert_eq!(
        layer.circuit_state(),
        Some(tower_ratelimit::CircuitState::Open)
    );
    // Alice signs in on a leased unit.
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    let count = resets(&snapshotter);
    assert_eq!(
        [count("skipped"), count("reset"), count("error")],
        [1, 0, 0]
    );
}

/// A success whose check was made before the circuit opened: by its response the store is
/// taken to be down, and its reset is not sent (it would wait for the store up to the timeout),
/// even once the circuit has cooled down (a `Resetter`'s reset would then be sent: no response
/// waits for it).
#[tokio::test]
async fn a_circuit_opened_while_the_request_was_served_is_not_asked_to_reset() {
    for cooled_down in [false, true] {
        let (clock, memory) = store();
        let switch = Arc::new(SwitchStore::new(memory));
        let breaker = tower_ratelimit::CircuitBreaker::new(1, Duration::from_secs(10)).unwrap();
        let (layer, snapshotter) = common::recorded(|| {
            RateLimitLayer::builder(switch.clone(), login_policy())
                .circuit_breaker(breaker)
                .clock(clock.clone())
                .reset_on(|res| res.status().is_success())
                .build()
                .unwrap()
        });
        // A request with `x-held` waits in the handler, after its check, until let go.
        let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let handler = {
            let (entered, go) = (entered.clone(), go.clone());
            move |req: Request| async move {
                if req.headers().contains_key("x-held") {
                    entered.notify_one();
                    go.notified().await;
                }
                login(req).await
            }
        };
        let app = Router::new()
            .route("/login", get(handler))
            .route_layer(layer.clone());
        assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
        let signing_in = tokio::spawn({
            let app = app.clone();
            async move {
                let held = with_header(attempt("alice", "hunter2"), "x-held", "1");
                send(&app, held).await.status()
            }
        });
        entered.notified().await;
        // While Alice's sign-in is served, the store goes down and Bob's check opens the
        // circuit.
        switch.set_down(true);
        assert_eq!(send(&app, attempt("bob", "guess")).await.status(), 401);
        assert_eq!(
            layer.circuit_state(),
            Some(tower_ratelimit::CircuitState::Open)
        );
        if cooled_down {
            clock.advance(Duration::from_secs(15));
        }
        go.notify_one();
        assert_eq!(signing_in.await.unwrap(), 204);
        let count = resets(&snapshotter);
        assert_eq!(
            [count("skipped"), count("reset"), count("error")],
            [1, 0, 0],
            "cooled down: {cooled_down}"
        );
    }
}

/// Failing open, there is no local count to reset and the store is not asked: skipped.
#[tokio::test]
async fn failing_open_resets_nothing() {
    let (_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let policy = login_policy().failure(FailurePolicy::FailOpen);
    let (app, snapshotter) = common::recorded(|| {
        app(RateLimitLayer::builder(switch.clone(), policy).no_circuit_breaker())
    });
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    switch.set_down(true);
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    switch.set_down(false);
    // The failure counted before the outage is still counted.
    assert_eq!(failures_let_through(&app, "alice").await, 2);
    let count = resets(&snapshotter);
    assert_eq!(
        [count("skipped"), count("reset"), count("error")],
        [1, 0, 0]
    );
}

/// A reset that fails: the response goes out as it is, the count stays, and the error is
/// counted.
#[tokio::test]
async fn a_failed_reset_leaves_the_response_as_it_is() {
    let (_clock, memory) = store();
    let store = OddReset {
        inner: memory,
        reset: ResetIs::Failing,
    };
    let (app, snapshotter) =
        common::recorded(|| app(RateLimitLayer::builder(store, login_policy())));
    assert_eq!(send(&app, attempt("alice", "guess")).await.status(), 401);
    let res = send(&app, attempt("alice", "hunter2")).await;
    assert_eq!(res.status(), 204);
    assert_eq!(
        res.extensions().get::<Verdict>().map(Verdict::kind),
        Some(VerdictKind::Allowed)
    );
    // The count stands, and the fields say so: what the check left.
    assert_eq!(header(&res, "ratelimit"), Some("\"login\";r=1;t=20"));
    assert_eq!(failures_let_through(&app, "alice").await, 1);
    assert_eq!(resets(&snapshotter)("error"), 1);
}

/// The response waits for the reset; a client that goes away first (its response dropped)
/// does not cancel it: it runs on in a task of its own.
#[tokio::test(start_paused = true)]
async fn a_reset_outlives_a_response_dropped_before_it() {
    let (_clock, memory) = store();
    let store = OddReset {
        inner: memory,
        reset: ResetIs::After(Duration::from_millis(30)),
    };
    let app = app(RateLimitLayer::builder(store, login_policy()));
    assert_eq!(
        statuses(&app, || attempt("alice", "guess"), 2).await,
        [401, 401]
    );
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, attempt("alice", "hunter2")).await.status(), 204);
    assert_eq!(start.elapsed(), Duration::from_millis(30));
    // Bob signs in after two failures and goes away before the reset is done.
    assert_eq!(
        statuses(&app, || attempt("bob", "guess"), 2).await,
        [401, 401]
    );
    let gone = tokio::time::timeout(
        Duration::from_millis(10),
        send(&app, attempt("bob", "hunter2")),
    );
    assert!(gone.await.is_err());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(failures_let_through(&app, "alice").await, 3);
    assert_eq!(failures_let_through(&app, "bob").await, 3);
}
