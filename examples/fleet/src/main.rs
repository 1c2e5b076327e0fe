//! Run with: cargo run -p example-fleet (flags: --gateways N, --users N, --redis URL, --alone)
//!
//! A fleet of gateways in one process: N copies of the example gateway (default 20), each with
//! its own Redis connections as if each were its own process, all sharing one redis-server. Many
//! users call `GET /api/items` with their own API key, limited to 100 a minute per key: every
//! user but one always reaches the same gateway; one user's requests are spread round-robin over
//! every gateway. The program prints, per user, how many requests each sent and how many were
//! admitted, against the limit.
//!
//! Shared, the spread user gets 100, like everyone else. With `--alone`, each gateway counts in
//! its own memory, and the spread user gets 100 from each gateway: N x 100.
//!
//! Without `--redis URL`, a redis-server is started on a free loopback port for the run (it
//! must be installed: `apt-get install redis-server`), and stopped at the end.
//!
//! The limit uses the sliding log, which is exact over any minute: the run takes a few seconds at
//! the default size (longer for fleets of hundreds of gateways), so the numbers do not depend on
//! how fast this machine is.

use std::fmt::Write as _;

#[path = "../../common/say.rs"]
mod say;
use say::{say, tell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use example_gateway::{Config, app};
use tower::ServiceExt;

/// The limit per API key, per minute.
const LIMIT: u64 = 100;
/// Requests each user sends per gateway it uses: more than the limit.
const PER_GATEWAY: u64 = 150;
/// Concurrent senders for the spread user.
const SPREAD_WORKERS: u64 = 8;
/// The most pinned users sending at once. Without a bound, `--users 20000` would put 20,000
/// requests in flight (each user's one at a time) on the gateways' few Redis connections, and most would wait past
/// the store's timeout and be answered 503 (fail closed): a measure of the overload, not of the
/// limit.
const USERS_AT_ONCE: usize = 256;

/// The most gateways a run builds (each a router with its own store connections, all in this
/// process), and the most users it sends for (each `PER_GATEWAY` requests per gateway it uses):
/// beyond them a run would take hours or all the memory.
const MAX_GATEWAYS: u64 = 1_000;
const MAX_USERS: u64 = 100_000;

/// What to run.
#[derive(Debug, Clone)]
struct Options {
    gateways: u64,
    users: u64,
    redis: Option<String>,
    alone: bool,
}

/// One user's line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    user: String,
    gateways: u64,
    sent: u64,
    admitted: u64,
    denied: u64,
    /// Answers other than 200 and 429 (a store failure: the policy fails closed).
    errors: u64,
}

/// The result of a run.
#[derive(Debug)]
struct Report {
    options: Options,
    store: String,
    rows: Vec<Row>,
    elapsed: Duration,
}

impl Report {
    /// The most a user may be admitted: 100 when shared; 100 per gateway used when alone (at
    /// most what was sent).
    fn expected(&self, row: &Row) -> u64 {
        if self.options.alone {
            (row.gateways * LIMIT).min(row.sent)
        } else {
            LIMIT.min(row.sent)
        }
    }

    fn table(&self) -> String {
        let o = &self.options;
        let mut s = String::new();
        let mode = if o.alone {
            "each counting alone in its own memory".to_owned()
        } else {
            format!("sharing one Redis ({})", self.store)
        };
        let _ = writeln!(
            s,
            "{} gateways {mode}; limit {LIMIT} per minute per API key (sliding log)\n",
            o.gateways
        );
        let _ = writeln!(
            s,
            "{:<10}{:>9}{:>7}{:>10}{:>8}{:>8}{:>10}",
            "user", "gateways", "sent", "admitted", "denied", "errors", "limit"
        );
        for r in &self.rows {
            let limit = if o.alone && r.gateways > 1 {
                format!("{}x{LIMIT}", r.gateways)
            } else {
                LIMIT.to_string()
            };
            let _ = writeln!(
                s,
                "{:<10}{:>9}{:>7}{:>10}{:>8}{:>8}{:>10}",
                r.user, r.gateways, r.sent, r.admitted, r.denied, r.errors, limit
            );
        }
        let sent: u64 = self.rows.iter().map(|r| r.sent).sum();
        let admitted: u64 = self.rows.iter().map(|r| r.admitted).sum();
        let errors: u64 = self.rows.iter().map(|r| r.errors).sum();
        let as_expected = self
            .rows
            .iter()
            .filter(|r| r.admitted == self.expected(r))
            .count();
        let _ = writeln!(
            s,
            "\n{sent} requests in {:.1} s, {admitted} admitted, {errors} errors; \
             {as_expected} of {} users admitted exactly their limit",
            self.elapsed.as_secs_f64(),
            self.rows.len()
        );
        s
    }
}

/// `s` as the inside of a TOML basic string (a password in a URL may hold `"` or `\`).
fn toml_string(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The gateway configuration of every member of the fleet.
fn config(redis: Option<&str>, prefix: &str) -> Result<Config, Box<dyn std::error::Error>> {
    let store = match redis {
        // Each check may wait up to 2 s: this run measures admission, not latency, and a debug
        // build on a small machine can be slow. A store failure would show in `errors`.
        Some(url) => format!(
            "kind = \"redis\"\nurl = \"{}\"\nprefix = \"{}\"\npool_size = 2\ntimeout_ms = 2000",
            toml_string(url),
            toml_string(prefix)
        ),
        None => "kind = \"memory\"\ntimeout_ms = 2000".to_owned(),
    };
    let text = format!(
        r#"
[store]
{store}

[[routes]]
path = "/api"
key = {{ source = "header", name = "x-api-key" }}

[routes.policy]
name = "fleet-api"
algorithm = "sliding_log"
quotas = [{{ limit = {LIMIT}, per = "minute" }}]
failure = {{ mode = "closed", retry_after_secs = 1 }}
"#
    );
    Ok(Config::from_toml(&text)?)
}

/// Sends `GET /api/items` as `user` to each gateway in `targets`, in order, and counts.
async fn send_all(gateways: Arc<Vec<Router>>, user: String, targets: Vec<usize>) -> Row {
    let mut row = Row {
        user: user.clone(),
        gateways: 0,
        sent: 0,
        admitted: 0,
        denied: 0,
        errors: 0,
    };
    for g in targets {
        let request = Request::get("/api/items")
            .header("x-api-key", &user)
            .body(Body::empty());
        let status = match request {
            Ok(req) => match gateways[g].clone().oneshot(req).await {
                Ok(res) => res.status().as_u16(),
                Err(never) => match never {},
            },
            Err(_) => 0,
        };
        row.sent += 1;
        match status {
            200 => row.admitted += 1,
            429 => row.denied += 1,
            _ => row.errors += 1,
        }
    }
    row
}

/// Raises this process's soft limit of open files to what a fleet of `gateways` sharing Redis
/// needs if it is lower (a soft limit of 1,024 is a common default, about 480 gateways), up to
/// its hard limit; past that, says what to do, rather than the run failing midway with "Too many
/// open files" or a `redis-server` that lowered its `maxclients` resetting connections. Needed:
/// each gateway's two connections (its store's `pool_size`) and a margin for the rest; the
/// `redis-server` the run starts needs as many for their other ends, and inherits this limit.
fn raise_open_files(gateways: u64) -> Result<(), String> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = gateways * 2 + 64;
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    if soft >= needed {
        return Ok(());
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if hard < needed {
        return Err(format!(
            "{gateways} gateways sharing Redis need about {needed} open files, and this process \
             may open at most {hard} (its hard limit: `ulimit -Hn`): run fewer gateways, or \
             raise the limit"
        ));
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(needed),
            maximum: limit.maximum,
        },
    )
    .map_err(|e| format!("cannot raise the open-file limit from {soft} to {needed}: {e}"))
}

/// Starts the fleet and drives the traffic.
async fn run(options: Options) -> Result<Report, Box<dyn std::error::Error>> {
    if !options.alone {
        raise_open_files(options.gateways)?;
    }
    // A redis-server for the run, unless one was given or the gateways count alone.
    let server = match (&options.redis, options.alone) {
        (None, false) => {
            // The usual cause, said plainly first.
            if !redis_harness::redis_server_installed() {
                return Err(
                    "redis-server or redis-cli not found: install them (Debian: apt-get install \
                            redis-server), give --redis URL, or run with --alone"
                        .into(),
                );
            }
            let server = redis_harness::RedisServer::builder()
                .try_start()
                .map_err(|why| format!("could not start redis-server: {why}"))?;
            Some(server)
        }
        _ => None,
    };
    let url = options
        .redis
        .clone()
        .or_else(|| server.as_ref().map(|s| s.url()));
    // A prefix of its own, so a run against a long-lived Redis never sees an earlier run's keys.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let prefix = format!("fleet-{}-{stamp}", std::process::id());
    let config = config(if options.alone { None } else { url.as_deref() }, &prefix)?;

    let mut gateways = Vec::new();
    for _ in 0..options.gateways {
        // Each call opens its own store: its own Redis connections, or its own memory.
        gateways.push(app(&config).await?);
    }
    let gateways = Arc::new(gateways);
    let n = usize::try_from(options.gateways)?;

    let started = Instant::now();
    let mut tasks = Vec::new();
    let at_once = Arc::new(tokio::sync::Semaphore::new(USERS_AT_ONCE));
    // Users pinned to one gateway each: user-01 to gateway 1, and so on around the fleet.
    for u in 1..options.users {
        let target = usize::try_from(u)? % n;
        let targets = vec![target; usize::try_from(PER_GATEWAY)?];
        let (gateways, at_once) = (gateways.clone(), at_once.clone());
        tasks.push(tokio::spawn(async move {
            // Never closed: the permit is always granted, in turn.
            let _turn = at_once.acquire_owned().await;
            send_all(gateways, format!("user-{u:02}"), targets).await
        }));
    }
    // The spread user: request k goes to gateway k mod N, sent by several workers at once.
    let spread_total = options.gateways * PER_GATEWAY;
    let mut spread = Vec::new();
    for w in 0..SPREAD_WORKERS {
        let targets = (w..spread_total)
            .step_by(usize::try_from(SPREAD_WORKERS)?)
            .map(|k| usize::try_from(k % options.gateways))
            .collect::<Result<Vec<_>, _>>()?;
        spread.push(tokio::spawn(send_all(
            gateways.clone(),
            "spread".to_owned(),
            targets,
        )));
    }

    let mut rows = Vec::new();
    for t in tasks {
        let mut row = t.await?;
        row.gateways = 1;
        rows.push(row);
    }
    let mut total = Row {
        user: "spread".to_owned(),
        gateways: options.gateways,
        sent: 0,
        admitted: 0,
        denied: 0,
        errors: 0,
    };
    for t in spread {
        let r = t.await?;
        total.sent += r.sent;
        total.admitted += r.admitted;
        total.denied += r.denied;
        total.errors += r.errors;
    }
    rows.push(total);
    let elapsed = started.elapsed();
    drop(server);

    Ok(Report {
        // Never the password: the URL is printed.
        store: url
            .as_deref()
            .map(ratelimit_redis::redact_url)
            .unwrap_or_default(),
        options,
        rows,
        elapsed,
    })
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        gateways: 20,
        users: 50,
        redis: None,
        alone: false,
    };
    // `args_os`: `args` would panic on an argument that is not UTF-8 (taken here lossily: every
    // value the fleet takes is text, and one that was not is refused as what it became).
    let mut args = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned());
    let number = |flag: &str, v: Option<String>, max: u64| -> Result<u64, String> {
        let v = v.ok_or(format!("{flag} needs a number"))?;
        match v.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(format!(
                "{flag} {v:?}: expected a number of at least 1 and at most {max}"
            )),
        }
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--gateways" => o.gateways = number("--gateways", args.next(), MAX_GATEWAYS)?,
            "--users" => o.users = number("--users", args.next(), MAX_USERS)?,
            "--redis" => o.redis = Some(args.next().ok_or("--redis needs a URL")?),
            "--alone" => o.alone = true,
            "--help" | "-h" => {
                let help = say(format_args!(
                    "example-fleet: gateways sharing one limit through a store\n\n\
                     Usage: example-fleet [--gateways N] [--users N] [--redis URL | --alone]\n\n  \
                     --gateways N  how many gateways (default 20, at most 1000)\n  \
                     --users N     how many users spread over them (default 50, at most 100000)\n  \
                     --redis URL   share the limit through this Redis (default: a redis-server \
                     the example starts on a free loopback port)\n  \
                     --alone       each gateway counts in its own memory"
                ));
                // Help that cannot be written is a failure (1), not a wrong command line (2).
                if let Err(e) = help {
                    tell(format_args!("error: cannot write the output: {e}"));
                    std::process::exit(1);
                }
                std::process::exit(0);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (expected --gateways N, --users N, --redis URL, --alone)"
                ));
            }
        }
    }
    // The gateways' configuration would refuse it in their own words (`store.url`, the gateway's
    // feature): said here in the fleet's.
    if let Some(url) = &o.redis
        && ratelimit_redis::is_tls_url(url)
        && !cfg!(any(feature = "tls", feature = "tls-rustls"))
    {
        return Err(format!(
            "--redis {}: rediss:// (TLS) needs example-fleet built with `--features tls` \
             (OpenSSL) or `--features tls-rustls` (rustls)",
            ratelimit_redis::redact_url(url)
        ));
    }
    // Pasted into the gateways' TOML: a control character (a newline) would end the string, and
    // be reported in a file the user never wrote, or add a setting.
    if let Some(url) = &o.redis
        && url.chars().any(char::is_control)
    {
        return Err(format!(
            "--redis {:?}: a URL holds no control characters",
            ratelimit_redis::redact_url(url)
        ));
    }
    // Read now, as the store will read it, so that a malformed URL (or a flag taken for one,
    // `--redis --alone`) is a wrong command line (status 2) named by the fleet's flag, not a
    // failure of the run (1) in terms of `store.url`.
    if let Some(url) = &o.redis
        && let Err(e) = redis::IntoConnectionInfo::into_connection_info(url.as_str())
    {
        return Err(format!(
            "--redis {}: not a Redis URL (expected redis://HOST:PORT): {e}",
            ratelimit_redis::redact_url(url)
        ));
    }
    if o.alone && o.redis.is_some() {
        return Err(
            "--redis and --alone do not go together: alone, each gateway counts in its own memory"
                .into(),
        );
    }
    Ok(o)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Errors as their messages (`main` returning the error would print its `Debug`).
    let options = match parse_args() {
        Ok(options) => options,
        Err(e) => {
            tell(format_args!("error: {e}"));
            return std::process::ExitCode::from(2);
        }
    };
    // Ctrl-C, SIGTERM, SIGHUP (a closed terminal) or SIGQUIT drops the run, and with it the
    // `redis-server` it may have started (the harness kills it when dropped): killed by a
    // signal's default action, the example would leave that server running. Listened for before
    // the run starts, so that a signal sent while the server starts finds its handler in place.
    let interrupted = redis_harness::process::interrupted();
    let outcome = tokio::select! {
        biased;
        () = interrupted => None,
        outcome = run(options) => Some(outcome),
    };
    let report = match outcome {
        Some(Ok(report)) => report,
        Some(Err(e)) => {
            tell(format_args!("error: {e}"));
            return std::process::ExitCode::FAILURE;
        }
        None => {
            tell(format_args!("interrupted"));
            return std::process::ExitCode::from(130);
        }
    };
    let mut printed = say(format_args!("{}", report.table().trim_end_matches('\n')));
    if report.elapsed > Duration::from_secs(50) {
        printed = printed.and_then(|()| {
            say(format_args!(
                "note: the run took most of a minute; the limit is per minute, so runs this long can admit more"
            ))
        });
    }
    if let Err(e) = printed {
        tell(format_args!("error: cannot write the output: {e}"));
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(report: &Report) -> &Row {
        report.rows.iter().find(|r| r.user == "spread").unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_redis_holds_the_spread_user_to_the_limit_and_alone_does_not() {
        let server = redis_harness::RedisServer::start();
        let options = Options {
            gateways: 4,
            users: 6,
            redis: Some(server.url()),
            alone: false,
        };
        let shared = run(options.clone()).await.unwrap();
        assert_eq!(shared.rows.len(), 6);
        for r in &shared.rows {
            assert_eq!(r.errors, 0, "{r:?}");
            assert_eq!(r.admitted, 100, "{r:?}");
            assert_eq!(r.admitted + r.denied, r.sent);
        }
        assert_eq!(spread(&shared).sent, 600);
        assert_eq!(spread(&shared).gateways, 4);
        assert!(
            shared
                .table()
                .contains("6 of 6 users admitted exactly their limit")
        );

        let alone = run(Options {
            alone: true,
            ..options
        })
        .await
        .unwrap();
        assert_eq!(spread(&alone).admitted, 400);
        for r in alone.rows.iter().filter(|r| r.user != "spread") {
            assert_eq!(r.admitted, 100, "{r:?}");
        }
        let table = alone.table();
        assert!(
            table.contains("spread            4    600       400     200       0     4x100"),
            "{table}"
        );
    }

    /// The widest cells the command line allows keep a space between columns: `--gateways
    /// 1000 --alone` makes a limit of `1000x100`, which ran into the errors column's `0`.
    #[test]
    fn the_widest_cells_keep_their_columns_apart() {
        let report = Report {
            options: Options {
                gateways: MAX_GATEWAYS,
                users: 1,
                redis: None,
                alone: true,
            },
            store: String::new(),
            rows: vec![Row {
                user: "spread".to_owned(),
                gateways: MAX_GATEWAYS,
                sent: MAX_GATEWAYS * PER_GATEWAY,
                admitted: MAX_GATEWAYS * LIMIT,
                denied: MAX_GATEWAYS * (PER_GATEWAY - LIMIT),
                errors: 0,
            }],
            elapsed: Duration::from_secs(1),
        };
        let table = report.table();
        let line = table.lines().find(|l| l.starts_with("spread")).unwrap();
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "spread", "1000", "150000", "100000", "50000", "0", "1000x100"
            ],
            "{table}"
        );
    }
}
