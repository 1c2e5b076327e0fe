//! The app starts while Redis is down, follows its policies, and recovers when Redis comes up.
//!
//! `RedisStoreBuilder::build` refuses to build a store it cannot connect (a typed
//! `RedisStoreError::Connection`, quickly, never a panic): that is the answer for a wrong address
//! at start-up. An app that must start during an outage builds with
//! `RedisStoreBuilder::build_lazy`, which retries in the background.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, ms};
use ratelimit_e2e::observe::{Logs, Metrics};
use ratelimit_e2e::{answers_ok, fault_layer, store_builder, wait_until};
use ratelimit_redis::RedisStoreError;
use redis_harness::RedisServer;
use tower_ratelimit::FailurePolicy;

const TIMEOUT: Duration = Duration::from_millis(50);
const MARGIN: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_starts_without_redis_and_recovers_when_it_comes_up() {
    let logs = Logs::install();
    // Reserve a port, then stop the server: Redis is down when the app starts.
    let mut redis = RedisServer::start();
    redis.kill();
    let url = redis.url();

    // A plain build fails fast with a typed error.
    let started = Instant::now();
    let err = store_builder(&url)
        .build()
        .await
        .expect_err("Redis is down");
    let took = started.elapsed();
    println!(
        "RedisStore::build with Redis down: {err} (after {:.1} ms)",
        ms(took)
    );
    assert!(matches!(err, RedisStoreError::Connection { .. }), "{err:?}");
    assert!(err.is_unavailable());
    assert!(
        took < Duration::from_secs(2),
        "build gave up after {took:?}"
    );

    // The app starts anyway, on a store that connects in the background.
    let store = store_builder(&url)
        .build_lazy(Duration::from_millis(100))
        .await
        .expect("only an invalid setting fails a lazy build");
    assert!(!store.is_connected());
    let metrics = Metrics::new();
    let (open, closed, fallback) = metrics.register(|| {
        (
            fault_layer(&store, "open", 1_000, FailurePolicy::FailOpen, TIMEOUT),
            fault_layer(
                &store,
                "closed",
                1_000,
                FailurePolicy::fail_closed(Duration::from_secs(3)),
                TIMEOUT,
            ),
            fault_layer(
                &store,
                "fallback",
                10,
                FailurePolicy::fallback(1).unwrap(),
                TIMEOUT,
            ),
        )
    });
    let app = Router::new()
        .route("/open", get(|| async { "ok" }).route_layer(open))
        .route("/closed", get(|| async { "ok" }).route_layer(closed))
        .route("/fallback", get(|| async { "ok" }).route_layer(fallback));
    let app = TestApp::serve(app).await;
    let client = load::client();
    let routes = [
        ("open", app.url("/open")),
        ("closed", app.url("/closed")),
        ("fallback", app.url("/fallback")),
    ];

    let origin = Instant::now();
    let down = load::run(
        &client,
        &routes,
        2,
        Duration::from_millis(800),
        Duration::from_millis(10),
        origin,
    )
    .await;
    println!("while down: {down}");
    assert_eq!(down.count(0), 0);
    assert!(down.max() <= TIMEOUT + MARGIN, "worst {:?}", down.max());
    assert_eq!(down.route("open").statuses(), [200]);
    assert_eq!(
        down.route("open").decided(),
        0,
        "let through undecided: {down}"
    );
    assert_eq!(down.route("closed").statuses(), [503]);
    assert!(
        down.route("closed")
            .0
            .iter()
            .all(|s| s.retry_after.as_deref() == Some("3"))
    );
    assert_eq!(down.route("fallback").count(200), 10, "{down}");
    assert_eq!(down.route("fallback").statuses(), [200, 429]);

    // Redis comes up on the same port.
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    let up_at = Instant::now();
    let recovered = wait_until(Duration::from_secs(5), || {
        answers_ok(&client, app.url("/closed"))
    })
    .await
    .expect("served by Redis within 5 s of it coming up");
    println!(
        "recovered {:.0} ms after Redis came up (restart returned {:.0} ms ago)",
        ms(recovered),
        ms(up_at.elapsed())
    );
    assert!(store.is_connected());
    // Each route's circuit closes by its own probe, up to a cool-down (200 ms) after Redis
    // answers: the open route's too, before its answers are held to being decided.
    let open_url = app.url("/open");
    wait_until(Duration::from_secs(5), || async {
        load::get(&client, "open", &open_url, Instant::now())
            .await
            .decided
    })
    .await
    .expect("the open route is decided by Redis within 5 s of it coming up");

    // About 250 checks a route, so that the 2% allowed below are a few checks, not one stall's
    // two (two loops a route).
    let after = load::run(
        &client,
        &routes,
        2,
        Duration::from_millis(1_500),
        Duration::from_millis(10),
        Instant::now(),
    )
    .await;
    println!("after recovery: {after}");
    assert_eq!(after.route("open").statuses(), [200]);
    // (On a loaded machine a check may exceed the 50 ms timeout: at most 2% of them.)
    assert!(
        after.route("open").decided_share() >= 0.98,
        "decided by Redis again: {after}"
    );
    assert!(after.route("closed").share(200) >= 0.98, "{after}");
    let fb = after.route("fallback");
    // Redis's limit of 10 applies again (one check that timed out may have been counted by
    // Redis and answered by the exhausted local share).
    assert!((9..=10).contains(&fb.count(200)), "{fb}");
    assert_eq!(redis.cli(&["exists", &store_key_prefix_probe(&redis)]), "1");

    assert!(metrics.decisions("closed", "failed_closed") > 0);
    assert!(metrics.decisions("closed", "allowed") > 0);
    assert!(!logs.matching(&["Redis cannot be reached yet"]).is_empty());
    assert!(
        !logs
            .matching(&["ratelimit-redis: connected to Redis"])
            .is_empty()
    );
}

/// Some key the store wrote under its prefix (proves checks reach Redis).
fn store_key_prefix_probe(redis: &RedisServer) -> String {
    let keys = redis.cli(&["--scan", "--pattern", "e2e:*"]);
    keys.lines()
        .next()
        .expect("a state key in Redis")
        .to_owned()
}
