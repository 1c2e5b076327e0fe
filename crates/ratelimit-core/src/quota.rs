//! Quotas: how many requests per how long, validated once.

use std::time::Duration;

use crate::error::ConfigError;
use crate::time::duration_to_micros;

/// The largest integer any store computes with: 2^52 (Lua numbers are doubles, exact to 2^53).
pub const MAX_EXACT: u64 = 1 << 52;

/// A validated rate: `limit` requests per `period`, with a `burst` (capacity) that defaults to
/// `limit`.
///
/// Rates are named with their units: `Quota::per_second(5)` is five requests every second, not one
/// request every five seconds.
///
/// ```
/// use ratelimit_core::Quota;
/// use std::time::Duration;
///
/// let api = Quota::per_minute(100)?;
/// assert_eq!(api.limit(), 100);
/// assert_eq!(api.period(), Duration::from_secs(60));
/// assert_eq!(api.burst(), 100);
///
/// // 10 per second on average, up to 20 at once.
/// let bursty = Quota::per_second(10)?.with_burst(20)?;
/// assert_eq!(bursty.burst(), 20);
///
/// assert!(Quota::per_second(0).is_err());
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
///
/// What each number means per algorithm:
/// - token bucket and GCRA: the bucket holds `burst` tokens and refills `limit` tokens per
///   `period`, continuously;
/// - fixed window, sliding window and sliding log: at most `limit` per `period`; `burst` is not
///   used, and must be left at `limit` ([`Limit::new`](crate::Limit::new) refuses another).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_micros: u64,
    burst: u64,
    // Derived once, at validation (they cost a gcd).
    scale: u64,
    refill_per_micro: u64,
    /// `burst × scale`, saturated: read on every check of the bucket algorithms, where a
    /// multiplication checked for overflow took a few instructions more each time.
    capacity: u64,
}

/// What was configured (`Quota { limit: 20, period: 10s, burst: 30 }`), not the numbers derived
/// from it for the algorithms.
impl std::fmt::Debug for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quota")
            .field("limit", &self.limit)
            .field("period", &Duration::from_micros(self.period_micros))
            .field("burst", &self.burst)
            .finish()
    }
}

impl Quota {
    /// `limit` requests per second.
    pub fn per_second(limit: u64) -> Result<Quota, ConfigError> {
        Quota::per_period(limit, Duration::from_secs(1))
    }

    /// `limit` requests per minute.
    pub fn per_minute(limit: u64) -> Result<Quota, ConfigError> {
        Quota::per_period(limit, Duration::from_secs(60))
    }

    /// `limit` requests per hour.
    pub fn per_hour(limit: u64) -> Result<Quota, ConfigError> {
        Quota::per_period(limit, Duration::from_secs(3_600))
    }

    /// `limit` requests per day (86,400 seconds).
    pub fn per_day(limit: u64) -> Result<Quota, ConfigError> {
        Quota::per_period(limit, Duration::from_secs(86_400))
    }

    /// `limit` requests per `period`. The period is counted in whole microseconds (a sub-microsecond
    /// remainder is dropped) and must be between 1 µs and 2^52 µs.
    pub fn per_period(limit: u64, period: Duration) -> Result<Quota, ConfigError> {
        Quota::per_period_with_burst(limit, period, limit)
    }

    /// `limit` requests per `period` with a bucket of `burst` (see [`with_burst`](Self::with_burst)),
    /// in one call.
    pub fn per_period_with_burst(
        limit: u64,
        period: Duration,
        burst: u64,
    ) -> Result<Quota, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        let period_micros = duration_to_micros(period);
        if period_micros == 0 {
            return Err(ConfigError::PeriodTooShort {
                nanos: period.as_nanos(),
            });
        }
        if period_micros > MAX_EXACT {
            return Err(ConfigError::PeriodTooLong {
                micros: period.as_micros(),
            });
        }
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        Quota {
            limit,
            period_micros,
            burst,
            scale: 0,
            refill_per_micro: 0,
            capacity: 0,
        }
        .validated()
    }

    /// The same rate with a different burst (bucket capacity): how many requests may pass at once
    /// after a quiet spell. Used by the token bucket and GCRA; a limit of a window algorithm
    /// refuses a burst other than the limit ([`Limit::new`](crate::Limit::new)).
    pub fn with_burst(self, burst: u64) -> Result<Quota, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        Quota { burst, ..self }.validated()
    }

    /// Every count, the limit and the burst included, stays within 2^52 (the Redis scripts
    /// count in doubles). What each algorithm forms from them (the bucket's `burst × scale`, the
    /// sliding window's `limit × period`) is checked by [`Limit::new`](crate::Limit::new), which
    /// knows the algorithm: a fixed window of 100,001 a day needs no bucket that fits.
    fn validated(mut self) -> Result<Quota, ConfigError> {
        let g = gcd(self.limit, self.period_micros);
        self.scale = self.period_micros / g;
        self.refill_per_micro = self.limit / g;
        self.capacity = self.burst.saturating_mul(self.scale);
        for (what, value) in [("limit", self.limit), ("burst", self.burst)] {
            if value > MAX_EXACT {
                return Err(ConfigError::AboveExact { what, value });
            }
        }
        Ok(self)
    }

    /// Whether the bucket algorithms can count this quota exactly: `burst × scale`, the bucket
    /// in level units, is at most 2^52 (the capacity saturates well above it).
    pub(crate) fn fits_bucket(&self) -> bool {
        self.capacity <= MAX_EXACT
    }

    pub(crate) fn too_large(&self, algorithm: crate::Algorithm) -> ConfigError {
        ConfigError::TooLarge {
            algorithm,
            limit: self.limit,
            period_micros: self.period_micros,
            burst: self.burst,
        }
    }

    /// Requests allowed per period.
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    #[must_use]
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros)
    }

    /// The period in microseconds.
    #[must_use]
    pub const fn period_micros(&self) -> u64 {
        self.period_micros
    }

    /// The bucket capacity (defaults to [`limit`](Quota::limit)).
    #[must_use]
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// Units of bucket level that make one token: `period / gcd(limit, period)`.
    ///
    /// The bucket algorithms count in these units so that a refill of `limit` tokens per `period`
    /// is an integer number of units per microsecond ([`refill_per_micro`](Quota::refill_per_micro)),
    /// exactly, for every quota.
    #[must_use]
    pub const fn scale(&self) -> u64 {
        self.scale
    }

    /// Units of bucket level refilled per microsecond: `limit / gcd(limit, period)`.
    #[must_use]
    pub const fn refill_per_micro(&self) -> u64 {
        self.refill_per_micro
    }

    /// The bucket capacity in level units: `burst × scale`, at most 2^52 in a token-bucket or GCRA
    /// [`Limit`](crate::Limit) (a quota that only a window algorithm can count exactly saturates
    /// at `u64::MAX`).
    #[must_use]
    pub const fn capacity_units(&self) -> u64 {
        self.capacity
    }
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_what_was_configured() {
        let q = Quota::per_period(20, Duration::from_secs(10))
            .unwrap()
            .with_burst(30)
            .unwrap();
        assert_eq!(
            format!("{q:?}"),
            "Quota { limit: 20, period: 10s, burst: 30 }"
        );
    }

    #[test]
    fn a_limit_above_2_52_is_refused_even_with_a_small_burst() {
        let one_us = Duration::from_micros(1);
        assert!(Quota::per_period_with_burst(MAX_EXACT + 1, one_us, 1).is_err());
        assert!(Quota::per_period_with_burst(MAX_EXACT, one_us, 1).is_ok());
    }

    #[test]
    fn units_are_in_the_names() {
        let q = Quota::per_second(5).unwrap();
        assert_eq!((q.limit(), q.period()), (5, Duration::from_secs(1)));
        let q = Quota::per_minute(100).unwrap();
        assert_eq!(q.period_micros(), 60_000_000);
        assert_eq!(
            Quota::per_hour(1).unwrap().period(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            Quota::per_day(1).unwrap().period(),
            Duration::from_secs(86_400)
        );
    }

    #[test]
    fn bad_values_are_typed_errors() {
        assert_eq!(Quota::per_second(0), Err(ConfigError::ZeroLimit));
        assert_eq!(
            Quota::per_period(1, Duration::from_nanos(999)),
            Err(ConfigError::PeriodTooShort { nanos: 999 })
        );
        assert!(matches!(
            Quota::per_period(1, Duration::MAX),
            Err(ConfigError::PeriodTooLong { .. })
        ));
        // The period given, also past what a u64 of microseconds holds (was: u64::MAX µs).
        assert_eq!(
            Quota::per_period(1, Duration::from_secs(1 << 53))
                .unwrap_err()
                .to_string(),
            "a quota's period must be at most 2^52 microseconds (got 9007199254740992000000 µs)"
        );
        assert_eq!(
            Quota::per_period(1, Duration::from_millis(18_446_744_073_709_552))
                .unwrap_err()
                .to_string(),
            "a quota's period must be at most 2^52 microseconds (got 18446744073709552000 µs)"
        );
        assert_eq!(
            Quota::per_second(1).unwrap().with_burst(0),
            Err(ConfigError::ZeroBurst)
        );
        assert_eq!(
            Quota::per_second(u64::MAX),
            Err(ConfigError::AboveExact {
                what: "limit",
                value: u64::MAX
            })
        );
        assert_eq!(
            Quota::per_second(1).unwrap().with_burst(MAX_EXACT + 1),
            Err(ConfigError::AboveExact {
                what: "burst",
                value: MAX_EXACT + 1
            })
        );
        // 7 per day with a burst of a million cannot be counted exactly in 2^52 units by a
        // bucket; a window does not count in them.
        let q = Quota::per_day(7).unwrap().with_burst(1_000_000).unwrap();
        assert!(!q.fits_bucket());
        assert!(q.capacity_units() > MAX_EXACT);
        let q = Quota::per_period(1, Duration::from_micros(MAX_EXACT - 1)).unwrap();
        assert_eq!(q.with_burst(MAX_EXACT).unwrap().capacity_units(), u64::MAX);
    }

    #[test]
    fn scale_makes_refill_an_integer() {
        // 2 per second: one token is 500,000 units... reduced by the gcd.
        let q = Quota::per_second(2).unwrap();
        assert_eq!(q.scale() * 2, q.refill_per_micro() * 1_000_000);
        let q = Quota::per_minute(100).unwrap();
        assert_eq!(q.scale(), 600_000);
        assert_eq!(q.refill_per_micro(), 1);
        let q = Quota::per_second(3).unwrap();
        assert_eq!((q.scale(), q.refill_per_micro()), (1_000_000, 3));
    }
}
