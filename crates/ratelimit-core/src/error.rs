//! Configuration errors.

use crate::Algorithm;

/// Why a [`Quota`](crate::Quota) or a [`Limit`](crate::Limit) was refused.
///
/// Nothing in this crate panics on a bad setting: every constructor returns this instead, so a
/// configuration file can be checked at start-up with a message that names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The number of requests per period was zero.
    #[error("a quota must allow at least one request per period (got 0)")]
    ZeroLimit,
    /// The burst (bucket capacity) was zero.
    #[error("a quota's burst (capacity) must be at least 1 (got 0)")]
    ZeroBurst,
    /// The period was shorter than one microsecond, the unit of time used throughout.
    #[error("a quota's period must be at least 1 microsecond (got {nanos} ns)")]
    PeriodTooShort {
        /// The period that was given, in nanoseconds.
        nanos: u128,
    },
    /// The period was longer than the largest supported (2^52 microseconds, about 142 years).
    #[error("a quota's period must be at most 2^52 microseconds (got {micros} µs)")]
    PeriodTooLong {
        /// The period that was given, in whole microseconds.
        micros: u128,
    },
    /// A quota's limit or burst is above 2^52, the largest count every store computes exactly
    /// (Redis runs its scripts on doubles, exact to 2^53, and the remaining bit is headroom).
    #[error("a quota's {what} must be at most 2^52 (got {value})")]
    AboveExact {
        /// `"limit"` or `"burst"`.
        what: &'static str,
        /// The number given.
        value: u64,
    },
    /// The quota's numbers are too large for its algorithm to be computed exactly by every
    /// store, which compute in integers no larger than 2^52.
    ///
    /// This bounds `burst × period / gcd(limit, period)` for the bucket algorithms (token bucket
    /// and GCRA) and `limit × period` (in microseconds) for the sliding window. The sliding log
    /// keeps one entry per admission, and takes a limit of at most
    /// [`MAX_SLIDING_LOG_LIMIT`](crate::MAX_SLIDING_LOG_LIMIT). The fixed window needs nothing
    /// more than [`AboveExact`](ConfigError::AboveExact). Checked by
    /// [`Limit::new`](crate::Limit::new), which knows the algorithm; the message says which
    /// bound, and what to change.
    #[error(
        "the quota {limit} per {period_micros} µs{} is too large for the {} algorithm: {}",
        BurstNote(*algorithm, *burst),
        algorithm.name(),
        too_large_hint(*algorithm)
    )]
    TooLarge {
        /// The algorithm the quota was checked for.
        algorithm: Algorithm,
        /// The quota's limit.
        limit: u64,
        /// The quota's period in microseconds.
        period_micros: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// A store or layer setting is out of range.
    #[error("invalid setting `{name}`: {reason}")]
    InvalidSetting {
        /// The setting's name.
        name: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// A name that is no [`Algorithm`]'s (see [`Algorithm::name`]; parsed with `str::parse`).
    #[error(
        "unknown algorithm {given:?}: one of token_bucket, gcra, fixed_window, sliding_window, sliding_log"
    )]
    UnknownAlgorithm {
        /// The name given.
        given: String,
    },
    /// A [`Limit`](crate::Limit) was built with no quota.
    #[error("a limit needs at least one quota")]
    NoQuota,
    /// A [`Limit`](crate::Limit) was built with more quotas than supported.
    #[error("a limit may combine at most {max} quotas (got {got})")]
    TooManyQuotas {
        /// The largest number of quotas in one limit.
        max: usize,
        /// How many were given.
        got: usize,
    },
}

/// A quota's burst in [`ConfigError::TooLarge`]'s message, for the algorithms that have one (the
/// window algorithms refuse a burst setting: naming one there would send the reader looking for
/// it).
struct BurstNote(Algorithm, u64);

impl std::fmt::Display for BurstNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.uses_burst() {
            write!(f, " (burst {})", self.1)
        } else {
            Ok(())
        }
    }
}

/// What bounds a quota under `algorithm`, and what to change, for [`ConfigError::TooLarge`].
fn too_large_hint(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            "burst × period (µs) / gcd(limit, period) must be at most 2^52; use a shorter period, \
             a smaller burst, or a limit that divides the period more evenly"
        }
        Algorithm::SlidingWindow => {
            "limit × period (µs) must be at most 2^52; use a shorter period or a smaller limit"
        }
        Algorithm::SlidingLog => {
            "a sliding log keeps one entry per admission and takes a limit of at most 100,000; \
             use the sliding window for larger limits"
        }
        Algorithm::FixedWindow => "the limit must be at most 2^52",
    }
}
