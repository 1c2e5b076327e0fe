//! `ratelimit-load`: open-loop load for the rate limiter. Run with
//! `cargo run --release -p ratelimit-load -- --help`; see `docs/load-tool.md`.

use std::process::ExitCode;

use ratelimit_load::{Config, Error, USAGE};

fn main() -> ExitCode {
    let config = match Config::from_args(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(Error::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ratelimit-load: {e}\n\n{USAGE}");
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
            eprintln!("ratelimit-load: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_async(&config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratelimit-load: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn main_async(config: &Config) -> Result<(), Error> {
    if !config.steps.is_empty() {
        let sweep = ratelimit_load::sweep(config).await?;
        if config.json {
            println!("{}", sweep.to_json());
        } else {
            for r in &sweep.steps {
                println!("{}", r.text());
            }
            print!("{}", sweep.text());
        }
        if let (Some(path), Some(last)) = (&config.svg, sweep.steps.last()) {
            std::fs::write(path, last.svg())?;
        }
        return Ok(());
    }
    let report = ratelimit_load::run(config).await?;
    if config.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.text());
    }
    if let Some(path) = &config.svg {
        std::fs::write(path, report.svg())?;
    }
    Ok(())
}
