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

    /// Drops the entries that have slid out of `quota`'s window at `now` (clamped as a check
    /// clamps it). For a store whose checks never count at an earlier time (the memory store on
    /// its clock): a denial then need not scan them again.
    pub(crate) fn prune_at(&mut self, quota: &Quota, now: Timestamp) {
        let now = clamp(self, now);
        self.prune(now, quota.period_micros());
    }

    fn prune(&mut self, now: u64, period: u64) {
        while let Some(&(t, c)) = self.entries.front() {
            if t.saturating_add(period) <= now {
                self.entries.pop_front();
                self.total = self.total.saturating_sub(c);
            } else {
                break;
            }
        }
        // Give back the memory of a burst once it has slid out (a full log of a large limit is
        // megabytes), by halves, so that a log that grows again does not reallocate at every
        // check: amortized, each entry is moved a constant number of times.
        let cap = self.entries.capacity();
        if cap > 64 && self.entries.len() < cap / 4 {
            self.entries.shrink_to((self.entries.len() * 2).max(64));
        }
    }
}

/// Checks `cost` at `now` against the exact log of the last `period`. Returns the decision and
/// the state to store if committed.
///
/// This copies the log; a store that holds the state should call [`decide`] and, if it admits,
/// [`commit`], which change it in place.
#[must_use]
pub fn check(
    quota: &Quota,
    state: Option<&SlidingLogState>,
    now: Timestamp,
    cost: u64,
) -> (Decision, SlidingLogState) {
    let mut log = state.cloned().unwrap_or_default();
    let decision = decide(quota, &log, now, cost);
    if decision.is_allowed() {
        commit(quota, &mut log, now, cost);
    }
    (decision, log)
}

/// The time a check at `now` counts with: never before the newest entry (time going backwards
/// never frees an entry), never past [`MAX_TIME`].
fn clamp(log: &SlidingLogState, now: Timestamp) -> u64 {
    let newest = log.entries.back().map_or(0, |&(t, _)| t);
    now.as_micros().min(MAX_TIME).max(newest)
}

/// The decision for `cost` at `now`, reading `log` without changing it.
#[must_use]
pub fn decide(quota: &Quota, log: &SlidingLogState, now: Timestamp, cost: u64) -> Decision {
    let p = quota.period_micros();
    let limit = quota.limit();
    let now = clamp(log, now);
    // Entries that have slid out of the window by `now`.
    let (mut expired, mut expired_cost) = (0, 0);
    for &(t, c) in &log.entries {
        if t.saturating_add(p) > now {
            break;
        }
        expired += 1;
        expired_cost = c.saturating_add(expired_cost);
    }
    let live = log.entries.range(expired..);
    // Saturating throughout: the state's fields are public, and a state kept under a larger limit
    // (or built by hand) may hold more than this quota's limit; it then denies, and never panics.
    let total = log.total.saturating_sub(expired_cost);
    let live_newest = live.clone().next_back().map(|&(t, _)| t);

    let (outcome, total, newest) = if cost > limit {
        (Verdict::Exceeds, total, live_newest)
    } else if cost == 0 || total.saturating_add(cost) <= limit {
        // A peek is always allowed, even on a log over the limit.
        let newest = if cost > 0 { Some(now) } else { live_newest };
        (Verdict::Allowed, total + cost, newest)
    } else {
        // Wait until enough of the oldest entries have slid out (at least 1 µs: a state whose
        // total its entries do not hold finds none to wait for).
        let at = freed_at(live.clone().copied(), total.saturating_add(cost) - limit, p);
        (
            Verdict::Denied(at.unwrap_or(now).saturating_sub(now).max(1)),
            total,
            live_newest,
        )
    };
    let reset = newest.map_or(0, |t| t.saturating_add(p).saturating_sub(now));
    let remaining = limit.saturating_sub(total);
    // Allowed, or a cost that can never pass (told the quota as it stands), and not full: more
    // is available when enough of the oldest entries, an admitted check's among them, have slid
    // out for one more than is left to pass: the oldest alone, unless the log holds more than
    // this limit (a state kept under a larger one). 0 if no entry frees it (a state whose total
    // its entries do not hold).
    let more = match outcome {
        Verdict::Allowed | Verdict::Exceeds if remaining < limit => {
            let admitted = (matches!(outcome, Verdict::Allowed) && cost > 0).then_some((now, cost));
            let need = total.saturating_add(remaining + 1) - limit;
            freed_at(live.copied().chain(admitted), need, p).map_or(0, |at| at.saturating_sub(now))
        }
        _ => 0,
    };
    Decision::from_parts(outcome, limit, remaining, reset).with_more_after_micros(more)
}

/// When `need` of the cost of `entries` (oldest first) has slid out of a window of `p`: when
/// the last entry it takes does; `None` if they do not hold that much.
fn freed_at(entries: impl Iterator<Item = (u64, u64)>, need: u64, p: u64) -> Option<u64> {
    let mut freed = 0u64;
    entries
        .into_iter()
        .find(|&(_, c)| {
            freed = freed.saturating_add(c);
            freed >= need
        })
        .map(|(t, _)| t.saturating_add(p))
}

/// Records an admitted `cost` at `now` in `log`: drops the entries that have slid out and adds
/// the new one. Call it only after [`decide`] admitted the same cost at the same time; a cost of
/// zero (a peek) changes nothing.
pub fn commit(quota: &Quota, log: &mut SlidingLogState, now: Timestamp, cost: u64) {
    if cost == 0 {
        return;
    }
    let now = clamp(log, now);
    log.prune(now, quota.period_micros());
    match log.entries.back_mut() {
        Some((t, c)) if *t == now => *c = c.saturating_add(cost),
        _ => log.entries.push_back((now, cost)),
    }
    log.total = log.total.saturating_add(cost);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A peek is always allowed, as under every other algorithm, even on a log that holds more
    /// than this quota's limit (a state kept under a larger one, or built by hand).
    #[test]
    fn a_peek_is_allowed_on_a_log_over_the_limit() {
        let log = SlidingLogState {
            entries: [(0, 60), (500_000, 40)].into(),
            total: 100,
        };
        let quota = Quota::per_second(10).unwrap();
        let d = decide(&quota, &log, Timestamp::from_micros(600_000), 0);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert!(decide(&quota, &log, Timestamp::from_micros(600_000), 1).is_denied());
        // More is available when the log is back under the limit: the 60 of 0 s leave at 1 s,
        // which still holds 40 (nothing left); the 40 of 0.5 s at 1.5 s.
        assert_eq!(d.more_after(), Some(std::time::Duration::from_millis(900)));
        let at = |ms: u64| decide(&quota, &log, Timestamp::from_micros(ms * 1_000), 0).remaining();
        assert_eq!((at(1_000), at(1_499), at(1_500)), (0, 0, 10));
    }

    /// A burst's memory is given back once its entries have slid out.
    #[test]
    fn a_burst_that_slid_out_gives_its_memory_back() {
        let quota = Quota::per_second(100_000).unwrap();
        let mut log = SlidingLogState::default();
        for t in 0..100_000u64 {
            commit(&quota, &mut log, Timestamp::from_micros(t), 1);
        }
        assert!(log.entries.capacity() >= 100_000);
        // A second later the burst has slid out; a trickle keeps the key live.
        for t in 0..10u64 {
            commit(
                &quota,
                &mut log,
                Timestamp::from_micros(1_000_000 + 100_000 + t),
                1,
            );
        }
        assert_eq!(log.entries.len(), 10);
        assert!(
            log.entries.capacity() <= 1_024,
            "{}",
            log.entries.capacity()
        );
    }

    /// The admissions of the last `period`, kept naively: every admission ever, summed each time.
    fn naive(
        limit: u64,
        period: u64,
        admitted: &[(u64, u64)],
        now: u64,
        cost: u64,
    ) -> (bool, u64, Option<u64>) {
        let live: Vec<_> = admitted
            .iter()
            .filter(|&&(t, _)| t + period > now)
            .collect();
        let total: u64 = live.iter().map(|&&(_, c)| c).sum();
        if cost <= limit && total + cost <= limit {
            return (true, limit - total - cost, None);
        }
        let retry = (cost <= limit).then(|| {
            let need = total + cost - limit;
            let mut freed = 0;
            live.iter()
                .find(|&&&(_, c)| {
                    freed += c;
                    freed >= need
                })
                .map_or(0, |&&(t, _)| t + period - now)
        });
        (false, limit - total, retry)
    }

    /// A log holding more than the quota's limit (kept under a larger one, or built by hand: the
    /// fields are public) is denied with nothing remaining, and waits for enough of it to slide
    /// out; a log whose fields disagree never panics.
    #[test]
    fn a_log_over_the_limit_is_denied_and_nothing_panics() {
        let quota = Quota::per_second(10).unwrap();
        let log = SlidingLogState {
            entries: [(0, 60), (500_000, 40)].into_iter().collect(),
            total: 100,
        };
        let d = decide(&quota, &log, Timestamp::from_micros(600_000), 1);
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
        // 91 units must slide out: both entries, the second at 1.5 s.
        assert_eq!(
            d.retry_after(),
            Some(std::time::Duration::from_micros(900_000))
        );
        let broken = SlidingLogState {
            entries: [(u64::MAX - 1, u64::MAX), (5, 3)].into_iter().collect(),
            total: 1,
        };
        for now in [0, 5, 1 << 40, u64::MAX] {
            for cost in [0, 1, 10, 11, u64::MAX] {
                let at = Timestamp::from_micros(now);
                let d = decide(&quota, &broken, at, cost);
                if let Some(wait) = d.retry_after() {
                    assert!(wait >= std::time::Duration::from_micros(1));
                }
                let mut log = broken.clone();
                commit(&quota, &mut log, at, cost);
            }
        }
    }

    proptest! {
        /// `decide` and `commit`, changing one log in place, make the decisions of a naive count
        /// of every admission in the window, and keep the log as short as the window needs.
        #[test]
        fn in_place_log_matches_a_naive_count(
            limit in 1u64..20,
            period in 1u64..50,
            steps in prop::collection::vec((0u64..12, 0u64..6), 1..200),
        ) {
            let quota = Quota::per_period(limit, std::time::Duration::from_micros(period)).unwrap();
            let mut log = SlidingLogState::default();
            let mut admitted = Vec::new();
            let mut now = 0;
            for (dt, cost) in steps {
                now += dt;
                let at = Timestamp::from_micros(now);
                let d = decide(&quota, &log, at, cost);
                let (allowed, remaining, retry) = naive(limit, period, &admitted, now, cost);
                prop_assert_eq!(d.is_allowed(), allowed);
                prop_assert_eq!(d.remaining(), remaining);
                prop_assert_eq!(d.retry_after().map(|r| r.as_micros() as u64), retry);
                if allowed {
                    commit(&quota, &mut log, at, cost);
                    if cost > 0 {
                        admitted.push((now, cost));
                    }
                }
                prop_assert!(log.total <= limit);
                prop_assert_eq!(log.total, log.entries.iter().map(|&(_, c)| c).sum::<u64>());
            }
        }
    }
}
