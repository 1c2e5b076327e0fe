//! A store's failure domains are seen through the wrappers in front of it: a caller that keeps a
//! circuit per domain (the tower layer) must get the store's own, not the default single one.

use std::sync::Arc;

use ratelimit_core::{DenialCache, Leasing, Limit, ManualClock, MemoryStore, Store};

/// A memory store that says it has 8 parts, a key's part being its length modulo 8.
struct Parted(MemoryStore<ManualClock>);

impl Store for Parted {
    type Error = <MemoryStore<ManualClock> as Store>::Error;
    type Future = <MemoryStore<ManualClock> as Store>::Future;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.0.check(key, limit, cost)
    }

    fn failure_domains(&self) -> usize {
        8
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        key.len() % 8
    }
}

fn parted(clock: &ManualClock) -> Parted {
    Parted(
        MemoryStore::builder()
            .with_clock(clock.clone())
            .build()
            .unwrap(),
    )
}

fn assert_forwards<S: Store>(store: &S, name: &str) {
    assert_eq!(store.failure_domains(), 8, "{name}");
    for key in [&b""[..], b"a", b"abc", b"abcdefghij"] {
        assert_eq!(store.failure_domain(key), key.len() % 8, "{name}: {key:?}");
    }
}

#[test]
fn wrappers_pass_on_their_stores_failure_domains() {
    let clock = ManualClock::new();
    assert_forwards(&parted(&clock), "the store");
    assert_forwards(&Arc::new(parted(&clock)), "Arc");
    assert_forwards(
        &DenialCache::new(parted(&clock), clock.clone()),
        "DenialCache",
    );
    assert_forwards(&Leasing::new(parted(&clock), clock.clone()), "Leasing");
    assert_forwards(
        &DenialCache::new(Leasing::new(parted(&clock), clock.clone()), clock.clone()),
        "DenialCache over Leasing",
    );
}

#[test]
fn a_memory_store_is_one_domain() {
    let store = MemoryStore::new();
    assert_eq!(store.failure_domains(), 1);
    assert_eq!(store.failure_domain(b"anything"), 0);
}
