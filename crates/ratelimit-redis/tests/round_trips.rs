//! Fewer Redis round trips, on a real redis-server: the denial cache, token leasing and request
//! coalescing, each checked for what it saves (counted by the wrappers and by the server's own
//! `INFO commandstats`) and for what it changes in the decisions.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T0, manual, unique_prefix};
use futures::future::join_all;
use ratelimit_core::{
    Algorithm, DenialCache, Leasing, Limit, ManualClock, Quota, Store, SystemClock, Timestamp,
};
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::RedisServer;

fn reset_stats(server: &RedisServer) {
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
}

/// 10,000 requests from one key at 100 times its limit (10 per second, asked 1,000 times a second
/// for 10 seconds): with the denial cache, the same decision for every request as without it, and
/// Redis is called only for the admissions and once per denial spell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_cache_abusive_key_same_decisions_few_calls() {
    let server = RedisServer::start();
    for alg in Algorithm::ALL {
        let limit = Limit::single(alg, Quota::per_second(10).unwrap()).unwrap();
        let mut runs = Vec::new();
        for cached in [false, true] {
            let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
            let store = manual(RedisStore::builder(server.url()), &clock)
                .prefix(unique_prefix("abuse"))
                .build()
                .await
                .unwrap();
            let cache = DenialCache::new(store.clone(), clock.clone());
            reset_stats(&server);
            let mut decisions = Vec::with_capacity(10_000);
            for _ in 0..10_000 {
                let d = if cached {
                    cache.check(b"abuser", &limit, 1).await.unwrap()
                } else {
                    store.check(b"abuser", &limit, 1).await.unwrap()
                };
                decisions.push(d);
                clock.advance(Duration::from_millis(1));
            }
            let calls = server.script_calls();
            runs.push((decisions, calls, cache.stats()));
        }
        let (plain, plain_calls, _) = &runs[0];
        let (with_cache, cached_calls, stats) = &runs[1];
        assert_eq!(*plain_calls, 10_000, "{alg}");
        let admitted = plain.iter().filter(|d| d.is_allowed()).count() as u64;
        // Identical decisions, field by field, request by request (cost 1, one gateway).
        assert_eq!(plain, with_cache, "{alg}");
        // Only admissions and the first denial of each spell reach Redis; for the token bucket,
        // GCRA and the fixed window, the admission that takes the last unit already says until
        // when the next is denied, so only admissions do.
        let spells = plain
            .windows(2)
            .filter(|w| w[0].is_allowed() && w[1].is_denied())
            .count() as u64
            + u64::from(plain[0].is_denied());
        let implied = matches!(
            alg,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::FixedWindow
        );
        let expected = if implied { admitted } else { admitted + spells };
        assert_eq!(*cached_calls, expected, "{alg}: {stats:?}");
        assert_eq!(
            stats.store_calls, *cached_calls,
            "{alg}: the server saw every call counted"
        );
        assert!(spells <= admitted, "{alg}");
        println!(
            "{alg}: admitted {admitted} of 10,000 with and without the cache; Redis calls \
             10,000 -> {cached_calls} ({} for denials)",
            cached_calls - admitted
        );
    }
}

/// The denial cache's skew caveat, on client clocks: gateway B's clock runs 20 ms ahead of A's.
/// B's check moves the key's time in Redis 20 ms ahead of A's clock, so Redis admits the key while
/// A's cache still holds its denial; that denial ends at its own deadline (A's clock when the check
/// was sent plus the `retry_after` Redis gave), no later, and then A asks Redis again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_cache_outlasts_redis_by_at_most_the_gateways_skew() {
    let server = RedisServer::start();
    let prefix = unique_prefix("skew");
    let clock_a = ManualClock::starting_at(Timestamp::from_micros(T0));
    let clock_b = ManualClock::starting_at(Timestamp::from_micros(T0 + 20_000));
    let build = |clock: &ManualClock| {
        manual(RedisStore::builder(server.url()), clock)
            .prefix(prefix.clone())
            .build()
    };
    let (store_a, store_b) = (
        build(&clock_a).await.unwrap(),
        build(&clock_b).await.unwrap(),
    );
    let cache_a = DenialCache::new(store_a.clone(), clock_a.clone());
    // 100 a second, burst 200: the 200th admission implies a denial of cost 1 for 10 ms.
    let quota = Quota::per_second(100).unwrap().with_burst(200).unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, quota).unwrap();
    for _ in 0..200 {
        assert!(cache_a.check(b"k", &limit, 1).await.unwrap().is_allowed());
    }
    let d = cache_a.check(b"k", &limit, 1).await.unwrap();
    assert!(d.is_cached(), "{d:?}");
    assert_eq!(d.retry_after(), Some(Duration::from_millis(10)), "{d:?}");

    // B, 20 ms ahead, finds 2 units refilled by its clock and takes one.
    assert!(store_b.check(b"k", &limit, 1).await.unwrap().is_allowed());
    clock_a.advance(Duration::from_millis(1));
    clock_b.advance(Duration::from_millis(1));
    // Redis now counts at B's time: it admits A's check, where A's cache still denies, with what
    // is left of its own deadline.
    let cached = cache_a.check(b"k", &limit, 1).await.unwrap();
    assert!(cached.is_cached(), "{cached:?}");
    assert_eq!(
        cached.retry_after(),
        Some(Duration::from_millis(9)),
        "{cached:?}"
    );
    assert!(store_a.check(b"k", &limit, 1).await.unwrap().is_allowed());

    // At its deadline the cached denial ends: A asks Redis, which decides.
    clock_a.advance(Duration::from_millis(9));
    clock_b.advance(Duration::from_millis(9));
    let after = cache_a.check(b"k", &limit, 1).await.unwrap();
    assert!(!after.is_cached(), "{after:?}");
}

/// Twenty gateways, each with its own Redis store and token leasing (leases of 10), share a quota
/// of 1,000 a day: never more than 1,000 admitted, and the shortfall (units leased but not yet
/// spent when demand stops) at most 20 x (10 - 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leasing_twenty_gateways_never_exceed_the_limit() {
    const GATEWAYS: usize = 20;
    const LEASE: u64 = 10;
    const CAPACITY: u64 = 1_000;
    let server = RedisServer::start();
    for alg in Algorithm::ALL {
        let prefix = unique_prefix("lease");
        let mut gateways = Vec::new();
        for _ in 0..GATEWAYS {
            // Server time, as real gateways; the lease clock is this process's. A patient
            // response timeout: the test counts admissions, not latency.
            let store = RedisStore::builder(server.url())
                .prefix(prefix.clone())
                .pool_size(1)
                .response_timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
            let leasing = Leasing::builder(store, SystemClock::new())
                .lease_size(LEASE)
                .max_ttl(Duration::from_secs(120))
                .build()
                .unwrap();
            gateways.push(Arc::new(leasing));
        }
        let limit = Limit::single(alg, Quota::per_day(CAPACITY).unwrap()).unwrap();
        reset_stats(&server);
        // Uneven demand, all at once: gateway g sends 20 + 5 g checks concurrently.
        let tasks = gateways.iter().enumerate().map(|(g, gw)| {
            let (gw, limit) = (Arc::clone(gw), limit.clone());
            tokio::spawn(async move {
                let checks = (0..20 + 5 * g).map(|_| gw.check(b"shared", &limit, 1));
                join_all(checks)
                    .await
                    .into_iter()
                    .filter(|r| r.as_ref().unwrap().is_allowed())
                    .count() as u64
            })
        });
        let admitted: u64 = join_all(tasks).await.into_iter().map(|r| r.unwrap()).sum();
        let demand: u64 = (0..GATEWAYS as u64).map(|g| 20 + 5 * g).sum();
        let unspent: u64 = gateways.iter().map(|g| g.outstanding_units()).sum();
        let calls: u64 = gateways.iter().map(|g| g.stats().store_calls).sum();
        assert!(demand > CAPACITY);
        assert!(admitted <= CAPACITY, "{alg}: {admitted}");
        assert_eq!(
            admitted + unspent,
            CAPACITY,
            "{alg}: granted = admitted + unspent"
        );
        assert!(
            CAPACITY - admitted <= GATEWAYS as u64 * (LEASE - 1),
            "{alg}: shortfall {} past the bound",
            CAPACITY - admitted
        );
        assert_eq!(server.script_calls(), calls, "{alg}");
        // All at once: at each gateway the checks that the first lease's spare units cover wait
        // for it, and the others go to the store side by side, as without leasing (waiting in
        // line for lease after lease would make the last wait many round trips), so the saving
        // here is about a lease's worth per gateway; the hot-key test below counts the saving of
        // a key asked again and again.
        let waited: u64 = gateways.iter().map(|g| g.stats().waited).sum();
        assert!(waited > 0, "{alg}");
        assert!(calls < demand, "{alg}: {calls} calls for {demand} checks");
        println!(
            "{alg}: {demand} checks on {GATEWAYS} gateways: admitted {admitted} of {CAPACITY} \
             (shortfall {}, bound {}), Redis calls {calls}",
            CAPACITY - admitted,
            GATEWAYS as u64 * (LEASE - 1)
        );
    }
}

/// A hot legitimate key at about its rate (1,000 a second, asked 1,000 times a second by 20
/// callers for 5 seconds, on one gateway): leasing admits what the exact limit admits, with a
/// small fraction of the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_hot_key_far_fewer_calls_no_over_admission() {
    let server = RedisServer::start();
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let limit = Limit::single(alg, Quota::per_second(1_000).unwrap()).unwrap();
        let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
        let store = manual(RedisStore::builder(server.url()), &clock)
            .prefix(unique_prefix("hot"))
            .build()
            .await
            .unwrap();
        let leasing = Leasing::new(store, clock.clone());
        reset_stats(&server);
        let mut admitted = 0;
        // Every 20 ms, 20 callers at once.
        for _ in 0..250 {
            let checks = (0..20).map(|_| leasing.check(b"hot", &limit, 1));
            admitted += join_all(checks)
                .await
                .into_iter()
                .filter(|r| r.as_ref().unwrap().is_allowed())
                .count();
            clock.advance(Duration::from_millis(20));
        }
        let calls = server.script_calls();
        assert_eq!(calls, leasing.stats().store_calls, "{alg}");
        // Demand never exceeds the rate: the exact limit admits all 5,000.
        assert_eq!(admitted, 5_000, "{alg}: {:?}", leasing.stats());
        assert!(calls * 1_000 / 5_000 < 100, "{alg}: {calls} calls");
        println!("{alg}: 5,000 checks, admitted {admitted}, Redis calls {calls}");
    }
}

/// The same hot key asked above its rate (25 callers every 20 ms: 1,250 a second against 1,000),
/// so that the limit binds and every unit is contested: leasing admits no more than the exact
/// limit does for the same checks at the same instants (replayed on the memory store) plus the
/// one lease its bound allows, and not much less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_hot_key_above_its_rate_admits_what_the_exact_limit_does() {
    let server = RedisServer::start();
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let limit = Limit::single(alg, Quota::per_second(1_000).unwrap()).unwrap();
        let clock = ManualClock::starting_at(Timestamp::from_micros(T0));
        let store = manual(RedisStore::builder(server.url()), &clock)
            .prefix(unique_prefix("hot-above"))
            .build()
            .await
            .unwrap();
        let leasing = Leasing::new(store, clock.clone());
        let exact_store = ratelimit_core::MemoryStore::new();
        let (mut admitted, mut exact) = (0u64, 0u64);
        for tick in 0..250u64 {
            let now = Timestamp::from_micros(T0 + tick * 20_000);
            exact += (0..25)
                .filter(|_| exact_store.check_at(b"hot", &limit, 1, now).is_allowed())
                .count() as u64;
            let checks = (0..25).map(|_| leasing.check(b"hot", &limit, 1));
            admitted += join_all(checks)
                .await
                .into_iter()
                .filter(|r| r.as_ref().unwrap().is_allowed())
                .count() as u64;
            clock.advance(Duration::from_millis(20));
        }
        let stats = leasing.stats();
        // The limit binds: the burst and 4.98 s of refill, of 6,250 asked.
        assert_eq!(exact, 1_000 + 4_980, "{alg}");
        assert!(
            admitted <= exact + ratelimit_core::DEFAULT_MAX_LEASE,
            "{alg}: {admitted} admitted, exact {exact}: {stats:?}"
        );
        assert!(
            admitted + ratelimit_core::DEFAULT_MAX_LEASE >= exact,
            "{alg}: {admitted} admitted, exact {exact}: {stats:?}"
        );
        println!("{alg} above its rate: admitted {admitted} (exact {exact}), {stats:?}");
    }
}

/// The multi-cost script decides exactly as the single-check script called once per cost: the
/// whole conformance table is replayed with every run of checks of one key at one instant sent as
/// one multi-cost call, and every field of every decision is compared with the pure algorithms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_cost_call_decides_as_sequential_checks() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    let store = manual(RedisStore::builder(server.url()), &clock)
        .prefix(unique_prefix("multi"))
        .build()
        .await
        .unwrap();
    let table = common::table();
    let (mut compared, mut batched) = (0, 0);
    for (n, sc) in table.iter().enumerate() {
        let mut reference = common::Reference::default();
        let mut i = 0;
        while i < sc.steps.len() {
            // A run of checks of one key at one instant.
            let first = &sc.steps[i];
            let mut j = i + 1;
            while j < sc.steps.len() && sc.steps[j].at == first.at && sc.steps[j].key == first.key {
                j += 1;
            }
            let mut key = format!("s{n}-").into_bytes();
            key.extend_from_slice(&first.key);
            let costs: Vec<u64> = sc.steps[i..j].iter().map(|s| s.cost).collect();
            let now = first.at;
            let expected: Vec<_> = costs
                .iter()
                .map(|&c| reference.check(&key, &sc.limit, c, now))
                .collect();
            clock.set(now);
            let got = store.check_many(&key, &sc.limit, &costs).await.unwrap();
            assert_eq!(got, expected, "{}: steps {i}..{j} costs {costs:?}", sc.name);
            compared += costs.len();
            if costs.len() > 1 {
                batched += costs.len();
            }
            i = j;
        }
    }
    println!("{compared} decisions compared, {batched} of them in multi-cost calls");
    assert!(batched > 3_000, "{batched}");
    for alg in Algorithm::ALL {
        assert!(
            table
                .iter()
                .any(|s| s.limit.algorithm() == alg && s.limit.quotas().len() > 1),
            "{alg} has a multi-quota scenario"
        );
    }
}

/// 1,000 concurrent checks of one key on one gateway: a handful of script calls, and exactly the
/// capacity admitted, for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalescing_thousand_concurrent_checks() {
    let server = RedisServer::start();
    for alg in Algorithm::ALL {
        let store = RedisStore::builder(server.url())
            .prefix(unique_prefix("coalesce"))
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let coalescing = Coalescing::new(store);
        // 100 a day: nothing refills during the test.
        let limit = Limit::single(alg, Quota::per_day(100).unwrap()).unwrap();
        reset_stats(&server);
        let decisions = common::concurrent_hot_checks(&coalescing, &limit, 1_000).await;
        let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
        let calls = server.script_calls();
        let stats = coalescing.stats();
        assert_eq!(admitted, 100, "{alg}");
        assert_eq!(calls, stats.store_calls, "{alg}: {stats:?}");
        assert_eq!(stats.checks, 1_000, "{alg}");
        assert!(calls <= 50, "{alg}: {calls} calls for 1,000 checks");
        // Every denial says when to retry; every admission's remaining count is distinct.
        common::assert_each_remaining_once(&decisions, 100, &alg.to_string());
        assert!(
            decisions
                .iter()
                .all(|d| d.is_allowed() || d.retry_after().is_some())
        );
        println!(
            "{alg}: 1,000 concurrent checks, {calls} script calls (largest batch {}), admitted \
             {admitted}",
            stats.largest_batch
        );
    }

    // `max_batch` bounds every call: 1,000 checks in batches of at most 10 take at least 100
    // calls, and the count is as exact.
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-max"))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).max_batch(10);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    let admitted = common::concurrent_hot_checks(&coalescing, &limit, 1_000)
        .await
        .iter()
        .filter(|d| d.is_allowed())
        .count();
    let stats = coalescing.stats();
    assert_eq!(admitted, 100);
    assert!(stats.largest_batch <= 10, "{stats:?}");
    assert!(stats.store_calls >= 100, "{stats:?}");
}

/// A batch whose call fails gives every check in it the error (none hangs, none is retried), and
/// the key's queue works again once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_failed_batch_fails_each_check_then_recovers() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-fail"))
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).batch_window(Duration::from_micros(300));
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    server.pause();
    let checks = (0..50).map(|_| coalescing.check(b"k", &limit, 1));
    let results = tokio::time::timeout(Duration::from_secs(10), join_all(checks))
        .await
        .expect("no check hangs");
    server.resume();
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(e) if e.is_unavailable())),
        "{results:?}"
    );
    // Every check was made, and queued, as `join_all` collected them: the first call carried
    // those queued by the end of the batch window (all 50, unless this thread was held up for
    // longer than it), a second call, after the first failed, the rest. A failed call's checks
    // sent again would add calls.
    let stats = coalescing.stats();
    assert_eq!(
        (stats.checks, stats.overflowed, stats.abandoned),
        (50, 0, 0),
        "{stats:?}"
    );
    let expected_calls = if stats.largest_batch == 50 { 1 } else { 2 };
    assert_eq!(stats.store_calls, expected_calls, "{stats:?}");
    // Working again, once Redis has worked through what it was sent while paused (a check may
    // time out meanwhile on a loaded machine): then a fresh burst is admitted (what the failed
    // calls and this wait consumed, if they ran at all, is at most a few hundred of the 1,000).
    let resumed = std::time::Instant::now();
    while coalescing.check(b"k", &limit, 1).await.is_err() {
        assert!(resumed.elapsed() < Duration::from_secs(5), "no recovery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let checks = (0..100).map(|_| coalescing.check(b"k", &limit, 1));
    let admitted = join_all(checks)
        .await
        .into_iter()
        .filter(|r| r.as_ref().unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 100);
}

/// A batch window is capped at `MAX_BATCH_WINDOW` (1 s): `Duration::MAX` would have held every
/// idle key's first check for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_windows_are_capped() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-cap"))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).batch_window(Duration::MAX);
    assert!(
        format!("{coalescing:?}").contains("batch_window: 1s"),
        "{coalescing:?}"
    );
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), coalescing.check(b"k", &limit, 1))
        .await
        .expect("the first check waits the capped window, not for ever");
    assert!(d.unwrap().is_allowed());
}

/// Checks whose callers gave up while queued behind a call in flight are not sent: they spend
/// nothing, as checks never sent would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_does_not_send_checks_whose_callers_gave_up() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-drop"))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let calls = server.script_calls();
    server.pause();
    // One check goes out and waits on the frozen server; ten queue behind it and are dropped.
    let first = tokio::spawn(coalescing.check(b"k", &limit, 1));
    common::until_sent(&coalescing, 1).await;
    for _ in 0..10 {
        drop(coalescing.check(b"k", &limit, 1));
    }
    server.resume();
    assert_eq!(first.await.unwrap().unwrap().remaining(), 999);
    let peek = coalescing.check(b"k", &limit, 0).await.unwrap();
    assert_eq!(peek.remaining(), 999, "the dropped checks spent nothing");
    assert_eq!(
        server.script_calls(),
        calls + 2,
        "the first check and the peek"
    );
}

/// A key's queue holds at most `max_queue` checks: one more is sent on its own, as without the
/// wrapper (not refused: a full queue is no failure of Redis), and so is one that finds the
/// places of callers who gave up still in the queue (they are cleared at their turn, counted as
/// abandoned: a new check in their place would wait at the back of a queue whose front already
/// waited too long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_sends_checks_past_a_full_queue_on_their_own() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-full"))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).max_queue(4);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    reset_stats(&server);
    server.pause();
    // One check goes out and waits on the frozen server; four queue behind it; the sixth finds
    // the queue full and goes on its own.
    let first = tokio::spawn(coalescing.check(b"k", &limit, 1));
    common::until_sent(&coalescing, 1).await;
    let mut queued: Vec<_> = (0..4).map(|_| coalescing.check(b"k", &limit, 1)).collect();
    let alone = tokio::spawn(coalescing.check(b"k", &limit, 1));
    // Two queued callers give up; the next check still goes on its own.
    queued.truncate(2);
    let alone_too = tokio::spawn(coalescing.check(b"k", &limit, 1));
    // Counted as they are sent, at their first poll in their tasks.
    common::until_sent(&coalescing, 3).await;
    assert_eq!(coalescing.stats().overflowed, 2);
    server.resume();
    assert!(first.await.unwrap().unwrap().is_allowed());
    assert!(alone.await.unwrap().unwrap().is_allowed());
    assert!(alone_too.await.unwrap().unwrap().is_allowed());
    for r in join_all(queued).await {
        assert!(r.unwrap().is_allowed());
    }
    // Spent: the first, the two alone, the two queued checks still awaited.
    let peek = coalescing.check(b"k", &limit, 0).await.unwrap();
    assert_eq!(peek.remaining(), 995);
    let stats = coalescing.stats();
    assert_eq!(
        (stats.checks, stats.abandoned, stats.overflowed),
        (8, 2, 2),
        "{stats:?}"
    );
    // The first, the two alone, the batch of two, the peek: what Redis ran.
    assert_eq!(stats.store_calls, 5, "{stats:?}");
    assert_eq!(server.script_calls(), 5);
    // Rode in another's call: one (of the batch of two).
    assert_eq!(stats.checks - stats.abandoned - stats.store_calls, 1);
}

/// A queue of checks of distinct costs gets each its own decision, in queue order: an answer
/// handed to the wrong waiter would show here (all-equal costs would hide it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_answers_each_check_of_a_batch_with_its_own_decision() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-order"))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store);
    // 100 a day, a burst of 100: nothing refills during the test.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_day(100).unwrap()).unwrap();
    server.pause();
    let first = tokio::spawn(coalescing.check(b"k", &limit, 1));
    common::until_sent(&coalescing, 1).await;
    let costs = [3, 0, 200, 2, 95, 1];
    let batch: Vec<_> = costs
        .iter()
        .map(|&c| coalescing.check(b"k", &limit, c))
        .collect();
    server.resume();
    assert_eq!(first.await.unwrap().unwrap().remaining(), 99);
    let got: Vec<_> = join_all(batch)
        .await
        .into_iter()
        .map(|r| {
            let d = r.unwrap();
            (d.is_allowed(), d.can_ever_pass(), d.remaining())
        })
        .collect();
    assert_eq!(
        got,
        [
            (true, true, 96),   // 3
            (true, true, 96),   // a peek
            (false, false, 96), // above the burst: never
            (true, true, 94),   // 2
            (false, true, 94),  // 95 of 94 left
            (true, true, 93),   // 1
        ]
    );
    assert_eq!(coalescing.stats().largest_batch, 6);
}

/// A check made outside a Tokio runtime (the tower layer's `call` needs none; only the poll
/// does) is sent on its own instead of spawning the key's task, which would panic there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_outside_a_runtime_sends_the_check_on_its_own() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-nort"))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    let made = {
        let coalescing = coalescing.clone();
        let limit = limit.clone();
        std::thread::spawn(move || coalescing.check(b"k", &limit, 1))
            .join()
            .expect("made without a runtime, without a panic")
    };
    assert_eq!(made.await.unwrap().remaining(), 999);
    assert_eq!(coalescing.stats().overflowed, 1);
}

/// A key's queue whose task ends before emptying it (here: the task's runtime shuts down during
/// the batch window) is removed: the checks of that key made afterwards start a task of their own
/// and are answered, instead of joining a queue nobody serves.
#[test]
fn coalescing_recovers_from_a_task_that_ended_with_its_runtime() {
    abandoned_then_answered(
        "coalesce-shutdown",
        Duration::from_millis(500),
        |c, limit| {
            // The key's task is spawned on this runtime (the store's is gone), which shuts down
            // during its window.
            let gave_up = common::current_thread_runtime().block_on(async {
                tokio::time::timeout(Duration::from_millis(20), c.check(b"k", limit, 1)).await
            });
            assert!(gave_up.is_err(), "still in the batch window");
        },
    );
}

/// The same when the key's task never ran at all: spawned on a runtime that has shut down, which
/// drops it unpolled. The queue it was made for is removed with it, and its check fails at once.
#[test]
fn coalescing_recovers_from_a_task_dropped_before_its_first_poll() {
    abandoned_then_answered("coalesce-unpolled", Duration::ZERO, |c, limit| {
        // A runtime's handle, entered after the runtime is gone: the key's task is spawned there
        // (the store's runtime is gone too) and dropped at once.
        let gone = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let handle = gone.handle().clone();
        drop(gone);
        let check = {
            let _in = handle.enter();
            c.check(b"k", limit, 1)
        };
        let failed = common::runtime().block_on(check);
        assert!(failed.is_err(), "its task is gone: {failed:?}");
    });
}

/// A key's task is not left on a current-thread runtime that stops being driven: the first check
/// of the key, made on one whose `block_on` returns once it is answered, has the task run on the
/// store's runtime, so that the key's checks from another runtime, queued behind it, are answered
/// (on the idle runtime, the batch after the first was sent, spending its tokens, and never
/// answered; and every later check of the key queued behind it).
#[test]
fn coalescing_a_key_first_checked_on_a_runtime_that_goes_idle_answers_the_others() {
    let main = common::runtime();
    let server = RedisServer::start();
    let store = main.block_on(async {
        RedisStore::builder(server.url())
            .prefix(unique_prefix("coalesce-idle-rt"))
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    });
    let coalescing = Coalescing::new(store);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    // Kept to the end, never driven again once its `block_on` returns.
    let side = common::current_thread_runtime();
    server.pause();
    let (first, second) = std::thread::scope(|s| {
        // Made inside the side runtime (made outside any, it would go on its own).
        let first = s.spawn(|| side.block_on(async { coalescing.check(b"k", &limit, 1).await }));
        main.block_on(common::until_sent(&coalescing, 1));
        // Made on the main runtime: queued behind the first.
        let second = {
            let _in = main.enter();
            coalescing.check(b"k", &limit, 1)
        };
        server.resume();
        (first.join().unwrap(), second)
    });
    assert_eq!(first.unwrap().remaining(), 999);
    assert_eq!(
        coalescing.stats().overflowed,
        0,
        "the first started the key's task"
    );
    let answer = |check: ratelimit_redis::CoalesceFuture| {
        main.block_on(async { tokio::time::timeout(Duration::from_secs(10), check).await })
            .expect("answered")
            .unwrap()
    };
    assert_eq!(answer(second).remaining(), 998);
    assert_eq!(answer(coalescing.check(b"k", &limit, 1)).remaining(), 997);
}

/// A check sent on its own (past a full queue) and dropped before it is ever polled sends nothing
/// and is counted as no call: `store_calls` counts the calls started (one given up after its
/// first poll counts, though redis-rs drops its command if the caller left before it was
/// written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_counts_a_check_sent_alone_as_a_call_only_once_sent() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique_prefix("coalesce-unsent"))
        .build()
        .await
        .unwrap();
    let coalescing = Coalescing::new(store).max_queue(0);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    reset_stats(&server);
    for _ in 0..5 {
        drop(coalescing.check(b"k", &limit, 1));
    }
    // Made and polled once outside a runtime (where it only yields), then dropped.
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut check = std::pin::pin!(coalescing.check(b"k", &limit, 1));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(std::future::Future::poll(check.as_mut(), &mut cx).is_pending());
        });
    });
    assert_eq!(
        coalescing.check(b"k", &limit, 1).await.unwrap().remaining(),
        999
    );
    let stats = coalescing.stats();
    assert_eq!(
        (
            stats.checks,
            stats.store_calls,
            stats.overflowed,
            stats.abandoned
        ),
        (7, 1, 1, 6),
        "{stats:?}"
    );
    assert_eq!(server.script_calls(), 1);
    // None rode in another's call.
    assert_eq!(stats.checks - stats.abandoned - stats.store_calls, 0);
}

/// A check of key `k` that `abandon` starts and gives up on, on a short-lived runtime, then one
/// on the main runtime: answered (not queued forever), and the first never sent. The store is
/// built on a runtime dropped before (else the key's task would run there, not on the
/// short-lived one), and its connection reopened on the main runtime.
fn abandoned_then_answered(
    prefix: &str,
    window: Duration,
    abandon: impl FnOnce(&Coalescing, &Limit),
) {
    let main = common::runtime();
    let server = RedisServer::start();
    let store = common::current_thread_runtime().block_on(async {
        RedisStore::builder(server.url())
            .prefix(unique_prefix(prefix))
            .build()
            .await
            .unwrap()
    });
    let limit = Limit::single(Algorithm::Gcra, Quota::per_day(1_000).unwrap()).unwrap();
    main.block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Peeks, which spend nothing, until the connection is open again.
        while store.check(b"k", &limit, 0).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "never reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let coalescing = Coalescing::new(store).batch_window(window);
    abandon(&coalescing, &limit);
    let answered = main.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), coalescing.check(b"k", &limit, 1)).await
    });
    let decision = answered.expect("answered, not queued forever").unwrap();
    assert_eq!(
        decision.remaining(),
        999,
        "the abandoned check was never sent"
    );
    // Counted as never sent: the stats' coalesced checks (checks − abandoned − calls) are none.
    let stats = coalescing.stats();
    assert_eq!((stats.checks, stats.abandoned), (2, 1), "{stats:?}");
    assert_eq!(stats.checks - stats.abandoned - stats.store_calls, 0);
}
