//! Every write sets an expiry equal to the time until the state is fresh again; no key lives
//! forever, including keys that were only ever denied.

mod common;

use std::time::Duration;

use common::{NowMicros, Reference, T0, unique_prefix};
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota, Timestamp};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["pttl", key]).parse().unwrap()
}

/// The key's expiry as a Unix time in milliseconds (-1: none, -2: no key).
fn pexpiretime(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["pexpiretime", key]).parse().unwrap()
}

/// `PTTL` counts down in real time from the moment of the write; allow for the time the test
/// itself takes between the write and the `PTTL`.
fn assert_ttl_close(got: i64, expected_ms: i64, what: &str) {
    assert!(
        got <= expected_ms && got >= expected_ms - 1_000.min(expected_ms / 2 + 200),
        "{what}: PTTL {got} ms, expected {expected_ms} ms"
    );
}

/// A store on `server` with a manual client clock at `T0` and no expiry slack (the TTLs are what
/// these tests check).
async fn client_clock_store(server: &RedisServer, name: &str) -> (ManualClock, RedisStore) {
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix(name))
        .client_clock(clock.clone())
        .expiry_slack(Duration::ZERO)
        .build()
        .await
        .unwrap();
    (clock, store)
}

/// With a client clock, a check's time is read before its command is sent and the expiry counts
/// from when the script runs: a check that waits in between must still find the state, so by
/// default a client-clock store's keys outlive their fresh time by the response timeout; the
/// server's clock needs no slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_store_keeps_keys_for_its_response_timeout_past_fresh() {
    let server = RedisServer::start();
    let limit = Limit::single(
        Algorithm::TokenBucket,
        Quota::per_minute(6).unwrap().with_burst(5).unwrap(),
    )
    .unwrap();
    let timeout = Duration::from_secs(5);
    let client = RedisStore::builder(server.url())
        .prefix(unique_prefix("client-slack"))
        .client_clock(ManualClock::starting_at(Timestamp::from_micros(T0)))
        .response_timeout(timeout)
        .build()
        .await
        .unwrap();
    let d = client.check(b"u", &limit, 1).await.unwrap();
    assert_eq!(d.reset_after(), Duration::from_secs(10));
    let key = &client.state_keys(b"u", &limit)[0];
    assert_ttl_close(pttl(&server, key), 15_000, "client clock, default slack");

    let server_time = RedisStore::builder(server.url())
        .prefix(unique_prefix("server-slack"))
        .response_timeout(timeout)
        .build()
        .await
        .unwrap();
    server_time.check(b"u", &limit, 1).await.unwrap();
    let key = &server_time.state_keys(b"u", &limit)[0];
    assert_ttl_close(pttl(&server, key), 10_000, "server clock, default slack");
}

/// A client clock's time is read when the check is sent (its response timeout starts), not when
/// its future is made: a future polled late would send a time older than the slack covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_is_read_when_the_check_is_sent() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("client-read"))
        .client_clock(clock.clone())
        .build()
        .await
        .unwrap();
    // One a second, a bucket of one.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(1).unwrap()).unwrap();
    assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
    let made = store.check(b"u", &limit, 1);
    clock.advance(Duration::from_secs(1));
    let d = made.await.unwrap();
    assert!(d.is_allowed(), "decided at the time it was made: {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_is_the_time_to_fresh_for_every_algorithm() {
    let server = RedisServer::start();
    let (clock, store) = client_clock_store(&server, "ttl").await;
    for alg in Algorithm::ALL {
        // Long periods, so the real time the test takes is small against the TTL.
        let limit = Limit::new(
            alg,
            [Quota::per_minute(10).unwrap(), Quota::per_hour(50).unwrap()],
        )
        .unwrap();
        let mut reference = Reference::default();
        for (step, cost) in [(0, 3), (7_000_000, 2), (1_000, 1)] {
            clock.advance(Duration::from_micros(step));
            let now = clock.now_micros();
            let d = store.check(b"user", &limit, cost).await.unwrap();
            let expected = reference.check(b"user", &limit, cost, Timestamp::from_micros(now));
            assert_eq!(d, expected);
            let states = reference.states(b"user").unwrap();
            let fresh_at = limit.fresh_at(states).as_micros();
            let expected_ms = (fresh_at - now).div_ceil(1_000) as i64;
            for key in store.state_keys(b"user", &limit) {
                assert_ttl_close(pttl(&server, &key), expected_ms, &format!("{alg} {key}"));
            }
        }
    }
}

/// In server-time mode (the default): 6 a minute with a burst of 5; after one request the
/// bucket is full again in 10 s, and that is the key's TTL. (A token every 10 s: the checks and
/// the `redis-cli` calls between them have ample time on a loaded machine, where with a token
/// every 500 ms a stall could refill one and let the sixth check pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_ttl_is_the_refill_time() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("srv"))
        .build()
        .await
        .unwrap();
    let limit = Limit::single(
        Algorithm::TokenBucket,
        Quota::per_minute(6).unwrap().with_burst(5).unwrap(),
    )
    .unwrap();
    let d = store.check(b"u", &limit, 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.reset_after(), Duration::from_secs(10));
    let key = &store.state_keys(b"u", &limit)[0];
    assert_ttl_close(pttl(&server, key), 10_000, "token bucket");
    // The burst of 5 less the one spent: 4 more pass, the fifth is denied.
    for _ in 0..4 {
        assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
    }
    let d = store.check(b"u", &limit, 1).await.unwrap();
    assert!(d.is_denied());
    // Empty bucket: 50 s to full again, minus the little real time the checks took.
    assert_ttl_close(pttl(&server, key), 50_000, "empty bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_only_keys_do_not_live_forever() {
    let server = RedisServer::start();
    let (clock, store) = client_clock_store(&server, "deny").await;
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_minute(10).unwrap()).unwrap();
        // A first request that is denied (its cost can never fit): nothing is stored, so there is
        // nothing to expire.
        for _ in 0..3 {
            let d = store.check(b"greedy", &limit, 11).await.unwrap();
            assert!(d.is_denied());
        }
        for key in store.state_keys(b"greedy", &limit) {
            assert_eq!(server.cli(&["exists", &key]), "0", "{alg}: {key}");
        }
        // A key that is then denied again and again keeps the expiry its last admission set: a
        // denial writes nothing, so it never extends the key's life, nor shortens it.
        for _ in 0..10 {
            assert!(store.check(b"busy", &limit, 1).await.unwrap().is_allowed());
        }
        // The expiry the last admission set, as an absolute time (`PEXPIRETIME` does not count
        // down): the denials below must leave it exactly as it is.
        let busy_keys = store.state_keys(b"busy", &limit);
        let set_by_admission: Vec<i64> =
            busy_keys.iter().map(|k| pexpiretime(&server, k)).collect();
        for _ in 0..50 {
            clock.advance(Duration::from_millis(100));
            assert!(
                store.check(b"busy", &limit, 1).await.unwrap().is_denied(),
                "{alg}"
            );
        }
        for key in store.state_keys(b"busy", &limit) {
            let ttl = pttl(&server, &key);
            assert!(ttl > 0, "{alg}: {key} has an expiry (PTTL {ttl})");
            // Every state is fresh at most two periods (the sliding window's previous window)
            // after the last admission, which set the expiry; the denials' 5 s of client time
            // did not touch it.
            assert!(ttl <= 120_001, "{alg}: {key} PTTL {ttl}");
        }
        let after_denials: Vec<i64> = busy_keys.iter().map(|k| pexpiretime(&server, k)).collect();
        assert_eq!(
            after_denials, set_by_admission,
            "{alg}: a denial moved an expiry"
        );
    }
    // Every key the store wrote has an expiry.
    let keys = server.cli(&["--scan", "--pattern", &format!("{}:*", store.prefix())]);
    assert!(!keys.is_empty());
    for key in keys.lines() {
        assert!(pttl(&server, key) > 0, "{key} has no expiry");
    }
}

/// With client clocks, a denial by a gateway whose clock runs ahead does not cut the expiry that
/// the admitting gateway set (a denial writes nothing), so the key does not vanish while its state
/// is still in force for the other gateways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_by_a_gateway_ahead_leaves_the_expiry_alone() {
    let server = RedisServer::start();
    let prefix = unique_prefix("skew");
    // With 30 s of slack on both, so that A's keys outlive the redis-cli calls below on a loaded
    // machine (a denial by B that wrote would still cut A's expiry, by 900 ms).
    let gateway = |clock: &ManualClock| {
        RedisStore::builder(server.url())
            .prefix(prefix.clone())
            .client_clock(clock.clone())
            .expiry_slack(Duration::from_secs(30))
            .build()
    };
    let clock_a = ManualClock::starting_at(Timestamp::from_micros(T0));
    let clock_b = ManualClock::starting_at(Timestamp::from_micros(T0 + 900_000));
    // T0 is 123,457 µs into its second, so B's time is in the next one-second window.
    let (a, b) = (
        gateway(&clock_a).await.unwrap(),
        gateway(&clock_b).await.unwrap(),
    );
    for alg in Algorithm::ALL {
        // One a second: after one admission the state is in force for a second.
        let limit = Limit::single(alg, Quota::per_second(1).unwrap()).unwrap();
        let key_name = format!("user-{alg}");
        assert!(
            a.check(key_name.as_bytes(), &limit, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        // The expiry A set, as an absolute time (`PEXPIRETIME`, which does not count down while
        // the test runs, as `PTTL` does).
        let keys = a.state_keys(key_name.as_bytes(), &limit);
        let set_by_a: Vec<i64> = keys.iter().map(|k| pexpiretime(&server, k)).collect();
        assert!(set_by_a.iter().all(|&t| t > 0), "{alg}: {set_by_a:?}");
        // B, 900 ms ahead, is denied (a fixed window: B is in the next window, and admitted).
        let d = b.check(key_name.as_bytes(), &limit, 1).await.unwrap();
        assert_eq!(d.is_allowed(), alg == Algorithm::FixedWindow, "{alg}");
        for (key, by_a) in keys.iter().zip(set_by_a) {
            let now = pexpiretime(&server, key);
            // The denial left A's expiry of about 1 s and the slack (B would have cut it to
            // about 100 ms and the slack; B's admission in the next window sets a later one).
            assert!(now >= by_a, "{alg}: {key} expires at {now}, A set {by_a}");
        }
    }
}

/// A peek (cost 0) writes nothing: not the state, not the expiry; on a key never seen it creates
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_writes_nothing() {
    let server = RedisServer::start();
    let (clock, store) = client_clock_store(&server, "peek").await;
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_minute(10).unwrap()).unwrap();
        let keys = store.state_keys(b"p", &limit);
        assert_eq!(store.check(b"p", &limit, 0).await.unwrap().remaining(), 10);
        assert_eq!(server.cli(&["exists", &keys[0]]), "0", "{alg}");
        assert!(store.check(b"p", &limit, 4).await.unwrap().is_allowed());
        let dump = |k: &str| server.cli(&["dump", k]);
        let before: Vec<String> = keys.iter().map(|k| dump(k)).collect();
        clock.advance(Duration::from_secs(1));
        let peek = store.check(b"p", &limit, 0).await.unwrap();
        assert!(peek.is_allowed(), "{alg}");
        let after: Vec<String> = keys.iter().map(|k| dump(k)).collect();
        assert_eq!(before, after, "{alg}: a peek changed the stored state");
    }
}

/// The sliding log keeps its totals in a hash next to its lists. If the hash is lost apart from
/// the lists (evicted under an `allkeys-lru` policy, deleted by an operator), the total is
/// recounted from the log instead of read as 0, which would admit a second limit's worth and
/// leave the total short for as long as the log lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_whose_total_was_lost_recounts_it() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = common::manual(
        RedisStore::builder(server.url()).prefix(unique_prefix("lost-total")),
        &clock,
    )
    .build()
    .await
    .unwrap();
    let limit = Limit::single(Algorithm::SlidingLog, Quota::per_minute(10).unwrap()).unwrap();
    for _ in 0..10 {
        assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
        clock.advance(Duration::from_secs(1));
    }
    let hash = &store.state_keys(b"u", &limit)[0];
    assert_eq!(server.cli(&["TYPE", hash]), "hash");
    assert_eq!(server.cli(&["DEL", hash]), "1");

    // At 10 s the log holds 10 requests of the last minute: denied until the first slides out.
    let d = store.check(b"u", &limit, 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(50)));
    assert_eq!(
        server.cli(&["HGET", hash, "n1"]),
        "10",
        "the recount is stored"
    );
    assert!(pttl(&server, hash) > 0, "and expires with the log");

    // At 60 s the first request has slid out: one more passes, then none.
    clock.advance(Duration::from_secs(50));
    assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"u", &limit, 1).await.unwrap().is_allowed());
    assert_eq!(server.cli(&["HGET", hash, "n1"]), "10");
}

/// A log whose hash counts more than its list holds (damaged by hand) finds no entry to wait
/// for: the denial still says to wait at least 1 µs, as `ratelimit-core` does, never 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_short_of_its_total_never_answers_a_zero_wait() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = common::manual(
        RedisStore::builder(server.url()).prefix(unique_prefix("short-log")),
        &clock,
    )
    .build()
    .await
    .unwrap();
    let limit = Limit::single(Algorithm::SlidingLog, Quota::per_minute(2).unwrap()).unwrap();
    for _ in 0..2 {
        assert!(store.check(b"u", &limit, 1).await.unwrap().is_allowed());
        clock.advance(Duration::from_secs(1));
    }
    let keys = store.state_keys(b"u", &limit);
    assert_eq!(server.cli(&["TYPE", &keys[1]]), "list");
    assert_eq!(server.cli(&["HGET", &keys[0], "n1"]), "2");
    assert_eq!(server.cli(&["HSET", &keys[0], "n1", "5"]), "0");
    let d = store.check(b"u", &limit, 1).await.unwrap();
    assert!(d.is_denied(), "{d:?}");
    assert!(
        d.retry_after()
            .is_some_and(|r| r >= Duration::from_micros(1)),
        "{d:?}"
    );
}

/// A single quota's state full again in less than a millisecond, or in a fraction of one more:
/// its expiry is rounded up to the next whole millisecond, never down (down, a bucket full again
/// in 500 µs was written with `SET ... PX 0`, which Redis refuses, and the check failed; a
/// fraction above a whole millisecond let the key go before the state was fresh). No expiry
/// slack, the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_quotas_expiry_rounds_up_to_the_millisecond() {
    let server = RedisServer::start();
    let (_clock, store) = client_clock_store(&server, "ttl-round").await;
    for alg in Algorithm::ALL {
        // A unit every 500 µs, 333⅓ µs, 250 µs; bursts of 1: full again within a millisecond.
        for per_second in [2_000, 3_000, 4_000] {
            let limit = Limit::single(alg, Quota::per_second(per_second).unwrap()).unwrap();
            let key = format!("user-{per_second}");
            let d = store.check(key.as_bytes(), &limit, 1).await;
            assert!(
                matches!(&d, Ok(d) if d.is_allowed()),
                "{alg} {per_second}/s: {d:?}"
            );
        }
        // 3 every 10 s: full again 3,333,333⅓ µs after one request, so 3,334 ms, not 3,333: the
        // key's expiry, read against the server's clock around the write, is at least that.
        let limit =
            Limit::single(alg, Quota::per_period(3, Duration::from_secs(10)).unwrap()).unwrap();
        let key = "user-thirds";
        let before = server_millis(&server);
        assert!(
            store
                .check(key.as_bytes(), &limit, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        for state_key in store.state_keys(key.as_bytes(), &limit) {
            let expires = pexpiretime(&server, &state_key);
            assert!(
                expires >= before + 3_334,
                "{alg}: expires {} ms after the write began, not 3,334",
                expires - before
            );
        }
    }
}

/// The server's clock, in Unix milliseconds.
fn server_millis(server: &RedisServer) -> i64 {
    let time = server.cli(&["time"]);
    let mut parts = time.lines();
    let secs: i64 = parts.next().unwrap().trim().parse().unwrap();
    let micros: i64 = parts.next().unwrap().trim().parse().unwrap();
    secs * 1_000 + micros / 1_000
}
