//! GCRA, the generic cell rate algorithm: one "theoretical arrival time" per key.

use super::MAX_TIME;
use super::ceil_div;
use crate::decision::Verdict;
use crate::{Decision, Quota, Timestamp};

/// GCRA's stored state: the theoretical arrival time (TAT).
///
/// The TAT is kept exactly, in units of `1 / quota.refill_per_micro()` microsecond, as
/// `tat × refill_per_micro + frac`. With parameters equivalent to a token bucket's, GCRA makes the
/// same decision as the bucket at every step: its debt `TAT − now` is the bucket's missing level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Whole microseconds of the TAT.
    pub tat: u64,
    /// The rest of the TAT, below `quota.refill_per_micro()`.
    pub frac: u64,
}

impl GcraState {
    /// The state of a key never seen, at `now`.
    #[must_use]
    pub fn fresh(now: Timestamp) -> Self {
        GcraState {
            tat: now.as_micros().min(MAX_TIME),
            frac: 0,
        }
    }

    /// When the TAT is reached: from then on the key is as if never used.
    #[must_use]
    pub fn fresh_at(&self) -> Timestamp {
        Timestamp::from_micros(self.tat.saturating_add(u64::from(self.frac > 0)))
    }
}

/// Debt `TAT − now` in level units, at most the capacity (a TAT further ahead, possible only if
/// the clock went back, means an empty bucket all the same).
fn debt(quota: &Quota, state: &GcraState, now: u64) -> u64 {
    if state.tat < now {
        0
    } else {
        (state.tat - now)
            .saturating_mul(quota.refill_per_micro())
            .saturating_add(state.frac)
            .min(quota.capacity_units())
    }
}

/// Checks `cost` at `now` with GCRA. Returns the decision and the state to store if committed.
#[must_use]
#[inline]
pub fn check(
    quota: &Quota,
    state: Option<&GcraState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, GcraState) {
    let cap = quota.capacity_units();
    let rate = quota.refill_per_micro();
    let scale = quota.scale();
    let now = now.as_micros().min(MAX_TIME);
    let mut d = state.map_or(0, |s| debt(quota, s, now));

    let outcome = if cost > quota.burst() {
        Verdict::Exceeds
    } else {
        let new_d = d + cost * scale;
        if new_d <= cap {
            d = new_d;
            Verdict::Allowed
        } else {
            Verdict::Denied(ceil_div(new_d - cap, rate))
        }
    };
    let decision =
        Decision::from_parts(outcome, quota.burst(), (cap - d) / scale, ceil_div(d, rate));
    let next = if rate == 1 {
        GcraState {
            tat: now + d,
            frac: 0,
        }
    } else {
        GcraState {
            tat: now + d / rate,
            frac: d % rate,
        }
    };
    (decision, next)
}
