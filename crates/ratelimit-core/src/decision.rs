//! The answer to a check.

use crate::QuotaSet;
use crate::time::duration_to_micros as micros;
use std::time::Duration;

/// Whether a request passed, and what to tell the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The request passed and its cost was consumed.
    Allowed,
    /// The request did not pass; the same cost passes after `retry_after`, if nothing else is
    /// consumed meanwhile.
    Denied {
        /// Exact time until this cost would pass (at least one microsecond).
        retry_after: Duration,
    },
    /// The cost is larger than the quota can ever hold: it will never pass, however long the
    /// client waits. This is a denial, not an error.
    Exceeds,
}

/// What an algorithm decided, in microseconds (internal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    Denied(u64),
    Exceeds,
}

/// The result of checking one cost against a [`Limit`](crate::Limit) at one instant.
///
/// When a limit combines several quotas, the decision describes the binding one: the quota that
/// denied with the longest wait, or, when all allowed, the one with the fewest requests left. A
/// denial also says which quotas did not admit the cost
/// ([`violated_quotas`](Self::violated_quotas)).
///
/// A decision may be marked as answered from a cache in front of the store ([`cached`](Self::cached)):
/// it is then no evidence of the store's health, for a circuit breaker. The mark is not part of
/// the decision's value: two decisions that differ only by it are equal.
#[derive(Clone, Copy)]
pub struct Decision {
    // Kept in integer microseconds (40 bytes in all): decisions are made on the hot path.
    /// Denied: the wait. Allowed: the time until more of the quota is available, 0 if not said.
    retry_after_us: u64,
    reset_after_us: u64,
    limit: u64,
    remaining: u64,
    /// The kind in the low byte, the quota index in the 32 bits above it, the violated quotas in
    /// the byte above that (see [`VIOLATED_SHIFT`]), a cached answer's reset lag above that (see
    /// [`LAG_SHIFT`]), and [`CACHED`] at the top: one word, so
    /// that a decision is written with whole-word stores and read back without a store-forwarding
    /// stall (a `u32` and a `u8` written apart and then copied as one word stalled every check,
    /// about 2 ns here).
    tag: u64,
}

/// The bit of a decision's tag that marks it as answered from a cache in front of the store.
const CACHED: u64 = 1 << 63;

/// Where a decision's tag keeps the violated quotas (a [`QuotaSet`]'s bits), when they are not
/// just the binding quota: zero there means "the binding quota alone" on a denial, so that a
/// single-quota decision is built with no more work than before, and one set is written one way
/// only (two equal decisions have equal tags).
const VIOLATED_SHIFT: u32 = 40;
const VIOLATED: u64 = 0xff << VIOLATED_SHIFT;

/// Where a decision's tag keeps how much later than the store's own its reset may be counted:
/// an admission [`Leasing`](crate::Leasing) answered from a lease counts the store's reset from
/// when the lease came back (so that a client is never told a reset before the store's), up to
/// that round trip after the store measured it. In units of [`LAG_UNIT_US`], rounded up; all
/// ones for a lag too long to keep. Not part of the decision's value, like [`CACHED`]; read by
/// [`DenialCache`](crate::DenialCache), whose denials must never outlast the store's.
const LAG_SHIFT: u32 = 48;
const LAG_MAX: u64 = 0x7fff;
const LAG: u64 = LAG_MAX << LAG_SHIFT;
/// 16 µs: a lag of up to half a second is kept.
const LAG_UNIT_US: u64 = 16;

impl Decision {
    /// The fields that make the decision's value (the cache mark left out).
    const fn value(&self) -> (u64, u64, u64, u64, u64) {
        (
            self.retry_after_us,
            self.reset_after_us,
            self.limit,
            self.remaining,
            self.tag & !(CACHED | LAG),
        )
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value().hash(state)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Allowed,
    Denied,
    Exceeds,
}

impl Kind {
    const fn tag(self) -> u64 {
        match self {
            Kind::Allowed => 0,
            Kind::Denied => 1,
            Kind::Exceeds => 2,
        }
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset_after", &self.reset_after())
            .field("more_after", &self.more_after())
            .field("quota_index", &self.quota_index())
            .field("violated_quotas", &self.violated_quotas())
            .field("cached", &self.is_cached())
            .finish()
    }
}

impl Decision {
    /// Builds a decision. Stores use this to report what they computed. Durations are counted in
    /// whole microseconds.
    #[must_use]
    pub fn new(
        outcome: Outcome,
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        quota_index: usize,
    ) -> Self {
        let (kind, retry_after_us) = match outcome {
            Outcome::Allowed => (Kind::Allowed, 0),
            Outcome::Denied { retry_after } => (Kind::Denied, micros(retry_after)),
            Outcome::Exceeds => (Kind::Exceeds, 0),
        };
        Decision {
            retry_after_us,
            reset_after_us: micros(reset_after),
            limit,
            remaining,
            tag: kind.tag() | (quota_index_bits(quota_index) << 8),
        }
    }

    /// The same, in microseconds, for the algorithms.
    #[inline]
    pub(crate) const fn from_parts(
        outcome: Verdict,
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
    ) -> Self {
        let (kind, retry_after_us) = match outcome {
            Verdict::Allowed => (Kind::Allowed, 0),
            Verdict::Denied(us) => (Kind::Denied, us),
            Verdict::Exceeds => (Kind::Exceeds, 0),
        };
        Decision {
            retry_after_us,
            reset_after_us,
            limit,
            remaining,
            tag: kind.tag(),
        }
    }

    /// The same, with the time until more of the quota is available if allowed or if the cost
    /// can never pass (see [`more_after`](Decision::more_after); 0 for unknown or none), in
    /// microseconds.
    #[inline]
    pub(crate) const fn with_more_after_micros(mut self, us: u64) -> Self {
        if matches!(self.kind(), Kind::Allowed | Kind::Exceeds) {
            self.retry_after_us = us;
        }
        self
    }

    /// A denial with no unit left, the given waits, and the limit and kind-and-index word of an
    /// earlier denial (the memory store's denial memo).
    #[inline]
    pub(crate) const fn memo_denial(
        retry_after_us: u64,
        reset_after_us: u64,
        limit: u64,
        tag: u64,
    ) -> Self {
        Decision {
            retry_after_us,
            reset_after_us,
            limit,
            remaining: 0,
            tag,
        }
    }

    /// The kind and quota index as one word (see [`memo_denial`](Self::memo_denial)).
    #[inline]
    pub(crate) const fn tag_word(&self) -> u64 {
        self.tag
    }

    /// [`retry_after`](Decision::retry_after) in microseconds when denied; otherwise
    /// [`more_after`](Decision::more_after)'s (0 if it says none).
    #[inline]
    pub(crate) const fn retry_after_micros(&self) -> u64 {
        self.retry_after_us
    }

    /// The same decision, describing quota `index` of its limit (for a denial, the one quota
    /// that denied). For a store that checks a limit's quotas one by one and joins them with
    /// [`combine`](Self::combine), which needs each decision to name its own quota (an
    /// algorithm's decision names quota 0); [`Limit::check`](crate::Limit::check) does both.
    #[inline]
    #[must_use]
    pub const fn with_quota_index(mut self, index: usize) -> Self {
        self.tag = (self.tag & (0xff | CACHED | LAG)) | (quota_index_bits(index) << 8);
        self
    }

    /// `true` unless a denial names quotas besides the binding one (see
    /// [`violated_quotas`](Self::violated_quotas)).
    #[inline]
    pub(crate) const fn denied_by_binding_quota_alone(&self) -> bool {
        self.tag & VIOLATED == 0
    }

    /// The quotas of the limit that did not admit the cost: empty when allowed; on a denial, the
    /// binding quota ([`quota_index`](Self::quota_index)) and every other quota that would have
    /// denied the same cost at that instant (each needs waiting for; the binding one longest).
    /// What the draft's `violated-policies` lists.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota, QuotaSet};
    ///
    /// let limit = Limit::new(
    ///     Algorithm::TokenBucket,
    ///     vec![Quota::per_second(2)?, Quota::per_minute(2)?, Quota::per_hour(100)?],
    /// )?;
    /// let store = MemoryStore::new();
    /// assert!(store.check_now(b"k", &limit, 2).violated_quotas().is_empty());
    /// let d = store.check_now(b"k", &limit, 1);
    /// assert_eq!(d.quota_index(), 1); // the minute binds: its wait is the longest
    /// assert_eq!(d.violated_quotas(), QuotaSet::EMPTY.with(0).with(1));
    /// # Ok::<(), ratelimit_core::ConfigError>(())
    /// ```
    #[must_use]
    pub const fn violated_quotas(&self) -> QuotaSet {
        if self.is_allowed() {
            return QuotaSet::EMPTY;
        }
        match ((self.tag & VIOLATED) >> VIOLATED_SHIFT) as u8 {
            0 => QuotaSet::EMPTY.with(self.quota_index()),
            bits => QuotaSet::from_bits(bits),
        }
    }

    /// The same decision, with `quotas` as the quotas that did not admit the cost, for a store
    /// that combines a limit's quotas itself and reports them (the binding quota is always
    /// counted in; an allowed decision keeps none).
    ///
    /// ```
    /// use ratelimit_core::{Decision, Outcome, QuotaSet};
    /// use std::time::Duration;
    ///
    /// let wait = Outcome::Denied { retry_after: Duration::from_secs(3) };
    /// let d = Decision::new(wait, 10, 0, Duration::from_secs(6), 1);
    /// assert_eq!(d.violated_quotas(), QuotaSet::from_bits(0b10));
    /// let d = d.with_violated_quotas(QuotaSet::from_bits(0b100));
    /// assert_eq!(d.violated_quotas(), QuotaSet::from_bits(0b110));
    /// ```
    #[must_use]
    pub const fn with_violated_quotas(mut self, quotas: QuotaSet) -> Self {
        self.tag &= !VIOLATED;
        if self.is_allowed() {
            return self;
        }
        let index = self.quota_index();
        let all = quotas.with(index);
        // The binding quota alone is written as zero (see `VIOLATED_SHIFT`).
        if all.bits() != QuotaSet::EMPTY.with(index).bits() {
            self.tag |= (all.bits() as u64) << VIOLATED_SHIFT;
        }
        self
    }

    /// The same decision, marked as answered from a cache in front of the store (a
    /// [`DenialCache`](crate::DenialCache) hit, a unit of a [`Leasing`](crate::Leasing) lease)
    /// rather than by the store itself. A store wrapper that answers some checks without asking
    /// the store it wraps marks those answers, so that a circuit breaker in front of it does not
    /// take them as evidence that the store is healthy. The mark changes nothing else: the
    /// decision compares equal to the unmarked one.
    ///
    /// ```
    /// use ratelimit_core::{Decision, Outcome};
    /// use std::time::Duration;
    ///
    /// let d = Decision::new(Outcome::Allowed, 10, 9, Duration::from_millis(100), 0);
    /// assert!(!d.is_cached());
    /// assert!(d.cached().is_cached());
    /// assert_eq!(d.cached(), d);
    /// ```
    #[must_use]
    #[inline]
    pub const fn cached(mut self) -> Self {
        self.tag |= CACHED;
        self
    }

    /// `true` if this decision was answered from a cache in front of the store, without asking
    /// it (see [`cached`](Self::cached)).
    #[must_use]
    #[inline]
    pub const fn is_cached(&self) -> bool {
        self.tag & CACHED != 0
    }

    /// The same decision, its reset counted up to `lag_us` µs later than the store's own (see
    /// [`LAG_SHIFT`]).
    #[must_use]
    #[inline]
    pub(crate) const fn with_reset_lag(mut self, lag_us: u64) -> Self {
        let units = lag_us.div_ceil(LAG_UNIT_US);
        let units = if units < LAG_MAX { units } else { LAG_MAX };
        self.tag = (self.tag & !LAG) | (units << LAG_SHIFT);
        self
    }

    /// How much later than the store's own the reset may be counted, in µs (0 for the store's
    /// own answer); `None` if longer than the decision can say.
    #[must_use]
    #[inline]
    pub(crate) const fn reset_lag_micros(&self) -> Option<u64> {
        let units = (self.tag & LAG) >> LAG_SHIFT;
        if units == LAG_MAX {
            None
        } else {
            Some(units * LAG_UNIT_US)
        }
    }

    const fn kind(&self) -> Kind {
        match self.tag & 0xff {
            0 => Kind::Allowed,
            1 => Kind::Denied,
            _ => Kind::Exceeds,
        }
    }

    /// Passed or not, and why.
    #[must_use]
    pub const fn outcome(&self) -> Outcome {
        match self.kind() {
            Kind::Allowed => Outcome::Allowed,
            Kind::Denied => Outcome::Denied {
                retry_after: Duration::from_micros(self.retry_after_us),
            },
            Kind::Exceeds => Outcome::Exceeds,
        }
    }

    /// `true` if the request passed.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.kind(), Kind::Allowed)
    }

    /// `true` if the request was denied (including a cost that can never pass).
    #[must_use]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Time until the same cost would pass, if it was denied and can ever pass.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.kind() {
            Kind::Denied => Some(Duration::from_micros(self.retry_after_us)),
            _ => None,
        }
    }

    /// When allowed, the time until more of the binding quota is available (its next unit back; of
    /// a limit of several quotas, the latest of the quotas with as few left, see
    /// [`combine`](Self::combine)), if the store said: the sliding window and the sliding log say
    /// it, as a unit may come back long before the quota is full again (the `t` of
    /// draft-ietf-httpapi-ratelimit-headers-10's `RateLimit` field). The same for a cost that can
    /// never pass ([`can_ever_pass`](Self::can_ever_pass) `false`: nothing was taken, and the
    /// quota it names is told as it stands). `None` when denied otherwise (the wait is
    /// [`retry_after`](Self::retry_after)), when the quota is full, and when the store did not say
    /// (the bucket algorithms, whose next unit follows from the limit, `remaining` and
    /// [`reset_after`](Self::reset_after); a fixed window, whose units all come back at its end; a
    /// store of another crate; a leased answer).
    #[must_use]
    pub const fn more_after(&self) -> Option<Duration> {
        match self.kind() {
            Kind::Allowed | Kind::Exceeds if self.retry_after_us > 0 => {
                Some(Duration::from_micros(self.retry_after_us))
            }
            _ => None,
        }
    }

    /// Says when more of the quota is available, for a store that computes it (see
    /// [`more_after`](Self::more_after)): kept on an allowed decision and on one whose cost can
    /// never pass, counted in whole microseconds (zero says nothing); ignored on any other
    /// denial, whose wait is its retry-after.
    #[must_use]
    pub fn with_more_after(self, more_after: Duration) -> Self {
        self.with_more_after_micros(micros(more_after))
    }

    /// `false` when the cost is larger than the quota can ever hold.
    #[must_use]
    pub const fn can_ever_pass(&self) -> bool {
        !matches!(self.kind(), Kind::Exceeds)
    }

    /// The most the binding quota admits at once: the burst for the bucket algorithms, the limit
    /// per period for the window algorithms.
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Requests (units of cost) still available right now in the quota this decision describes,
    /// after this check. With several quotas that is the binding one
    /// ([`quota_index`](Self::quota_index)): when allowed, the one with the fewest left; when
    /// denied, the one with the longest wait, which may have a few left (fewer than the cost)
    /// while another has none.
    #[must_use]
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the binding quota is back to full (zero if it is full).
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// [`reset_after`](Decision::reset_after) in microseconds.
    #[inline]
    pub(crate) const fn reset_after_micros(&self) -> u64 {
        self.reset_after_us
    }

    /// Which quota of the limit this decision describes (its index in [`Limit::quotas`](crate::Limit::quotas)).
    #[must_use]
    pub const fn quota_index(&self) -> usize {
        ((self.tag >> 8) & u32::MAX as u64) as usize
    }

    /// Combines per-quota decisions into the decision of the whole limit (all-or-nothing). Each
    /// must name its own quota ([`with_quota_index`](Self::with_quota_index)).
    ///
    /// Denied if any is denied; then the binding quota is the one that can never pass, or else
    /// the one with the longest wait (waiting that long lets every quota pass, since waiting only
    /// ever helps). Allowed otherwise; the binding quota is the one with the fewest left. Ties
    /// (same outcome and wait) go to the quota with fewer left, then to one that is full (it caps
    /// the limit where it stands: nothing more is coming), then to the one with the longer time
    /// to full, then to the earlier quota. The result is the binding quota's decision as it
    /// is: on a denial, another quota may have fewer left than its `remaining`. A denial's
    /// [`violated_quotas`](Self::violated_quotas) are those of every decision combined; an
    /// admission's [`more_after`](Self::more_after) is the latest of the quotas with as few left
    /// as the binding one (the limit has one more when each of them has), or none if one of them
    /// says none.
    #[must_use]
    pub fn combine(decisions: &[Decision]) -> Option<Decision> {
        let mut best: Option<Decision> = None;
        let mut violated = QuotaSet::EMPTY;
        for d in decisions {
            violated = violated.union(d.violated_quotas());
            best = Some(match best {
                None => *d,
                Some(b) => {
                    if d.binds_tighter_than(&b) {
                        *d
                    } else {
                        b
                    }
                }
            });
        }
        best.map(|b| {
            let mut b = b.with_violated_quotas(violated);
            if matches!(b.kind(), Kind::Allowed) {
                // Every quota allowed. Fewer left binds: those with as few left as the binding
                // one each free a unit before the limit has one more, so more comes when it
                // comes for the last of them (never, if one of them says none).
                for d in decisions {
                    if d.remaining == b.remaining {
                        b.retry_after_us = match (b.retry_after_us, d.retry_after_us) {
                            (0, _) | (_, 0) => 0,
                            (x, y) => x.max(y),
                        };
                    }
                }
            }
            b
        })
    }

    fn binds_tighter_than(&self, other: &Decision) -> bool {
        fn rank(d: &Decision) -> (u8, u64) {
            match d.kind() {
                Kind::Allowed => (0, 0),
                Kind::Denied => (1, d.retry_after_us),
                Kind::Exceeds => (2, 0),
            }
        }
        let (a, b) = (rank(self), rank(other));
        if a != b {
            return a > b;
        }
        // Same outcome and wait: fewer remaining binds tighter; then a quota that is full (the
        // limit can have no more while it holds as few as it does: nothing more is coming); then
        // the longer time to full (a client told "0 left" should hear of the quota that takes
        // longest to come back).
        if self.remaining != other.remaining {
            return self.remaining < other.remaining;
        }
        let (full, other_full) = (self.remaining >= self.limit, other.remaining >= other.limit);
        if full != other_full {
            return full;
        }
        self.reset_after_us > other.reset_after_us
    }
}

/// A quota index as kept in a decision's tag (saturating at `u32::MAX`, as before).
const fn quota_index_bits(index: usize) -> u64 {
    if index > u32::MAX as usize {
        u32::MAX as u64
    } else {
        index as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(outcome: Outcome, remaining: u64, i: usize) -> Decision {
        Decision::new(outcome, 10, remaining, Duration::ZERO, i)
    }

    /// A reset lag is kept rounded up (never less than it was), survives the decision's other
    /// marks and a change of quota index, is no part of its value, and one too long to keep
    /// reads as unknown.
    #[test]
    fn a_reset_lag_is_kept_rounded_up() {
        let base = d(Outcome::Allowed, 3, 0);
        assert_eq!(base.reset_lag_micros(), Some(0));
        for (lag, kept) in [
            (0, 0),
            (1, 16),
            (16, 16),
            (5_000, 5_008),
            (524_256, 524_256),
        ] {
            let lagged = base.cached().with_reset_lag(lag);
            assert_eq!(lagged.reset_lag_micros(), Some(kept), "{lag}");
            assert!(lagged.is_cached() && lagged == base);
            assert_eq!(lagged.with_quota_index(2).reset_lag_micros(), Some(kept));
            assert_eq!(lagged.with_quota_index(2).quota_index(), 2);
        }
        for lag in [524_257, 1_000_000, u64::MAX] {
            assert_eq!(base.with_reset_lag(lag).reset_lag_micros(), None, "{lag}");
        }
        // Set again, it replaces the last.
        let twice = base.with_reset_lag(u64::MAX).with_reset_lag(32);
        assert_eq!(twice.reset_lag_micros(), Some(32));
    }

    #[test]
    fn combine_picks_the_binding_quota() {
        let ok = d(Outcome::Allowed, 5, 0);
        let ok2 = d(Outcome::Allowed, 2, 1);
        assert_eq!(Decision::combine(&[ok, ok2]).unwrap().quota_index(), 1);
        let short = d(
            Outcome::Denied {
                retry_after: Duration::from_secs(1),
            },
            0,
            2,
        );
        let long = d(
            Outcome::Denied {
                retry_after: Duration::from_secs(9),
            },
            0,
            3,
        );
        let c = Decision::combine(&[ok, short, long, ok2]).unwrap();
        assert_eq!(c.quota_index(), 3);
        assert_eq!(c.retry_after(), Some(Duration::from_secs(9)));
        assert_eq!(c.violated_quotas(), QuotaSet::from_bits(0b1100));
        let never = d(Outcome::Exceeds, 0, 4);
        let c = Decision::combine(&[long, never]).unwrap();
        assert!(!c.can_ever_pass());
        assert_eq!(c.retry_after(), None);
        assert_eq!(c.violated_quotas(), QuotaSet::from_bits(0b1_1000));
        assert!(Decision::combine(&[]).is_none());
        let ok = Decision::combine(&[ok, ok2]).unwrap();
        assert!(ok.violated_quotas().is_empty());
    }

    /// Among quotas with as few left, a full one binds: it caps the limit where it stands, so
    /// nothing more is coming (no `more_after`, no time to full), however long the other takes
    /// to fill.
    #[test]
    fn a_full_quota_binds_among_those_with_as_few_left() {
        let filling = Decision::new(Outcome::Allowed, 5, 2, Duration::from_secs(57), 0)
            .with_more_after(Duration::from_secs(54));
        let full = Decision::new(Outcome::Allowed, 2, 2, Duration::ZERO, 1);
        for pair in [
            [filling, full],
            [full.with_quota_index(0), filling.with_quota_index(1)],
        ] {
            let c = Decision::combine(&pair).unwrap();
            assert_eq!((c.limit(), c.remaining()), (2, 2), "{pair:?}");
            assert_eq!(c.reset_after(), Duration::ZERO);
            assert_eq!(c.more_after(), None);
        }
        // Fewer left still binds first.
        let fewer = Decision::new(Outcome::Allowed, 5, 1, Duration::from_secs(57), 0);
        assert_eq!(Decision::combine(&[fewer, full]).unwrap().quota_index(), 0);
    }

    /// A set is written one way only: the binding quota alone, given or implied, makes equal
    /// decisions; an allowed decision keeps no set; the binding quota is always in it.
    #[test]
    fn violated_quotas_have_one_form() {
        let wait = Outcome::Denied {
            retry_after: Duration::from_secs(1),
        };
        let denied = d(wait, 0, 2);
        assert_eq!(denied.violated_quotas(), QuotaSet::from_bits(0b100));
        assert_eq!(
            denied.with_violated_quotas(QuotaSet::from_bits(0b100)),
            denied
        );
        assert_eq!(denied.with_violated_quotas(QuotaSet::EMPTY), denied);
        let both = denied.with_violated_quotas(QuotaSet::from_bits(0b1));
        assert_eq!(both.violated_quotas(), QuotaSet::from_bits(0b101));
        assert_ne!(both, denied);
        assert_eq!(both.with_quota_index(2), denied, "re-indexed: one quota");
        assert_eq!(both.cached().violated_quotas(), both.violated_quotas());
        let allowed = d(Outcome::Allowed, 3, 2);
        assert_eq!(
            allowed.with_violated_quotas(QuotaSet::from_bits(0b11)),
            allowed
        );
        assert!(allowed.violated_quotas().is_empty());
        // An index no limit has: no quota to name.
        assert!(d(wait, 0, 9).violated_quotas().is_empty());
    }
}
