//! Failure policies with stores that fail or hang: fail open, fail closed, local fallback, the
//! timeout and the circuit breaker.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota, Store};
use tower_ratelimit::{
    BodyMode, CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer, Verdict,
    VerdictKind,
};

fn per_minute(n: u64) -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(n).unwrap()).unwrap()
}

fn app<St: Store, M>(layer: RateLimitLayer<St, M>) -> Router
where
    St::Future: Unpin,
    M: BodyMode<axum::body::Body>,
    M::Body: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <M::Body as http_body::Body>::Error: Into<axum::BoxError>,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A layer over a store that never answers, failing closed (`Retry-After: 2`) after `timeout`,
/// with no circuit breaker.
fn hanging_fail_closed(name: &str, timeout: Duration) -> RateLimitLayer<Arc<HangingStore>> {
    RateLimitLayer::builder(
        Arc::new(HangingStore::default()),
        Policy::new(name, per_minute(1))
            .unwrap()
            .failure(FailurePolicy::fail_closed(Duration::from_secs(2))),
    )
    .timeout(timeout)
    .no_circuit_breaker()
    .build()
    .unwrap()
}

/// [`closed_with_breaker`], with the recorder of its metrics.
fn breaker_layer<St: Store>(
    store: St,
    policy: Policy,
    clock: &ManualClock,
) -> (RateLimitLayer<St>, metrics_util::debugging::Snapshotter) {
    recorded(|| closed_with_breaker(store, policy, clock))
}

fn verdict(res: &http::Response<axum::body::Body>) -> VerdictKind {
    res.extensions().get::<Verdict>().unwrap().kind()
}

#[tokio::test]
async fn fail_open_lets_requests_through_and_records_them() {
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            FailingStore::default(),
            Policy::new("open", per_minute(1))
                .unwrap()
                .failure(FailurePolicy::FailOpen),
        )
        .no_circuit_breaker()
        .build()
        .unwrap()
    });
    let app = app(layer);
    for _ in 0..3 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(verdict(&res), VerdictKind::FailedOpen);
        assert!(res.headers().get("ratelimit").is_none());
    }
    let m = Recorded::take(&snapshotter);
    assert_eq!(m.outcome("open", "failed_open"), 3);
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "open"), ("kind", "error")]
        ),
        3
    );
}

#[tokio::test]
async fn fail_closed_answers_503_with_retry_after() {
    let layer = RateLimitLayer::new(
        FailingStore::default(),
        Policy::new("login", per_minute(5))
            .unwrap()
            .failure(FailurePolicy::fail_closed(Duration::from_millis(1_500))),
    )
    .unwrap();
    let res = send(&app(layer), request("/")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after"), Some("2"));
    assert_eq!(verdict(&res), VerdictKind::FailedClosed);
    // A cost of 0, which the limit always lets through, still needs the store's answer.
    let free = RateLimitLayer::new(
        FailingStore::default(),
        Policy::new("login", per_minute(5))
            .unwrap()
            .cost(|_| 0)
            .failure(FailurePolicy::fail_closed(Duration::from_millis(1_500))),
    )
    .unwrap();
    let res = send(&app(free), request("/")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(verdict(&res), VerdictKind::FailedClosed);
}

/// A dry run never denies, not even when its store fails and its failure policy would fail
/// closed: the request goes through, marked as a shadow denial. (A mutation answering 503 there
/// survived the tests of this file.)
#[tokio::test]
async fn a_dry_run_that_would_fail_closed_lets_the_request_through() {
    let layer = RateLimitLayer::new(
        FailingStore::default(),
        Policy::new("login", per_minute(5))
            .unwrap()
            .dry_run(true)
            .failure(FailurePolicy::fail_closed(Duration::from_millis(1_500))),
    )
    .unwrap();
    let res = send(&app(layer), request("/")).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(verdict(&res), VerdictKind::ShadowDenied);
}

// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn fallback_counts_locally_against_a_share_of_the_limit() {
    let clock = ManualClock::new();
    // 6 a minute shared by 3 gateways: 2 a minute each while the store is down.
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            FailingStore::default(),
            Policy::new("fb", per_minute(6))
                .unwrap()
                .failure(FailurePolicy::fallback(3).unwrap()),
        )
        .no_circuit_breaker()
        .clock(clock.clone())
        .build()
        .unwrap()
    });
    let app = app(layer);
    // The headers advertise the quota the fallback enforces, the local share.
    for remaining in ["1", "0"] {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(verdict(&res), VerdictKind::FallbackAllowed);
        assert_eq!(header(&res, "ratelimit-policy"), Some("\"fb\";q=2;w=60"));
        let r = header(&res, "ratelimit").unwrap();
        assert!(r.starts_with(&format!("\"fb\";r={remaining};")), "{r}");
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(verdict(&res), VerdictKind::FallbackDenied);
    assert_eq!(header(&res, "retry-after"), Some("30"));
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"fb\";q=2;w=60"));
    // Other clients have their own local share.
    assert_eq!(
        send(&app, request_from("/", "192.0.2.99:1")).await.status(),
        200
    );
    // The fallback runs on the layer's clock.
    clock.advance(Duration::from_secs(30));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    let m = Recorded::take(&snapshotter);
    assert_eq!(m.outcome("fb", "fallback_allowed"), 4);
    assert_eq!(m.outcome("fb", "fallback_denied"), 1);
}

/// `policy` (6 a minute, costs from `x-cost`) falling back to a third of its limit on `store`,
/// behind a breaker that opens after 2 failures for 7 s.
fn fallback_behind_breaker<St: Store>(
    store: St,
    policy: Policy,
    clock: &ManualClock,
) -> RateLimitLayer<St> {
    RateLimitLayer::builder(
        store,
        policy
            .cost(cost_header)
            .failure(FailurePolicy::fallback(3).unwrap()),
    )
    .circuit_breaker(CircuitBreaker::new(2, Duration::from_secs(7)).unwrap())
    .clock(clock.clone())
    .build()
    .unwrap()
}

/// `req` with `x-cost: n`.
fn costing(mut req: http::Request<axum::body::Body>, n: u64) -> http::Request<axum::body::Body> {
    req.headers_mut()
        .insert("x-cost", http::HeaderValue::from(n));
    req
}

/// A cost above each gateway's share of the limit, which the shared limit admits, is denied by
/// the fallback only until the store is back: the 429 says when the layer asks the store again
/// (what is left of the cool-down of the key's circuit while it is open, including when this
/// very failure opened it; 1 s while it is closed), where before it said nothing, as for a cost
/// that can never pass. A cost above the shared limit itself still gets no `Retry-After`.
#[tokio::test]
async fn a_cost_above_the_fallback_share_is_told_when_the_store_is_asked_again() {
    let clock = ManualClock::new();
    // A burst of 6 shared by 3 gateways: 2 each while the store is down.
    let policy = Policy::new("fb", per_minute(6)).unwrap();
    let app = app(fallback_behind_breaker(
        FailingStore::default(),
        policy,
        &clock,
    ));
    let wait_for = |res: &http::Response<axum::body::Body>| {
        assert_eq!(res.status(), 429);
        assert_eq!(verdict(res), VerdictKind::FallbackDenied);
        let wait = header(res, "retry-after").map(str::to_owned);
        // `t` says the same wait (none when none would help: the local share is whole).
        let t = header(res, "ratelimit")
            .and_then(|v| v.rsplit_once(";t="))
            .map(|(_, t)| t.to_owned());
        assert_eq!(t, wait);
        wait
    };
    // A failure that leaves the circuit closed: the next request asks the store again.
    let res = send(&app, costing(request("/"), 4)).await;
    assert_eq!(wait_for(&res).as_deref(), Some("1"));
    // The failure that opens it, and a request it then turns away: the next probe is a
    // cool-down away.
    for _ in 0..2 {
        let res = send(&app, costing(request("/"), 4)).await;
        assert_eq!(wait_for(&res).as_deref(), Some("7"));
    }
    // What is left of it, 3 s on.
    clock.advance(Duration::from_secs(3));
    let res = send(&app, costing(request("/"), 4)).await;
    assert_eq!(wait_for(&res).as_deref(), Some("4"));
    // The probe, when the cool-down is over, fails and opens the circuit again.
    clock.advance(Duration::from_secs(4));
    let res = send(&app, costing(request("/"), 4)).await;
    assert_eq!(wait_for(&res).as_deref(), Some("7"));
    // Above the shared limit too: no wait would help.
    let res = send(&app, costing(request("/"), 7)).await;
    assert_eq!(wait_for(&res), None);
    // Within the share: the local bucket's own wait, as before.
    assert_eq!(send(&app, costing(request("/"), 2)).await.status(), 200);
    let res = send(&app, costing(request("/"), 1)).await;
    assert_eq!(wait_for(&res).as_deref(), Some("30"));
}

/// With a circuit per failure domain, the wait follows the key's own circuit: another domain's
/// open circuit does not make a key whose circuit is closed wait a cool-down. A custom body is
/// given the same wait.
#[tokio::test]
async fn the_fallbacks_wait_follows_the_keys_own_circuit() {
    let (clock, memory) = store();
    let store = HalfDown::odd_down(memory);
    let body = tower_ratelimit::DenialBody::custom(|denial| {
        let wait = denial
            .retry_after_secs()
            .map_or("none".into(), |s| s.to_string());
        http::Response::new(bytes::Bytes::from(wait))
    });
    let policy = Policy::new("fb", per_minute(6))
        .unwrap()
        .key(tower_ratelimit::key::ApiKeyHeader::new("x-api-key").unwrap())
        .body(body);
    let app = app(fallback_behind_breaker(store.clone(), policy, &clock));
    // The odd domain's circuit: closed after one failure, open after two.
    let res = send(&app, costing(with_key("k1"), 4)).await;
    assert_eq!(header(&res, "retry-after"), Some("1"));
    let res = send(&app, costing(with_key("k1"), 4)).await;
    assert_eq!(header(&res, "retry-after"), Some("7"));
    let res = send(&app, costing(with_key("k1"), 4)).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("7"));
    assert_eq!(body_text(res).await, "7");
    // Now the even domain fails too: its circuit is closed, so 1 s.
    store.store.set_down(true);
    let res = send(&app, costing(with_key("k0"), 4)).await;
    assert_eq!(res.status(), 429);
    assert_eq!(verdict(&res), VerdictKind::FallbackDenied);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(body_text(res).await, "1");
    // Above the shared limit: the custom body is told there is no wait.
    let res = send(&app, costing(with_key("k0"), 7)).await;
    assert_eq!(header(&res, "retry-after"), None);
    assert_eq!(body_text(res).await, "none");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_is_cut_at_the_timeout() {
    let store = Arc::new(HangingStore::default());
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            store.clone(),
            Policy::new("hang", per_minute(5))
                .unwrap()
                .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
        )
        .timeout(Duration::from_millis(80))
        .build()
        .unwrap()
    });
    let app = app(layer);
    let start = tokio::time::Instant::now();
    let res = send(&app, request("/")).await;
    assert_eq!(start.elapsed(), Duration::from_millis(80));
    assert_eq!(res.status(), 503);
    assert_eq!(verdict(&res), VerdictKind::FailedClosed);
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "hang"), ("kind", "timeout")]
        ),
        1
    );
    assert_eq!(m.outcome("hang", "failed_closed"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_timeout_counts_from_the_call_not_from_the_first_poll() {
    use tower::{Service, ServiceExt};
    // A caller that polls the response future late (a busy executor, a queue between the call
    // and the poll) does not extend the store's time: the check was sent in `call`.
    let layer = hanging_fail_closed("late", Duration::from_millis(80));
    // The layer on a service of its own: axum's router would call it at the first poll only.
    let mut svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let fut = ServiceExt::<http::Request<axum::body::Body>>::ready(&mut svc)
        .await
        .unwrap()
        .call(request("/"));
    tokio::time::advance(Duration::from_millis(100)).await;
    let start = tokio::time::Instant::now();
    let res = fut.await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::FailedClosed
    );
}

/// `call` needs no Tokio runtime, only the response future's polls do (a store that has to wait
/// gets its timer there): a caller may make the call on a thread of its own.
#[test]
fn call_needs_no_runtime_only_the_poll_does() {
    use std::task::{Context, Poll, Waker};
    use tower::Service;
    let layer = hanging_fail_closed("outside", Duration::from_millis(20));
    let mut svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let fut = std::thread::spawn(move || {
        let ready = svc.poll_ready(&mut Context::from_waker(Waker::noop()));
        assert!(matches!(ready, Poll::Ready(Ok(()))));
        svc.call(request("/"))
    })
    .join()
    .expect("call made outside a runtime");
    // Paused time: the timeout is not waited for.
    let res = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(fut)
        .unwrap();
    assert_eq!(res.status(), 503);
}

/// A check dropped where no Tokio runtime is current has nothing to finish it on, and counts for
/// nothing, a probe being handed on; even when the drop comes from a panic of the caller's (`call`
/// needs no runtime, so a thread that calls and then panics drops the future as it unwinds).
/// Before, such a drop counted as a failure of the store: a healthy store's circuit opened, and a
/// probe so dropped opened its circuit again for a whole cool-down.
#[test]
fn a_check_dropped_by_a_callers_panic_outside_a_runtime_counts_for_nothing() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::Ordering;
    use std::task::{Context, Waker};
    use tower::Service;
    fn service<St: Store>(
        layer: &RateLimitLayer<St>,
    ) -> impl Service<http::Request<axum::body::Body>, Error = std::convert::Infallible> {
        tower::Layer::layer(
            layer,
            tower::service_fn(|_req: http::Request<axum::body::Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            }),
        )
    }
    /// A call of `svc`, dropped as the thread panics right after it.
    fn call_then_panic<Sv: Service<http::Request<axum::body::Body>>>(svc: &mut Sv) {
        let dropped = catch_unwind(AssertUnwindSafe(|| {
            assert!(
                svc.poll_ready(&mut Context::from_waker(Waker::noop()))
                    .is_ready()
            );
            let _sent = svc.call(request("/"));
            panic!("a bug of the caller's, after its call");
        }));
        assert!(dropped.is_err());
    }
    let clock = ManualClock::new();
    let breaker = || CircuitBreaker::new(1, Duration::from_secs(5)).unwrap();

    // A check of a healthy (if slow) store.
    let hanging = Arc::new(HangingStore::default());
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(hanging.clone(), Policy::new("nort", per_minute(9)).unwrap())
            .circuit_breaker(breaker())
            .clock(clock.clone())
            .build()
            .unwrap()
    });
    let mut svc = service(&layer);
    call_then_panic(&mut svc);
    assert_eq!(hanging.calls.load(Ordering::SeqCst), 1);
    let errors = Recorded::take(&snapshotter).counter(
        "ratelimit_store_errors_total",
        &[("policy", "nort"), ("kind", "error")],
    );
    assert_eq!(
        (errors, layer.circuit_state()),
        (0, Some(CircuitState::Closed))
    );

    // A probe: handed on to the next request, which asks the store.
    let (_, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    switch.set_down(true);
    let layer =
        RateLimitLayer::builder(switch.clone(), Policy::new("probe", per_minute(9)).unwrap())
            .circuit_breaker(breaker())
            .clock(clock.clone())
            .build()
            .unwrap();
    let mut svc = service(&layer);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(svc.call(request("/"))).unwrap();
    drop(rt);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(switch.calls(), 1);
    clock.advance(Duration::from_secs(5));
    call_then_panic(&mut svc);
    assert_eq!(switch.calls(), 2, "the probe");
    drop(svc.call(request("/")));
    assert_eq!(switch.calls(), 3, "the next request probes in its place");
}

#[tokio::test(start_paused = true)]
async fn a_slow_store_that_answers_in_time_decides() {
    let (_clock, memory) = store();
    let store = Arc::new(SwitchStore::new(memory));
    let layer =
        RateLimitLayer::new(store.clone(), Policy::new("async", per_minute(2)).unwrap()).unwrap();
    let app = app(layer);
    for _ in 0..2 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(verdict(&res), VerdictKind::Allowed);
        assert!(res.headers().get("ratelimit").is_some());
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("30"));
    assert_eq!(store.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_has_to_wait_answers_in_the_inner_body_type_with_same_body() {
    let (_clock, memory) = store();
    let store = Arc::new(SwitchStore::new(memory));
    let layer = RateLimitLayer::new(
        store.clone(),
        Policy::new("async", per_minute(1))
            .unwrap()
            .failure(FailurePolicy::fail_closed(Duration::from_secs(2))),
    )
    .unwrap()
    .same_body();
    let router = app(layer);
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(body_text(res).await, "ok");
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("60"));
    assert_eq!(body_text(res).await, "Too Many Requests\n");
    assert_eq!(store.calls(), 2);

    // A store that hangs, cut at the timeout inside the boxed future: the fail-closed 503 is
    // written in the inner body type too.
    let layer = hanging_fail_closed("closed", Duration::from_millis(20)).same_body();
    let router = app(layer);
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after"), Some("2"));
    assert_eq!(
        body_text(res).await,
        "Service Unavailable: the rate limiter cannot decide\n"
    );
}

/// Under a problem+json policy, the fail-closed 503 is a problem+json body too (type
/// `about:blank`), with its `Retry-After`.
#[tokio::test(start_paused = true)]
async fn a_problem_json_policy_fails_closed_in_problem_json() {
    let layer = RateLimitLayer::builder(
        Arc::new(HangingStore::default()),
        Policy::new("closed", per_minute(1))
            .unwrap()
            .body(tower_ratelimit::DenialBody::ProblemJson)
            .failure(FailurePolicy::fail_closed(Duration::from_secs(2))),
    )
    .timeout(Duration::from_millis(20))
    .no_circuit_breaker()
    .build()
    .unwrap();
    let res = send(&app(layer), request("/")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after"), Some("2"));
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        body_text(res).await,
        "{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
         \"detail\":\"the rate limiter cannot decide\"}"
    );
}

/// Store latency: every answer that has to wait is timed; answers that come at once are sampled
/// at random, about one in 64, even when two layers' calls interleave on one thread. (The
/// sampler's sequence is fixed per thread, so the counts are the same on every run.)
#[test]
fn waiting_answers_are_all_timed_immediate_ones_sampled() {
    let counts = std::thread::spawn(|| {
        let (_clock, memory) = store();
        let ((waiting, immediate), snapshotter) = recorded(|| {
            let waiting = RateLimitLayer::new(
                Arc::new(SwitchStore::new(memory.clone())),
                Policy::new("waiting", per_minute(10_000)).unwrap(),
            )
            .unwrap();
            let immediate = RateLimitLayer::new(
                memory,
                Policy::new("immediate", per_minute(10_000)).unwrap(),
            )
            .unwrap();
            (waiting, immediate)
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (waiting, immediate) = (app(waiting), app(immediate));
            for _ in 0..3_200 {
                assert_eq!(send(&waiting, request("/")).await.status(), 200);
                assert_eq!(send(&immediate, request("/")).await.status(), 200);
            }
        });
        let m = Recorded::take(&snapshotter);
        let len = |p: &str| m.histogram_len("ratelimit_store_duration_seconds", &[("policy", p)]);
        (
            len("waiting"),
            len("immediate"),
            m.outcome("immediate", "allowed"),
        )
    })
    .join()
    .unwrap();
    let (waiting, immediate, decisions) = counts;
    assert_eq!((waiting, decisions), (3_200, 3_200));
    // 3,200 / 64 = 50 expected.
    assert!((25..=75).contains(&immediate), "{immediate}");
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_after_the_configured_failures_and_half_opens_later() {
    let clock = ManualClock::new();
    let (_store_clock, memory) = store();
    let store = Arc::new(SwitchStore::new(memory));
    store.set_down(true);
    let (layer, snapshotter) = breaker_layer(
        store.clone(),
        Policy::new("cb", per_minute(100)).unwrap(),
        &clock,
    );
    let app = app(layer.clone());

    // Three failures reach the store, then the circuit opens.
    for _ in 0..3 {
        assert_eq!(send(&app, request("/")).await.status(), 503);
    }
    assert_eq!(store.calls(), 3);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // While open, requests get the failure policy without calling the store.
    for _ in 0..5 {
        assert_eq!(send(&app, request("/")).await.status(), 503);
    }
    assert_eq!(store.calls(), 3);
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.gauge("ratelimit_circuit_state", &[("policy", "cb")]),
        Some(1.0)
    );
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "cb"), ("kind", "circuit_open")]
        ),
        5
    );

    // After the cool-down one probe goes to the store; it fails, so the circuit opens again.
    clock.advance(Duration::from_secs(10));
    assert_eq!(send(&app, request("/")).await.status(), 503);
    assert_eq!(store.calls(), 4);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(send(&app, request("/")).await.status(), 503);
    assert_eq!(store.calls(), 4);

    // The store recovers; the next probe after another cool-down closes the circuit.
    store.set_down(false);
    clock.advance(Duration::from_secs(9));
    assert_eq!(
        send(&app, request("/")).await.status(),
        503,
        "still cooling down"
    );
    assert_eq!(store.calls(), 4);
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(store.calls(), 5);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(store.calls(), 6);
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.gauge("ratelimit_circuit_state", &[("policy", "cb")]),
        Some(0.0)
    );
}

#[tokio::test(start_paused = true)]
async fn only_one_probe_while_half_open() {
    let clock = ManualClock::new();
    let store = Arc::new(HangingStore::default());
    let layer = RateLimitLayer::builder(
        store.clone(),
        Policy::new("probe", per_minute(100)).unwrap(),
    )
    .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(5)).unwrap())
    .timeout(Duration::from_millis(100))
    .clock(clock.clone())
    .build()
    .unwrap();
    let app = app(layer.clone());
    assert_eq!(send(&app, request("/")).await.status(), 200, "failed open");
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    clock.advance(Duration::from_secs(5));
    // The probe hangs; meanwhile another request does not call the store.
    let probe = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request("/")).await.status() }
    });
    tokio::task::yield_now().await;
    assert_eq!(layer.circuit_state(), Some(CircuitState::HalfOpen));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(store.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(probe.await.unwrap(), 200);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}

/// Callers that give up sooner than the layer's timeout (a gRPC deadline, an outer timeout, clients
/// that disconnect) still open the circuit over a hanging store: a check whose request is dropped
/// before the store answered runs on to its own deadline, and its timeout counts as a failure.
/// Without that, every request would wait for the hung store until its caller gave up, and the
/// failure policy would never act.
#[tokio::test(start_paused = true)]
async fn checks_dropped_before_the_timeout_still_open_the_circuit() {
    let store = Arc::new(HangingStore::default());
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(store.clone(), Policy::new("gone", per_minute(5)).unwrap())
            .timeout(Duration::from_millis(80))
            .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(30)).unwrap())
            .build()
            .unwrap()
    });
    let app = app(layer.clone());
    for _ in 0..3 {
        // The caller's deadline (20 ms) comes before the layer's timeout (80 ms).
        let gave_up = tokio::time::timeout(Duration::from_millis(20), send(&app, request("/")));
        assert!(gave_up.await.is_err());
    }
    assert_eq!(store.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    // The dropped checks reach their deadline in the background.
    tokio::time::sleep(Duration::from_millis(80)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // Open: the next request gets the failure policy at once, without asking the store.
    let start = tokio::time::Instant::now();
    let res = send(&app, request("/")).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(res.status(), 200);
    assert_eq!(verdict(&res), VerdictKind::FailedOpen);
    assert_eq!(store.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter("ratelimit_checks_cancelled_total", &[("policy", "gone")]),
        3
    );
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "gone"), ("kind", "timeout")]
        ),
        3
    );
    assert_eq!(m.outcome("gone", "failed_open"), 1);
}

/// A check whose request was dropped and that then fails is logged as the layer's own failures
/// are: one line a second at most, with the count of those held back. Every caller here gives
/// up before the layer's timeout (a gRPC deadline, an outer timeout, clients resetting their
/// streams) and the circuit never opens (a threshold never reached, as with successes in
/// between): each failure is one of these, and was one line each.
#[tokio::test(start_paused = true)]
async fn failures_of_dropped_checks_are_logged_at_most_once_a_second() {
    let (lines, _guard) = Lines::capture();
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder(
        Arc::new(HangingStore::default()),
        Policy::new("dropped", per_minute(5)).unwrap(),
    )
    .timeout(Duration::from_millis(80))
    .circuit_breaker(CircuitBreaker::new(1_000, Duration::from_secs(60)).unwrap())
    .clock(clock.clone())
    .build()
    .unwrap();
    let app = app(layer.clone());
    let drop_requests = async |n: usize| {
        for _ in 0..n {
            let gave_up = tokio::time::timeout(Duration::from_millis(20), send(&app, request("/")));
            assert!(gave_up.await.is_err());
        }
        // The dropped checks reach the layer's timeout in the background.
        tokio::time::sleep(Duration::from_millis(80)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };
    const LINE: &str = "rate-limit store check failed (its request was dropped before the answer)";
    drop_requests(50).await;
    let text = lines.text();
    assert_eq!(text.matches(LINE).count(), 1, "{text}");
    assert!(text.contains("held_back=0"), "{text}");
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));

    // A second later, the next such failure is written, counting the 49 held back.
    clock.advance(Duration::from_secs(1));
    drop_requests(1).await;
    let text = lines.text();
    assert_eq!(text.matches(LINE).count(), 2, "{text}");
    assert!(text.contains("held_back=49"), "{text}");
}

/// A probe whose request is dropped (before its future ran, or while it waited) is settled by the
/// store's answer all the same: a client that cancels every request it sends cannot keep the
/// circuit open over a healthy store. The cancelled checks are counted.
#[tokio::test(start_paused = true)]
async fn a_dropped_probe_is_settled_by_the_store_not_by_the_client() {
    use tower::{Service, ServiceExt};
    let clock = ManualClock::new();
    let (_store_clock, memory) = store();
    let store = Arc::new(SwitchStore::new(memory));
    store.set_down(true);
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(store.clone(), Policy::new("drop", per_minute(9)).unwrap())
            .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(5)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap()
    });
    // The service itself (a router would only call it when its own future is polled).
    let mut svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let res = svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(res.status(), 200, "failed open");
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let settle = || async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };

    // Still down: the probe's request goes away before its future is ever polled; the store's
    // failure re-opens the circuit, for another cool-down.
    clock.advance(Duration::from_secs(5));
    let probe = svc.ready().await.unwrap().call(request("/"));
    assert_eq!(layer.circuit_state(), Some(CircuitState::HalfOpen));
    drop(probe);
    settle().await;
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(store.calls(), 2);
    let res = svc.ready().await.unwrap().call(request("/")).await.unwrap();
    let kind = |res: &http::Response<_>| res.extensions().get::<Verdict>().unwrap().kind();
    assert_eq!(kind(&res), VerdictKind::FailedOpen);
    assert_eq!(store.calls(), 2, "open: the store is not asked");

    // Up again: the probe's request is dropped while it waits for the store's answer; the answer
    // closes the circuit.
    store.set_down(false);
    store
        .delay_ms
        .store(10, std::sync::atomic::Ordering::SeqCst);
    clock.advance(Duration::from_secs(5));
    let mut probe = Box::pin(svc.ready().await.unwrap().call(request("/")));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(probe.as_mut().poll(&mut cx).is_pending());
    drop(probe);
    settle().await;
    assert_eq!(layer.circuit_state(), Some(CircuitState::HalfOpen));
    tokio::time::sleep(Duration::from_millis(10)).await;
    settle().await;
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    let res = svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(kind(&res), VerdictKind::Allowed);

    // Both checks reached the store (it counted them) but decided no request.
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter("ratelimit_checks_cancelled_total", &[("policy", "drop")]),
        2
    );
    assert_eq!(m.outcome("drop", "allowed"), 1);
    assert_eq!(m.outcome("drop", "failed_open"), 2);
    // The first request's failure, and the dropped probe's, settled in the background.
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "drop"), ("kind", "error")]
        ),
        2
    );
    assert_eq!(
        m.gauge("ratelimit_circuit_state", &[("policy", "drop")]),
        Some(0.0)
    );
}

/// A store whose check panics while the request waits for it (its future's second poll): the
/// request's task unwinds without the layer's own count, and the check still counts as a store
/// error, towards opening the circuit as any failure does.
#[tokio::test(start_paused = true)]
async fn a_check_that_panics_while_waited_for_counts_as_a_failure() {
    struct PanicsWhenWaited;
    struct SecondPoll(bool);
    impl std::future::Future for SecondPoll {
        type Output = Result<ratelimit_core::Decision, StoreDown>;
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Self::Output> {
            assert!(!self.0, "the store's check panicked");
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
    impl Store for PanicsWhenWaited {
        type Error = StoreDown;
        type Future = SecondPoll;
        fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
            SecondPoll(false)
        }
    }
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            PanicsWhenWaited,
            Policy::new("boom", per_minute(5)).unwrap(),
        )
        .circuit_breaker(CircuitBreaker::new(2, Duration::from_secs(30)).unwrap())
        .build()
        .unwrap()
    });
    let app = app(layer.clone());
    for _ in 0..2 {
        assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
        let app = app.clone();
        let task = tokio::spawn(async move { send(&app, request("/")).await });
        assert!(task.await.unwrap_err().is_panic());
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "boom"), ("kind", "error")]
        ),
        2
    );
}

/// A store whose `check` panics while it is the probe: nothing is left to settle the probe, so
/// the circuit takes it as lost after a cool-down and the next request probes again, rather than
/// refusing the store to every request for good.
#[tokio::test(start_paused = true)]
async fn a_probe_lost_to_a_panicking_store_is_sent_again() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::{Service, ServiceExt};
    struct Panicky(AtomicBool, AtomicU64);
    impl Store for Panicky {
        type Error = StoreDown;
        type Future = std::future::Ready<Result<ratelimit_core::Decision, StoreDown>>;
        fn check(&self, _: &[u8], _: &Limit, _: u64) -> Self::Future {
            self.1.fetch_add(1, Ordering::SeqCst);
            if self.0.load(Ordering::SeqCst) {
                panic!("a store bug");
            }
            std::future::ready(Err(StoreDown))
        }
    }
    let clock = ManualClock::new();
    let store = Arc::new(Panicky(AtomicBool::new(false), AtomicU64::new(0)));
    let layer = RateLimitLayer::builder(store.clone(), Policy::new("p", per_minute(9)).unwrap())
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(5)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    clock.advance(Duration::from_secs(5));
    store.0.store(true, Ordering::SeqCst);
    let ready = svc.ready().await.unwrap();
    let call = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ready.call(request("/"))));
    assert!(call.is_err(), "the store panicked");
    assert_eq!(store.1.load(Ordering::SeqCst), 2);
    // The lost probe stands for a cool-down: the store is not asked meanwhile.
    store.0.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_millis(4_999));
    svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(store.1.load(Ordering::SeqCst), 2);
    // Then the next request probes again (and fails here: open for another cool-down).
    clock.advance(Duration::from_millis(1));
    svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(store.1.load(Ordering::SeqCst), 3);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}

// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn the_fallback_store_size_is_configurable_and_validated() {
    let policy = || {
        Policy::new("fb", per_minute(6))
            .unwrap()
            .failure(FailurePolicy::fallback(3).unwrap())
    };
    assert!(
        RateLimitLayer::builder(FailingStore::default(), policy())
            .fallback_max_keys(0)
            .build()
            .is_err()
    );
    // A share of 2 a minute. Client A spends one unit; 20 s later, far more clients than the
    // fallback holds arrive. At the cap, the states nearest to fresh go first, A's among them: A
    // starts again from a full share (two requests), where a store that kept it would admit one
    // (its level refilled to 1.67). A store of the default size keeps it.
    for (max_keys, a_admitted) in [(Some(64), 2), (None, 1)] {
        let clock = ManualClock::new();
        let mut builder = RateLimitLayer::builder(FailingStore::default(), policy())
            .no_circuit_breaker()
            .clock(clock.clone());
        if let Some(n) = max_keys {
            builder = builder.fallback_max_keys(n);
        }
        let layer = builder.build().unwrap();
        let app = app(layer.clone());
        let a = "192.0.2.200:1";
        assert_eq!(send(&app, request_from("/", a)).await.status(), 200);
        clock.advance(Duration::from_secs(20));
        // Each client still gets its first request.
        for i in 0..1_000u32 {
            let peer = format!("198.51.{}.{}:1", i / 256, i % 256);
            assert_eq!(send(&app, request_from("/", &peer)).await.status(), 200);
        }
        let mut admitted = 0;
        while send(&app, request_from("/", a)).await.status() == 200 {
            admitted += 1;
            assert!(admitted <= 2, "a share of 2");
        }
        assert_eq!(admitted, a_admitted, "fallback_max_keys {max_keys:?}");
        // What the fallback holds: 1,001 clients in a store of the default size; in one of 64,
        // at most 64, having dropped the rest.
        let stats = layer.fallback_stats().expect("a fallback store");
        match max_keys {
            Some(cap) => {
                assert_eq!(stats.max_keys, cap);
                assert!(stats.keys <= cap, "{stats:?}");
                assert!(stats.evictions >= 1_001 - cap as u64, "{stats:?}");
            }
            None => {
                assert_eq!(stats.max_keys, ratelimit_core::DEFAULT_MAX_KEYS);
                assert_eq!((stats.keys, stats.evictions), (1_001, 0));
            }
        }
        assert!(stats.memory_bytes >= stats.keys * 16, "{stats:?}");
    }
    let without = RateLimitLayer::new(
        FailingStore::default(),
        policy().failure(FailurePolicy::FailOpen),
    );
    assert_eq!(without.unwrap().fallback_stats(), None);
}

/// Answers that never asked the store (denial-cache hits under the layer) are no evidence that it
/// is healthy: between real failures they do not keep the circuit closed, and a probe answered
/// that way does not close it; the next request probes the store instead.
// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test(start_paused = true)]
async fn answers_that_never_asked_the_store_neither_keep_the_circuit_closed_nor_close_it() {
    let (clock, memory) = store();
    let store = Arc::new(SwitchStore::new(memory));
    let cached = Arc::new(ratelimit_core::DenialCache::new(
        store.clone(),
        clock.clone(),
    ));
    let layer = closed_with_breaker(cached, Policy::new("cb", per_minute(1)).unwrap(), &clock);
    let app = app(layer.clone());
    let (a, b) = ("192.0.2.1:1", "192.0.2.2:1");

    // A spends its quota; the cache knows from that answer that A's next request is denied.
    assert_eq!(send(&app, request_from("/", a)).await.status(), 200);
    assert_eq!(send(&app, request_from("/", a)).await.status(), 429);
    assert_eq!(store.calls(), 1);

    // The store goes down. B's checks fail; A's denials come from the cache in between, and
    // once B's failures have opened the circuit too (`Store::check_cached`).
    store.set_down(true);
    for _ in 0..3 {
        assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
        assert_eq!(send(&app, request_from("/", b)).await.status(), 503);
        let hit = send(&app, request_from("/", a)).await;
        assert_eq!(hit.status(), 429);
        assert_eq!(verdict(&hit), VerdictKind::Denied);
    }
    assert_eq!(store.calls(), 4, "only B's checks reached the store");
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));

    // Cooled down, the store back: A's request is the probe, answered from the cache without
    // asking the store, so the circuit stays open and B's request probes the store and closes it.
    store.set_down(false);
    clock.advance(Duration::from_secs(10));
    let res = send(&app, request_from("/", a)).await;
    assert_eq!(res.status(), 429);
    assert_eq!(verdict(&res), VerdictKind::Denied);
    assert_eq!(store.calls(), 4);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(send(&app, request_from("/", b)).await.status(), 200);
    assert_eq!(store.calls(), 5);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
}

/// No check reached `switch` since it counted `calls`, and `layer`'s circuit is still open.
#[cfg(feature = "axum")]
fn kept_from_the_store<St: Store>(switch: &SwitchStore, calls: u64, layer: &RateLimitLayer<St>) {
    assert_eq!(
        switch.calls(),
        calls,
        "the open circuit kept every check from the store"
    );
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}

/// While a key's circuit is open the store is not asked, but what a wrapper holds in front of it
/// still answers (`Store::check_cached`): a client the denial cache knows to be over its limit
/// is denied, not let through by the fail-open policy; units a lease holds are spent, not
/// refused by the fail-closed one. Neither asks the store, nor closes the circuit.
// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test(start_paused = true)]
async fn an_open_circuit_still_answers_what_is_cached_in_front_of_the_store() {
    let (a, b) = ("192.0.2.1:1", "192.0.2.2:1");
    let breaker = || CircuitBreaker::new(3, Duration::from_secs(10)).unwrap();

    // Fail open, with a denial cache.
    let (clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let cached = ratelimit_core::DenialCache::new(switch.clone(), clock.clone());
    let layer = RateLimitLayer::builder(cached, Policy::new("open", per_minute(1)).unwrap())
        .circuit_breaker(breaker())
        .clock(clock.clone())
        .build()
        .unwrap();
    let router = app(layer.clone());
    assert_eq!(send(&router, request_from("/", a)).await.status(), 200);
    assert_eq!(send(&router, request_from("/", a)).await.status(), 429);
    switch.set_down(true);
    for _ in 0..3 {
        let res = send(&router, request_from("/", b)).await;
        assert_eq!(verdict(&res), VerdictKind::FailedOpen);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let calls = switch.calls();
    for _ in 0..3 {
        let res = send(&router, request_from("/", a)).await;
        assert_eq!(res.status(), 429, "A is over its limit, outage or not");
        assert_eq!(verdict(&res), VerdictKind::Denied);
        assert_eq!(res.headers()["retry-after"], "60");
        let res = send(&router, request_from("/", b)).await;
        assert_eq!(verdict(&res), VerdictKind::FailedOpen);
    }
    kept_from_the_store(&switch, calls, &layer);

    // Fail closed, with leases of 5 units.
    let (clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let leasing = ratelimit_core::Leasing::builder(switch.clone(), clock.clone())
        .lease_size(5)
        .build()
        .unwrap();
    let layer = closed_with_breaker(
        leasing,
        Policy::new("closed", per_minute(100)).unwrap(),
        &clock,
    );
    let router = app(layer.clone());
    assert_eq!(send(&router, request_from("/", a)).await.status(), 200);
    assert_eq!(switch.calls(), 1, "A leased 5 units");
    switch.set_down(true);
    for _ in 0..3 {
        assert_eq!(send(&router, request_from("/", b)).await.status(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    let calls = switch.calls();
    for _ in 0..4 {
        let res = send(&router, request_from("/", a)).await;
        assert_eq!(res.status(), 200, "a unit A holds");
        assert_eq!(verdict(&res), VerdictKind::Allowed);
    }
    let res = send(&router, request_from("/", a)).await;
    assert_eq!(
        res.status(),
        503,
        "A's lease spent: the failure policy answers"
    );
    assert_eq!(verdict(&res), VerdictKind::FailedClosed);
    kept_from_the_store(&switch, calls, &layer);
}

/// A store that answers at once and cannot fail (the in-memory store's `Ready` future with an
/// `Infallible` error) gets no breaker, even one asked for. A store that can fail gets one, and so
/// does a store whose error is `Infallible` but whose answer can wait: its timeouts open it.
#[tokio::test(start_paused = true)]
async fn only_a_store_that_can_fail_or_wait_has_a_breaker() {
    let policy = || Policy::new("cb", per_minute(100)).unwrap();
    let (clock, memory) = store();
    assert_eq!(
        RateLimitLayer::new(memory.clone(), policy())
            .unwrap()
            .circuit_state(),
        None
    );
    let asked = RateLimitLayer::builder(memory, policy())
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
        .build()
        .unwrap();
    assert_eq!(asked.circuit_state(), None);
    let failing = RateLimitLayer::new(Arc::new(FailingStore::default()), policy()).unwrap();
    assert_eq!(failing.circuit_state(), Some(CircuitState::Closed));

    let hanging = Arc::new(HangingInfallibleStore::default());
    let layer = RateLimitLayer::builder(hanging.clone(), policy())
        .timeout(Duration::from_millis(20))
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
        .clock(clock)
        .build()
        .unwrap();
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    let app = app(layer.clone());
    for _ in 0..5 {
        // Fail open (the default): each request goes through after the timeout or, once the
        // circuit is open, at once.
        assert_eq!(send(&app, request("/")).await.status(), 200);
    }
    assert_eq!(hanging.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}

/// A store whose future is `std::future::Ready` answers in `check` itself, so its answers are
/// evidence even though they come at once: successes between failures keep the circuit closed,
/// and a probe answered at once closes it.
#[tokio::test]
async fn a_store_that_answers_in_check_is_judged_by_every_answer() {
    let (clock, flaky) = flaky();
    judged_by_every_answer(ReadyFlakyStore(flaky.clone()), &flaky, &clock).await;
}

/// The same for a store whose future is ready at its first poll but is not `Ready` (a boxed
/// `async` block): its answers, none of them marked as cached, are evidence too. (Until the cache
/// mark, only `Ready` futures' answers were: the circuit opened on scattered failures and never
/// closed again.)
#[tokio::test]
async fn a_store_answering_at_once_through_a_boxed_future_recovers() {
    let (clock, flaky) = flaky();
    judged_by_every_answer(BoxedFlakyStore(flaky.clone()), &flaky, &clock).await;
}

/// Successes between failures keep the circuit closed; three failures in a row open it; once
/// cooled down, a probe answered at once closes it.
async fn judged_by_every_answer<St: Store>(store: St, flaky: &FlakyStore, clock: &ManualClock)
where
    St::Future: Unpin,
{
    let layer = closed_with_breaker(store, Policy::new("ready", per_minute(100)).unwrap(), clock);
    let app = app(layer.clone());
    let set_down = |down| flaky.down.store(down, std::sync::atomic::Ordering::SeqCst);
    // Failures scattered between successes are not consecutive.
    for _ in 0..5 {
        set_down(true);
        assert_eq!(send(&app, request("/")).await.status(), 503);
        set_down(false);
        assert_eq!(send(&app, request("/")).await.status(), 200);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    // Three in a row open it.
    set_down(true);
    for _ in 0..3 {
        assert_eq!(send(&app, request("/")).await.status(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // Cooled down and back: the probe's answer, ready at once, closes it.
    set_down(false);
    clock.advance(Duration::from_secs(10));
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(verdict(&res), VerdictKind::Allowed);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
}

/// A [`FlakyStore`], up, on a manual clock.
fn flaky() -> (ManualClock, Arc<FlakyStore>) {
    let (clock, memory) = store();
    let flaky = FlakyStore {
        inner: memory,
        down: std::sync::atomic::AtomicBool::new(false),
    };
    (clock, Arc::new(flaky))
}

/// A memory store behind a switch that can fail.
#[derive(Debug)]
struct FlakyStore {
    inner: Arc<ratelimit_core::MemoryStore<ratelimit_core::ManualClock>>,
    down: std::sync::atomic::AtomicBool,
}

impl FlakyStore {
    fn answer(
        &self,
        key: &[u8],
        limit: &Limit,
        cost: u64,
    ) -> Result<ratelimit_core::Decision, StoreDown> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            Err(StoreDown)
        } else {
            Ok(self.inner.check_now(key, limit, cost))
        }
    }
}

/// A [`FlakyStore`] answering in `check` (a `Ready` future).
struct ReadyFlakyStore(Arc<FlakyStore>);

impl Store for ReadyFlakyStore {
    type Error = StoreDown;
    type Future = std::future::Ready<Result<ratelimit_core::Decision, StoreDown>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        std::future::ready(self.0.answer(key, limit, cost))
    }
}

/// A [`FlakyStore`] answering through a boxed future, ready at its first poll.
struct BoxedFlakyStore(Arc<FlakyStore>);

type BoxedCheck = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<ratelimit_core::Decision, StoreDown>> + Send>,
>;

impl Store for BoxedFlakyStore {
    type Error = StoreDown;
    type Future = BoxedCheck;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let answer = self.0.answer(key, limit, cost);
        Box::pin(async move { answer })
    }
}

/// A store that cannot fail but never answers.
#[derive(Debug, Default)]
struct HangingInfallibleStore {
    calls: std::sync::atomic::AtomicU64,
}

impl Store for HangingInfallibleStore {
    type Error = std::convert::Infallible;
    type Future = std::future::Pending<Result<ratelimit_core::Decision, std::convert::Infallible>>;

    fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::pending()
    }
}

/// A store of two failure domains (a key's last byte, even or odd), the odd one down: a cluster
/// store with one master lost, say.
struct HalfDown {
    store: SwitchStore,
    odd_down: std::sync::atomic::AtomicBool,
    odd_calls: AtomicU64,
}

impl HalfDown {
    /// Over `memory`, the odd domain down.
    fn odd_down(memory: TestStore) -> Arc<HalfDown> {
        Arc::new(HalfDown {
            store: SwitchStore::new(memory),
            odd_down: true.into(),
            odd_calls: AtomicU64::new(0),
        })
    }
}

/// The failure domain of the test stores of two: 1 for a key whose last byte is odd, else 0.
fn odd_or_even(key: &[u8]) -> usize {
    usize::from(key.last().is_some_and(|b| b % 2 == 1))
}

/// A request from the default peer with `x-api-key: key`.
fn with_key(key: &'static str) -> http::Request<axum::body::Body> {
    let mut req = request("/");
    req.headers_mut()
        .insert("x-api-key", http::HeaderValue::from_static(key));
    req
}

impl Store for HalfDown {
    type Error = StoreDown;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ratelimit_core::Decision, StoreDown>> + Send>,
    >;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        if self.failure_domain(key) == 1 {
            self.odd_calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.odd_down.load(std::sync::atomic::Ordering::SeqCst) {
                return Box::pin(async { Err(StoreDown) });
            }
        }
        self.store.check(key, limit, cost)
    }

    fn failure_domains(&self) -> usize {
        2
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        odd_or_even(key)
    }
}

#[tokio::test(start_paused = true)]
async fn one_failure_domain_down_leaves_the_others_circuits_closed() {
    use tower_ratelimit::metrics::{CIRCUIT_STATE, CIRCUITS_NOT_CLOSED};

    let clock = ManualClock::new();
    let (_store_clock, memory) = store();
    let store = HalfDown::odd_down(memory);
    let odd_calls = || store.odd_calls.load(std::sync::atomic::Ordering::SeqCst);
    let (layer, snapshotter) = breaker_layer(
        store.clone(),
        Policy::new("parts", per_minute(100))
            .unwrap()
            .key(tower_ratelimit::key::ApiKeyHeader::new("x-api-key").unwrap()),
        &clock,
    );
    let app = app(layer.clone());

    // The odd domain's failures, each followed by an even key's success: three in a row of its
    // own open its circuit (a success elsewhere says nothing of it).
    for _ in 0..3 {
        assert_eq!(send(&app, with_key("k1")).await.status(), 503);
        assert_eq!(send(&app, with_key("k0")).await.status(), 200);
    }
    assert_eq!(odd_calls(), 3);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    // The odd keys get the failure policy without asking the store; the even ones are checked.
    let calls = store.store.calls();
    for _ in 0..4 {
        assert_eq!(send(&app, with_key("k3")).await.status(), 503);
        assert_eq!(send(&app, with_key("k2")).await.status(), 200);
    }
    assert_eq!(odd_calls(), 3);
    assert_eq!(store.store.calls(), calls + 4);
    let m = Recorded::take(&snapshotter);
    let gauges = |m: &Recorded| {
        [CIRCUIT_STATE, CIRCUITS_NOT_CLOSED].map(|name| m.gauge(name, &[("policy", "parts")]))
    };
    assert_eq!(
        gauges(&m),
        [Some(1.0), Some(1.0)],
        "open; one circuit of two"
    );
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "parts"), ("kind", "circuit_open")]
        ),
        4
    );

    // The odd domain recovers: after the cool-down its probe closes its circuit.
    store
        .odd_down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    clock.advance(Duration::from_secs(10));
    assert_eq!(send(&app, with_key("k1")).await.status(), 200);
    assert_eq!(odd_calls(), 4);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    assert_eq!(
        gauges(&Recorded::take(&snapshotter)),
        [Some(0.0), Some(0.0)]
    );
}

/// A store of two failure domains (a key's last byte, even or odd) that answers at once, from
/// memory or with an error while down, and counts how often it is asked for a key's domain.
struct ReadyParted {
    memory: TestStore,
    down: std::sync::atomic::AtomicBool,
    domain_calls: AtomicU64,
}

impl Store for ReadyParted {
    type Error = StoreDown;
    type Future = std::future::Ready<Result<ratelimit_core::Decision, StoreDown>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        std::future::ready(if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            Err(StoreDown)
        } else {
            Ok(self.memory.check_now(key, limit, cost))
        })
    }

    fn failure_domains(&self) -> usize {
        2
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.domain_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        odd_or_even(key)
    }
}

/// While every circuit is closed and counts no failure, a check answered at once does not ask
/// the store for its key's domain (a cluster store hashes the key for it); a failure does, and
/// so do the checks after it until its count is cleared.
#[tokio::test]
async fn a_healthy_stores_answers_need_no_failure_domain() {
    let clock = ManualClock::new();
    let (_store_clock, memory) = store();
    let store = Arc::new(ReadyParted {
        memory,
        down: false.into(),
        domain_calls: AtomicU64::new(0),
    });
    let calls = || store.domain_calls.load(std::sync::atomic::Ordering::SeqCst);
    let (layer, _snapshotter) = breaker_layer(
        store.clone(),
        Policy::new("clean", per_minute(100)).unwrap(),
        &clock,
    );
    let app = app(layer);
    for _ in 0..5 {
        assert_eq!(send(&app, request("/")).await.status(), 200);
    }
    assert_eq!(calls(), 0, "a healthy store is not asked");

    store.down.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(send(&app, request("/")).await.status(), 503);
    assert_eq!(calls(), 1, "a failure is counted in its key's circuit");
    store.down.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(calls(), 2, "a success clears its circuit's count");
    for _ in 0..5 {
        assert_eq!(send(&app, request("/")).await.status(), 200);
    }
    assert_eq!(calls(), 2, "clean again");
}

/// `single_circuit`: one circuit whatever the store's domains, as before there were any: the
/// failing domain's failures, each followed by another domain's success, never come in a row.
#[tokio::test(start_paused = true)]
async fn a_single_circuit_ignores_the_failure_domains() {
    let clock = ManualClock::new();
    let (_store_clock, memory) = store();
    let store = HalfDown::odd_down(memory);
    let layer = RateLimitLayer::builder(
        store.clone(),
        Policy::new("one", per_minute(100))
            .unwrap()
            .key(tower_ratelimit::key::ApiKeyHeader::new("x-api-key").unwrap())
            .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
    )
    .circuit_breaker(
        CircuitBreaker::new(3, Duration::from_secs(10))
            .unwrap()
            .single_circuit(),
    )
    .clock(clock.clone())
    .build()
    .unwrap();
    let app = app(layer.clone());
    for _ in 0..4 {
        assert_eq!(send(&app, with_key("k1")).await.status(), 503);
        assert_eq!(send(&app, with_key("k0")).await.status(), 200);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    // Three in a row, whatever their keys, open it for every key.
    for key in ["k1", "k3", "k5"] {
        assert_eq!(send(&app, with_key(key)).await.status(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(send(&app, with_key("k0")).await.status(), 503);
}

/// A store whose own response timeout is more than twice the layer's and more than 50 ms above
/// it (the Redis store's default 500 ms under the layer's 50 ms) is named in a warning when the
/// layer is built: checks the layer gave up on would wait in the store that long. Otherwise (the
/// gateway example's layer plus 10 ms on a layer of 5 ms, say), or for a store without one,
/// nothing is said.
#[test]
fn a_store_timeout_far_above_the_layers_is_warned_of_when_built() {
    let timed = |ms| TimedStore {
        inner: store().1,
        response_timeout: Duration::from_millis(ms),
    };
    let build = |store: TimedStore, layer_ms: u64| {
        let (lines, _guard) = Lines::capture();
        RateLimitLayer::builder(store, Policy::new("api", per_minute(10)).unwrap())
            .timeout(Duration::from_millis(layer_ms))
            .build()
            .unwrap();
        lines.text()
    };

    let text = build(timed(500), 50);
    assert_eq!(text.matches("WARN").count(), 1, "{text}");
    assert!(
        text.contains("store_timeout_ms=500") && text.contains("timeout_ms=50"),
        "{text}"
    );
    assert!(text.contains("policy=api"), "{text}");
    assert!(text.contains("a little above the layer's"), "{text}");
    assert_eq!(build(timed(56), 5).matches("WARN").count(), 1);
    for (store_ms, layer_ms) in [(60, 50), (100, 50), (500, 250), (10, 50), (15, 5), (55, 5)] {
        let text = build(timed(store_ms), layer_ms);
        assert_eq!(text, "", "store {store_ms} ms, layer {layer_ms} ms");
    }
    let (lines, _guard) = Lines::capture();
    RateLimitLayer::builder(store().1, Policy::new("api", per_minute(10)).unwrap())
        .timeout(Duration::from_millis(1))
        .build()
        .unwrap();
    assert_eq!(lines.text(), "", "a store without a response timeout");
}

/// An open circuit whose probes are answered from a cache hands each probe on to the next
/// request: the circuit is logged half-open once, when its first probe goes out, not again for
/// every request that takes a handed-on probe (a hot key answered from a denial cache while
/// Redis is down took one per request), and it stays open, as published, until a probe asks the
/// store; that one closes it.
#[tokio::test]
async fn probes_handed_on_by_a_cache_are_logged_once() {
    use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
    let (clock, inner) = store();
    let store = Arc::new(ModeStore {
        mode: AtomicU8::new(FAIL),
        inner,
    });
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            store.clone(),
            Policy::new("cached", per_minute(1_000))
                .unwrap()
                .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
        )
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(10)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
    });
    let gauge =
        || Recorded::take(&snapshotter).gauge("ratelimit_circuit_state", &[("policy", "cached")]);
    let app = app(layer.clone());
    assert_eq!(send(&app, request("/")).await.status(), 503);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    assert_eq!(gauge(), Some(1.0), "published open");

    let (lines, _guard) = Lines::capture_from(tracing::Level::INFO);
    clock.advance(Duration::from_secs(10));
    store.mode.store(CACHED, SeqCst);
    for _ in 0..50 {
        assert_eq!(send(&app, request("/")).await.status(), 200);
        assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    }
    // The gauge's last value (a snapshot takes it and leaves 0): the first probe's handing on
    // published open, and nothing after it published another state.
    assert_eq!(gauge(), Some(1.0), "published open");
    let text = lines.text();
    assert_eq!(text.matches("half-open").count(), 1, "{text}");
    assert_eq!(text.lines().count(), 1, "nothing else logged: {text}");

    store.mode.store(ANSWER, SeqCst);
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    let text = lines.text();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains("circuit closed"), "{text}");
}

/// A cool-down no longer than the layer's timeout is warned of when the layer is built.
#[test]
fn a_cool_down_within_the_timeout_is_warned_of_when_built() {
    let build = |cool_down_ms: u64| {
        let (lines, _guard) = Lines::capture();
        RateLimitLayer::builder(
            FailingStore::default(),
            Policy::new("cd", per_minute(10)).unwrap(),
        )
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(cool_down_ms)).unwrap())
        .build()
        .unwrap();
        lines.text()
    };
    for cool_down_ms in [1, 50] {
        let text = build(cool_down_ms);
        assert_eq!(text.matches("WARN").count(), 1, "{cool_down_ms} ms: {text}");
        assert!(
            text.contains("cool-down not longer than the store timeout"),
            "{text}"
        );
    }
    assert_eq!(build(51), "");
    assert_eq!(build(10_000), "");
    // The memory store, which can neither fail nor time out, gets no breaker: nothing to warn of.
    let (lines, _guard) = Lines::capture();
    RateLimitLayer::builder(
        ratelimit_core::MemoryStore::new(),
        Policy::new("cd", per_minute(10)).unwrap(),
    )
    .timeout(Duration::from_millis(50))
    .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(1)).unwrap())
    .build()
    .unwrap();
    assert_eq!(lines.text(), "");
}

/// A store whose checks hang, fail at once, answer as a cache in front of a store would
/// (`Decision::cached`: answers that say nothing of the store's health) or answer as the store
/// itself, as `mode` says when each is made.
struct ModeStore {
    mode: std::sync::atomic::AtomicU8,
    inner: TestStore,
}

const HANG: u8 = 0;
const FAIL: u8 = 1;
const CACHED: u8 = 2;
const ANSWER: u8 = 3;

impl Store for ModeStore {
    type Error = StoreDown;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ratelimit_core::Decision, StoreDown>> + Send>,
    >;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        match self.mode.load(std::sync::atomic::Ordering::SeqCst) {
            HANG => Box::pin(std::future::pending()),
            FAIL => Box::pin(std::future::ready(Err(StoreDown))),
            CACHED => Box::pin(std::future::ready(Ok(self
                .inner
                .check_now(key, limit, cost)
                .cached()))),
            _ => Box::pin(std::future::ready(Ok(self
                .inner
                .check_now(key, limit, cost)))),
        }
    }
}

/// Checks sent before the circuit opened that time out after a probe closed it are older
/// evidence than that probe: they do not open it again (with a cool-down near the timeout, or
/// timers late on a loaded machine, they did: two such timeouts re-opened a circuit over a store
/// that answered). Checks sent after the close count as ever.
#[tokio::test(start_paused = true)]
async fn timeouts_of_checks_sent_before_a_close_do_not_reopen_it() {
    use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
    let (clock, inner) = store();
    let store = Arc::new(ModeStore {
        mode: AtomicU8::new(HANG),
        inner,
    });
    let layer = RateLimitLayer::builder(
        store.clone(),
        Policy::new("stale", per_minute(1_000))
            .unwrap()
            .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
    )
    .timeout(Duration::from_millis(50))
    .circuit_breaker(CircuitBreaker::new(2, Duration::from_millis(60)).unwrap())
    .clock(clock.clone())
    .build()
    .unwrap();
    let app = app(layer.clone());
    // Two checks sent into a hanging store, while the circuit is closed.
    let early: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, request("/")).await.status() })
        })
        .collect();
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(1)).await;
    // Two failures open the circuit; a cool-down later a probe that the store answers closes it.
    store.mode.store(FAIL, SeqCst);
    for _ in 0..2 {
        assert_eq!(send(&app, request("/")).await.status(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
    clock.advance(Duration::from_millis(60));
    store.mode.store(ANSWER, SeqCst);
    assert_eq!(send(&app, request("/")).await.status(), 200);
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    // The two early checks time out now: their requests get the failure policy's answer, and
    // the circuit stays closed.
    tokio::time::advance(Duration::from_millis(60)).await;
    for check in early {
        assert_eq!(check.await.unwrap(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Closed));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    // Timeouts of checks sent after the close open it.
    store.mode.store(HANG, SeqCst);
    let late: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, request("/")).await.status() })
        })
        .collect();
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(60)).await;
    for check in late {
        assert_eq!(check.await.unwrap(), 503);
    }
    assert_eq!(layer.circuit_state(), Some(CircuitState::Open));
}

/// Without a circuit breaker every request of an outage asks the store and fails: the failure is
/// logged at most once a second (by the layer's clock), each line counting the ones held back
/// since the last, so that an outage under load does not write a line per request.
#[tokio::test]
async fn store_failures_are_logged_at_most_once_a_second() {
    let clock = ManualClock::new();
    let store = Arc::new(FailingStore::default());
    let layer = RateLimitLayer::builder(store.clone(), Policy::new("api", per_minute(10)).unwrap())
        .no_circuit_breaker()
        .clock(clock.clone())
        .build()
        .unwrap();
    let app = app(layer);
    let (lines, _guard) = Lines::capture();
    for _ in 0..10 {
        assert_eq!(send(&app, request("/")).await.status(), 200, "failing open");
    }
    let text = lines.text();
    assert_eq!(text.matches("rate-limit store failed").count(), 1, "{text}");
    assert!(text.contains("held_back=0"), "{text}");
    clock.advance(Duration::from_millis(999));
    send(&app, request("/")).await;
    assert_eq!(lines.text().matches("WARN").count(), 1);
    clock.advance(Duration::from_millis(1));
    send(&app, request("/")).await;
    let text = lines.text();
    assert_eq!(text.matches("rate-limit store failed").count(), 2, "{text}");
    assert!(
        text.contains("held_back=10"),
        "the ten since the first: {text}"
    );
    // Every request asked the store all the same.
    assert_eq!(store.calls.load(std::sync::atomic::Ordering::SeqCst), 12);
}
