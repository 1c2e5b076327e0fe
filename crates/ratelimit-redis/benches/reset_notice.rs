//! How soon another gateway hears of a reset: the window in which its `DenialCache` may still
//! deny a client that was just reset, once resets are announced
//! (`RedisStoreBuilder::announce_resets`, `RedisStore::watch_resets`).
//!
//! Run with: `cargo bench -p ratelimit-redis --bench reset_notice`
//! (`BENCH_RESETS` per round, default 2000; `BENCH_ROUNDS`, default 3).
//!
//! Starts its own `redis-server` (through `redis-harness`). Per round, interleaved so that other
//! load on the machine hits both alike: `BENCH_RESETS` resets one after another through a store
//! that does not announce them (the baseline: a reset's round trip), then as many through one
//! that does, each timed from the call to its answer, and to the moment a watch on another store
//! (its own connection, as on another gateway) hands the notice to its handler. Prints, for each,
//! p50 / p99 / max over every round, and the ratios to the baseline's round trip; and how long
//! after the reset's answer the notice came (the window in which another gateway's cache may
//! still deny the client: 0 when the notice came first).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, ResetNotice};
use redis_harness::RedisServer;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn line(name: &str, h: &Histogram<u64>, baseline_p50: u64) {
    println!(
        "{name:<46} p50 {:>6} us   p99 {:>6} us   max {:>7} us   p50 {:>5.2}x the baseline's",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        h.value_at_quantile(0.5) as f64 / baseline_p50.max(1) as f64,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it, and
    // then a short smoke run checks that it works.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let resets = env("BENCH_RESETS", if smoke { 100 } else { 2_000 });
    let rounds = env("BENCH_ROUNDS", if smoke { 1 } else { 3 }).max(1);
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let build = |announce: bool| {
            RedisStore::builder(server.url())
                .prefix("bench-notice")
                .announce_resets(announce)
                .build()
        };
        let quiet = build(false).await.expect("store");
        let announcing = build(true).await.expect("store");
        let watched = build(false).await.expect("store");
        let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let _watch = watched
            .watch_resets(move |notice| {
                let at = Instant::now();
                let key = match notice {
                    ResetNotice::Reset { key, .. } => key.to_vec(),
                    _ => Vec::new(), // subscribed
                };
                let _ = tx.send((key, at));
            })
            .expect("watch");
        let limit = Limit::single(Algorithm::Gcra, Quota::per_minute(100).unwrap()).unwrap();
        let subscribed = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await;
        let (key, _) = subscribed
            .expect("the watch did not subscribe in 10 s")
            .expect("the watch ended");
        assert!(key.is_empty(), "subscribed first");

        let (mut baseline, mut answered, mut after_answer, mut after_call) =
            (histogram(), histogram(), histogram(), histogram());
        // Notices handed to the other store's handler before the reset's own answer came back.
        let mut heard_first = 0u64;
        for round in 0..rounds {
            for i in 0..resets {
                let key = format!("q-{round}-{i}");
                let start = Instant::now();
                quiet.reset(key.as_bytes(), &limit).await.expect("reset");
                baseline.record(start.elapsed().as_micros() as u64).unwrap();
            }
            for i in 0..resets {
                let key = format!("a-{round}-{i}");
                let start = Instant::now();
                announcing
                    .reset(key.as_bytes(), &limit)
                    .await
                    .expect("reset");
                let done = Instant::now();
                let (heard_key, at) = heard.recv().await.expect("the watch ended");
                assert_eq!(heard_key, key.as_bytes(), "notices come in order");
                answered.record((done - start).as_micros() as u64).unwrap();
                after_answer
                    .record(at.saturating_duration_since(done).as_micros() as u64)
                    .unwrap();
                after_call.record((at - start).as_micros() as u64).unwrap();
                heard_first += u64::from(at < done);
            }
        }
        let base = baseline.value_at_quantile(0.5);
        println!(
            "{} resets of each kind, {rounds} rounds interleaved, one at a time, loopback",
            resets * rounds
        );
        line(
            "reset, not announced (baseline round trip)",
            &baseline,
            base,
        );
        line("reset, announced", &answered, base);
        line(
            "notice heard elsewhere, from the reset's call",
            &after_call,
            base,
        );
        line(
            "notice heard elsewhere, after the answer",
            &after_answer,
            base,
        );
        println!(
            "(after the answer: 0 when the notice came first, as {heard_first} of {} did)",
            resets * rounds
        );
    });
}
