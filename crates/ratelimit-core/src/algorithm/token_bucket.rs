//! Token bucket with lazy refill: `tokens = min(capacity, tokens + elapsed × rate)`, no timers.

use super::MAX_TIME;
use super::{ceil_div, mul_at_least};
use crate::decision::Verdict;
use crate::{Decision, Quota, Timestamp};

/// A token bucket's stored state.
///
/// The level is counted in units of `1 / quota.scale()` token so that the refill, `limit` tokens
/// per `period`, is a whole number of units per microsecond and no rounding ever happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Bucket level in units (`tokens × quota.scale()`), at time `last`.
    pub level: u64,
    /// When the level was last computed, in microseconds.
    pub last: u64,
}

impl TokenBucketState {
    /// A full bucket at `now`.
    #[must_use]
    pub fn fresh(quota: &Quota, now: Timestamp) -> Self {
        TokenBucketState {
            level: quota.capacity_units(),
            last: now.as_micros().min(MAX_TIME),
        }
    }

    /// When this bucket is full again if nothing more is taken: from then on it is the same as a
    /// bucket never used, so it may be forgotten.
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> Timestamp {
        let deficit = quota.capacity_units().saturating_sub(self.level);
        Timestamp::from_micros(
            self.last
                .saturating_add(ceil_div(deficit, quota.refill_per_micro())),
        )
    }
}

/// Checks `cost` at `now` against a token bucket. Returns the decision and the state to store if
/// the decision is committed. Time earlier than the state's is treated as the state's time.
#[must_use]
#[inline]
pub fn check(
    quota: &Quota,
    state: Option<&TokenBucketState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, TokenBucketState) {
    let cap = quota.capacity_units();
    let rate = quota.refill_per_micro();
    let scale = quota.scale();
    let now = now.as_micros().min(MAX_TIME);
    let (mut level, last) = match state {
        Some(s) => (s.level.min(cap), s.last),
        None => (cap, now),
    };
    let now = now.max(last);
    let elapsed = now - last;
    let deficit = cap - level;
    // `elapsed × rate >= deficit`, compared without overflow: the bucket is full again.
    if mul_at_least(elapsed, rate, deficit) {
        level = cap;
    } else {
        level += elapsed * rate;
    }

    let outcome = if cost > quota.burst() {
        Verdict::Exceeds
    } else {
        let need = cost * scale;
        if level >= need {
            level -= need;
            Verdict::Allowed
        } else {
            Verdict::Denied(ceil_div(need - level, rate))
        }
    };
    let decision = Decision::from_parts(
        outcome,
        quota.burst(),
        if level < scale { 0 } else { level / scale },
        // The memory store builds the stored time from this value (`compact::split`).
        ceil_div(cap - level, rate),
    );
    (decision, TokenBucketState { level, last: now })
}
