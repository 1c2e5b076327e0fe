//! `MemoryStore` under a flood of new keys (every check a key never seen, as from an attacker
//! with many addresses), at its cap against with room to spare, in the same run.
//!
//! Run with: `cargo bench -p ratelimit-core --bench new_keys`
//!
//! A token bucket of 100 a minute, on the store's own clock: every state stays live for the whole
//! run, so at the cap every new key evicts (an eighth of a shard at a time, the states nearest
//! to fresh). "cap" is a store of 100,000 keys, full before the measurement; "room" one of 2^25,
//! which the run does not fill (it grows its tables instead). Their ratio is what eviction costs
//! a new key.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};

fn bench(c: &mut Criterion) {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    let mut g = c.benchmark_group("memory_store/new_keys");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    for (name, max_keys) in [("cap", 100_000usize), ("room", 1 << 25)] {
        let store = MemoryStore::builder().max_keys(max_keys).build().unwrap();
        let mut next = 0u64;
        // Full (or, with room, as many keys) before the measurement.
        for _ in 0..200_000 {
            next += 1;
            black_box(store.check_now(&next.to_le_bytes(), &limit, 1));
        }
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    next += 1;
                    black_box(store.check_now(&next.to_le_bytes(), &limit, 1));
                }
                start.elapsed()
            })
        });
        // The longest checks: the ones that rebuild a shard's table (one in about 780 at the
        // cap), timed one by one over a million more new keys.
        let mut times: Vec<u32> = (0..1_000_000)
            .map(|_| {
                next += 1;
                let start = Instant::now();
                black_box(store.check_now(&next.to_le_bytes(), &limit, 1));
                start.elapsed().as_nanos() as u32
            })
            .collect();
        times.sort_unstable();
        eprintln!(
            "{name}: {} keys held of {}, {} evicted; one check by one: p99.9 {} ns, \
             p99.99 {} ns, max {} ns",
            store.len(),
            store.max_keys(),
            store.evictions(),
            times[999_000],
            times[999_900],
            times[999_999]
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
