//! One run: gateways, the open-loop scheduler, the workers, and the report.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use ratelimit_core::{
    Algorithm, Clock, DEFAULT_MAX_LEASE, DEFAULT_MAX_TTL, DenialCache, Leasing, Limit, MemoryStore,
    Store, SystemClock,
};
use ratelimit_redis::{Coalescing, RedisStore};
use redis::aio::MultiplexedConnection;
use redis_harness::RedisServer;
use tokio::sync::Notify;

use crate::config::{Assign, Config, Mode, StoreKind, Target};
use crate::report::{Report, SecondStats, Sweep};
use crate::schedule::{Sampler, due, due_by, user_key};
use crate::{Error, http};

/// A request that starts this long after its scheduled time counts as behind schedule.
const LATE: Duration = Duration::from_millis(1);
/// How long the in-flight requests of a run may take to finish after the schedule ends.
const GRACE: Duration = Duration::from_secs(15);
/// Latencies are recorded in microseconds; the per-second series up to one minute (a longer
/// latency counts as one minute there), the whole run's up to the longest a request can take.
const MAX_SECOND_LATENCY_US: u64 = 60_000_000;

/// Runs the load `config` describes once and reports what happened. If the store is Redis and
/// no URL is given, a `redis-server` is started for the run (and stopped after it).
pub async fn run(config: &Config) -> Result<Report, Error> {
    config.validate()?;
    let mut config = config.clone();
    let _server = start_redis_if_needed(&mut config)?;
    run_once(&config).await
}

/// Runs `config` at each rate of `config.steps` in turn (or at `config.rate` if there are none),
/// stopping after the first step that is not sustained (see [`Report::sustained`]).
pub async fn sweep(config: &Config) -> Result<Sweep, Error> {
    config.validate()?;
    let mut config = config.clone();
    let _server = start_redis_if_needed(&mut config)?;
    let rates = if config.steps.is_empty() {
        vec![config.rate]
    } else {
        config.steps.clone()
    };
    let steps = run_steps(&rates, config.p99_target, |rate| {
        let mut step = config.clone();
        step.rate = rate;
        async move { run_once(&step).await }
    })
    .await?;
    Ok(Sweep {
        p99_target: config.p99_target,
        steps,
    })
}

/// The reports of `run_at` each of `rates` in turn, up to and including the first not sustained
/// under `p99_target`.
async fn run_steps<F, Fut>(
    rates: &[f64],
    p99_target: Duration,
    mut run_at: F,
) -> Result<Vec<Report>, Error>
where
    F: FnMut(f64) -> Fut,
    Fut: std::future::Future<Output = Result<Report, Error>>,
{
    let mut steps = Vec::new();
    for &rate in rates {
        let report = run_at(rate).await?;
        let ok = report.sustained(p99_target);
        steps.push(report);
        if !ok {
            break;
        }
    }
    Ok(steps)
}

/// The rate `completed` answers from the first scheduled request to the last answer, `elapsed`
/// after it, show for a schedule of `rate` a second. That span holds only `n − 1` of the
/// schedule's `n` intervals: one interval more, so that a schedule kept to the letter reads as
/// its rate.
fn achieved_rate(completed: u64, elapsed: Duration, rate: f64) -> f64 {
    completed as f64 / (elapsed.as_secs_f64() + 1.0 / rate).max(1e-9)
}

/// Starts a `redis-server` for the run if it needs one and was given no URL. A server that does
/// not start (the harness says why: its log, no temporary directory, a `redis-server` that
/// cannot be run) is an error: a usage error if it starts without the `--redis-config` lines
/// (one of them is what it refused).
fn start_redis_if_needed(config: &mut Config) -> Result<Option<RedisServer>, Error> {
    if config.store != StoreKind::Redis || config.redis_url.is_some() {
        return Ok(None);
    }
    // The usual cause, said plainly (the harness would panic with its own message first).
    if !redis_harness::redis_server_installed() {
        return Err(Error::Redis(
            "redis-server or redis-cli not found: install them (Debian: apt-get install \
             redis-server), or give --redis-url"
                .to_owned(),
        ));
    }
    let start = |lines: &[String]| {
        lines
            .iter()
            .fold(RedisServer::builder(), |b, line| b.config(line.as_str()))
            .try_start()
    };
    let server = start(&config.redis_config).map_err(|why| {
        // A server that starts without the `--redis-config` lines refused one of them: a bad
        // argument (exit status 2), whatever its message (a bad directive, an `include` or a
        // `loadmodule` it cannot read, a socket path it cannot bind).
        if !config.redis_config.is_empty() && start(&[]).is_ok() {
            Error::Usage(format!("--redis-config: redis-server refused it: {why}"))
        } else {
            Error::Redis(format!("could not start redis-server: {why}"))
        }
    })?;
    config.redis_url = Some(server.url());
    Ok(Some(server))
}

/// Shared by the scheduler thread and the workers of one run.
struct Shared {
    start: Instant,
    /// `start` on [`clock`](Self::clock), in µs.
    start_us: u64,
    rate: f64,
    total: u64,
    /// Requests `0..released` are due.
    released: AtomicU64,
    /// The next request to claim.
    next: AtomicU64,
    notify: Notify,
    abort: AtomicBool,
    completed: AtomicU64,
    sampler: Sampler,
    /// Per user: requests sent (what each was admitted is in the recorder's `admissions`).
    sent: Vec<AtomicU32>,
    /// Per user: requests that failed (no decision: they test no limit).
    failed: Vec<AtomicU32>,
    rec: Mutex<Recorder>,
    /// The clock the admissions are timed on: the one the in-memory stores count with, so that
    /// the check over every interval measures spans as the stores did (std's `Instant` and this
    /// clock may run at rates some parts per million apart).
    clock: SystemClock,
}

/// What a request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Denied,
    Error,
}

struct Recorder {
    latency: Histogram<u64>,
    /// The longest latency, as measured (a histogram's `max` is the top of its bucket: with 3
    /// significant digits, 5,113 µs reads 5,115, and 5,119 with the per-second series' 2).
    max_us: u64,
    seconds: Vec<Histogram<u64>>,
    /// Each second's longest latency, as measured (at most a minute, as in `seconds`).
    second_max_us: Vec<u64>,
    denied: u64,
    errors: u64,
    late_starts: u64,
    max_start_lateness: Duration,
    last_end: Option<Instant>,
    /// The latest answer on `Shared::clock` (µs).
    last_end_us: u64,
    /// Every admission: user, when its request was sent and when its answer came (µs on
    /// `Shared::clock`), for the check over every interval.
    admissions: Vec<(u32, u64, u64)>,
}

impl Recorder {
    /// A request's latency of `us`, scheduled in second `second` of the run.
    fn latency(&mut self, second: usize, us: u64) {
        self.latency.saturating_record(us);
        self.max_us = self.max_us.max(us);
        if let Some(h) = self.seconds.get_mut(second) {
            let us = us.min(MAX_SECOND_LATENCY_US);
            h.saturating_record(us);
            self.second_max_us[second] = self.second_max_us[second].max(us);
        }
    }
}

impl Shared {
    /// The run's state, its schedule starting `lead` after the tables are built: a Zipf table of
    /// millions of users takes a noticeable time to make, and the requests due meanwhile would
    /// all start late, measured as the limiter's latency.
    fn new(config: &Config, lead: Duration) -> Shared {
        let total = ((config.duration.as_secs_f64() * config.rate).round() as u64).max(1);
        let secs = config.duration.as_secs() as usize + 2;
        let hist = |max: u64, sig| {
            Histogram::new_with_bounds(1, max.max(2), sig)
                .unwrap_or_else(|_| unreachable!("valid histogram bounds"))
        };
        // A request scheduled at the start may be answered at the end of the grace period.
        let max_latency_us = (config.duration + GRACE + Duration::from_secs(1)).as_micros() as u64;
        let sampler = Sampler::new(config);
        let sent = (0..config.users).map(|_| AtomicU32::new(0)).collect();
        let failed = (0..config.users).map(|_| AtomicU32::new(0)).collect();
        let rec = Mutex::new(Recorder {
            latency: hist(max_latency_us, 3),
            max_us: 0,
            seconds: (0..secs).map(|_| hist(MAX_SECOND_LATENCY_US, 2)).collect(),
            second_max_us: vec![0; secs],
            denied: 0,
            errors: 0,
            late_starts: 0,
            max_start_lateness: Duration::ZERO,
            last_end: None,
            last_end_us: 0,
            // At most one per request: never grown (and copied) under the lock mid-run.
            admissions: Vec::with_capacity(total as usize),
        });
        let clock = SystemClock::new();
        let start_us = clock.now().as_micros() + lead.as_micros() as u64;
        Shared {
            start: Instant::now() + lead,
            start_us,
            rate: config.rate,
            total,
            released: AtomicU64::new(0),
            next: AtomicU64::new(0),
            notify: Notify::new(),
            abort: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            sampler,
            sent,
            failed,
            rec,
            clock,
        }
    }

    /// The next due request, waiting until one is due; `None` when the schedule is done.
    async fn claim(&self) -> Option<u64> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a release in between is not missed.
            notified.as_mut().enable();
            loop {
                let n = self.next.load(Ordering::Relaxed);
                if n >= self.total || self.abort.load(Ordering::Relaxed) {
                    return None;
                }
                if n >= self.released.load(Ordering::Acquire) {
                    break;
                }
                if self
                    .next
                    .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    return Some(n);
                }
            }
            notified.await;
        }
    }

    /// Request `i`'s user and scheduled instant.
    fn begin(&self, i: u64) -> (u64, Instant) {
        (self.sampler.user(i), self.start + due(i, self.rate))
    }

    /// Now on the clock the admissions are timed on, in µs.
    fn micros(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// Records request `i`'s answer; `started_us` is [`micros`](Self::micros) when it was sent.
    fn record(
        &self,
        i: u64,
        user: u64,
        scheduled: Instant,
        (started, started_us): (Instant, u64),
        outcome: Outcome,
    ) {
        let end = Instant::now();
        let end_us = self.micros();
        let latency = end.saturating_duration_since(scheduled);
        let lateness = started.saturating_duration_since(scheduled);
        let us = (latency.as_micros() as u64).max(1);
        let second = (i as f64 / self.rate) as usize;
        {
            let mut r = self.rec.lock();
            // Counted under the lock the report is built under, so that it reads a user's sent
            // and failed counts of the same requests.
            self.sent[user as usize].fetch_add(1, Ordering::Relaxed);
            if matches!(outcome, Outcome::Error) {
                self.failed[user as usize].fetch_add(1, Ordering::Relaxed);
            }
            r.latency(second, us);
            match outcome {
                Outcome::Admitted => r.admissions.push((user as u32, started_us, end_us)),
                Outcome::Denied => r.denied += 1,
                Outcome::Error => r.errors += 1,
            }
            if lateness > LATE {
                r.late_starts += 1;
            }
            r.max_start_lateness = r.max_start_lateness.max(lateness);
            if r.last_end.is_none_or(|t| t < end) {
                r.last_end = Some(end);
            }
            r.last_end_us = r.last_end_us.max(end_us);
        }
        self.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Releases requests as they fall due, on its own thread (a std sleep is precise to tens of
/// microseconds; tokio's timer to a millisecond).
fn scheduler(shared: Arc<Shared>, wake_limit: usize, tick: Duration) {
    let mut released = 0;
    while released < shared.total && !shared.abort.load(Ordering::Relaxed) {
        let elapsed = shared.start.elapsed();
        let now_due = due_by(elapsed, shared.rate).min(shared.total);
        if now_due > released {
            shared.released.store(now_due, Ordering::Release);
            for _ in 0..(now_due - released).min(wake_limit as u64) {
                shared.notify.notify_one();
            }
            released = now_due;
        }
        if released >= shared.total {
            break;
        }
        let next = due(released, shared.rate);
        let wait = next.saturating_sub(shared.start.elapsed()).max(tick);
        std::thread::sleep(wait);
    }
    shared.notify.notify_waiters();
}

/// The Redis server's clock (`TIME`, µs) against `clock`, read around it: (the midpoint of the two
/// readings of `clock`, the server's time, half the round trip).
async fn server_time(
    conn: &mut MultiplexedConnection,
    clock: &SystemClock,
) -> Result<(u64, u64, u64), Error> {
    let mut best: Option<(u64, u64, u64)> = None;
    // The reading with the shortest round trip of a few.
    for _ in 0..5 {
        let before = clock.now().as_micros();
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(conn)
            .await
            .map_err(|e| Error::Redis(e.to_string()))?;
        let after = clock.now().as_micros();
        let half = after.saturating_sub(before) / 2;
        let reading = (before + half, secs * 1_000_000 + micros, half);
        if best.is_none_or(|b| reading.2 < b.2) {
            best = Some(reading);
        }
    }
    best.ok_or_else(|| Error::Redis("no TIME reading".into()))
}

/// How much faster than the tool's clock the server's ran between two [`server_time`] readings,
/// at most (a fraction; 0 if it ran slower), counting the readings' uncertainty against it. A
/// Redis store on server time decides on the server's wall clock, whose rate may differ from the
/// tool's (quanta's TSC rate, calibrated once per process against the OS clock; NTP adjusting the
/// wall clock's rate), and the exactness checks measure spans on the tool's.
fn server_faster(before: (u64, u64, u64), after: (u64, u64, u64)) -> f64 {
    let tool = after.0.saturating_sub(before.0);
    if tool == 0 {
        return 0.0;
    }
    let server = after.1 as f64 - before.1 as f64;
    let uncertainty = (before.2 + after.2) as f64;
    ((server + uncertainty) / tool as f64 - 1.0).max(0.0)
}

/// A connection of the tool's own to the Redis server, for the measurements around a run.
async fn connect(url: &str) -> Result<MultiplexedConnection, Error> {
    let client = redis::Client::open(url).map_err(|e| Error::Redis(e.to_string()))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Error::Redis(e.to_string()))
}

/// [`eval_calls`] and [`server_time`], read on `conn`.
async fn readings(
    conn: &mut MultiplexedConnection,
    clock: &SystemClock,
) -> Result<(u64, (u64, u64, u64)), Error> {
    Ok((eval_calls(conn).await?, server_time(conn, clock).await?))
}

/// Calls of EVAL and EVALSHA the server has answered, from `INFO commandstats`.
async fn eval_calls(conn: &mut MultiplexedConnection) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| Error::Redis(e.to_string()))?;
    Ok(redis_harness::script_calls(&info))
}

/// Counters of the wrappers (denial caches, leasing) of a run, summed over the gateways:
/// (checks answered locally, checks passed to the store).
type WrapperStats = Box<dyn Fn() -> (u64, u64) + Send + Sync>;

/// What a run's gateways are, for the report.
struct Setup {
    cache_stats: Option<WrapperStats>,
    /// How far above the exact bound the mode may admit.
    tolerance: Tolerance,
}

impl Setup {
    fn plain() -> Setup {
        Setup {
            cache_stats: None,
            tolerance: Tolerance::Exact,
        }
    }
}

/// How far above the exact bound a mode may admit, by its documented guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tolerance {
    /// Not at all: the mode's decisions are the store's.
    Exact,
    /// This many units in any span (leasing on a bucket: one lease, whatever the gateways).
    Once(u64),
    /// This many units per period the bound counts (leasing on a sliding window or log:
    /// `G × (L − 1)` in any window of one period).
    PerPeriod(u64),
}

impl Tolerance {
    /// Leasing's guarantee for `config`'s algorithm (see `ratelimit_core::Leasing`).
    fn leasing(config: &Config) -> Tolerance {
        // A lease holds at most the limit's largest cost (a bucket's burst, a window's limit).
        // (The settings were validated before any run: their limit builds.)
        let lease = config.lease_size.unwrap_or(DEFAULT_MAX_LEASE);
        let lease = config
            .build_limit()
            .map_or(lease, |limit| lease.min(limit.max_cost()));
        // With users assigned to a gateway each, a user's units are leased by one gateway.
        let gateways = match config.assign {
            Assign::UserHash => 1,
            Assign::RoundRobin => config.gateways as u64,
        };
        match config.algorithm {
            // `burst + r × (T + ttl)`: one lifetime's refill more, and a lease lives at most the
            // time it takes to refill (so `r × ttl ≤ L`) and at most `DEFAULT_MAX_TTL`.
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let period = config.period.as_micros().max(1);
                let refilled =
                    (u128::from(config.limit) * DEFAULT_MAX_TTL.as_micros()).div_ceil(period);
                Tolerance::Once(lease.min(u64::try_from(refilled).unwrap_or(u64::MAX)))
            }
            // A lease never outlives its window.
            Algorithm::FixedWindow => Tolerance::Exact,
            _ => Tolerance::PerPeriod(gateways.saturating_mul(lease.saturating_sub(1))),
        }
    }

    /// The units it allows over a span of `elapsed`.
    fn over(self, config: &Config, elapsed: Duration) -> u64 {
        match self {
            Tolerance::Exact => 0,
            Tolerance::Once(n) => n,
            Tolerance::PerPeriod(n) => n.saturating_mul(config.periods_in_bound(elapsed)),
        }
    }

    /// The units, once or per period.
    fn units(self) -> u64 {
        match self {
            Tolerance::Exact => 0,
            Tolerance::Once(n) | Tolerance::PerPeriod(n) => n,
        }
    }
}

/// Added to every span the bounds are taken over: admissions are timed on the clock the in-memory
/// stores count with (`Shared::clock`), but in whole microseconds read at other instants, so the
/// span the store counted may be a microsecond or so longer than the one the tool measured.
const CLOCK_SLACK: Duration = Duration::from_micros(2);

/// Added to every span of a run against a Redis store on server time, besides the measured rate
/// difference ([`server_faster`], an average over the run): a step or a burst of slewing of the
/// server's wall clock within the run counts fully in a short interval. A run at 2026-12-01 16:15
/// UTC reported one user above the bound in some interval in both Redis runs of `tests/runs.rs`
/// at once (a request 0.5 ms before a refill by the tool's clock, admitted by the server), and
/// none of three runs right after did; the cause was not established. It lets through what the
/// limit admits in 1 ms more than the exact bound: one refill for a bucket that refills at most
/// every millisecond (up to 1,000 a second per user), ⌈1 ms / refill interval⌉ for a faster one,
/// and for a window, a whole window's limit more in an interval within 1 ms of spanning another.
const SERVER_CLOCK_SLACK: Duration = Duration::from_millis(1);

/// How the store's clock may differ from the tool's, for the bounds: it may run up to `faster`
/// (a fraction: 0.001 is 1,000 ppm) faster, and be `ahead` more in any span.
#[derive(Debug, Clone, Copy, Default)]
struct ClockAllowance {
    faster: f64,
    ahead: Duration,
}

impl ClockAllowance {
    /// The longest span the store may have counted where the tool measured `elapsed`.
    fn span(self, elapsed: Duration) -> Duration {
        elapsed.mul_f64(1.0 + self.faster) + self.ahead + CLOCK_SLACK
    }
}

/// The most a user may be admitted over a span of `elapsed` (on the tool's clock) in this mode.
fn bound_with(
    config: &Config,
    tolerance: Tolerance,
    elapsed: Duration,
    clocks: ClockAllowance,
) -> u64 {
    let span = clocks.span(elapsed);
    config
        .admission_bound(span)
        .saturating_add(tolerance.over(config, span))
}

/// Wraps each gateway's store as `config.mode` says, then evaluates the body with the wrapped
/// gateways and their [`Setup`] bound to the given names (one expansion per store type).
macro_rules! with_mode {
    ($config:expr, $base:expr, |$gws:ident, $setup:ident| $body:expr) => {{
        let base = $base;
        match $config.mode {
            Mode::Exact => {
                let $gws = base;
                let $setup = Setup::plain();
                $body
            }
            Mode::DenialCache => {
                let $gws: Vec<_> = base
                    .into_iter()
                    .map(|s| Arc::new(DenialCache::new(s, SystemClock::new())))
                    .collect();
                let $setup = wrapper_setup(
                    &$gws,
                    |g| {
                        let s = g.stats();
                        (s.hits, s.store_calls)
                    },
                    Tolerance::Exact,
                );
                $body
            }
            Mode::Coalesce => Err(Error::Usage("--mode coalesce needs --store redis".into())),
            Mode::Leasing => {
                let $gws = base
                    .into_iter()
                    .map(|s| {
                        let b = Leasing::builder(s, SystemClock::new());
                        match $config.lease_size {
                            Some(n) => b.lease_size(n),
                            None => b,
                        }
                        .build()
                        .map(Arc::new)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let $setup = wrapper_setup(
                    &$gws,
                    |g| {
                        let s = g.stats();
                        (s.local, s.store_calls)
                    },
                    Tolerance::leasing(&$config),
                );
                $body
            }
        }
    }};
}

async fn run_once(config: &Config) -> Result<Report, Error> {
    let limit = config.build_limit()?;
    let url = config.redis_url.clone();
    let prefix = format!(
        "rl-load:{}:{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let redis = |n: usize| {
        let url = url.clone();
        let prefix = prefix.clone();
        let pool = config.pool_size;
        let slack = config.expiry_slack;
        async move {
            let url = url.ok_or_else(|| Error::Redis("no Redis URL".into()))?;
            let mut stores = Vec::with_capacity(n);
            for _ in 0..n {
                let s = RedisStore::builder(url.as_str())
                    .prefix(prefix.as_str())
                    .pool_size(pool)
                    .expiry_slack(slack)
                    .build()
                    .await
                    .map_err(|e| match e {
                        // A setting the store refuses is a bad argument (exit status 2), named
                        // as the tool's argument.
                        ratelimit_redis::RedisStoreError::Config { name, .. } => {
                            let argument = match name {
                                "url" => "--redis-url",
                                "pool_size" => "--pool-size",
                                "expiry_slack" => "--expiry-slack-ms",
                                _ => "a Redis setting",
                            };
                            Error::Usage(format!("{argument}: {e}"))
                        }
                        e => Error::Redis(e.to_string()),
                    })?;
                stores.push(s);
            }
            Ok::<_, Error>(stores)
        }
    };
    // Every user's state must stay for the run: an evicted user starts again from a full quota,
    // which the exactness check would blame on the limiter. The cap is split over the store's
    // shards, so it leaves each shard four times its expected share (and at least 64 keys).
    let made = std::sync::Mutex::new(Vec::new());
    let memory = || {
        let store = Arc::new(
            MemoryStore::builder()
                .max_keys(
                    (config.users as usize)
                        .saturating_add(64)
                        .saturating_mul(4)
                        .max(4_096),
                )
                .build()
                .unwrap_or_else(|_| unreachable!("a valid key cap")),
        );
        made.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&store));
        store
    };
    let n = config.gateways;
    let report = match (config.target, config.store) {
        (Target::Store, StoreKind::Memory) => {
            with_mode!(config, vec![memory(); n], |gws, setup| {
                drive_store(config, limit, gws, setup).await
            })
        }
        (Target::Store, StoreKind::MemoryPerGateway) => {
            let gws: Vec<_> = (0..n).map(|_| memory()).collect();
            with_mode!(config, gws, |gws, setup| {
                drive_store(config, limit, gws, setup).await
            })
        }
        (Target::Store, StoreKind::Redis) if config.mode == Mode::Coalesce => {
            let (gws, setup) = coalescing(redis(n).await?);
            drive_store(config, limit, gws, setup).await
        }
        (Target::Store, StoreKind::Redis) => {
            with_mode!(config, redis(n).await?, |gws, setup| {
                drive_store(config, limit, gws, setup).await
            })
        }
        (Target::Store, StoreKind::None) => {
            Err(Error::Usage("--store none needs --target http".into()))
        }
        (Target::Http, StoreKind::None) => {
            let routers = (0..n).map(|_| http::bare()).collect();
            drive_http(config, routers, Setup::plain()).await
        }
        (Target::Http, StoreKind::Memory) => {
            with_mode!(config, vec![memory(); n], |gws, setup| {
                layered_http(config, &limit, gws, setup).await
            })
        }
        (Target::Http, StoreKind::MemoryPerGateway) => {
            let gws: Vec<_> = (0..n).map(|_| memory()).collect();
            with_mode!(config, gws, |gws, setup| {
                layered_http(config, &limit, gws, setup).await
            })
        }
        (Target::Http, StoreKind::Redis) if config.mode == Mode::Coalesce => {
            let (gws, setup) = coalescing(redis(n).await?);
            layered_http(config, &limit, gws, setup).await
        }
        (Target::Http, StoreKind::Redis) => {
            with_mode!(config, redis(n).await?, |gws, setup| {
                layered_http(config, &limit, gws, setup).await
            })
        }
    };
    let mut report = report?;
    let made = made.into_inner().unwrap_or_else(|e| e.into_inner());
    if !made.is_empty() {
        report.memory_evictions = Some(made.iter().map(|s| s.evictions()).sum());
    }
    Ok(report)
}

/// Wraps each gateway's Redis store in `Coalescing`; its local answers are the checks that
/// shared another check's script call.
fn coalescing(stores: Vec<RedisStore>) -> (Vec<Arc<Coalescing>>, Setup) {
    let gws: Vec<_> = stores
        .into_iter()
        .map(|s| Arc::new(Coalescing::new(s)))
        .collect();
    let setup = wrapper_setup(
        &gws,
        |g| {
            let s = g.stats();
            // The checks sent are the checks made but those whose callers gave up first.
            let sent = s.checks.saturating_sub(s.abandoned);
            (sent.saturating_sub(s.store_calls), s.store_calls)
        },
        Tolerance::Exact,
    );
    (gws, setup)
}

fn wrapper_setup<W: Send + Sync + 'static>(
    gws: &[Arc<W>],
    stats: fn(&W) -> (u64, u64),
    tolerance: Tolerance,
) -> Setup {
    let gws: Vec<Arc<W>> = gws.to_vec();
    Setup {
        cache_stats: Some(Box::new(move || {
            gws.iter().fold((0, 0), |(l, c), g| {
                let (gl, gc) = stats(g);
                (l + gl, c + gc)
            })
        })),
        tolerance,
    }
}

async fn layered_http<S>(
    config: &Config,
    limit: &Limit,
    gateways: Vec<S>,
    setup: Setup,
) -> Result<Report, Error>
where
    S: Store,
{
    let routers = gateways
        .into_iter()
        .map(|g| http::layered(g, limit))
        .collect::<Result<_, _>>()?;
    drive_http(config, routers, setup).await
}

async fn drive_store<S>(
    config: &Config,
    limit: Limit,
    gateways: Vec<S>,
    setup: Setup,
) -> Result<Report, Error>
where
    S: Store,
{
    // Warm up every gateway (connections, script cache) on keys no user has.
    for (g, gw) in gateways.iter().enumerate() {
        let key = format!("warmup:{g}");
        gw.check(key.as_bytes(), &limit, 1)
            .await
            .map_err(|e| Error::Redis(format!("warm-up check failed: {e}")))?;
    }
    let gateways = Arc::new(gateways);
    let limit = Arc::new(limit);
    let assign = config.assign;
    let spawn = move |shared: Arc<Shared>, _w: usize| {
        let (gateways, limit) = (gateways.clone(), limit.clone());
        tokio::spawn(async move {
            let n = gateways.len() as u64;
            let mut buf = [0u8; 24];
            while let Some(i) = shared.claim().await {
                let (user, scheduled) = shared.begin(i);
                let g = match assign {
                    Assign::RoundRobin => i % n,
                    Assign::UserHash => user % n,
                } as usize;
                let started = (Instant::now(), shared.micros());
                let fut = gateways[g].check(user_key(&mut buf, user), &limit, 1);
                let outcome = match fut.await {
                    Ok(d) if d.is_allowed() => Outcome::Admitted,
                    Ok(_) => Outcome::Denied,
                    Err(_) => Outcome::Error,
                };
                shared.record(i, user, scheduled, started, outcome);
            }
        })
    };
    drive(config, setup, config.effective_concurrency(), spawn).await
}

async fn drive_http(
    config: &Config,
    routers: Vec<axum::Router>,
    setup: Setup,
) -> Result<Report, Error> {
    let servers = http::serve_all(routers).await?;
    let addrs: Vec<_> = servers.iter().map(|s| s.addr).collect();
    // Every connection is opened (and answers once) before the clock starts.
    let mut conns = Vec::with_capacity(config.effective_concurrency());
    for c in 0..config.effective_concurrency() {
        let addr = addrs[c % addrs.len()];
        let mut conn = http::Conn::connect(addr).await?;
        // Admitted, or denied by another connection's warm-up of the same key; anything else (a
        // store failing behind the layer, a broken router) would be measured as the run's errors.
        let status = conn.request(b"warmup").await?;
        if !matches!(status, 200 | 429) {
            return Err(Error::Io(std::io::Error::other(format!(
                "the warm-up request to {addr} was answered {status} (200 or 429 expected)"
            ))));
        }
        conns.push(Mutex::new(Some(conn)));
    }
    let conns = Arc::new(conns);
    let spawn = move |shared: Arc<Shared>, w: usize| {
        let conns = conns.clone();
        tokio::spawn(async move {
            let Some(mut conn) = conns[w].lock().take() else {
                return;
            };
            let mut buf = [0u8; 24];
            while let Some(i) = shared.claim().await {
                let (user, scheduled) = shared.begin(i);
                let started = (Instant::now(), shared.micros());
                let outcome = match conn.request(user_key(&mut buf, user)).await {
                    Ok(200) => Outcome::Admitted,
                    Ok(429) => Outcome::Denied,
                    // An error (the connection's next request starts over on a new one).
                    _ => Outcome::Error,
                };
                shared.record(i, user, scheduled, started, outcome);
            }
        })
    };
    let report = drive(config, setup, config.effective_concurrency(), spawn).await;
    // Stopped here, as on every early return above (`Server`'s drop).
    drop(servers);
    report
}

/// Runs the scheduler and `workers` workers made by `spawn`, shows progress, and builds the
/// report.
async fn drive<F>(config: &Config, setup: Setup, workers: usize, spawn: F) -> Result<Report, Error>
where
    F: Fn(Arc<Shared>, usize) -> tokio::task::JoinHandle<()>,
{
    let mut probe = match (&config.redis_url, config.store) {
        (Some(url), StoreKind::Redis) => Some(connect(url).await?),
        _ => None,
    };
    // Every `SystemClock` of the process reads quanta's one calibration: this one runs at the rate
    // of the one the admissions are timed on.
    let clock = SystemClock::new();
    let before = match &mut probe {
        Some(conn) => Some(readings(conn, &clock).await?),
        None => None,
    };
    let cache_before = setup.cache_stats.as_ref().map(|f| f());

    let shared = Arc::new(Shared::new(config, Duration::from_millis(20)));
    let handles: Vec<_> = (0..workers).map(|w| spawn(shared.clone(), w)).collect();
    let sched = {
        let shared = shared.clone();
        let tick = config.tick;
        std::thread::Builder::new()
            .name("ratelimit-load-scheduler".into())
            .spawn(move || {
                let wait = shared.start.saturating_duration_since(Instant::now());
                std::thread::sleep(wait);
                scheduler(shared, workers, tick);
            })?
    };

    let bar = progress_bar(config, shared.total);
    let progress = bar.clone().map(|bar| {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut last = (0u64, Instant::now());
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let done = shared.completed.load(Ordering::Relaxed);
                let now = Instant::now();
                let rate = (done - last.0) as f64 / now.duration_since(last.1).as_secs_f64();
                last = (done, now);
                bar.set_position(done);
                bar.set_message(format!("{rate:>8.0}/s"));
            }
        })
    });

    let deadline = config.duration + GRACE;
    let mut timed_out = false;
    let aborts: Vec<_> = handles.iter().map(|h| h.abort_handle()).collect();
    let all = async {
        for h in handles {
            let _ = h.await;
        }
    };
    if tokio::time::timeout(deadline, all).await.is_err() {
        timed_out = true;
        shared.abort.store(true, Ordering::Relaxed);
        shared.notify.notify_waiters();
        // Workers still waiting for an answer stop there: none records a request while the
        // report is made (under the lock its records take).
        for a in &aborts {
            a.abort();
        }
    }
    shared.abort.store(true, Ordering::Relaxed);
    let _ = tokio::task::spawn_blocking(move || sched.join()).await;
    if let Some(p) = progress {
        p.abort();
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    // The server's figures after the run, or why they could not be read.
    let server = match (&mut probe, before, &config.redis_url) {
        // Saturating: a server whose statistics were reset during the run (`CONFIG RESETSTAT`,
        // a restart) counts fewer calls after than before.
        (Some(conn), Some((calls, time)), Some(url)) => {
            // The probe's connection sat idle for the whole run: a server's `timeout` may have
            // closed it, or a stall outlast its reply timeout. Read again on a new one before
            // giving up the server's figures.
            let after = match readings(conn, &clock).await {
                Ok(after) => Ok(after),
                Err(_) => async { readings(&mut connect(url).await?, &clock).await }.await,
            };
            match after {
                Ok(after) => ServerAfter::Read {
                    calls: after.0.saturating_sub(calls),
                    faster: server_faster(time, after.1),
                },
                // Redis gone by the end of the run (killed, stopped, unreachable): the run's
                // own figures are kept, and the report says what is missing.
                Err(e) => ServerAfter::Unread(e.to_string()),
            }
        }
        _ => ServerAfter::None,
    };
    let cache_after = setup.cache_stats.as_ref().map(|f| f());
    // On a blocking thread: the interval check is O(n²) for a user admitted n times (seconds for
    // hundreds of thousands, hours for millions), and the runtime's thread must stay free for the
    // Ctrl-C or SIGTERM that ends the tool meanwhile (see `main`).
    let config = config.clone();
    let tolerance = setup.tolerance;
    let report = tokio::task::spawn_blocking(move || {
        build_report(
            &config,
            &shared,
            tolerance,
            timed_out,
            server,
            cache_before
                .zip(cache_after)
                .map(|(b, a)| (a.0 - b.0, a.1 - b.1)),
        )
    })
    .await;
    // A panic in the report is the tool's bug: raised here as it would have been inline.
    Ok(report.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
}

fn progress_bar(config: &Config, total: u64) -> Option<ProgressBar> {
    if config.quiet || config.json || !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} decisions {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

/// What the Redis server told after a run.
enum ServerAfter {
    /// No Redis store.
    None,
    /// The script calls it answered during the run, and how much faster its clock ran than the
    /// tool's ([`server_faster`]).
    Read { calls: u64, faster: f64 },
    /// It could not be read (gone by the end of the run): why.
    Unread(String),
}

fn build_report(
    config: &Config,
    shared: &Shared,
    tolerance: Tolerance,
    timed_out: bool,
    server: ServerAfter,
    cache: Option<(u64, u64)>,
) -> Report {
    let (clocks, redis_calls, server_faster, redis_unread) = match server {
        ServerAfter::None => (ClockAllowance::default(), None, None, None),
        ServerAfter::Read { calls, faster } => (
            ClockAllowance {
                faster,
                ahead: SERVER_CLOCK_SLACK,
            },
            Some(calls),
            Some(faster),
            None,
        ),
        // Its clock's rate is not known: only the step allowance is made (the report says so).
        ServerAfter::Unread(why) => (
            ClockAllowance {
                faster: 0.0,
                ahead: SERVER_CLOCK_SLACK,
            },
            None,
            None,
            Some(why),
        ),
    };
    let rec = shared.rec.lock();
    let completed = rec.latency.len();
    let elapsed = rec
        .last_end
        .map_or_else(|| shared.start.elapsed(), |t| t - shared.start);
    // The whole run's bound over its span on the clock the admissions (and the in-memory stores,
    // and the server clock's allowance) are measured on, not std's `Instant`, whose rate may be
    // some parts per million apart: over a long run of a heavy user, enough for a refill.
    let end_us = if rec.last_end.is_some() {
        rec.last_end_us
    } else {
        shared.micros()
    };
    let span = Duration::from_micros(end_us.saturating_sub(shared.start_us));
    let bound = config.admission_bound(clocks.span(span));
    let bound_tolerated = bound_with(config, tolerance, span, clocks);
    let mut users_seen = 0;
    let mut max_admitted = 0;
    let mut users_above = 0;
    let mut users_tested = 0;
    let mut users_above_tolerance = 0;
    let mut users_tested_tolerance = 0;
    let mut abusive_sent = 0;
    let mut abusive_admitted = 0;
    let by_user = admissions_by_user(&rec.admissions, shared.sent.len());
    for (u, ((sent, failed), admissions)) in shared
        .sent
        .iter()
        .zip(&shared.failed)
        .zip(&by_user)
        .enumerate()
    {
        let sent = u64::from(sent.load(Ordering::Relaxed));
        // A request that failed was neither admitted nor denied: it tests no limit.
        let decided = sent.saturating_sub(u64::from(failed.load(Ordering::Relaxed)));
        let admitted = admissions.len() as u64;
        if sent > 0 {
            users_seen += 1;
        }
        max_admitted = max_admitted.max(admitted);
        if decided > bound {
            users_tested += 1;
        }
        if decided > bound_tolerated {
            users_tested_tolerance += 1;
        }
        if admitted > bound {
            users_above += 1;
        }
        if admitted > bound_tolerated {
            users_above_tolerance += 1;
        }
        if shared.sampler.is_abusive(u as u64) {
            abusive_sent += sent;
            abusive_admitted += admitted;
        }
    }
    let users_above_in_some_interval =
        users_above_in_some_interval(config, by_user, tolerance, clocks);
    // A percentile of `h`, whose measured max is `max`: the top of its value's bucket, so never
    // said above the max.
    let q = |h: &Histogram<u64>, q: f64, max: u64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(q).min(max)
        }
    };
    let per_second = rec
        .seconds
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.is_empty())
        .map(|(s, h)| {
            let max = rec.second_max_us[s];
            SecondStats {
                second: s as u64,
                completed: h.len(),
                p50_us: q(h, 0.5, max),
                p99_us: q(h, 0.99, max),
                max_us: max,
            }
        })
        .collect();
    Report {
        target: config.target,
        store: config.store,
        mode: config.mode,
        gateways: config.gateways,
        users: config.users,
        abusive: config.abusive,
        dist: config.dist,
        limit: config.limit_label(),
        target_rate: config.rate,
        duration: config.duration,
        concurrency: config.effective_concurrency(),
        scheduled: shared.total,
        completed,
        admitted: rec.admissions.len() as u64,
        denied: rec.denied,
        errors: rec.errors,
        timed_out,
        elapsed,
        achieved_rate: achieved_rate(completed, elapsed, config.rate),
        late_starts: rec.late_starts,
        max_start_lateness: rec.max_start_lateness,
        p50_us: q(&rec.latency, 0.5, rec.max_us),
        p90_us: q(&rec.latency, 0.9, rec.max_us),
        p99_us: q(&rec.latency, 0.99, rec.max_us),
        p999_us: q(&rec.latency, 0.999, rec.max_us),
        max_us: rec.max_us,
        mean_us: rec.latency.mean(),
        per_second,
        users_seen,
        max_admitted,
        admission_bound: bound,
        users_tested,
        users_above_bound: users_above,
        users_above_in_some_interval,
        tolerance: tolerance.units(),
        tolerance_per_period: matches!(tolerance, Tolerance::PerPeriod(_)),
        users_above_tolerance,
        users_tested_tolerance,
        memory_evictions: None,
        abusive_sent,
        abusive_admitted,
        redis_calls,
        redis_unread,
        server_clock_faster_ppm: server_faster.map(|f| f * 1e6),
        local_answers: cache.map(|c| c.0),
        store_calls: cache.map(|c| c.1),
    }
}

/// Each user's admissions (when its request was sent, when its answer came), by user index.
fn admissions_by_user(admissions: &[(u32, u64, u64)], users: usize) -> Vec<Vec<(u64, u64)>> {
    let mut by_user = vec![Vec::new(); users];
    for &(user, sent, answered) in admissions {
        by_user[user as usize].push((sent, answered));
    }
    by_user
}

/// Users admitted more than the limit allows within some interval of the run, not only over the
/// whole of it. An admission was decided at some instant between its request being sent and its
/// answer; so the admissions whose request was sent at or after `a`'s and answered by `b`'s
/// answer were all decided within `[sent_a, answered_b]`, and their number must not exceed the
/// bound for that interval's length. Conservative (the interval is at least as long as the one
/// the decisions really fell in): it never reports a user the limiter treated exactly. The bound
/// includes the mode's `tolerance` (see [`bound_with`]).
///
/// Every pair is checked, in O(n²) cheap steps for a user admitted n times: the bound is
/// inverted once (the shortest span that admits `m`, for every `m` up to n), and the answers of
/// the admissions sent from `a` on are kept sorted as `a` moves back, so that the `k`-th of them
/// is the one that makes `k + 1`.
fn users_above_in_some_interval(
    config: &Config,
    by_user: Vec<Vec<(u64, u64)>>,
    tolerance: Tolerance,
    clocks: ClockAllowance,
) -> u64 {
    let bound =
        |span_us: u64| bound_with(config, tolerance, Duration::from_micros(span_us), clocks);
    // Users admitted at most the bound of an empty interval cannot exceed any interval's bound.
    let floor = bound(0);
    let mut above = 0;
    for mut list in by_user {
        if list.len() as u64 <= floor {
            continue;
        }
        list.sort_unstable();
        // The whole span of the user's admissions is one of the intervals below, and the
        // cheapest: a user over its bound (a limiter that does not limit gives one user many
        // admissions) needs no search.
        let first_sent = list[0].0;
        let last_answered = list
            .iter()
            .map(|&(_, answered)| answered)
            .max()
            .unwrap_or(0);
        let whole = last_answered.saturating_sub(first_sent);
        if list.len() as u64 > bound(whole) {
            above += 1;
            continue;
        }
        // need[m]: the shortest span (µs) whose bound admits m. The bound grows with the span,
        // and the whole span admits them all, so a binary search finds it.
        let need: Vec<u64> = (0..=list.len() as u64)
            .map(|m| {
                let (mut lo, mut hi) = (0u64, whole);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if bound(mid) >= m {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                lo
            })
            .collect();
        let mut ends: Vec<u64> = Vec::with_capacity(list.len());
        let over = list.iter().rev().any(|&(sent_a, answered_a)| {
            let at = ends.partition_point(|&e| e < answered_a);
            ends.insert(at, answered_a);
            // The k-th answer (from 0) closes an interval holding k + 1 admissions.
            ends.iter()
                .zip(&need[1..])
                .any(|(&answered, &shortest)| answered.saturating_sub(sent_a) < shortest)
        });
        if over {
            above += 1;
        }
    }
    above
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten requests at 10 a second, the last sent 0.9 s after the first and answered at once:
    /// the rate kept, 10 a second (not 10 / 0.9). Answers later than that read lower.
    #[test]
    fn a_kept_schedule_achieves_its_rate() {
        assert_eq!(achieved_rate(10, Duration::from_millis(900), 10.0), 10.0);
        assert_eq!(achieved_rate(10, Duration::from_millis(1_900), 10.0), 5.0);
        assert_eq!(achieved_rate(0, Duration::ZERO, 10.0), 0.0);
    }

    /// A sweep goes on past each sustained step and stops after the first that is not, whatever
    /// the steps after it: the outcome of each step is made up here, not asked of the machine.
    #[tokio::test]
    async fn a_sweep_stops_after_its_first_unsustained_step() {
        // One real run, for a report to copy; its timings are overwritten below.
        let config = Config {
            rate: 10.0,
            duration: Duration::from_millis(100),
            quiet: true,
            ..config()
        };
        let base = run_once(&config).await.unwrap();
        let target = Duration::from_millis(5);
        // A step is sustained below 300 a second, at 400, and at no other rate.
        let step = |rate: f64| {
            let mut r = base.clone();
            r.target_rate = rate;
            r.achieved_rate = rate;
            r.p99_us = if rate < 300.0 || rate == 400.0 {
                1_000
            } else {
                9_000
            };
            r
        };
        let rates = |steps: &[Report]| steps.iter().map(|r| r.target_rate).collect::<Vec<_>>();
        let sweep = |rates: &'static [f64]| {
            run_steps(rates, target, move |rate| async move { Ok(step(rate)) })
        };
        assert_eq!(
            rates(&sweep(&[100.0, 200.0]).await.unwrap()),
            [100.0, 200.0]
        );
        assert_eq!(
            rates(&sweep(&[100.0, 200.0, 300.0, 400.0]).await.unwrap()),
            [100.0, 200.0, 300.0],
            "stopped at 300, though 400 would have been sustained"
        );
        assert_eq!(rates(&sweep(&[300.0, 100.0]).await.unwrap()), [300.0]);
        // A step that fails to run ends the sweep with its error.
        let failing = run_steps(&[100.0, 200.0], target, |rate| async move {
            if rate > 150.0 {
                Err(Error::Redis("down".into()))
            } else {
                Ok(step(rate))
            }
        });
        assert!(matches!(failing.await, Err(Error::Redis(_))));
    }

    fn config() -> Config {
        Config {
            limit: 100,
            period: Duration::from_secs(60),
            ..Config::default()
        }
    }

    /// A warm-up answered neither 200 nor 429 (a store failing behind the layer, a broken
    /// router) stops the run before it starts, naming the status, instead of being measured as
    /// the run's errors.
    #[tokio::test]
    async fn a_warm_up_answered_with_an_error_stops_the_run() {
        let config = Config {
            rate: 10.0,
            duration: Duration::from_millis(100),
            quiet: true,
            ..config()
        };
        let failing = axum::Router::new().route(
            "/",
            axum::routing::get(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
        );
        let err = drive_http(&config, vec![failing], Setup::plain())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("warm-up") && err.contains("503"), "{err}");
        // A warm-up denied (429) is a warm-up: the run goes on.
        let denying = axum::Router::new().route(
            "/",
            axum::routing::get(|| async { axum::http::StatusCode::TOO_MANY_REQUESTS }),
        );
        let report = drive_http(&config, vec![denying], Setup::plain())
            .await
            .unwrap();
        assert_eq!((report.admitted, report.errors), (0, 0));
        assert_eq!(report.denied, report.completed);
        assert!(report.denied > 0);
    }

    /// The longest latency is reported as measured, for the run and for each second: the
    /// histograms' `max` is the top of a bucket, 5,115 µs for the run (3 significant digits) and
    /// 5,119 for its second (2), so a second's max read longer than the whole run's. Percentiles
    /// (tops of buckets too) are capped at it.
    #[test]
    fn the_longest_latency_is_reported_as_measured() {
        let config = Config {
            rate: 10.0,
            duration: Duration::from_secs(2),
            ..config()
        };
        let shared = Shared::new(&config, Duration::ZERO);
        {
            let mut rec = shared.rec.lock();
            rec.latency(0, 812);
            rec.latency(0, 5_113);
            rec.latency(1, 2_049);
            rec.latency(1, 70_000_001);
        }
        let r = build_report(
            &config,
            &shared,
            Tolerance::Exact,
            false,
            ServerAfter::None,
            None,
        );
        assert_eq!(r.max_us, 70_000_001);
        let seconds: Vec<_> = r
            .per_second
            .iter()
            .map(|s| (s.second, s.p99_us, s.max_us))
            .collect();
        // The per-second series counts a latency over a minute as one minute; a percentile, the
        // top of its bucket (5,119 for 5,113 here), is never above the measured max.
        assert_eq!(seconds, [(0, 5_113, 5_113), (1, 60_000_000, 60_000_000)]);
        assert!(r.p999_us <= r.max_us, "{} > {}", r.p999_us, r.max_us);
    }

    /// A sliding log frees a slot exactly one period after an admission (an entry counts in
    /// `(now - period, now]`): a closed span of one period may hold `limit + 1`, and is not
    /// reported; `limit + 1` in less than a period is.
    #[test]
    fn a_sliding_log_slot_freed_at_exactly_one_period_is_not_reported() {
        let c = Config {
            algorithm: Algorithm::SlidingLog,
            ..config()
        };
        let p = 60_000_000;
        let mut exact: Vec<_> = (0..100).map(|_| (3, 0, 0)).collect();
        exact.push((3, p, p));
        let by_user = || admissions_by_user(&exact, 4);
        assert_eq!(
            users_above_in_some_interval(
                &c,
                by_user(),
                Tolerance::Exact,
                ClockAllowance::default()
            ),
            0
        );
        // One more within the period (a few microseconds clear of the clocks' slack): reported.
        exact.push((3, p - 10, p - 10));
        let by_user = admissions_by_user(&exact, 4);
        assert_eq!(
            users_above_in_some_interval(&c, by_user, Tolerance::Exact, ClockAllowance::default()),
            1
        );
    }

    /// Leasing's tolerance follows its guarantee: one lease on the buckets, none on fixed windows,
    /// `gateways × (lease − 1)` per period on the sliding algorithms.
    #[test]
    fn leasing_tolerance_by_algorithm() {
        let with = |algorithm| Config {
            algorithm,
            gateways: 4,
            lease_size: Some(10),
            ..config()
        };
        assert_eq!(
            Tolerance::leasing(&with(Algorithm::Gcra)),
            Tolerance::Once(10)
        );
        assert_eq!(
            Tolerance::leasing(&with(Algorithm::FixedWindow)),
            Tolerance::Exact
        );
        let sliding = with(Algorithm::SlidingLog);
        let t = Tolerance::leasing(&sliding);
        assert_eq!(t, Tolerance::PerPeriod(36));
        // Two periods and a bit touch three half-open windows of one period.
        assert_eq!(t.over(&sliding, Duration::from_secs(121)), 3 * 36);
    }

    /// The tolerance counts the leases the library can grant, not the size asked for: never
    /// more than the limit's largest cost (a bucket's burst, a window's limit), on a bucket never
    /// more than its rate refills in a lease's longest lifetime (`DEFAULT_MAX_TTL`), and with
    /// users assigned to one gateway each, one gateway's lease. Before, 10 a second under the
    /// sliding log at 4 gateways allowed 4 × 63 units a period more, and `--check` passed a store
    /// admitting 20 times the limit.
    #[test]
    fn leasing_tolerance_counts_the_leases_that_can_be_granted() {
        let per_second = |algorithm, limit| Config {
            algorithm,
            limit,
            period: Duration::from_secs(1),
            gateways: 4,
            ..Config::default()
        };
        assert_eq!(
            Tolerance::leasing(&per_second(Algorithm::SlidingLog, 10)),
            Tolerance::PerPeriod(4 * 9)
        );
        assert_eq!(
            Tolerance::leasing(&per_second(Algorithm::TokenBucket, 10)),
            Tolerance::Once(10)
        );
        // 100 a minute refills 17 (16.7, rounded up) in the 10 s a lease may live at most.
        let minute = Config {
            algorithm: Algorithm::Gcra,
            limit: 100,
            period: Duration::from_secs(60),
            ..Config::default()
        };
        assert_eq!(Tolerance::leasing(&minute), Tolerance::Once(17));
        let sticky = Config {
            algorithm: Algorithm::SlidingLog,
            limit: 100,
            period: Duration::from_secs(60),
            gateways: 20,
            assign: crate::config::Assign::UserHash,
            ..Config::default()
        };
        assert_eq!(Tolerance::leasing(&sticky), Tolerance::PerPeriod(63));
        // Over HTTP a user's requests go round-robin over the gateways' connections.
        let spread = Config {
            assign: crate::config::Assign::RoundRobin,
            ..sticky
        };
        assert_eq!(Tolerance::leasing(&spread), Tolerance::PerPeriod(20 * 63));
    }

    /// Thousands of admissions of one user at the bucket's pace are checked pair by pair and
    /// not reported; three extra admissions in the middle of them are.
    #[test]
    fn many_admissions_are_checked_and_a_burst_among_them_found() {
        let c = Config {
            limit: 1_000,
            period: Duration::from_secs(1),
            ..Config::default()
        };
        // A full bucket at once, then one a millisecond (the refill rate), answered 0.3 ms later.
        let mut paced: Vec<_> = (0..1_000).map(|_| (5, 0, 300)).collect();
        paced.extend((1..=4_000u64).map(|i| (5, i * 1_000, i * 1_000 + 300)));
        assert_eq!(
            users_above_in_some_interval(
                &c,
                admissions_by_user(&paced, 6),
                Tolerance::Exact,
                ClockAllowance::default()
            ),
            0
        );
        paced.extend((0..3).map(|_| (5, 2_000_000, 2_000_300)));
        assert_eq!(
            users_above_in_some_interval(
                &c,
                admissions_by_user(&paced, 6),
                Tolerance::Exact,
                ClockAllowance::default()
            ),
            1
        );
    }

    /// 150 admissions in the first second and none after: within the whole minute's bound
    /// (200), but 49 more than a bucket of 100 can give in one second.
    #[test]
    fn a_burst_the_whole_run_hides_is_found() {
        let burst: Vec<_> = (0..150).map(|i| (7, i * 6_000, i * 6_000 + 500)).collect();
        assert!(150 <= config().admission_bound(Duration::from_secs(60)));
        assert_eq!(
            users_above_in_some_interval(
                &config(),
                admissions_by_user(&burst, 8),
                Tolerance::Exact,
                ClockAllowance::default(),
            ),
            1
        );
        // Within the documented tolerance of 64 it passes.
        assert_eq!(
            users_above_in_some_interval(
                &config(),
                admissions_by_user(&burst, 8),
                Tolerance::Once(64),
                ClockAllowance::default(),
            ),
            0
        );
    }

    /// The server's clock against the tool's: faster by the readings' difference, uncertainty
    /// included; a slower server needs nothing.
    #[test]
    fn how_much_faster_the_server_ran() {
        // 1 s on the tool's clock, 1 s + 300 µs on the server's, each read within ±50 µs.
        let f = server_faster((1_000, 5_000_000, 50), (1_001_000, 6_000_300, 50));
        assert!((f - 400e-6).abs() < 1e-9, "{f}");
        assert_eq!(
            server_faster((0, 5_000_000, 0), (1_000_000, 5_999_000, 0)),
            0.0
        );
        assert_eq!(server_faster((7, 1, 0), (7, 2, 0)), 0.0);
    }

    /// The case seen in CI, as the fixed schedule gives it: a user's 100-unit burst from +0 ms,
    /// then a request at +599.5 ms, 0.5 ms before the first refill by the tool's clock, admitted
    /// by the server. Reported on the tool's clock alone; not with a server clock allowed to run
    /// 1,000 ppm faster, nor with the fixed allowance of a run on server time.
    #[test]
    fn a_server_clock_running_fast_is_allowed_for() {
        let mut seen: Vec<_> = (0..100).map(|i| (9, i * 100, i * 100 + 80)).collect();
        seen.push((9, 599_500, 599_580));
        let run = || admissions_by_user(&seen, 10);
        assert_eq!(
            users_above_in_some_interval(
                &config(),
                run(),
                Tolerance::Exact,
                ClockAllowance::default()
            ),
            1
        );
        for clocks in [
            ClockAllowance {
                faster: 1e-3,
                ahead: Duration::ZERO,
            },
            ClockAllowance {
                faster: 0.0,
                ahead: SERVER_CLOCK_SLACK,
            },
        ] {
            assert_eq!(
                users_above_in_some_interval(&config(), run(), Tolerance::Exact, clocks),
                0,
                "{clocks:?}"
            );
        }
    }

    /// Admissions at the bucket's pace (a burst of 100, then one every 0.6 s) never exceed it,
    /// whichever interval is taken, even with answers that overlap the next request.
    #[test]
    fn exact_admissions_are_not_reported() {
        let mut exact: Vec<_> = (0..100).map(|i| (1, i * 10, i * 10 + 5_000)).collect();
        exact.extend((1..=50).map(|i| (1, 1_000 + i * 600_000, 1_000 + i * 600_000 + 5_000)));
        assert_eq!(
            users_above_in_some_interval(
                &config(),
                admissions_by_user(&exact, 2),
                Tolerance::Exact,
                ClockAllowance::default(),
            ),
            0
        );
    }
}
