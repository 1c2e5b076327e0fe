//! A slow and broken network between the app and Redis: a loopback TCP proxy
//! (`redis_harness::proxy::Proxy`) adds latency to every chunk, cuts connections and refuses new
//! ones. Latency under the timeout is only latency; latency over it is a failure answered by the
//! policy within the timeout; cut and refused connections are failures the store recovers from
//! by itself.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, Samples, ms};
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::{answers_ok, fault_layer, store_builder, wait_until};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;
use redis_harness::proxy::Proxy;
use tower_ratelimit::{FailurePolicy, RateLimitLayer};

const TIMEOUT: Duration = Duration::from_millis(100);
const MARGIN: Duration = Duration::from_millis(400);

fn layer(store: &RedisStore, name: &str, failure: FailurePolicy) -> RateLimitLayer<RedisStore> {
    fault_layer(store, name, 100_000, failure, TIMEOUT)
}

async fn phase(client: &reqwest::Client, app: &TestApp, what: &str, ms_: u64) -> Samples {
    let s = load::run(
        client,
        &[("open", app.url("/open")), ("closed", app.url("/closed"))],
        2,
        Duration::from_millis(ms_),
        Duration::from_millis(5),
        Instant::now(),
    )
    .await;
    println!("{what}: {s}");
    assert_eq!(s.count(0), 0, "{what}: every request answered");
    assert!(
        s.max() <= TIMEOUT + MARGIN,
        "{what}: worst {:?} over {:?}",
        s.max(),
        TIMEOUT + MARGIN
    );
    s
}

/// Waits until `/closed` is answered by the store again, and `/open` too (each route's circuit
/// closes by its own probe), then 150 ms more: a connection whose opening failed just before
/// waits out its 100 ms gap (`RECONNECT_GAP`) before opening again, and the next phase measures
/// the store once every connection can be open.
async fn recovers(client: &reqwest::Client, app: &TestApp, what: &str) {
    let took = wait_until(Duration::from_secs(5), || {
        answers_ok(client, app.url("/closed"))
    })
    .await
    .unwrap_or_else(|| panic!("{what}: no recovery within 5 s"));
    let open = app.url("/open");
    wait_until(Duration::from_secs(5), || async {
        load::get(client, "open", &open, Instant::now())
            .await
            .decided
    })
    .await
    .unwrap_or_else(|| panic!("{what}: the open route not decided again within 5 s"));
    println!("{what}: recovered in {:.0} ms", ms(took));
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_cuts_and_refusals_between_app_and_redis() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port());
    let store = store_builder(&proxy.url())
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("store");
    let metrics = Metrics::new();
    let (open, closed) = metrics.register(|| {
        (
            layer(&store, "net-open", FailurePolicy::FailOpen),
            layer(
                &store,
                "net-closed",
                FailurePolicy::fail_closed(Duration::from_secs(1)),
            ),
        )
    });
    let app = TestApp::serve(
        Router::new()
            .route("/open", get(|| async { "ok" }).route_layer(open))
            .route("/closed", get(|| async { "ok" }).route_layer(closed)),
    )
    .await;
    let client = load::client();

    let fast = phase(&client, &app, "no added latency", 500).await;
    // (On a loaded machine a check may exceed the timeout: at most 2% of them.)
    assert!(fast.share(200) >= 0.98, "{fast}");

    // 20 ms each way: a 40 ms round trip, under the 100 ms timeout.
    proxy.set_latency(Duration::from_millis(20));
    let slow = phase(&client, &app, "20 ms each way", 1_000).await;
    let closed = slow.route("closed");
    assert!(
        closed.count(200) * 10 >= closed.len() * 9,
        "at least 90% decided by Redis: {closed}"
    );
    assert!(
        slow.percentile(50.0) >= Duration::from_millis(40),
        "the latency is really added"
    );

    // 300 ms each way: every check times out; the policy answers within the timeout.
    proxy.set_latency(Duration::from_millis(300));
    let errors_before = metrics.store_errors("net-closed", "timeout");
    let stalled = phase(&client, &app, "300 ms each way", 1_000).await;
    assert_eq!(stalled.route("open").statuses(), [200]);
    assert_eq!(stalled.route("open").decided(), 0, "let through undecided");
    assert_eq!(stalled.route("closed").statuses(), [503]);
    assert!(metrics.store_errors("net-closed", "timeout") > errors_before);
    assert!(metrics.store_errors("net-closed", "circuit_open") > 0);
    println!(
        "  p99 during the slow phase: {:.1} ms",
        ms(stalled.percentile(99.0))
    );

    // Back to normal, and every connection is cut: the store reconnects by itself.
    proxy.set_latency(Duration::ZERO);
    let accepted_before_cut = proxy.accepted();
    proxy.drop_connections();
    let cut = phase(&client, &app, "connections cut", 300).await;
    assert_eq!(cut.route("open").statuses(), [200]);
    recovers(&client, &app, "after the cut").await;
    assert!(
        proxy.accepted() > accepted_before_cut,
        "the store made new connections after the cut"
    );

    // New connections refused, open ones cut: failures, then recovery once accepted again.
    let errors_before_refusals = metrics.store_errors("net-closed", "error");
    proxy.set_refuse(true);
    proxy.drop_connections();
    let refused = phase(&client, &app, "connections refused", 800).await;
    assert_eq!(refused.route("open").statuses(), [200]);
    assert!(refused.route("closed").count(503) > 0);
    assert!(
        metrics.store_errors("net-closed", "error") > errors_before_refusals,
        "the refusals were counted as store errors"
    );
    // From here on the proxy accepts again: what it accepts is the store reconnecting.
    let accepted_before_healing = proxy.accepted();
    proxy.set_refuse(false);
    recovers(&client, &app, "after refusals end").await;

    let healed = phase(&client, &app, "healed", 500).await;
    assert!(healed.share(200) >= 0.98, "{healed}");
    assert!(healed.route("open").decided_share() >= 0.98, "{healed}");
    assert!(
        proxy.accepted() > accepted_before_healing,
        "the store opened new connections once they were accepted"
    );
}
