//! A shard's memo of a denied key: checks of that key answered without the shard's lock.
//!
//! An abusive client is one key checked over and over and denied nearly every time. Under the
//! lock, each of those denials costs two atomic read-modify-writes on the lock's cache line, which
//! moves between the cores that serve the key; with two cores on one key the checks run no faster
//! than on one. A denial changes no state, though, and until the key can pass again every check
//! of it at cost 1 is the same denial, only nearer its end. So the shard keeps the last such
//! denial (the key's identity, the instants at which one request passes and the quota is full
//! again, and the figures that do not change) behind a sequence lock, and a check that finds its
//! key there answers from it with plain loads: the cache line is shared by the cores that read it
//! and written only when the memo changes.
//!
//! The answer is exactly the one the lock would give: while a key is denied for a request of cost
//! 1, nothing but time changes its state (a denial stores nothing, and a cost of 1 is the least
//! that can be admitted, so no admission of the key comes before the denial ends), so its decision
//! at a later time is the memo's with the waits shortened by the time passed since. Only a cost of
//! exactly 1 is answered, and only from a denial of cost 1 that left no unit (so that "remaining"
//! is 0 all along) and that one quota alone made (another quota denying too would recover before
//! the binding one, and drop out of the decision's violated quotas): another cost may have a
//! different wait and binding quota, and takes the lock as before. The memo answers only a check
//! whose clock reading is not past the shard's latest time (a copy of which the lock's holder
//! publishes in the memo while it names a key), and counts at that time, as the lock would; a check
//! that would move the latest time on takes the lock (the memo writes nothing shared), which is one
//! check per microsecond of the clock at most. A clock that goes back, or a core whose clock is
//! behind another's, so gets the lock's answer too. The memo is written only while both of its
//! instants are within the algorithms' time range (past `MAX_TIME` they hold time still, and the
//! memo's waits would shrink), and never once the store has been checked at an explicit time (a
//! key's state may then be ahead of the clock, its waits not shortening as the clock moves).
//!
//! The memo's key is also kept in the shard itself (the `hint`), on the cache line that a check
//! reads anyway (for the prefetch), and the memo's own line is read only when the hint names the
//! key: a check of any other key touches no line more than before, and does one comparison more.
//! Where that comparison sits matters on a table larger than the cache: see `check_now`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use crate::algorithm::MAX_TIME;
use crate::{Decision, Timestamp};

#[cfg(test)]
thread_local! {
    /// How many checks of this thread the memo answered (tests: that it was used at all).
    pub(super) static ANSWERS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// One denial of one key, behind a sequence lock. Written only with the shard's lock held (so
/// there is one writer at a time); read without it. On a cache line of its own, so that the
/// lock's traffic does not take the line from its readers.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct DenialMemo {
    /// Even while the fields below are stable, odd while they are being written.
    seq: AtomicU64,
    /// The key's identity; 0 (never an identity) when empty.
    id: AtomicU64,
    /// The first instant at which a request of cost 1 passes, in µs; 0 when empty.
    until: AtomicU64,
    /// The instant at which the binding quota is full again, in µs.
    full_at: AtomicU64,
    limit: AtomicU64,
    /// The decision's kind and quota index.
    tag: AtomicU64,
    /// The instant (µs) the denial was recorded at: the memo answers no earlier time. (A reader
    /// that read the shard's latest time just before a new denial was recorded would otherwise
    /// answer for a time before it, with waits that are too long.)
    at: AtomicU64,
    /// The shard's latest time (µs), published while the memo names a key (outside the sequence
    /// lock: a stale value is an earlier time, at which the answer was right a moment before).
    latest: AtomicU64,
}

impl DenialMemo {
    /// The decision for `id` at cost 1 at `now` (the later of the clock and the shard's latest
    /// time), if the memo holds a denial of `id` that still stands then. Read under the memo's
    /// sequence lock; the caller has found `id` in the shard's hint.
    #[inline]
    pub(super) fn denial(&self, id: u64, now: Timestamp) -> Option<Decision> {
        let seq = self.seq.load(Ordering::Acquire);
        if self.id.load(Ordering::Relaxed) != id {
            return None;
        }
        let until = self.until.load(Ordering::Relaxed);
        let full_at = self.full_at.load(Ordering::Relaxed);
        let limit = self.limit.load(Ordering::Relaxed);
        let tag = self.tag.load(Ordering::Relaxed);
        let at = self.at.load(Ordering::Relaxed);
        // Orders the loads above before the second reading of `seq`: if any of them saw a write
        // of a writer, that writer's odd `seq` is seen here too.
        fence(Ordering::Acquire);
        if seq & 1 != 0 || self.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        let now = now.as_micros();
        if now >= until || now < at {
            return None;
        }
        #[cfg(test)]
        ANSWERS.with(|n| n.set(n.get() + 1));
        Some(Decision::memo_denial(
            until - now,
            full_at.saturating_sub(now),
            limit,
            tag,
        ))
    }

    /// Keeps the memo in step with a decision for `id` made under the shard's lock at `now` (the
    /// time it counted at): a denial of cost 1 that left no unit, by one quota alone, is written
    /// into an empty or expired memo, unless the store has been checked at an explicit time. An
    /// admission needs nothing: by the store's clock, an admission of the memo's key comes at or
    /// after the end of its denial, when the memo no longer answers (and `check_at`, whose
    /// admission may come from the future, empties every memo and stops their writing first). The
    /// caller holds the lock.
    #[inline]
    pub(super) fn after_check(
        &self,
        hint: &AtomicU64,
        id: u64,
        cost: u64,
        now: Timestamp,
        d: &Decision,
        explicit_times: &AtomicBool,
    ) {
        if d.is_allowed() {
            return;
        }
        if cost == 1 && d.remaining() == 0 && d.can_ever_pass() {
            self.record(hint, id, now.as_micros(), d, explicit_times);
        }
    }

    /// The shard's latest time, as last published.
    #[inline]
    pub(super) fn latest(&self) -> Timestamp {
        // Acquire, paired with the Release stores: a reader that sees a latest time sees every
        // memo write (and clear) made under the lock before it, not only the older ones the
        // key's Acquire gave it.
        Timestamp::from_micros(self.latest.load(Ordering::Acquire))
    }

    /// Publishes the shard's latest time `now` (the caller holds the lock and has just moved it
    /// on), if the memo names a key: only then is it read, so other shards' checks write nothing.
    #[inline]
    pub(super) fn publish_latest(&self, hint: &AtomicU64, now: Timestamp) {
        if hint.load(Ordering::Relaxed) != 0 {
            self.latest.store(now.as_micros(), Ordering::Release);
        }
    }

    /// Writes the denial `d` of `id` at `now` (µs) into an empty or expired memo (another key's
    /// denial that still stands stays: a second hot key in the shard takes the lock rather than
    /// make the two evict each other on every check), if both of its instants are within the
    /// algorithms' time range.
    #[inline(never)]
    fn record(&self, hint: &AtomicU64, id: u64, now: u64, d: &Decision, explicit: &AtomicBool) {
        // A denial by several quotas is not written: the others recover before the binding one,
        // and the memo would go on naming them among its violated quotas. (Tested here, out of
        // line, rather than in `after_check`: there it cost every admission 5 instructions.)
        if explicit.load(Ordering::Relaxed) || !d.denied_by_binding_quota_alone() {
            return;
        }
        let until = now.saturating_add(d.retry_after_micros());
        let full_at = now.saturating_add(d.reset_after_micros());
        if self.until.load(Ordering::Relaxed) > now || until > MAX_TIME || full_at > MAX_TIME {
            return;
        }
        self.latest.store(now, Ordering::Release);
        self.write(id, now, until, full_at, d);
        // Release: a reader that sees the key (with Acquire) sees this memo's latest time.
        hint.store(id, Ordering::Release);
    }

    /// Empties the memo (the caller holds the lock): for a sweep or an eviction, which may drop
    /// the memo's key.
    pub(super) fn clear(&self, hint: &AtomicU64) {
        if self.id.load(Ordering::Relaxed) != 0 {
            hint.store(0, Ordering::Relaxed);
            self.write(0, 0, 0, 0, &Decision::memo_denial(0, 0, 0, 0));
        }
    }

    fn write(&self, id: u64, at: u64, until: u64, full_at: u64, d: &Decision) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd `seq` before the fields: a reader that sees any new field sees it.
        fence(Ordering::Release);
        self.id.store(id, Ordering::Relaxed);
        self.until.store(until, Ordering::Relaxed);
        self.full_at.store(full_at, Ordering::Relaxed);
        self.limit.store(d.limit(), Ordering::Relaxed);
        self.tag.store(d.tag_word(), Ordering::Relaxed);
        self.at.store(at, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;
    use std::time::Duration;

    /// A store never checked at an explicit time.
    static NEVER: AtomicBool = AtomicBool::new(false);
    /// A store checked at an explicit time.
    static EXPLICIT: AtomicBool = AtomicBool::new(true);

    fn denial(retry_us: u64, reset_us: u64) -> Decision {
        Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_micros(retry_us),
            },
            10,
            0,
            Duration::from_micros(reset_us),
            1,
        )
    }

    #[test]
    fn a_recorded_denial_answers_until_the_key_can_pass() {
        let memo = DenialMemo::default();
        let hint = AtomicU64::new(0);
        assert_eq!(memo.denial(7, Timestamp::from_micros(0)), None);
        memo.after_check(
            &hint,
            7,
            1,
            Timestamp::from_micros(100),
            &denial(50, 900),
            &NEVER,
        );
        // Later: the waits shortened by the time passed.
        assert_eq!(
            memo.denial(7, Timestamp::from_micros(120)),
            Some(denial(30, 880))
        );
        assert_eq!(memo.denial(8, Timestamp::from_micros(120)), None);
        assert_eq!(memo.denial(7, Timestamp::from_micros(150)), None);
    }

    /// A reader whose time was read before a newer denial of its key was recorded (the shard's
    /// latest time, read outside the sequence lock, then the key admitted and denied again) is
    /// not answered for that earlier time, at which the new denial did not exist: it takes the
    /// lock.
    #[test]
    fn no_answer_for_a_time_before_the_denial_was_recorded() {
        let memo = DenialMemo::default();
        let hint = AtomicU64::new(0);
        let t = Timestamp::from_micros;
        memo.after_check(&hint, 7, 1, t(0), &denial(1_000, 1_000), &NEVER);
        let stale = memo.latest();
        assert_eq!(stale, t(0));
        // The denial ends; the key is admitted and denied again at 1,400.
        memo.after_check(&hint, 7, 1, t(1_400), &denial(1_000, 1_000), &NEVER);
        assert_eq!(memo.denial(7, stale), None);
        assert_eq!(memo.denial(7, t(1_400)), Some(denial(1_000, 1_000)));
        assert_eq!(memo.denial(7, t(1_500)), Some(denial(900, 900)));
    }

    #[test]
    fn only_denials_of_cost_one_with_nothing_left_are_recorded() {
        let memo = DenialMemo::default();
        let hint = AtomicU64::new(0);
        let t = Timestamp::from_micros(100);
        memo.after_check(&hint, 7, 2, t, &denial(50, 900), &NEVER);
        assert_eq!(memo.denial(7, t), None);
        memo.after_check(&hint, 7, 1, t, &denial(50, 900), &EXPLICIT);
        assert_eq!(memo.denial(7, t), None);
        let left = Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_micros(50),
            },
            10,
            1,
            Duration::from_micros(900),
            0,
        );
        memo.after_check(&hint, 7, 1, t, &left, &NEVER);
        assert_eq!(memo.denial(7, t), None);
        memo.after_check(
            &hint,
            7,
            1,
            t,
            &Decision::new(Outcome::Exceeds, 10, 0, Duration::ZERO, 0),
            &NEVER,
        );
        assert_eq!(memo.denial(7, t), None);
    }

    #[test]
    fn another_key_waits_its_turn_and_an_admission_leaves_it() {
        let memo = DenialMemo::default();
        let hint = AtomicU64::new(0);
        let t = Timestamp::from_micros;
        memo.after_check(&hint, 7, 1, t(100), &denial(50, 900), &NEVER);
        assert_eq!(hint.load(Ordering::Relaxed), 7);
        // Another key's denial does not replace one that still stands...
        memo.after_check(&hint, 8, 1, t(110), &denial(50, 900), &NEVER);
        assert_eq!(hint.load(Ordering::Relaxed), 7);
        // ...nor does an admission clear it: by the store's clock, the key's own cannot come
        // before the denial ends (and a store checked at explicit times writes no memo).
        let allowed = Decision::new(Outcome::Allowed, 10, 3, Duration::from_micros(5), 0);
        memo.after_check(&hint, 7, 1, t(150), &allowed, &NEVER);
        memo.after_check(&hint, 8, 1, t(110), &allowed, &NEVER);
        assert!(memo.denial(7, t(110)).is_some());
        memo.clear(&hint);
        assert_eq!(hint.load(Ordering::Relaxed), 0);
        assert_eq!(memo.denial(7, t(110)), None);
        // Once it has expired, the next denial takes its place.
        memo.after_check(&hint, 7, 1, t(100), &denial(50, 900), &NEVER);
        memo.after_check(&hint, 8, 1, t(150), &denial(20, 900), &NEVER);
        assert_eq!(hint.load(Ordering::Relaxed), 8);
        assert_eq!(memo.denial(8, t(160)), Some(denial(10, 890)));
        memo.clear(&hint);
        assert_eq!(hint.load(Ordering::Relaxed), 0);
        assert_eq!(memo.denial(8, t(160)), None);
    }
}
