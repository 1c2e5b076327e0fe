//! A flood of distinct keys: the key count stays at or under the cap, and memory per key is
//! measured (resident set size, from /proc on Linux).
#![forbid(unsafe_code)]

use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn a_million_keys_stay_under_a_cap_of_100_000() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(100_000)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    let rss_before = rss_bytes();
    let mut peak = 0;
    for i in 0..1_000_000u64 {
        // Every key stays live (a token bucket 1 short of full for 600 ms): no key is fresh, so
        // the cap is held by eviction alone.
        assert!(store.check_now(&i.to_le_bytes(), &limit, 1).is_allowed());
        if i % 10_000 == 0 {
            peak = peak.max(store.len());
        }
    }
    let held = store.len();
    assert!(held <= 100_000, "held {held}");
    assert!(peak <= 100_000, "peak {peak}");
    // Eviction frees an eighth of a shard at a time, so the store stays nearly full.
    assert!(held >= 85_000, "held {held}");
    assert!(store.evictions() >= 900_000 - 15_000);
    if let (Some(a), Some(b)) = (rss_before, rss_bytes()) {
        println!(
            "resident growth {} bytes for {held} keys: {} bytes per key",
            b.saturating_sub(a),
            b.saturating_sub(a) / held as u64
        );
    }
}

/// A million live token-bucket keys: the tables hold 16 bytes per bucket at a load between 1/2
/// and 3/4, so at most 32 bytes per key (plus the shards' fixed parts).
#[test]
fn a_million_keys_take_at_most_32_bytes_each() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(2_000_000)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    for i in 0..1_000_000u64 {
        assert!(store.check_now(&i.to_le_bytes(), &limit, 1).is_allowed());
    }
    assert_eq!(store.len(), 1_000_000);
    assert_eq!(store.evictions(), 0);
    let bytes = store.memory_bytes();
    println!(
        "tables: {bytes} bytes for 1,000,000 keys: {:.1} bytes per key",
        bytes as f64 / 1e6
    );
    assert!(bytes <= 32 * 1_000_000 + 64 * 1024, "{bytes} bytes");
    assert!(bytes >= 16 * 1_000_000, "{bytes} bytes");
}

#[test]
fn fresh_keys_are_dropped_without_any_eviction() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(10_000)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
    for round in 0..50u64 {
        for i in 0..5_000u64 {
            let key = (round * 5_000 + i).to_le_bytes();
            assert!(store.check_now(&key, &limit, 1).is_allowed());
        }
        // 100 ms later every bucket is full again: all 5,000 keys are fresh.
        clock.advance(std::time::Duration::from_millis(100));
    }
    assert!(store.len() <= 10_000);
    // 250,000 distinct keys went through a store of 10,000 without losing a live state.
    assert_eq!(store.evictions(), 0);
}

/// A store of one shard holding at most 64 keys, on a manual clock.
fn one_shard_of_64() -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_keys(64)
        .shards(1)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    (clock, store)
}

#[test]
fn evicted_keys_are_the_ones_nearest_to_fresh() {
    let (_clock, store) = one_shard_of_64();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
    // One heavy key: empty bucket, a minute from fresh.
    for _ in 0..10 {
        assert!(store.check_now(b"heavy", &limit, 1).is_allowed());
    }
    // Light keys (6 s from fresh) flood the store past its cap.
    for i in 0..1_000u64 {
        let _ = store.check_now(&i.to_le_bytes(), &limit, 1);
    }
    assert!(store.len() <= 64);
    // The heavy key kept its state: it is still denied.
    assert!(store.check_now(b"heavy", &limit, 1).is_denied());
}

/// At the cap, a sweep that frees only a few fresh states makes room for an eighth of the cap,
/// evicting the states nearest to fresh: otherwise the next few new keys would each bring another
/// sweep of the whole table.
#[test]
fn a_sweep_at_the_cap_makes_room_for_an_eighth() {
    use std::time::Duration;
    let (clock, store) = one_shard_of_64();
    let short = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
    let long = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    // Two states fresh within 100 ms, 62 that stay live for six minutes: the store is full.
    for i in 0..2u64 {
        assert!(store.check_now(&i.to_le_bytes(), &short, 1).is_allowed());
    }
    for i in 2..64u64 {
        assert!(store.check_now(&i.to_le_bytes(), &long, 1).is_allowed());
    }
    assert_eq!((store.len(), store.evictions()), (64, 0));
    clock.advance(Duration::from_secs(1));
    // A new key: the sweep frees the two fresh states and evicts down to 56 before adding it.
    assert!(store.check_now(b"new", &long, 1).is_allowed());
    assert_eq!(store.evictions(), 6);
    assert_eq!(store.len(), 57);
    // Seven more keys fit without another sweep or eviction.
    for i in 100..107u64 {
        assert!(store.check_now(&i.to_le_bytes(), &long, 1).is_allowed());
    }
    assert_eq!((store.len(), store.evictions()), (64, 6));
}

/// `memory_bytes` counts a sliding log's entries (16 bytes each), and a sweep returns them.
#[test]
fn memory_bytes_counts_sliding_logs() {
    use std::time::Duration;
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let empty = store.memory_bytes();
    let limit = Limit::single(Algorithm::SlidingLog, Quota::per_minute(1_000).unwrap()).unwrap();
    for _ in 0..500 {
        assert!(store.check_now(b"k", &limit, 1).is_allowed());
        clock.advance(Duration::from_millis(1));
    }
    assert!(
        store.memory_bytes() >= empty + 500 * 16,
        "{} bytes, {empty} empty",
        store.memory_bytes()
    );
    clock.advance(Duration::from_secs(60));
    store.sweep_now();
    assert!(store.is_empty());
    // As much as a store that never held a key, once swept (each shard keeps a small table).
    let baseline = MemoryStore::new();
    baseline.sweep_now();
    assert_eq!(store.memory_bytes(), baseline.memory_bytes());
}

#[test]
fn bad_store_settings_are_typed_errors() {
    assert!(MemoryStore::builder().max_keys(0).build().is_err());
    assert!(MemoryStore::builder().shards(3).build().is_err());
    assert!(
        MemoryStore::builder()
            .max_keys(4)
            .shards(8)
            .build()
            .is_err()
    );
    // Past the most shards a store takes (each is 192 bytes with its memo): an error, not an
    // allocation that overflows or aborts the process.
    for shards in [1 << 17, 1 << 40, 1 << 60, 1 << 63] {
        assert!(
            MemoryStore::builder()
                .max_keys(usize::MAX)
                .shards(shards)
                .build()
                .is_err(),
            "{shards} shards"
        );
    }
    let most = MemoryStore::builder()
        .max_keys(usize::MAX)
        .shards(1 << 16)
        .build()
        .unwrap();
    assert_eq!(most.max_keys(), usize::MAX - usize::MAX % (1 << 16));
}

/// Regression: a per-shard cap below the sweep threshold (64) once panicked on `clamp`.
#[test]
fn tiny_caps_hold_under_a_flood() {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    for max_keys in 1..=40usize {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .max_keys(max_keys)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        for i in 0..2_000u64 {
            assert!(store.check_now(&i.to_le_bytes(), &limit, 1).is_allowed());
            assert!(
                store.len() <= max_keys,
                "max_keys {max_keys}: {}",
                store.len()
            );
        }
        clock.advance(std::time::Duration::from_secs(1));
        store.sweep_now();
    }
}

/// Past the algorithms' last instant (`MAX_TIME`, the year 2112) time stands still for them, so a
/// state written there never becomes fresh; a sweep must not drop it either, or the key would
/// start over full.
#[test]
fn sweeps_past_the_last_instant_keep_live_states() {
    use ratelimit_core::Timestamp;
    use ratelimit_core::algorithm::MAX_TIME;
    use std::time::Duration;
    let clock = ManualClock::starting_at(Timestamp::from_micros(MAX_TIME + 7_200_000_000));
    let store = MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    assert!(store.check_now(b"a", &limit, 1).is_allowed());
    assert!(!store.check_now(b"a", &limit, 1).is_allowed());
    clock.advance(Duration::from_secs(7_200));
    store.sweep_now();
    assert_eq!(store.len(), 1, "the state is not fresh for the algorithm");
    assert!(!store.check_now(b"a", &limit, 1).is_allowed());
}
