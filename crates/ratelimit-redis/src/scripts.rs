//! The Lua scripts, one per algorithm, each with the shared prelude in front.

use std::sync::LazyLock;

use ratelimit_core::Algorithm;
use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");
const HELPERS: &str = include_str!("lua/helpers.lua");
/// The line of an algorithm's script where the general path's helpers go (after its fast path).
const HELPERS_MARK: &str = "--@helpers\n";

/// The algorithms' own scripts, in [`index`] order.
const ALGORITHMS: [&str; 5] = [
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
];

/// An algorithm's script with the shared helpers in place of its `--@helpers` line (every
/// script has one; a test checks it).
fn with_helpers(algorithm: &str) -> String {
    let (fast, general) = algorithm
        .split_once(HELPERS_MARK)
        .unwrap_or(("", algorithm));
    [fast, HELPERS, general].concat()
}

/// The single-cost sources: the prelude, then the algorithm's script.
static SOURCES: LazyLock<[String; 5]> =
    LazyLock::new(|| ALGORITHMS.map(|a| [PRELUDE, &with_helpers(a)].concat()));

static SCRIPTS: LazyLock<[Script; 5]> =
    LazyLock::new(|| SOURCES.each_ref().map(|s| Script::new(s)));

/// The multi-cost form of a script (request coalescing): the algorithm's script becomes a function
/// run once per cost, in order, on the state the previous cost left (see `lua/multi_head.lua`).
static MULTI_SOURCES: LazyLock<[String; 5]> = LazyLock::new(|| {
    ALGORITHMS.map(|a| {
        [
            PRELUDE,
            include_str!("lua/multi_head.lua"),
            &with_helpers(a),
            include_str!("lua/multi_tail.lua"),
        ]
        .concat()
    })
});

static MULTI: LazyLock<[Script; 5]> =
    LazyLock::new(|| MULTI_SOURCES.each_ref().map(|s| Script::new(s)));

/// The reset script's source (`RedisStore::reset`): it deletes the keys it is given.
const RESET_SOURCE: &str = include_str!("lua/reset.lua");

static RESET: LazyLock<Script> = LazyLock::new(|| Script::new(RESET_SOURCE));

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
    index(algorithm).map(|i| SOURCES[i].as_str())
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

/// The source of one of this crate's scripts (`redis::Script` keeps its own private), for a
/// `SCRIPT LOAD` sent to one node only.
pub(crate) fn source_of(script: &Script) -> Option<&'static str> {
    if script.get_hash() == RESET.get_hash() {
        return Some(RESET_SOURCE);
    }
    SCRIPTS
        .iter()
        .zip(SOURCES.iter())
        .chain(MULTI.iter().zip(MULTI_SOURCES.iter()))
        .find(|(s, _)| s.get_hash() == script.get_hash())
        .map(|(_, source)| source.as_str())
}

/// The script of `RedisStore::reset`.
pub(crate) fn reset_script() -> &'static Script {
    &RESET
}

/// Every script, single- and multi-cost, and the reset's, for loading at start.
pub(crate) fn all() -> impl Iterator<Item = &'static Script> {
    SCRIPTS
        .iter()
        .chain(MULTI.iter())
        .chain(std::iter::once(&*RESET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_marks_where_the_helpers_go_once() {
        for (i, script) in ALGORITHMS.iter().enumerate() {
            assert_eq!(script.matches(HELPERS_MARK).count(), 1, "script {i}");
            let source = &SOURCES[i];
            assert!(source.starts_with(PRELUDE));
            assert!(!source.contains(HELPERS_MARK));
            assert_eq!(source.matches("local function helpers()").count(), 1);
        }
    }

    #[test]
    fn every_script_has_its_source() {
        for script in all() {
            let source = source_of(script).unwrap();
            assert_eq!(Script::new(source).get_hash(), script.get_hash());
        }
        assert_eq!(source_of(&Script::new("return 1")), None);
    }

    #[test]
    fn fast_paths_come_before_the_helpers() {
        // Every algorithm but the sliding log has a single-quota fast path that returns before
        // the helpers closure is made.
        for source in &SOURCES[..4] {
            let fast = source.find("if N == 1 then").unwrap();
            assert!(fast < source.find("local function helpers()").unwrap());
        }
    }
}
