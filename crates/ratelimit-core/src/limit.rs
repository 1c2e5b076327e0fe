//! A limit: one algorithm and one or more quotas, checked together all-or-nothing.

use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::State;
use crate::quota::MAX_EXACT;
use crate::{Algorithm, ConfigError, Decision, Quota, Timestamp};

/// The most quotas one limit may combine.
pub const MAX_QUOTAS: usize = 8;

/// The largest limit per period the sliding log accepts (its memory per key grows with it).
pub const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;

/// What a key is held to: an [`Algorithm`] and one or more [`Quota`]s.
///
/// With several quotas (say 10 per second with bursts of 20, and 1,000 per hour) a request passes
/// only if every quota has room, and then it consumes from all of them; if any denies, none
/// consumes.
///
/// ```
/// use ratelimit_core::{Algorithm, Limit, Quota};
///
/// let limit = Limit::new(
///     Algorithm::TokenBucket,
///     [Quota::per_second(10)?.with_burst(20)?, Quota::per_hour(1_000)?],
/// )?;
/// assert_eq!(limit.quotas().len(), 2);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    /// Shared: a clone (a policy per request, a coalesced batch) allocates nothing.
    quotas: Arc<[Quota]>,
    fingerprint: u64,
}

impl Limit {
    /// A limit of `algorithm` over `quotas` (at least one, at most [`MAX_QUOTAS`]). A window
    /// algorithm's quotas take no burst but their limit (`ConfigError::InvalidSetting` names
    /// `burst` otherwise): they admit at most `limit` a period, and would ignore it.
    pub fn new(
        algorithm: Algorithm,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<Limit, ConfigError> {
        let quotas: Arc<[Quota]> = quotas.into_iter().collect();
        if quotas.is_empty() {
            return Err(ConfigError::NoQuota);
        }
        if quotas.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas {
                max: MAX_QUOTAS,
                got: quotas.len(),
            });
        }
        for q in quotas.iter() {
            // The window algorithms admit at most `limit` a period and have no bucket: a burst of
            // another size would be silently unused.
            if !algorithm.uses_burst() && q.burst() != q.limit() {
                return Err(ConfigError::InvalidSetting {
                    name: "burst",
                    reason: "is used only by the token bucket and GCRA; the window algorithms \
                             admit at most `limit` per period (leave the burst at the limit)",
                });
            }
            let fits = match algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => q.fits_bucket(),
                Algorithm::SlidingWindow => {
                    u128::from(q.limit()) * u128::from(q.period_micros()) <= u128::from(MAX_EXACT)
                }
                Algorithm::SlidingLog => q.limit() <= MAX_SLIDING_LOG_LIMIT,
                Algorithm::FixedWindow => true,
            };
            if !fits {
                return Err(q.too_large(algorithm));
            }
        }
        let fingerprint = fingerprint(algorithm, &quotas);
        Ok(Limit {
            algorithm,
            quotas,
            fingerprint,
        })
    }

    /// A limit of one quota.
    pub fn single(algorithm: Algorithm, quota: Quota) -> Result<Limit, ConfigError> {
        Limit::new(algorithm, [quota])
    }

    /// The algorithm.
    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quotas, in the order given.
    #[must_use]
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// A stable 64-bit digest of the algorithm and quotas. Stores keep state per (key, limit):
    /// when a key's limit changes, it starts afresh rather than reading a state counted in other
    /// units.
    #[must_use]
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The largest cost this limit can ever admit at once: the smallest bucket (`burst`) of the
    /// token bucket and GCRA, the smallest `limit` of the window algorithms. A larger cost is
    /// always denied ([`Outcome::Exceeds`](crate::Outcome::Exceeds)), so a configuration that can
    /// charge one should be refused.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, Limit, Quota};
    ///
    /// let q = Quota::per_minute(100)?.with_burst(20)?;
    /// assert_eq!(Limit::single(Algorithm::TokenBucket, q)?.max_cost(), 20);
    /// let window = Quota::per_minute(100)?;
    /// assert_eq!(Limit::single(Algorithm::FixedWindow, window)?.max_cost(), 100);
    /// # Ok::<(), ratelimit_core::ConfigError>(())
    /// ```
    #[must_use]
    pub fn max_cost(&self) -> u64 {
        let bucket = self.algorithm.uses_burst();
        self.quotas
            .iter()
            .map(|q| if bucket { q.burst() } else { q.limit() })
            .min()
            .unwrap_or(0)
    }

    /// The longest period among the quotas.
    #[must_use]
    pub fn longest_period(&self) -> Duration {
        self.quotas
            .iter()
            .map(Quota::period)
            .max()
            .unwrap_or_default()
    }

    /// Each gateway's local share of this limit when `n` gateways each count alone (the local
    /// fallback when the shared store is down; `n` = 0 is taken as 1, the whole limit): every
    /// limit and burst divided by `n`, rounded down
    /// but at least 1, so that `n` gateways together admit no more than the limit, except where
    /// the rounding up to 1 adds: a limit below `n`, or a burst below `n` (a burst of 5 over 10
    /// gateways is a burst of 1 each, 10 together).
    ///
    /// A share's limit may have fewer factors in common with the period than the limit had (a
    /// day's 10,000,000 divided by 3), which can take a token bucket's or GCRA's share past what
    /// it counts exactly ([`ConfigError::TooLarge`]); the share's limit is then rounded down further, to a
    /// multiple of the smallest divisor of the period that makes it fit (3,333,312 for that
    /// example: 21 fewer a day). That costs little for periods of whole seconds, minutes, hours
    /// or days, which have many divisors; a period with few (a prime number of microseconds)
    /// may lose a third of the share or more (285,000,033 a 95,000,011 µs period, halved, is a
    /// plain share of 142,500,016, rounded down to 95,000,011), always downwards. Where no multiple is left below the share's limit, the
    /// share keeps its limit and its burst is lowered to what fits instead.
    ///
    /// So every limit [`Limit::new`] accepts has a share for any `n` (property-tested on random
    /// limits, prime periods among them: `every_limit_can_be_divided`); the `Result` is kept for
    /// a rule a later version may add.
    pub fn divided(&self, n: u64) -> Result<Limit, ConfigError> {
        let n = n.max(1);
        let quotas = self
            .quotas
            .iter()
            .map(|q| local_share(q, n, self.algorithm.uses_burst()))
            .collect::<Result<Vec<_>, _>>()?;
        Limit::new(self.algorithm, quotas)
    }

    /// The state of quota `index` for a key never seen.
    ///
    /// # Panics
    ///
    /// If `index` is not below the number of quotas ([`quotas`](Self::quotas)`().len()`).
    #[must_use]
    pub fn fresh_state(&self, index: usize, now: Timestamp) -> State {
        self.algorithm.fresh_state(&self.quotas[index], now)
    }

    /// Fresh states for every quota.
    #[must_use]
    pub fn fresh_states(&self, now: Timestamp) -> Vec<State> {
        (0..self.quotas.len())
            .map(|i| self.fresh_state(i, now))
            .collect()
    }

    /// Checks `cost` at `now` against every quota, all-or-nothing: if every quota allows, the
    /// new states are written into `states`; otherwise, and for a peek (cost 0), `states` is left
    /// as it was.
    ///
    /// `states` holds one state per quota, in order (see [`fresh_states`](Limit::fresh_states)
    /// for a key never seen). A state of another algorithm counts as fresh. A quota with no state
    /// in the slice (a slice shorter than the quotas) is checked as fresh, and what it admits
    /// cannot be recorded: always pass one state per quota.
    #[must_use]
    pub fn check(&self, states: &mut [State], now: Timestamp, cost: u64) -> Decision {
        if let ([quota], [state]) = (&*self.quotas, &mut *states) {
            return self.algorithm.check_in_place(quota, state, now, cost);
        }
        // Decide every quota first, reading the states; write only if all admit.
        let mut decisions =
            [Decision::new(crate::Outcome::Allowed, 0, 0, Duration::ZERO, 0); MAX_QUOTAS];
        let mut next: [Option<State>; MAX_QUOTAS] = Default::default();
        for (i, quota) in self.quotas.iter().enumerate() {
            let (d, n) = self.algorithm.decide(quota, states.get(i), now, cost);
            decisions[i] = d.with_quota_index(i);
            next[i] = n;
        }
        let decision = Decision::combine(&decisions[..self.quotas.len()])
            .expect("a limit has at least one quota");
        if decision.is_allowed() {
            for ((quota, state), next) in self.quotas.iter().zip(states.iter_mut()).zip(next) {
                self.algorithm.commit(quota, state, next, now, cost);
            }
        }
        decision
    }

    /// When every state is fresh again (the latest of their fresh times).
    #[must_use]
    pub fn fresh_at(&self, states: &[State]) -> Timestamp {
        states
            .iter()
            .zip(self.quotas.iter())
            .map(|(s, q)| s.fresh_at(q))
            .max()
            .unwrap_or(Timestamp::ZERO)
    }
}

fn fingerprint(algorithm: Algorithm, quotas: &[Quota]) -> u64 {
    // Fixed keys: the fingerprint must be the same in every process (it is part of Redis keys).
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x7261_7465_6c69_6d69, 0x7420_7631);
    h.write(algorithm.name().as_bytes());
    // Little-endian bytes on every host (`write_u64` hashes native-endian ones): a fleet of mixed
    // hosts must name the same Redis keys.
    for q in quotas {
        h.write(&q.limit().to_le_bytes());
        h.write(&q.period_micros().to_le_bytes());
        h.write(&q.burst().to_le_bytes());
    }
    h.finish()
}

/// `q`'s share for one of `n` gateways (see [`Limit::divided`]), rounded to fit a bucket if the
/// algorithm counts in one.
fn local_share(q: &Quota, n: u64, bucket: bool) -> Result<Quota, ConfigError> {
    let limit = (q.limit() / n).max(1);
    let burst = (q.burst() / n).max(1);
    let share = Quota::per_period_with_burst(limit, q.period(), burst)?;
    if !bucket || share.fits_bucket() {
        return Ok(share);
    }
    // `burst * period / gcd(limit, period)` must be at most MAX_EXACT: a limit that is a multiple
    // of a divisor `d` of the period with `d >= burst * period / MAX_EXACT` makes it so.
    let period = q.period_micros();
    let need = (u128::from(burst) * u128::from(period)).div_ceil(u128::from(MAX_EXACT));
    let d = smallest_divisor_at_least(period, u64::try_from(need).unwrap_or(u64::MAX));
    match limit / d * d {
        // No multiple below the share's limit (a period with few divisors, such as a prime
        // number of microseconds, and a share below its smallest fitting one): the share keeps
        // its limit and its burst is lowered to what the limit's scale fits instead.
        0 => {
            let fit = MAX_EXACT / share.scale().max(1);
            match fit {
                // Refused by `Limit::new`, with the bucket's bound.
                0 => Ok(share),
                fit => Quota::per_period_with_burst(limit, q.period(), burst.min(fit)),
            }
        }
        rounded => Quota::per_period_with_burst(rounded, q.period(), burst),
    }
}

/// The smallest divisor of `n` that is at least `at_least` (`n` itself if none is smaller; 1 for
/// `at_least <= 1`), from the divisor pairs `(i, n / i)` with `i ≤ √n`: a few hundred thousand
/// steps for a day in microseconds, at most 2^26 for the longest period, once, when the limit is
/// divided.
fn smallest_divisor_at_least(n: u64, at_least: u64) -> u64 {
    let mut best = n.max(1);
    let mut i = 1u64;
    while i * i <= n {
        if n.is_multiple_of(i) {
            for d in [i, n / i] {
                if d >= at_least && d < best {
                    best = d;
                }
            }
        }
        i += 1;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    /// A share of a quota over a prime number of microseconds, which has no divisor to round its
    /// limit to: its burst is lowered to fit instead of the share failing; and a share rounded to
    /// the period's one divisor loses what the docs say, downwards.
    #[test]
    fn a_share_over_a_prime_period_fits_by_its_burst() {
        let p = 100_000_007; // prime
        let l = Limit::single(
            Algorithm::TokenBucket,
            Quota::per_period(p, Duration::from_micros(p)).unwrap(),
        )
        .unwrap();
        let q = l
            .divided(2)
            .expect("a share that fits by its burst")
            .quotas()[0];
        assert_eq!(q.limit(), p / 2);
        assert!(
            q.burst() < p / 2 && q.burst() * q.scale() <= MAX_EXACT,
            "{q:?}"
        );
        assert!(q.burst() > p / 3, "lowered to what fits, no further: {q:?}");

        let p = 95_000_011; // prime
        let l = Limit::single(
            Algorithm::Gcra,
            Quota::per_period(3 * p, Duration::from_micros(p)).unwrap(),
        )
        .unwrap();
        let q = l.divided(2).unwrap().quotas()[0];
        assert_eq!((q.limit(), q.burst()), (p, 3 * p / 2));
    }

    /// A burst given to a window algorithm, which could only ignore it, is refused; the same
    /// quota is taken by the bucket algorithms, and a window quota without one by every algorithm.
    #[test]
    fn a_window_algorithm_refuses_a_burst() {
        let bursty = Quota::per_minute(20).unwrap().with_burst(30).unwrap();
        for algorithm in Algorithm::ALL {
            let got = Limit::new(algorithm, [Quota::per_second(5).unwrap(), bursty]);
            if algorithm.uses_burst() {
                assert!(got.is_ok(), "{algorithm}");
            } else {
                assert!(
                    matches!(got, Err(ConfigError::InvalidSetting { name: "burst", .. })),
                    "{algorithm}: {got:?}"
                );
            }
            let plain = Quota::per_minute(20).unwrap().with_burst(20).unwrap();
            assert!(Limit::single(algorithm, plain).is_ok(), "{algorithm}");
        }
    }

    /// The fingerprint is part of every Redis key: it must not change between versions, builds
    /// or hosts (these values were computed by the code before it hashed little-endian bytes,
    /// `write_u64` on a little-endian host).
    #[test]
    fn fingerprints_are_stable() {
        let one = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
        // (GCRA since window algorithms refuse a burst; this case was a sliding window before,
        // fingerprint 0xbec0_b417_41a4_37e2, by the same function.)
        let two = Limit::new(
            Algorithm::Gcra,
            [
                Quota::per_second(10).unwrap(),
                Quota::per_period_with_burst(1_000, std::time::Duration::from_secs(3_600), 50)
                    .unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(one.fingerprint(), 0x495f_6cbd_1921_65b7);
        assert_eq!(two.fingerprint(), 0x8a14_6ceb_8b8e_ec02);
    }

    /// A multi-quota decision describes its binding quota as a whole: its limit, its reset and
    /// what is left in it (as the `RateLimit` field names it), even when another quota has
    /// fewer left. Here the per-minute quota binds a denied cost of 5 (the longer wait) with 2
    /// left, while the per-second quota has none, so a cost of 1 is denied too.
    #[test]
    fn a_multi_quota_denial_describes_its_binding_quota() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::FixedWindow,
        ] {
            let minute = Quota::per_minute(12).unwrap();
            let l = Limit::new(algorithm, [Quota::per_second(10).unwrap(), minute]).unwrap();
            let mut s = l.fresh_states(Timestamp::ZERO);
            assert!(l.check(&mut s, Timestamp::ZERO, 10).is_allowed());
            let d = l.check(&mut s, Timestamp::ZERO, 5);
            assert!(d.is_denied(), "{algorithm:?}");
            assert_eq!(d.quota_index(), 1, "{algorithm:?}: the longer wait binds");
            assert_eq!((d.limit(), d.remaining()), (12, 2), "{algorithm:?}");
            let alone = Limit::single(algorithm, minute).unwrap();
            let mut m = alone.fresh_states(Timestamp::ZERO);
            assert!(alone.check(&mut m, Timestamp::ZERO, 10).is_allowed());
            assert_eq!(
                alone.check(&mut m, Timestamp::ZERO, 5).reset_after(),
                d.reset_after()
            );
            assert!(l.check(&mut s.clone(), Timestamp::ZERO, 1).is_denied());
        }
    }

    /// A quota too large for its algorithm is refused with that algorithm's bound and remedy,
    /// not the bucket's (a smaller burst does nothing for a sliding log).
    #[test]
    fn too_large_says_what_bounds_each_algorithm() {
        let log = Limit::single(Algorithm::SlidingLog, Quota::per_second(200_000).unwrap());
        let msg = log.unwrap_err().to_string();
        assert_eq!(MAX_SLIDING_LOG_LIMIT, 100_000, "the message spells it out");
        assert!(msg.contains("at most 100,000"), "{msg}");
        assert!(!msg.contains("burst ×"), "{msg}");
        let window = Limit::single(Algorithm::SlidingWindow, Quota::per_day(100_000).unwrap());
        let msg = window.unwrap_err().to_string();
        assert!(msg.contains("limit × period"), "{msg}");
        assert!(msg.contains("smaller limit"), "{msg}");
    }

    /// A quota too large for its algorithm is named with its burst only where the algorithm has
    /// one: the window algorithms refuse a burst setting, so naming one would send the reader
    /// looking for it.
    #[test]
    fn a_too_large_quota_names_its_burst_only_for_the_bucket_algorithms() {
        let day = Quota::per_day(2_000_000).unwrap();
        let sliding = Limit::single(Algorithm::SlidingWindow, day).unwrap_err();
        assert_eq!(
            sliding.to_string(),
            "the quota 2000000 per 86400000000 µs is too large for the sliding_window algorithm: \
             limit × period (µs) must be at most 2^52; use a shorter period or a smaller limit"
        );
        let bucket = Limit::single(Algorithm::Gcra, Quota::per_day(52_127).unwrap()).unwrap_err();
        assert!(
            bucket
                .to_string()
                .starts_with("the quota 52127 per 86400000000 µs (burst 52127) is too large"),
            "{bucket}"
        );
    }

    /// The bucket's bound (`burst × period / gcd(limit, period)` within 2^52) holds only the
    /// algorithms that count in a bucket: 52,127 a day (prime to a day's microseconds) is refused
    /// to them, with their bound, and taken by the window algorithms, whose shares are not
    /// rounded for it.
    #[test]
    fn only_the_bucket_algorithms_are_held_to_the_buckets_bound() {
        let q = Quota::per_day(52_127).unwrap();
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let err = Limit::single(algorithm, q).unwrap_err();
            assert!(
                matches!(err, ConfigError::TooLarge { algorithm: a, .. } if a == algorithm),
                "{err}"
            );
            assert!(err.to_string().contains("burst ×"), "{err}");
            // A smaller burst fits.
            assert!(Limit::single(algorithm, q.with_burst(1_000).unwrap()).is_ok());
        }
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
            let l = Limit::single(algorithm, q).unwrap();
            let mut s = l.fresh_states(Timestamp::ZERO);
            assert!(l.check(&mut s, Timestamp::ZERO, 52_127).is_allowed());
            assert!(l.check(&mut s, Timestamp::ZERO, 1).is_denied());
            assert_eq!(l.divided(2).unwrap().quotas()[0].limit(), 26_063);
        }
        let window = Limit::single(Algorithm::SlidingWindow, q).unwrap_err();
        assert!(window.to_string().contains("limit × period"), "{window}");
    }

    #[test]
    fn a_share_whose_refill_would_not_fit_is_rounded_down_to_fit() {
        for (limit, n) in [
            (10_000_000, 3),
            (86_400_000, 7),
            (86_400_000_000, 999_983),
            (4_320_000_000, 7),
        ] {
            for algorithm in [
                Algorithm::TokenBucket,
                Algorithm::Gcra,
                Algorithm::FixedWindow,
            ] {
                let whole = Limit::single(algorithm, Quota::per_day(limit).unwrap()).unwrap();
                let share = whole
                    .divided(n)
                    .unwrap_or_else(|e| panic!("{limit}/{n}: {e}"));
                let q = &share.quotas()[0];
                assert_eq!(q.period(), Duration::from_secs(86_400));
                // Never above the plain share, and not far below it.
                assert!(q.limit() <= limit / n, "{limit}/{n}: {}", q.limit());
                assert!(q.limit() * n <= limit);
                assert!(
                    q.limit() as f64 >= 0.999 * (limit / n) as f64,
                    "{}",
                    q.limit()
                );
            }
        }
        // The example of the docs.
        let whole =
            Limit::single(Algorithm::TokenBucket, Quota::per_day(10_000_000).unwrap()).unwrap();
        assert!(
            Limit::single(Algorithm::TokenBucket, Quota::per_day(3_333_333).unwrap()).is_err(),
            "the plain share does not fit"
        );
        assert_eq!(whole.divided(3).unwrap().quotas()[0].limit(), 3_333_312);
        // A burst below the limit: the share's rate with a bucket of its limit would not fit,
        // with its own bucket it does, and is not rounded.
        let whole = Limit::single(
            Algorithm::TokenBucket,
            Quota::per_day(10_000_000)
                .unwrap()
                .with_burst(100_000)
                .unwrap(),
        )
        .unwrap();
        let share = whole.divided(3).unwrap().quotas()[0];
        assert_eq!((share.limit(), share.burst()), (3_333_333, 33_333));
        // A share that fits as it is stays as it is.
        let whole = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100).unwrap()).unwrap();
        assert_eq!(whole.divided(3).unwrap().quotas()[0].limit(), 33);
    }

    #[test]
    fn smallest_divisors() {
        assert_eq!(smallest_divisor_at_least(86_400_000_000, 0), 1);
        assert_eq!(smallest_divisor_at_least(86_400_000_000, 7), 8);
        assert_eq!(smallest_divisor_at_least(86_400_000_000, 64), 64);
        assert_eq!(smallest_divisor_at_least(97, 2), 97);
        assert_eq!(smallest_divisor_at_least(97, 98), 97);
        assert_eq!(smallest_divisor_at_least(1 << 52, 3), 4);
    }
}
