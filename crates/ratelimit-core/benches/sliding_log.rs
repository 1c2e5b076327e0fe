//! The sliding log in `MemoryStore`, against the sliding-window counter on the same traffic.
//!
//! Run with: `cargo bench -p ratelimit-core --bench sliding_log`
//!
//! One key, 1,000 per second, checked every 100 µs of (given) time: one check in ten is admitted
//! and the key's log holds about 1,000 entries. The sliding-window counter keeps two counters
//! whatever the limit, so its time is the floor the log's is compared with.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota, Timestamp};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sliding_log");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    for alg in [Algorithm::SlidingWindow, Algorithm::SlidingLog] {
        for limit in [100u64, 1_000] {
            let quota = Quota::per_period(limit, Duration::from_millis(limit)).unwrap();
            let limit_ = Limit::single(alg, quota).unwrap();
            let store = MemoryStore::new();
            let mut now = 0u64;
            g.bench_function(BenchmarkId::new(alg.name(), limit), |b| {
                b.iter(|| {
                    now += 100;
                    black_box(store.check_at(b"k", &limit_, 1, Timestamp::from_micros(now)))
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
