//! Fixed window: a counter per window of `period`, windows aligned to the clock's epoch.
//!
//! Kept to show its boundary problem: a client can pass `2 × limit` in a short time across a
//! window boundary.

use super::MAX_TIME;
use crate::decision::Verdict;
use crate::{Decision, Quota, Timestamp};

/// A fixed window's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Start of the window counted, in microseconds (a multiple of the period).
    pub start: u64,
    /// Cost admitted in that window.
    pub count: u64,
}

impl FixedWindowState {
    /// An empty window at `now`.
    #[must_use]
    pub fn fresh(quota: &Quota, now: Timestamp) -> Self {
        let now = now.as_micros().min(MAX_TIME);
        FixedWindowState {
            start: now - now % quota.period_micros(),
            count: 0,
        }
    }

    /// When this window ends.
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> Timestamp {
        if self.count == 0 {
            Timestamp::from_micros(self.start)
        } else {
            Timestamp::from_micros(self.start.saturating_add(quota.period_micros()))
        }
    }
}

/// Checks `cost` at `now` in a fixed window. Returns the decision and the state to store if
/// committed. Time earlier than the stored window counts in the stored window.
#[must_use]
#[inline]
pub fn check(
    quota: &Quota,
    state: Option<&FixedWindowState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, FixedWindowState) {
    let period = quota.period_micros();
    let limit = quota.limit();
    let mut now = now.as_micros().min(MAX_TIME);
    let mut start = now - now % period;
    let mut count = 0;
    if let Some(s) = state
        && s.start >= start
    {
        // Same window, or the clock went back: keep counting in the stored window. Clamped like
        // every time here: a state built by hand may start past the latest time (a stored one
        // never does), and its end must not saturate into a wait of 0.
        start = s.start.min(MAX_TIME);
        now = now.max(start);
        count = s.count.min(limit);
    }
    let end = start.saturating_add(period);
    let outcome = if cost > limit {
        Verdict::Exceeds
    } else if count + cost <= limit {
        count += cost;
        Verdict::Allowed
    } else {
        Verdict::Denied(end - now)
    };
    let reset = if count == 0 { 0 } else { end - now };
    let decision = Decision::from_parts(outcome, limit, limit - count, reset);
    (decision, FixedWindowState { start, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state built by hand with a start past the latest time the algorithms count with (or
    /// near `u64::MAX`) is decided as any other: a denial names a wait of at least a microsecond
    /// (a wait of 0 would send the client straight back, to be denied again), and the state to
    /// store starts within the counted time.
    #[test]
    fn a_state_from_the_far_future_never_answers_a_zero_wait() {
        let quota = Quota::per_second(10).unwrap();
        for start in [u64::MAX - 3, u64::MAX, MAX_TIME + 1, MAX_TIME] {
            for count in [1, 10, u64::MAX] {
                let state = FixedWindowState { start, count };
                for now in [0, 1_000_000, MAX_TIME] {
                    for cost in [0, 1, 10, 11] {
                        let (d, next) =
                            check(&quota, Some(&state), Timestamp::from_micros(now), cost);
                        assert!(d.remaining() <= 10);
                        assert!(next.start <= MAX_TIME, "start {start}: {next:?}");
                        if d.is_denied() && cost <= 10 {
                            let wait = d.retry_after().expect("a cost within the limit passes");
                            assert!(!wait.is_zero(), "start {start}, now {now}: {d:?}");
                        }
                    }
                }
            }
        }
    }
}
