//! The seed's scenarios, reproduced exactly, through the public store API on a manual clock.
#![forbid(unsafe_code)]

use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Outcome, Quota, Timestamp};

fn store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .expect("valid settings")
}

#[test]
fn capacity_5_refill_2_per_second() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let clock = ManualClock::new();
        let store = store(&clock);
        let limit = Limit::single(
            algorithm,
            Quota::per_second(2).unwrap().with_burst(5).unwrap(),
        )
        .unwrap();

        let first: Vec<bool> = (0..7)
            .map(|_| store.check_now(b"client", &limit, 1).is_allowed())
            .collect();
        assert_eq!(
            first,
            [true, true, true, true, true, false, false],
            "{algorithm}"
        );
        // The 6th request waits exactly one token: 500 ms.
        let d = store.check_now(b"client", &limit, 1);
        assert_eq!(
            d.outcome(),
            Outcome::Denied {
                retry_after: Duration::from_millis(500)
            }
        );

        clock.advance(Duration::from_millis(1_100));
        let second: Vec<bool> = (0..3)
            .map(|_| store.check_now(b"client", &limit, 1).is_allowed())
            .collect();
        assert_eq!(second, [true, true, false], "{algorithm}");
        // 0.2 tokens are left over from the 1.1 s: the next token is 400 ms away.
        let d = store.check_now(b"client", &limit, 1);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_millis(400)),
            "{algorithm}"
        );
    }
}

/// 100 per minute; 150 requests at 59.9 s and 150 at 60.1 s.
fn boundary(algorithm: Algorithm) -> (usize, usize) {
    let clock = ManualClock::starting_at(Timestamp::from_millis(59_900));
    let store = store(&clock);
    let limit = Limit::single(algorithm, Quota::per_minute(100).unwrap()).unwrap();
    let before = (0..150)
        .filter(|_| store.check_now(b"client", &limit, 1).is_allowed())
        .count();
    clock.set(Timestamp::from_millis(60_100));
    let after = (0..150)
        .filter(|_| store.check_now(b"client", &limit, 1).is_allowed())
        .count();
    (before, after)
}

#[test]
fn boundary_experiment_every_algorithm() {
    let table: Vec<(Algorithm, (usize, usize))> =
        Algorithm::ALL.iter().map(|&a| (a, boundary(a))).collect();
    for (a, (before, after)) in &table {
        println!(
            "{a:>15}: {before} at 59.9 s + {after} at 60.1 s = {}",
            before + after
        );
    }
    let total = |a: Algorithm| {
        let (_, (b, c)) = table.iter().find(|(x, _)| *x == a).unwrap();
        b + c
    };
    // The fixed window's boundary problem: twice the limit within 200 ms.
    assert_eq!(boundary(Algorithm::FixedWindow), (100, 100));
    assert_eq!(total(Algorithm::FixedWindow), 200);
    // Every other algorithm holds the limit.
    assert_eq!(total(Algorithm::TokenBucket), 100);
    assert_eq!(total(Algorithm::Gcra), 100);
    assert_eq!(total(Algorithm::SlidingWindow), 100);
    assert_eq!(total(Algorithm::SlidingLog), 100);
}

#[test]
fn cost_zero_is_a_peek_and_too_large_a_cost_never_passes() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = store(&clock);
        let limit = Limit::single(algorithm, Quota::per_second(10).unwrap()).unwrap();
        let peek = store.check_now(b"k", &limit, 0);
        assert!(peek.is_allowed(), "{algorithm}");
        assert_eq!(peek.remaining(), 10, "{algorithm}");
        assert!(store.is_empty(), "{algorithm}: a peek stores nothing");

        assert!(store.check_now(b"k", &limit, 3).is_allowed());
        assert_eq!(
            store.check_now(b"k", &limit, 0).remaining(),
            7,
            "{algorithm}"
        );

        for cost in [11, u64::MAX] {
            let d = store.check_now(b"k", &limit, cost);
            assert_eq!(d.outcome(), Outcome::Exceeds, "{algorithm}");
            assert!(!d.can_ever_pass());
            assert_eq!(d.retry_after(), None);
        }
        assert_eq!(
            store.check_now(b"k", &limit, 0).remaining(),
            7,
            "{algorithm}"
        );
    }
}

#[test]
fn multi_quota_is_all_or_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = store(&clock);
        // 5 per second, and 8 per hour.
        let limit = Limit::new(
            algorithm,
            [Quota::per_second(5).unwrap(), Quota::per_hour(8).unwrap()],
        )
        .unwrap();
        let admitted = (0..10)
            .filter(|_| store.check_now(b"k", &limit, 1).is_allowed())
            .count();
        assert_eq!(admitted, 5, "{algorithm}: the per-second quota binds first");
        let d = store.check_now(b"k", &limit, 1);
        assert_eq!(d.quota_index(), 0);

        clock.advance(Duration::from_secs(2));
        // The hour quota has 3 left; a cost of 4 fits the second but not the hour: nothing is
        // consumed from either.
        let d = store.check_now(b"k", &limit, 4);
        assert!(d.is_denied(), "{algorithm}");
        assert_eq!(d.quota_index(), 1, "{algorithm}");
        assert_eq!(d.remaining(), 3, "{algorithm}");
        let peek = store.check_now(b"k", &limit, 0);
        assert_eq!(peek.remaining(), 3, "{algorithm}");
        // The per-second quota still has all 5.
        assert!(store.check_now(b"k", &limit, 3).is_allowed(), "{algorithm}");
        assert!(store.check_now(b"k", &limit, 1).is_denied(), "{algorithm}");
    }
}

#[test]
fn exact_headers_figures_for_100_per_minute() {
    let clock = ManualClock::new();
    let store = store(&clock);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    let d = store.check_now(b"u", &limit, 1);
    assert_eq!((d.limit(), d.remaining()), (100, 99));
    assert_eq!(d.reset_after(), Duration::from_millis(600));
    for _ in 0..99 {
        assert!(store.check_now(b"u", &limit, 1).is_allowed());
    }
    let d = store.check_now(b"u", &limit, 1);
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), Duration::from_secs(60));
    assert_eq!(d.retry_after(), Some(Duration::from_millis(600)));
}

#[test]
fn time_going_backwards_grants_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::starting_at(Timestamp::from_secs(1_000));
        let store = store(&clock);
        let limit = Limit::single(algorithm, Quota::per_second(3).unwrap()).unwrap();
        for _ in 0..3 {
            assert!(store.check_now(b"k", &limit, 1).is_allowed(), "{algorithm}");
        }
        clock.set(Timestamp::from_secs(10));
        assert!(store.check_now(b"k", &limit, 1).is_denied(), "{algorithm}");
        assert_eq!(
            store.check_now(b"k", &limit, 0).remaining(),
            0,
            "{algorithm}"
        );
    }
}

#[test]
fn far_future_times_saturate_instead_of_overflowing() {
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(
            algorithm,
            [Quota::per_second(3).unwrap(), Quota::per_day(5).unwrap()],
        )
        .unwrap();
        let single = Limit::single(algorithm, Quota::per_day(5).unwrap()).unwrap();
        let store = MemoryStore::new();
        // Every time from 2^52 µs on is the algorithms' last instant: the four checks count at
        // one instant, as four at 2^52 would, with nothing wrapped around to an early time (which
        // would refill) or overflowed.
        for (i, t) in [u64::MAX, u64::MAX - 1, 1 << 60, 1 << 52]
            .into_iter()
            .enumerate()
        {
            let at = Timestamp::from_micros(t);
            let d = store.check_at(b"k", &limit, 1, at);
            // 3 a second binds: the fourth at one instant is denied.
            assert_eq!(d.is_allowed(), i < 3, "{algorithm} at {t}: {d:?}");
            let d = store.check_at(b"k", &single, 1, at);
            assert!(d.is_allowed(), "{algorithm} at {t}: {d:?}");
            assert_eq!(d.remaining(), 4 - i as u64, "{algorithm} at {t}: {d:?}");
        }
    }
}

/// A peek changes no state, whatever the time says: one at an earlier time must not move a state
/// back (a GCRA debt capped at the burst would then forget what was spent), nor one at a later
/// time move it forward. Several quotas, so the memory store keeps the states in full.
#[test]
fn a_peek_at_another_time_changes_nothing() {
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(
            algorithm,
            [
                Quota::per_second(10).unwrap(),
                Quota::per_hour(1_000).unwrap(),
            ],
        )
        .unwrap();
        let store = MemoryStore::new();
        let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
        assert!(
            store.check_at(b"k", &limit, 10, at(100)).is_allowed(),
            "{algorithm}"
        );
        // Peeks before and after, then the same time again: still spent.
        assert!(
            store.check_at(b"k", &limit, 0, at(0)).is_allowed(),
            "{algorithm}"
        );
        assert!(
            store.check_at(b"k", &limit, 0, at(130)).is_allowed(),
            "{algorithm}"
        );
        let again = store.check_at(b"k", &limit, 10, at(100));
        assert!(!again.is_allowed(), "{algorithm}: {again:?}");
    }
}

/// A peek is allowed even when the clock went back within a sliding window and the weighted
/// count there is above the limit (the count admitted at the later time stays).
#[test]
fn a_sliding_window_peek_after_the_clock_went_back_is_allowed() {
    let limit = Limit::single(Algorithm::SlidingWindow, Quota::per_second(10).unwrap()).unwrap();
    let store = MemoryStore::new();
    let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
    assert!(store.check_at(b"k", &limit, 10, at(500)).is_allowed());
    assert!(store.check_at(b"k", &limit, 9, at(1_950)).is_allowed());
    let peek = store.check_at(b"k", &limit, 0, at(1_100));
    assert!(peek.is_allowed(), "{peek:?}");
    assert_eq!(peek.remaining(), 0);
    assert!(!store.check_at(b"k", &limit, 1, at(1_100)).is_allowed());
}

/// The store reads its clock before taking a shard's lock, so two checks can take the lock in the
/// other order than they read the clock; each shard then counts at the latest time it has seen.
/// Seen here with a clock set back: a key first checked after the clock went back counts at the
/// shard's latest time (its fixed window is the one after 10 s, not the one before), while a
/// check at an explicit time (`check_at`) keeps its own time.
#[test]
fn a_shard_never_counts_at_an_earlier_time_than_it_has_seen() {
    let clock = ManualClock::starting_at(Timestamp::from_secs(10));
    let store = MemoryStore::builder()
        .shards(1)
        .with_clock(clock.clone())
        .build()
        .expect("valid settings");
    let limit = Limit::single(Algorithm::FixedWindow, Quota::per_second(1).unwrap()).unwrap();
    let per_10s = Limit::single(
        Algorithm::FixedWindow,
        Quota::per_period(5, Duration::from_secs(10)).unwrap(),
    )
    .unwrap();
    assert!(store.check_now(b"a", &limit, 1).is_allowed());
    clock.set(Timestamp::from_secs(5));
    // At 5 s the window would be [0 s, 10 s) and reset in 5 s; at 10 s it is [10 s, 20 s).
    let d = store.check_now(b"b", &per_10s, 1);
    assert!(d.is_allowed());
    assert_eq!(d.reset_after(), Duration::from_secs(10));
    let d = store.check_at(b"c", &per_10s, 1, Timestamp::from_secs(5));
    assert_eq!(d.reset_after(), Duration::from_secs(5));
    // Once the clock passes the latest time, it counts again.
    clock.set(Timestamp::from_secs(12));
    let d = store.check_now(b"d", &per_10s, 1);
    assert_eq!(d.reset_after(), Duration::from_secs(8));
}
