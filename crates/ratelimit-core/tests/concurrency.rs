//! Many threads on one key: the lost-update race must be absent.
#![forbid(unsafe_code)]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

const THREADS: usize = 8;
const PER_THREAD: usize = 2_000;

fn hammer(store: &Arc<MemoryStore<ManualClock>>, limit: &Limit, key: &'static [u8]) -> usize {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (store, limit, barrier) = (store.clone(), limit.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..PER_THREAD)
                    .filter(|_| store.check_now(key, &limit, 1).is_allowed())
                    .count()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

/// A store with the default settings on `clock`, to share between threads.
fn store_on(clock: &ManualClock) -> Arc<MemoryStore<ManualClock>> {
    Arc::new(
        MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap(),
    )
}

#[test]
fn one_key_admits_exactly_the_capacity() {
    for algorithm in Algorithm::ALL {
        // The clock does not move, so nothing refills: exactly the capacity may pass.
        let store = store_on(&ManualClock::new());
        let limit = Limit::single(algorithm, Quota::per_hour(1_000).unwrap()).unwrap();
        let admitted = hammer(&store, &limit, b"hot");
        assert_eq!(admitted, 1_000, "{algorithm}");
    }
}

#[test]
fn multi_quota_never_half_consumes_under_contention() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = store_on(&clock);
        // 700 a minute binds while 1,000 an hour would still have room: every denied request
        // had room in the hour quota, so a half-consuming check would drain it.
        let minute = Quota::per_minute(700).unwrap();
        let hour = Quota::per_hour(1_000).unwrap();
        let limit = Limit::new(algorithm, [minute, hour]).unwrap();
        assert_eq!(hammer(&store, &limit, b"hot"), 700, "{algorithm}");

        // Two minutes later the minute quota is full again (for the sliding window too), so a
        // peek reports the hour quota.
        clock.advance(Duration::from_secs(120));
        let peek = store.check_now(b"hot", &limit, 0);
        assert_eq!(peek.quota_index(), 1, "{algorithm}");

        // What the hour quota holds after exactly 700, replayed alone and in order.
        let replay_clock = ManualClock::new();
        let replay = MemoryStore::builder()
            .with_clock(replay_clock.clone())
            .build()
            .unwrap();
        let hour_only = Limit::single(algorithm, hour).unwrap();
        for _ in 0..700 {
            assert!(replay.check_now(b"hot", &hour_only, 1).is_allowed());
        }
        replay_clock.advance(Duration::from_secs(120));
        let expected = replay.check_now(b"hot", &hour_only, 0).remaining();
        assert_eq!(peek.remaining(), expected, "{algorithm}");
    }
}

/// One key checked by many threads while the clock moves: its denials of cost 1 are answered
/// without the lock (the shard's denial memo) while they stand, and each refilled unit must still
/// be admitted exactly once, neither twice nor lost to a denial answered after the unit came.
#[test]
fn a_denied_key_is_admitted_exactly_as_it_refills_while_time_moves() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const CHECKERS: usize = 3;
    const TICKS: u64 = 400;
    const TICK: Duration = Duration::from_micros(500);
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let clock = ManualClock::new();
        let store = store_on(&clock);
        // 1 unit a millisecond, burst 10: 10 + 200 over the 200 ms the clock moves.
        let quota = Quota::per_second(1_000).unwrap().with_burst(10).unwrap();
        let limit = Limit::single(algorithm, quota).unwrap();
        // The burst first: a full bucket would lose the refill of the first ticks.
        let burst = (0..10)
            .filter(|_| store.check_now(b"hot", &limit, 1).is_allowed())
            .count();
        assert_eq!(burst, 10, "{algorithm}");
        let done = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(CHECKERS + 1));
        let handles: Vec<_> = (0..CHECKERS)
            .map(|_| {
                let (store, limit) = (store.clone(), limit.clone());
                let (done, checks, barrier) = (done.clone(), checks.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    let mut admitted = 0;
                    while !done.load(Ordering::Acquire) {
                        admitted += usize::from(store.check_now(b"hot", &limit, 1).is_allowed());
                        checks.fetch_add(1, Ordering::Release);
                    }
                    // The clock has stopped: take what is left at its last time.
                    for _ in 0..20 {
                        admitted += usize::from(store.check_now(b"hot", &limit, 1).is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        barrier.wait();
        for _ in 0..TICKS {
            clock.advance(TICK);
            // Some checker must count at this time before the next tick (else a descheduled set
            // of checkers lets the bucket fill past its burst and units are lost for real): one
            // of CHECKERS + 1 checks finished after this point started after it, so read the
            // new time.
            let seen = checks.load(Ordering::Acquire);
            while checks.load(Ordering::Acquire) < seen + CHECKERS + 1 {
                thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(burst + admitted, 10 + 200, "{algorithm}");
        let last = store.check_now(b"hot", &limit, 1);
        assert!(last.is_denied(), "{algorithm}: {last:?}");
        assert_eq!(
            last.retry_after(),
            Some(Duration::from_millis(1)),
            "{algorithm}"
        );
    }
}
