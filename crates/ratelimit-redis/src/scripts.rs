//! The Lua scripts, one per algorithm, each with the shared prelude in front.

use std::sync::LazyLock;

use ratelimit_core::Algorithm;
use redis::Script;

macro_rules! script {
    ($file:literal) => {
        concat!(include_str!("lua/prelude.lua"), include_str!($file))
    };
}

const TOKEN_BUCKET: &str = script!("lua/token_bucket.lua");
const GCRA: &str = script!("lua/gcra.lua");
const FIXED_WINDOW: &str = script!("lua/fixed_window.lua");
const SLIDING_WINDOW: &str = script!("lua/sliding_window.lua");
const SLIDING_LOG: &str = script!("lua/sliding_log.lua");

static SCRIPTS: LazyLock<[Script; 5]> = LazyLock::new(|| {
    [
        Script::new(TOKEN_BUCKET),
        Script::new(GCRA),
        Script::new(FIXED_WINDOW),
        Script::new(SLIDING_WINDOW),
        Script::new(SLIDING_LOG),
    ]
});

/// The multi-cost form of a script (request coalescing): the algorithm's script becomes a function
/// run once per cost, in order, on the state the previous cost left (see `lua/multi_head.lua`).
macro_rules! multi {
    ($file:literal) => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/multi_head.lua"),
            include_str!($file),
            include_str!("lua/multi_tail.lua")
        )
    };
}

static MULTI: LazyLock<[Script; 5]> = LazyLock::new(|| {
    [
        Script::new(multi!("lua/token_bucket.lua")),
        Script::new(multi!("lua/gcra.lua")),
        Script::new(multi!("lua/fixed_window.lua")),
        Script::new(multi!("lua/sliding_window.lua")),
        Script::new(multi!("lua/sliding_log.lua")),
    ]
});

const SOURCES: [&str; 5] = [
    TOKEN_BUCKET,
    GCRA,
    FIXED_WINDOW,
    SLIDING_WINDOW,
    SLIDING_LOG,
];

fn index(algorithm: Algorithm) -> Option<usize> {
    match algorithm {
        Algorithm::TokenBucket => Some(0),
        Algorithm::Gcra => Some(1),
        Algorithm::FixedWindow => Some(2),
        Algorithm::SlidingWindow => Some(3),
        Algorithm::SlidingLog => Some(4),
        // `Algorithm` is non-exhaustive: an algorithm added to ratelimit-core later has no script
        // here until this crate is updated.
        _ => None,
    }
}

/// The full Lua source run for `algorithm` (the shared prelude followed by the algorithm's
/// script), for auditing, pre-loading with `SCRIPT LOAD`, or benchmarking with `redis-benchmark`.
/// `None` for an algorithm this version of the crate has no script for.
#[must_use]
pub fn script_source(algorithm: Algorithm) -> Option<&'static str> {
    index(algorithm).map(|i| SOURCES[i])
}

/// The SHA1 of [`script_source`], as used with `EVALSHA`.
#[must_use]
pub fn script_sha(algorithm: Algorithm) -> Option<&'static str> {
    script(algorithm).map(Script::get_hash)
}

pub(crate) fn script(algorithm: Algorithm) -> Option<&'static Script> {
    index(algorithm).map(|i| &SCRIPTS[i])
}

/// The multi-cost script of `algorithm`: ARGV[2] is a comma-separated list of costs; the reply
/// is six integers per cost.
pub(crate) fn multi_script(algorithm: Algorithm) -> Option<&'static Script> {
    index(algorithm).map(|i| &MULTI[i])
}

/// Every script, single- and multi-cost, for loading at start.
pub(crate) fn all() -> impl Iterator<Item = &'static Script> {
    SCRIPTS.iter().chain(MULTI.iter())
}
