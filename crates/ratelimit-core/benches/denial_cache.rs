//! `DenialCache` under a flood of distinct clients, each over its limit, when the cache is full
//! against when it has room, in the same run.
//!
//! Run with: `cargo bench -p ratelimit-core --bench denial_cache`
//!
//! Each check is a new client's first, 20,000 a second of (given) time: the store admits it and
//! the admission takes the client's one unit, so the cache records the denial it implies (two
//! entries: the denial and the client's record) until the unit comes back, 1 to 5 s later by
//! client. About 55,000 clients are denied at any time, about 110,000 entries: more than the
//! default capacity (100,000), which is full from the first seconds on, about as many as a cache
//! of 108,000 (the edge: denials end about as fast as new ones come), and far fewer than a cache
//! of a million holds, which sweeps none in the run (its ended entries stay until it fills).
//! The ratios to the last are what a full cache costs a check.
#![forbid(unsafe_code)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratelimit_core::{
    Algorithm, DEFAULT_MAX_DENIALS, DenialCache, Limit, ManualClock, MemoryStore, Quota, Store,
};

/// Given time between two checks: 20,000 new clients a second.
const STEP: Duration = Duration::from_micros(50);
/// Limits of one unit per 1 s to 5 s (in steps of 100 ms), by client.
const PERIODS: u64 = 41;

fn now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory store answers at once"),
    }
}

fn bench(c: &mut Criterion) {
    let limits: Vec<Limit> = (0..PERIODS)
        .map(|i| {
            let quota = Quota::per_period(1, Duration::from_millis(1_000 + 100 * i)).unwrap();
            Limit::single(Algorithm::TokenBucket, quota).unwrap()
        })
        .collect();
    let mut g = c.benchmark_group("denial_cache/flood");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    g.warm_up_time(Duration::from_secs(1));
    // The default capacity, one a little larger (at the edge: about as many entries end as
    // come, and a sweep of a full shard finds only a few to drop), and one with room to spare.
    for (name, max) in [
        ("full", DEFAULT_MAX_DENIALS),
        ("edge", 108_000),
        ("room", 1_000_000),
    ] {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .max_keys(1 << 20)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let cached = DenialCache::new(store, clock.clone())
            .max_entries(max)
            .unwrap();
        let mut client = 0u64;
        let mut one = || {
            client += 1;
            // Spread over the limits by a multiplicative hash, so that neighbours differ.
            let limit =
                &limits[(client.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % limits.len()];
            clock.advance(STEP);
            black_box(now(cached.check(&client.to_le_bytes(), limit, 1)).unwrap());
        };
        // Ten seconds of given time first: the cache in its steady state.
        for _ in 0..200_000 {
            one();
        }
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    one();
                }
                start.elapsed()
            })
        });
        let s = cached.stats();
        eprintln!(
            "{name}: {} entries held of {}, {} denials recorded, {} dropped while they could answer",
            cached.len(),
            cached.capacity(),
            s.inserted,
            s.evicted
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
