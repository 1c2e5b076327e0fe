//! `DenialCache`: answers repeated denials locally until they can first pass, without asking the
//! store.
//!
//! See the documentation of the type for how it works and its guarantees.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use pin_project_lite::pin_project;

use crate::algorithm::MAX_TIME;
use crate::key_digest::{BuildIdHasher, KeyDigest};
use crate::memory_store::prev_power_of_two;
use crate::reset::WrapperResetFuture;
use crate::time::duration_to_micros as micros;
use crate::{Algorithm, Clock, ConfigError, Decision, Forget, Limit, Outcome, Quota, Reset, Store};

/// The time on `clock` in µs, as the algorithms count it: past [`MAX_TIME`] (the year 2112) time
/// stands still for them, so a denial's deadline past it must count from it too, or a cached
/// denial would run out while the store's does not.
fn now_on(clock: &impl Clock) -> u64 {
    clock.now().as_micros().min(MAX_TIME)
}

/// The default most entries a [`DenialCache`] holds: 100,000 (denials and their keys' records;
/// 50,000 keys denied at one cost each).
pub const DEFAULT_MAX_DENIALS: usize = 100_000;

const MAX_SHARDS: usize = 16;

/// A [`Store`] wrapper that answers a repeated denial locally until its retry-after has passed.
///
/// A client far over its limit keeps sending the same request. Once the store has denied a
/// (key, limit, cost) with a retry-after, every later check of the same (key, limit, cost) before
/// that deadline is denied again: this wrapper answers those checks itself, so an abusive client
/// costs the store one call per retry-after instead of one per request.
///
/// ```
/// use ratelimit_core::{Algorithm, DenialCache, Limit, ManualClock, MemoryStore, Quota, Store};
/// use std::future::Future;
/// use std::pin::pin;
/// use std::task::{Context, Poll, Waker};
/// use std::time::Duration;
///
/// # fn now<F: Future>(f: F) -> F::Output {
/// #     match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
/// #         Poll::Ready(v) => v,
/// #         Poll::Pending => unreachable!(),
/// #     }
/// # }
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
/// let cached = DenialCache::new(store, clock.clone()).max_entries(10_000)?;
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10)?)?;
///
/// let admitted = (0..1_000)
///     .filter(|_| now(cached.check(b"abuser", &limit, 1)).unwrap().is_allowed())
///     .count();
/// assert_eq!(admitted, 10);
/// // Every denial was answered from the cache: the admission that took the last token already
/// // said when the next one comes.
/// assert_eq!(cached.stats().hits, 990);
///
/// // A token comes back after 100 ms: the cache lets the next check through to the store.
/// clock.advance(Duration::from_millis(100));
/// assert!(now(cached.check(b"abuser", &limit, 1)).unwrap().is_allowed());
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
///
/// # Why it changes no decision
///
/// For every algorithm of this crate (token bucket, GCRA, fixed window, sliding-window counter,
/// sliding log), and for limits combining several quotas:
///
/// 1. **Waiting only helps.** If nothing is consumed, a key's state only moves toward allowing as
///    time passes (a bucket refills, a window ends or slides). The `retry_after` of a denial is the
///    exact first instant at which the same cost passes if nothing else is consumed; before it, the
///    store denies that cost.
/// 2. **Consumption only hurts.** Other requests for the key (on this gateway, with another cost,
///    or on other gateways sharing the store) can only take units, never give them back, so they
///    can only push that instant later.
/// 3. **A denial consumes nothing**, so not sending it to the store leaves the store's state, and
///    every later decision, exactly as they would have been.
///
/// So a cached denial is returned only for a check that the store, asked at the same moment,
/// would also have denied. The deadline is measured from the time read *before* the store was
/// asked, so a slow round trip makes the cached deadline earlier (one more store call), never
/// later. A cost that can never pass ([`Outcome::Exceeds`]) is cached for the limit's longest
/// period.
///
/// **An admission ends the key's cached denials.** Each (key, limit) with cached denials has a
/// record of its *generation*. A denial is recorded under the current one and answers only while
/// it is still current; an admission of any cost of the key that passes through the cache starts
/// a new generation, so each of that key's denials (of that limit) cached before it goes back to
/// the store at its next check. Between admissions, a client alternating costs keeps hitting the
/// cache: each cost has its own entry. A denial is not recorded when the key's generation changed
/// while it was in flight (an admission of the key, or its first recorded denial, came back
/// through the cache meanwhile): it may predate that admission, and costs one more store call.
/// One case is not seen: a denial sent while the key had no record and answered while it has none
/// (an admission of a key without a record changes nothing; a record can also have expired or
/// been evicted meanwhile) is recorded even if an admission of the key came back in between. Its
/// deadline may then be early, as with other gateways' consumption (below), never late.
///
/// **Denials implied by an admission.** Under a single-quota limit, an admission that leaves
/// fewer units than its cost says when that cost passes again, for three algorithms: the fixed
/// window denies it until the window ends (`reset_after`); the token bucket and GCRA until
/// `reset_after − (burst − cost) × period / limit`, when that is a whole number of microseconds
/// (always for 10 or 100 per second, or 100 per minute; for 7 per second only when `burst − cost`
/// is a multiple of 7).
/// The cache records that denial too, under the generation the admission started, so a client
/// hammering an exhausted key costs the store one call per admission and nothing for its denials.
///
/// What a cached decision reports: on one gateway, the outcome and `retry_after` (deadline − now)
/// are what the store would say, whatever costs the client mixes (no admission of the key came back
/// through the cache since the denial was recorded, and denials consume nothing); `reset_after` is
/// recomputed from the stored deadline the same way; `remaining` is the value the store reported
/// with its denial, below the cost (refill may have raised it since). With a cost of 1 per key on
/// one gateway, a cached decision is identical to the store's, field by field (a denied cost of 1
/// has 0 remaining, until it passes); with larger or mixed costs, every field but `remaining` is,
/// under a single quota (a cost of 5 denied with 0 left reports 0 while the bucket refills to 3).
/// When requests the cache does not see consume meanwhile (other gateways sharing the store, or the
/// case above), the cached `retry_after` may be earlier than the store's, never later: the store is
/// asked again at that earlier instant. A check that went to the store and whose answer never came
/// back through the cache (dropped by a caller's timeout, or failed) may have been admitted: it
/// ends the key's cached denials, as an admission does. A cached [`Outcome::Exceeds`] keeps the
/// fields the store reported with it (but its [`more_after`](Decision::more_after), which it
/// does not keep), `reset_after` counting down to 0, until an admission of the
/// key ends it or the limit's longest period has passed; the store's own report may move on
/// meanwhile as windows end (of several quotas, it may name another). Of a limit of several quotas,
/// a cached denial names the binding quota alone in [`violated_quotas`](Decision::violated_quotas):
/// it still denies until the deadline, while the other quotas the store named may have refilled
/// since; and when two quotas would have the client wait as long, the store names the one with
/// fewer units left (then the later reset), which refill may change while the denial is cached: the
/// cached answer's `limit`, `reset_after` and quota index are then the other quota's (its outcome
/// and `retry_after` are still the store's).
///
/// Caveat: the deadline is counted on this wrapper's clock. If the store reads another clock (a
/// Redis store on server time), the two must advance at the same rate; a clock running fast on the
/// store's side by a fraction `f` makes a cached denial last up to `f × retry_after` too long.
///
/// Caveat: a store counting ahead of this clock. A cached denial ends at this clock's reading
/// when its check was sent plus the store's `retry_after`. A store that never counts at a time
/// before one it counted at (`MemoryStore`, per shard; the Redis scripts, per key) may be counting
/// ahead of this clock: after this clock was set back (a `ManualClock` moved back, or a `Clock` of
/// your own; [`SystemClock`](crate::SystemClock) and [`WallClock`](crate::WallClock) never go
/// back); over a Redis store on client time, when another gateway's clock is ahead of this one's;
/// on server time, after the server's clock stepped forward (or this clock stood still, as a
/// `WallClock` does after the system clock steps back). The store then admits the
/// key before the cached denial ends, and the cache denies it until its deadline: later than the
/// store's by up to the step, or the skew between the gateways' clocks, or their sum when both
/// happen (with client clocks 20 ms apart, a denial cached by the gateway behind can outlast the
/// store's by 20 ms), and its
/// `retry_after` is longer by as much. Keep client clocks in step (NTP), or use the server's clock.
/// And a store in front of which a cache answers some checks sees fewer of them, so after a step
/// back its latest time may be earlier than without the cache: until the clock has passed the
/// latest time it read before the step, it may deny a cost that it would have admitted without
/// the cache (found by proptest; `tests/wrapper_properties.rs` checks the rest with a clock that
/// only moves on).
///
/// Caveat: "consumption only hurts" assumes the store keeps the key's state. When the store loses
/// it (an evicted key of a full `MemoryStore`, a Redis failover to a replica that had not received
/// it, an operator deleting the key to let a client back in), the store would admit the client at
/// once, but a cached denial still stands until its deadline, at most `retry_after` from the denial
/// (the limit's longest period for a cost that can never pass). To let a client back in at once,
/// [`reset`](Reset::reset) it through the cache (over a store that implements [`Reset`]), which
/// ends its cached denials here; for a reset made through another gateway's cache,
/// [`forget`](DenialCache::forget) the key here when this gateway hears of it (the Redis store
/// announces its resets when asked to); after deleting its state some other way,
/// [`clear`](DenialCache::clear) the cache as well.
///
/// Caveat: it also assumes the wrapped store never gives units back. Over
/// [`Leasing`](crate::Leasing) the cache is exact against the shared store, but a unit returned to
/// a lease (by a check that waited for the lease and was cancelled) is not seen by a denial cached
/// meanwhile: that unit stays unspent, as part of leasing's under-admission bound, until the
/// lease expires (see `docs/round-trips.md`). An admission the lease answered (its last unit,
/// say) reports the store's reset counted from when the lease came back, up to that round trip
/// later than the store measured it, and says by how much: the denial it implies is that much
/// shorter, so that it ends no later than the store's.
///
/// # Memory
///
/// At most [`max_entries`](DenialCache::max_entries) entries are held (default
/// [`DEFAULT_MAX_DENIALS`]): one per denial, and one per (key, limit) with denials, its record
/// (generation and latest deadline), so a key denied at a single cost takes two. Each is a 16-byte
/// digest and a 48-byte entry: a 64-byte table slot. When a shard fills, the entries that can
/// answer nothing are dropped first (expired denials, denials an admission ended, records without a
/// denial); if that leaves less than an eighth of it free, the entries expiring soonest until an
/// eighth is (a record expires with its last denial, so it goes with or after them), so that a full
/// shard is gone over once per eighth of its size of new entries (two for a new key's denial), not
/// once per denial when they end about as fast as they come. A denial not held only means one more
/// store call: no decision changes.
pub struct DenialCache<S, C> {
    inner: S,
    clock: C,
    table: Arc<Table>,
}

/// Counters of a [`DenialCache`], since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DenialCacheStats {
    /// Checks answered from the cache: store calls saved.
    pub hits: u64,
    /// Checks passed to the store.
    pub store_calls: u64,
    /// Denials recorded.
    pub inserted: u64,
    /// Denials that could still have answered, dropped because the cache was full (each costs at
    /// most one more store call).
    pub evicted: u64,
}

impl<S: fmt::Debug, C> fmt::Debug for DenialCache<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenialCache")
            .field("inner", &self.inner)
            .field("capacity", &self.capacity())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Clock> DenialCache<S, C> {
    /// Caches the denials of `inner`, timed by `clock` (use the clock the store uses, or the
    /// system clock for a store on server time), holding at most [`DEFAULT_MAX_DENIALS`].
    pub fn new(inner: S, clock: C) -> Self {
        DenialCache {
            inner,
            clock,
            table: Arc::new(Table::new(DEFAULT_MAX_DENIALS)),
        }
    }

    /// Holds at most `n` entries: denials and their keys' records (see
    /// [Memory](DenialCache#memory)). Set before the first check; clears the cache.
    ///
    /// A denial takes two entries (itself and its key's record), so `n` must be at least 2:
    /// anything less is refused with [`ConfigError::InvalidSetting`] rather than quietly
    /// raised (a cache of 0 cannot be a way to turn it off: leave the wrapper out instead).
    pub fn max_entries(mut self, n: usize) -> Result<Self, ConfigError> {
        if n < 2 {
            return Err(ConfigError::InvalidSetting {
                name: "max_entries",
                reason: "must be at least 2 (a cached denial takes two entries)",
            });
        }
        self.table = Arc::new(Table::new(n));
        Ok(self)
    }
}

/// A clone shares the cache (its denials and counters) and clones the wrapped store and clock:
/// one cache for several layers, as one `Arc<DenialCache<..>>` would be.
impl<S: Clone, C: Clone> Clone for DenialCache<S, C> {
    fn clone(&self) -> Self {
        DenialCache {
            inner: self.inner.clone(),
            clock: self.clock.clone(),
            table: Arc::clone(&self.table),
        }
    }
}

impl<S, C> DenialCache<S, C> {
    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped store, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Counters since the cache was made.
    pub fn stats(&self) -> DenialCacheStats {
        let t = &self.table;
        DenialCacheStats {
            hits: t.shards.iter().map(|s| s.0.lock().hits).sum(),
            store_calls: t.peeks.load(Ordering::Relaxed)
                + t.shards.iter().map(|s| s.0.lock().misses).sum::<u64>(),
            inserted: t.inserted.load(Ordering::Relaxed),
            evicted: t.evicted.load(Ordering::Relaxed),
        }
    }

    /// How many entries are held now: denials and their keys' records (expired ones, and denials
    /// an admission ended, included until they are swept).
    pub fn len(&self) -> usize {
        self.table.shards.iter().map(|s| s.0.lock().map.len()).sum()
    }

    /// `true` if nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every denial (and key record) held: the next check of every key goes to the store. For after a
    /// key's state was deleted from the store (to let a client back in at once), since a held
    /// denial outlives the state it was read from. A check already waiting for the store
    /// records no denial when its answer comes (it may have been read before the deletion: one
    /// more store call for its key), as after a [`forget`](DenialCache::forget). The counters
    /// are kept.
    pub fn clear(&self) {
        for shard in self.table.shards.iter() {
            let mut shard = shard.0.lock();
            shard.map.clear();
            // As a reset of every key: no check sent before now records its denial.
            shard.resets += 1;
        }
    }

    /// Ends `key`'s cached denials under the limit whose [`fingerprint`](Limit::fingerprint) is
    /// `limit_fingerprint`, as this cache's own [`reset`](Reset::reset) of it does once the store
    /// has reset: for a reset made through another gateway, which this one learns of from the
    /// store (the Redis store's `watch_resets`). A denial of a check sent before this call is not
    /// cached when it comes. Other keys and limits, and the counters, are untouched.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, DenialCache, Limit, ManualClock, MemoryStore, Quota, Store};
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::sync::Arc;
    /// use std::task::{Context, Poll, Waker};
    ///
    /// # fn now<F: Future>(f: F) -> F::Output {
    /// #     match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
    /// #         Poll::Ready(v) => v,
    /// #         Poll::Pending => unreachable!(),
    /// #     }
    /// # }
    /// let clock = ManualClock::new();
    /// let shared = Arc::new(MemoryStore::builder().with_clock(clock.clone()).build()?);
    /// let cache = DenialCache::new(Arc::clone(&shared), clock);
    /// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1)?)?;
    /// assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    /// assert!(!now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    /// // Another gateway resets alice in the shared store; the cache still denies her...
    /// shared.reset_now(b"alice", &limit);
    /// assert!(!now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    /// // ...until this gateway hears of the reset.
    /// cache.forget(b"alice", limit.fingerprint());
    /// assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    /// # Ok::<(), ratelimit_core::ConfigError>(())
    /// ```
    pub fn forget(&self, key: &[u8], limit_fingerprint: u64) {
        self.table.forget(self.table.kid(key, limit_fingerprint));
    }

    /// The most entries (denials and their keys' records) held at once.
    pub fn capacity(&self) -> usize {
        self.table.per_shard_cap * self.table.shards.len()
    }
}

impl<S: Store, C: Clock + 'static> Store for DenialCache<S, C> {
    type Error = S::Error;
    type Future = DenialCacheFuture<S::Future>;

    fn failure_domains(&self) -> usize {
        self.inner.failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.inner.failure_domain(key)
    }

    fn response_timeout(&self) -> Option<std::time::Duration> {
        self.inner.response_timeout()
    }

    /// The key's cached denial for `cost`, if it has one; else the wrapped store's cached answer
    /// (a leased unit), taken in as [`check`](Store::check) takes the store's answers in (an
    /// admission ends the key's cached denials, and the denial it implies is cached). Counted in
    /// neither [`stats`](DenialCache::stats)' hits nor its store calls: no store call was to
    /// be made.
    fn check_cached(&self, key: &[u8], limit: &Limit, cost: u64) -> Option<Decision> {
        if cost == 0 {
            return self.inner.check_cached(key, limit, cost);
        }
        let now = now_on(&self.clock);
        let kid = self.table.kid(key, limit.fingerprint());
        let id = entry_id(kid, cost);
        let seen = match self.table.lookup(kid, id, now, false) {
            Ok(d) => return Some(d),
            Err(seen) => seen,
        };
        let d = self.inner.check_cached(key, limit, cost)?;
        let mut r = Record::new(&self.table, (kid, id, seen), now, limit, cost);
        self.table.record(&r, &d);
        r.answered = true;
        Some(d)
    }

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        if cost == 0 {
            // A peek is never denied: nothing to cache.
            self.table.peeks.fetch_add(1, Ordering::Relaxed);
            return DenialCacheFuture {
                state: State::Miss {
                    fut: self.inner.check(key, limit, cost),
                    record: None,
                },
            };
        }
        let now = now_on(&self.clock);
        let kid = self.table.kid(key, limit.fingerprint());
        let id = entry_id(kid, cost);
        let seen = match self.table.lookup(kid, id, now, true) {
            Ok(d) => {
                return DenialCacheFuture {
                    state: State::Hit { decision: Some(d) },
                };
            }
            Err(seen) => seen,
        };
        DenialCacheFuture {
            state: State::Miss {
                fut: self.inner.check(key, limit, cost),
                record: Some(Record::new(&self.table, (kid, id, seen), now, limit, cost)),
            },
        }
    }
}

/// [`forget`](DenialCache::forget), and [`clear`](DenialCache::clear) for resets unheard.
impl<S, C> Forget for DenialCache<S, C> {
    fn forget(&self, key: &[u8], limit_fingerprint: u64) {
        DenialCache::forget(self, key, limit_fingerprint);
    }

    fn forget_unheard(&self) {
        self.clear();
    }
}

impl<S: Reset, C: Clock + 'static> Reset for DenialCache<S, C> {
    type ResetFuture = WrapperResetFuture<S::ResetFuture>;

    /// Resets the key in the wrapped store; when that completes (or its future is dropped, as
    /// the store may have reset all the same), the key's cached denials under `limit` end, and
    /// a denial of a check sent before then is not cached when it comes.
    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        let table = Arc::clone(&self.table);
        let kid = table.kid(key, limit.fingerprint());
        WrapperResetFuture::new(self.inner.reset(key, limit), move || table.forget(kid))
    }
}

pin_project! {
    /// The future of a [`DenialCache`] check: a cached denial, ready at once, or the wrapped
    /// store's check, whose denial is recorded when it completes.
    pub struct DenialCacheFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Hit { decision: Option<Decision> },
        Miss { #[pin] fut: F, record: Option<Record> },
    }
}

struct Record {
    table: Arc<Table>,
    /// The (key, limit)'s digest, which picks the shard and names its key record.
    kid: u128,
    /// The (key, limit, cost)'s entry.
    id: u128,
    /// The key record's generation, and the shard's resets, when the check was sent.
    seen: Seen,
    sent: u64,
    exceeds_for: Duration,
    cost: u64,
    /// The limit, for the algorithms whose admissions can imply a denial (see
    /// [`implied_wait`]).
    implied: Option<(Algorithm, Quota)>,
    /// The store's answer was taken in ([`Table::record`]).
    answered: bool,
}

impl Record {
    /// The record of a check of `cost` against `limit` sent at `sent`: `(kid, id, seen)` as
    /// [`Table::lookup`] found them.
    fn new(
        table: &Arc<Table>,
        (kid, id, seen): (u128, u128, Seen),
        sent: u64,
        limit: &Limit,
        cost: u64,
    ) -> Self {
        Record {
            table: Arc::clone(table),
            kid,
            id,
            seen,
            sent,
            exceeds_for: limit.longest_period(),
            cost,
            implied: implied_by(limit),
            answered: false,
        }
    }
}

/// A check that went to the store and never brought its answer back here (its future dropped
/// first, as a caller's timeout drops it, or the store failed) may have been admitted all the
/// same: a store may decide when its `check` is called (the in-memory store does), and a Redis
/// timeout may come after the script ran. So it ends the key's cached denials, as an admission
/// would (one more store call for each, never a stale deadline).
impl Drop for Record {
    fn drop(&mut self) {
        if !self.answered {
            self.table.unanswered(self.kid);
        }
    }
}

impl<F> fmt::Debug for DenialCacheFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Hit { .. } => "cached denial",
            State::Miss { .. } => "store call",
        };
        f.debug_struct("DenialCacheFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, E> Future for DenialCacheFuture<F>
where
    F: Future<Output = Result<Decision, E>>,
{
    type Output = Result<Decision, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Hit { decision } => Poll::Ready(Ok(decision
                .take()
                .expect("DenialCacheFuture polled after completion"))),
            StateProj::Miss { fut, record } => {
                let out = std::task::ready!(fut.poll(cx));
                if let (Ok(d), Some(mut r)) = (&out, record.take()) {
                    r.table.record(&r, d);
                    r.answered = true;
                }
                // An error drops the record unanswered (see `Record`'s drop).
                Poll::Ready(out)
            }
        }
    }
}

/// What an [`Entry`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A denial with a retry-after.
    Denied,
    /// A cost that can never pass.
    Exceeds,
    /// The record of a (key, limit): its current generation, and how long its denials last.
    Key,
}

/// One cached denial, or the record of a (key, limit) that has some, in microseconds of the
/// cache's clock.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Of a denial: the first instant at which the same cost may pass (exclusive end of the
    /// denial). Of a key record: the latest `until` of the denials recorded under it.
    until: u64,
    /// When the binding quota is full again, as the store reported it.
    reset_at: u64,
    limit: u64,
    remaining: u64,
    /// Of a denial: its key's generation when it was recorded; it answers only while that is
    /// still the key's. Of a key record: the current generation. A shard never gives out the same
    /// generation twice.
    generation: u64,
    quota_index: u32,
    kind: Kind,
}

impl Entry {
    fn key_record(until: u64, generation: u64) -> Self {
        Entry {
            until,
            reset_at: 0,
            limit: 0,
            remaining: 0,
            generation,
            quota_index: 0,
            kind: Kind::Key,
        }
    }

    fn decision(&self, now: u64) -> Decision {
        let outcome = if self.kind == Kind::Exceeds {
            Outcome::Exceeds
        } else {
            Outcome::Denied {
                retry_after: Duration::from_micros(self.until - now),
            }
        };
        Decision::new(
            outcome,
            self.limit,
            self.remaining,
            Duration::from_micros(self.reset_at.saturating_sub(now)),
            self.quota_index as usize,
        )
    }
}

type Map = HashMap<u128, Entry, BuildIdHasher>;

/// One shard of the table, on its own cache lines: its denials, and its share of the hit and miss
/// counts, kept under the lock each lookup takes anyway, so that checks on different shards
/// share no counter.
#[repr(align(128))]
struct Shard(Mutex<ShardData>);

#[derive(Default)]
struct ShardData {
    /// Denials, and the records of the (key, limit)s they belong to.
    map: Map,
    hits: u64,
    misses: u64,
    /// The last generation given out in this shard.
    generations: u64,
    /// Resets of keys of this shard (see `Table::forget`).
    resets: u64,
}

/// What a check sees when it is sent, for its answer to be taken in against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// The key record's generation (`None`: no record).
    generation: Option<u64>,
    /// The shard's resets.
    resets: u64,
}

impl ShardData {
    /// The current generation of the (key, limit) `kid`, if it has a record.
    fn generation_of(&self, kid: u128) -> Option<u64> {
        self.map
            .get(&kid)
            .filter(|e| e.kind == Kind::Key)
            .map(|e| e.generation)
    }

    fn new_generation(&mut self) -> u64 {
        self.generations += 1;
        self.generations
    }

    /// Starts a new generation of `kid` if it has a record: its cached denials answer no more.
    fn renew(&mut self, kid: u128) {
        if let Some(k) = self.map.get_mut(&kid).filter(|e| e.kind == Kind::Key) {
            self.generations += 1;
            k.generation = self.generations;
        }
    }

    /// Makes room for the entry `id` and the key record `kid`, which are kept, within `cap`
    /// entries: if full, first drops the entries that can answer nothing any more (expired
    /// denials, denials of a past generation, key records without a denial); then, if that left
    /// less than an eighth of the shard free, the entries that expire soonest until an eighth is,
    /// so that a full shard is gone over at most once per eighth of its size of new entries.
    /// Returns how many denials that could still have answered were dropped.
    fn make_room(&mut self, kid: u128, id: u128, now: u64, cap: usize) -> u64 {
        let map = &mut self.map;
        let needed =
            |m: &Map| usize::from(!m.contains_key(&kid)) + usize::from(!m.contains_key(&id));
        if map.len() + needed(map) <= cap {
            return 0;
        }
        let current = |m: &Map| {
            let mut g: Vec<u64> = m
                .values()
                .filter(|e| e.kind == Kind::Key)
                .map(|e| e.generation)
                .collect();
            g.sort_unstable();
            g
        };
        let live = current(map);
        map.retain(|_, e| {
            e.kind == Kind::Key || (e.until > now && live.binary_search(&e.generation).is_ok())
        });
        let mut referred: Vec<u64> = map
            .values()
            .filter(|e| e.kind != Kind::Key)
            .map(|e| e.generation)
            .collect();
        referred.sort_unstable();
        map.retain(|k, e| {
            e.kind != Kind::Key || *k == kid || referred.binary_search(&e.generation).is_ok()
        });
        // Leave an eighth of the shard free, and at least the two entries of a new key's denial:
        // a sweep that freed only a few dead entries would otherwise be followed by another after
        // as many new ones, each going over the whole shard (with denials expiring about as fast
        // as new ones come, every new denial did).
        let n = needed(map);
        let keep = cap.saturating_sub((cap / 8).max(2)).max(2);
        if map.len() + n <= keep {
            return 0;
        }
        // `keep` is at least 2: the entries other than `kid` and `id`, `len + n - 2` of them, are
        // at least `drop`.
        let drop = map.len() + n - keep;
        // Ranked by deadline, ties broken by digest, so exactly `drop` go. A key record expires
        // with its last denial, so it goes after its denials (or with the last, on a tie).
        let mut ranks: Vec<(u64, u128)> = map
            .iter()
            .filter(|(k, _)| **k != kid && **k != id)
            .map(|(k, e)| (e.until, *k))
            .collect();
        let (_, &mut threshold, _) = ranks.select_nth_unstable(drop - 1);
        let mut evicted = 0;
        map.retain(|k, e| {
            let keep = *k == kid || *k == id || (e.until, *k) > threshold;
            evicted += u64::from(!keep && e.kind != Kind::Key);
            keep
        });
        // Denials whose key record went (on a tie) can answer nothing: they go too.
        let live = current(map);
        map.retain(|_, e| {
            let keep = e.kind == Kind::Key || live.binary_search(&e.generation).is_ok();
            evicted += u64::from(!keep);
            keep
        });
        evicted
    }
}

struct Table {
    shards: Box<[Shard]>,
    per_shard_cap: usize,
    digest: KeyDigest,
    /// Peeks (cost 0), which go to the store without a lookup.
    peeks: AtomicU64,
    inserted: AtomicU64,
    evicted: AtomicU64,
}

impl Table {
    /// `max` is at least 2 (`max_entries` refuses less): with at most `max / 2` shards, each
    /// holds at least the two entries of a denial and its key's record.
    fn new(max: usize) -> Self {
        let shards = MAX_SHARDS.min(prev_power_of_two(max / 2));
        Table {
            shards: (0..shards)
                .map(|_| Shard(Mutex::new(ShardData::default())))
                .collect(),
            per_shard_cap: max / shards,
            digest: KeyDigest::random(),
            peeks: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// The digest of a (key, limit): a 128-bit SipHash of the key under a per-process random
    /// secret tweaked by the limit's fingerprint: fixed size whatever the key's length, and
    /// HashDoS-resistant.
    fn kid(&self, key: &[u8], fingerprint: u64) -> u128 {
        self.digest.digest_u128(key, fingerprint, KEY_TWEAK)
    }

    fn shard(&self, kid: u128) -> &Mutex<ShardData> {
        // The high bits of the (key, limit)'s digest pick the shard, so a key's record and its
        // denials share one; the map hashes with the low bits of each entry's id.
        &self.shards[((kid >> 64) as usize) & (self.shards.len() - 1)].0
    }

    /// The cached denial of the entry `id` of the (key, limit) `kid` at `now`, counted as a hit if
    /// `counted`; else a miss (so counted), and what the check sent now sees (the key's
    /// generation, the shard's resets).
    fn lookup(&self, kid: u128, id: u128, now: u64, counted: bool) -> Result<Decision, Seen> {
        let mut guard = self.shard(kid).lock();
        let shard = &mut *guard;
        let current = shard.generation_of(kid);
        let resets = shard.resets;
        let found = match shard.map.get(&id) {
            Some(e) if e.kind != Kind::Key => {
                if e.until > now && Some(e.generation) == current {
                    // Answered here, without asking the store: marked so.
                    Some(e.decision(now).cached())
                } else {
                    // Expired, or recorded before an admission of the key: it can never answer
                    // again (a generation is never given out twice).
                    shard.map.remove(&id);
                    None
                }
            }
            _ => None,
        };
        match found {
            Some(d) => {
                shard.hits += u64::from(counted);
                Ok(d)
            }
            None => {
                shard.misses += u64::from(counted);
                Err(Seen {
                    generation: current,
                    resets,
                })
            }
        }
    }

    /// Takes in the store's answer to a check sent at `r.sent`: an admission starts a new
    /// generation of the key (its cached denials no longer answer); a denial, or one the
    /// admission implies, is recorded, unless the key's generation changed since the check was
    /// sent (an admission, or the first denial of the key, came in meanwhile).
    /// A check of the key `kid` that may have been admitted without its answer coming back: the
    /// key's cached denials end, as at an admission.
    fn unanswered(&self, kid: u128) {
        self.shard(kid).lock().renew(kid);
    }

    /// The (key, limit) `kid` was reset: a new generation, so that its cached denials answer no
    /// more; and one more reset of its shard, so that no check of the shard sent before now
    /// records a denial it read before the reset (whatever becomes of the key's record
    /// meanwhile: a key without one has nothing to renew). The other keys of the shard pay one
    /// more store call each for a check in flight across a reset, which is rare.
    fn forget(&self, kid: u128) {
        let mut guard = self.shard(kid).lock();
        let shard = &mut *guard;
        shard.resets += 1;
        shard.renew(kid);
    }

    fn record(&self, r: &Record, d: &Decision) {
        let sent = r.sent;
        let allowed = d.is_allowed();
        let until = match d.outcome() {
            // An admission whose reset may be counted later than the store's (a unit of
            // `Leasing`'s lease: see `Decision::with_reset_lag`) implies a denial that much
            // shorter, so that it ends no later than the store's; none if the lag is longer
            // than the decision can say.
            Outcome::Allowed => r
                .implied
                .and_then(|(a, q)| implied_wait(a, &q, r.cost, d))
                .and_then(|wait| wait.checked_sub(d.reset_lag_micros()?))
                .filter(|&wait| wait > 0)
                .map(|wait| sent.saturating_add(wait)),
            Outcome::Denied { retry_after } => Some(sent.saturating_add(micros(retry_after))),
            Outcome::Exceeds => Some(sent.saturating_add(micros(r.exceeds_for).max(1))),
        };
        let entry = until.map(|until| Entry {
            until,
            reset_at: sent.saturating_add(micros(d.reset_after())),
            limit: d.limit(),
            remaining: d.remaining(),
            generation: 0,
            quota_index: u32::try_from(d.quota_index()).unwrap_or(u32::MAX),
            kind: if d.can_ever_pass() {
                Kind::Denied
            } else {
                Kind::Exceeds
            },
        });
        let (kid, id) = (r.kid, r.id);
        let mut guard = self.shard(kid).lock();
        let shard = &mut *guard;
        let current = shard.generation_of(kid);
        if allowed && current.is_some() {
            shard.renew(kid);
        }
        let Some(mut entry) = entry else { return };
        if current != r.seen.generation || shard.resets != r.seen.resets {
            // The key's generation moved while the check was in flight: the answer may predate
            // an admission. Or a key of the shard was reset meanwhile: it may predate the reset.
            // Not recorded (one more store call).
            return;
        }
        let evicted = shard.make_room(kid, id, sent, self.per_shard_cap);
        if evicted > 0 {
            self.evicted.fetch_add(evicted, Ordering::Relaxed);
        }
        entry.generation = match shard.map.get_mut(&kid) {
            Some(k) => {
                k.until = k.until.max(entry.until);
                k.generation
            }
            None => {
                let generation = shard.new_generation();
                shard
                    .map
                    .insert(kid, Entry::key_record(entry.until, generation));
                generation
            }
        };
        shard.map.insert(id, entry);
        self.inserted.fetch_add(1, Ordering::Relaxed);
    }
}

/// The second tweak of a (key, limit)'s digest (the first is the limit's fingerprint).
const KEY_TWEAK: u64 = 0x6b65_795f_7265_636f;

/// An odd constant (the 128-bit golden ratio, made odd), which mixes a cost into an entry id.
const COST_MIX: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835;

/// The id of the entry of `cost` (at least 1) of the (key, limit) `kid`. Multiplying by an odd
/// constant is a bijection of `u128`, so the costs of one key have distinct ids, none equal to
/// `kid` itself (the key record's id; the product of a cost ≥ 1 is not 0). Two different keys'
/// entries collide only when their digests differ by one of these public, easily inverted masks:
/// the mix alone gives no protection, the digest's secret does (a client cannot pick keys whose
/// digests differ by a chosen value; by chance, one pair in 2^128).
fn entry_id(kid: u128, cost: u64) -> u128 {
    kid ^ u128::from(cost).wrapping_mul(COST_MIX)
}

/// The algorithm and quota of a limit whose admissions can imply denials: single-quota token
/// bucket, GCRA and fixed window. With several quotas another one could deny for longer: the
/// implied denial would be right but not the store's own answer.
fn implied_by(limit: &Limit) -> Option<(Algorithm, Quota)> {
    match (limit.algorithm(), limit.quotas()) {
        (a @ (Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::FixedWindow), [q]) => {
            Some((a, *q))
        }
        _ => None,
    }
}

/// After `cost` was allowed with fewer than `cost` units left, under a single-quota limit, the same
/// cost is denied until a moment the decision determines exactly, for two families (µs from the
/// check; `None` otherwise):
///
/// - fixed window: the window's end, which is its `reset_after` (its count is > 0);
/// - token bucket and GCRA: the quota `q` needs
///   `cost × scale` units of level and is full after `reset_after`; the difference is
///   `(burst − cost) × scale / refill_per_micro` µs, exactly when that division is exact (it is
///   whenever a token is a whole number of µs, `period / limit`); otherwise nothing is implied.
///
/// Waiting only helps and others only consume (as for denials), so the store denies that cost
/// until then; the retry-after it would give is the cached one.
fn implied_wait(algorithm: Algorithm, q: &Quota, cost: u64, d: &Decision) -> Option<u64> {
    if cost == 0 || d.remaining() >= cost {
        return None;
    }
    let reset = micros(d.reset_after());
    let wait = match algorithm {
        Algorithm::FixedWindow => reset,
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let units = q.burst().checked_sub(cost)? * q.scale();
            if !units.is_multiple_of(q.refill_per_micro()) {
                return None;
            }
            reset.checked_sub(units / q.refill_per_micro())?
        }
        _ => return None,
    };
    (wait > 0).then_some(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QuotaSet, Timestamp};

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn an_entry_is_as_large_as_the_docs_say() {
        assert_eq!(std::mem::size_of::<Entry>(), 48);
        assert_eq!(std::mem::size_of::<(u128, Entry)>(), 64);
    }
    use crate::{Algorithm, ManualClock, MemoryStore, Quota};
    use std::pin::pin;
    use std::task::Waker;

    #[test]
    fn any_size_from_two_is_accepted() {
        for n in [2, 3, 1000, usize::MAX / 2 + 1, usize::MAX] {
            let clock = ManualClock::new();
            let cached = DenialCache::new(MemoryStore::new(), clock)
                .max_entries(n)
                .unwrap();
            assert!((2..=n).contains(&cached.capacity()), "{n}");
        }
    }

    #[test]
    fn a_size_below_two_is_a_typed_error() {
        for n in [0, 1] {
            let err = DenialCache::new(MemoryStore::new(), ManualClock::new())
                .max_entries(n)
                .unwrap_err();
            assert_eq!(
                err,
                ConfigError::InvalidSetting {
                    name: "max_entries",
                    reason: "must be at least 2 (a cached denial takes two entries)",
                },
                "{n}"
            );
            assert!(err.to_string().contains("max_entries"), "{err}");
        }
    }

    /// Clones share one cache: a denial one of them cached answers the other's check.
    #[test]
    fn clones_share_the_cache() {
        let clock = ManualClock::new();
        let store = Arc::new(
            MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
        );
        let a = DenialCache::new(Arc::clone(&store), clock.clone());
        let b = a.clone();
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
        assert!(now(a.check(b"k", &limit, 1)).unwrap().is_allowed());
        assert!(!now(a.check(b"k", &limit, 1)).unwrap().is_allowed());
        let calls = a.stats().store_calls;
        let d = now(b.check(b"k", &limit, 1)).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(
            b.stats().store_calls,
            calls,
            "answered from the shared cache"
        );
        assert_eq!(a.stats(), b.stats());
    }

    /// A held denial outlives a state deleted from the store; `clear` lets the client back in.
    #[test]
    fn clear_forgets_every_denial() {
        let clock = ManualClock::new();
        let (_, cached) = stores(&clock);
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
        assert!(now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
        assert!(!now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
        assert!(!cached.is_empty());
        // The store forgets the key (a fresh store stands for a deleted state): the cache still
        // denies, until cleared.
        let cached = DenialCache {
            inner: MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
            clock: cached.clock.clone(),
            table: cached.table.clone(),
        };
        assert!(!now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
        cached.clear();
        assert!(cached.is_empty());
        assert!(now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
    }

    /// Past the end of the algorithms' time (2^52 µs, the year 2112) time stands still for the
    /// store: a cached denial must not run out while the store's does not, nor count its
    /// retry-after down (found by `tests/wrapper_properties.rs`).
    #[test]
    fn past_the_end_of_time_a_cached_denial_stands_as_the_stores() {
        let clock = ManualClock::starting_at(Timestamp::from_micros(MAX_TIME + 100));
        let (plain, cached) = stores(&clock);
        let limit = Limit::single(
            Algorithm::TokenBucket,
            Quota::per_period(1, Duration::from_micros(2)).unwrap(),
        )
        .unwrap();
        for _ in 0..2 {
            assert_eq!(
                now(cached.check(b"k", &limit, 1)).unwrap().is_allowed(),
                plain.check_now(b"k", &limit, 1).is_allowed()
            );
        }
        for _ in 0..4 {
            clock.advance(Duration::from_micros(1));
            let want = plain.check_now(b"k", &limit, 1);
            let got = now(cached.check(b"k", &limit, 1)).unwrap();
            assert_eq!(got.outcome(), want.outcome());
            assert_eq!(got.retry_after(), Some(Duration::from_micros(2)));
            assert!(got.is_cached());
        }
    }

    fn now<F: Future>(f: F) -> F::Output {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("a MemoryStore check is always ready"),
        }
    }

    fn stores(
        clock: &ManualClock,
    ) -> (
        MemoryStore<ManualClock>,
        DenialCache<MemoryStore<ManualClock>, ManualClock>,
    ) {
        let plain = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let cached = DenialCache::new(
            MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
            clock.clone(),
        )
        .max_entries(64)
        .unwrap();
        (plain, cached)
    }

    fn limits() -> Vec<Limit> {
        let mut out = Vec::new();
        for alg in Algorithm::ALL {
            for quotas in [
                vec![Quota::per_second(5).unwrap()],
                vec![Quota::per_second(2).unwrap().with_burst(4).unwrap()],
                vec![
                    Quota::per_second(5).unwrap(),
                    Quota::per_minute(20).unwrap(),
                ],
            ] {
                // The window algorithms take no burst but the limit.
                if alg.uses_burst() || quotas.iter().all(|q| q.burst() == q.limit()) {
                    out.push(Limit::new(alg, quotas).unwrap());
                }
            }
        }
        out
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// With one cost per key, the cache and a plain store fed the same traffic on the same clock
    /// make identical decisions, field by field: a cached denial recomputes retry-after and
    /// reset-after from its deadlines, and a denied cost of 1 always has 0 remaining. Exactly the
    /// cache's hits are marked as cached.
    #[test]
    fn identical_decisions_for_every_algorithm() {
        for limit in limits() {
            let clock = ManualClock::new();
            let (plain, cached) = stores(&clock);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            for step in 0..4_000 {
                let r = rng.next();
                if r.is_multiple_of(4) {
                    clock.advance(Duration::from_micros(r % 150_000));
                }
                let key = [b'k', (r >> 20) as u8 % 3];
                let hits = cached.stats().hits;
                let want = plain.check_now(&key, &limit, 1);
                let got = now(cached.check(&key, &limit, 1)).unwrap();
                // A hit names the binding quota alone: the others the store named may have
                // recovered since.
                if got.is_cached() {
                    assert_eq!(
                        got.violated_quotas(),
                        QuotaSet::EMPTY.with(got.quota_index())
                    );
                    assert_eq!(
                        got.violated_quotas().union(want.violated_quotas()),
                        want.violated_quotas(),
                        "{limit:?} step {step}"
                    );
                    assert_eq!(got.with_quota_index(0), want.with_quota_index(0));
                    assert_eq!(got.quota_index(), want.quota_index());
                } else {
                    assert_eq!(got, want, "{limit:?} step {step}");
                }
                // A hit is marked as answered from the cache; the store's answers are not.
                assert!(!want.is_cached());
                assert_eq!(got.is_cached(), cached.stats().hits > hits, "step {step}");
            }
            let s = cached.stats();
            assert!(s.hits > 500, "{limit:?}: {s:?}");
            assert_eq!(s.hits + s.store_calls, 4_000);
        }
    }

    /// With one larger cost per key, every field but `remaining` is the store's; `remaining` is
    /// the one reported with the denial, never more than the store's now (refill only adds).
    #[test]
    fn one_larger_cost_same_decisions_but_remaining() {
        for limit in limits() {
            let clock = ManualClock::new();
            let (plain, cached) = stores(&clock);
            let mut rng = Rng(0x5851_f42d_4c95_7f2d);
            for step in 0..4_000 {
                let r = rng.next();
                if r.is_multiple_of(4) {
                    clock.advance(Duration::from_micros(r % 150_000));
                }
                let key = [b'k', (r >> 20) as u8 % 3];
                let want = plain.check_now(&key, &limit, 3);
                let got = now(cached.check(&key, &limit, 3)).unwrap();
                let fields =
                    |d: &Decision| (d.outcome(), d.limit(), d.reset_after(), d.quota_index());
                assert_eq!(fields(&got), fields(&want), "{limit:?} step {step}");
                assert!(got.remaining() <= want.remaining(), "{limit:?} step {step}");
            }
            assert!(cached.stats().hits > 500, "{limit:?}: {:?}", cached.stats());
        }
    }

    /// With several costs per key on one gateway, every admission of the key ends its cached
    /// denials: every field but `remaining` is the store's, as with one cost.
    #[test]
    fn mixed_costs_same_outcomes() {
        for limit in limits() {
            let clock = ManualClock::new();
            let (plain, cached) = stores(&clock);
            let mut rng = Rng(0x2545_f491_4f6c_dd1d);
            for step in 0..4_000 {
                let r = rng.next();
                if r.is_multiple_of(4) {
                    clock.advance(Duration::from_micros(r % 150_000));
                }
                let key = [b'k', (r >> 20) as u8 % 3];
                let cost = [1, 1, 1, 2, 3, 0, 99][(r >> 30) as usize % 7];
                let want = plain.check_now(&key, &limit, cost);
                let got = now(cached.check(&key, &limit, cost)).unwrap();
                let what = format!("{limit:?} step {step} cost {cost}");
                let fields =
                    |d: &Decision| (d.outcome(), d.limit(), d.reset_after(), d.quota_index());
                if got.can_ever_pass() {
                    assert_eq!(fields(&got), fields(&want), "{what}: {got:?} {want:?}");
                } else {
                    // A cost that can never pass: cached for the longest period, while the
                    // store's windows and binding quota may move on (see the type's docs).
                    assert_eq!(got.outcome(), want.outcome(), "{what}");
                }
                if got.is_allowed() {
                    assert_eq!(got, want, "{what}");
                } else {
                    assert!(got.remaining() <= want.remaining(), "{what}");
                }
            }
            assert!(cached.stats().hits > 100, "{limit:?}");
        }
    }

    #[test]
    fn other_consumers_only_make_a_cached_denial_truer() {
        // Two gateways share one store; the cache sits on the first. The second keeps taking
        // tokens: every cached denial is still one the shared store makes at that moment.
        let clock = ManualClock::new();
        let shared = Arc::new(
            MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
        );
        let cached = DenialCache::new(Arc::clone(&shared), clock.clone());
        let limit = Limit::single(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
        for i in 0..2_000 {
            clock.advance(Duration::from_millis(7));
            if i % 3 == 0 {
                let _ = shared.check_now(b"k", &limit, 1);
            }
            let got = now(cached.check(b"k", &limit, 1)).unwrap();
            if got.is_denied() {
                // A peek (cost 0) does not consume; ask whether cost 1 would pass: it must not.
                let peek = shared.check_now(b"k", &limit, 0);
                assert_eq!(
                    peek.remaining(),
                    0,
                    "step {i}: cached denial of a passable cost"
                );
            }
        }
        assert!(cached.stats().hits > 0);
    }

    /// An admission that leaves fewer units than its cost implies the next denial of that cost
    /// (token bucket, GCRA, fixed window, one quota): the burst's last admission is the last call.
    #[test]
    fn an_emptying_admission_implies_the_next_denial() {
        for alg in Algorithm::ALL {
            let clock = ManualClock::new();
            let (plain, cached) = stores(&clock);
            let limit = Limit::single(alg, Quota::per_second(5).unwrap()).unwrap();
            for _ in 0..10 {
                let want = plain.check_now(b"k", &limit, 1);
                assert_eq!(now(cached.check(b"k", &limit, 1)).unwrap(), want, "{alg}");
            }
            let implied = matches!(
                alg,
                Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::FixedWindow
            );
            let calls = cached.stats().store_calls;
            assert_eq!(calls, if implied { 5 } else { 6 }, "{alg}");
        }
    }

    #[test]
    fn exceeds_is_cached_and_peeks_are_not() {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let cached = DenialCache::new(store, clock.clone());
        let limit = Limit::single(Algorithm::SlidingLog, Quota::per_second(3).unwrap()).unwrap();
        for _ in 0..10 {
            let d = now(cached.check(b"k", &limit, 4)).unwrap();
            assert_eq!(d.outcome(), Outcome::Exceeds);
            assert_eq!(d.remaining(), 3);
        }
        assert_eq!(cached.stats().store_calls, 1);
        for _ in 0..5 {
            assert!(now(cached.check(b"k", &limit, 0)).unwrap().is_allowed());
        }
        assert_eq!(cached.stats().store_calls, 6);
        // The denial, and its key's record.
        assert_eq!(cached.len(), 2);
    }

    /// A full shard that frees only a few entries by dropping the dead ones frees an eighth of
    /// itself all the same: otherwise, with denials expiring about as fast as new ones come (a
    /// flood of clients at the cache's size), every new denial rebuilt the whole shard, and a
    /// check cost ten times as much (`benches/denial_cache.rs`).
    #[test]
    fn a_sweep_that_frees_a_few_entries_frees_an_eighth() {
        sweep_frees_an_eighth::<64>();
        // A small shard, whose eighth is less than a new denial's two entries, frees two.
        sweep_frees_an_eighth::<12>();
    }

    fn sweep_frees_an_eighth<const CAP: usize>() {
        let mut shard = ShardData::default();
        // CAP / 2 keys, each with one denial: a full shard, the denials ending at 1, 2, ...
        let keys = (CAP / 2) as u128;
        for k in 0..keys {
            let generation = shard.new_generation();
            let until = k as u64 + 1;
            shard
                .map
                .insert(k << 64, Entry::key_record(until, generation));
            let mut denial = Entry::key_record(until, generation);
            denial.kind = Kind::Denied;
            shard.map.insert(entry_id(k << 64, 1), denial);
        }
        assert_eq!(shard.map.len(), CAP);
        let mut sweeps = 0;
        for k in keys..1_000u128 {
            let now = (k - keys + 1) as u64;
            // At each step the oldest key's denial has just expired: one key's two entries are
            // dead, as many as the new key needs.
            let (kid, id) = (k << 64, entry_id(k << 64, 1));
            let before = shard.map.len();
            shard.make_room(kid, id, now, CAP);
            if before + 2 > CAP {
                sweeps += 1;
                assert!(
                    shard.map.len() + 2 + (CAP / 8).max(2) <= CAP,
                    "a sweep at key {k} left {} of {CAP}",
                    shard.map.len()
                );
            }
            let generation = shard.new_generation();
            let until = now + keys as u64;
            shard.map.insert(kid, Entry::key_record(until, generation));
            let mut denial = Entry::key_record(until, generation);
            denial.kind = Kind::Denied;
            shard.map.insert(id, denial);
            assert!(shard.map.len() <= CAP);
        }
        // A sweep frees room for the new key and for (CAP / 8).max(2) / 2 more.
        let most = (1_000 - keys as usize) / (1 + (CAP / 8).max(2) / 2) + 1;
        assert!(
            sweeps <= most,
            "{sweeps} sweeps of a shard of {CAP}, {most} at most"
        );
    }

    #[test]
    fn memory_is_bounded_and_overflow_only_costs_calls() {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let cached = DenialCache::new(store, clock.clone())
            .max_entries(100)
            .unwrap();
        assert_eq!(cached.capacity(), 96);
        let limit = Limit::single(Algorithm::FixedWindow, Quota::per_hour(1).unwrap()).unwrap();
        for round in 0..3 {
            for k in 0..10_000u32 {
                let d = now(cached.check(&k.to_le_bytes(), &limit, 1)).unwrap();
                assert_eq!(d.is_allowed(), round == 0, "key {k} round {round}");
                assert!(cached.len() <= cached.capacity());
            }
        }
        let s = cached.stats();
        // 10,000 keys in turn through 96 slots: nearly every denial was dropped before its key
        // came back, which cost a store call each and changed no decision.
        assert!(s.hits < 1_000, "{s:?}");
        assert!(s.evicted > 19_000, "{s:?}");
        assert_eq!(s.hits + s.store_calls, 30_000);
    }

    fn shared(clock: &ManualClock) -> Arc<MemoryStore<ManualClock>> {
        Arc::new(
            MemoryStore::builder()
                .with_clock(clock.clone())
                .build()
                .unwrap(),
        )
    }

    /// Issue 1: a denial cached for cost 3 must not survive an admission of cost 2 that
    /// passed through the same cache.
    #[test]
    fn an_admission_of_another_cost_invalidates_a_cached_denial() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
        let a = now(cached.check(b"k", &limit, 8)).unwrap();
        assert!(a.is_allowed());
        assert_eq!(a.remaining(), 2);
        let d = now(cached.check(b"k", &limit, 3)).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        assert!(now(cached.check(b"k", &limit, 2)).unwrap().is_allowed());
        let got = now(cached.check(b"k", &limit, 3)).unwrap();
        // A denial consumes nothing: the store's own answer at this moment.
        let want = store.check_now(b"k", &limit, 3);
        assert!(got.is_denied() && want.is_denied());
        assert_eq!(want.retry_after(), Some(Duration::from_millis(300)));
        assert_eq!(got.retry_after(), want.retry_after(), "{got:?} {want:?}");
        assert_eq!(got.reset_after(), want.reset_after());
        // Retrying at the cached retry-after passes (nothing else consumed).
        clock.advance(got.retry_after().unwrap());
        assert!(now(cached.check(b"k", &limit, 3)).unwrap().is_allowed());
    }

    /// A check dropped before its answer came back (a caller's timeout) may have been admitted:
    /// the memory store decides when `check` is called. Its key's cached denials end, as at an
    /// admission, so the next check of the denied cost gets the store's own (later) deadline.
    #[test]
    fn a_check_dropped_before_its_answer_ends_the_keys_cached_denials() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
        assert!(now(cached.check(b"k", &limit, 8)).unwrap().is_allowed());
        let d = now(cached.check(b"k", &limit, 3)).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        // Decided (and admitted) at the call; dropped unpolled.
        drop(cached.check(b"k", &limit, 2));
        let got = now(cached.check(b"k", &limit, 3)).unwrap();
        assert!(!got.is_cached(), "{got:?}");
        assert_eq!(got.retry_after(), Some(Duration::from_millis(300)));
        assert_eq!(got.remaining(), 0);
        // A denial of another key, or of this key while nothing was dropped, is still cached.
        let again = now(cached.check(b"k", &limit, 3)).unwrap();
        assert!(again.is_cached() && again.retry_after() == got.retry_after());
    }

    /// Issue 1, with the denial an admission implies: cost 5 empties a burst of 5, so cost 5 is
    /// implied denied until the bucket is full; an admission of cost 1 pushes that back.
    #[test]
    fn an_admission_of_another_cost_invalidates_an_implied_denial() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(
            Algorithm::TokenBucket,
            Quota::per_second(2).unwrap().with_burst(5).unwrap(),
        )
        .unwrap();
        assert!(now(cached.check(b"k", &limit, 5)).unwrap().is_allowed());
        clock.advance(Duration::from_millis(661));
        assert!(now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
        let got = now(cached.check(b"k", &limit, 5)).unwrap();
        let want = store.check_now(b"k", &limit, 5);
        assert!(got.is_denied() && want.is_denied());
        assert_eq!(got.retry_after(), want.retry_after(), "{got:?} {want:?}");
        clock.advance(got.retry_after().unwrap());
        assert!(now(cached.check(b"k", &limit, 5)).unwrap().is_allowed());
    }

    /// Issue 2: a cached `Exceeds` is not kept across an admission: its `remaining` and `reset`
    /// are the store's after it.
    #[test]
    fn an_admission_refreshes_a_cached_exceeds() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(2).unwrap()).unwrap();
        let e = now(cached.check(b"k", &limit, 3)).unwrap();
        assert_eq!(e.outcome(), Outcome::Exceeds);
        assert_eq!((e.remaining(), e.reset_after()), (2, Duration::ZERO));
        assert!(now(cached.check(b"k", &limit, 2)).unwrap().is_allowed());
        let got = now(cached.check(b"k", &limit, 3)).unwrap();
        let want = store.check_now(b"k", &limit, 3);
        assert_eq!(want.outcome(), Outcome::Exceeds);
        assert_eq!(
            (want.remaining(), want.reset_after()),
            (0, Duration::from_secs(1))
        );
        assert_eq!(got.outcome(), Outcome::Exceeds);
        assert_eq!(
            (got.remaining(), got.reset_after()),
            (want.remaining(), want.reset_after())
        );
        // Cached again from there: the next one is a hit with the same fields.
        let again = now(cached.check(b"k", &limit, 3)).unwrap();
        assert!(again.is_cached());
        assert_eq!(
            (again.remaining(), again.reset_after()),
            (0, Duration::from_secs(1))
        );
    }

    /// A denial answered after an admission of the key that went through the cache while it
    /// was in flight is not recorded: it may predate the admission.
    #[test]
    fn a_denial_in_flight_across_an_admission_is_not_recorded() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
        assert!(now(cached.check(b"k", &limit, 8)).unwrap().is_allowed());
        // The store decides at the call and answers at the poll: this denial is decided before
        // the admission below, and answered after it.
        let late = cached.check(b"k", &limit, 3);
        assert!(now(cached.check(b"k", &limit, 2)).unwrap().is_allowed());
        let d = now(late).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        let got = now(cached.check(b"k", &limit, 3)).unwrap();
        assert!(!got.is_cached(), "{got:?}");
        assert_eq!(got.retry_after(), Some(Duration::from_millis(300)));

        // Without a key record at send time: another denial of the key recorded meanwhile
        // (which makes the record) stops this one too.
        let limit = Limit::single(Algorithm::SlidingLog, Quota::per_second(10).unwrap()).unwrap();
        assert!(now(cached.check(b"s", &limit, 8)).unwrap().is_allowed());
        let late = cached.check(b"s", &limit, 3);
        assert!(now(cached.check(b"s", &limit, 5)).unwrap().is_denied());
        assert!(now(late).unwrap().is_denied());
        assert!(now(cached.check(b"s", &limit, 5)).unwrap().is_cached());
        assert!(!now(cached.check(b"s", &limit, 3)).unwrap().is_cached());
        assert!(now(cached.check(b"s", &limit, 3)).unwrap().is_cached());
    }

    /// A client alternating costs 1 and 5 on an exhausted key keeps hitting the cache: each cost
    /// has its own entry, and no admission comes between them.
    #[test]
    fn alternating_costs_keep_their_hits() {
        let clock = ManualClock::new();
        let store = shared(&clock);
        let cached = DenialCache::new(Arc::clone(&store), clock.clone());
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(10).unwrap()).unwrap();
        for _ in 0..10 {
            assert!(now(cached.check(b"k", &limit, 1)).unwrap().is_allowed());
        }
        let calls = cached.stats().store_calls;
        for i in 0..1_000 {
            let cost = if i % 2 == 0 { 1 } else { 5 };
            let got = now(cached.check(b"k", &limit, cost)).unwrap();
            assert!(got.is_denied());
            assert_eq!(
                got.retry_after(),
                store.check_now(b"k", &limit, cost).retry_after()
            );
        }
        let s = cached.stats();
        // The implied denial of cost 1 was recorded with the last admission; cost 5 asks once.
        assert_eq!(s.store_calls, calls + 1, "{s:?}");
        assert_eq!(s.hits, 999, "{s:?}");
    }

    /// The key records are held, expired and evicted like denials: the table stays within its
    /// bound; a record whose denials an admission ended, or which expired, gives its slot (and its
    /// ended denials theirs) before any denial that could still answer is evicted.
    #[test]
    fn key_records_stay_within_the_bound() {
        let clock = ManualClock::new();
        let cached = DenialCache::new(shared(&clock), clock.clone())
            .max_entries(100)
            .unwrap();
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
        for k in 0..2_000u32 {
            let key = k.to_le_bytes();
            // Cost 8 leaves 2 (its own implied denial, for 36 s, and the key's record), cost 3
            // is denied (for 6 s), then cost 1 passes: all three entries are ended, long before
            // they expire.
            assert!(now(cached.check(&key, &limit, 8)).unwrap().is_allowed());
            assert!(now(cached.check(&key, &limit, 3)).unwrap().is_denied());
            clock.advance(Duration::from_millis(1));
            assert!(now(cached.check(&key, &limit, 1)).unwrap().is_allowed());
            assert!(cached.len() <= cached.capacity());
        }
        let s = cached.stats();
        assert_eq!(s.inserted, 4_000, "{s:?}");
        assert_eq!(s.evicted, 0, "{s:?}");

        // Denials that expire: their records expire with them.
        let limit = Limit::single(Algorithm::FixedWindow, Quota::per_second(1).unwrap()).unwrap();
        for _ in 0..3 {
            for k in 0..2_000u32 {
                for cost in [1, 2, 3] {
                    let _ = now(cached.check(&k.to_le_bytes(), &limit, cost));
                    assert!(cached.len() <= cached.capacity(), "{}", cached.len());
                }
            }
            clock.advance(Duration::from_secs(1));
        }
        // Every shard is full of expired denials and records: a new denial takes their slots,
        // evicting nothing.
        clock.advance(Duration::from_secs(10));
        let evicted = cached.stats().evicted;
        assert!(cached.len() > cached.capacity() / 2, "{}", cached.len());
        for k in 0..2_000u32 {
            let key = k.to_le_bytes();
            assert!(now(cached.check(&key, &limit, 1)).unwrap().is_allowed());
            assert!(now(cached.check(&key, &limit, 1)).unwrap().is_cached());
            assert_eq!(cached.stats().evicted, evicted, "key {k}");
            clock.advance(Duration::from_secs(1));
        }
    }
}
