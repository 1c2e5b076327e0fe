//! A stored state the scripts never write (a number below zero or past 2^53, a word that is not a
//! number, too few or too many numbers), written by hand or by another tool under the store's prefix:
//! the check fails with an error, in the scripts' read phase, and the value is left as it was.
//! Never a decision made from it: a negative token-bucket level was read as a denial by the
//! script and as an admission by the client (the level reply's sign), every check admitted and
//! nothing spent.

mod common;

use common::{T0, manual, unique_prefix};
use ratelimit_core::{Algorithm, Limit, ManualClock, Quota, Timestamp};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;

/// Values of `fields` numbers per quota over `quotas` quotas that no script writes, each
/// differing from a well-formed state (times `T0`, counts and levels 5) in one way.
fn malformed(fields: usize, quotas: usize) -> Vec<String> {
    let n = fields * quotas;
    let well_formed: Vec<String> = (0..n)
        .map(|i| {
            if i % fields == fields - 1 || fields == 3 && i % fields == 0 {
                T0.to_string()
            } else {
                "5".to_owned()
            }
        })
        .collect();
    let mut values = Vec::new();
    for at in 0..n {
        // The last three: digits only, but past 2^53, which no script writes and a double
        // cannot hold exactly (2^53 + 1 reads as 2^53): read, they were decided from, and an
        // admission wrote back a negative number and an expiry of millions of years.
        for bad in [
            "-500000",
            "-1",
            "x",
            "",
            "1.5",
            "0x10",
            "99999999999999999999",
            "9007199254740993",
            "9007199254740992",
        ] {
            let mut v = well_formed.clone();
            v[at] = bad.to_owned();
            values.push(v.join(":"));
        }
    }
    values.push(well_formed[..n - 1].join(":"));
    values.push(format!("{}:5", well_formed.join(":")));
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_state_no_script_writes_fails_the_check_and_is_left_as_it_was() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
    let store = manual(RedisStore::builder(server.url()), &clock)
        .prefix(unique_prefix("stored"))
        .build()
        .await
        .unwrap();
    let q1 = Quota::per_second(10).unwrap();
    let q2 = Quota::per_minute(100).unwrap();
    let mut checked = 0;
    for (algorithm, fields) in [
        (Algorithm::TokenBucket, 2),
        (Algorithm::Gcra, 2),
        (Algorithm::FixedWindow, 2),
        (Algorithm::SlidingWindow, 3),
    ] {
        for quotas in [1, 2] {
            let limit = if quotas == 1 {
                Limit::single(algorithm, q1).unwrap()
            } else {
                Limit::new(algorithm, vec![q1, q2]).unwrap()
            };
            let key = store.state_keys(b"k", &limit)[0].clone();
            for value in malformed(fields, quotas) {
                server.cli(&["set", &key, &value]);
                for cost in [0, 1] {
                    let answer = store.check(b"k", &limit, cost).await;
                    assert!(
                        answer.is_err(),
                        "{algorithm:?}, {quotas} quota(s), stored {value:?}, cost {cost}: {answer:?}"
                    );
                    assert_eq!(server.cli(&["get", &key]), value, "{algorithm:?} {value:?}");
                    checked += 1;
                }
            }
            // A well-formed state decides again once the bad one is gone.
            server.cli(&["del", &key]);
            assert!(store.check(b"k", &limit, 1).await.unwrap().is_allowed());
        }
    }
    // The sliding log: a list entry not as the scripts write it.
    let limit = Limit::single(Algorithm::SlidingLog, q1).unwrap();
    let keys = store.state_keys(b"k", &limit);
    for entry in [
        "x",
        "-5:1",
        &format!("{T0}:-1"),
        &format!("{T0}:1.5"),
        &format!("{T0}"),
        &format!("{T0}:99999999999999999999"),
        "99999999999999999999:1",
    ] {
        server.cli(&["del", &keys[1]]);
        server.cli(&["hset", &keys[0], "n1", "1"]);
        server.cli(&["rpush", &keys[1], entry]);
        for cost in [0, 1] {
            let answer = store.check(b"k", &limit, cost).await;
            assert!(answer.is_err(), "entry {entry:?}, cost {cost}: {answer:?}");
            assert_eq!(server.cli(&["lrange", &keys[1], "0", "-1"]), entry);
            checked += 1;
        }
    }
    // A total past 2^53 beside a well-formed log is recounted from the log, as any damaged
    // total is: not decided from (it denied the key for good).
    server.cli(&["del", &keys[1]]);
    server.cli(&["hset", &keys[0], "n1", "99999999999999999999"]);
    server.cli(&["rpush", &keys[1], &format!("{T0}:1")]);
    let d = store.check(b"k", &limit, 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 8, "{d:?}");
    println!("{checked} checks of malformed states");
    // The error names the key, and what is wrong with it.
    let limit = Limit::single(Algorithm::TokenBucket, q1).unwrap();
    let key = store.state_keys(b"k", &limit)[0].clone();
    server.cli(&["set", &key, "-1:1"]);
    let error = store.check(b"k", &limit, 1).await.unwrap_err().to_string();
    println!("{error}");
    assert!(
        error.contains("malformed state") && error.contains(&key),
        "{error}"
    );
}

/// The largest numbers a script writes are read back as state, not refused as malformed: GCRA's
/// theoretical arrival time is the time plus up to 2^52 µs of debt, below 2^53 (the scripts'
/// bound on a stored number) because the client clock is refused from 2^52 µs on. (A clock at
/// 2^52 was taken, GCRA stored 2^53, and every later check of the key failed as malformed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_states_a_script_writes_are_read_back() {
    let server = RedisServer::start();
    let last = (1u64 << 52) - 1;
    let clock = ManualClock::starting_at(Timestamp::from_micros(last));
    let store = manual(RedisStore::builder(server.url()), &clock)
        .prefix(unique_prefix("largest"))
        .build()
        .await
        .unwrap();
    let quotas = [
        // A debt of 2^52 µs at once.
        (
            Quota::per_period(1, std::time::Duration::from_micros(1 << 52)).unwrap(),
            1,
        ),
        // 2^32 requests of 2^20 µs each: 2^52 µs.
        (
            Quota::per_period(1, std::time::Duration::from_micros(1 << 20))
                .unwrap()
                .with_burst(1 << 32)
                .unwrap(),
            1 << 32,
        ),
    ];
    for (i, (quota, cost)) in quotas.into_iter().enumerate() {
        for limit in [
            Limit::single(Algorithm::Gcra, quota).unwrap(),
            // Beside a second quota that admits the cost too.
            Limit::new(
                Algorithm::Gcra,
                vec![
                    quota,
                    Quota::per_period(1 << 33, std::time::Duration::from_secs(60)).unwrap(),
                ],
            )
            .unwrap(),
        ] {
            let key = format!("k{i}-{}", limit.quotas().len());
            let first = store.check(key.as_bytes(), &limit, cost).await.unwrap();
            assert!(first.is_allowed(), "{limit:?}: {first:?}");
            for cost in [1, 0] {
                let next = store.check(key.as_bytes(), &limit, cost).await;
                assert!(
                    matches!(next, Ok(ref d) if d.is_allowed() == (cost == 0)),
                    "{limit:?}, then cost {cost}: {next:?}"
                );
            }
        }
    }
    // From 2^52 µs on, the client clock's time is refused, before anything is sent.
    clock.set(Timestamp::from_micros(1 << 52));
    let limit = Limit::single(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let refused = store.check(b"k", &limit, 1).await;
    assert!(
        matches!(
            refused,
            Err(ratelimit_redis::RedisStoreError::ClockOutOfRange { micros }) if micros == 1 << 52
        ),
        "{refused:?}"
    );
}
