//! The rate-limiting algorithms: pure functions of (quota, stored state, now, cost).
//!
//! None of them reads a clock, allocates a timer or keeps hidden state: each `check` takes the
//! stored state and the time, and returns a [`Decision`] and the state to store
//! if the decision is committed. All arithmetic is in integers; see `docs/algorithms.md` for each
//! algorithm's exact admission bound.
//!
//! Each function counts exactly only for a quota that [`Limit::new`](crate::Limit::new) accepts
//! for its algorithm: a [`Quota`] checks its own numbers, the limit checks what the algorithm
//! forms from them (the token bucket's and GCRA's `burst × period / gcd(limit, period)` within
//! 2^52, the sliding window's `limit × period`). [`Limit::check`](crate::Limit::check) is the
//! entry point that has checked; calling a function here with a quota that no limit of its
//! algorithm would take gives unspecified decisions, or an overflow panic in a debug build
//! (never undefined behaviour).

use crate::{Decision, Quota, Timestamp};

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindowState;
pub use token_bucket::TokenBucketState;

/// Which algorithm a [`Limit`](crate::Limit) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket with lazy refill: smooth rate, bursts up to the capacity. The default.
    #[default]
    TokenBucket,
    /// GCRA: the same decisions as the token bucket, kept as one timestamp (except for a check
    /// whose time is before the state's, which GCRA charges as debt: see `docs/algorithms.md`).
    Gcra,
    /// Fixed window aligned to the epoch: cheap, but passes up to twice the limit across a
    /// window boundary.
    FixedWindow,
    /// Sliding-window counter: two counters, weighted; close to exact at fixed cost.
    SlidingWindow,
    /// Sliding log: exact over any window of `period`, memory proportional to the limit.
    SlidingLog,
}

impl Algorithm {
    /// Whether a quota's `burst` counts: the token bucket's and GCRA's capacity. The window
    /// algorithms allow `limit` per period: [`Limit::new`](crate::Limit::new) refuses them a
    /// burst other than the limit, which they could only ignore.
    #[must_use]
    pub const fn uses_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];

    /// A short lowercase name: `token_bucket`, `gcra`, `fixed_window`, `sliding_window`,
    /// `sliding_log`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
        }
    }

    /// The state of a key never seen, at `now`.
    #[must_use]
    pub fn fresh_state(self, quota: &Quota, now: Timestamp) -> State {
        match self {
            Algorithm::TokenBucket => State::TokenBucket(TokenBucketState::fresh(quota, now)),
            Algorithm::Gcra => State::Gcra(GcraState::fresh(now)),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindowState::fresh(quota, now)),
            Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindowState::fresh(quota, now)),
            Algorithm::SlidingLog => State::SlidingLog(Box::default()),
        }
    }

    /// Checks `cost` at `now` against `state` (a state of another algorithm counts as none).
    /// Returns the decision and the state to store if the decision is committed.
    #[must_use]
    pub fn check(
        self,
        quota: &Quota,
        state: Option<&State>,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, State) {
        match self {
            Algorithm::TokenBucket => {
                let s = match state {
                    Some(State::TokenBucket(s)) => Some(s),
                    _ => None,
                };
                let (d, s) = token_bucket::check(quota, s, now, cost);
                (d, State::TokenBucket(s))
            }
            Algorithm::Gcra => {
                let s = match state {
                    Some(State::Gcra(s)) => Some(s),
                    _ => None,
                };
                let (d, s) = gcra::check(quota, s, now, cost);
                (d, State::Gcra(s))
            }
            Algorithm::FixedWindow => {
                let s = match state {
                    Some(State::FixedWindow(s)) => Some(s),
                    _ => None,
                };
                let (d, s) = fixed_window::check(quota, s, now, cost);
                (d, State::FixedWindow(s))
            }
            Algorithm::SlidingWindow => {
                let s = match state {
                    Some(State::SlidingWindow(s)) => Some(s),
                    _ => None,
                };
                let (d, s) = sliding_window::check(quota, s, now, cost);
                (d, State::SlidingWindow(s))
            }
            Algorithm::SlidingLog => {
                let s = match state {
                    Some(State::SlidingLog(s)) => Some(&**s),
                    _ => None,
                };
                let (d, s) = sliding_log::check(quota, s, now, cost);
                (d, State::SlidingLog(Box::new(s)))
            }
        }
    }

    /// Checks `cost` at `now` against `state` and, if it is admitted, updates `state` in place.
    /// A state of another algorithm counts as none: the check is decided as on a fresh key, and
    /// an admission replaces that state with this algorithm's. A denied check, and a peek
    /// (cost 0), leave any state as it was: a peek at a later time must not move the state
    /// forward, nor one at an earlier time move it back.
    #[must_use]
    pub fn check_in_place(
        self,
        quota: &Quota,
        state: &mut State,
        now: Timestamp,
        cost: u64,
    ) -> Decision {
        let (decision, next) = self.decide(quota, Some(state), now, cost);
        if decision.is_allowed() {
            self.commit(quota, state, next, now, cost);
        }
        decision
    }

    /// The decision for `cost` at `now`, and what [`commit`](Algorithm::commit) needs to record
    /// it: the state to store, or `None` for a sliding log held in `state`, which is changed in
    /// place instead of copied.
    pub(crate) fn decide(
        self,
        quota: &Quota,
        state: Option<&State>,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, Option<State>) {
        match (self, state) {
            (Algorithm::SlidingLog, Some(State::SlidingLog(log))) => {
                (sliding_log::decide(quota, log, now, cost), None)
            }
            _ => {
                let (decision, next) = self.check(quota, state, now, cost);
                (decision, Some(next))
            }
        }
    }

    /// Records an admission [`decide`](Algorithm::decide) made, with what it returned. A peek
    /// (cost 0) records nothing.
    pub(crate) fn commit(
        self,
        quota: &Quota,
        state: &mut State,
        next: Option<State>,
        now: Timestamp,
        cost: u64,
    ) {
        if cost == 0 {
            return;
        }
        match (next, state) {
            (Some(next), state) => *state = next,
            (None, State::SlidingLog(log)) => sliding_log::commit(quota, log, now, cost),
            // `decide` returns `None` only for a sliding log held in the state.
            (None, _) => {}
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm from its [`name`](Algorithm::name) (`"gcra"`, `"token_bucket"`...), as
/// `Display` prints it and the `serde` feature reads it; `-` may stand for `_`, in any case.
///
/// ```
/// use ratelimit_core::Algorithm;
///
/// assert_eq!("sliding-window".parse(), Ok(Algorithm::SlidingWindow));
/// assert!("leaky_bucket".parse::<Algorithm>().is_err());
/// ```
impl std::str::FromStr for Algorithm {
    type Err = crate::ConfigError;

    fn from_str(s: &str) -> Result<Algorithm, crate::ConfigError> {
        let name = s.replace('-', "_").to_ascii_lowercase();
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| crate::ConfigError::UnknownAlgorithm {
                given: s.to_owned(),
            })
    }
}

/// Read as [`FromStr`](std::str::FromStr) reads a name (`"sliding-window"` and `"GCRA"` too, as
/// on a command line), written as [`name`](Algorithm::name) gives it. An unknown name is serde's
/// `unknown variant` error, listing the names.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse()
            .map_err(|_| serde::de::Error::unknown_variant(&name, &NAMES))
    }
}

/// The names of [`Algorithm::ALL`], in order, for an error's list.
#[cfg(feature = "serde")]
const NAMES: [&str; 5] = [
    "token_bucket",
    "gcra",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;
    use serde::Deserialize;
    use serde::de::value::{Error, StrDeserializer};

    fn read(name: &str) -> Result<Algorithm, Error> {
        Algorithm::deserialize(StrDeserializer::<Error>::new(name))
    }

    /// A configuration reads a name as `parse` does: a file and a command line agree.
    #[test]
    fn a_configuration_reads_names_as_parse_does() {
        assert_eq!(NAMES, Algorithm::ALL.map(Algorithm::name));
        for a in Algorithm::ALL {
            assert_eq!(read(a.name()), Ok(a));
            assert_eq!(read(&a.name().replace('_', "-").to_uppercase()), Ok(a));
        }
        let e = read("leaky_bucket").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown variant `leaky_bucket`, expected one of `token_bucket`"),
            "{e}"
        );
    }
}

/// The stored state of one quota of one key, for any algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum State {
    /// See [`TokenBucketState`].
    TokenBucket(TokenBucketState),
    /// See [`GcraState`].
    Gcra(GcraState),
    /// See [`FixedWindowState`].
    FixedWindow(FixedWindowState),
    /// See [`SlidingWindowState`].
    SlidingWindow(SlidingWindowState),
    /// See [`SlidingLogState`] (boxed: it is the one state that grows).
    SlidingLog(Box<SlidingLogState>),
}

impl State {
    /// The time from which this state is the same as no state at all: it may be forgotten then
    /// without changing any decision. Stores use it for expiry.
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> Timestamp {
        match self {
            State::TokenBucket(s) => s.fresh_at(quota),
            State::Gcra(s) => s.fresh_at(),
            State::FixedWindow(s) => s.fresh_at(quota),
            State::SlidingWindow(s) => s.fresh_at(quota),
            State::SlidingLog(s) => s.fresh_at(quota),
        }
    }
}

/// The latest time the algorithms count with: 2^52 µs after the epoch (the year 2112 for Unix
/// time). A later time is taken as this one, so that no sum of a time and a period can overflow.
pub const MAX_TIME: u64 = 1 << 52;

/// `ceil(a / b)` for `b > 0`. Most quotas refill a whole number of units per microsecond with
/// `b == 1`; that case skips the division, the slowest instruction on the hot path.
#[inline]
pub(crate) const fn ceil_div(a: u64, b: u64) -> u64 {
    if b == 1 {
        a
    } else {
        a / b + !a.is_multiple_of(b) as u64
    }
}

/// `a × b >= c`, without overflow and without dividing.
#[inline]
pub(crate) const fn mul_at_least(a: u64, b: u64, c: u64) -> bool {
    match a.checked_mul(b) {
        Some(p) => p >= c,
        None => true,
    }
}
