//! Sliding log: the exact count of cost admitted in the last `period`.
//!
//! Memory per key is bounded by the limit: the log holds one entry per distinct admission instant
//! still inside the window, each of cost at least one.

use std::collections::VecDeque;

use super::MAX_TIME;
use crate::decision::Verdict;
use crate::{Decision, Quota, Timestamp};

/// A sliding log's stored state: admissions still inside the window, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SlidingLogState {
    /// `(time in microseconds, cost)` of each admission, oldest first; costs at one instant merged.
    pub entries: VecDeque<(u64, u64)>,
    /// Sum of the costs in `entries`.
    pub total: u64,
}

impl SlidingLogState {
    /// When the newest entry slides out.
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> Timestamp {
        match self.entries.back() {
            Some(&(t, _)) => Timestamp::from_micros(t.saturating_add(quota.period_micros())),
            None => Timestamp::ZERO,
        }
    }

    fn prune(&mut self, now: u64, period: u64) {
        while let Some(&(t, c)) = self.entries.front() {
            if t.saturating_add(period) <= now {
                self.entries.pop_front();
                self.total -= c;
            } else {
                break;
            }
        }
    }
}

/// Checks `cost` at `now` against the exact log of the last `period`. Returns the decision and
/// the state to store if committed.
#[must_use]
pub fn check(
    quota: &Quota,
    state: Option<&SlidingLogState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, SlidingLogState) {
    let p = quota.period_micros();
    let limit = quota.limit();
    let mut log = state.cloned().unwrap_or_default();
    let newest = log.entries.back().map_or(0, |&(t, _)| t);
    let now = now.as_micros().min(MAX_TIME).max(newest);
    log.prune(now, p);

    let outcome = if cost > limit {
        Verdict::Exceeds
    } else if log.total + cost <= limit {
        if cost > 0 {
            match log.entries.back_mut() {
                Some((t, c)) if *t == now => *c += cost,
                _ => log.entries.push_back((now, cost)),
            }
            log.total += cost;
        }
        Verdict::Allowed
    } else {
        // Wait until enough of the oldest entries have slid out.
        let need = log.total + cost - limit;
        let mut freed = 0;
        let mut at = now;
        for &(t, c) in &log.entries {
            freed += c;
            if freed >= need {
                at = t + p;
                break;
            }
        }
        Verdict::Denied(at - now)
    };
    let reset = log.entries.back().map_or(0, |&(t, _)| t + p - now);
    let decision = Decision::from_parts(outcome, limit, limit - log.total, reset);
    (decision, log)
}
