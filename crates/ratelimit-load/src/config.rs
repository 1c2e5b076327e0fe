//! What to run: the settings of one load run, and the command-line parser that fills them.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, Quota};

use crate::Error;

/// What the load is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `Store::check` called directly: the limiter's decision path without HTTP.
    Store,
    /// Real HTTP/1.1 gateways (axum servers started in this process on 127.0.0.1), over
    /// keep-alive connections.
    Http,
}

/// Where the limit state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// No limiter at all: bare axum (HTTP target only), the baseline.
    None,
    /// One in-process `MemoryStore`, shared by every gateway of the run.
    Memory,
    /// One `MemoryStore` per gateway, not shared: what a fleet gets from per-instance state. It
    /// admits up to N times the limit with N gateways, and the exactness check says so.
    MemoryPerGateway,
    /// Redis: each gateway has its own `RedisStore` (its own connections) on one server.
    Redis,
}

/// Which wrapper, if any, sits between each gateway and its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every decision is one store call.
    Exact,
    /// `ratelimit_core::DenialCache` per gateway: repeated denials are answered locally until
    /// their retry-after has passed.
    DenialCache,
    /// `ratelimit_core::Leasing` per gateway (adaptive lease size, at most
    /// `ratelimit_core::DEFAULT_MAX_LEASE` units): a gateway reserves a batch of a key's units in
    /// one store call and admits from it locally.
    Leasing,
    /// `ratelimit_redis::Coalescing` per gateway (Redis only): concurrent checks of one key on one
    /// gateway share one script call.
    Coalesce,
}

/// How users are drawn for each request (the abusive users come on top).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Every user equally likely.
    Uniform,
    /// User of rank k (from 1) drawn with weight 1/k^s.
    Zipf(f64),
}

/// How a request of the store target picks its gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assign {
    /// Request i goes to gateway i mod N: one user's requests are spread over every gateway,
    /// which is the case a shared store must get right.
    RoundRobin,
    /// A user always goes to the same gateway (sticky load balancing).
    UserHash,
}

/// The settings of one run (or of a sweep of runs, with [`Config::steps`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// What the load is sent to.
    pub target: Target,
    /// Where the limit state lives.
    pub store: StoreKind,
    /// The Redis server to use; if `None` and the store is Redis, a `redis-server` is started.
    pub redis_url: Option<String>,
    /// Connections each `RedisStore` keeps.
    pub pool_size: usize,
    /// Added to every Redis key's expiry (`RedisStoreBuilder::expiry_slack`).
    pub expiry_slack: Duration,
    /// Extra `redis.conf` lines for the `redis-server` the tool starts (ignored with a URL).
    pub redis_config: Vec<String>,
    /// Wrapper between gateway and store.
    pub mode: Mode,
    /// With `--mode leasing`: a fixed lease size in units; `None` adapts it to each key's traffic.
    pub lease_size: Option<u64>,
    /// Number of gateway instances.
    pub gateways: usize,
    /// How the store target assigns requests to gateways.
    pub assign: Assign,
    /// Number of users (abusive ones included).
    pub users: u64,
    /// How normal users are drawn.
    pub dist: Distribution,
    /// How many users are abusive (the last `abusive` user ids).
    pub abusive: u64,
    /// How many times more requests an abusive user sends than a normal user on average.
    pub abuse_factor: f64,
    /// Target rate, decisions a second.
    pub rate: f64,
    /// How long requests are scheduled for.
    pub duration: Duration,
    /// Requests allowed per period, per user.
    pub limit: u64,
    /// The period of the limit.
    pub period: Duration,
    /// Bucket capacity (token bucket and GCRA); `None` means equal to the limit.
    pub burst: Option<u64>,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Store target: the most checks in flight. HTTP target: the number of connections. 0 picks
    /// a default for the target (see [`Config::effective_concurrency`]).
    pub concurrency: usize,
    /// The scheduler thread sleeps at least this long between releases of due requests: the
    /// most a request can start late because of the tool, traded against its CPU use.
    pub tick: Duration,
    /// Seed of the (deterministic) request-to-user schedule.
    pub seed: u64,
    /// Rates to step through instead of `rate` (a sweep).
    pub steps: Vec<f64>,
    /// In a sweep, the p99 latency a step must stay under to count as sustained.
    pub p99_target: Duration,
    /// Print JSON instead of text.
    pub json: bool,
    /// Exit with status 3 unless the run establishes the mode's guarantee (see
    /// [`Report::check`](crate::Report::check)).
    pub check: bool,
    /// Write an SVG plot of latency over time here.
    pub svg: Option<PathBuf>,
    /// No progress bar.
    pub quiet: bool,
    /// Tokio worker threads.
    pub threads: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            target: Target::Store,
            store: StoreKind::Memory,
            redis_url: None,
            pool_size: 1,
            expiry_slack: Duration::ZERO,
            lease_size: None,
            redis_config: Vec::new(),
            mode: Mode::Exact,
            gateways: 1,
            assign: Assign::RoundRobin,
            users: 10_000,
            dist: Distribution::Uniform,
            abusive: 0,
            abuse_factor: 100.0,
            rate: 10_000.0,
            duration: Duration::from_secs(10),
            limit: 100,
            period: Duration::from_secs(60),
            burst: None,
            algorithm: Algorithm::TokenBucket,
            concurrency: 0,
            tick: Duration::from_micros(250),
            seed: 1,
            steps: Vec::new(),
            p99_target: Duration::from_millis(10),
            json: false,
            check: false,
            svg: None,
            quiet: false,
            threads: 2,
        }
    }
}

/// The command-line help.
pub const USAGE: &str = "\
ratelimit-load: open-loop load for the rate limiter (store or HTTP gateways), with an exactness check

USAGE: ratelimit-load [OPTIONS]

  --target store|http        what to load: Store::check directly, or axum gateways over HTTP [store]
  --store none|memory|redis|memory-per-gateway
                             where state lives; none = bare axum (http only); memory-per-gateway
                             = an unshared store per gateway (over-admits: a negative control)
                             [memory]
  --redis-url URL            use this Redis; default: start a redis-server on a free port
  --pool-size N              connections per RedisStore (per gateway) [1]
  --expiry-slack-ms MS       added to every Redis key's expiry (fewer keys expire and are
                             made again when users return within it) [0]
  --redis-config LINE        a redis.conf line for the redis-server the tool starts, e.g.
                             'hz 100' (repeatable; ignored with --redis-url)
  --mode exact|denial-cache|leasing|coalesce
                             wrapper between each gateway and the store (coalesce: Redis only)
                             [exact]
  --lease-size N             leasing: reserve N units per lease (the most a gateway may hold
                             unspent per key) [adaptive, at most 64]
  --gateways N               gateway instances [1]
  --assign round-robin|user-hash   store target: request-to-gateway assignment [round-robin]
  --users N                  users, abusive ones included [10000]
  --dist uniform|zipf:S      distribution of normal users [uniform]
  --abusive K                K abusive users (the last K ids) [0]
  --abuse-factor F           an abusive user sends F times a normal user's mean rate [100]
  --rate R                   target decisions per second [10000]
  --duration S               seconds of schedule (decimals allowed; at most 3600, and at most
                             100,000,000 requests in all) [10]
  --limit N/PERIOD           per-user limit; PERIOD = second|minute|hour|day|<n>s|<n>ms [100/minute]
  --burst B                  bucket capacity (token_bucket, gcra) [= limit]
  --algorithm NAME           token_bucket|gcra|fixed_window|sliding_window|sliding_log [token_bucket]
  --concurrency N            store: most checks in flight [1024]; http: connections [64]
  --steps R1,R2,...          sweep: one run per rate, stops after the first that fails
  --p99-target-ms MS         sweep: a step is sustained if p99 <= MS, >= 95% of the rate is
                             achieved, under 0.1% errors and every request completed [10]
  --tick-us US               the scheduler releases due requests at most every US µs, 1 to
                             100000 [250]
  --seed N                   seed of the request-to-user schedule [1]
  --threads N                tokio worker threads, 1 to 1024 [2]
  --json                     print the report as JSON
  --check                    exit 3 unless the run shows the mode's guarantee (no user above
                             the bound + tolerance over the run or in any interval of it, some
                             user testing it, no failed request, nothing cut short, no live key
                             evicted from a memory store)
  --svg PATH                 write p50/p99 latency per second as an SVG plot
  --quiet                    no progress bar
  -h, --help                 this help
";

impl Config {
    /// Parses command-line arguments (without the program name).
    pub fn from_args<I, S>(args: I) -> Result<Config, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut c = Config::default();
        let mut it = args.into_iter().map(Into::into);
        while let Some(flag) = it.next() {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (flag, None),
            };
            let mut value = |name: &str| -> Result<String, Error> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => it
                        .next()
                        .ok_or_else(|| Error::Usage(format!("{name} needs a value"))),
                }
            };
            match flag.as_str() {
                // `--check=false` would otherwise mean `--check`.
                "--json" | "--check" | "--quiet" | "--help" if inline.is_some() => {
                    return Err(Error::Usage(format!("{flag} takes no value")));
                }
                "--target" => {
                    c.target = match value("--target")?.as_str() {
                        "store" => Target::Store,
                        "http" => Target::Http,
                        other => return Err(bad("--target", other)),
                    }
                }
                "--store" => {
                    c.store = match value("--store")?.as_str() {
                        "none" | "bare" => StoreKind::None,
                        "memory" => StoreKind::Memory,
                        "memory-per-gateway" => StoreKind::MemoryPerGateway,
                        "redis" => StoreKind::Redis,
                        other => return Err(bad("--store", other)),
                    }
                }
                "--redis-url" => c.redis_url = Some(redis_url(&value("--redis-url")?)?),
                "--pool-size" => c.pool_size = num("--pool-size", &value("--pool-size")?)?,
                "--lease-size" => {
                    c.lease_size = Some(num("--lease-size", &value("--lease-size")?)?);
                }
                "--expiry-slack-ms" => {
                    let ms = num("--expiry-slack-ms", &value("--expiry-slack-ms")?)?;
                    c.expiry_slack = Duration::from_millis(ms);
                }
                "--redis-config" => c.redis_config.push(value("--redis-config")?),
                "--mode" => {
                    c.mode = match value("--mode")?.as_str() {
                        "exact" => Mode::Exact,
                        "denial-cache" | "denial_cache" => Mode::DenialCache,
                        "leasing" | "lease" => Mode::Leasing,
                        "coalesce" | "coalescing" => Mode::Coalesce,
                        other => return Err(bad("--mode", other)),
                    }
                }
                "--gateways" => c.gateways = num("--gateways", &value("--gateways")?)?,
                "--assign" => {
                    c.assign = match value("--assign")?.as_str() {
                        "round-robin" => Assign::RoundRobin,
                        "user-hash" => Assign::UserHash,
                        other => return Err(bad("--assign", other)),
                    }
                }
                "--users" => c.users = num("--users", &value("--users")?)?,
                "--dist" => c.dist = value("--dist")?.parse()?,
                "--abusive" => c.abusive = num("--abusive", &value("--abusive")?)?,
                "--abuse-factor" => {
                    c.abuse_factor = num("--abuse-factor", &value("--abuse-factor")?)?
                }
                "--rate" => c.rate = num("--rate", &value("--rate")?)?,
                "--duration" => {
                    let s: f64 = num("--duration", &value("--duration")?)?;
                    c.duration = Duration::try_from_secs_f64(s)
                        .map_err(|_| Error::Usage(format!("--duration {s}: not a duration")))?;
                }
                "--limit" => {
                    let v = value("--limit")?;
                    let (n, p) = parse_limit(&v)?;
                    c.limit = n;
                    c.period = p;
                }
                "--burst" => c.burst = Some(num("--burst", &value("--burst")?)?),
                "--algorithm" => {
                    let v = value("--algorithm")?;
                    c.algorithm = v.parse().map_err(|_| bad("--algorithm", &v))?;
                }
                "--concurrency" => c.concurrency = num("--concurrency", &value("--concurrency")?)?,
                "--connections" => c.concurrency = num("--connections", &value("--connections")?)?,
                "--steps" => {
                    c.steps = value("--steps")?
                        .split(',')
                        .map(|s| num("--steps", s.trim()))
                        .collect::<Result<_, _>>()?
                }
                "--p99-target-ms" => {
                    let ms: f64 = num("--p99-target-ms", &value("--p99-target-ms")?)?;
                    if !(ms.is_finite() && ms > 0.0 && ms <= 3_600_000.0) {
                        return Err(Error::Usage(
                            "--p99-target-ms must be more than 0 and at most 3600000".to_owned(),
                        ));
                    }
                    c.p99_target = Duration::from_secs_f64(ms / 1e3);
                }
                "--seed" => c.seed = num("--seed", &value("--seed")?)?,
                "--tick-us" => {
                    c.tick = Duration::from_micros(num("--tick-us", &value("--tick-us")?)?)
                }
                "--threads" => c.threads = num("--threads", &value("--threads")?)?,
                "--json" => c.json = true,
                "--check" => c.check = true,
                "--svg" => c.svg = Some(PathBuf::from(value("--svg")?)),
                "--quiet" | "-q" => c.quiet = true,
                "-h" | "--help" => return Err(Error::Help),
                other => return Err(Error::Usage(format!("unknown option {other}"))),
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings fit together.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |m: &str| Err(Error::Usage(m.to_owned()));
        // Each user takes some 40 bytes of counters and tables, reserved at the start.
        if self.users == 0 || self.users > 100_000_000 {
            return fail("--users must be between 1 and 100000000");
        }
        if self.abusive >= self.users {
            return fail("--abusive must be smaller than --users");
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return fail("--rate must be positive");
        }
        if self.steps.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
            return fail("--steps must be positive rates");
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(3_600) {
            return fail("--duration must be between 0 and 3600 seconds");
        }
        if self.gateways == 0 || self.gateways > 1_000 {
            return fail("--gateways must be between 1 and 1000");
        }
        if self.concurrency > 100_000 {
            return fail("--concurrency must be at most 100000");
        }
        if self.target == Target::Http && self.effective_concurrency() < self.gateways {
            return fail(
                "--concurrency must be at least --gateways with --target http (each gateway needs a connection)",
            );
        }
        if self.target == Target::Http && self.assign == Assign::UserHash {
            return fail(
                "--assign user-hash is for --target store: over HTTP, requests go round-robin over \
                 the connections",
            );
        }
        if self.tick.is_zero() || self.tick > Duration::from_millis(100) {
            return fail("--tick-us must be between 1 and 100000");
        }
        if let Some(n) = self.lease_size {
            if self.mode != Mode::Leasing {
                return fail("--lease-size needs --mode leasing");
            }
            if n == 0 || n > 1_000_000 {
                return fail("--lease-size must be between 1 and 1000000");
            }
        }
        if self.expiry_slack > Duration::from_secs(86_400) {
            return fail("--expiry-slack-ms must be at most one day");
        }
        if self.pool_size == 0 || self.threads == 0 {
            return fail("--pool-size and --threads must be at least 1");
        }
        if self.threads > 1024 {
            return fail("--threads must be at most 1024");
        }
        if !(self.abuse_factor.is_finite() && (1.0..=1e6).contains(&self.abuse_factor)) {
            return fail("--abuse-factor must be between 1 and 1000000");
        }
        // Each scheduled request takes a record of 24 bytes, reserved at the start.
        // A sweep runs its steps' rates only, not `--rate`.
        let steps_max = if self.steps.is_empty() {
            self.rate
        } else {
            self.steps.iter().copied().fold(0.0, f64::max)
        };
        if steps_max * self.duration.as_secs_f64() > 100_000_000.0 {
            return fail(
                "--rate (or a --steps rate) times --duration must be at most 100000000 requests",
            );
        }
        if self.store == StoreKind::None && self.target == Target::Store {
            return fail("--store none (bare axum) needs --target http");
        }
        if self.check && !self.steps.is_empty() {
            return fail("--check checks one run, not a sweep (--steps)");
        }
        if self.check && self.store == StoreKind::None {
            return fail("--check needs a store: bare axum limits nothing");
        }
        if self.store == StoreKind::None && self.mode != Mode::Exact {
            return fail("--mode needs a store");
        }
        if self.mode == Mode::Coalesce && self.store != StoreKind::Redis {
            return fail("--mode coalesce needs --store redis");
        }
        if let Distribution::Zipf(s) = self.dist
            && !(s.is_finite() && s > 0.0)
        {
            return fail("zipf exponent must be positive");
        }
        self.build_limit().map(|_| ())
    }

    /// The concurrency in use: `concurrency`, or if it is 0, 1,024 checks in flight for the store
    /// target and 64 connections for the HTTP target.
    pub fn effective_concurrency(&self) -> usize {
        match (self.concurrency, self.target) {
            (0, Target::Store) => 1_024,
            (0, Target::Http) => 64,
            (n, _) => n,
        }
    }

    /// The per-user limit these settings describe.
    pub fn build_limit(&self) -> Result<Limit, Error> {
        let quota = Quota::per_period_with_burst(
            self.limit,
            self.period,
            self.burst.unwrap_or(self.limit),
        )?;
        Ok(Limit::single(self.algorithm, quota)?)
    }

    /// The most requests one user can be admitted over a span of `elapsed` with these settings,
    /// by the algorithm's own guarantee (see `docs/load-tool.md`).
    pub fn admission_bound(&self, elapsed: Duration) -> u64 {
        let n = u128::from(self.limit);
        let bound = match self.algorithm {
            // A bucket of `burst`, refilled by limit/period: burst + floor(limit * T / period).
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let (t, p) = (elapsed.as_micros(), self.period.as_micros().max(1));
                u128::from(self.burst.unwrap_or(self.limit)) + n * t / p
            }
            // At most `limit` in each of the windows of one period that cover the span.
            _ => n * u128::from(self.periods_in_bound(elapsed)),
        };
        u64::try_from(bound).unwrap_or(u64::MAX)
    }

    /// How many windows of one period a span of `elapsed` is covered by, for the window
    /// algorithms (the bound counts `limit` for each, and a tolerance given per period too).
    pub fn periods_in_bound(&self, elapsed: Duration) -> u64 {
        let t = elapsed.as_micros();
        let p = self.period.as_micros().max(1);
        let periods = match self.algorithm {
            // Any half-open span of one period, (x - period, x], holds at most `limit`, and a
            // closed span of T is covered by floor(T / period) + 1 of them.
            Algorithm::SlidingLog => t / p + 1,
            // Each calendar window admits at most `limit`, and a span of T touches at most
            // ceil(T / period) + 1 windows. The sliding-window counter admits no more.
            _ => t.div_ceil(p) + 1,
        };
        u64::try_from(periods).unwrap_or(u64::MAX)
    }

    /// A one-line description of the limit: `100/60s token_bucket`.
    pub fn limit_label(&self) -> String {
        let burst = match self.burst {
            Some(b) if b != self.limit => format!(" burst {b}"),
            _ => String::new(),
        };
        format!(
            "{}/{} {}{burst}",
            self.limit,
            fmt_period(self.period),
            self.algorithm.name()
        )
    }
}

fn fmt_period(p: Duration) -> String {
    if p.subsec_nanos() == 0 {
        format!("{}s", p.as_secs())
    } else {
        format!("{}ms", p.as_millis())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Store => "store",
            Target::Http => "http",
        })
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreKind::None => "none",
            StoreKind::Memory => "memory",
            StoreKind::MemoryPerGateway => "memory-per-gateway",
            StoreKind::Redis => "redis",
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Exact => "exact",
            Mode::DenialCache => "denial-cache",
            Mode::Leasing => "leasing",
            Mode::Coalesce => "coalesce",
        })
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

impl FromStr for Distribution {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        if s == "uniform" {
            return Ok(Distribution::Uniform);
        }
        if s == "zipf" {
            return Ok(Distribution::Zipf(1.0));
        }
        match s.strip_prefix("zipf:") {
            Some(e) => Ok(Distribution::Zipf(num("--dist zipf:S", e)?)),
            None => Err(bad("--dist", s)),
        }
    }
}

fn bad(flag: &str, value: &str) -> Error {
    Error::Usage(format!("{flag}: unknown value {value:?}"))
}

fn num<T: FromStr>(flag: &str, v: &str) -> Result<T, Error> {
    v.replace('_', "")
        .parse()
        .map_err(|_| Error::Usage(format!("{flag}: {v:?} is not a number")))
}

/// `100/minute`, `10/second`, `5/10s`, `3/500ms`.
fn parse_limit(v: &str) -> Result<(u64, Duration), Error> {
    let (n, p) = v
        .split_once('/')
        .ok_or_else(|| Error::Usage(format!("--limit {v:?}: expected N/PERIOD")))?;
    let n: u64 = num("--limit", n)?;
    let period = match p {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3_600),
        "d" | "day" => Duration::from_secs(86_400),
        other => {
            if let Some(ms) = other.strip_suffix("ms") {
                Duration::from_millis(num("--limit", ms)?)
            } else if let Some(s) = other.strip_suffix('s') {
                Duration::from_secs(num("--limit", s)?)
            } else {
                return Err(Error::Usage(format!(
                    "--limit {v:?}: unknown period {other:?}"
                )));
            }
        }
    };
    Ok((n, period))
}

/// `--redis-url`'s value, if it is a `redis://` URL (the tool is built without TLS). What is
/// shown of a wrong one has its password replaced.
fn redis_url(url: &str) -> Result<String, Error> {
    let scheme = redis::parse_redis_url(url).map(|u| u.scheme().to_owned());
    match scheme.as_deref() {
        Some("redis" | "valkey" | "redis+unix" | "valkey+unix" | "unix") => Ok(url.to_owned()),
        Some(_) => Err(Error::Usage(format!(
            "--redis-url {}: the tool is built without TLS; give a redis:// URL",
            ratelimit_redis::redact_url(url)
        ))),
        None => Err(Error::Usage(format!(
            "--redis-url {}: not a Redis URL (redis://[[user]:password@]host[:port][/db])",
            ratelimit_redis::redact_url(url)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_would_crash_or_mislead_are_refused() {
        for args in [
            // Per-user tables for four billion users: out of memory after the whole run.
            "--users 4000000000",
            // 100 gateways over 64 connections: 36 gateways would get no traffic.
            "--target http --store memory --gateways 100",
            "--target http --store memory --gateways 8 --concurrency 4",
            // Sticky assignment is the store target's: HTTP would be round-robin all the same.
            "--target http --store memory --assign user-hash",
        ] {
            let checked = Config::from_args(args.split_whitespace()).and_then(|c| c.validate());
            assert!(
                matches!(checked, Err(Error::Usage(_))),
                "{args}: {checked:?}"
            );
        }
        let ok = Config::from_args(
            "--target http --store memory --gateways 100 --concurrency 100".split_whitespace(),
        )
        .unwrap();
        ok.validate().unwrap();
    }

    /// The cap of 100,000,000 requests counts the rates that run: a sweep's steps, not the
    /// `--rate` it does not use (which refused a sweep of 360,000-request steps).
    #[test]
    fn the_request_cap_counts_the_rates_that_run() {
        let checked =
            |args: &str| Config::from_args(args.split_whitespace()).and_then(|c| c.validate());
        checked("--rate 50000 --steps 100,200 --duration 3600").unwrap();
        for refused in [
            "--rate 50000 --duration 3600",
            "--rate 10 --steps 100,50000 --duration 3600",
        ] {
            assert!(
                matches!(checked(refused), Err(Error::Usage(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn parses_the_seed_fleet_command() {
        let c = Config::from_args(
            "--target store --store redis --gateways 20 --users 100000 --limit 100/minute \
             --rate 50000 --duration 30 --dist zipf:1.1 --abusive 10 --json"
                .split_whitespace(),
        )
        .unwrap();
        assert_eq!(c.target, Target::Store);
        assert_eq!(c.store, StoreKind::Redis);
        assert_eq!(c.gateways, 20);
        assert_eq!(c.users, 100_000);
        assert_eq!((c.limit, c.period), (100, Duration::from_secs(60)));
        assert_eq!(c.rate, 50_000.0);
        assert_eq!(c.duration, Duration::from_secs(30));
        assert_eq!(c.dist, Distribution::Zipf(1.1));
        assert_eq!(c.abusive, 10);
        assert!(c.json);
        let leasing = Config::from_args(
            "--mode leasing --lease-size 32 --assign user-hash".split_whitespace(),
        )
        .unwrap();
        assert_eq!(
            (leasing.mode, leasing.lease_size),
            (Mode::Leasing, Some(32))
        );
    }

    #[test]
    fn rejects_what_does_not_fit() {
        for args in [
            "--rate 0",
            "--users 10 --abusive 10",
            "--target store --store none",
            "--limit 100/fortnight",
            "--dist pareto",
            "--bogus",
            "--gateways",
            "--lease-size 8",
            "--mode leasing --lease-size 0",
            "--p99-target-ms -1",
            "--p99-target-ms 0",
            "--p99-target-ms nan",
            "--p99-target-ms 1e30",
            "--abuse-factor inf",
            "--rate 1000000 --duration 600",
            "--threads 1000000",
            "--check=false",
            "--json=no",
            "--quiet=0",
        ] {
            assert!(
                Config::from_args(args.split_whitespace()).is_err(),
                "{args} was accepted"
            );
        }
        assert!(matches!(Config::from_args(["--help"]), Err(Error::Help)));
    }

    #[test]
    fn bounds_follow_the_algorithm() {
        let mut c = Config {
            limit: 100,
            period: Duration::from_secs(60),
            ..Config::default()
        };
        // Under one period: the burst. Over 90 s: 100 + 150.
        assert_eq!(c.admission_bound(Duration::from_secs(30)), 150);
        assert_eq!(c.admission_bound(Duration::from_millis(500)), 100);
        assert_eq!(c.admission_bound(Duration::from_secs(90)), 250);
        c.burst = Some(10);
        assert_eq!(c.admission_bound(Duration::from_secs(60)), 110);
        c.algorithm = Algorithm::FixedWindow;
        assert_eq!(c.admission_bound(Duration::from_secs(30)), 200);
        c.algorithm = Algorithm::SlidingLog;
        assert_eq!(c.admission_bound(Duration::from_secs(30)), 100);
        // A closed span of exactly one period: the slot of its first instant frees at its last.
        assert_eq!(c.admission_bound(Duration::from_secs(60)), 200);
        assert_eq!(c.periods_in_bound(Duration::from_secs(60)), 2);
        assert_eq!(parse_limit("5/10s").unwrap(), (5, Duration::from_secs(10)));
        assert_eq!(
            parse_limit("3/500ms").unwrap(),
            (3, Duration::from_millis(500))
        );
    }
}
