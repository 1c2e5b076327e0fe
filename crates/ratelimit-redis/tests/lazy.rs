//! `RedisStoreBuilder::build_lazy`: a store made while Redis cannot be reached, against a real
//! `redis-server` behind a proxy that refuses connections, then accepts them.

mod common;

use std::time::{Duration, Instant};

use common::unique_prefix;
use ratelimit_core::{Algorithm, Limit, Quota, Store};
use ratelimit_redis::{Coalescing, RedisStore, RedisStoreError};
use redis_harness::RedisServer;
use redis_harness::proxy::Proxy;

fn limit() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_answers_at_once_while_down_and_connects_once_redis_is_reachable() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let retry_every = Duration::from_millis(200);
    let before = proxy.accepted();
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lazy"))
        .build_lazy(retry_every)
        .await
        .expect("an unreachable server is not an invalid setting");
    assert!(!store.is_connected());
    assert!(store.get().is_none());

    // While Redis refuses: every check fails at once, with the attempt's error, and attempts are
    // made one per `retry_every` at most, however many checks come.
    let start = Instant::now();
    let (mut checks, mut at_once) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(1) {
        checks += 1;
        let limit = limit();
        let mut check = std::pin::pin!(store.check(b"k", &limit, 1));
        let e = match futures::poll!(check.as_mut()) {
            std::task::Poll::Ready(answer) => {
                at_once += 1;
                answer
            }
            std::task::Poll::Pending => check.await,
        }
        .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        assert!(matches!(e, RedisStoreError::Connection { .. }), "{e:?}");
        tokio::task::yield_now().await;
    }
    let attempts = proxy.accepted() - before;
    println!(
        "{checks} checks in 1 s while down, {at_once} answered at their first poll, {attempts} \
         attempts to connect"
    );
    // Only a check that made an attempt waited for anything.
    assert!(
        checks - at_once <= attempts && at_once > 0,
        "{} of {checks} checks waited, for {attempts} attempts",
        checks - at_once
    );
    // The first at once, then at most one per 200 ms (and some slack for a slow attempt).
    assert!((2..=7).contains(&attempts), "{attempts} attempts in 1 s");

    // Reachable again: the next attempt builds the store, and checks reach Redis.
    proxy.set_refuse(false);
    let back = Instant::now();
    loop {
        match store.check(b"k", &limit(), 1).await {
            Ok(d) => {
                assert!(d.is_allowed());
                break;
            }
            Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        }
        assert!(back.elapsed() < Duration::from_secs(5), "never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "connected {:?} after Redis accepted connections",
        back.elapsed()
    );
    assert!(store.is_connected());
    let redis = store.get().expect("the built store");
    let keys = redis.state_keys(b"k", &limit());
    assert_eq!(
        server.cli(&["exists", &keys[0]]),
        "1",
        "the state is in Redis"
    );
    // Later checks count on the same state.
    let d = store.check(b"k", &limit(), 1).await.unwrap();
    assert!(d.remaining() < 99, "{d:?}");
}

/// The store connects once Redis can be reached whether checks come or not: a gateway started
/// during an outage and left idle, or whose routes' circuits are open (their checks held back for
/// a cool-down), is connected when its next check comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_connects_without_checks() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lazy-idle"))
        .build_lazy(Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!store.is_connected());
    proxy.set_refuse(false);
    let start = Instant::now();
    while !store.is_connected() {
        assert!(start.elapsed() < Duration::from_secs(5), "never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "connected {:?} after Redis accepted connections, no check made",
        start.elapsed()
    );
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
}

/// `Coalescing` wraps a lazy store as it does a built one: while Redis cannot be reached its
/// checks fail at once (none waits in a key's queue for a call that cannot be made), and once the
/// store has connected the concurrent checks of a key share script calls, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_over_a_lazy_store_fails_at_once_then_merges_checks() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lazy-coalesce"))
        .build_lazy(Duration::from_millis(50))
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).batch_window(Duration::from_millis(2));
    // 100 a day: nothing refills during the test.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();

    let checks = (0..20).map(|_| coalescing.check(b"hot", &limit, 1));
    let results = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(checks))
        .await
        .expect("no check waits while Redis cannot be reached");
    for r in results {
        let e = r.unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
    }

    proxy.set_refuse(false);
    let start = Instant::now();
    while !coalescing.get_ref().is_connected() {
        assert!(start.elapsed() < Duration::from_secs(5), "never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = coalescing.stats();
    let decisions = common::concurrent_hot_checks(&coalescing, &limit, 300).await;
    let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
    let stats = coalescing.stats();
    let calls = stats.store_calls - before.store_calls;
    println!("300 concurrent checks once connected: {calls} script calls; {stats:?}");
    assert_eq!(admitted, 100, "exactly the limit");
    assert!(
        calls < 100,
        "{calls} script calls for 300 checks: none merged"
    );
    common::assert_each_remaining_once(&decisions, 100, "once connected");
}

#[tokio::test]
async fn an_invalid_setting_fails_a_lazy_build_at_once() {
    // No server at all: the setting is refused before any connection is tried.
    let err = RedisStore::builder("redis://127.0.0.1:1")
        .prefix("a{b}")
        .build_lazy(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedisStoreError::Config { name: "prefix", .. }),
        "{err:?}"
    );
    // A retry interval of zero would retry without pause; of more than an hour, hardly ever.
    for every in [Duration::ZERO, Duration::from_secs(3_601), Duration::MAX] {
        let err = RedisStore::builder("redis://127.0.0.1:1")
            .build_lazy(every)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                RedisStoreError::Config {
                    name: "retry_every",
                    ..
                }
            ),
            "{every:?}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_built_while_redis_is_up_is_connected_at_once() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("lazy-up"))
        .build_lazy(Duration::from_secs(3_600))
        .await
        .unwrap();
    assert!(store.is_connected());
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
}

/// Refused credentials are a wrong setting, not Redis being down: a lazy build returns them, as
/// `build` does, instead of retrying them for ever.
#[tokio::test]
async fn refused_credentials_fail_a_lazy_build_at_once() {
    let server = RedisServer::builder().password("right").start();
    let url = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let err = RedisStore::builder(url)
        .prefix(unique_prefix("lazy-auth"))
        .build_lazy(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.is_refused_credentials(), "{err:?}");
    assert!(!err.is_unavailable(), "reached, and refused: {err:?}");
    assert!(!err.to_string().contains("wrong"), "not echoed: {err}");
    // The message says what happened plainly, and names the server it tried, without the
    // password.
    assert!(
        err.to_string().contains("Redis refused the credentials: "),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("redis://***@127.0.0.1:{}", server.port())),
        "{err}"
    );
    // Unreachable is not refused.
    let mut down = RedisServer::start();
    down.kill();
    let unreachable = RedisStore::builder(down.url()).build().await.unwrap_err();
    assert!(!unreachable.is_refused_credentials(), "{unreachable:?}");
    assert!(
        unreachable
            .to_string()
            .starts_with(&format!("could not connect to Redis: {}: ", down.url())),
        "{unreachable}"
    );
}

/// An address where something other than a usable Redis answers is a wrong setting too: a lazy
/// build returns it at once (`is_wrong_server`), on one line; an unreachable one is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_server_fails_a_lazy_build_at_once() {
    // A web server where Redis should be.
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let web_url = format!("redis://127.0.0.1:{}", web.local_addr().unwrap().port());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for conn in web.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.read(&mut [0u8; 512]);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let plain = RedisServer::start();
    let node = RedisServer::builder().config("cluster-enabled yes").start();
    let sentinel = RedisServer::builder().sentinel_of(plain.port()).start();
    let lazily = |builder: ratelimit_redis::RedisStoreBuilder| async move {
        builder
            .prefix(unique_prefix("lazy-wrong"))
            .build_lazy(Duration::from_secs(3_600))
            .await
    };
    for (what, builder) in [
        ("a web server", RedisStore::builder(web_url.as_str())),
        (
            "a web server as a cluster",
            RedisStore::cluster([web_url.as_str()]),
        ),
        ("no cluster support", RedisStore::cluster([plain.url()])),
        (
            "no database 99",
            RedisStore::builder(format!("{}/99", plain.url())),
        ),
        // Past what `SELECT` takes (a 32-bit number): refused with another text ("value is
        // out of range"), which was taken for an outage and retried for ever.
        (
            "a database number past 32 bits",
            RedisStore::builder(format!("{}/99999999999", plain.url())),
        ),
        // A cluster node and a Sentinel given with a database: the `SELECT` fails before the
        // `HELLO` that tells them apart without one (they were taken for outages).
        (
            "a cluster node, with a database",
            RedisStore::builder(format!("{}/1", node.url())),
        ),
        (
            "a Sentinel, with a database",
            RedisStore::builder(format!("{}/1", sentinel.url())),
        ),
    ] {
        let err = lazily(builder)
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: built"));
        assert!(err.is_wrong_server(), "{what}: {err:?}");
        assert!(!err.is_refused_credentials(), "{what}: {err:?}");
        // Reached: not an outage to wait out.
        assert!(!err.is_unavailable(), "{what}: {err:?}");
        if what.starts_with("a web server") {
            assert!(
                err.to_string()
                    .contains("what answers there is not a Redis server"),
                "{what}: {err}"
            );
        }
        assert!(!err.to_string().contains('\n'), "{what}: one line: {err}");
    }
    // Unreachable is not a wrong server: the lazy build starts, and retries. (A proxy that
    // refuses holds its port; a killed server's could be taken by another test's meanwhile.)
    let proxy = Proxy::start(plain.port());
    proxy.set_refuse(true);
    let unreachable = RedisStore::builder(proxy.url()).build().await.unwrap_err();
    assert!(!unreachable.is_wrong_server(), "{unreachable:?}");
    assert!(unreachable.is_unavailable(), "{unreachable:?}");
    let store = lazily(RedisStore::builder(proxy.url())).await.unwrap();
    assert!(!store.is_connected());
}

/// Log lines written by a test's subscriber.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Lines {
    /// Collects the warnings logged on this thread while the guard lives.
    fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
        // A second dispatcher registered for good: with only the capture's, tracing would cache
        // a callsite's interest from whichever thread reached it first, for every thread (see
        // tower-ratelimit's tests/common, `keep_a_second_dispatcher`).
        static KEPT: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        KEPT.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::new()));
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        (lines, tracing::subscriber::set_default(subscriber))
    }

    /// What was logged so far.
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// How many warnings logged so far say `what`.
    fn warned(&self, what: &str) -> usize {
        self.text()
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains(what))
            .count()
    }
}

/// A lazy store of `url`, whose server is behind `proxy` (refusing at first): warned of once as
/// unreachable; then, the proxy forwarding, warned of at once as `then` says (within 20 s), and
/// still not connected.
async fn warned_at_once_when_reached(
    lines: &Lines,
    proxy: &Proxy,
    url: String,
    prefix: &str,
    then: &str,
) {
    proxy.set_refuse(true);
    let store = RedisStore::builder(url)
        .prefix(unique_prefix(prefix))
        .build_lazy(Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(lines.warned("cannot be reached yet"), 1, "{}", lines.text());
    proxy.set_refuse(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines.warned(then) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lines.warned(then), 1, "{}", lines.text());
    assert!(!store.is_connected());
}

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An outage retried every 20 ms is one warning, not one per attempt: the attempts after the
/// first are `DEBUG` events until a minute has passed. (A current-thread runtime: the task that
/// retries logs on the thread whose subscriber this test set. The attempts are counted at the
/// proxy: `DEBUG` events of a callsite that other tests' threads reached first, with no
/// subscriber, may not reach this one.)
#[tokio::test]
async fn failed_attempts_are_warned_of_once_a_minute_at_most() {
    let (lines, _guard) = Lines::capture();
    // A proxy that refuses, holding its port (a killed server's port may be taken by another
    // test's server meanwhile).
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lazy-quiet"))
        .build_lazy(Duration::from_millis(20))
        .await
        .unwrap();
    // Five attempts after the first, each a connection the proxy accepts and closes.
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.accepted() < 6 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(proxy.accepted() >= 6, "{} attempts", proxy.accepted());
    assert!(!store.is_connected());
    assert_eq!(lines.warned(""), 1, "{}", lines.text());
}

/// A change of cause is warned of at once, not up to a minute later: Redis unreachable, then
/// reached but refusing the credentials (a password rotated during the outage).
#[tokio::test]
async fn a_change_of_cause_is_warned_of_at_once() {
    let (lines, _guard) = Lines::capture();
    let server = RedisServer::builder().password("rotated").start();
    let proxy = Proxy::start(server.port());
    // Reachable again, with the password changed.
    let url = format!("redis://:expired-pw@127.0.0.1:{}", proxy.port());
    warned_at_once_when_reached(&lines, &proxy, url, "lazy-cause", "refused the credentials").await;
    assert!(
        !lines.text().contains("expired-pw"),
        "the password is not echoed: {}",
        lines.text()
    );
}

/// Reached after an outage, a server that is not one the store can use (here, without the
/// URL's database) is warned of at once as such, not as the outage going on.
#[tokio::test]
async fn a_wrong_server_reached_after_an_outage_is_warned_of_at_once() {
    let (lines, _guard) = Lines::capture();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/99", proxy.port());
    warned_at_once_when_reached(
        &lines,
        &proxy,
        url,
        "lazy-wrong",
        "not a Redis this store can use",
    )
    .await;
}

/// A replica given as the server is reached but cannot serve checks: warned of as such (not as
/// a Redis that cannot be reached), retried, and connected once it is promoted.
#[tokio::test]
async fn a_replica_is_warned_of_as_reached_and_connected_once_promoted() {
    let (lines, _guard) = Lines::capture();
    let primary = RedisServer::start();
    let replica = RedisServer::builder()
        .config(format!("replicaof 127.0.0.1 {}", primary.port()))
        .start();
    let store = RedisStore::builder(replica.url())
        .prefix(unique_prefix("lazy-replica"))
        .build_lazy(Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(
        lines.warned("Redis was reached but cannot serve checks yet"),
        1,
        "{}",
        lines.text()
    );
    assert!(
        lines.text().contains("a replica given as the server"),
        "{}",
        lines.text()
    );
    assert_eq!(lines.warned("cannot be reached yet"), 0, "{}", lines.text());
    assert!(!store.is_connected());
    replica.cli(&["replicaof", "no", "one"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !store.is_connected() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(store.is_connected());
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
}

/// A store built by `build` serves through the lazy type as it is: connected, and never
/// attempting anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_store_is_a_connected_lazy_store() {
    let server = RedisServer::start();
    let built = RedisStore::builder(server.url())
        .prefix(unique_prefix("lazy-from"))
        .build()
        .await
        .unwrap();
    let store = ratelimit_redis::LazyRedisStore::from(built);
    assert!(store.is_connected());
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
}

/// An attempt whose task ends with its runtime (a store shared by several runtimes, one of which
/// shuts down while it attempts) does not stop the attempts: checks on another runtime make them,
/// and the store connects.
#[test]
fn an_attempt_ended_with_its_runtime_does_not_stop_the_attempts() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let retry_every = Duration::from_millis(50);
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = first.block_on(async {
        let store = RedisStore::builder(proxy.url())
            .prefix(unique_prefix("lazy-runtime"))
            .build_lazy(retry_every)
            .await
            .unwrap();
        tokio::time::sleep(retry_every).await;
        // Starts an attempt, in a task this runtime drops unrun as it shuts down.
        assert!(store.check(b"k", &limit(), 1).await.is_err());
        store
    });
    drop(first);
    proxy.set_refuse(false);
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let start = Instant::now();
        while store.check(b"k", &limit(), 1).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no attempt after the first runtime's"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(store.is_connected());
    });
}

/// The store's response timeout, as the tower layer reads it when it is built: the builder's (or
/// the 500 ms default), known before a lazy store has reached Redis, and the same through every
/// wrapper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_timeout_is_told_before_and_after_connecting() {
    use ratelimit_core::{DenialCache, Leasing, SystemClock};
    use std::sync::Arc;

    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let builder = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lazy-timeout"))
        .response_timeout(Duration::from_millis(60));
    let unbuilt = builder
        .clone()
        .build_lazy(Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!unbuilt.is_connected());
    let told = Some(Duration::from_millis(60));
    assert_eq!(unbuilt.response_timeout(), told);

    proxy.set_refuse(false);
    let built = builder.build().await.unwrap();
    assert_eq!(built.response_timeout(), told);
    assert_eq!(
        ratelimit_redis::LazyRedisStore::from(built.clone()).response_timeout(),
        told
    );
    assert_eq!(Arc::new(built.clone()).response_timeout(), told);
    let wrapped = DenialCache::new(
        Leasing::new(ratelimit_redis::Coalescing::new(built), SystemClock::new()),
        SystemClock::new(),
    );
    assert_eq!(wrapped.response_timeout(), told);
    let default = RedisStore::builder(server.url()).build_lazy(Duration::from_secs(60));
    assert_eq!(
        default.await.unwrap().response_timeout(),
        Some(Duration::from_millis(500))
    );
}

/// A store dropped while Redis is still down ends its task that retries at once, rather than
/// when that task next wakes (up to `retry_every`, an hour here).
#[tokio::test]
async fn a_dropped_store_ends_its_retrying_task_at_once() {
    let url = format!("redis://127.0.0.1:{}", redis_harness::closed_port());
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let store = RedisStore::builder(url)
        .build_lazy(Duration::from_secs(3_600))
        .await
        .unwrap();
    assert!(!store.is_connected());
    // Let it run up to its wait for the next attempt (and the failed attempt's watch of the
    // runtime end).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        before + 2,
        "the task that retries, waiting, and the store's watch of its runtime"
    );
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > before {
        assert!(
            Instant::now() < deadline,
            "the task still runs 5 s after its store was dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A store dropped while an attempt waits on a server that accepted the connection and never
/// answers ends its task at once, rather than when the attempt's timeouts (an hour here) end it.
/// The store's own task that opens the attempt's connection runs on until the connection opens
/// or fails (here, when the server closes it; at the latest, at the connect timeout), then ends
/// too.
#[tokio::test]
async fn a_store_dropped_during_an_attempt_ends_its_task_at_once() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let (accepted, told_accepted) = std::sync::mpsc::channel();
    let (close, told_close) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        // The first attempt (`build_lazy`'s own) is closed at once: unavailable, so retried.
        drop(listener.accept());
        // The next is kept without a word until the test says.
        let held = listener.accept().unwrap();
        accepted.send(()).unwrap();
        let _ = told_close.recv();
        drop(held);
    });
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let store = RedisStore::builder(url)
        .connect_timeout(Duration::from_secs(3_600))
        .response_timeout(Duration::from_secs(3_600))
        .build_lazy(Duration::from_millis(10))
        .await
        .unwrap();
    assert!(!store.is_connected());
    let deadline = Instant::now() + Duration::from_secs(5);
    while told_accepted.try_recv().is_err() {
        assert!(Instant::now() < deadline, "the retried attempt never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let during = metrics.num_alive_tasks();
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() >= during {
        assert!(
            Instant::now() < deadline,
            "the task still runs 5 s after its store was dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    close.send(()).unwrap();
    server.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > before {
        assert!(
            Instant::now() < deadline,
            "the attempt's connection task outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A user that may not run `SELECT` (an ACL without it), given a database in the URL, has a right
/// missing: refused credentials, which waiting will not mend, so the lazy build is refused too.
/// (The client's error, "Redis server refused to switch database" with "this user has no
/// permissions to run the 'select' command", carries no `NOPERM` code, and was taken for an
/// outage: the lazy build started and retried it for ever.)
/// So is a URL with a database and without the password the server asks (`NOAUTH`'s code
/// dropped the same way, where without a database it is kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_select_is_refused_credentials() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL", "SETUSER", "limited", "on", ">pw12345", "~*", "&*", "+@all", "-select",
    ]);
    let locked = RedisServer::builder().password("s3cret").start();
    for url in [
        format!("redis://limited:pw12345@127.0.0.1:{}/1", server.port()),
        format!("redis://127.0.0.1:{}/1", locked.port()),
    ] {
        let err = RedisStore::builder(url.as_str())
            .prefix(unique_prefix("no-select"))
            .build()
            .await
            .unwrap_err();
        assert!(err.is_refused_credentials(), "{url}: {err:?}");
        assert!(!err.is_unavailable(), "{url}: {err:?}");
        let lazy = RedisStore::builder(url.as_str())
            .prefix(unique_prefix("no-select"))
            .build_lazy(Duration::from_secs(3_600))
            .await
            .expect_err("a lazy build refused");
        assert!(lazy.is_refused_credentials(), "{url}: {lazy:?}");
    }
}

/// A lazy store made on a runtime that is then dropped (a set-up runtime), while Redis refuses:
/// its task that retries went with that runtime, and a check on a current-thread runtime starts
/// it again there, so that the store connects once Redis accepts.
#[test]
fn a_lazy_store_whose_runtime_is_gone_connects_for_a_current_thread_runtime() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_refuse(true);
    let store = common::current_thread_runtime().block_on(async {
        RedisStore::builder(proxy.url())
            .prefix(unique_prefix("lazy-gone-rt"))
            .build_lazy(Duration::from_millis(100))
            .await
            .unwrap()
    });
    assert!(!store.is_connected());
    proxy.set_refuse(false);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let connected = common::current_thread_runtime().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(d) = store.check(b"k", &limit, 1).await {
                return d.remaining();
            }
            assert!(Instant::now() < deadline, "never connected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert_eq!(connected, 999);
}
