//! `MemoryStore` against governor's keyed limiter, in the same run.
//!
//! Run with: `cargo bench -p ratelimit-core --bench memory_store`
//!
//! Cases: one hot key, and 1,000,000 present keys picked at random; each single-threaded and with
//! 2 threads (the time is wall time per check across both threads). Both limiters use the same
//! quota (100 per minute) and read their own real clock on every check.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};

const KEYS: u64 = 1_000_000;
const SAMPLE: usize = 1 << 22;

fn random_keys() -> Vec<u64> {
    // xorshift64*: a fixed, cheap sequence, the same for both limiters.
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    (0..SAMPLE)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D) % KEYS
        })
        .collect()
}

fn run_threads(threads: usize, iters: u64, f: impl Fn(u64, u64) + Sync) -> Duration {
    let per = iters / threads as u64 + 1;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t as u64, per));
        }
    });
    start.elapsed()
}

/// The limit, the random key sample, and both limiters with the same quota (100 per minute),
/// each holding the same 1,000,000 keys.
fn limiters() -> (Limit, Vec<u64>, MemoryStore, DefaultKeyedRateLimiter<u64>) {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
    let ours = MemoryStore::builder().max_keys(2_000_000).build().unwrap();
    let theirs = RateLimiter::keyed(GQuota::per_minute(NonZeroU32::new(100).unwrap()));
    for k in 0..KEYS {
        let _ = ours.check_now(&k.to_le_bytes(), &limit, 1);
        let _ = theirs.check_key(&k);
    }
    (limit, random_keys(), ours, theirs)
}

fn bench(c: &mut Criterion) {
    let (limit, keys, ours, theirs) = limiters();

    let mut g = c.benchmark_group("memory_store");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));

    for threads in [1usize, 2] {
        g.bench_function(BenchmarkId::new("ours/hot_key", threads), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, |_, n| {
                    let key = 7u64.to_le_bytes();
                    for _ in 0..n {
                        black_box(ours.check_now(black_box(&key), &limit, 1));
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("governor/hot_key", threads), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, |_, n| {
                    for _ in 0..n {
                        let _ = black_box(theirs.check_key(black_box(&7u64)));
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("ours/1M_keys", threads), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, |t, n| {
                    let start = (t as usize) * (SAMPLE / 2);
                    for i in start..start + n as usize {
                        let k = keys[i % SAMPLE];
                        black_box(ours.check_now(&k.to_le_bytes(), &limit, 1));
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("governor/1M_keys", threads), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, |t, n| {
                    let start = (t as usize) * (SAMPLE / 2);
                    for i in start..start + n as usize {
                        let k = keys[i % SAMPLE];
                        let _ = black_box(theirs.check_key(&k));
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);

/// Times one batch of `BATCH` checks by `check` on `threads` threads: of key 7 (`hot`) or of the
/// sample's keys from `start` on (each thread its own half of the sample). Returns the wall time
/// per check across all threads, in ns.
fn batch(threads: usize, hot: bool, keys: &[u64], start: usize, check: impl Fn(u64) + Sync) -> f64 {
    const BATCH: u64 = 200_000;
    let elapsed = if hot {
        run_threads(threads, BATCH, |_, n| {
            for _ in 0..n {
                check(7);
            }
        })
    } else {
        run_threads(threads, BATCH, |t, n| {
            let from = start + (t as usize) * (SAMPLE / 2);
            for i in 0..n as usize {
                check(keys[(from + i) % SAMPLE]);
            }
        })
    };
    elapsed.as_nanos() as f64 / BATCH as f64
}

/// Ratios from interleaved rounds: each round times a batch of every case for both limiters, on
/// the same keys, in alternating order, and each keeps its fastest batch. On a shared machine the
/// minimum is far steadier than a mean, and interleaving exposes both limiters to the same
/// background load.
fn ratios() {
    const ROUNDS: usize = 15;
    let (limit, keys, ours, theirs) = limiters();
    let cases = [
        ("hot_key", 1usize),
        ("hot_key", 2),
        ("1M_keys", 1),
        ("1M_keys", 2),
    ];
    // [case][0: ours, 1: governor]
    let mut best = [[f64::INFINITY; 2]; 4];
    // Where the round's 1M-keys batches start in the key sample: the same keys for both
    // limiters, and not the keys the previous round brought into the cache.
    let mut cursor = 0usize;
    for round in 0..ROUNDS {
        for (c, &(case, threads)) in cases.iter().enumerate() {
            let hot = case == "hot_key";
            let start = cursor;
            cursor = (cursor + 200_000) % SAMPLE;
            for turn in 0..2 {
                // Ours first in even rounds, governor first in odd ones.
                let who = (turn + round) % 2;
                let ns = if who == 0 {
                    batch(threads, hot, &keys, start, |k| {
                        black_box(ours.check_now(&black_box(k).to_le_bytes(), &limit, 1));
                    })
                } else {
                    batch(threads, hot, &keys, start, |k| {
                        let _ = black_box(theirs.check_key(&black_box(k)));
                    })
                };
                best[c][who] = best[c][who].min(ns);
            }
        }
    }
    println!(
        "\nInterleaved minimum over {ROUNDS} rounds of 200000 checks (ns per check, wall time across the threads):"
    );
    for (c, &(case, threads)) in cases.iter().enumerate() {
        println!(
            "  {case:<8} {threads} thread(s): ours {:>6.1} ns, governor {:>6.1} ns, governor / ours = {:.2}",
            best[c][0],
            best[c][1],
            best[c][1] / best[c][0]
        );
    }
}

fn main() {
    benches();
    // Only under `cargo bench` (which passes `--bench`): `cargo test --all-targets` runs each
    // benchmark once as a test, and `--profile-time` runs measure one benchmark alone.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--profile-time") {
        ratios();
    }
    Criterion::default().configure_from_args().final_summary();
}
