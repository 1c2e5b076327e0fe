//! `MemoryStore`: a concurrent, bounded, in-process store for every algorithm.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::algorithm::State;
use crate::{Clock, ConfigError, Decision, Limit, Store, SystemClock, Timestamp};

/// The default cap on the number of keys held: 1,000,000.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

const DEFAULT_SHARDS: usize = 64;
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
/// - **Compact.** Keys are held as a 128-bit SipHash-1-3 digest under a random per-store key
///   (HashDoS-resistant; two distinct keys share a state with probability at most n²/2¹²⁹ for n
///   keys), so the key's length does not matter.
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
    mask: u64,
    per_shard_cap: usize,
    seed: (u64, u64),
    evictions: AtomicU64,
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
    /// The most keys held at once (default 1,000,000). At least 1.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How many independently locked shards (a power of two; default 64, fewer for small caps).
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
        let seed = random_seed();
        Ok(MemoryStore {
            shards: (0..shards).map(|_| Shard::default()).collect(),
            mask: (shards - 1) as u64,
            per_shard_cap,
            seed,
            evictions: AtomicU64::new(0),
            clock: self.clock,
        })
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Checks `cost` for `key` against `limit` now, by this store's clock. See [`Store::check`].
    pub fn check_now(&self, key: &[u8], limit: &Limit, cost: u64) -> Decision {
        self.check_at(key, limit, cost, self.clock.now())
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C> MemoryStore<C> {
    /// Checks `cost` for `key` against `limit` at an explicit time (for simulations; a time
    /// earlier than the key's last is treated as that last time).
    pub fn check_at(&self, key: &[u8], limit: &Limit, cost: u64, now: Timestamp) -> Decision {
        let id = self.key_id(key, limit.fingerprint());
        let mut table = self.shards[(id.1 & self.mask) as usize].lock();
        if let Some(entry) = table.map.get_mut(&id) {
            if entry.slot.len() != limit.quotas().len() {
                entry.slot = Slot::fresh(limit, now);
            }
            let decision = limit.check(entry.slot.as_mut_slice(), now, cost);
            if decision.is_allowed() && cost > 0 {
                entry.fresh_at = limit.fresh_at(entry.slot.as_slice()).as_micros();
            }
            return decision;
        }
        let mut slot = Slot::fresh(limit, now);
        let decision = limit.check(slot.as_mut_slice(), now, cost);
        if decision.is_allowed() && cost > 0 {
            let fresh_at = limit.fresh_at(slot.as_slice()).as_micros();
            if fresh_at > now.as_micros() {
                let evicted = table.insert(
                    id,
                    Entry { fresh_at, slot },
                    now.as_micros(),
                    self.per_shard_cap,
                );
                if evicted > 0 {
                    self.evictions.fetch_add(evicted, Ordering::Relaxed);
                }
            }
        }
        decision
    }

    /// How many keys are held now (locks each shard in turn).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// `true` if no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys this store holds at once.
    pub fn max_keys(&self) -> usize {
        self.per_shard_cap * self.shards.len()
    }

    /// How many live (not yet fresh) states were dropped because the store was full. Each may have
    /// let its key pass up to its quota's capacity more than an unbounded store would have.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Drops every state that is fresh at `now`. Never needed for correctness or for the bound;
    /// useful to return memory after a burst of keys.
    pub fn sweep(&self, now: Timestamp) {
        for shard in self.shards.iter() {
            let mut t = shard.lock();
            t.map.retain(|_, e| e.fresh_at > now.as_micros());
            t.sweep_at = (t.map.len() * 2).clamp(MIN_SWEEP, self.per_shard_cap.max(1));
        }
    }

    fn key_id(&self, key: &[u8], fingerprint: u64) -> KeyId {
        let mut h = SipHasher13::new_with_keys(self.seed.0, self.seed.1);
        h.write_u64(fingerprint);
        h.write(key);
        let d = h.finish128();
        KeyId(d.h1, d.h2)
    }
}

impl<C: Clock + 'static> Store for MemoryStore<C> {
    type Error = Infallible;
    type Future = Ready<Result<Decision, Infallible>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        ready(Ok(self.check_now(key, limit, cost)))
    }
}

/// A shard on its own cache lines, so that two cores locking neighbouring shards do not contend.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<Table>);

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while a table is locked; if something ever did, the table is still a
        // valid map of valid states.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Table {
    map: HashMap<KeyId, Entry, BuildHasherDefault<IdHasher>>,
    sweep_at: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            map: HashMap::default(),
            sweep_at: MIN_SWEEP,
        }
    }
}

impl Table {
    /// Inserts a new key, first making room if the table reached its sweep point. Returns how many
    /// live states were evicted.
    fn insert(&mut self, id: KeyId, entry: Entry, now: u64, cap: usize) -> u64 {
        let cap = cap.max(1);
        let mut evicted = 0;
        if self.map.len() >= self.sweep_at.min(cap) {
            self.map.retain(|_, e| e.fresh_at > now);
            if self.map.len() >= cap {
                let keep = cap - (cap / 8).max(1);
                evicted = self.evict_nearest_fresh(self.map.len() - keep);
            }
            self.sweep_at = (self.map.len() * 2).clamp(MIN_SWEEP, cap);
        }
        self.map.insert(id, entry);
        evicted as u64
    }

    /// Drops the `n` states that would be fresh soonest.
    fn evict_nearest_fresh(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut times: Vec<u64> = self.map.values().map(|e| e.fresh_at).collect();
        let (below, &mut threshold, _) = times.select_nth_unstable(n - 1);
        let mut ties = n - below.iter().filter(|&&t| t < threshold).count();
        self.map.retain(|_, e| {
            if e.fresh_at < threshold {
                false
            } else if e.fresh_at == threshold && ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
        n
    }
}

#[derive(Debug)]
struct Entry {
    /// When every state of this key is fresh again (microseconds).
    fresh_at: u64,
    slot: Slot,
}

#[derive(Debug)]
enum Slot {
    One(State),
    Many(Box<[State]>),
}

impl Slot {
    fn fresh(limit: &Limit, now: Timestamp) -> Slot {
        if limit.quotas().len() == 1 {
            Slot::One(limit.fresh_state(0, now))
        } else {
            Slot::Many(limit.fresh_states(now).into_boxed_slice())
        }
    }

    fn len(&self) -> usize {
        match self {
            Slot::One(_) => 1,
            Slot::Many(s) => s.len(),
        }
    }

    fn as_slice(&self) -> &[State] {
        match self {
            Slot::One(s) => std::slice::from_ref(s),
            Slot::Many(s) => s,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [State] {
        match self {
            Slot::One(s) => std::slice::from_mut(s),
            Slot::Many(s) => s,
        }
    }
}

/// A key's 128-bit digest. Its first half is already uniformly random, so the table hashes it as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyId(u64, u64);

impl Hash for KeyId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}

#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `KeyId`; fold anything else in, to stay a valid hasher.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn prev_power_of_two(n: usize) -> usize {
    if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    }
}

fn random_seed() -> (u64, u64) {
    use std::hash::BuildHasher;
    // std's RandomState is seeded from the operating system's randomness.
    let a = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
    let b = std::collections::hash_map::RandomState::new().hash_one(0xfeed_u64);
    (a, b)
}

