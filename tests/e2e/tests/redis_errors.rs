//! Redis answering errors instead of decisions: `maxmemory` reached with `noeviction`, a wrong
//! password, `SCRIPT FLUSH` in the middle of a load. Each maps to the route's failure policy (or,
//! for `SCRIPT FLUSH`, to no failure at all), with a log line and a metric, never a panic.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ratelimit_e2e::app::TestApp;
use ratelimit_e2e::load::{self, ms};
use ratelimit_e2e::observe::{Logs, Metrics};
use ratelimit_e2e::{
    answers_ok, fault_layer, patient_store_builder, per_minute, store_builder, wait_until,
};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;
use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer};

const TIMEOUT: Duration = Duration::from_millis(50);
const MARGIN: Duration = Duration::from_millis(750);

/// `/open` (fail open) and `/closed` (fail closed, Retry-After 1) over `store`, policies named
/// `<prefix>-open` and `<prefix>-closed`.
/// One scenario at a time: each loads its own server with bursts of 8 request loops and asserts
/// that nearly every healthy check answers within the 50 ms timeout, which two side by side on a
/// 2-core machine would not leave room for.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn app(store: &RedisStore, prefix: &str, metrics: &Metrics) -> TestApp {
    let (open, closed) = metrics.register(|| {
        (
            fault_layer(
                store,
                &format!("{prefix}-open"),
                100_000,
                FailurePolicy::FailOpen,
                TIMEOUT,
            ),
            fault_layer(
                store,
                &format!("{prefix}-closed"),
                100_000,
                FailurePolicy::fail_closed(Duration::from_secs(1)),
                TIMEOUT,
            ),
        )
    });
    TestApp::serve(
        Router::new()
            .route("/open", get(|| async { "ok" }).route_layer(open))
            .route("/closed", get(|| async { "ok" }).route_layer(closed)),
    )
    .await
}

/// `redis-cli` with an explicit password (the harness's helper uses the configured one).
fn cli_with_password(port: u16, password: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
            "-a",
            password,
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn burst(client: &reqwest::Client, app: &TestApp, what: &str) -> load::Samples {
    let s = load::run(
        client,
        &[("open", app.url("/open")), ("closed", app.url("/closed"))],
        2,
        Duration::from_millis(600),
        Duration::from_millis(5),
        Instant::now(),
    )
    .await;
    println!("{what}: {s}");
    assert_eq!(s.count(0), 0, "{what}: every request answered");
    assert!(s.max() <= TIMEOUT + MARGIN, "{what}: worst {:?}", s.max());
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_with_noeviction_maps_to_the_policy() {
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = Logs::install();
    let redis = RedisServer::builder()
        .config("maxmemory-policy noeviction")
        .start();
    let store = store_builder(&redis.url()).build().await.expect("store");
    let metrics = Metrics::new();
    let app = app(&store, "oom", &metrics).await;
    let client = load::client();

    let ok = burst(&client, &app, "before maxmemory").await;
    assert!(ok.share(200) >= 0.98, "{ok}");

    // Fill about 3 MB, then cap memory at 1 MB: every write is refused with OOM.
    redis.cli(&[
        "eval",
        "for i = 1, 3000 do redis.call('set', 'fill:' .. i, string.rep('x', 1000)) end return 1",
        "0",
    ]);
    redis.cli(&["config", "set", "maxmemory", "1mb"]);
    let full = burst(&client, &app, "maxmemory reached").await;
    assert_eq!(full.route("open").statuses(), [200], "fail open serves");
    assert_eq!(
        full.route("closed").statuses(),
        [503],
        "fail closed refuses"
    );
    assert!(metrics.store_errors("oom-closed", "error") >= 3);
    assert!(metrics.decisions("oom-closed", "failed_closed") > 0);
    assert!(metrics.decisions("oom-open", "failed_open") > 0);
    let lines = logs.matching(&["WARN", "rate-limit store failed", "oom-closed", "OOM"]);
    println!("log line: {}", lines.first().expect("an OOM log line"));

    // Memory freed: the store decides again, without a restart.
    redis.cli(&["config", "set", "maxmemory", "0"]);
    let back = wait_until(Duration::from_secs(5), || {
        answers_ok(&client, app.url("/closed"))
    })
    .await
    .expect("recovers within 5 s of memory being freed");
    println!("recovered {:.0} ms after maxmemory was lifted", ms(back));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_maps_to_the_policy() {
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = Logs::install();
    let redis = RedisServer::builder().password("right-pw").start();
    let port = redis.port();

    // At start-up: a typed error that says why, never a panic.
    let wrong = format!("redis://:wrong-pw@127.0.0.1:{port}");
    let err = store_builder(&wrong)
        .build()
        .await
        .expect_err("wrong password");
    println!("build with a wrong password: {err}");
    let text = err.to_string();
    assert!(
        matches!(err, ratelimit_redis::RedisStoreError::Connection { .. }),
        "{err:?}"
    );
    assert!(
        text.to_ascii_lowercase().contains("authentication failed"),
        "{text}"
    );
    assert!(
        !text.contains("wrong-pw"),
        "the password is not echoed: {text}"
    );

    // While running: the password changes and the connections are cut.
    let right = format!("redis://:right-pw@127.0.0.1:{port}");
    let store = store_builder(&right).build().await.expect("store");
    let metrics = Metrics::new();
    let app = app(&store, "auth", &metrics).await;
    let client = load::client();
    let ok = burst(&client, &app, "right password").await;
    assert!(ok.share(200) >= 0.98, "{ok}");

    cli_with_password(
        port,
        "right-pw",
        &["config", "set", "requirepass", "rotated-pw"],
    );
    cli_with_password(port, "rotated-pw", &["client", "kill", "type", "normal"]);
    let refused = burst(&client, &app, "password rotated under the app").await;
    assert_eq!(refused.route("open").statuses(), [200]);
    assert_eq!(refused.route("closed").statuses(), [503]);
    assert!(metrics.store_errors("auth-closed", "error") >= 1);
    let lines = logs.matching(&["WARN", "rate-limit store failed", "auth-closed"]);
    println!("log line: {}", lines.first().expect("a log line"));

    // The password is put back: the store reconnects by itself.
    cli_with_password(
        port,
        "rotated-pw",
        &["config", "set", "requirepass", "right-pw"],
    );
    let back = wait_until(Duration::from_secs(5), || {
        answers_ok(&client, app.url("/closed"))
    })
    .await
    .expect("recovers within 5 s of the password being restored");
    println!(
        "recovered {:.0} ms after the password was restored",
        ms(back)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_load_costs_nothing_and_counts_exactly() {
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    // The store's own timeout too (200 ms in the suite's builder) must leave room for the
    // NOSCRIPT path, EVALSHA, SCRIPT LOAD and EVALSHA again, on a loaded machine.
    let store = patient_store_builder(&redis.url())
        .build()
        .await
        .expect("store");
    let metrics = Metrics::new();
    let limit = 150;
    // Fail closed, and a timeout long enough that a loaded machine never causes one: any store
    // error would show as a 503.
    let api = metrics.register(|| {
        RateLimitLayer::builder(
            store.clone(),
            Policy::new("flush", per_minute(limit))
                .unwrap()
                .failure(FailurePolicy::fail_closed(Duration::from_secs(1))),
        )
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
    });
    let app =
        TestApp::serve(Router::new().route("/api", get(|| async { "ok" }).route_layer(api))).await;
    let client = load::client();

    let origin = Instant::now();
    let run_for = Duration::from_millis(1_500);
    let flusher = tokio::task::spawn_blocking(move || {
        let mut flushes = 0;
        while origin.elapsed() < run_for {
            assert_eq!(redis.cli(&["script", "flush"]), "OK");
            flushes += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        (flushes, redis)
    });
    let samples = load::run(
        &client,
        &[("api", app.url("/api"))],
        3,
        run_for,
        Duration::from_millis(2),
        origin,
    )
    .await;
    let (flushes, redis) = flusher.await.unwrap();
    println!("{flushes} SCRIPT FLUSHes during {samples}");

    // About 20 on this machine (a `redis-cli` process and a 50 ms pause each); fewer on a
    // loaded one, and a few suffice to land between checks.
    assert!(flushes >= 5, "{flushes} flushes");
    assert_eq!(samples.count(0), 0);
    assert_eq!(samples.count(503), 0, "NOSCRIPT never becomes a failure");
    assert_eq!(metrics.store_errors("flush", "error"), 0);
    assert_eq!(metrics.store_errors("flush", "timeout"), 0);
    assert!(samples.len() as u64 > limit + 50, "the limit was reached");
    // A token bucket of 150/min refills 2.5 per second: over the run at most ~5 more.
    let admitted = samples.count(200) as u64;
    assert!(
        (limit..=limit + 6).contains(&admitted),
        "admitted {admitted} for a limit of {limit}"
    );
    assert_eq!(metrics.decisions("flush", "allowed"), admitted);
    let sha = ratelimit_redis::script_sha(ratelimit_core::Algorithm::TokenBucket).unwrap();
    let _ = client.get(app.url("/api")).send().await.unwrap();
    assert_eq!(redis.cli(&["script", "exists", sha]), "1", "reloaded");
    // The server saw the NOSCRIPT replies and the reloads: its own error and command counters.
    let errors = redis.cli(&["info", "errorstats"]);
    let noscript = stat(&errors, "errorstat_NOSCRIPT:count=");
    let commands = redis.cli(&["info", "commandstats"]);
    let loads = stat(&commands, "cmdstat_script|load:calls=");
    println!("server side: {noscript} NOSCRIPT replies, {loads} SCRIPT LOADs");
    assert!(noscript >= 1, "{errors}");
    assert!(loads >= 1, "{commands}");
}

/// The number after `prefix` in an `INFO` section (0 if absent).
fn stat(info: &str, prefix: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
