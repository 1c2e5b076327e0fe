//! Redis frozen (SIGSTOP) for two seconds in the middle of a load, then thawed (SIGCONT); and
//! frozen under callers that give up before the layer does.
//!
//! The TCP connections stay open and nothing is answered: the worst case for latency. Every
//! request must still be answered within the layer's store timeout (50 ms) plus a margin, the
//! circuit breaker must open during the stall and close by itself after it, and no request may
//! hang.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, ms};
use ratelimit_e2e::observe::{Logs, Metrics};
use ratelimit_e2e::{per_minute, store_builder, wait_until};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;
use tower_ratelimit::{CircuitBreaker, CircuitState, FailurePolicy, Policy, RateLimitLayer};

const TIMEOUT: Duration = Duration::from_millis(50);
const MARGIN: Duration = Duration::from_millis(750);
const COOL_DOWN: Duration = Duration::from_millis(200);
const PAUSE_AT: Duration = Duration::from_millis(500);
const RESUME_AT: Duration = Duration::from_millis(2_500);
/// Long enough after the resume (at 2.5 s) for a slow recovery to leave a window to measure.
const LOAD_FOR: Duration = Duration::from_millis(5_000);

fn layer(store: &RedisStore, name: &str, failure: FailurePolicy) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder(
        store.clone(),
        Policy::new(name, per_minute(100_000))
            .expect("policy")
            .failure(failure),
    )
    .timeout(TIMEOUT)
    // More failures than the 3 requests in flight per route: one stall of the loaded test
    // machine must not open it after the recovery (the 2 s stall still opens it in ~150 ms).
    .circuit_breaker(CircuitBreaker::new(8, COOL_DOWN).expect("breaker"))
    .build()
    .expect("layer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_at_most_the_timeout_and_the_breaker_recovers() {
    let logs = Logs::install();
    let redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let metrics = Metrics::new();
    let (open, closed) = metrics.register(|| {
        (
            layer(&store, "open", FailurePolicy::FailOpen),
            layer(
                &store,
                "closed",
                FailurePolicy::fail_closed(Duration::from_secs(1)),
            ),
        )
    });
    let app = Router::new()
        .route("/open", get(|| async { "ok" }).route_layer(open.clone()))
        .route(
            "/closed",
            get(|| async { "ok" }).route_layer(closed.clone()),
        );
    let app = TestApp::serve(app).await;
    let client = load::client();
    let routes = [("open", app.url("/open")), ("closed", app.url("/closed"))];

    let origin = Instant::now();
    // Watch the breaker of the fail-closed route.
    let states: Arc<Mutex<Vec<(Duration, CircuitState)>>> = Arc::default();
    let watcher = {
        let states = states.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            while origin.elapsed() < LOAD_FOR + Duration::from_secs(5) {
                if let Some(s) = closed.circuit_state() {
                    let mut v = states.lock().unwrap();
                    if v.last().map(|l| l.1) != Some(s) {
                        v.push((origin.elapsed(), s));
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let load = {
        let client = client.clone();
        tokio::spawn(async move {
            load::run(
                &client,
                &routes,
                3,
                LOAD_FOR,
                Duration::from_millis(5),
                origin,
            )
            .await
        })
    };
    tokio::time::sleep_until((origin + PAUSE_AT).into()).await;
    redis.pause();
    // Read once the signal is delivered (`pause` waits for the shell that sends it, which a
    // loaded machine may take tens of milliseconds to start): the stall window starts here.
    let paused_at = origin.elapsed();
    tokio::time::sleep_until((origin + RESUME_AT).into()).await;
    // Redis may answer from this instant on: the stall window ends here.
    let resume_began = origin.elapsed();
    redis.resume();
    let resumed_at = origin.elapsed();
    let closed_again = wait_until(Duration::from_secs(5), || async {
        closed.circuit_state() == Some(CircuitState::Closed)
            && open.circuit_state() == Some(CircuitState::Closed)
    })
    .await;
    let samples = load.await.unwrap();
    watcher.abort();
    let states = states.lock().unwrap().clone();

    let stall = samples.sent_between(paused_at, resume_began);
    println!(
        "paused at {:.0} ms, resumed at {:.0} ms",
        ms(paused_at),
        ms(resumed_at)
    );
    println!("whole load: {samples}");
    println!("during the stall: {stall}");
    for r in ["open", "closed"] {
        println!("  {r:>6} during the stall: {}", stall.route(r));
    }
    println!("breaker of /closed: {states:?}");
    let closed_again = closed_again.expect("both breakers close within 5 s of the resume");
    println!(
        "breakers closed {:.0} ms after the resume",
        ms(closed_again)
    );

    assert_eq!(samples.count(0), 0, "no request hung or failed");
    assert!(
        samples.max() <= TIMEOUT + MARGIN,
        "worst latency {:?} over {:?}",
        samples.max(),
        TIMEOUT + MARGIN
    );
    assert!(stall.len() > 100, "the load ran during the stall");
    assert!(stall.percentile(99.0) <= TIMEOUT + MARGIN);

    // During the stall (after the first timeouts) each policy answers.
    let settled = samples.sent_between(
        paused_at + TIMEOUT + Duration::from_millis(20),
        resume_began,
    );
    assert_eq!(settled.route("open").statuses(), [200]);
    assert_eq!(settled.route("closed").statuses(), [503]);
    assert_eq!(
        settled.route("open").decided(),
        0,
        "while Redis is paused, the open route's 200s are let through undecided"
    );

    // The breaker opened during the stall and closed after it.
    let opened = states
        .iter()
        .find(|(t, s)| *s == CircuitState::Open && *t >= paused_at)
        .expect("the breaker opened during the stall");
    assert!(
        // (8 failures in a row: about 3 rounds of the 3 loops' 50 ms timeouts, some 170 ms on
        // this machine; a loaded one's late timers stretch each round.)
        opened.0 < paused_at + Duration::from_secs(1),
        "opened {:?} after the pause",
        opened.0 - paused_at
    );
    assert!(
        states
            .iter()
            .any(|(t, s)| *s == CircuitState::Closed && *t > resumed_at),
        "closed after the resume: {states:?}"
    );

    // After recovery the store decides again.
    let after = samples.sent_between(
        resumed_at + closed_again + Duration::from_millis(100),
        LOAD_FOR,
    );
    assert!(
        after.route("closed").len() >= 50,
        "recovered too late to measure after it: {}",
        after.route("closed")
    );
    // (On a loaded machine a check may exceed the 50 ms timeout: at most 2% of them.)
    assert!(
        after.route("closed").share(200) >= 0.98,
        "{}",
        after.route("closed")
    );
    assert!(
        after.route("open").decided_share() >= 0.98,
        "the open route is decided again: {} of {}",
        after.route("open").decided(),
        after.route("open").len()
    );
    let res = client.get(app.url("/closed")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().contains_key("ratelimit"));

    assert!(metrics.store_errors("closed", "timeout") >= 3);
    assert!(metrics.store_errors("closed", "circuit_open") > 0);
    assert!(metrics.decisions("closed", "failed_closed") > 0);
    assert!(metrics.decisions("open", "failed_open") > 0);
    assert!(
        !logs
            .matching(&["WARN", "rate-limit store timed out"])
            .is_empty()
    );
    assert!(!logs.matching(&["circuit half-open"]).is_empty());
}

/// Callers whose deadline is shorter than the layer's timeout (a gRPC deadline, an outer timeout)
/// drop every request before the layer gives up on a frozen Redis. Their checks still run on in
/// the background (here until the store's own 200 ms response timeout, under the layer's 300 ms)
/// and count as failures, so the breaker opens and the failure policy answers at once, instead
/// of every request waiting on the frozen server until its caller gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_first_still_open_the_breaker() {
    use tower::ServiceExt;
    use tower_ratelimit::{Verdict, VerdictKind};
    let redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let layer = RateLimitLayer::builder(
        store,
        Policy::new("impatient", per_minute(100)).expect("policy"),
    )
    .timeout(Duration::from_millis(300))
    .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(60)).expect("breaker"))
    .build()
    .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let request = || ratelimit_e2e::request_from(([192, 0, 2, 7], 4000).into());
    // Healthy first: the store decides.
    let res = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::Allowed
    );

    redis.pause();
    for _ in 0..3 {
        let gave_up =
            tokio::time::timeout(Duration::from_millis(30), app.clone().oneshot(request())).await;
        assert!(gave_up.is_err(), "a frozen Redis answered");
    }
    let opened = wait_until(Duration::from_secs(5), || async {
        layer.circuit_state() == Some(CircuitState::Open)
    })
    .await;
    redis.resume();
    let opened = opened.expect("the breaker opens once the dropped checks time out");
    println!(
        "breaker open {:.0} ms after the last caller gave up",
        ms(opened)
    );
    // Open: answered at once by the failure policy (fail open), without waiting on the store.
    let start = Instant::now();
    let res = app.clone().oneshot(request()).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(300));
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::FailedOpen
    );
}
