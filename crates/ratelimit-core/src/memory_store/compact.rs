//! One-word encodings of single-quota states, so that a key fits a 16-byte bucket with its
//! 64-bit identity.
//!
//! Every word tells, without its quota, a time from which its state is certainly fresh
//! ([`fresh_from`]), so that sweeps can drop fresh states of any limit. Bit 63 is never set here
//! (the store marks states in its side storage with it); bit 62 picks one of two forms.
//!
//! **Bucket form** (bit 62 clear; token bucket and GCRA): bits 0..52 hold `a`, the first whole
//! microsecond at which the state is fresh (2^52 µs is the year 2112 in Unix time), and bits
//! 52..62 hold `b`, what rounding up to `a` added, in 1/rate µs. A token bucket's `(level, last)` and "the time it is full again" carry the
//! same information at any instant: `level = capacity − (full_at − now) × rate`. The store keeps
//! the latter, because it does not go stale, and hands the algorithm the former; GCRA's TAT is
//! that time already.
//!
//! **Window form** (bit 62 set; fixed and sliding windows): a window state is fresh at a multiple
//! of its period `p`. With `e` the largest exponent such that `2^e ≤ p` (at most 53), the word holds
//! `e` (bits 56..62), `m = ⌈fresh_at / 2^e⌉` (bits `e + 2`..56) and the counts in the low `e + 2`
//! bits (a sliding window's two counts in halves of them). `m × 2^e` is at or after the exact
//! time, which is the one multiple of `p` in `((m − 1) × 2^e, m × 2^e]`. A window of a minute
//! thus keeps counts below 2^27 (a sliding window's below 2^13 each), one of a second below 2^21
//! (2^10 each).
//!
//! A state that does not fit goes to the shard's side storage, as do sliding logs and multi-quota
//! limits: a remainder `b` of 2^10 or more (possible only for refill rates above 1,024 units per
//! µs, that is limits whose ratio to the period in µs does not reduce below 1,024), counts beyond
//! the above, and times at or past 2^52 µs (bucket form) or 2^53 µs (window form).

use crate::algorithm::{
    FixedWindowState, GcraState, MAX_TIME, SlidingWindowState, TokenBucketState, fixed_window,
    gcra, sliding_window, token_bucket,
};
use crate::{Algorithm, Decision, Limit, Quota, State, Timestamp};

/// The state to store after an allowed check.
#[derive(Debug)]
pub(super) enum Next {
    Inline(u64),
    /// States for the side storage, and when they are fresh.
    Big(Vec<State>, u64),
}

/// Set in the window form.
const WINDOW: u64 = 1 << 62;
/// Bits of `a` in the bucket form.
const A_BITS: u32 = 52;
/// Bits of `b` in the bucket form.
const B_BITS: u32 = 10;
/// Bits of a window's time in the window form (times below 2^53 µs).
const T_BITS: u32 = 53;
/// Where `e` starts in the window form.
const E_SHIFT: u32 = 56;

/// A time from which the state in `word` is certainly fresh: exactly so in the bucket form, at
/// most `2^e − 1` µs later than exactly in the window form.
#[inline]
pub(super) fn fresh_from(word: u64) -> u64 {
    if word & WINDOW == 0 {
        word & mask(A_BITS)
    } else {
        let (e, m, _) = window_parts(word);
        m << e
    }
}

#[inline(always)]
const fn mask(bits: u32) -> u64 {
    (1 << bits) - 1
}

/// The bucket form of `(a, b)`, if it fits.
#[inline]
fn bucket_word(a: u64, b: u64) -> Option<u64> {
    (a <= mask(A_BITS) && b <= mask(B_BITS)).then_some(a | (b << A_BITS))
}

/// The bucket form's `(a, b)` for quota `q`, or `None` for a word this quota cannot have written
/// (another form, or a remainder not below its rate): a state of another key whose 64-bit digest
/// is the same, which then counts as fresh, as [`Limit::check`] counts a state of another
/// algorithm.
#[inline]
fn bucket_parts(q: &Quota, word: u64) -> Option<(u64, u64)> {
    let (a, b) = (word & mask(A_BITS), (word >> A_BITS) & mask(B_BITS));
    let ours = word & WINDOW == 0 && (b == 0 || (b < q.refill_per_micro() && a > 0));
    ours.then_some((a, b))
}

/// `e` for period `p`: the largest with `2^e ≤ p`, at most 53.
#[inline]
fn exponent(p: u64) -> u32 {
    p.ilog2().min(T_BITS)
}

/// The window form of a state fresh at `fresh_at` (a multiple of `p`) with `payload` in its low
/// `e + 2` bits, if it fits.
#[inline]
fn window_word(p: u64, fresh_at: u64, payload: u64) -> Option<u64> {
    let e = exponent(p);
    let m = fresh_at.div_ceil(1 << e);
    let fits = fresh_at.is_multiple_of(p)
        && fresh_at <= mask(T_BITS)
        && payload <= mask(e + 2)
        && m <= mask(E_SHIFT - (e + 2));
    fits.then_some(WINDOW | (u64::from(e) << E_SHIFT) | (m << (e + 2)) | payload)
}

/// The window form's `e`.
#[inline]
fn window_exponent(word: u64) -> u32 {
    ((word >> E_SHIFT) & mask(6)) as u32
}

/// The window form's `(e, m, payload)`.
#[inline]
fn window_parts(word: u64) -> (u32, u64, u64) {
    let e = window_exponent(word);
    let low = word & mask(E_SHIFT);
    (e, low >> (e + 2), low & mask(e + 2))
}

/// The exact time a window state of period `p` in `word` is fresh, and its payload, or `None`
/// for a word a window of period `p` cannot have written (see [`bucket_parts`]).
#[inline]
fn window_fresh_at(p: u64, word: u64) -> Option<(u64, u64)> {
    let ours = word & WINDOW != 0 && window_exponent(word) == exponent(p);
    ours.then(|| {
        let (e, m, payload) = window_parts(word);
        ((m << e) / p * p, payload)
    })
}

/// Where a check puts the state to store: the word for the bucket, or the states for the side
/// storage. Two places rather than one `Option<Next>`, whose tests (of its niche in the vector's
/// capacity) and drop check took about 15 instructions of every admission.
#[derive(Debug)]
pub(super) struct Out {
    /// The word to store, or [`NO_WORD`].
    pub(super) word: u64,
    big: Option<(Vec<State>, u64)>,
}

/// No word to store: bit 63, never set in a word here.
pub(super) const NO_WORD: u64 = u64::MAX;

impl Out {
    /// Nothing to store yet.
    #[inline(always)]
    pub(super) fn new() -> Self {
        Out {
            word: NO_WORD,
            big: None,
        }
    }

    /// The state to store, if any.
    #[inline(always)]
    pub(super) fn into_next(self) -> Option<Next> {
        if self.word != NO_WORD {
            Some(Next::Inline(self.word))
        } else {
            self.big
                .map(|(states, fresh_at)| Next::Big(states, fresh_at))
        }
    }
}

/// Checks `cost` against `limit` from a stored inline state (or none), returning the decision;
/// the state to store goes to `next`, which must be empty on entry and is left empty unless an
/// admission changed the state (a denial or a peek stores nothing, so its state is not encoded).
///
/// The state goes out through `next` rather than beside the decision: returning both from the arms
/// of the match below merged them in a stack temporary, written a field at a time and read back
/// in wider loads, whose stalled store forwarding was a quarter of a check's time (`perf
/// annotate`). (A closure in its place was not inlined.)
#[inline(always)]
pub(super) fn check(
    limit: &Limit,
    stored: Option<u64>,
    now: Timestamp,
    cost: u64,
    next: &mut Out,
) -> Decision {
    let [quota] = limit.quotas() else {
        return general(limit, now, cost, next);
    };
    let q = quota;
    match limit.algorithm() {
        Algorithm::TokenBucket => {
            let now_us = now.as_micros().min(MAX_TIME);
            let s = stored
                .and_then(|word| bucket_parts(q, word))
                .map(|(a, b)| TokenBucketState {
                    level: q.capacity_units() - debt(q, a, b, now_us),
                    last: now_us,
                });
            let (d, s) = token_bucket::check(q, s.as_ref(), now, cost);
            if !stores(&d, cost) {
                return d;
            }
            let (a, b) = split(
                q,
                s.last,
                q.capacity_units() - s.level,
                d.reset_after_micros(),
            );
            put(
                next,
                inline_or_big(bucket_word(a, b), || {
                    (State::TokenBucket(s), s.fresh_at(q).as_micros())
                }),
            );
            d
        }
        Algorithm::Gcra => {
            let s = stored.and_then(|word| bucket_parts(q, word)).map(|(a, b)| {
                let (tat, frac) = unround(q, a, b);
                GcraState { tat, frac }
            });
            let (d, s) = gcra::check(q, s.as_ref(), now, cost);
            if !stores(&d, cost) {
                return d;
            }
            let (a, b) = round(q, s.tat, s.frac);
            put(
                next,
                inline_or_big(bucket_word(a, b), || {
                    (State::Gcra(s), s.fresh_at().as_micros())
                }),
            );
            d
        }
        Algorithm::FixedWindow => {
            let p = q.period_micros();
            let s = stored
                .and_then(|word| window_fresh_at(p, word))
                .map(|(end, count)| FixedWindowState {
                    start: end.saturating_sub(p),
                    count,
                });
            let (d, s) = fixed_window::check(q, s.as_ref(), now, cost);
            if !stores(&d, cost) {
                return d;
            }
            let end = s.start.saturating_add(p);
            put(
                next,
                inline_or_big(window_word(p, end, s.count), || {
                    (State::FixedWindow(s), end)
                }),
            );
            d
        }
        Algorithm::SlidingWindow => {
            let p = q.period_micros();
            let half = (exponent(p) + 2) / 2;
            let s = stored
                .and_then(|word| window_fresh_at(p, word))
                .map(|(fresh_at, counts)| {
                    let (current, previous) = (counts >> half, counts & mask(half));
                    let back = if current > 0 { 2 * p } else { p };
                    SlidingWindowState {
                        start: fresh_at.saturating_sub(back),
                        current,
                        previous,
                    }
                });
            let (d, s) = sliding_window::check(q, s.as_ref(), now, cost);
            if !stores(&d, cost) {
                return d;
            }
            let fresh_at = s.fresh_at(q).as_micros();
            let word = if s.current <= mask(half) && s.previous <= mask(half) {
                window_word(p, fresh_at, (s.current << half) | s.previous)
            } else {
                None
            };
            put(
                next,
                inline_or_big(word, || (State::SlidingWindow(s), fresh_at)),
            );
            d
        }
        _ => general(limit, now, cost, next),
    }
}

/// Limits whose state never fits a bucket: checked on fresh states (the side storage is checked
/// in place by the store itself).
fn general(limit: &Limit, now: Timestamp, cost: u64, next: &mut Out) -> Decision {
    let mut states = limit.fresh_states(now);
    let d = limit.check(&mut states, now, cost);
    if stores(&d, cost) {
        let fresh_at = limit.fresh_at(&states).as_micros();
        put(next, Next::Big(states, fresh_at));
    }
    d
}

/// Sets `next`, empty until then: the word in place, or the side states without calling the drop
/// glue of the empty `Option` they replace (assigning over it compiled to that call, out of
/// line).
#[inline(always)]
fn put(next: &mut Out, value: Next) {
    debug_assert!(
        next.word == NO_WORD && next.big.is_none(),
        "a check stores one state"
    );
    match value {
        Next::Inline(word) => next.word = word,
        Next::Big(states, fresh_at) => std::mem::forget(next.big.replace((states, fresh_at))),
    }
}

/// Whether a check's state is stored: only an admission of a positive cost changes it.
#[inline(always)]
pub(super) fn stores(d: &Decision, cost: u64) -> bool {
    d.is_allowed() && cost > 0
}

/// The word to store if there is one, else the state for the side storage and when it is fresh
/// (made only then).
#[inline(always)]
fn inline_or_big(word: Option<u64>, big: impl FnOnce() -> (State, u64)) -> Next {
    match word {
        Some(word) => Next::Inline(word),
        None => {
            let (state, fresh_at) = big();
            Next::Big(vec![state], fresh_at)
        }
    }
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

/// The time a bucket with `debt` at `last` is full, stored as `(a, b)`, given `up`, the number of
/// microseconds until then rounded up (`⌈debt / rate⌉`, which the decision's reset time already
/// is): `a = last + up` and `b = up × rate − debt`, the same as [`round`] of the exact time,
/// without a second division.
#[inline]
fn split(q: &Quota, last: u64, debt: u64, up: u64) -> (u64, u64) {
    let rate = q.refill_per_micro();
    debug_assert_eq!(up, debt.div_ceil(rate));
    // `debt` is at most the capacity and `rate` at most the limit, both at most 2^52 (see
    // `Quota`), so `up × rate < debt + rate ≤ 2^53`: no overflow.
    (last + up, up * rate - debt)
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

#[cfg(test)]
mod tests {
    use super::{Next, Out, WINDOW, check};
    use crate::{Algorithm, Limit, Quota, Timestamp};
    use std::time::Duration;

    /// Two keys whose 64-bit digests agree share a word: whatever one limit wrote, any other
    /// limit reads it without a panic (no underflow, no shift past 63), and a word of the other
    /// form, or a remainder not below its rate, counts as fresh.
    #[test]
    fn a_word_written_by_another_limit_is_read_safely() {
        let quotas = [
            Quota::per_minute(100).unwrap(),
            Quota::per_second(1_000_000_000).unwrap(),
            Quota::per_period(7, Duration::from_micros(3)).unwrap(),
            Quota::per_second(3).unwrap().with_burst(50).unwrap(),
            Quota::per_period(1_000, Duration::from_secs(86_400)).unwrap(),
        ];
        let algorithms = [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ];
        let limits: Vec<Limit> = algorithms
            .iter()
            .flat_map(|&a| {
                quotas
                    .iter()
                    // The window algorithms take no burst but the limit.
                    .filter(move |q| a.uses_burst() || q.burst() == q.limit())
                    .map(move |&q| Limit::single(a, q).unwrap())
            })
            .collect();
        let t0 = Timestamp::from_micros(1_764_000_000_000_000);
        let mut words = Vec::new();
        for writer in &limits {
            for cost in [1, 2, 40] {
                let mut next = Out::new();
                let d = check(writer, None, t0, cost, &mut next);
                if let (true, Some(Next::Inline(word))) = (d.is_allowed(), next.into_next()) {
                    words.push(word);
                }
            }
        }
        // Also words no limit writes: every form bit, exponents and remainders at their widest.
        words.extend([
            0,
            u64::MAX >> 1,
            WINDOW | (63 << 56),
            (1 << 62) - 1,
            1 << 52,
        ]);
        let mut foreign = 0;
        for &word in &words {
            for reader in &limits {
                for (later, cost) in [(0, 1), (1, 0), (1_000, 3), (10_000_000, 1)] {
                    let now = t0.saturating_add(Duration::from_micros(later));
                    let got = check(reader, Some(word), now, cost, &mut Out::new());
                    let fresh = check(reader, None, now, cost, &mut Out::new());
                    let bucket_reader =
                        matches!(reader.algorithm(), Algorithm::TokenBucket | Algorithm::Gcra);
                    if bucket_reader == (word & WINDOW != 0) {
                        assert_eq!(got, fresh, "word {word:#x} read by {reader:?}");
                        foreign += 1;
                    }
                }
            }
        }
        assert!(foreign > 100, "{foreign} cross-form reads");
    }
}
