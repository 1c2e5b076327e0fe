//! `Reset`: a key's state forgotten, in the memory store and through the denial cache, and no
//! other key's.

use std::collections::HashSet;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use ratelimit_core::{
    Algorithm, DenialCache, Limit, ManualClock, MemoryStore, Quota, Reset, Store,
};

fn now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the in-memory store answers at once"),
    }
}

fn store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap()
}

/// A memory store of one shard: every key in one table.
fn one_shard(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .shards(1)
        .with_clock(clock.clone())
        .build()
        .unwrap()
}

/// One limit per algorithm, of one quota and of two.
fn limits() -> Vec<Limit> {
    let mut out = Vec::new();
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        out.push(Limit::single(alg, Quota::per_minute(5).unwrap()).unwrap());
        out.push(
            Limit::new(
                alg,
                [Quota::per_second(3).unwrap(), Quota::per_hour(20).unwrap()],
            )
            .unwrap(),
        );
    }
    out
}

#[test]
fn a_reset_key_decides_as_a_new_key() {
    for limit in limits() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1_000));
        let store = store(&clock);
        while store.check_now(b"k", &limit, 1).is_allowed() {}
        clock.advance(Duration::from_millis(10));
        assert!(!store.check_now(b"k", &limit, 1).is_allowed(), "{limit:?}");
        assert!(store.reset_now(b"k", &limit), "{limit:?}");
        // A store that never saw the key, at the same instant: the same decisions, in full.
        let fresh = self::store(&clock);
        loop {
            let (a, b) = (
                store.check_now(b"k", &limit, 1),
                fresh.check_now(b"k", &limit, 1),
            );
            assert_eq!(a, b, "{limit:?}");
            if !a.is_allowed() {
                break;
            }
        }
        // A key without state: nothing to forget.
        assert!(!store.reset_now(b"never seen", &limit));
    }
}

#[test]
fn a_reset_forgets_only_its_key_under_its_limit() {
    let clock = ManualClock::new();
    let store = store(&clock);
    let a = Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap();
    let b = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    for _ in 0..2 {
        store.check_now(b"alice", &a, 1);
        store.check_now(b"alice", &b, 1);
        store.check_now(b"bob", &a, 1);
    }
    now(store.reset(b"alice", &a)).unwrap();
    assert_eq!(store.check_now(b"alice", &a, 0).remaining(), 2);
    assert_eq!(store.check_now(b"alice", &b, 0).remaining(), 1);
    assert_eq!(store.check_now(b"bob", &a, 0).remaining(), 0);
    // A peek stores nothing: alice's state under `a` is gone still.
    assert_eq!(store.len(), 2);
}

/// A key denied at cost 1 is answered from its shard's memo without the lock: the reset ends
/// that answer too.
#[test]
fn a_reset_ends_a_memoized_denial() {
    let clock = ManualClock::new();
    let store = one_shard(&clock);
    let limit = Limit::single(Algorithm::Gcra, Quota::per_hour(1).unwrap()).unwrap();
    assert!(store.check_now(b"hot", &limit, 1).is_allowed());
    for _ in 0..3 {
        assert!(!store.check_now(b"hot", &limit, 1).is_allowed());
    }
    store.reset_now(b"hot", &limit);
    assert!(store.check_now(b"hot", &limit, 1).is_allowed());
    assert!(!store.check_now(b"hot", &limit, 1).is_allowed());
}

#[derive(Debug, Clone)]
enum Op {
    Check(u16),
    Reset(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u16..400).prop_map(Op::Check),
        1 => (0u16..400).prop_map(Op::Reset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// One shard, so that every key shares one table and resets move the keys of long runs back:
    /// each key keeps its state whatever was reset around it. A quota of 1 an hour, the clock
    /// still: a key is admitted exactly when it holds no state.
    #[test]
    fn resets_keep_every_other_keys_state(
        ops in prop::collection::vec(op(), 1..2_000),
        big in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let store = one_shard(&clock);
        // A two-quota limit keeps its states beside the table (its side storage is reused).
        let limit = if big {
            Limit::new(
                Algorithm::TokenBucket,
                [Quota::per_hour(1).unwrap(), Quota::per_day(5).unwrap()],
            )
            .unwrap()
        } else {
            Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap()
        };
        let mut held = HashSet::new();
        for op in &ops {
            match *op {
                Op::Check(k) => {
                    let d = store.check_now(&k.to_le_bytes(), &limit, 1);
                    prop_assert_eq!(d.is_allowed(), held.insert(k), "key {}", k);
                }
                Op::Reset(k) => {
                    prop_assert_eq!(store.reset_now(&k.to_le_bytes(), &limit), held.remove(&k));
                }
            }
            prop_assert_eq!(store.len(), held.len());
        }
        for k in 0u16..400 {
            let d = store.check_now(&k.to_le_bytes(), &limit, 0);
            prop_assert_eq!(d.remaining() == 0, held.contains(&k), "key {}", k);
        }
    }
}

fn cached(clock: &ManualClock) -> DenialCache<MemoryStore<ManualClock>, ManualClock> {
    DenialCache::new(store(clock), clock.clone())
}

/// A reset ends the key's cached denials when it completes, and when its future is dropped
/// first too (the store may have reset all the same: the memory store resets when `reset` is
/// called).
#[test]
fn a_reset_ends_the_keys_cached_denials_done_or_dropped() {
    for dropped in [false, true] {
        let clock = ManualClock::new();
        let cache = cached(&clock);
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
        assert!(now(cache.check(b"k", &limit, 1)).unwrap().is_allowed());
        assert!(!now(cache.check(b"k", &limit, 1)).unwrap().is_allowed());
        let d = now(cache.check(b"k", &limit, 1)).unwrap();
        assert!(d.is_cached() && !d.is_allowed());
        let reset = cache.reset(b"k", &limit);
        if dropped {
            drop(reset);
        } else {
            now(reset).unwrap();
        }
        let d = now(cache.check(b"k", &limit, 1)).unwrap();
        assert!(d.is_allowed() && !d.is_cached(), "dropped: {dropped}");
    }
}

/// A check decided before the reset whose answer is taken in after it: its denial is not
/// cached, or it would deny the reset key until its deadline.
#[test]
fn a_denial_read_before_a_reset_is_not_cached_after_it() {
    for recorded_before in [false, true] {
        let clock = ManualClock::new();
        let cache = cached(&clock);
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
        // Either no record of the key in the cache (2 left), or one: an admission that leaves 1
        // implies (and caches) the denial of a second check of cost 2.
        let first = if recorded_before { 2 } else { 1 };
        assert!(now(cache.check(b"k", &limit, first)).unwrap().is_allowed());
        // The memory store decides when `check` is called; the cache takes the answer in at the
        // poll, after the reset.
        let (mut early, mut reset) = (cache.check(b"k", &limit, 3), cache.reset(b"k", &limit));
        assert!(now(&mut reset).is_ok());
        assert!(!now(&mut early).unwrap().is_allowed());
        let d = now(cache.check(b"k", &limit, 3)).unwrap();
        assert!(d.is_allowed() && !d.is_cached(), "{recorded_before}");
    }
}

/// Checks of two keys in one shard race resets of one of them: each reset grants the reset key
/// at most one more quota, and the other key, moved about in the table by the resets, keeps
/// its count exactly.
#[test]
fn concurrent_resets_grant_one_quota_each_and_touch_no_other_key() {
    const QUOTA: u64 = 50;
    const RESETS: u64 = 200;
    let clock = ManualClock::new();
    let store = Arc::new(one_shard(&clock));
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(QUOTA).unwrap()).unwrap();
    // Neighbours in the one table, so that the reset key's removal moves some of them.
    for k in 0u32..64 {
        store.check_now(&k.to_le_bytes(), &limit, 1);
    }
    let done = Arc::new(AtomicBool::new(false));
    let reset_key_allowed = Arc::new(AtomicU64::new(0));
    let other_allowed = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for (key, count) in [
        (&b"reset me"[..], reset_key_allowed.clone()),
        (&b"leave me"[..], other_allowed.clone()),
    ] {
        let (store, limit, done) = (store.clone(), limit.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            // Until a denial after the last reset: each key's quota is then spent.
            loop {
                let resets_done = done.load(Ordering::Acquire);
                if store.check_now(key, &limit, 1).is_allowed() {
                    count.fetch_add(1, Ordering::Relaxed);
                } else if resets_done {
                    break;
                }
            }
        }));
    }
    let resets = {
        let (store, limit) = (store.clone(), limit.clone());
        std::thread::spawn(move || {
            for _ in 0..RESETS {
                store.reset_now(b"reset me", &limit);
                std::thread::yield_now();
            }
        })
    };
    resets.join().unwrap();
    done.store(true, Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    let granted = reset_key_allowed.load(Ordering::Relaxed);
    assert!(granted <= QUOTA * (RESETS + 1), "{granted}");
    assert!(granted >= QUOTA, "{granted}");
    assert_eq!(other_allowed.load(Ordering::Relaxed), QUOTA);
    for k in 0u32..64 {
        assert_eq!(
            store.check_now(&k.to_le_bytes(), &limit, 0).remaining(),
            QUOTA - 1
        );
    }
}

fn leasing(clock: &ManualClock) -> ratelimit_core::Leasing<MemoryStore<ManualClock>, ManualClock> {
    ratelimit_core::Leasing::builder(store(clock), clock.clone())
        .lease_size(10)
        .build()
        .unwrap()
}

/// Checks of cost 1 until the first denial, at one instant: how many were admitted.
fn admitted_until_denied<S: Store>(store: &S, key: &[u8], limit: &Limit) -> u64 {
    let mut n = 0;
    while now(store.check(key, limit, 1)).unwrap().is_allowed() {
        n += 1;
        assert!(n <= 1_000, "never denied");
    }
    n
}

#[test]
fn a_reset_ends_the_keys_lease() {
    let clock = ManualClock::new();
    let leasing = leasing(&clock);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(20).unwrap()).unwrap();
    // A lease of 10: one unit spent, nine held here.
    assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    assert_eq!(leasing.outstanding_units(), 9);
    now(leasing.reset(b"k", &limit)).unwrap();
    assert_eq!(leasing.outstanding_units(), 0);
    // The nine dropped are counted as wasted: admitted + wasted + outstanding is what the store
    // granted.
    assert_eq!(leasing.stats().wasted_units, 9);
    // A full quota, and not a unit of the old lease on top.
    assert_eq!(admitted_until_denied(&leasing, b"k", &limit), 20);
}

/// A lease granted before the reset and taken in after it: its check is admitted (the store
/// counted it before the reset), and none of its other units are kept.
#[test]
fn a_lease_in_flight_across_a_reset_keeps_none_of_its_units() {
    let clock = ManualClock::new();
    let leasing = leasing(&clock);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(20).unwrap()).unwrap();
    // The memory store grants the lease when `check` is called; the wrapper takes it in at the
    // poll, after the reset.
    let mut in_flight = leasing.check(b"k", &limit, 1);
    now(leasing.reset(b"k", &limit)).unwrap();
    assert!(now(&mut in_flight).unwrap().is_allowed());
    assert_eq!(leasing.outstanding_units(), 0);
    assert_eq!(leasing.stats().wasted_units, 9, "the units not kept");
    assert_eq!(admitted_until_denied(&leasing, b"k", &limit), 20);
}

/// As above, with the cache's one shard filled by another key's denial before the early answer
/// comes, which leaves nothing of the reset key in the cache to compare the answer with: the
/// denial is still not cached.
#[test]
fn a_denial_read_before_a_reset_is_not_cached_when_the_shard_is_full() {
    let clock = ManualClock::new();
    let cache = DenialCache::new(store(&clock), clock.clone())
        .max_entries(2)
        .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    assert!(now(cache.check(b"k", &limit, 1)).unwrap().is_allowed());
    let (mut early, mut reset) = (cache.check(b"k", &limit, 3), cache.reset(b"k", &limit));
    assert!(now(&mut reset).is_ok());
    // Another key's denial (and its record) fill the shard.
    while now(cache.check(b"other", &limit, 1)).unwrap().is_allowed() {}
    assert!(now(cache.check(b"other", &limit, 1)).unwrap().is_cached());
    assert!(!now(&mut early).unwrap().is_allowed());
    let d = now(cache.check(b"k", &limit, 3)).unwrap();
    assert!(d.is_allowed() && !d.is_cached());
}

/// A memory store whose reset takes effect at its future's second poll, as a network store's
/// takes a round trip.
struct SlowReset(Arc<MemoryStore<ManualClock>>);

impl Store for SlowReset {
    type Error = ratelimit_core::NoError;
    type Future = <MemoryStore<ManualClock> as Store>::Future;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.0.check(key, limit, cost)
    }
}

struct SlowResetFuture {
    store: Arc<MemoryStore<ManualClock>>,
    key: Vec<u8>,
    limit: Limit,
    polled: bool,
}

impl Future for SlowResetFuture {
    type Output = Result<(), ratelimit_core::NoError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            return Poll::Pending;
        }
        self.store.reset_now(&self.key, &self.limit);
        Poll::Ready(Ok(()))
    }
}

impl Reset for SlowReset {
    type ResetFuture = SlowResetFuture;

    fn reset(&self, key: &[u8], limit: &Limit) -> SlowResetFuture {
        SlowResetFuture {
            store: self.0.clone(),
            key: key.to_vec(),
            limit: limit.clone(),
            polled: false,
        }
    }
}

/// A lease asked for and granted while the store's reset is on its way, from the state the
/// reset then forgets: its units go when the reset completes.
#[test]
fn a_lease_granted_while_the_reset_is_on_its_way_ends_with_it() {
    let clock = ManualClock::new();
    let leasing =
        ratelimit_core::Leasing::builder(SlowReset(Arc::new(store(&clock))), clock.clone())
            .lease_size(10)
            .build()
            .unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(20).unwrap()).unwrap();
    let mut reset = leasing.reset(b"k", &limit);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(std::pin::Pin::new(&mut reset).poll(&mut cx).is_pending());
    assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    assert_eq!(leasing.outstanding_units(), 9);
    assert!(now(&mut reset).is_ok());
    assert_eq!(leasing.outstanding_units(), 0);
    assert_eq!(
        leasing.stats().wasted_units,
        9,
        "the units the reset dropped"
    );
    assert_eq!(admitted_until_denied(&leasing, b"k", &limit), 20);
}

/// Two gateways' caches over one shared store: a reset made through one does not end the
/// other's cached denial until that one forgets it (what a gateway does when it hears of another
/// gateway's reset); the forget touches no other key or limit, and a denial read before it is not
/// cached after it.
#[test]
fn a_reset_made_elsewhere_ends_a_cached_denial_once_forgotten() {
    let clock = ManualClock::new();
    let shared = Arc::new(store(&clock));
    let a = DenialCache::new(Arc::clone(&shared), clock.clone());
    let b = DenialCache::new(Arc::clone(&shared), clock.clone());
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    let other = Limit::single(Algorithm::Gcra, Quota::per_minute(3).unwrap()).unwrap();
    for (key, limit) in [(&b"k"[..], &limit), (b"k", &other), (b"j", &limit)] {
        while now(a.check(key, limit, 1)).unwrap().is_allowed() {}
        assert!(now(a.check(key, limit, 1)).unwrap().is_cached());
    }
    // A check of A's that the store denies before the reset (a cost A has no denial of), whose
    // answer A takes in after it has heard of the reset: that denial is not cached.
    let mut early = a.check(b"k", &limit, 3);
    now(b.reset(b"k", &limit)).unwrap();
    // A still answers from its cache: it has not heard of B's reset.
    assert!(now(a.check(b"k", &limit, 1)).unwrap().is_cached());
    a.forget(b"k", limit.fingerprint());
    assert!(!now(&mut early).unwrap().is_allowed());
    let d = now(a.check(b"k", &limit, 3)).unwrap();
    assert!(d.is_allowed() && !d.is_cached());
    // Only that key under that limit.
    assert!(now(a.check(b"k", &other, 1)).unwrap().is_cached());
    assert!(now(a.check(b"j", &limit, 1)).unwrap().is_cached());
}

/// A lease held by one gateway when another resets the key: forgotten, its units go, and the
/// key gets a full quota, not the lease's units on top.
#[test]
fn a_lease_forgotten_after_a_reset_elsewhere_leaves_a_full_quota() {
    let clock = ManualClock::new();
    let shared = Arc::new(store(&clock));
    let lease = |s: &Arc<MemoryStore<ManualClock>>| {
        ratelimit_core::Leasing::builder(Arc::clone(s), clock.clone())
            .lease_size(10)
            .build()
            .unwrap()
    };
    let (a, b) = (lease(&shared), lease(&shared));
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(20).unwrap()).unwrap();
    assert!(now(a.check(b"k", &limit, 1)).unwrap().is_allowed());
    assert_eq!(a.outstanding_units(), 9);
    now(b.reset(b"k", &limit)).unwrap();
    a.forget(b"k", limit.fingerprint());
    assert_eq!(a.outstanding_units(), 0);
    assert_eq!(admitted_until_denied(&a, b"k", &limit), 20);
}

/// Resets that went unheard (the watch was not subscribed) were made while a check was in
/// flight: its denial, read before them and taken in after `forget_unheard` (or `clear`), is not
/// cached. The client, let back in by a reset elsewhere, is admitted at its next check.
#[test]
fn a_denial_in_flight_across_forget_unheard_is_not_cached() {
    use ratelimit_core::Forget;
    let clock = ManualClock::new();
    let shared = Arc::new(store(&clock));
    let cache = DenialCache::new(Arc::clone(&shared), clock.clone());
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    for forget in [
        (|c: &DenialCache<_, _>| Forget::forget_unheard(c)) as fn(&DenialCache<_, _>),
        |c| c.clear(),
    ] {
        // Two left: no denial implied, so the key has no record in the cache.
        assert!(now(cache.check(b"k", &limit, 1)).unwrap().is_allowed());
        // Decided (denied) when made; taken in at its poll.
        let early = cache.check(b"k", &limit, 3);
        assert!(
            shared.reset_now(b"k", &limit),
            "another gateway's reset, unheard"
        );
        forget(&cache);
        assert!(!now(early).unwrap().is_allowed());
        let d = now(cache.check(b"k", &limit, 3)).unwrap();
        assert!(d.is_allowed() && !d.is_cached(), "{d:?}");
        assert!(shared.reset_now(b"k", &limit));
    }
}

/// Through the `Forget` trait (what a watch of announced resets calls), over an `Arc` as a
/// gateway shares its cache: `forget` ends one key's denials under one limit, and
/// `forget_unheard` every denial (resets may have gone unheard), while a `Leasing` keeps its
/// leases on `forget_unheard` and ends one on `forget`.
#[test]
fn forget_through_the_trait() {
    use ratelimit_core::Forget;
    let clock = ManualClock::new();
    let cache = Arc::new(cached(&clock));
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    let denied_and_cached = |key: &[u8]| {
        let d = now(cache.check(key, &limit, 1)).unwrap();
        !d.is_allowed() && d.is_cached()
    };
    for key in [&b"a"[..], b"b", b"c"] {
        assert!(now(cache.check(key, &limit, 1)).unwrap().is_allowed());
        assert!(!now(cache.check(key, &limit, 1)).unwrap().is_allowed());
        assert!(denied_and_cached(key));
    }
    let held: &dyn Forget = &cache;
    held.forget(b"a", limit.fingerprint());
    assert!(!denied_and_cached(b"a"));
    assert!(denied_and_cached(b"b") && denied_and_cached(b"c"));
    held.forget_unheard();
    assert!(!denied_and_cached(b"b") && !denied_and_cached(b"c"));

    let leasing = leasing(&clock);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(20).unwrap()).unwrap();
    assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    Forget::forget_unheard(&leasing);
    assert_eq!(leasing.outstanding_units(), 9);
    Forget::forget(&leasing, b"k", limit.fingerprint());
    assert_eq!(leasing.outstanding_units(), 0);
}

/// A key whose lease request the store denied goes straight to the store until that denial's
/// wait is over; after a reset that may have gone unheard (`forget_unheard`), it leases again at
/// once, instead of costing a store call a check for the rest of the wait (every answer the
/// store's own either way).
#[test]
fn a_key_starved_of_leases_leases_again_after_unheard_resets() {
    use ratelimit_core::Forget;
    let clock = ManualClock::new();
    let leasing = leasing(&clock);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(10).unwrap()).unwrap();
    for _ in 0..10 {
        assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    }
    // The lease spent: the next lease request is denied, and the key starved of leases.
    assert!(!now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    assert!(!now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    let before = leasing.stats();
    assert_eq!((before.leases, before.lease_denials), (1, 1), "{before:?}");
    // The store reset where this gateway did not hear of it.
    assert!(now(leasing.get_ref().reset(b"k", &limit)).is_ok());
    Forget::forget_unheard(&leasing);
    assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    assert!(now(leasing.check(b"k", &limit, 1)).unwrap().is_allowed());
    let after = leasing.stats();
    assert_eq!(after.leases, 2, "leased again: {after:?}");
    assert_eq!(after.store_calls, before.store_calls + 1, "{after:?}");
}

/// A lease a missed reset should have ended is kept (`forget_unheard`), and admits its units; but
/// a `DenialCache` above it implies no denial from its last unit's answer, whose reset is the
/// forgotten state's: it would deny a client the store admits, for as long as that state would
/// have. Four an hour, a lease of four: one spent, a reset unheard, three more from the lease;
/// the fifth is admitted (the store, reset, has room).
#[test]
fn a_cache_over_a_lease_kept_across_unheard_resets_implies_no_stale_denial() {
    let gw = &Gateway::new(4);
    let cache = &gw.cache;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(4).unwrap()).unwrap();
    assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    gw.reset_unheard(b"alice", &limit);
    for _ in 0..3 {
        assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    }
    let fifth = now(cache.check(b"alice", &limit, 1)).unwrap();
    assert!(fifth.is_allowed(), "{fifth:?}");
}

/// A store decided by `store` when a check is sent, and answered once its gate is open: each
/// check's gate is open from the start unless `gating`, and kept in `gates` in sending order.
#[derive(Clone)]
struct Gated {
    store: Arc<MemoryStore<ManualClock>>,
    gating: Arc<AtomicBool>,
    gates: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Gated {
    fn new(store: &Arc<MemoryStore<ManualClock>>) -> Self {
        Gated {
            store: Arc::clone(store),
            gating: Arc::default(),
            gates: Arc::default(),
        }
    }

    /// Checks sent from now on wait for their gate (`true`), or not.
    fn hold(&self, hold: bool) {
        self.gating.store(hold, Ordering::Release);
    }

    /// Answers the check sent `back` checks ago (0: the last).
    fn answer(&self, back: usize) {
        let gates = self.gates.lock().unwrap();
        gates[gates.len() - 1 - back].store(true, Ordering::Release);
    }
}

struct GatedCheck {
    decided: ratelimit_core::Decision,
    open: Arc<AtomicBool>,
}

impl Future for GatedCheck {
    type Output = Result<ratelimit_core::Decision, std::convert::Infallible>;

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        if self.open.load(Ordering::Acquire) {
            Poll::Ready(Ok(self.decided))
        } else {
            Poll::Pending
        }
    }
}

impl Store for Gated {
    type Error = std::convert::Infallible;
    type Future = GatedCheck;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> GatedCheck {
        let open = Arc::new(AtomicBool::new(!self.gating.load(Ordering::Acquire)));
        self.gates.lock().unwrap().push(Arc::clone(&open));
        GatedCheck {
            decided: self.store.check_now(key, limit, cost),
            open,
        }
    }
}

/// A gateway's stack over the shared store: a `DenialCache` over `Leasing` (leases of the size
/// given) over the store behind a `Gated` link.
struct Gateway {
    shared: Arc<MemoryStore<ManualClock>>,
    gated: Gated,
    leasing: ratelimit_core::Leasing<Gated, ManualClock>,
    cache: DenialCache<ratelimit_core::Leasing<Gated, ManualClock>, ManualClock>,
}

impl Gateway {
    fn new(lease_size: u64) -> Self {
        let clock = ManualClock::new();
        let shared = Arc::new(store(&clock));
        let gated = Gated::new(&shared);
        let leasing = ratelimit_core::Leasing::builder(gated.clone(), clock.clone())
            .lease_size(lease_size)
            .build()
            .unwrap();
        let cache = DenialCache::new(leasing.clone(), clock);
        Gateway {
            shared,
            gated,
            leasing,
            cache,
        }
    }

    /// Another gateway resets `key`; this one's watch, subscribed again, applies what it may
    /// have missed, innermost first.
    fn reset_unheard(&self, key: &[u8], limit: &Limit) {
        use ratelimit_core::Forget;
        self.shared.reset_now(key, limit);
        Forget::forget_unheard(&self.leasing);
        Forget::forget_unheard(&self.cache);
    }
}

/// Polls `check` once: its answer if it has come.
fn poll_once<F: Future>(check: std::pin::Pin<&mut F>) -> Option<F::Output> {
    match check.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// The same, for checks decided before the missed reset and answered after `forget_unheard`: a
/// lease request (its lease is of the forgotten state too), and a check straight to the store
/// (a cost above what the lease holds), whose answer must not make the kept lease's answers
/// trusted again. 4 (then 8) an hour, leases of 4.
#[test]
fn answers_in_flight_across_unheard_resets_imply_no_stale_denial() {
    for (per_hour, first_cost) in [(4, None), (8, Some(4))] {
        let gw = &Gateway::new(4);
        let (gated, cache) = (&gw.gated, &gw.cache);
        let limit =
            Limit::single(Algorithm::TokenBucket, Quota::per_hour(per_hour).unwrap()).unwrap();
        if first_cost.is_some() {
            // A lease of 4 taken, 3 left in it.
            assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
        }
        gated.hold(true);
        // A lease request (or, with 3 left in the lease, a check of 4 straight to the store),
        // decided now, answered after the reset and the forget.
        let mut in_flight = pin!(cache.check(b"alice", &limit, first_cost.unwrap_or(1)));
        assert!(poll_once(in_flight.as_mut()).is_none());
        gw.reset_unheard(b"alice", &limit);
        gated.hold(false);
        gated.answer(0);
        let answer = poll_once(in_flight.as_mut()).expect("answered once open");
        assert!(answer.unwrap().is_allowed());
        for i in 0..3 {
            let d = now(cache.check(b"alice", &limit, 1)).unwrap();
            assert!(d.is_allowed(), "{per_hour}: {i}: {d:?}");
        }
        let next = now(cache.check(b"alice", &limit, 1)).unwrap();
        assert!(
            next.is_allowed(),
            "{per_hour}: the store, reset, has room: {next:?}"
        );
    }
}

/// A lease request sent after `forget_unheard`, whose answer comes after a check sent before it
/// (of the forgotten state: "0 left" of its window) and one sent after it: the lease's own answer
/// reports the key's remaining as the older answer lowered it, and implies no denial to the
/// cache above. A fixed window of 4 an hour, leases of 1: two spent, then a lease request (A) and
/// a direct check (D, the window's last unit) in flight across the reset and the forget; A
/// answered; then a lease request (F) and a direct check (E); answered E, D, F.
#[test]
fn a_lease_answered_after_an_older_check_implies_no_stale_denial() {
    let gw = &Gateway::new(1);
    let (gated, cache) = (&gw.gated, &gw.cache);
    let limit = Limit::single(Algorithm::FixedWindow, Quota::per_hour(4).unwrap()).unwrap();
    for _ in 0..2 {
        assert!(now(cache.check(b"alice", &limit, 1)).unwrap().is_allowed());
    }
    gated.hold(true);
    let mut a = pin!(cache.check(b"alice", &limit, 1));
    assert!(poll_once(a.as_mut()).is_none());
    let mut d = pin!(cache.check(b"alice", &limit, 1));
    assert!(poll_once(d.as_mut()).is_none());
    gw.reset_unheard(b"alice", &limit);
    gated.answer(1);
    assert!(poll_once(a.as_mut()).unwrap().unwrap().is_allowed());
    let mut f = pin!(cache.check(b"alice", &limit, 1));
    assert!(poll_once(f.as_mut()).is_none());
    let mut e = pin!(cache.check(b"alice", &limit, 1));
    assert!(poll_once(e.as_mut()).is_none());
    gated.answer(0);
    assert!(poll_once(e.as_mut()).unwrap().unwrap().is_allowed());
    gated.answer(2);
    let old = poll_once(d.as_mut()).unwrap().unwrap();
    assert!(old.is_allowed() && old.remaining() == 0, "{old:?}");
    gated.answer(1);
    assert!(poll_once(f.as_mut()).unwrap().unwrap().is_allowed());
    gated.hold(false);
    assert_eq!(gw.shared.check_now(b"alice", &limit, 0).remaining(), 2);
    let next = now(cache.check(b"alice", &limit, 1)).unwrap();
    assert!(next.is_allowed(), "the store, reset, has room: {next:?}");
}
