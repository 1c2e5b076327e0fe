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

#[test]
fn one_key_admits_exactly_the_capacity() {
    for algorithm in Algorithm::ALL {
        // The clock does not move, so nothing refills: exactly the capacity may pass.
        let store = Arc::new(
            MemoryStore::builder()
                .with_clock(ManualClock::new())
                .build()
                .unwrap(),
        );
        let limit = Limit::single(algorithm, Quota::per_hour(1_000).unwrap()).unwrap();
        let admitted = hammer(&store, &limit, b"hot");
        assert_eq!(admitted, 1_000, "{algorithm}");
    }
}

#[test]
fn multi_quota_never_half_consumes_under_contention() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new();
        let store = Arc::new(
            MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
        );
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
