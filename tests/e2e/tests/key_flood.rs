//! A flood of distinct client identities against the in-memory store: its key count stays at
//! the cap and resident memory stays under a bound derived from it.
//!
//! The 10,000,000-identity run is `#[ignore]`d (about 40 s in a debug build, 6 s in release); run
//! it with `cargo test --release -p ratelimit-e2e -- --ignored`, which also runs the fallback
//! flood of `key_flood_fallback.rs`. The default run floods with 1,000,000 identities.
//!
//! The tests of this file run one at a time (a lock), since they measure the resident memory of
//! the whole process; the fallback flood is in its own file, so its own process.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::Instant;

use ratelimit_core::MemoryStore;
use ratelimit_e2e::observe::rss_bytes;
use ratelimit_e2e::per_minute;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Resident bytes allowed per key the store may hold: the tables take 21 to 32 bytes per key
/// (16-byte buckets, between 3/4 and 1/2 full); a generous bound leaves room for a table being
/// rebuilt next to the old one and for allocator slack.
const BYTES_PER_KEY: u64 = 128;
/// Allocator and runtime noise allowed on top.
const SLACK: u64 = 16 * 1024 * 1024;

/// How often (in identities) the flood samples the resident size and the store's key count.
const SAMPLE_EVERY: u64 = 50_000;

/// The `n`-th identity: a distinct IPv4 address (the key a `ClientIp` extractor would give).
fn identity(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0b00_0000_u32.wrapping_add(n as u32)))
}

fn memory_store_flood(identities: u64, max_keys: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .build()
        .expect("store");
    let limit = per_minute(100);
    let before = rss_bytes();
    let mut peak = before;
    let start = Instant::now();
    let mut key = [0u8; 5];
    key[0] = 4;
    for n in 0..identities {
        if let IpAddr::V4(v4) = identity(n) {
            key[1..].copy_from_slice(&v4.octets());
        }
        assert!(store.check_now(&key, &limit, 1).is_allowed());
        if n % SAMPLE_EVERY == 0 {
            peak = peak.max(rss_bytes());
            assert!(store.len() <= max_keys);
        }
    }
    peak = peak.max(rss_bytes());
    let growth = peak.saturating_sub(before);
    let bound = max_keys as u64 * BYTES_PER_KEY + SLACK;
    println!(
        "MemoryStore, max_keys {max_keys}: {identities} identities in {:.1} s, {} held, \
         {} evictions, tables {} bytes, resident growth {} bytes (bound {bound})",
        start.elapsed().as_secs_f64(),
        store.len(),
        store.evictions(),
        store.memory_bytes(),
        growth,
    );
    assert!(store.len() <= max_keys);
    assert!(
        store.memory_bytes() as u64 <= max_keys as u64 * 32,
        "tables of {} bytes",
        store.memory_bytes()
    );
    assert!(growth <= bound, "resident growth {growth} over {bound}");
}

#[test]
fn memory_store_one_million_identities() {
    memory_store_flood(1_000_000, 100_000);
}

#[test]
#[ignore = "10,000,000 identities: run in release with --ignored"]
fn memory_store_ten_million_identities() {
    memory_store_flood(10_000_000, 100_000);
}
