//! Two-word encodings of single-quota states, so that a key fits one 32-byte bucket.
//!
//! Word `a` is always the time (µs) from which the state is fresh, so that sweeps can tell fresh
//! keys without knowing their quota:
//!
//! | algorithm      | `a`                                   | `b`                                  |
//! |----------------|---------------------------------------|--------------------------------------|
//! | token bucket   | when the bucket is full (µs, rounded up) | what rounding up added, in 1/rate µs |
//! | GCRA           | the TAT (µs, rounded up)              | what rounding up added, in 1/rate µs |
//! | fixed window   | the window's end                      | the count                            |
//! | sliding window | when both counters have slid out      | `current << 32 \| previous`          |
//!
//! A token bucket's `(level, last)` and "the time it is full again" carry the same information at
//! any instant: `level = capacity − (full_at − now) × rate`. The store keeps the latter, because
//! it does not go stale, and hands the algorithm the former. Sliding logs, multi-quota limits and
//! counters above 2^32 go to the shard's side storage instead.

use crate::algorithm::{
    FixedWindowState, GcraState, MAX_TIME, SlidingWindowState, TokenBucketState, fixed_window,
    gcra, sliding_window, token_bucket,
};
use crate::{Algorithm, Decision, Limit, Quota, State, Timestamp};

/// The state to store after an allowed check.
#[derive(Debug)]
pub(super) enum Next {
    Inline(u64, u64),
    /// States for the side storage, and when they are fresh.
    Big(Vec<State>, u64),
}

/// Checks `cost` against `limit` from a stored inline state (or none), returning the decision and
/// the state to store if it is allowed.
#[inline(always)]
pub(super) fn check(
    limit: &Limit,
    stored: Option<(u64, u64)>,
    now: Timestamp,
    cost: u64,
) -> (Decision, Next) {
    let [quota] = limit.quotas() else {
        return general(limit, now, cost);
    };
    let q = quota;
    match limit.algorithm() {
        Algorithm::TokenBucket => {
            let now_us = now.as_micros().min(MAX_TIME);
            let s = stored.map(|(a, b)| TokenBucketState {
                level: q.capacity_units() - debt(q, a, b, now_us),
                last: now_us,
            });
            let (d, s) = token_bucket::check(q, s.as_ref(), now, cost);
            let (a, b) = split(q, s.last, q.capacity_units() - s.level);
            (d, Next::Inline(a, b))
        }
        Algorithm::Gcra => {
            let s = stored.map(|(a, b)| {
                let (tat, frac) = unround(q, a, b);
                GcraState { tat, frac }
            });
            let (d, s) = gcra::check(q, s.as_ref(), now, cost);
            let (a, b) = round(q, s.tat, s.frac);
            (d, Next::Inline(a, b))
        }
        Algorithm::FixedWindow => {
            let p = q.period_micros();
            let s = stored.map(|(end, count)| FixedWindowState {
                start: end.saturating_sub(p),
                count,
            });
            let (d, s) = fixed_window::check(q, s.as_ref(), now, cost);
            (d, Next::Inline(s.start + p, s.count))
        }
        Algorithm::SlidingWindow => {
            let p = q.period_micros();
            let s = stored.map(|(fresh_at, counts)| {
                let (current, previous) = (counts >> 32, counts & u64::from(u32::MAX));
                let back = if current > 0 { 2 * p } else { p };
                SlidingWindowState {
                    start: fresh_at.saturating_sub(back),
                    current,
                    previous,
                }
            });
            let (d, s) = sliding_window::check(q, s.as_ref(), now, cost);
            let fresh_at = s.fresh_at(q).as_micros();
            let next = match (u32::try_from(s.current), u32::try_from(s.previous)) {
                (Ok(c), Ok(p)) => Next::Inline(fresh_at, (u64::from(c) << 32) | u64::from(p)),
                _ => Next::Big(vec![State::SlidingWindow(s)], fresh_at),
            };
            (d, next)
        }
        _ => general(limit, now, cost),
    }
}

/// Limits whose state never fits a bucket: checked on fresh states (the side storage is checked
/// in place by the store itself).
fn general(limit: &Limit, now: Timestamp, cost: u64) -> (Decision, Next) {
    let mut states = limit.fresh_states(now);
    let d = limit.check(&mut states, now, cost);
    let fresh_at = limit.fresh_at(&states).as_micros();
    (d, Next::Big(states, fresh_at))
}

/// Debt at `now` (level units) of a bucket stored as `(a, b)`.
#[inline]
fn debt(q: &Quota, a: u64, b: u64, now: u64) -> u64 {
    let (a, b) = unround(q, a, b);
    if a < now {
        0
    } else {
        (a - now)
            .saturating_mul(q.refill_per_micro())
            .saturating_add(b)
            .min(q.capacity_units())
    }
}

/// The time a bucket with `debt` at `last` is full, stored as `(a, b)`.
#[inline]
fn split(q: &Quota, last: u64, debt: u64) -> (u64, u64) {
    let rate = q.refill_per_micro();
    if rate == 1 {
        (last + debt, 0)
    } else {
        round(q, last + debt / rate, debt % rate)
    }
}

/// `tat + frac / rate` µs as `(ceil, rate − frac)` (or `(tat, 0)` when `frac` is 0), so that `a` is
/// exactly the first whole microsecond at which the state is fresh.
#[inline]
fn round(q: &Quota, tat: u64, frac: u64) -> (u64, u64) {
    if frac == 0 {
        (tat, 0)
    } else {
        (tat + 1, q.refill_per_micro() - frac)
    }
}

/// The inverse of [`round`].
#[inline]
fn unround(q: &Quota, a: u64, b: u64) -> (u64, u64) {
    if b == 0 {
        (a, 0)
    } else {
        (a - 1, q.refill_per_micro() - b)
    }
}
