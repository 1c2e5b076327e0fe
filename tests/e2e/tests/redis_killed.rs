//! Redis killed (SIGKILL) in the middle of a load, then restarted on the same port, empty.
//!
//! Three routes share one `RedisStore`, each with its own failure policy:
//! - `/open` (fail open, 1,000/min): keeps answering 200 throughout;
//! - `/closed` (fail closed, 1,000/min): answers 503 with `Retry-After: 2` while Redis is down;
//! - `/fallback` (40/min, local share for 2 gateways = 20/min): admits at most 20 while Redis is
//!   down and 429 after that.
//!
//! After the restart the store reconnects by itself (the app is not restarted) and reloads its
//! scripts on `NOSCRIPT`; every route is limited by Redis again within a stated time.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, ms};
use ratelimit_e2e::observe::{Logs, Metrics};
use ratelimit_e2e::{fault_layer, store_builder, wait_until};
use redis_harness::RedisServer;
use tower_ratelimit::FailurePolicy;

const TIMEOUT: Duration = Duration::from_millis(50);
const MARGIN: Duration = Duration::from_millis(750);
/// Late enough for about 200 checks a route before the kill, so that the 2% of them a loaded
/// machine may answer after the 50 ms timeout are a few checks, not one stall's two.
const KILL_AT: Duration = Duration::from_millis(1_200);
const RESTART_AT: Duration = Duration::from_millis(2_600);
/// Long enough after the restart for a slow recovery to leave a window to measure.
const LOAD_FOR: Duration = Duration::from_millis(5_600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_hold_while_redis_is_killed_and_recover_after_restart() {
    let logs = Logs::install();
    let mut redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let metrics = Metrics::new();
    let (open, closed, fallback) = metrics.register(|| {
        (
            fault_layer(&store, "open", 1_000, FailurePolicy::FailOpen, TIMEOUT),
            fault_layer(
                &store,
                "closed",
                1_000,
                FailurePolicy::fail_closed(Duration::from_secs(2)),
                TIMEOUT,
            ),
            fault_layer(
                &store,
                "fallback",
                40,
                FailurePolicy::fallback(2).unwrap(),
                TIMEOUT,
            ),
        )
    });
    let app = Router::new()
        .route("/open", get(|| async { "ok" }).route_layer(open))
        .route(
            "/closed",
            get(|| async { "ok" }).route_layer(closed.clone()),
        )
        .route("/fallback", get(|| async { "ok" }).route_layer(fallback));
    let app = TestApp::serve(app).await;
    let client = load::client();
    let routes = [
        ("open", app.url("/open")),
        ("closed", app.url("/closed")),
        ("fallback", app.url("/fallback")),
    ];

    let origin = Instant::now();
    let load = {
        let client = client.clone();
        let routes = routes.clone();
        tokio::spawn(async move {
            load::run(
                &client,
                &routes,
                2,
                LOAD_FOR,
                Duration::from_millis(10),
                origin,
            )
            .await
        })
    };
    tokio::time::sleep_until((origin + KILL_AT).into()).await;
    // Read on both sides of the kill: a thread paused between the reading and the kill would
    // otherwise put answers Redis still gave inside the outage window.
    let kill_began = origin.elapsed();
    redis.kill();
    let killed_at = origin.elapsed();
    tokio::time::sleep_until((origin + RESTART_AT).into()).await;
    // Redis may answer from inside `restart` on (it waits for PING): the outage window ends here.
    let restart_began = origin.elapsed();
    let redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    let restarted_at = origin.elapsed();
    // Recovery: the fail-closed route is served by Redis again.
    let recovered = wait_until(Duration::from_secs(5), || async {
        let s = load::get(&client, "closed", &app.url("/closed"), origin).await;
        s.status == 200
    })
    .await;
    let samples = load.await.unwrap();

    println!(
        "killed at {:.0} ms, restarted at {:.0} ms",
        ms(killed_at),
        ms(restarted_at)
    );
    for r in ["open", "closed", "fallback"] {
        println!("{r:>8}: {}", samples.route(r));
    }
    let recovered = recovered.expect("the store reconnects within 5 s of the restart");
    println!("recovered {:.0} ms after the restart", ms(recovered));

    // Nothing hangs, nothing fails at the HTTP level, every answer is bounded.
    assert_eq!(samples.count(0), 0, "every request got a response");
    assert!(
        samples.max() <= TIMEOUT + MARGIN,
        "worst latency {:?} over {:?}",
        samples.max(),
        TIMEOUT + MARGIN
    );

    // Before the kill: Redis decides. (On a loaded machine a check may exceed the 50 ms timeout
    // and be answered by the policy: at most 2% of them.)
    let before = samples.answered_before(kill_began);
    assert_eq!(before.route("open").statuses(), [200]);
    assert!(
        before.route("open").decided_share() >= 0.98,
        "the open route's 200s were decided: {} of {}",
        before.route("open").decided(),
        before.route("open").len()
    );
    assert!(
        before.route("closed").share(200) >= 0.98,
        "{}",
        before.route("closed")
    );

    // While down (from the kill until the restart began): each route follows its policy.
    let down = samples.sent_between(killed_at + Duration::from_millis(5), restart_began);
    assert!(down.route("open").len() > 20, "load ran during the outage");
    assert_eq!(
        down.route("open").statuses(),
        [200],
        "fail open keeps serving"
    );
    assert_eq!(
        down.route("open").decided(),
        0,
        "with Redis down, every 200 of the open route was let through undecided"
    );
    let closed_down = down.route("closed");
    assert_eq!(closed_down.statuses(), [503], "fail closed answers 503");
    assert!(
        closed_down
            .0
            .iter()
            .all(|s| s.retry_after.as_deref() == Some("2")),
        "every 503 says Retry-After: 2"
    );
    let fb = down.route("fallback");
    assert!(fb.count(200) <= 20, "local share is 20: {fb}");
    assert!(fb.count(429) > 0, "the local share is enforced: {fb}");
    assert_eq!(fb.count(200) + fb.count(429), fb.len());

    // Over the whole run the fallback route never admitted more than Redis's 40 before the kill,
    // the local 20 during the outage and a fresh 40 after the restart, plus what refilled over
    // the run: at most 40 a minute from Redis's bucket and 20 from the local one.
    let refill = (LOAD_FOR.as_secs_f64() * (40.0 + 20.0) / 60.0).ceil() as usize;
    let admitted = samples.route("fallback").count(200);
    assert!(
        admitted <= 40 + 20 + 40 + refill,
        "{admitted} admitted, at most {}",
        40 + 20 + 40 + refill
    );

    // After recovery every route is decided by Redis again. Each route's circuit closes by its
    // own probe: the window starts after the later of the two routes' recoveries (the open
    // route's from its first decided answer after the restart).
    let open_recovered = samples
        .route("open")
        .0
        .iter()
        .filter(|s| s.sent_at >= restart_began && s.decided)
        .map(|s| s.sent_at + s.latency)
        .min()
        .expect("the open route is decided by Redis again after the restart");
    let after = samples.sent_between(
        (restarted_at + recovered).max(open_recovered) + Duration::from_millis(300),
        LOAD_FOR,
    );
    assert!(
        after.route("closed").len() >= 50,
        "recovered too late to measure after it: {}",
        after.route("closed")
    );
    assert_eq!(after.route("open").statuses(), [200]);
    assert!(
        after.route("open").decided_share() >= 0.98,
        "the open route is decided by Redis again: {} of {}",
        after.route("open").decided(),
        after.route("open").len()
    );
    assert!(
        after.route("closed").share(200) >= 0.98,
        "{}",
        after.route("closed")
    );
    let res = client.get(app.url("/fallback")).send().await.unwrap();
    let policy = res.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        policy, "\"fallback\";q=40;w=60",
        "Redis's limit, not the local share"
    );

    // The restarted Redis holds state again, and the scripts were reloaded on NOSCRIPT.
    let sha = ratelimit_redis::script_sha(ratelimit_core::Algorithm::TokenBucket).unwrap();
    assert_eq!(redis.cli(&["script", "exists", sha]), "1");
    let keys = redis.cli(&["--scan", "--pattern", "e2e:*"]);
    assert!(
        keys.lines().count() >= 3,
        "state keys after restart: {keys}"
    );

    // Counted and logged.
    assert!(metrics.decisions("open", "failed_open") > 0);
    assert!(metrics.decisions("closed", "failed_closed") > 0);
    assert!(metrics.decisions("fallback", "fallback_allowed") <= 20);
    assert!(metrics.decisions("fallback", "fallback_denied") > 0);
    assert!(metrics.store_errors("closed", "error") > 0);
    assert!(metrics.store_errors("closed", "circuit_open") > 0);
    assert!(
        !logs
            .matching(&["WARN", "rate-limit store failed", "closed"])
            .is_empty()
    );
    assert!(!logs.matching(&["circuit open"]).is_empty());
    assert!(!logs.matching(&["circuit closed"]).is_empty());
    assert_eq!(
        closed.circuit_state(),
        Some(tower_ratelimit::CircuitState::Closed)
    );
}
