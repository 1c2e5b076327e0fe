//! Run with: cargo run -p example-gateway (with Redis: `-- --config examples/gateway/gateway-redis.toml`)
//! (`rediss://` URLs, TLS: `cargo run -p example-gateway --features tls -- --config ...`, or
//! `--features tls-rustls` for rustls instead of OpenSSL)
//!
//! An API server whose rate limits come from a TOML file (`examples/gateway/gateway.toml` by
//! default; every field is described in `docs/configuration.md`).
//!
//! Flags:
//! - `--config PATH`: the configuration file;
//! - `--listen ADDR`: where to listen, overriding the file's `listen`;
//! - `--redis URL`: the Redis server, instead of the file's `[store] url` (which may then be left
//!   out);
//! - `--check`: check the configuration (and connect to Redis if configured), then exit.
//!
//! A flag's value may also follow an `=` (`--config=PATH`).
//!
//! A bad configuration stops the gateway at start with a message naming the field (exit status
//! 2; Redis unreachable at start is status 3, which a supervisor may retry; see
//! docs/configuration.md). Ctrl-C or SIGTERM stops it gracefully (no new connections; the
//! requests in flight get `shutdown_timeout_ms`, 30 s by default, to finish). The rate
//! limiter's events go to stderr, filtered by `RUST_LOG` (default `info`).

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[path = "../../common/say.rs"]
mod say;
use say::{say, tell};

use example_gateway::config::{KeyConfig, StoreKind};
use example_gateway::{Config, app, metrics_handle};

/// The configuration used when `--config` is not given.
const DEFAULT_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml");

/// What the command line asked for.
struct Args {
    config: PathBuf,
    listen: Option<SocketAddr>,
    /// The Redis server instead of the file's `[store] url` (a `kind = "redis"` store only).
    redis: Option<String>,
    check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut parsed = Args {
        config: PathBuf::from(DEFAULT_CONFIG),
        listen: None,
        redis: None,
        check: false,
    };
    // `args_os`: a path need not be UTF-8, and `args` would panic on one that is not.
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        // `--flag=value` as well as `--flag value` (systemd units and container specs often
        // write the first).
        let (flag, mut inline) = split_flag(&arg);
        let flag = flag.as_str();
        let has_inline = inline.is_some();
        let mut value = |missing: &'static str| -> Result<OsString, String> {
            match inline.take() {
                Some(v) => Ok(v),
                None => args.next().ok_or_else(|| missing.to_owned()),
            }
        };
        match flag {
            "--config" => {
                parsed.config = value("--config needs a path")?.into();
            }
            "--listen" => {
                let addr = value("--listen needs an address")?;
                let addr = addr.to_string_lossy();
                parsed.listen = Some(
                    addr.parse()
                        .map_err(|e| format!("--listen {addr:?}: {e} (expected IP:PORT)"))?,
                );
            }
            "--redis" => {
                let url = value("--redis needs a URL")?;
                parsed.redis = Some(
                    url.into_string()
                        .map_err(|_| "--redis: the URL is not UTF-8".to_owned())?,
                );
            }
            "--check" | "--help" | "-h" if has_inline => {
                return Err(format!("{flag} takes no value"));
            }
            "--check" => parsed.check = true,
            "--help" | "-h" => {
                let help = say(format_args!(
                    "example-gateway: an HTTP gateway whose rate limits come from a TOML file\n\n\
                     Usage: example-gateway [--config PATH] [--listen ADDR] [--redis URL] \
                     [--check]\n\n  \
                     --config PATH  the configuration (default {DEFAULT_CONFIG}; \
                     docs/configuration.md)\n  \
                     --listen ADDR  the address to serve on (IP:PORT), instead of the file's\n  \
                     --redis URL    the Redis server, instead of the file's [store] url \
                     (a kind = \"redis\" store)\n  \
                     --check        check the configuration, print `ok` and exit"
                ));
                // Help that cannot be written is a failure (1), not a wrong command line (2).
                if let Err(e) = help {
                    tell(format_args!("error: cannot write the output: {e}"));
                    std::process::exit(1);
                }
                std::process::exit(0);
            }
            // The value of an unknown `--flag=value` is not echoed: it may be a password
            // (`--redis-url=redis://:pw@…`); nor is what follows the `=` of any other argument
            // (`-p=pw`, `password=pw`), nor the password of a URL given without its flag.
            other => {
                let shown = match (has_inline, other.split_once('=')) {
                    (true, _) => format!("{other}=…"),
                    (false, Some((name, _))) if !name.contains("://") => format!("{name}=…"),
                    (false, _) => ratelimit_redis::redact_url(other),
                };
                return Err(format!(
                    "unknown argument `{shown}` (expected --config PATH, --listen ADDR, \
                     --redis URL, --check)"
                ));
            }
        }
    }
    Ok(parsed)
}

/// `arg` as a flag and its value if it is `--flag=value`, split at its first `=`: the flag as
/// text, the value as given (a path need not be UTF-8, and is not made text). Anything else is
/// the whole argument, as text (lossily: it is matched against the flags, or named as unknown).
fn split_flag(arg: &OsStr) -> (String, Option<OsString>) {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let bytes = arg.as_bytes();
        if let Some(at) = bytes.iter().position(|&b| b == b'=')
            && let Ok(flag) = std::str::from_utf8(&bytes[..at])
            && flag.starts_with("--")
        {
            let value = OsStr::from_bytes(&bytes[at + 1..]).to_owned();
            return (flag.to_owned(), Some(value));
        }
    }
    #[cfg(not(unix))]
    if let Some((flag, value)) = arg.to_str().and_then(|a| a.split_once('='))
        && flag.starts_with("--")
    {
        return (flag.to_owned(), Some(value.into()));
    }
    (arg.to_string_lossy().into_owned(), None)
}

/// Ctrl-C or SIGTERM (what an orchestrator sends before it stops a container): the first starts a
/// graceful shutdown (the server stops accepting connections and lets the requests in flight
/// finish, within `shutdown_timeout_ms`); a second ends it at once, with status 130, for an
/// operator who will not wait for the drain.
///
/// The handlers are installed when this is made, not when it is first awaited: made before the
/// gateway says where it listens, a signal sent as soon as it has said so is a graceful
/// shutdown, not the default action's abrupt exit.
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                terminate: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next Ctrl-C or SIGTERM (never, if no handler could be installed).
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                () = received(self.terminate.as_mut()) => {}
                () = received(self.interrupt.as_mut()) => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Waits for `signal` (for ever if its handler could not be installed).
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// A one-line description of the configured store.
fn describe_store(config: &Config) -> String {
    let s = &config.store;
    let extras: Vec<&str> = [
        (s.denial_cache, "denial cache"),
        (s.watch_resets, "reset watch"),
        (s.coalesce, "coalescing"),
    ]
    .iter()
    .filter_map(|&(on, name)| on.then_some(name))
    .collect();
    let extras = if extras.is_empty() {
        String::new()
    } else {
        format!(" ({})", extras.join(", "))
    };
    let store = match s.kind {
        StoreKind::Memory => "in-memory (this process only)".to_owned(),
        StoreKind::Redis => format!(
            "Redis at {}",
            ratelimit_redis::redact_url(s.url.as_deref().unwrap_or("?"))
        ),
        StoreKind::RedisCluster => {
            let urls: Vec<String> = s
                .urls
                .iter()
                .map(|u| ratelimit_redis::redact_url(u))
                .collect();
            format!("Redis Cluster at {}", urls.join(", "))
        }
    };
    store + &extras
}

/// The log filter `RUST_LOG` gives (`info` if it is unset, or names no directive: empty, as
/// `Environment=RUST_LOG=` in a systemd unit sets it, which tracing-subscriber would take for a
/// filter that lets nothing through, warnings included). A directive that does not parse (a
/// mistyped level, `hyper=warnn`) is left out with a warning, and the others kept: not the whole
/// variable dropped for `info` without a word, as `EnvFilter::try_from_default_env` would have
/// it. (tracing-subscriber's own lenient parse warns with `eprintln!`, which panics on a stderr
/// that cannot be written.)
fn log_filter() -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::Directive;
    let Some(value) = std::env::var_os("RUST_LOG") else {
        return EnvFilter::new("info");
    };
    let Some(value) = value.to_str() else {
        tell(format_args!(
            "warning: RUST_LOG is not UTF-8: logging at info"
        ));
        return EnvFilter::new("info");
    };
    if value.split(',').all(|d| d.trim().is_empty()) {
        return EnvFilter::new("info");
    }
    if let Ok(filter) = EnvFilter::builder().parse(value) {
        return filter;
    }
    let mut kept = Vec::new();
    for directive in value.split(',').filter(|d| !d.is_empty()) {
        match directive.parse::<Directive>() {
            Ok(_) => kept.push(directive),
            Err(e) => tell(format_args!(
                "warning: RUST_LOG: ignoring `{}`: {e}",
                directive.escape_debug()
            )),
        }
    }
    match EnvFilter::builder().parse(kept.join(",")) {
        Ok(filter) if !kept.is_empty() => filter,
        _ => {
            tell(format_args!(
                "warning: RUST_LOG has no directive that parses: logging at info"
            ));
            EnvFilter::new("info")
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // The rate limiter's events (store failures and timeouts, the circuit breaker) and the
    // gateway's own, on stderr; `RUST_LOG` chooses (default `info`; `debug` adds every denial).
    // A line that cannot be written (`2>/dev/full`, a log pipe whose reader has gone) is lost,
    // not reported: tracing-subscriber reports it with `eprintln!`, which panics there, in
    // whatever task logged (a request's, the signal handler's).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(log_filter())
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            tell(format_args!("error: {e}"));
            return ExitCode::from(2);
        }
    };
    // Where a store error comes from: the file, or the file with the URL given on the command
    // line.
    let source = match args.redis {
        Some(_) => format!("{} with --redis", args.config.display()),
        None => args.config.display().to_string(),
    };
    let mut config = match Config::load_with_redis(&args.config, args.redis.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            // The URL refused at load (a `rediss://` one without a TLS feature, say) may be the
            // command line's.
            let from = if e.field == "store.url" {
                source.as_str()
            } else {
                &args.config.display().to_string()
            };
            tell(format_args!("error in {from}: {e}"));
            return ExitCode::from(2);
        }
    };
    for warning in config.warnings() {
        tell(format_args!(
            "warning in {}: {warning}",
            args.config.display()
        ));
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    // Applied as the file was loaded, to a `kind = "redis"` store only.
    if args.redis.is_some() && config.store.kind != StoreKind::Redis {
        tell(format_args!(
            "error: --redis replaces the url of a `kind = \"redis\"` store; the [store] of {} \
             is not one (try examples/gateway/gateway-redis.toml)",
            args.config.display()
        ));
        return ExitCode::from(2);
    }
    if args.check {
        // A check of the configuration also checks that Redis can be reached.
        config.store.start_without_redis = false;
    }
    let router = match app(&config).await {
        Ok(r) => r,
        Err(e) => {
            tell(format_args!("error in {source}: {e}"));
            return ExitCode::from(e.exit_status());
        }
    };
    if args.check {
        if let Err(e) = say(format_args!("{}: ok", args.config.display())) {
            tell(format_args!("error: cannot write the output: {e}"));
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }

    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tell(format_args!(
                "error: cannot listen on {}: {e}",
                config.listen
            ));
            return ExitCode::FAILURE;
        }
    };
    // Before the address is printed: see `Signals`.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut signals = Signals::install();
    tokio::spawn(async move {
        signals.next().await;
        tracing::info!("shutting down: finishing the requests in flight");
        let _ = stop.send(true);
        signals.next().await;
        tracing::warn!(
            "shutting down: a second signal; exiting without waiting for the requests in flight"
        );
        std::process::exit(130);
    });
    let addr = listener.local_addr().unwrap_or(config.listen);
    // Written at once, when made: a banner that cannot be written (a full disk) fails the start,
    // a reader gone (`| head -n 1`) does not.
    let mut banner = String::new();
    let _ = writeln!(banner, "gateway listening on http://{addr}/");
    let _ = writeln!(banner, "  config: {}", args.config.display());
    let _ = writeln!(banner, "  store:  {}", describe_store(&config));
    for route in &config.routes {
        let p = &route.policy;
        let key = match &route.key {
            KeyConfig::Ip { .. } => "client IP".to_owned(),
            KeyConfig::Header { name } => format!("header {name}"),
            KeyConfig::Global {} => "everyone together".to_owned(),
        };
        let quotas: Vec<String> = p
            .quotas
            .iter()
            .map(|q| {
                let rate = match (q.per, q.period_ms) {
                    (Some(per), _) => format!("{}/{}", q.limit, format!("{per:?}").to_lowercase()),
                    (None, Some(ms)) => format!("{}/{ms}ms", q.limit),
                    (None, None) => q.limit.to_string(),
                };
                // The burst a client meets first (what `X-RateLimit-Limit` says), if not the
                // limit.
                match q.burst {
                    Some(burst) if burst != q.limit => format!("{rate} (burst {burst})"),
                    _ => rate,
                }
            })
            .collect();
        let tiers: Vec<&str> = p.tiers.iter().map(|t| t.name.as_str()).collect();
        let _ = writeln!(
            banner,
            "  route {:<8} policy {:?}: {} per {key}{}{}",
            route.path,
            p.name,
            quotas.join(" + "),
            if tiers.is_empty() {
                String::new()
            } else {
                format!(", tiers {}", tiers.join(", "))
            },
            if p.dry_run { " (dry run)" } else { "" },
        );
    }
    if let Some(admin) = &config.admin {
        let source = match (&admin.token_env, &admin.token_file) {
            (Some(name), _) => format!("${name}"),
            (None, Some(path)) => path.display().to_string(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            banner,
            "  admin:  POST /admin/reset?policy=NAME&ip=ADDR|client=VALUE (token from {source})"
        );
    }
    let _ = writeln!(banner, "try:");
    let _ = writeln!(banner, "  curl -i -X POST http://{addr}/login");
    let _ = writeln!(
        banner,
        "  curl -i -H 'x-api-key: demo-free' http://{addr}/api/items"
    );
    let _ = writeln!(
        banner,
        "  curl -s http://{addr}/metrics | grep ratelimit_decisions_total"
    );
    if let Err(e) = say(format_args!("{}", banner.trim_end_matches('\n'))) {
        tell(format_args!("error: cannot write the output: {e}"));
        return ExitCode::FAILURE;
    }

    // Without the exporter's own HTTP listener, its upkeep (draining histograms) is ours to run.
    let handle = metrics_handle();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });

    // The signal starts the graceful shutdown and its deadline: requests in flight get
    // `shutdown_timeout_ms` to finish, then the process exits with whatever is still open (a
    // client stalled mid-request would otherwise hold it until the orchestrator's SIGKILL).
    let signalled = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // An error means the sender is gone without a signal: never.
        if rx.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let drain = Duration::from_millis(config.shutdown_timeout_ms);
    let signal = signalled(stopping.clone());
    let deadline = async move {
        signal.await;
        tokio::time::sleep(drain).await;
    };
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(signalled(stopping));
    tokio::select! {
        served = std::future::IntoFuture::into_future(served) => match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tell(format_args!("error: {e}"));
                ExitCode::FAILURE
            }
        },
        () = deadline => {
            tracing::warn!(
                after_ms = config.shutdown_timeout_ms,
                "shutting down: requests still in flight after shutdown_timeout_ms; exiting"
            );
            ExitCode::SUCCESS
        }
    }
}
