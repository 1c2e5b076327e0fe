//! `ratelimit-load`: an open-loop load tool for the rate limiter.
//!
//! It sends decisions at a target rate (not "as fast as it can"), to the store directly or to
//! real axum gateways over HTTP on 127.0.0.1, for many users drawn from a chosen distribution,
//! and reports the achieved rate, latency percentiles measured from each request's *scheduled*
//! time (so queueing behind a slow request counts: no coordinated omission), how many decisions
//! each user got against the exact maximum its limit allows, and Redis calls per request.
//!
//! ```no_run
//! use ratelimit_load::{Config, StoreKind, Target};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), ratelimit_load::Error> {
//! let config = Config {
//!     target: Target::Store,
//!     store: StoreKind::Memory,
//!     users: 1_000,
//!     rate: 2_000.0,
//!     duration: Duration::from_secs(1),
//!     ..Config::default()
//! };
//! let report = ratelimit_load::run(&config).await?;
//! assert_eq!(report.users_above_bound, 0);
//! println!("{}", report.text());
//! # Ok(())
//! # }
//! ```
//!
//! The binary's flags, the schedule and the exactness check are described in
//! `docs/load-tool.md`.
#![forbid(unsafe_code)]

mod config;
mod http;
mod report;
mod run;
mod schedule;

pub use config::{Assign, Config, Distribution, Mode, StoreKind, Target, USAGE};
pub use report::{Report, SecondStats, Sweep};
pub use run::{run, sweep};

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--help` was asked for.
    #[error("help requested")]
    Help,
    /// A command-line argument or setting is wrong.
    #[error("{0}")]
    Usage(String),
    /// The limit is not valid.
    #[error("invalid limit: {0}")]
    Limit(#[from] ratelimit_core::ConfigError),
    /// The layer could not be built.
    #[error("invalid layer settings: {0}")]
    Layer(#[from] tower_ratelimit::Error),
    /// Redis could not be reached or set up.
    #[error("redis: {0}")]
    Redis(String),
    /// A socket or file operation failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The run was made but does not show the mode's guarantee (`--check`): what failed.
    #[error("check failed: {}", .0.join("; "))]
    Check(Vec<String>),
}
