//! Points in time as integer microseconds.

use std::time::Duration;

/// A point in time: whole microseconds since the epoch of the [`Clock`](crate::Clock) that produced it.
///
/// Every algorithm in this crate works on integer microseconds, so that the Redis scripts (whose
/// numbers are doubles, exact up to 2^53) make bit-for-bit the same decisions as the Rust code.
/// Microseconds since the Unix epoch stay below 2^53 until the year 2255.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch itself.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp `micros` microseconds after the epoch.
    #[must_use]
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// A timestamp `millis` milliseconds after the epoch (saturating).
    #[must_use]
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000))
    }

    /// A timestamp `secs` seconds after the epoch (saturating).
    #[must_use]
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1_000_000))
    }

    /// Microseconds since the epoch.
    #[must_use]
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This timestamp moved `d` later, saturating; sub-microsecond parts of `d` are dropped.
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_to_micros(d)))
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    #[must_use]
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

/// Whole microseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn duration_to_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
