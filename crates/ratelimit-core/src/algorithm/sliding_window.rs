//! Sliding-window counter: the two-counter weighted approximation.
//!
//! The estimate is `previous × (period − elapsed) / period + current`, where `elapsed` is the time
//! since the current window began. A request passes if the estimate, with its cost added, is at
//! most the limit. Comparisons are done multiplied out by `period`, in integers.

use super::MAX_TIME;
use crate::decision::Verdict;
use crate::{Decision, Quota, Timestamp};

/// A sliding-window counter's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowState {
    /// Start of the current window, in microseconds (a multiple of the period).
    pub start: u64,
    /// Cost admitted in the current window.
    pub current: u64,
    /// Cost admitted in the window before it.
    pub previous: u64,
}

impl SlidingWindowState {
    /// Empty counters at `now`.
    #[must_use]
    pub fn fresh(quota: &Quota, now: Timestamp) -> Self {
        let now = now.as_micros().min(MAX_TIME);
        SlidingWindowState {
            start: now - now % quota.period_micros(),
            current: 0,
            previous: 0,
        }
    }

    /// When both counters have slid out.
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> Timestamp {
        let p = quota.period_micros();
        let t = if self.current > 0 {
            self.start.saturating_add(2 * p)
        } else if self.previous > 0 {
            self.start.saturating_add(p)
        } else {
            self.start
        };
        Timestamp::from_micros(t)
    }
}

/// Checks `cost` at `now` with the sliding-window counter. Returns the decision and the state to
/// store if committed.
#[must_use]
#[inline]
pub fn check(
    quota: &Quota,
    state: Option<&SlidingWindowState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, SlidingWindowState) {
    let p = quota.period_micros();
    let limit = quota.limit();
    let mut now = now.as_micros().min(MAX_TIME);
    let mut start = now - now % p;
    let (mut current, mut previous) = (0, 0);
    if let Some(s) = state {
        if s.start >= start {
            // Clamped like every time here: a state built by hand may start past the latest time
            // (a stored one never does), and the sums below must not overflow.
            start = s.start.min(MAX_TIME);
            now = now.max(start);
            (current, previous) = (s.current, s.previous);
        } else if s.start + p == start {
            previous = s.current;
        }
    }
    let (current_in, previous_in) = (current.min(limit), previous.min(limit));
    current = current_in;
    previous = previous_in;
    let e = now - start;
    let (p128, l128) = (u128::from(p), u128::from(limit));
    let weighted_prev = u128::from(previous) * u128::from(p - e);

    // The wait until `cost` (at most the limit) passes, for a cost that does not pass now.
    let wait = |current: u64, cost: u64| {
        if current + cost <= limit {
            // Passes later in this window, once enough of `previous` has slid out:
            // previous × (p − e') ≤ (limit − current − cost) × p.
            let room = u128::from(limit - current - cost) * p128 / u128::from(previous);
            let e_pass = p - room as u64; // room < p − e here, so this is > e
            e_pass - e
        } else {
            // Passes in the next window, where `current` becomes the previous count.
            let e_next = if current == 0 {
                0
            } else {
                let room = u128::from(limit - cost) * p128 / u128::from(current);
                p - (room.min(p128) as u64)
            };
            start + p + e_next - now
        }
    };
    let outcome = if cost > limit {
        Verdict::Exceeds
    } else if cost == 0 || weighted_prev + u128::from(current + cost) * p128 <= l128 * p128 {
        // A peek is always allowed, even when the clock went back within the window and the
        // weighted count is above the limit there.
        current += cost;
        Verdict::Allowed
    } else {
        Verdict::Denied(wait(current, cost))
    };
    let used = u128::from(previous) * u128::from(p - e) + u128::from(current) * p128;
    let remaining = ((l128 * p128).saturating_sub(used) / p128) as u64;
    let reset = if current > 0 {
        start + 2 * p - now
    } else if previous > 0 {
        start + p - now
    } else {
        0
    };
    // Allowed, or a cost that can never pass (told the quota as it stands), and not full: more
    // is available when one more unit than is left would pass (it does not now, `remaining`
    // being whole units left).
    let more = if matches!(outcome, Verdict::Allowed | Verdict::Exceeds) && remaining < limit {
        wait(current, remaining + 1)
    } else {
        0
    };
    let decision =
        Decision::from_parts(outcome, limit, remaining, reset).with_more_after_micros(more);
    (
        decision,
        SlidingWindowState {
            start,
            current,
            previous,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state built by hand with a start past the latest time the algorithms count with (or
    /// near `u64::MAX`) is denied or allowed, never an overflow.
    #[test]
    fn a_state_from_the_far_future_never_overflows() {
        let quota = Quota::per_second(10).unwrap();
        for start in [u64::MAX - 10, u64::MAX, MAX_TIME + 1, MAX_TIME] {
            for (current, previous) in [(1, 0), (0, 1), (10, 10), (u64::MAX, u64::MAX)] {
                let state = SlidingWindowState {
                    start,
                    current,
                    previous,
                };
                for now in [0, 1_000_000, MAX_TIME] {
                    for cost in [0, 1, 10, 11] {
                        let (d, next) =
                            check(&quota, Some(&state), Timestamp::from_micros(now), cost);
                        assert!(d.remaining() <= 10);
                        assert!(next.start <= MAX_TIME);
                    }
                }
            }
        }
    }
}
