//! `ratelimit-load`: open-loop load for the rate limiter. Run with
//! `cargo run --release -p ratelimit-load -- --help`; see `docs/load-tool.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use ratelimit_load::{Config, Error, USAGE};

// The examples' writers: on stdout a reader gone (`| head`) is not a failure, a full disk is;
// on stderr nothing that cannot be written is a panic.
#[path = "../../../examples/common/say.rs"]
mod say;
use say::{say, tell};

fn main() -> ExitCode {
    // Read as given, so that an argument that is not UTF-8 (a file name may be anything but a
    // 0 byte) is a usage error, not a panic.
    let args: Result<Vec<String>, Error> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string().map_err(|a| {
                Error::Usage(format!(
                    "{} is not UTF-8: every argument, --svg's path too, must be",
                    a.to_string_lossy()
                ))
            })
        })
        .collect();
    let config = match args.and_then(Config::from_args) {
        Ok(c) => c,
        Err(Error::Help) => {
            return match say(format_args!("{}", USAGE.trim_end_matches('\n'))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tell(format_args!("ratelimit-load: cannot write the output: {e}"));
                    ExitCode::FAILURE
                }
            };
        }
        Err(e) => {
            tell(format_args!("ratelimit-load: {e}\n\n{USAGE}"));
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tell(format_args!(
                "ratelimit-load: cannot start the runtime: {e}"
            ));
            return ExitCode::FAILURE;
        }
    };
    // Ctrl-C, SIGTERM, SIGHUP (a closed terminal) or SIGQUIT drops the run, and with it the
    // `redis-server` it started (the harness kills it when dropped), before the tool exits:
    // killed by a signal's default action, the tool would leave the server running.
    let outcome = runtime.block_on(async {
        // Listened for before the run starts: starting `redis-server` blocks the thread until it
        // answers, and a signal then must find its handler in place (a handler made at the first
        // poll of a `select!` branch polled second would not be).
        let interrupted = redis_harness::process::interrupted();
        tokio::select! {
            biased;
            () = interrupted => None,
            result = main_async(&config) => Some(result),
        }
    });
    // Without waiting for a report still being made on a blocking thread (the interval check of
    // a heavy user can take long): the run it reports on is over, and its server stopped.
    runtime.shutdown_background();
    match outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
        // A setting found wrong only when used (a Redis URL the store refuses, a `--redis-config`
        // line the server refuses): a bad argument, as at parsing.
        Some(Err(e @ Error::Usage(_))) => {
            tell(format_args!("ratelimit-load: {e}\n\n{USAGE}"));
            ExitCode::from(2)
        }
        Some(Err(e @ Error::Check(_))) => {
            tell(format_args!("ratelimit-load: {e}"));
            ExitCode::from(3)
        }
        Some(Err(e)) => {
            tell(format_args!("ratelimit-load: {e}"));
            ExitCode::FAILURE
        }
        None => {
            tell(format_args!("ratelimit-load: interrupted"));
            ExitCode::from(130)
        }
    }
}

async fn main_async(config: &Config) -> Result<(), Error> {
    let mut lines = Vec::new();
    if !config.steps.is_empty() {
        let sweep = ratelimit_load::sweep(config).await?;
        if config.json {
            lines.push(sweep.to_json().to_string());
        } else {
            lines.extend(sweep.steps.iter().map(|r| r.text()));
            lines.push(sweep.text().trim_end_matches('\n').to_owned());
        }
        let svg = sweep.steps.last().map(|last| last.svg());
        return write_out(lines, config.svg.clone().zip(svg)).await;
    }
    let report = ratelimit_load::run(config).await?;
    if config.json {
        lines.push(report.to_json().to_string());
    } else {
        lines.push(report.text().trim_end_matches('\n').to_owned());
    }
    let svg = config.svg.clone().map(|path| (path, report.svg()));
    write_out(lines, svg).await?;
    if config.check {
        let failed = report.check();
        if !failed.is_empty() {
            return Err(Error::Check(failed));
        }
    }
    Ok(())
}

/// Writes the report's `lines` to stdout and the chart to its file, on a blocking thread: a write
/// that blocks (a reader of the pipe that stopped reading, a FIFO for `--svg`) leaves the signals
/// heard, and the tool stops on one as documented instead of waiting for the reader.
async fn write_out(lines: Vec<String>, svg: Option<(PathBuf, String)>) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || -> Result<(), Error> {
        for line in &lines {
            say(format_args!("{line}"))?;
        }
        if let Some((path, chart)) = svg {
            std::fs::write(path, chart)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Io(std::io::Error::other(e)))?
}
