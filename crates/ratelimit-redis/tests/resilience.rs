//! Timeouts, broken connections, restarts, passwords and ACL users, configuration errors.

mod common;

use std::time::{Duration, Instant};

use common::{LEAST_PRIVILEGE, connections_received, unique_prefix};
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, RedisStoreBuilder, RedisStoreError};
use redis_harness::RedisServer;
use redis_harness::proxy::Proxy;

fn limit() -> Limit {
    Limit::single(Algorithm::Gcra, Quota::per_second(100).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_is_a_timeout_not_a_hang() {
    let server = RedisServer::start();
    let store = checked(
        RedisStore::builder(server.url())
            .prefix(unique_prefix("pause"))
            .response_timeout(Duration::from_millis(200)),
    )
    .await;
    server.pause();
    let started = Instant::now();
    let err = store.check(b"k", &limit(), 1).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(matches!(err, RedisStoreError::Timeout { .. }), "{err:?}");
    assert!(err.is_unavailable());
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // Once thawed, checks work again on the same connections.
    let mut ok = false;
    for _ in 0..20 {
        if store.check(b"k", &limit(), 1).await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "checks work again after the server resumes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_reopened_after_a_restart() {
    let mut server = RedisServer::start();
    let store = checked(
        RedisStore::builder(server.url())
            .prefix(unique_prefix("restart"))
            .pool_size(3),
    )
    .await;
    server.kill();
    let err = store.check(b"k", &limit(), 1).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    // The connections are re-opened while the server is down: their errors name the URL, as the
    // build's would, on one line.
    let url = server.url();
    let mut named = None;
    for _ in 0..10 {
        let e = store.check(b"k", &limit(), 1).await.unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        if matches!(e, RedisStoreError::Connection { .. }) {
            named = Some(e.to_string());
            break;
        }
    }
    let named = named.expect("a check fails for want of a connection while the server is down");
    assert!(
        named.starts_with(&format!("could not connect to Redis: {url}: ")),
        "{named}"
    );
    assert!(!named.contains('\n'), "{named}");
    server.restart();
    // Each broken connection fails once and is replaced; then every check succeeds (the restarted
    // server is empty and has no scripts: NOSCRIPT loads them).
    let mut failures = 0;
    let mut successes = 0;
    for _ in 0..30 {
        match store.check(b"k", &limit(), 1).await {
            Ok(_) => successes += 1,
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                failures += 1;
            }
        }
    }
    assert!(failures <= 3, "{failures} failures after the restart");
    assert!(successes >= 27);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users() {
    let server = RedisServer::builder()
        .password("s3cret")
        .acl_user("gateway", "g4teway")
        .start();
    let port = server.port();
    for url in [
        format!("redis://:s3cret@127.0.0.1:{port}"),
        format!("redis://gateway:g4teway@127.0.0.1:{port}/0"),
    ] {
        let store = RedisStore::builder(url.as_str()).build().await.unwrap();
        assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    }
    let err = RedisStore::builder(format!("redis://gateway:wrong@127.0.0.1:{port}"))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::Connection { .. }), "{err:?}");
    assert!(
        !err.to_string().contains("wrong"),
        "no password in messages: {err}"
    );
    // Without a password the connection opens, and the first command (loading the scripts) is
    // refused: build fails, saying so as it does for a wrong password, with the URL.
    let err = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::Connection { source: Some(e), .. } if e.code() == Some("NOAUTH")),
        "{err:?}"
    );
    assert!(err.is_refused_credentials(), "{err:?}");
    assert!(
        err.to_string().starts_with(&format!(
            "could not connect to Redis: redis://127.0.0.1:{port}: Redis refused the credentials: "
        )),
        "{err}"
    );
}

/// A password set on the server while the store runs without one (a rotation done in the wrong
/// order): the checks' errors say the credentials were refused, whatever words Redis used for
/// it (`NOAUTH`, or closing the connection with "unauthenticated multibulk length").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_set_while_running_is_told_as_refused_credentials() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("requirepass"))
        .build()
        .await
        .unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    server.cli(&["config", "set", "requirepass", "rotated"]);
    server.cli_with_password("rotated", &["client", "kill", "type", "normal"]);
    let mut told = None;
    for _ in 0..20 {
        if let Err(e) = store.check(b"k", &limit(), 1).await
            && e.is_refused_credentials()
        {
            told = Some(e);
            break;
        }
    }
    let err = told.expect("a check's error tells the credentials were refused");
    println!("{err}");
    assert!(
        err.to_string().contains("Redis refused the credentials: "),
        "{err}"
    );
}

/// A server that starts asking a password the URL does not give (rotated server first) answers
/// a new connection's first check with a refusal (`NOAUTH`, or "unauthenticated multibulk length"
/// and a closed connection): that connection is given up at once and the next opening waits the
/// reconnect gap, as after a refused opening. Not a connection opened for every second check,
/// each check after the refusal failing on the closed one as unavailable (about 400 openings a
/// second were seen before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_set_while_running_waits_the_reconnect_gap_between_openings() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("requirepass-gap"))
        .build()
        .await
        .unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    server.cli(&["config", "set", "requirepass", "rotated"]);
    let authed = |args: &[&str]| server.cli_with_password("rotated", args);
    let connections = || connections_received(&authed(&["info", "stats"]));
    authed(&["client", "kill", "type", "normal"]);
    let before = connections();
    let started = std::time::Instant::now();
    // The killed connection's check fails as a broken one (unavailable); the next opens anew.
    let mut first = 0;
    while !store
        .check(b"k", &limit(), 1)
        .await
        .unwrap_err()
        .is_refused_credentials()
    {
        first += 1;
        assert!(first < 3, "no refusal in {first} checks");
    }
    for i in 0..300 {
        let err = store.check(b"k", &limit(), 1).await.unwrap_err();
        assert!(
            err.is_refused_credentials() && !err.is_unavailable(),
            "check {i}: {err}"
        );
    }
    let elapsed = started.elapsed();
    // Less the `redis-cli` connection that counts them.
    let opened = connections() - before - 1;
    // One at once, then at most one a gap (100 ms), and one more for the edge.
    let most = 2 + elapsed.as_millis() / 100;
    println!("{opened} connections opened in {elapsed:?}");
    assert!(
        u128::from(opened) <= most,
        "{opened} connections opened in {elapsed:?} (at most {most})"
    );
}

/// Another client's script running past `busy-reply-threshold` has Redis answer `BUSY` to every
/// command until it ends or is killed: the check's script did not run, and waiting mends it, so
/// the error is `is_unavailable`, as `LOADING` is. The store checks again once it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_with_another_script_is_unavailable() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("busy"))
        .build()
        .await
        .unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    server.cli(&["config", "set", "busy-reply-threshold", "100"]);
    let port = server.port().to_string();
    let mut busy = std::process::Command::new("redis-cli")
        .args(["-p", &port, "eval", "while true do end", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Checks answered before the script starts; those sent before the threshold wait for it
    // (and may time out); then `BUSY`.
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "no BUSY answer within 10 s");
        match store.check(b"k", &limit(), 1).await {
            Err(e) if e.to_string().contains("BUSY") => break e,
            Ok(_) | Err(RedisStoreError::Timeout { .. }) => {}
            Err(other) => panic!("a check while a script runs: {other:?}"),
        }
    };
    assert!(err.is_unavailable(), "{err}");
    assert!(
        !err.is_refused_credentials() && !err.is_wrong_server(),
        "{err}"
    );
    assert_eq!(server.cli(&["script", "kill"]), "OK");
    busy.wait().unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
}

/// The least a Redis user needs (docs/redis.md, "Access control"): the store's own commands, the
/// commands its scripts call (ACLs apply to those too), and its prefix's keys. Every algorithm,
/// admitted and denied, single and several quotas, works under that user; a key outside the
/// prefix is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_is_enough() {
    let server = RedisServer::builder()
        .config(format!(
            "user limiter on >l1miter resetkeys ~acl-rl:* -@all {LEAST_PRIVILEGE}"
        ))
        .start();
    let store = common::acl_store(server.port(), "limiter", "l1miter")
        .build()
        .await
        .unwrap();
    for alg in Algorithm::ALL {
        for limit in [
            Limit::single(alg, Quota::per_minute(2).unwrap()).unwrap(),
            Limit::new(
                alg,
                [Quota::per_minute(2).unwrap(), Quota::per_hour(5).unwrap()],
            )
            .unwrap(),
        ] {
            for expected in [true, true, false] {
                let d = store.check(b"user-1", &limit, 1).await.unwrap();
                assert_eq!(d.is_allowed(), expected, "{alg} {limit:?}");
            }
            // A peek, and a cost that never fits.
            assert!(
                store
                    .check(b"user-1", &limit, 0)
                    .await
                    .unwrap()
                    .is_allowed()
            );
            assert!(store.check(b"user-1", &limit, 9).await.unwrap().is_denied());
        }
    }
    // The same user with another prefix: its keys are outside the pattern.
    let other = common::acl_store(server.port(), "limiter", "l1miter")
        .prefix("elsewhere")
        .build()
        .await
        .unwrap();
    let err = other.check(b"user-1", &limit(), 1).await.unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::Redis(e) if e.code() == Some("NOPERM")),
        "{err:?}"
    );
}

/// A reset deletes keys: the least-privilege user is refused it (`NOPERM`, a typed error, the
/// state kept), and the same user with `+del` may (docs/redis.md, "Access control").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_needs_del_on_top_of_the_least_privilege() {
    let server = RedisServer::builder()
        .config(format!(
            "user limiter on >l1miter resetkeys ~acl-rl:* -@all {LEAST_PRIVILEGE}"
        ))
        .config(format!(
            "user resetter on >r3setter resetkeys ~acl-rl:* -@all {LEAST_PRIVILEGE} +del"
        ))
        .start();
    let store =
        |user: &str, password: &str| common::acl_store(server.port(), user, password).build();
    let limiter = store("limiter", "l1miter").await.unwrap();
    let resetter = store("resetter", "r3setter").await.unwrap();
    let limit = Limit::single(Algorithm::SlidingLog, Quota::per_minute(1).unwrap()).unwrap();
    assert!(limiter.check(b"u", &limit, 1).await.unwrap().is_allowed());
    // Refused inside the script (the `DEL` it calls), which Redis tells without `NOPERM`'s code.
    let err = limiter.reset(b"u", &limit).await.unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::Redis(_)) && err.is_refused_credentials(),
        "{err:?}"
    );
    assert!(limiter.check(b"u", &limit, 1).await.unwrap().is_denied());
    resetter.reset(b"u", &limit).await.unwrap();
    assert!(limiter.check(b"u", &limit, 1).await.unwrap().is_allowed());
}

/// A user missing one of the sliding log's write commands (`+hset`, `+pexpire`, `+rpush`) is
/// refused its admitting checks with nothing written: the script asks for every write before the
/// first, since Redis does not roll back a script cut short (before, the log's entries were
/// appended, the failed checks counted, and the keys left without expiry). A denial that
/// repairs a total is refused the same way; a user that may publish but not delete is refused an
/// announced reset before anything is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_user_may_not_make_leaves_nothing_written() {
    let without = |command: &str| LEAST_PRIVILEGE.replace(&format!(" +{command}"), "");
    let server = RedisServer::builder()
        .config(format!(
            "user nohset on >p4ss resetkeys ~acl-rl:* -@all {}",
            without("hset")
        ))
        .config(format!(
            "user nopexpire on >p4ss resetkeys ~acl-rl:* -@all {}",
            without("pexpire")
        ))
        .config(format!(
            "user norpush on >p4ss resetkeys ~acl-rl:* -@all {}",
            without("rpush")
        ))
        .config(format!(
            "user nolset on >p4ss resetkeys ~acl-rl:* -@all {}",
            without("lset")
        ))
        .config(format!(
            "user nodel on >p4ss resetkeys ~acl-rl:* resetchannels &acl-rl:resets -@all \
             {LEAST_PRIVILEGE} +publish"
        ))
        .start();
    let keys = || server.cli(&["--scan", "--pattern", "acl-rl:*"]);
    for user in ["nohset", "nopexpire", "norpush"] {
        // (The right is among the least privilege's, so the user lacks only it.)
        assert_ne!(without(user.trim_start_matches("no")), LEAST_PRIVILEGE);
        let store = common::acl_store(server.port(), user, "p4ss")
            .build()
            .await
            .unwrap();
        for limit in [
            Limit::single(Algorithm::SlidingLog, Quota::per_minute(3).unwrap()).unwrap(),
            Limit::new(
                Algorithm::SlidingLog,
                [Quota::per_minute(3).unwrap(), Quota::per_hour(5).unwrap()],
            )
            .unwrap(),
        ] {
            for _ in 0..3 {
                let err = store.check(b"u", &limit, 1).await.unwrap_err();
                assert!(err.is_refused_credentials(), "{user}: {err:?}");
                assert!(
                    matches!(&err, RedisStoreError::Redis(e) if e.code() == Some("NOPERM")),
                    "{user}: {err:?}"
                );
            }
            // A peek writes nothing, and finds nothing spent.
            let peek = store.check(b"u", &limit, 0).await.unwrap();
            assert_eq!(peek.remaining(), 3, "{user}");
            assert_eq!(keys(), "", "{user}");
        }
    }

    // The batch form (what `Coalescing` sends for concurrent checks of one key) is refused the
    // same way, with nothing written, even where only a later cost of the batch would make the
    // write refused: at one instant the first cost pushes an entry and the next ones merge into
    // it (`LSET`). Before, the refusal of one cost was dropped from the batch's reply, so the
    // whole batch failed as an unexpected reply, the first cost counted.
    for user in ["nohset", "nopexpire", "norpush", "nolset"] {
        let store = common::acl_store(server.port(), user, "p4ss")
            .build()
            .await
            .unwrap();
        let limit = Limit::single(Algorithm::SlidingLog, Quota::per_minute(3).unwrap()).unwrap();
        for costs in [&[1, 1][..], &[1, 1, 1], &[5, 1]] {
            let err = store.check_many(b"u", &limit, costs).await.unwrap_err();
            assert!(err.is_refused_credentials(), "{user} {costs:?}: {err:?}");
            assert!(
                matches!(&err, RedisStoreError::Redis(e) if e.code() == Some("NOPERM")),
                "{user} {costs:?}: {err:?}"
            );
            assert_eq!(keys(), "", "{user} {costs:?}");
        }
        // A batch of peeks writes nothing, and is answered.
        let peeks = store.check_many(b"u", &limit, &[0, 0]).await.unwrap();
        assert!(
            peeks.iter().all(|d| d.remaining() == 3),
            "{user}: {peeks:?}"
        );
    }

    // An announced reset by a user that may publish but not delete: refused before publishing.
    let store = common::acl_store(server.port(), "nodel", "p4ss")
        .announce_resets(true)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
    let err = store.reset(b"u", &limit).await.unwrap_err();
    assert!(err.is_refused_credentials(), "{err:?}");
    assert!(store.check(b"u", &limit, 1).await.unwrap().is_denied());
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(!stats.contains("cmdstat_publish:"), "{stats}");
}

/// The longest timeouts accepted (an hour) work: a check's deadline is counted without
/// overflow. Longer ones are refused (`bad_settings_are_typed_errors`); before, a
/// `response_timeout` of `Duration::MAX` built a store whose every check panicked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_timeouts_accepted_work() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3_600);
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("long-timeouts"))
        .response_timeout(hour)
        .connect_timeout(hour)
        .wait_timeout(hour)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn bad_settings_are_typed_errors() {
    let cases: Vec<(&str, RedisStoreError)> = vec![
        (
            "prefix",
            RedisStore::builder("redis://127.0.0.1:1")
                .prefix("a{b}")
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "pool_size",
            RedisStore::builder("redis://127.0.0.1:1")
                .pool_size(0)
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "response_timeout",
            RedisStore::builder("redis://127.0.0.1:1")
                .response_timeout(Duration::ZERO)
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "response_timeout",
            RedisStore::builder("redis://127.0.0.1:1")
                .response_timeout(Duration::MAX)
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "connect_timeout",
            RedisStore::builder("redis://127.0.0.1:1")
                .connect_timeout(Duration::from_secs(u64::MAX))
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "url",
            RedisStore::builder("http://nope")
                .build()
                .await
                .unwrap_err(),
        ),
        (
            "url",
            RedisStore::cluster(Vec::<String>::new())
                .build()
                .await
                .unwrap_err(),
        ),
    ];
    for (name, err) in cases {
        match err {
            RedisStoreError::Config { name: n, .. } => assert_eq!(n, name),
            other => panic!("{name}: expected a Config error, got {other:?}"),
        }
    }
    // A URL the client refuses is named in the error without its password, with or without
    // its scheme, or in a query whose values hold an `@`.
    for url in [
        "redis://default:s3cret@",
        "default:s3cret@127.0.0.1:1",
        "redis+unix:///tmp/x.sock?user=a@b&pass=s3cret&db=x",
    ] {
        let err = RedisStore::builder(url).build().await.unwrap_err();
        assert!(
            matches!(err, RedisStoreError::Config { name: "url", .. }),
            "{err:?}"
        );
        assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    }
    // Nothing listens on port 1: a connection error, within the connect timeout.
    let err = RedisStore::builder("redis://127.0.0.1:1")
        .connect_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, RedisStoreError::Connection { .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some() || err.to_string().contains("connect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_stay_in_their_slot_and_prefix() {
    // A unit takes 36 s to come back, and a key expires once its state is full again: the keys
    // are all still there when they are listed, however slow the machine (at 100 a second, one
    // check's key lived 10 ms, and a loaded machine's listing missed some).
    let limit = Limit::single(Algorithm::Gcra, Quota::per_hour(100).unwrap()).unwrap();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("app")
        .build()
        .await
        .unwrap();
    let long = vec![b'a'; 10_000];
    let keys: Vec<&[u8]> = vec![
        b"}{other}",
        b"{victim}",
        b"victim}",
        b"\n\r\x00",
        b"",
        &long,
    ];
    for k in &keys {
        assert!(store.check(k, &limit, 1).await.unwrap().is_allowed());
    }
    // A key that spells another's hashed form does not share its state.
    let hashed = store.state_keys(b"{victim}", &limit)[0].clone();
    let tag = &hashed[hashed.find('{').unwrap() + 1..hashed.find('}').unwrap()];
    let d = store.check(tag.as_bytes(), &limit, 1).await.unwrap();
    assert_eq!(d.remaining(), 99, "'{tag}' is its own key");
    let stored = server.cli(&["--scan", "--pattern", "*"]);
    let mut stored: Vec<&str> = stored.lines().collect();
    stored.sort_unstable();
    // Each key's state is the one key the store names for it, and nothing else was written.
    let mut expected: Vec<String> = keys
        .iter()
        .chain([&tag.as_bytes()])
        .map(|k| store.state_keys(k, &limit).remove(0))
        .collect();
    expected.sort_unstable();
    assert_eq!(stored, expected);
    for key in stored {
        assert!(key.starts_with("app:{"), "{key}");
        assert!(key.len() < 120, "bounded: {key}");
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        // The slot is the store's hash tag's: it holds only the bytes a verbatim key may have
        // (`[A-Za-z0-9._:@/-]`), never a brace or a byte of a hostile key.
        let inner = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
        assert!(
            !inner.is_empty()
                && inner
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b)),
            "{key}"
        );
    }
}

/// A connection whose peer goes silent without closing it (power loss, a partition: no reset
/// ever arrives) is replaced once a check on it has timed out, instead of failing every check
/// until the kernel gives up on the socket. The proxy holds every chunk for an hour, then
/// forwards new connections at once again; only a new connection gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_after_checks_time_out() {
    silent_then_back("silent", async |store| {
        for _ in 0..3 {
            let err = store.check(b"k", &limit(), 1).await.unwrap_err();
            assert!(matches!(err, RedisStoreError::Timeout { .. }), "{err:?}");
        }
    })
    .await;
}

/// The same when every check is cut short by its caller before the store's own timeout fires
/// (the tower layer's 50 ms against the store's 500 ms by default): no check ever times out in
/// the store, but the connection, which has left a command unanswered for the response timeout,
/// is still replaced, and checks get through again once the network does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_when_callers_give_up_first() {
    silent_then_back("silent-short", async |store| {
        // Half a second of checks, each given up after 50 ms.
        for _ in 0..10 {
            assert!(caller(store).await.is_err(), "nothing answers");
        }
    })
    .await;
}

/// A connection whose answer came after its caller gave up is alive, and is kept: the next check,
/// on a quiet connection, finds its command unanswered for longer than the response timeout, and
/// a probe (not the check itself) finds the connection answering. Redis behind a proxy that
/// delays every chunk by 100 ms each way; the caller gives up after 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answering_after_its_caller_gave_up_is_kept() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = one_connection_through(&proxy, "late", Duration::from_millis(2_000)).await;
    let accepted = proxy.accepted();
    proxy.set_latency(Duration::from_millis(100));
    assert!(caller(&store).await.is_err(), "given up before the answer");
    // Quiet for longer than the response timeout: the answer came meanwhile, and nobody saw it.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for _ in 0..3 {
        assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    }
    // The probe's PING had its answer long before the checks were done.
    assert_eq!(proxy.accepted(), accepted, "the connection was kept");
}

/// A check given up after its command was sent leaves its reply on the connection: the checks
/// sent after it, on the same connection, each get their own key's answer, never that reply.
/// (redis-rs reads a dropped request's reply and throws it away; this pins it.) The replies are
/// held in a proxy while the first check is given up and the next one is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_up_checks_reply_never_answers_another_check() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = one_connection_through(&proxy, "stray", Duration::from_millis(5_000)).await;
    let day = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    for left in (90..100).rev() {
        assert_eq!(store.check(b"x", &day, 1).await.unwrap().remaining(), left);
    }
    let accepted = proxy.accepted();
    let calls = server.script_calls();

    proxy.set_hold_replies(true);
    // A check of `key` on a task of its own, and a wait until the server has run `n` checks
    // since (their replies held in the proxy).
    let spawn_check = |key: &'static [u8]| {
        let (store, day) = (store.clone(), day.clone());
        tokio::spawn(async move { store.check(key, &day, 1).await })
    };
    let ran = async |n: u64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.script_calls() < calls + n {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    // Given up once the server has run it: a check given up before its connection's task wrote
    // it would never be sent at all.
    let given_up = spawn_check(b"x");
    ran(1, "the first check reaches the server").await;
    given_up.abort();
    assert!(
        given_up.await.is_err_and(|e| e.is_cancelled()),
        "no reply while they are held"
    );
    // The next check is sent while the first one's reply is still held.
    let next = spawn_check(b"y");
    ran(2, "both checks reach the server").await;
    proxy.set_hold_replies(false);
    let next = next.await.unwrap().unwrap();
    assert_eq!(
        next.remaining(),
        99,
        "y's own answer, not x's (89): {next:?}"
    );
    // The given-up check ran on the server: x counted it.
    assert_eq!(store.check(b"x", &day, 0).await.unwrap().remaining(), 89);
    assert_eq!(store.check(b"y", &day, 1).await.unwrap().remaining(), 98);
    assert_eq!(proxy.accepted(), accepted, "all on the one connection");
}

/// A store of one connection through `proxy` (keys under a prefix made from `name`), checked
/// once.
async fn one_connection_through(
    proxy: &Proxy,
    name: &str,
    response_timeout: Duration,
) -> RedisStore {
    checked(
        RedisStore::builder(proxy.url())
            .prefix(unique_prefix(name))
            .pool_size(1)
            .response_timeout(response_timeout),
    )
    .await
}

/// `builder`'s store, once a first check of `k` is allowed.
async fn checked(builder: RedisStoreBuilder) -> RedisStore {
    let store = builder.build().await.unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    store
}

/// A check of `k` that its caller gives up after 50 ms, as the tower layer does by default.
fn caller(store: &RedisStore) -> tokio::time::Timeout<ratelimit_redis::CheckFuture> {
    tokio::time::timeout(Duration::from_millis(50), store.check(b"k", &limit(), 1))
}

/// A store (response timeout 200 ms) behind a proxy that goes silent while `silent` runs checks,
/// then forwards again: checks, each given up after 50 ms, get an answer within 10 s, on a new
/// connection (the old one still holds its chunks for an hour; a first re-opening, made while
/// the proxy still held everything, may be stuck until its connect timeout, 1 s).
async fn silent_then_back(name: &str, silent: impl AsyncFnOnce(&RedisStore)) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = checked(
        RedisStore::builder(proxy.url())
            .prefix(unique_prefix(name))
            .response_timeout(Duration::from_millis(200)),
    )
    .await;
    let accepted = proxy.accepted();
    proxy.set_latency(Duration::from_secs(3_600));
    silent(&store).await;
    proxy.set_latency(Duration::ZERO);
    let started = Instant::now();
    let mut answered = None;
    while answered.is_none() && started.elapsed() < Duration::from_secs(10) {
        if let Ok(Ok(d)) = caller(&store).await {
            answered = Some(d);
        }
    }
    assert!(answered.expect("answered on a new connection").is_allowed());
    assert!(proxy.accepted() > accepted, "a new connection");
}

/// A store of one connection through `proxy`, checked once; then every chunk takes 500 ms each
/// way (a round trip is 1 s, within a check's 3 s, a margin for a loaded machine; opening a
/// connection and then checking on it takes two), and the connection is cut: a check fails, and
/// the next one has to open a connection again.
async fn broken_behind_a_slow_proxy(proxy: &Proxy, name: &str) -> RedisStore {
    let store = checked(
        RedisStore::builder(proxy.url())
            .prefix(unique_prefix(name))
            .pool_size(1)
            .response_timeout(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(5)),
    )
    .await;
    proxy.set_latency(Duration::from_millis(500));
    proxy.drop_connections();
    let broken = store.check(b"k", &limit(), 1).await.unwrap_err();
    assert!(broken.is_unavailable(), "{broken:?}");
    store
}

/// Opening a connection is the slot's own task, not the check's: a check that gives up on it (a
/// caller's timeout shorter than opening takes, a dropped request) does not cancel it, and the
/// checks after it find the connection open instead of starting over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_is_not_cancelled_by_a_check_that_gives_up() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = broken_behind_a_slow_proxy(&proxy, "reopen").await;
    // A caller gives up 100 ms into the check, while the connection is being opened.
    let accepted = proxy.accepted();
    let gave_up = tokio::time::timeout(Duration::from_millis(100), store.check(b"k", &limit(), 1));
    assert!(gave_up.await.is_err());
    // The opening (one round trip) went on without it: the next check needs one round trip only,
    // on the connection that opening made (no other is opened).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let started = Instant::now();
    let d = store.check(b"k", &limit(), 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(
        proxy.accepted(),
        accepted + 1,
        "one connection opened, and kept"
    );
    println!(
        "one check on the re-opened connection: {:?}",
        started.elapsed()
    );
}

/// An opening whose task ends with its runtime (a store shared by several runtimes: one shuts
/// down while it re-opens a connection) does not leave the slot "opening" for good: the checks
/// after it, on another runtime, open the connection again and are answered.
#[test]
fn a_reconnect_ended_with_its_runtime_does_not_leave_the_slot_stuck() {
    let main = common::runtime();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = main.block_on(broken_behind_a_slow_proxy(&proxy, "reopen-shutdown"));
    // On a runtime of its own, a check starts the opening (spawned there) and gives up; the
    // runtime shuts down with the opening half done.
    let gave_up = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_millis(100), store.check(b"k", &limit(), 1)).await
        });
    assert!(gave_up.is_err(), "still opening");
    proxy.set_latency(Duration::ZERO);
    main.block_on(async {
        let d = store.check(b"k", &limit(), 1).await.unwrap();
        assert!(d.is_allowed());
    });
}

/// A standalone primary demoted to a replica behind the address the store uses (a failover
/// behind a DNS name or a virtual IP): its connections answer `READONLY` to every write from then
/// on. The check that gets `READONLY` fails, its connection is replaced, and the next check
/// reaches the new primary, which goes on from the replicated count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_to_a_demoted_primary_is_replaced() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let old_port = old.port().to_string();
    let new_port = new.port().to_string();
    new.cli(&["REPLICAOF", "127.0.0.1", &old_port]);
    let proxy = Proxy::start(old.port());
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("demoted"))
        .pool_size(1)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(100).unwrap()).unwrap();
    for left in [99, 98, 97] {
        assert_eq!(
            store.check(b"k", &limit, 1).await.unwrap().remaining(),
            left
        );
    }
    old.wait_replicated();

    // Failover: the replica is promoted, the old primary follows it, the address moves.
    new.cli(&["REPLICAOF", "NO", "ONE"]);
    old.cli(&["REPLICAOF", "127.0.0.1", &new_port]);
    proxy.set_upstream(new.port());
    let accepted = proxy.accepted();

    let err = store.check(b"k", &limit, 1).await.unwrap_err();
    assert!(err.to_string().contains("ReadOnly"), "{err}");
    let d = store.check(b"k", &limit, 1).await.unwrap();
    assert_eq!(
        d.remaining(),
        96,
        "the new primary counts on from the replicated state"
    );
    assert_eq!(proxy.accepted(), accepted + 1, "one new connection");
    for left in [95, 94] {
        assert_eq!(
            store.check(b"k", &limit, 1).await.unwrap().remaining(),
            left
        );
    }
}

/// A server that refuses writes (too few replicas for `min-replicas-to-write`; `maxmemory` reached
/// with `noeviction`; a failed RDB save refuses them the same way) still answers a denial and a
/// peek, which write nothing, and an admission fails with its error. The scripts have no shebang
/// for this: Redis 7 refuses a script declared with one (without the `no-writes` flag) before
/// it runs in each of these states, a denial included, and a fail-open layer would then let the
/// denied clients through for as long as it lasted (see prelude.lua).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_writes_still_answers_denials_and_peeks() {
    for (setting, value, refusal) in [
        ("min-replicas-to-write", "1", "NOREPLICAS"),
        ("maxmemory", "1", "OOM"),
    ] {
        let server = RedisServer::start();
        let store =
            checked(RedisStore::builder(server.url()).prefix(unique_prefix("no-writes"))).await;
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(2).unwrap()).unwrap();
        for _ in 0..2 {
            assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
        }
        server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        server.cli(&["CONFIG", "SET", setting, value]);
        let denial = store.check(b"k", &limit, 1).await.unwrap();
        assert!(!denial.is_allowed(), "{setting}: {denial:?}");
        let peek = store.check(b"k", &limit, 0).await.unwrap();
        assert_eq!(peek.remaining(), 0, "{setting}: {peek:?}");
        let admission = store.check(b"other", &limit, 1).await;
        assert!(
            matches!(&admission, Err(e) if e.to_string().contains(refusal)),
            "{setting}: {admission:?}"
        );
    }
}

/// A server that refuses connections (restarting, its port closed) refuses them in microseconds:
/// the store waits a moment between failed openings, and the checks meanwhile fail at once with
/// the last opening's error, instead of every check opening a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_with_a_gap() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = checked(RedisStore::builder(proxy.url()).prefix(unique_prefix("gap"))).await;
    proxy.set_refuse(true);
    proxy.drop_connections();
    let opened =
        failing_for_a_second(&store, &limit(), &proxy, RedisStoreError::is_unavailable).await;
    // One attempt per 100 ms gap at most (the first at once), and some slack for the timer.
    assert!(opened <= 15, "{opened} connections tried in 1 s");
    proxy.set_refuse(false);
    let back = recovers(&store, &limit()).await;
    println!("recovered {back:?} after connections were accepted again");
}

/// Checks `k` for one second, each of which must fail with an error `expected` accepts, and at
/// its first poll unless it tried to open a connection (or was the first, sent on the connection
/// in place); returns how many connections the proxy accepted meanwhile.
async fn failing_for_a_second(
    store: &RedisStore,
    limit: &Limit,
    proxy: &Proxy,
    expected: impl Fn(&RedisStoreError) -> bool,
) -> u64 {
    let before = proxy.accepted();
    let start = Instant::now();
    let (mut checks, mut at_once) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(1) {
        checks += 1;
        let mut check = std::pin::pin!(store.check(b"k", limit, 1));
        let answer = match futures::poll!(check.as_mut()) {
            std::task::Poll::Ready(answer) => {
                at_once += 1;
                answer
            }
            std::task::Poll::Pending => check.await,
        };
        match answer {
            Err(e) => assert!(expected(&e), "{e:?}"),
            Ok(d) => panic!("nothing should answer: {d:?}"),
        }
    }
    let opened = proxy.accepted() - before;
    println!(
        "{checks} checks in 1 s, all failed, {at_once} at their first poll, {opened} connections made"
    );
    // Only a check that tried to open a connection waited for anything, besides the first,
    // which found the connection in place broken or demoted: the others failed at once, with
    // the last attempt's error.
    assert!(
        checks - at_once <= opened + 1 && at_once > 0,
        "{} of {checks} checks waited, for {opened} connections made",
        checks - at_once
    );
    opened
}

/// How long until a check of `k` is answered again (at most 5 s).
async fn recovers(store: &RedisStore, limit: &Limit) -> Duration {
    let start = Instant::now();
    while store.check(b"k", limit, 1).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "no recovery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

/// One connection of two breaks while new connections are refused: the checks its slot would
/// have carried go over the other connection, instead of failing at once for as long as its
/// openings are refused. Only the check that found it broken fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_without_a_connection_lends_its_checks_to_another() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("lend"))
        .pool_size(2)
        .build()
        .await
        .unwrap();
    for _ in 0..4 {
        assert!(store.check(b"k", &limit(), 1).await.is_ok());
    }
    proxy.set_refuse(true);
    // Cut one of the store's two connections, server side (the proxy's upstream of it).
    let clients = server.cli(&["client", "list"]);
    let victim = clients
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .find_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .expect("the store's connections are listed")
        .to_owned();
    let attempts_before = proxy.accepted();
    assert_eq!(server.cli(&["client", "kill", "id", &victim]), "1");
    let mut failed = 0;
    for _ in 0..200 {
        if let Err(e) = store.check(b"k", &limit(), 1).await {
            assert!(e.is_unavailable(), "{e:?}");
            failed += 1;
        }
    }
    assert!(
        failed <= 1,
        "{failed} of 200 checks failed with one connection left"
    );
    // The cut slot really was without a connection meanwhile: it tried to open one, refused.
    // (The proxy counts a connection when its accepting thread takes it, which may come a
    // little after the store's connect returned.)
    let counted = Instant::now();
    while proxy.accepted() == attempts_before {
        assert!(
            counted.elapsed() < Duration::from_secs(2),
            "the cut slot tried to reopen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.set_refuse(false);
}

/// An address that still leads to the demoted primary after a failover (a DNS name not yet
/// moved): every new connection answers `READONLY` too. The store does not make one per check:
/// a connection that answers `READONLY` as soon as it is made holds the next opening for the
/// reconnect gap. Once the address moves, checks reach the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_left_at_a_demoted_primary_is_not_reconnected_at_every_check() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let proxy = Proxy::start(old.port());
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix("demoted-stays"))
        .pool_size(1)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(100).unwrap()).unwrap();
    assert!(store.check(b"k", &limit, 1).await.is_ok());
    // The old primary becomes a replica of the new; the address stays on it.
    old.cli(&["REPLICAOF", "127.0.0.1", &new.port().to_string()]);
    let opened = failing_for_a_second(&store, &limit, &proxy, |e| {
        e.to_string().contains("ReadOnly")
    })
    .await;
    assert!(opened <= 15, "{opened} connections made in 1 s");
    proxy.set_upstream(new.port());
    recovers(&store, &limit).await;
}

/// A connection goes silent and its callers stop asking: behind the tower layer, a few checks
/// given up after 50 ms open the circuit breaker, and no check reaches the store until its
/// cool-down ends. The connection must be probed and replaced meanwhile, not when that first
/// check after the cool-down finds it silent and is sent on it all the same (it would fail, and
/// the circuit would open for another cool-down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_without_further_checks() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = one_connection_through(&proxy, "silent-idle", Duration::from_millis(200)).await;
    let accepted = proxy.accepted();
    proxy.set_latency(Duration::from_secs(3_600));
    for _ in 0..3 {
        assert!(
            caller(&store).await.is_err(),
            "a silent connection answered"
        );
    }
    // New connections are served at once; the old one holds its chunks for an hour.
    proxy.set_latency(Duration::ZERO);
    // Nothing asks meanwhile: a probe (200 ms of silence, then 200 ms for its PING) makes a new
    // connection (about 0.4 s on this machine; up to 10 s allowed for a loaded one), and once
    // the proxy has accepted it, half a second more lets the store finish opening it.
    let made = std::time::Instant::now();
    while proxy.accepted() == accepted && made.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        proxy.accepted() > accepted,
        "a new connection was made without a check"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Waited for up to 5 s, not the 50 ms of a caller, so that a loaded machine's pause does
    // not fail it: one sent on the silent connection would still fail, at the store's 200 ms.
    let first = tokio::time::timeout(Duration::from_secs(5), store.check(b"k", &limit(), 1)).await;
    assert!(
        matches!(first, Ok(Ok(ref d)) if d.is_allowed()),
        "the first check after the quiet spell: {first:?}"
    );
}

/// A probe whose `PING` finds the connection broken (cut, not silent) empties the slot at once:
/// a check made while a new connection is being opened waits for one instead of being sent on
/// the dead connection and failing. (The probe had left the dead connection in its slot until
/// its replacement opened: a check in between failed on it, emptied the slot, and the probe's
/// new connection was then dropped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_finds_its_connection_broken_empties_the_slot() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // 3 s: the probe's PING waits that long, while the test cuts the connection under it.
    let store = one_connection_through(&proxy, "probe-broken", Duration::from_secs(3)).await;
    let pings = || {
        server
            .cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
            .and_then(|l| l.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let before = pings();
    // Requests still reach the server; its replies stay in the proxy.
    proxy.set_hold_replies(true);
    assert!(
        caller(&store).await.is_err(),
        "a silent connection answered"
    );
    // After 3 s of silence the store probes the connection: its PING reaches the server.
    let started = Instant::now();
    while pings() == before {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no probe in 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Cut under the probe: its PING fails as broken. New connections take 100 ms a chunk each
    // way, so a replacement opened now takes at least 200 ms.
    proxy.set_latency(Duration::from_millis(100));
    proxy.drop_connections();
    proxy.set_hold_replies(false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let checked = tokio::time::timeout(Duration::from_secs(10), store.check(b"k", &limit(), 1))
        .await
        .expect("the store answers within its timeouts");
    assert!(
        matches!(checked, Ok(ref d) if d.is_allowed()),
        "a check made while the connection is replaced: {checked:?}"
    );
}

/// A check waiting for its slot's connection, whose opening is slow (its first chunk takes 3 s
/// through the proxy), takes another slot's connection as soon as that one opens: it does not
/// wait for its own slot's opening until its response timeout (1.5 s), and fail, while a
/// connection is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_waiting_for_a_slow_opening_takes_a_connection_opened_meanwhile() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store = checked(
        RedisStore::builder(proxy.url())
            .prefix(unique_prefix("lend-late"))
            .pool_size(2)
            .response_timeout(Duration::from_millis(1_500))
            .connect_timeout(Duration::from_secs(10)),
    )
    .await;
    // Both connections cut: each of the next two checks (round robin) finds its slot's broken,
    // fails, and leaves the slot empty.
    proxy.drop_connections();
    // What the two checks got, for the failure messages below: a timeout (a check sent just as
    // its connection's task ended) rather than a broken pipe changes what the slots hold.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let t = Instant::now();
        let broken = store.check(b"k", &limit(), 1).await.unwrap_err();
        assert!(broken.is_unavailable(), "{broken:?}");
        seen.push(format!("{broken:?} after {:?}", t.elapsed()));
    }
    // The next check opens its slot's connection, slowly, and waits for it.
    proxy.set_latency(Duration::from_secs(3));
    let accepted = proxy.accepted();
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.check(b"k", &limit(), 1).await }
    });
    let started = Instant::now();
    while proxy.accepted() == accepted {
        if started.elapsed() >= Duration::from_secs(5) {
            let third = if waiting.is_finished() {
                format!("ended: {:?}", waiting.await)
            } else {
                "still waiting".to_owned()
            };
            panic!(
                "no opening in 5 s: the two checks got {seen:?}; the third check {third}; the \
                 proxy accepted {accepted} connections before it, {} now",
                proxy.accepted()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its first chunk is read by the proxy, and held for 3 s.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The other slot opens at once, for the next check.
    proxy.set_latency(Duration::ZERO);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
    let waited = waiting.await.unwrap();
    assert!(
        waited.is_ok(),
        "the waiting check failed with a connection open: {waited:?}"
    );
}

/// The reconnect gap holds under concurrent checks too: a check that read the slot's failures
/// just before an opening failed, and took the opening flag just after, waits out the gap
/// instead of opening again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_with_a_gap_under_concurrent_checks() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let store =
        checked(RedisStore::builder(proxy.url()).prefix(unique_prefix("gap-concurrent"))).await;
    proxy.set_refuse(true);
    proxy.drop_connections();
    let before = proxy.accepted();
    let start = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut checks = 0u64;
                while start.elapsed() < Duration::from_secs(1) {
                    checks += 1;
                    let e = store.check(b"k", &limit(), 1).await.unwrap_err();
                    assert!(e.is_unavailable(), "{e:?}");
                    tokio::task::yield_now().await;
                }
                checks
            })
        })
        .collect();
    let mut checks = 0;
    for t in tasks {
        checks += t.await.unwrap();
    }
    let opened = proxy.accepted() - before;
    println!("{checks} checks in 1 s from 32 tasks, {opened} connections tried");
    assert!(opened <= 15, "{opened} connections tried in 1 s");
    proxy.set_refuse(false);
}

/// Connections the server closed while they were idle (its `timeout` setting, `CLIENT KILL`, a
/// proxy's idle limit) are found closed by a `PING` before the next check is written on them, and
/// the check goes on a new connection: answered, and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_while_idle_fail_no_check() {
    let server = RedisServer::start();
    // A day's quota: nothing refills while the test runs (a minute's would give a unit back
    // every 600 ms, which a loaded machine's pauses can reach).
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("idle-closed"))
        .pool_size(3)
        .ping_after_idle(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    for _ in 0..3 {
        store.check(b"k", &limit, 1).await.unwrap();
    }
    // Every connection the store has, closed by the server (redis-cli's own is skipped).
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert_eq!(killed.trim(), "3", "the store's three connections closed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 4..=9u64 {
        let d = store
            .check(b"k", &limit, 1)
            .await
            .unwrap_or_else(|e| panic!("check {n} after the connections were closed: {e}"));
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 100 - n, "check {n} counted once");
    }
}

/// The store's connections carry TCP keepalive probes (so that a NAT or load balancer on the way
/// does not forget an idle one): Linux shows their keepalive timer in `/proc/net/tcp`.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_carry_tcp_keepalive() {
    let server = RedisServer::start();
    let store = checked(
        RedisStore::builder(server.url())
            .prefix(unique_prefix("keepalive"))
            .pool_size(2),
    )
    .await;
    // The client ends of established connections to the server: `rem_address` is the server's
    // port, `st` 01; `tr` is the pending timer, 2 for keepalive (0 for none), and `tm->when`
    // when it fires, in hundredths of a second: within the store's 60 s, not Linux's default
    // two hours.
    let port = format!(":{:04X}", server.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let timers: Vec<(&str, u64)> = table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f[2].ends_with(&port) && f[3] == "01")
        .map(|f| {
            let (timer, when) = f[5].split_once(':').unwrap();
            (timer, u64::from_str_radix(when, 16).unwrap())
        })
        .collect();
    assert_eq!(timers.len(), 2, "the store's two connections: {timers:?}");
    assert!(
        timers
            .iter()
            .all(|&(timer, when)| timer == "02" && when <= 6_000),
        "keepalive timers: {timers:?}"
    );
    drop(store);
}

/// A Redis Sentinel given as the server is refused at `build` (and `build_lazy`, which would
/// otherwise retry it for ever), naming it: it answers `PING` but runs no script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_given_as_the_server_is_refused() {
    let primary = RedisServer::start();
    let sentinel = RedisServer::builder().sentinel_of(primary.port()).start();
    common::assert_refused_as_wrong_server(&sentinel.url(), "sentinel", "a Redis Sentinel").await;
}

/// A server still loading its data (restarted with a dump to load) refuses commands with
/// `LOADING` until it is done: waiting will help, so the build's error and a check's are
/// `is_unavailable`, as for a server not yet listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_loading_its_data_is_unavailable_while_it_loads() {
    // 20,000 keys at 500 µs each: about 10 s of loading, answered during (every 1 KB loaded).
    let mut server = RedisServer::builder()
        .config("key-load-delay 500")
        .config("loading-process-events-interval-bytes 1024")
        .start();
    let store = checked(RedisStore::builder(server.url()).prefix(unique_prefix("loading"))).await;
    server.cli(&[
        "eval",
        "for i = 1, 20000 do redis.call('SET', 'filler:' .. i, i) end",
        "0",
    ]);
    server.cli(&["save"]);
    server.restart_loading();

    let loading =
        |e: &RedisStoreError| matches!(e, RedisStoreError::Redis(r) if r.code() == Some("LOADING"));
    let err = RedisStore::builder(server.url())
        .prefix(unique_prefix("loading"))
        .build()
        .await
        .expect_err("no store is built while the server loads its data");
    assert!(loading(&err), "{err:?}");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        !err.is_refused_credentials() && !err.is_wrong_server(),
        "{err:?}"
    );

    // The store built before: its connection was cut by the restart, and the new one is refused.
    let mut refused = None;
    for _ in 0..50 {
        let err = store.check(b"k", &limit(), 1).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        if loading(&err) {
            refused = Some(err);
            break;
        }
    }
    let err = refused.expect("a check answered LOADING");
    assert!(err.to_string().contains("loading the dataset"), "{err}");
}

/// A replica given as the server: every admission would fail with `READONLY`, so the
/// build says so, as an unavailable server (a failover may promote it, or move the address to
/// the primary: a lazy store retries it), and builds once it is a primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_given_as_the_server_fails_the_build_until_promoted() {
    let primary = RedisServer::start();
    let replica = RedisServer::builder()
        .config(format!("replicaof 127.0.0.1 {}", primary.port()))
        .start();
    let build = || {
        RedisStore::builder(replica.url())
            .prefix(unique_prefix("replica"))
            .build()
    };
    let err = build().await.expect_err("no store is built on a replica");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        !err.is_refused_credentials() && !err.is_wrong_server(),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&replica.url()) && text.contains("a replica given as the server"),
        "{text}"
    );
    replica.cli(&["replicaof", "no", "one"]);
    let store = build().await.unwrap();
    assert!(store.check(b"k", &limit(), 1).await.unwrap().is_allowed());
}

/// A connection reopened for a check made on a current-thread runtime that then goes idle is not
/// driven from that runtime: the opening (and with it the connection's I/O task, which redis-rs
/// spawns where the connection is made) runs on the store's runtime, so that the main runtime's
/// checks on it are answered. Before, they timed out until the silence probe replaced the
/// connection, each counted as a failure by a circuit breaker.
#[test]
fn a_connection_reopened_for_a_runtime_that_goes_idle_serves_the_others() {
    reopened_for_another_runtime("idle-rt-conn", common::current_thread_runtime(), false);
}

/// A store built outside a Tokio runtime (its tasks would have nowhere to run) is a typed
/// configuration error, not a panic; the lazy store's too.
#[test]
fn a_store_built_outside_a_tokio_runtime_is_a_configuration_error() {
    let server = RedisServer::start();
    let builder = || RedisStore::builder(server.url()).prefix(unique_prefix("no-rt"));
    for result in [
        futures::executor::block_on(builder().build()).map(|_| ()),
        futures::executor::block_on(builder().build_lazy(Duration::from_secs(1))).map(|_| ()),
    ] {
        match result {
            Err(RedisStoreError::Config { name, .. }) => assert_eq!(name, "runtime"),
            other => panic!("{other:?}"),
        }
    }
}

/// A store built on a runtime that is then dropped (a set-up runtime), used from a current-thread
/// runtime: its first connection went with the set-up runtime, and the one reopened for the
/// checks is made (and driven) on theirs, so that the store mends itself as before.
#[test]
fn a_store_whose_runtime_is_gone_reconnects_for_a_current_thread_runtime() {
    let server = RedisServer::start();
    let store = common::current_thread_runtime()
        .block_on(async { one_connection(&server, "gone-rt", 500).await });
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    // A peek: the failed attempts spend nothing whatever they were.
    let remaining = common::current_thread_runtime().block_on(until_answered(&store, &limit, 0));
    assert_eq!(remaining, 1_000);
}

/// A connection reopened for a check made on a short-lived multi-thread runtime is made on the
/// store's own (multi-thread) runtime, not on the short-lived one, whose shutdown would take the
/// connection's I/O with it and fail the store's next checks.
#[test]
fn a_connection_reopened_for_a_short_lived_runtime_serves_the_store_s_own() {
    reopened_for_another_runtime("short-rt", common::runtime(), true);
}

/// A store of one connection, built on a multi-thread runtime (`main`): its connection killed,
/// reopened for the checks made on `side`, then used by `main`'s checks, which are answered
/// whatever became of `side` (shut down with `drop_side`; else kept, never driven again).
fn reopened_for_another_runtime(prefix: &str, side: tokio::runtime::Runtime, drop_side: bool) {
    let main = common::runtime();
    let server = RedisServer::start();
    let store = main.block_on(async { one_connection(&server, prefix, 500).await });
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    main.block_on(store.check(b"k", &limit, 1)).unwrap();
    server.cli(&["client", "kill", "type", "normal"]);
    // The first check on `side` finds the connection closed; a later one finds it reopened.
    assert_eq!(side.block_on(until_answered(&store, &limit, 1)), 998);
    if drop_side {
        drop(side);
    }
    let remaining: Vec<_> = main.block_on(async {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(store.check(b"k", &limit, 1).await.map(|d| d.remaining()));
        }
        out
    });
    assert_eq!(
        remaining.into_iter().map(Result::ok).collect::<Vec<_>>(),
        [Some(997), Some(996), Some(995)]
    );
}

/// A store of one connection to `server`, under a prefix made from `prefix`, with a response
/// timeout of `timeout_ms`.
async fn one_connection(server: &RedisServer, prefix: &str, timeout_ms: u64) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(unique_prefix(prefix))
        .pool_size(1)
        .response_timeout(Duration::from_millis(timeout_ms))
        .build()
        .await
        .unwrap()
}

/// `remaining` after the first check of `cost` for `k` that `store` answers, within 10 s.
async fn until_answered(store: &RedisStore, limit: &Limit, cost: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(d) = store.check(b"k", limit, cost).await {
            return d.remaining();
        }
        assert!(Instant::now() < deadline, "never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task that takes 0.5 ms to drop: a runtime holding a few thousand of them takes a second or
/// so to shut down, as a busy server's runtime, with many connections' tasks, may.
struct SlowDrop;

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// The store is built on a multi-thread runtime whose shutdown takes a while; its checks come
/// from another, long-lived runtime. Once the store's runtime is shutting down, its connection
/// (driven there) breaks: one failed check, and the next reopens the connection on the checks'
/// runtime, however long the shutdown goes on. (The store's watch of its runtime is dropped at
/// some point of the shutdown, and the runtime refuses new tasks from its start: each opening
/// sent there was dropped unrun, failing its check, until the watch went. `offset` shifts the
/// tasks' ids, so that the watch is dropped after the connection's driver in some runs.)
#[test]
fn a_store_s_runtime_shutting_down_fails_one_check_on_another() {
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let server = RedisServer::start();
    let mut unfinished = Vec::new();
    for offset in 0..4 {
        let home = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        for _ in 0..offset {
            home.spawn(async {});
        }
        let store =
            home.block_on(async { one_connection(&server, "home-shutting-down", 200).await });
        for _ in 0..2_000 {
            let slow = SlowDrop;
            home.spawn(async move {
                let _slow = slow;
                std::future::pending::<()>().await
            });
        }
        let main = common::runtime();
        main.block_on(store.check(b"k", &limit, 0)).unwrap();
        let dropper = std::thread::spawn(move || drop(home));
        unfinished.push(main.block_on(async {
            let started = Instant::now();
            let mut unfinished = 0;
            while started.elapsed() < Duration::from_secs(2) {
                if let Err(e) = store.check(b"k", &limit, 0).await
                    && e.to_string().contains("opening ended before it finished")
                {
                    unfinished += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            unfinished
        }));
        dropper.join().unwrap();
    }
    assert!(
        unfinished.iter().all(|&n| n <= 1),
        "checks failed as their connection's opening was sent to the store's runtime shutting \
         down (per offset): {unfinished:?}"
    );
}
