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

/// A clock that, read from a thread that asked it to, holds that thread after the reading until
/// the test lets it go: the check has its time, and waits for the lock, while the test acts.
struct HoldingClock {
    clock: ManualClock,
    /// `(read, go)`: met once when the held thread has read the clock, once to let it go.
    meet: (Barrier, Barrier),
}

thread_local! {
    static HOLD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl ratelimit_core::Clock for HoldingClock {
    fn now(&self) -> ratelimit_core::Timestamp {
        let now = self.clock.now();
        if HOLD.with(|h| h.replace(false)) {
            self.meet.0.wait();
            self.meet.1.wait();
        }
        now
    }
}

/// `sweep_now` changes no decision of a concurrent `check_now`: a check that read the clock
/// before the sweep but reaches its shard after it counts at the sweep's time, as the shard's
/// latest, not at its own earlier reading against a state the sweep dropped. Here a fixed window
/// of 1 a second, full since 0 s: a check reads 0.3 s and is held; the clock moves to 1.5 s and
/// the sweep drops the state (its window is over). The check is then the first of the window
/// that starts at 1 s (reset 0.5 s later), not a second admission in the window from 0 s
/// (which a sweep at the clock's time, the shard left at 0.3 s, would give: reset 0.7 s later).
#[test]
fn sweep_now_changes_no_decision_of_a_check_that_read_the_clock_before_it() {
    let clock = Arc::new(HoldingClock {
        clock: ManualClock::new(),
        meet: (Barrier::new(2), Barrier::new(2)),
    });
    let store = Arc::new(
        MemoryStore::builder()
            .shards(1)
            .with_clock(Arc::clone(&clock))
            .build()
            .unwrap(),
    );
    let limit = Limit::single(Algorithm::FixedWindow, Quota::per_second(1).unwrap()).unwrap();
    assert!(store.check_now(b"k", &limit, 1).is_allowed());
    clock.clock.advance(Duration::from_millis(300));
    let held = {
        let (store, limit) = (Arc::clone(&store), limit.clone());
        thread::spawn(move || {
            HOLD.with(|h| h.set(true));
            store.check_now(b"k", &limit, 1)
        })
    };
    clock.meet.0.wait();
    // The check has read 0.3 s. The window from 0 s ends; the sweep drops its state.
    clock.clock.advance(Duration::from_millis(1_200));
    store.sweep_now();
    assert_eq!(store.len(), 0, "the window's state was swept");
    clock.meet.1.wait();
    let d = held.join().unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(
        d.reset_after(),
        Duration::from_millis(500),
        "counted at 1.5 s, in the window from 1 s: {d:?}"
    );
    // The window from 1 s is now full: the next check is denied until 2 s.
    let next = store.check_now(b"k", &limit, 1);
    assert_eq!(next.retry_after(), Some(Duration::from_millis(500)));
}
