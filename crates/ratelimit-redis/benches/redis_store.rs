//! RedisStore throughput and latency next to the server's own ceiling.
//!
//! Run with: `cargo bench -p ratelimit-redis --bench redis_store`
//! (`BENCH_SECS` per row, default 2; `BENCH_ROUNDS` interleaved rounds, default 3, medians shown;
//! `BENCH_ALGORITHMS=token_bucket,gcra,...`; `BENCH_WORKERS` client runtime threads, default 1;
//! `BENCH_POOL` the store's connections, default the store's default.)
//!
//! Starts its own `redis-server` (through `redis-harness`), then for each algorithm:
//! 1. `redis-benchmark -P 16` sending `EVALSHA` of the very script the store runs, on random keys
//!    of 100,000 users: the server's own ceiling for that script;
//! 2. `RedisStore::check` from 1, 16, 64 and 256 concurrent callers on random keys of 100,000
//!    users: decisions per second, p50 and p99 latency, and the script's server cost
//!    (`INFO commandstats`, `usec_per_call` of `EVALSHA`);
//! 3. for comparison, a deadpool pool of 16 used the usual way, one checkout per call.
//!
//! Besides throughput and latency it shows CPU time per decision, which other load on the machine
//! disturbs far less: the client's (this process, from /proc/self/stat) and redis-server's (from
//! `INFO cpu`, which counts its network work too, unlike `usec_per_call`).
//!
//! The three are interleaved in rounds, and the table shows each row's median over the rounds, so
//! that other load on the machine hits all rows alike.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, script_sha, script_source};
use redis_harness::RedisServer;

const USERS: u64 = 100_000;

struct Row {
    label: String,
    per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    usec_per_call: f64,
    /// CPU time per decision: this process (the client), and redis-server (from INFO cpu).
    client_cpu_us: f64,
    server_cpu_us: f64,
}

/// CPU seconds this process has used (all threads), from /proc/self/stat.
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime is the 12th, stime the 13th.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds redis-server has used (user + system).
fn server_cpu_secs(server: &RedisServer) -> f64 {
    server
        .cli(&["info", "cpu"])
        .lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

fn usec_per_call(server: &RedisServer) -> f64 {
    let info = server.cli(&["info", "commandstats"]);
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Runs `callers` tasks, each checking random keys in a loop for `secs`.
async fn run_callers<F, Fut>(callers: usize, secs: f64, check: F) -> (f64, Histogram<u64>, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let check = Arc::new(check);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (check, stop, done) = (Arc::clone(&check), Arc::clone(&stop), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (c as u64 + 1).wrapping_mul(0x2545_f491);
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut warm = true;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let user = xorshift(&mut rng) % USERS;
                let t = Instant::now();
                check(user).await;
                done.fetch_add(1, Ordering::Relaxed);
                if warm && started.elapsed() > Duration::from_millis(300) {
                    warm = false;
                }
                if !warm {
                    let _ = hist.record(t.elapsed().as_micros().max(1) as u64);
                }
            }
            hist
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let measured_from = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = measured_from.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for t in tasks {
        all.add(t.await.unwrap()).unwrap();
    }
    (
        all.len() as f64 / elapsed,
        all,
        done.load(Ordering::Relaxed),
    )
}

/// `redis-benchmark -P 16` with EVALSHA of the store's script for `limit`, on random keys.
fn redis_benchmark(
    server: &RedisServer,
    store: &RedisStore,
    limit: &Limit,
    requests: usize,
) -> (f64, String) {
    let alg = limit.algorithm();
    let sha = script_sha(alg).unwrap();
    // The key the store would use for user "user:<n>", with redis-benchmark's random number in
    // place of <n>.
    let keys = store.state_keys(b"user:__rand_int__", limit);
    let mut args: Vec<String> = vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        server.port().to_string(),
        "-P".into(),
        "16".into(),
        "-n".into(),
        requests.to_string(),
        "-r".into(),
        USERS.to_string(),
        "-q".into(),
        "EVALSHA".into(),
        sha.to_owned(),
        keys.len().to_string(),
    ];
    args.extend(keys);
    // Server time, cost 1, the quota's parameters: what the store sends (see src/lua/prelude.lua).
    args.extend(["s", "1", "1", "0"].map(String::from));
    let q = limit.quotas()[0];
    match alg {
        Algorithm::TokenBucket | Algorithm::Gcra => args.extend([
            q.burst().to_string(),
            q.scale().to_string(),
            q.refill_per_micro().to_string(),
            q.capacity_units().to_string(),
        ]),
        _ => args.extend([q.limit().to_string(), q.period_micros().to_string()]),
    }
    let out = Command::new("redis-benchmark")
        .args(&args)
        .output()
        .expect("run redis-benchmark (from redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // With -q the last line reads "EVALSHA ...: 123456.79 requests per second, p50=... msec".
    let per_sec = text
        .split(['\r', '\n'])
        .filter_map(|l| l.split(": ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|n| n.parse::<f64>().ok())
        .next_back()
        .unwrap_or(f64::NAN);
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.contains('{') || a.is_empty() {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect();
    (per_sec, format!("redis-benchmark {}", shown.join(" ")))
}

/// `RedisStore::check` from `callers` concurrent tasks on random keys.
async fn store_row(
    server: &RedisServer,
    store: &RedisStore,
    limit: &Limit,
    callers: usize,
    secs: f64,
) -> Row {
    server.cli(&["flushall"]);
    server.cli(&["config", "resetstat"]);
    let (s, l) = (store.clone(), limit.clone());
    let (c0, s0) = (process_cpu_secs(), server_cpu_secs(server));
    let (per_sec, hist, n) = run_callers(callers, secs, move |user| {
        let (s, l) = (s.clone(), l.clone());
        async move {
            let key = format!("user:{user}");
            s.check(key.as_bytes(), &l, 1).await.expect("check");
        }
    })
    .await;
    let (c1, s1) = (process_cpu_secs(), server_cpu_secs(server));
    Row {
        label: format!("RedisStore, {callers} callers"),
        per_sec,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        usec_per_call: usec_per_call(server),
        client_cpu_us: (c1 - c0) * 1e6 / n as f64,
        server_cpu_us: (s1 - s0) * 1e6 / n as f64,
    }
}

/// For comparison: a deadpool pool of 16 used the usual way, one checkout per call (deadpool-redis
/// runs UNWATCH + PING on every recycle), 64 callers.
async fn checkout_row(server: &RedisServer, store: &RedisStore, limit: &Limit, secs: f64) -> Row {
    server.cli(&["flushall"]);
    server.cli(&["config", "resetstat"]);
    let pool = deadpool_redis::Config::from_url(server.url())
        .builder()
        .unwrap()
        .max_size(16)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .unwrap();
    let script = Arc::new(redis::Script::new(
        script_source(limit.algorithm()).unwrap(),
    ));
    let (l, st) = (limit.clone(), store.clone());
    let (c0, s0) = (process_cpu_secs(), server_cpu_secs(server));
    let (per_sec, hist, n) = run_callers(64, secs, move |user| {
        let (p, script) = (pool.clone(), Arc::clone(&script));
        let keys = st.state_keys(format!("user:{user}").as_bytes(), &l);
        let q = l.quotas()[0];
        let alg = l.algorithm();
        async move {
            let mut conn = p.get().await.expect("pool");
            let mut inv = script.prepare_invoke();
            for k in &keys {
                inv.key(k.as_str());
            }
            inv.arg("s").arg(1).arg(1).arg(0);
            match alg {
                Algorithm::TokenBucket | Algorithm::Gcra => {
                    inv.arg(q.burst())
                        .arg(q.scale())
                        .arg(q.refill_per_micro())
                        .arg(q.capacity_units());
                }
                _ => {
                    inv.arg(q.limit()).arg(q.period_micros());
                }
            }
            // One integer (the level reply of a single-quota token bucket or GCRA) or six.
            let _: redis::Value = inv.invoke_async(&mut *conn).await.expect("eval");
        }
    })
    .await;
    let (c1, s1) = (process_cpu_secs(), server_cpu_secs(server));
    Row {
        label: "deadpool checkout per call (16), 64 callers".into(),
        per_sec,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        usec_per_call: usec_per_call(server),
        client_cpu_us: (c1 - c0) * 1e6 / n as f64,
        server_cpu_us: (s1 - s0) * 1e6 / n as f64,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it, and
    // then a short smoke run checks that every part works.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 0.2 } else { 2.0 });
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(if smoke { 1 } else { 3 })
        .max(1);
    let requests: usize = if smoke { 2_000 } else { 200_000 };
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    // The client's runtime threads and the store's connections (BENCH_WORKERS, BENCH_POOL).
    // One client thread by default: with the server on the same two-core machine, client and
    // server each get a core, as a gateway and its Redis would on separate machines.
    let workers = env("BENCH_WORKERS").unwrap_or(1);
    let pool_size = env("BENCH_POOL").unwrap_or(ratelimit_redis::DEFAULT_POOL_SIZE);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    println!(
        "redis-server {} on 127.0.0.1:{}, {} CPUs, {secs} s per row, client: {workers} tokio \
         workers, pool_size {pool_size}",
        server
            .cli(&["info", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?"),
        server.port(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let algorithms: Vec<Algorithm> = match std::env::var("BENCH_ALGORITHMS") {
        Ok(list) => Algorithm::ALL
            .into_iter()
            .filter(|a| list.split(',').any(|n| n == a.name()))
            .collect(),
        Err(_) if smoke => vec![Algorithm::TokenBucket],
        Err(_) => vec![Algorithm::TokenBucket, Algorithm::Gcra],
    };
    runtime.block_on(async {
        let store = RedisStore::builder(server.url())
            .pool_size(pool_size)
            // Generous: a stall of the shared machine must not abort the measurement.
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        for alg in algorithms {
            // 10 per second: random users are almost always allowed, so every call writes.
            let limit = Limit::single(alg, Quota::per_second(10).unwrap()).unwrap();
            let source_lines = script_source(alg).unwrap().lines().count();
            println!(
                "\n== {alg} (script: {source_lines} lines, sha {})",
                script_sha(alg).unwrap()
            );
            let mut samples: Vec<Vec<Row>> = Vec::new();
            let mut ratios = Vec::new();
            for round in 0..rounds {
                let mut rows = Vec::new();
                server.cli(&["flushall"]);
                server.cli(&["config", "resetstat"]);
                let s0 = server_cpu_secs(&server);
                let (ceiling, command) = redis_benchmark(&server, &store, &limit, requests);
                let server_cpu_us = (server_cpu_secs(&server) - s0) * 1e6 / requests as f64;
                if round == 0 {
                    println!("{command}");
                }
                rows.push(Row {
                    label: "redis-benchmark -P 16 (the server's ceiling)".into(),
                    per_sec: ceiling,
                    p50_us: 0,
                    p99_us: 0,
                    usec_per_call: usec_per_call(&server),
                    client_cpu_us: f64::NAN,
                    server_cpu_us,
                });
                for callers in [1, 16, 64, 256] {
                    rows.push(store_row(&server, &store, &limit, callers, secs).await);
                }
                rows.push(checkout_row(&server, &store, &limit, secs).await);
                for r in &rows {
                    assert!(r.per_sec > 0.0, "{}: no decisions measured", r.label);
                }
                let at64 = rows[3].per_sec;
                ratios.push(at64 / ceiling);
                samples.push(rows);
            }
            println!(
                "| {:<46} | {:>12} | {:>8} | {:>8} | {:>14} | {:>11} | {:>11} |",
                "client (median of rounds)",
                "decisions/s",
                "p50 us",
                "p99 us",
                "usec_per_call",
                "client CPU",
                "server CPU"
            );
            println!(
                "|{:-<48}|{:->14}|{:->10}|{:->10}|{:->16}|{:->13}|{:->13}|",
                "", "", "", "", "", "", ""
            );
            for i in 0..samples[0].len() {
                let med_f = |f: &dyn Fn(&Row) -> f64| {
                    let mut v: Vec<f64> = samples.iter().map(|r| f(&r[i])).collect();
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                let lat = |v: f64| {
                    if v == 0.0 {
                        "-".to_owned()
                    } else {
                        format!("{v:.0}")
                    }
                };
                let cpu = |v: f64| {
                    if v.is_nan() {
                        "-".to_owned()
                    } else {
                        format!("{v:.1} us")
                    }
                };
                println!(
                    "| {:<46} | {:>12.0} | {:>8} | {:>8} | {:>14.2} | {:>11} | {:>11} |",
                    samples[0][i].label,
                    med_f(&|r| r.per_sec),
                    lat(med_f(&|r| r.p50_us as f64)),
                    lat(med_f(&|r| r.p99_us as f64)),
                    med_f(&|r| r.usec_per_call),
                    cpu(med_f(&|r| r.client_cpu_us)),
                    cpu(med_f(&|r| r.server_cpu_us)),
                );
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "at 64 callers, RedisStore / redis-benchmark within each round: {}; median {:.0}%",
                ratios
                    .iter()
                    .map(|r| format!("{:.0}%", 100.0 * r))
                    .collect::<Vec<_>>()
                    .join(", "),
                100.0 * ratios[ratios.len() / 2]
            );
        }
    });
}
