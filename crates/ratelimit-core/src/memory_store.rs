//! `MemoryStore`: a concurrent, bounded, in-process store for every algorithm.

use parking_lot::{Mutex, MutexGuard};
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::algorithm::{MAX_TIME, State};
use crate::key_digest::KeyDigest;
use crate::{Clock, ConfigError, Decision, Limit, Reset, Store, SystemClock, Timestamp};

mod compact;
mod denial_memo;

use denial_memo::DenialMemo;

/// The default cap on the number of keys held: 1,000,000.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

const DEFAULT_SHARDS: usize = 64;
/// The most shards a store takes: 12 MB of shards and memos before any key, far past the cores
/// that could contend for them.
const MAX_SHARDS: usize = 1 << 16;
/// A shard is not swept before it holds this many keys.
const MIN_SWEEP: usize = 64;

/// A rate-limit store in this process's memory: the default store, and the local fallback when a
/// shared store is down.
///
/// - **Atomic.** A check is one read-modify-write under the lock of the key's shard; concurrent
///   checks of one key never spend the same token.
/// - **Bounded.** At most [`max_keys`](MemoryStoreBuilder::max_keys) keys are held. States that
///   have returned to fresh (a full bucket, an empty window) are dropped as the store grows, which
///   changes no decision. If a shard is full of live states, it drops the states nearest to fresh,
///   an eighth of the shard at a time, and counts them in [`evictions`](MemoryStore::evictions): a
///   key evicted so starts again from fresh. No background thread is needed.
/// - **Compact.** A key is held as a 64-bit SipHash-1-3 digest under a random per-store key
///   (HashDoS-resistant), its state in one more word: 16 bytes per key in the table, whatever the
///   key's length. Two distinct keys share a state only if their digests agree, with probability
///   about n²/2⁶⁵ for n keys held (3 × 10⁻⁸ for a million).
///
/// ```
/// use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(2)?.with_burst(5)?)?;
///
/// let allowed = (0..7).filter(|_| store.check_now(b"alice", &limit, 1).is_allowed()).count();
/// assert_eq!(allowed, 5);
///
/// clock.advance(Duration::from_millis(1_100));
/// let allowed = (0..3).filter(|_| store.check_now(b"alice", &limit, 1).is_allowed()).count();
/// assert_eq!(allowed, 2);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct MemoryStore<C = SystemClock> {
    shards: Box<[Shard]>,
    /// Each shard's denial memo, apart from the shards, which it would make twice as large.
    memos: Box<[DenialMemo]>,
    mask: u64,
    per_shard_cap: usize,
    digest: KeyDigest,
    evictions: AtomicU64,
    /// Set by the first `check_at`: a key may then hold a state ahead of the clock, whose waits do
    /// not shorten as the clock moves, and the denial memo is no longer written.
    explicit_times: AtomicBool,
    clock: C,
}

/// Settings for a [`MemoryStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder<C = SystemClock> {
    max_keys: usize,
    shards: Option<usize>,
    clock: C,
}

impl MemoryStore<SystemClock> {
    /// A store on the system clock holding at most [`DEFAULT_MAX_KEYS`] keys.
    #[must_use]
    pub fn new() -> Self {
        MemoryStore::builder()
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }

    /// Settings, starting from the defaults.
    pub fn builder() -> MemoryStoreBuilder<SystemClock> {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
            clock: SystemClock::new(),
        }
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl<C> MemoryStoreBuilder<C> {
    /// The most keys held at once (default 1,000,000). At least 1. It bounds keys, not bytes:
    /// a key of the bucket and window counters takes 21 to 32 bytes, but a sliding log's also
    /// holds 16 bytes for each admission instant inside its period (up to `limit` of them, and
    /// up to twice that allocated), so a store of sliding logs is sized by `max_keys × limit`
    /// (see [`MemoryStore::memory_bytes`] and `docs/memory-store.md`).
    ///
    /// The cap is split evenly over the store's shards, so the store holds at most `max_keys`
    /// rounded down to a multiple of their number (1,000 over the 32 shards of a store of that
    /// size is 992), never more: [`MemoryStore::max_keys`] tells the cap in force. Keys do not
    /// fall evenly over the shards, so evictions begin when the first shard fills, before the
    /// store holds that many (from about 97% of a 1,000,000 cap, 79% of 10,000 and 53% of 1,000
    /// in `docs/memory-store.md`'s runs): size it above the live keys expected.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How many independently locked shards (a power of two up to 65,536, and at most
    /// `max_keys`; default 64, fewer for small caps).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Uses another clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the store, or says which setting is wrong.
    pub fn build(self) -> Result<MemoryStore<C>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidSetting {
                name: "max_keys",
                reason: "must be at least 1",
            });
        }
        let shards = match self.shards {
            Some(n) if n == 0 || !n.is_power_of_two() => {
                return Err(ConfigError::InvalidSetting {
                    name: "shards",
                    reason: "must be a power of two",
                });
            }
            Some(n) if n > MAX_SHARDS => {
                return Err(ConfigError::InvalidSetting {
                    name: "shards",
                    reason: "must be at most 65,536",
                });
            }
            Some(n) if n > self.max_keys => {
                return Err(ConfigError::InvalidSetting {
                    name: "shards",
                    reason: "must not exceed max_keys",
                });
            }
            Some(n) => n,
            // At least 16 keys per shard, so that eviction works on a meaningful sample.
            None => DEFAULT_SHARDS.min(prev_power_of_two((self.max_keys / 16).max(1))),
        };
        let per_shard_cap = self.max_keys / shards;
        Ok(MemoryStore {
            shards: (0..shards).map(|_| Shard::default()).collect(),
            memos: (0..shards).map(|_| DenialMemo::default()).collect(),
            mask: (shards - 1) as u64,
            per_shard_cap,
            digest: KeyDigest::random(),
            evictions: AtomicU64::new(0),
            explicit_times: AtomicBool::new(false),
            clock: self.clock,
        })
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Checks `cost` for `key` against `limit` now, by this store's clock. See [`Store::check`].
    pub fn check_now(&self, key: &[u8], limit: &Limit, cost: u64) -> Decision {
        let (shard, id) = self.key_id(key, limit.fingerprint());
        // Hash; for a table past `PREFETCH_FROM` buckets, request the key's home bucket; then
        // read the clock and lock, so that the bucket's miss overlaps them instead of following
        // them. The clock is read before the shard's lock; the shard then counts at the latest
        // time it has seen, so that a check that read the clock first but got the lock second
        // does not count at an earlier time than the one before it: per shard, and so per key,
        // time never goes backwards.
        let s = &self.shards[shard];
        // A key denied at cost 1 is answered from its shard's memo while the denial stands,
        // without the lock (see `denial_memo`); any other check only compares the memo's key.
        if cost == 1 && s.memo_key.load(Ordering::Relaxed) == id {
            return self.check_memo(shard, id, limit);
        }
        s.prefetch(id);
        let now = self.clock.now();
        self.check_id(shard, id, limit, cost, now, true)
    }

    /// `check_now` at cost 1 of the key its shard's denial memo names: from the memo if the
    /// denial still stands, else under the lock. Out of line, so that the path of every other
    /// check stays as it was (the memo's code inlined into it cost about 50 ns a check on a
    /// million keys, in the bucket's miss, which it apparently overlapped less).
    ///
    /// The memo answers only a check whose clock reading is not past the shard's latest time, and
    /// counts at that time, as the lock would: a check that would move the latest time on takes
    /// the lock to do so (the memo writes nothing), which is one check per microsecond of the
    /// clock at most, while the checks that contend for a key come many to a microsecond.
    #[inline(never)]
    fn check_memo(&self, shard: usize, id: u64, limit: &Limit) -> Decision {
        let now = self.clock.now();
        let memo = &self.memos[shard];
        // Acquire: the memo's latest time is then at least the one it was written at (its
        // writer publishes the key last, with Release).
        if self.shards[shard].memo_key.load(Ordering::Acquire) != id {
            return self.check_id(shard, id, limit, 1, now, true);
        }
        let latest = memo.latest();
        if now <= latest
            && let Some(d) = memo.denial(id, latest)
        {
            return d;
        }
        self.check_id(shard, id, limit, 1, now, true)
    }

    /// Forgets `key`'s state under `limit`: its next check counts from a full quota, as a new
    /// key's. Returns whether a state was held. The same as [`Reset::reset`], answered at once
    /// (see [`Reset`] for what a reset means).
    pub fn reset_now(&self, key: &[u8], limit: &Limit) -> bool {
        let (shard, id) = self.key_id(key, limit.fingerprint());
        let s = &self.shards[shard];
        let mut table = s.lock();
        // The memo may name the key, with a denial computed from the state going now.
        if s.memo_key.load(Ordering::Relaxed) == id {
            self.memos[shard].clear(&s.memo_key);
        }
        table.remove(id)
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Drops every state that is fresh now, by this store's clock. Never needed for correctness
    /// or for the bound; useful to return memory after a burst of keys: their slots and their
    /// states, those a bucket's word cannot hold too (a sliding log's, several quotas'); the
    /// shard's table of slots for such states is returned once none of its keys left uses one
    /// ([`memory_bytes`](Self::memory_bytes) tells). Unlike
    /// [`sweep`](Self::sweep) with a time read from the clock beforehand, it changes no decision
    /// of a concurrent [`check_now`](Self::check_now): each shard is swept at the latest time it
    /// has counted at, which a check that read the clock earlier then counts at too.
    pub fn sweep_now(&self) {
        let now = self.clock.now();
        for (shard, memo) in self.shards.iter().zip(self.memos.iter()) {
            let mut t = shard.lock();
            let at = t.advance(now);
            memo.publish_latest(&shard.memo_key, at);
            self.sweep_shard(shard, memo, &mut t, at);
        }
    }
}

impl<C> MemoryStore<C> {
    /// Checks `cost` for `key` against `limit` at an explicit time (for simulations; a time
    /// earlier than the key's last is never better than that last time). Keep the times
    /// non-decreasing across keys for the pure algorithms' answers: a sweep at a later time may
    /// have dropped a state that was fresh then (see `docs/memory-store.md`).
    pub fn check_at(&self, key: &[u8], limit: &Limit, cost: u64, now: Timestamp) -> Decision {
        if !self.explicit_times.load(Ordering::Relaxed) {
            self.explicit_times.store(true, Ordering::Relaxed);
            for (shard, memo) in self.shards.iter().zip(self.memos.iter()) {
                let _t = shard.lock();
                memo.clear(&shard.memo_key);
            }
        }
        let (shard, id) = self.key_id(key, limit.fingerprint());
        self.check_id(shard, id, limit, cost, now, false)
    }

    /// The check of the key `id` of `shard` (see [`key_id`](Self::key_id)). Always inlined: left
    /// to itself, the compiler stopped inlining it into `check_now` once the denial memo was
    /// added, and then the clock's read too, which cost about 30 ns a check on a million keys.
    #[inline(always)]
    fn check_id(
        &self,
        shard: usize,
        id: u64,
        limit: &Limit,
        cost: u64,
        now: Timestamp,
        monotonic: bool,
    ) -> Decision {
        let memo = &self.memos[shard];
        let shard = &self.shards[shard];
        let mut table = shard.lock();
        let table = &mut *table;
        let now = if monotonic {
            let now = table.advance(now);
            memo.publish_latest(&shard.memo_key, now);
            now
        } else {
            // A check at an explicit time may admit the memo's key ahead of its denial. The first
            // `check_at` empties every memo, but a concurrent one may get here before it reaches
            // this shard: empty this shard's memo under its lock too.
            memo.clear(&shard.memo_key);
            now
        };
        let decision = self.check_locked(shard, memo, table, id, limit, cost, now, monotonic);
        memo.after_check(
            &shard.memo_key,
            id,
            cost,
            now,
            &decision,
            &self.explicit_times,
        );
        decision
    }

    /// The check of `check_id`, with the shard's lock held and the time to count at. (The shard
    /// and its memo are passed as they are: passing their index instead made the million-key
    /// check about 30 ns slower, by the code's layout alone.)
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn check_locked(
        &self,
        shard: &Shard,
        memo: &DenialMemo,
        table: &mut Table,
        id: u64,
        limit: &Limit,
        cost: u64,
        now: Timestamp,
        monotonic: bool,
    ) -> Decision {
        let found = table.find(id);
        if let Some(i) = found {
            let word = table.buckets[i].word;
            if word & BIG != 0 {
                let big = &mut table.big[(word & !BIG) as usize];
                if big.states.len() != limit.quotas().len() {
                    big.states = limit.fresh_states(now);
                } else if monotonic && limit.algorithm() == crate::Algorithm::SlidingLog {
                    // On the store's clock no later check counts at an earlier time: the entries
                    // that have slid out can go now, so that a key denied while its log ages does
                    // not have each check scan them under the lock (an admission would drop
                    // them; a denial does not). Decisions are unchanged.
                    for (state, quota) in big.states.iter_mut().zip(limit.quotas()) {
                        if let crate::algorithm::State::SlidingLog(log) = state {
                            log.prune_at(quota, now);
                        }
                    }
                }
                let decision = limit.check(&mut big.states, now, cost);
                if compact::stores(&decision, cost) {
                    big.fresh_at = limit.fresh_at(&big.states).as_micros();
                }
                return decision;
            }
            let mut next = compact::Out::new();
            let decision = compact::check(limit, Some(word), now, cost, &mut next);
            if next.word != compact::NO_WORD {
                // The common case written here, in registers.
                table.buckets[i].word = next.word;
            } else if let Some(next) = next.into_next() {
                table.replace(i, next);
            }
            return decision;
        }
        let mut next = compact::Out::new();
        let decision = compact::check(limit, None, now, cost, &mut next);
        if let Some(next) = next.into_next() {
            let held = table.len;
            let evicted = table.insert(id, next, now.as_micros(), self.per_shard_cap);
            shard.publish(table);
            if table.len <= held {
                // The insert swept or evicted: the memo's key may be gone.
                memo.clear(&shard.memo_key);
            }
            if evicted > 0 {
                self.evictions.fetch_add(evicted, Ordering::Relaxed);
            }
        }
        decision
    }

    /// How many keys are held now (locks each shard in turn).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    /// `true` if no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys this store holds at once: the builder's `max_keys` rounded down to a
    /// multiple of the number of shards.
    pub fn max_keys(&self) -> usize {
        self.per_shard_cap * self.shards.len()
    }

    /// How many states a sweep could not show fresh were dropped because their shard was full
    /// (the cap is split over the shards, so this can start before [`len`](Self::len) reaches
    /// [`max_keys`](Self::max_keys): see `docs/memory-store.md`). Each
    /// may have let its key pass up to its quota's capacity more than an unbounded store would
    /// have. (A window state's fresh time is kept rounded up, by less than its period: one fresh
    /// already within that rounding counts too; see `docs/memory-store.md`.)
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Bytes held by the tables (buckets and the states too large for a bucket), excluding the
    /// store's fixed size.
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().memory_bytes()).sum()
    }

    /// Drops every state that is fresh at `now`. Never needed for correctness or for the bound;
    /// useful to return memory after a burst of keys (with the side storage's limit of
    /// [`sweep_now`](Self::sweep_now)). For a store checked at explicit times
    /// ([`check_at`](Self::check_at)); a store checked by its own clock is swept with
    /// [`sweep_now`](Self::sweep_now), which cannot drop a state that a concurrent check, having
    /// read the clock a moment before, still counts against.
    pub fn sweep(&self, now: Timestamp) {
        for (shard, memo) in self.shards.iter().zip(self.memos.iter()) {
            let mut t = shard.lock();
            self.sweep_shard(shard, memo, &mut t, now);
        }
    }

    fn sweep_shard(&self, shard: &Shard, memo: &DenialMemo, t: &mut Table, now: Timestamp) {
        t.retain(|_, fresh_from| is_live(fresh_from, now.as_micros()), 0);
        memo.clear(&shard.memo_key);
        // The side storage's free list and slots are returned too, once nothing uses them.
        if t.len == 0 || t.free_big.len() == t.big.len() {
            t.big = Vec::new();
            t.free_big = Vec::new();
        }
        shard.publish(t);
        let cap = self.per_shard_cap.max(1);
        t.sweep_at = (t.len * 2).clamp(MIN_SWEEP.min(cap), cap);
    }

    /// The key's shard and its identity in the shard's table: the low bits of its digest pick
    /// the shard, the high bits its place in the shard's table, and the whole digest is its
    /// identity.
    #[inline]
    fn key_id(&self, key: &[u8], fingerprint: u64) -> (usize, u64) {
        // The limit's fingerprint is folded into the secret key: one pass over the key bytes.
        let h = self.digest.digest64(key, fingerprint);
        // 0 marks an empty bucket.
        ((h & self.mask) as usize, h.max(1))
    }
}

impl<C: Clock + 'static> Store for MemoryStore<C> {
    type Error = Infallible;
    type Future = Ready<Result<Decision, Infallible>>;

    #[inline]
    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        ready(Ok(self.check_now(key, limit, cost)))
    }
}

impl<C: Clock + 'static> Reset for MemoryStore<C> {
    type ResetFuture = Ready<Result<(), Infallible>>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        self.reset_now(key, limit);
        ready(Ok(()))
    }
}

/// A shard's table of up to this many buckets (32 KB) is not prefetched: a heuristic (not
/// measured at this size) for a table small enough to stay in a core's cache, where a prefetch
/// would only cost its instructions. Per shard: with 64 shards, stores of up to about 100,000
/// keys (2 MB of tables) are never prefetched.
const PREFETCH_FROM: usize = 2048;

/// A shard on its own cache lines, so that two cores locking neighbouring shards do not contend.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: Mutex<Table>,
    /// Where the table's buckets are and how many, published under the lock whenever the table
    /// may have been rebuilt, for [`prefetch`](Self::prefetch) to read without the lock. A stale
    /// pair only makes a prefetch useless: it is never dereferenced.
    buckets_at: AtomicPtr<Bucket>,
    buckets_len: AtomicUsize,
    /// The key of the shard's denial memo (0: none), read without the lock before the memo
    /// itself, on a line that a check reads anyway (see `denial_memo`).
    memo_key: AtomicU64,
}

impl Shard {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, Table> {
        // parking_lot's mutex: no poisoning to check, and a short spin before parking, which
        // suits a critical section of a few dozen nanoseconds.
        self.table.lock()
    }

    /// Publishes where `table`'s buckets are (called with the lock held, after adding a key or a
    /// sweep, either of which may rebuild the table).
    #[inline]
    fn publish(&self, table: &Table) {
        self.buckets_at
            .store(table.buckets.as_ptr().cast_mut(), Ordering::Relaxed);
        self.buckets_len
            .store(table.buckets.len(), Ordering::Relaxed);
    }

    /// Asks for the cache line of `id`'s home bucket, without the lock.
    #[inline]
    fn prefetch(&self, id: u64) {
        let n = self.buckets_len.load(Ordering::Relaxed);
        if n > PREFETCH_FROM {
            let at = self.buckets_at.load(Ordering::Relaxed);
            crate::prefetch::prefetch(at.wrapping_add(Table::home(id, n)));
        }
    }
}

/// Set in a bucket's word when its states live in the shard's side storage (the other bits are
/// their index there).
const BIG: u64 = 1 << 63;

/// One key: the 64-bit identity and the state in one word (see [`compact`]), 16 bytes in all, so
/// that a lookup in a large table touches one cache line and a table of a million keys fits in
/// about 21 to 32 MB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(align(16))]
struct Bucket {
    /// The key's identity (never 0; 0 marks an empty bucket).
    id: u64,
    /// The state, or `BIG` and the index of the states in the side storage.
    word: u64,
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.id == 0
    }
}

/// A state that is fresh from `fresh_from` on is live at `now`. Time stops at `MAX_TIME` for the
/// algorithms, so a state fresh only after it never is fresh.
fn is_live(fresh_from: u64, now: u64) -> bool {
    fresh_from > now.min(MAX_TIME)
}

/// States too large for a bucket's word, and when they are fresh.
#[derive(Debug, Default)]
struct Big {
    fresh_at: u64,
    states: Vec<State>,
}

/// An open-addressing table with linear probing. Keys are removed in bulk (a sweep) by
/// rebuilding, and one at a time (a reset) by moving the rest of the run back: no tombstones.
#[derive(Debug)]
struct Table {
    buckets: Vec<Bucket>,
    len: usize,
    /// States too large for a bucket (multi-quota limits, sliding logs, large counts).
    big: Vec<Big>,
    free_big: Vec<u64>,
    sweep_at: usize,
    /// The latest time a check by the store's clock counted at (see `check_now`).
    latest: Timestamp,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            buckets: Vec::new(),
            len: 0,
            big: Vec::new(),
            free_big: Vec::new(),
            sweep_at: MIN_SWEEP,
            latest: Timestamp::ZERO,
        }
    }
}

impl Table {
    /// Moves the shard's latest time on to `now` if later, and returns it: the time to count at.
    #[inline]
    fn advance(&mut self, now: Timestamp) -> Timestamp {
        if now > self.latest {
            self.latest = now;
        }
        self.latest
    }

    #[inline]
    fn home(id: u64, n: usize) -> usize {
        // Lemire's multiply-shift: any table size, no modulo.
        ((u128::from(id) * n as u128) >> 64) as usize
    }

    #[inline]
    fn find(&self, id: u64) -> Option<usize> {
        let n = self.buckets.len();
        if n == 0 {
            return None;
        }
        let mut i = Self::home(id, n);
        loop {
            let b = &self.buckets[i];
            if b.id == id {
                return Some(i);
            }
            if b.is_empty() {
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    fn place(buckets: &mut [Bucket], bucket: Bucket) {
        let n = buckets.len();
        let mut i = Self::home(bucket.id, n);
        while !buckets[i].is_empty() {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        buckets[i] = bucket;
    }

    /// The bucket word for `next`: the state itself, or `BIG` and its slot in the side storage.
    fn word(&mut self, next: compact::Next) -> u64 {
        match next {
            compact::Next::Inline(word) => word,
            compact::Next::Big(states, fresh_at) => self.alloc_big(Big { fresh_at, states }) | BIG,
        }
    }

    /// Sets bucket `i`'s state to `next`.
    #[cold]
    #[inline(never)]
    fn replace(&mut self, i: usize, next: compact::Next) {
        self.buckets[i].word = self.word(next);
    }

    fn alloc_big(&mut self, big: Big) -> u64 {
        match self.free_big.pop() {
            Some(slot) => {
                self.big[slot as usize] = big;
                slot
            }
            None => {
                self.big.push(big);
                (self.big.len() - 1) as u64
            }
        }
    }

    /// Inserts a new key, first making room if the table reached its sweep point. Returns how many
    /// live states were evicted.
    fn insert(&mut self, id: u64, next: compact::Next, now: u64, cap: usize) -> u64 {
        let cap = cap.max(1);
        let mut evicted = 0;
        if self.len >= self.sweep_at.min(cap) {
            let full = self.len >= cap;
            self.retain(|_, fresh_from| is_live(fresh_from, now), 0);
            // At the cap, make room for an eighth of it at least: a sweep that freed only a few
            // fresh states would otherwise be followed by another after as many inserts, each
            // rebuilding the whole table (O(cap) a key while nearly every state is live).
            let keep = cap - (cap / 8).max(1);
            if full && self.len > keep {
                evicted = self.evict_nearest_fresh(self.len - keep);
            }
            self.sweep_at = (self.len * 2).clamp(MIN_SWEEP.min(cap), cap);
        }
        // Keep the load at or under 3/4; grow by half (never past what `cap` keys need).
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            let want = (self.buckets.len() * 3 / 2).max(16);
            let most = cap.saturating_mul(4) / 3 + 2;
            self.retain(|_, _| true, want.min(most).max((self.len + 1) * 4 / 3 + 1));
        }
        let word = self.word(next);
        Self::place(&mut self.buckets, Bucket { id, word });
        self.len += 1;
        evicted as u64
    }

    /// Removes the key `id`, if held, and returns whether it was. The keys after it in its run
    /// that probed past its bucket move back into the hole (linear probing's deletion), so
    /// that no lookup stops short of them and no tombstone is needed.
    fn remove(&mut self, id: u64) -> bool {
        let Some(mut hole) = self.find(id) else {
            return false;
        };
        self.free_side_storage(self.buckets[hole]);
        let n = self.buckets.len();
        let mut j = hole;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let b = self.buckets[j];
            // The table is at most 3/4 full: the run ends.
            if b.is_empty() {
                break;
            }
            // `b` stays if its home is in (hole, j], going round the end: a lookup of it starts
            // after the hole. Else it moves into the hole, which moves to its bucket.
            let home = Self::home(b.id, n);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = Bucket::default();
        self.len -= 1;
        true
    }

    /// Frees the side storage of `b`'s states, if they are kept there, for `b` is going.
    fn free_side_storage(&mut self, b: Bucket) {
        if b.word & BIG != 0 {
            let slot = b.word & !BIG;
            self.big[slot as usize] = Big::default();
            self.free_big.push(slot);
        }
    }

    /// A time from which the state of `b` is certainly fresh.
    fn fresh_from(&self, b: &Bucket) -> u64 {
        if b.word & BIG != 0 {
            self.big[(b.word & !BIG) as usize].fresh_at
        } else {
            compact::fresh_from(b.word)
        }
    }

    /// Rebuilds the table with the buckets that `keep` accepts (given the time from which each is
    /// fresh), into `size` buckets (0: a size fitting the survivors). Side storage of dropped
    /// buckets is freed.
    fn retain(&mut self, mut keep: impl FnMut(&Bucket, u64) -> bool, size: usize) {
        let old = std::mem::take(&mut self.buckets);
        let mut kept = Vec::with_capacity(self.len);
        for b in old.into_iter().filter(|b| !b.is_empty()) {
            if keep(&b, self.fresh_from(&b)) {
                kept.push(b);
            } else {
                self.free_side_storage(b);
            }
        }
        let size = if size == 0 {
            (kept.len() * 3 / 2).max(16)
        } else {
            size
        };
        let mut buckets = vec![Bucket::default(); size.max(kept.len() * 4 / 3 + 1)];
        for b in &kept {
            Self::place(&mut buckets, *b);
        }
        self.len = kept.len();
        self.buckets = buckets;
    }

    /// Drops the `n` states that would be fresh soonest. Ties are broken by the identity's low
    /// bits, which do not decide a key's position in the table (its high bits do), so evictions
    /// do not leave the survivors clustered (that would lengthen probe sequences).
    fn evict_nearest_fresh(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let rank = |b: &Bucket, fresh_from: u64| (fresh_from, b.id.rotate_left(32));
        let mut ranks: Vec<(u64, u64)> = self
            .buckets
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| rank(b, self.fresh_from(b)))
            .collect();
        let (_, &mut threshold, _) = ranks.select_nth_unstable(n - 1);
        self.retain(|b, fresh_from| rank(b, fresh_from) > threshold, 0);
        n
    }

    fn memory_bytes(&self) -> usize {
        let state_bytes = |s: &State| match s {
            State::SlidingLog(log) => {
                std::mem::size_of::<crate::algorithm::SlidingLogState>()
                    + log.entries.capacity() * std::mem::size_of::<(u64, u64)>()
            }
            _ => 0,
        };
        self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + self.big.capacity() * std::mem::size_of::<Big>()
            + self.free_big.capacity() * std::mem::size_of::<u64>()
            + self
                .big
                .iter()
                .map(|v| {
                    v.states.capacity() * std::mem::size_of::<State>()
                        + v.states.iter().map(state_bytes).sum::<usize>()
                })
                .sum::<usize>()
    }
}

/// The largest power of two at most `n` (1 for 0), without overflow for any `n`.
pub(crate) fn prev_power_of_two(n: usize) -> usize {
    1 << n.max(1).ilog2()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, ManualClock, Quota};
    use std::time::Duration;

    /// On its clock, a denial drops a sliding log's entries that have slid out (and, the log
    /// mostly gone, its memory), with the decisions of a log that kept them; at explicit times
    /// (which may go back) it does not.
    #[test]
    fn a_sliding_log_denial_on_the_clock_drops_what_slid_out() {
        let clock = ManualClock::new();
        let on_clock = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let explicit = MemoryStore::new();
        let limit =
            Limit::single(Algorithm::SlidingLog, Quota::per_minute(10_000).unwrap()).unwrap();
        let mut t = Timestamp::ZERO;
        let both = |cost: u64, t: Timestamp| {
            clock.set(t);
            let a = on_clock.check_now(b"k", &limit, cost);
            let b = explicit.check_at(b"k", &limit, cost, t);
            assert_eq!(a, b, "cost {cost} at {t:?}");
            a
        };
        for _ in 0..9_900 {
            assert!(both(1, t).is_allowed());
            t = t.saturating_add(Duration::from_micros(1));
        }
        t = t.saturating_add(Duration::from_secs(30));
        for _ in 0..100 {
            assert!(both(1, t).is_allowed());
            t = t.saturating_add(Duration::from_micros(1));
        }
        let (before, kept) = (on_clock.memory_bytes(), explicit.memory_bytes());
        // 61 s in: the first 9,900 have slid out; 100 + 9,950 is over the limit.
        t = Timestamp::from_micros(61_000_000);
        assert!(!both(9_950, t).is_allowed());
        assert!(
            on_clock.memory_bytes() < before / 4,
            "{} of {before}",
            on_clock.memory_bytes()
        );
        assert_eq!(explicit.memory_bytes(), kept);
        // The same decisions afterwards: 9,900 pass at once, then nothing.
        assert!(both(9_900, t).is_allowed());
        assert!(!both(1, t).is_allowed());
    }

    /// What `prefetch` reads without the lock is where each table's buckets are, through growth,
    /// eviction at the cap and sweeps (a stale pair would only make the prefetch useless, but
    /// would do so silently).
    #[test]
    fn every_shard_publishes_where_its_buckets_are() {
        let clock = ManualClock::new();
        // Two shards of up to 2,500 keys: tables past `PREFETCH_FROM` buckets, which are
        // prefetched.
        let store = MemoryStore::builder()
            .max_keys(5_000)
            .shards(2)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
        let published = |store: &MemoryStore<ManualClock>| {
            for shard in store.shards.iter() {
                let table = shard.lock();
                assert_eq!(
                    shard.buckets_at.load(Ordering::Relaxed).cast_const(),
                    table.buckets.as_ptr()
                );
                assert_eq!(
                    shard.buckets_len.load(Ordering::Relaxed),
                    table.buckets.len()
                );
            }
        };
        for k in 0..50_000u64 {
            let _ = store.check_now(&k.to_le_bytes(), &limit, 1);
        }
        assert!(store.evictions() > 0, "the cap was reached");
        published(&store);
        for shard in store.shards.iter() {
            assert!(shard.buckets_len.load(Ordering::Relaxed) > PREFETCH_FROM);
        }
        clock.advance(std::time::Duration::from_secs(60));
        store.sweep_now();
        assert!(store.is_empty());
        published(&store);
    }

    /// A shard's lock, table, published buckets and memo key fill two cache lines, no more.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_shard_is_two_cache_lines() {
        assert_eq!(std::mem::size_of::<Shard>(), 128);
        assert_eq!(std::mem::size_of::<DenialMemo>(), 64);
    }

    /// A store of one shard on a manual clock.
    fn one_shard() -> (ManualClock, MemoryStore<ManualClock>) {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .shards(1)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        (clock, store)
    }

    /// A shard of 16 keys whose key `hot` is denied at cost 1 (so named by the shard's memo) for
    /// an hour, by a limit of 1 an hour.
    fn denied_hot_key() -> (ManualClock, MemoryStore<ManualClock>, Limit) {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .max_keys(16)
            .shards(1)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let hourly = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
        assert!(store.check_now(b"hot", &hourly, 1).is_allowed());
        assert!(store.check_now(b"hot", &hourly, 1).is_denied());
        let (_, id) = store.key_id(b"hot", hourly.fingerprint());
        assert_eq!(store.shards[0].memo_key.load(Ordering::Relaxed), id);
        (clock, store, hourly)
    }

    /// The memo answers only for a key whose state is there: a key evicted at the cap starts
    /// again from fresh, from the memo as under the lock.
    #[test]
    fn an_evicted_key_is_not_denied_by_the_memo() {
        let (_clock, store, hourly) = denied_hot_key();
        // Keys that stay live for a day fill the shard: at the cap, the states nearest to fresh
        // go first, and `hot` (fresh in an hour) is the nearest.
        let daily = Limit::single(Algorithm::TokenBucket, Quota::per_day(1).unwrap()).unwrap();
        for k in 0..16u64 {
            assert!(store.check_now(&k.to_le_bytes(), &daily, 1).is_allowed());
        }
        assert!(store.evictions() > 0);
        assert_eq!(store.shards[0].memo_key.load(Ordering::Relaxed), 0);
        assert!(store.check_now(b"hot", &hourly, 1).is_allowed());
    }

    fn memo_answers() -> u64 {
        denial_memo::ANSWERS.with(|n| n.get())
    }

    /// A denied key's next checks at cost 1 come from the memo, with the lock's answer.
    #[test]
    fn a_denied_key_is_answered_by_the_memo() {
        let (clock, store, hourly) = denied_hot_key();
        let before = memo_answers();
        let first = store.check_now(b"hot", &hourly, 1);
        assert_eq!(memo_answers() - before, 1);
        assert_eq!(
            first.retry_after(),
            Some(std::time::Duration::from_secs(3_600))
        );
        // A clock past the shard's latest time takes the lock, which moves that time on...
        clock.advance(std::time::Duration::from_secs(60));
        let later = store.check_now(b"hot", &hourly, 1);
        assert_eq!(memo_answers() - before, 1);
        // ...and the memo answers the next checks at that time, or at a clock behind it.
        assert_eq!(store.check_now(b"hot", &hourly, 1), later);
        clock.set(Timestamp::from_micros(30_000_000));
        assert_eq!(store.check_now(b"hot", &hourly, 1), later);
        assert_eq!(memo_answers() - before, 3);
        assert_eq!(
            later.retry_after(),
            Some(std::time::Duration::from_secs(3_540))
        );
        assert_eq!(later.reset_after(), std::time::Duration::from_secs(3_540));
        // Another cost takes the lock.
        let _ = store.check_now(b"hot", &hourly, 2);
        assert_eq!(memo_answers() - before, 3);
    }

    /// A denial by several quotas is not memoized: the others would recover before the binding
    /// one, and the memo would go on naming them. The lock's answer, every time.
    #[test]
    fn a_denial_by_several_quotas_is_not_memoized() {
        let (clock, store) = one_shard();
        let limit = Limit::new(
            Algorithm::TokenBucket,
            [Quota::per_second(2).unwrap(), Quota::per_minute(2).unwrap()],
        )
        .unwrap();
        assert!(store.check_now(b"hot", &limit, 2).is_allowed());
        let both = store.check_now(b"hot", &limit, 1);
        assert_eq!(both.violated_quotas(), crate::QuotaSet::from_bits(0b11));
        // The second is full again; the minute still denies.
        clock.advance(std::time::Duration::from_millis(600));
        let minute = crate::QuotaSet::from_bits(0b10);
        for _ in 0..3 {
            let d = store.check_now(b"hot", &limit, 1);
            assert_eq!((d.quota_index(), d.violated_quotas()), (1, minute), "{d:?}");
        }
        // With the minute alone denying, the memo answers again.
        let before = memo_answers();
        assert_eq!(store.check_now(b"hot", &limit, 1).violated_quotas(), minute);
        assert_eq!(memo_answers() - before, 1);
    }

    /// A clock set back (or a core whose clock is behind) counts at the shard's latest time, from
    /// the memo as under the lock: here the key was admitted again at that time.
    #[test]
    fn the_memo_counts_at_the_shards_latest_time() {
        let limit = Limit::single(
            Algorithm::TokenBucket,
            Quota::per_second(10).unwrap().with_burst(5).unwrap(),
        )
        .unwrap();
        for other_key in [false, true] {
            let (clock, store) = one_shard();
            for _ in 0..5 {
                assert!(store.check_now(b"hot", &limit, 1).is_allowed());
            }
            assert!(store.check_now(b"hot", &limit, 1).is_denied());
            clock.set(Timestamp::from_micros(1_000_000));
            let key: &[u8] = if other_key { b"other" } else { b"hot" };
            assert!(store.check_now(key, &limit, 1).is_allowed());
            clock.set(Timestamp::from_micros(50_000));
            let d = store.check_now(b"hot", &limit, 1);
            assert!(d.is_allowed(), "{d:?}");
            assert_eq!(d.remaining(), if other_key { 4 } else { 3 });
        }
    }

    /// Past the algorithms' last instant time stands still, and so do the waits: the memo is not
    /// written there.
    #[test]
    fn past_the_last_instant_the_waits_do_not_shrink() {
        let clock = ManualClock::starting_at(Timestamp::from_micros(crate::algorithm::MAX_TIME));
        let store = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let hourly = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
        assert!(store.check_now(b"hot", &hourly, 1).is_allowed());
        let first = store.check_now(b"hot", &hourly, 1);
        clock.advance(std::time::Duration::from_secs(1));
        let later = store.check_now(b"hot", &hourly, 1);
        assert_eq!(
            first.retry_after(),
            Some(std::time::Duration::from_secs(3_600))
        );
        assert_eq!(later, first);
    }

    /// After a check at an explicit time, a key's state may be ahead of the clock and its waits
    /// do not shorten as the clock moves: the memo is no longer written.
    #[test]
    fn a_store_checked_at_explicit_times_writes_no_memo() {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let hourly = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
        let ten_hours = Timestamp::from_micros(36_000_000_000);
        assert!(store.check_at(b"k", &hourly, 1, ten_hours).is_allowed());
        let first = store.check_now(b"k", &hourly, 1);
        clock.advance(std::time::Duration::from_secs(1_800));
        let later = store.check_now(b"k", &hourly, 1);
        assert!(first.is_denied());
        assert_eq!(later, first);
    }

    /// A sweep at a later time than the clock's (which drops states fresh then) empties the memo
    /// too, so that the key's next check is the lock's answer.
    #[test]
    fn a_sweep_empties_the_memo() {
        let (clock, store, hourly) = denied_hot_key();
        store.sweep(Timestamp::from_micros(3_600_000_000));
        assert!(store.is_empty());
        assert_eq!(clock.now(), Timestamp::ZERO);
        assert!(store.check_now(b"hot", &hourly, 1).is_allowed());
    }
}
