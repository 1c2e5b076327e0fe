//! Keys as digests under a random secret: SipHash-1-3-64 for the memory store's tables (a 16-byte
//! bucket keeps 8 bytes of identity), SipHash-1-3-128 for the denial cache and the leasing wrapper.
//!
//! The `siphasher` crate computes the same functions (the tests compare them on random
//! inputs), but its streaming `Hasher` interface buffers partial words; a key is hashed here in
//! one pass over whole words, which takes about half the instructions.

use std::hash::{BuildHasherDefault, Hasher};

/// A secret SipHash key, drawn from the operating system's randomness (through std's
/// `RandomState`). Unknown to clients, so they cannot aim collisions at a table. Its `Debug`
/// prints no part of it: a store's `{:?}` in a log line must not give it away.
#[derive(Clone, Copy)]
pub(crate) struct KeyDigest {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(<secret>)")
    }
}

impl KeyDigest {
    pub(crate) fn random() -> Self {
        use std::hash::BuildHasher;
        let k0 = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
        let k1 = std::collections::hash_map::RandomState::new().hash_one(0xfeed_u64);
        KeyDigest { k0, k1 }
    }

    /// A 64-bit digest of `key` (SipHash-1-3-64) under the secret tweaked by `tweak`.
    #[inline]
    pub(crate) fn digest64(&self, key: &[u8], tweak: u64) -> u64 {
        siphash13_64(self.k0 ^ tweak, self.k1, key)
    }

    /// The 128-bit digest of `key` (SipHash-1-3-128), under a secret tweaked by `tweak0` and
    /// `tweak1` (a limit's fingerprint, a cost): a distinct keyed function for each pair of
    /// tweaks, in one pass over the key.
    #[inline]
    pub(crate) fn digest_u128(&self, key: &[u8], tweak0: u64, tweak1: u64) -> u128 {
        let (h1, h2) = siphash13_128(self.k0 ^ tweak0, self.k1 ^ tweak1, key);
        u128::from(h1) | (u128::from(h2) << 64)
    }
}

/// A hasher for tables keyed by digests, which are uniformly random already: it keeps 64 bits of
/// the digest instead of hashing it again.
#[derive(Debug, Default)]
pub(crate) struct IdHasher(u64);

/// [`IdHasher`] for `HashMap`.
pub(crate) type BuildIdHasher = BuildHasherDefault<IdHasher>;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only integers are hashed here; fold anything else in, to stay a valid hasher.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

#[inline(always)]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

#[inline(always)]
fn compress(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    round(v);
    v[0] ^= m;
}

/// SipHash-1-3's state after absorbing `data` under the key `(k0, k1)`; `v1_tweak` is 0xee for
/// the 128-bit output, 0 for the 64-bit one.
#[inline(always)]
fn absorb(k0: u64, k1: u64, data: &[u8], v1_tweak: u64) -> [u64; 4] {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d ^ v1_tweak,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        compress(&mut v, u64::from_le_bytes(word));
    }
    compress(&mut v, tail(data) | ((data.len() as u64) << 56));
    v
}

/// Three SipRounds after xoring `x` into `v2`, and the xor of the state.
#[inline(always)]
fn finish(v: &mut [u64; 4], x: u64) -> u64 {
    v[2] ^= x;
    round(v);
    round(v);
    round(v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// SipHash-1-3-128 of `data` under the key `(k0, k1)`, as two 64-bit halves.
#[inline]
pub(crate) fn siphash13_128(k0: u64, k1: u64, data: &[u8]) -> (u64, u64) {
    let mut v = absorb(k0, k1, data, 0xee);
    let h1 = finish(&mut v, 0xee);
    v[1] ^= 0xdd;
    let h2 = finish(&mut v, 0);
    (h1, h2)
}

/// SipHash-1-3-64 of `data` under the key `(k0, k1)`.
#[inline]
pub(crate) fn siphash13_64(k0: u64, k1: u64, data: &[u8]) -> u64 {
    let mut v = absorb(k0, k1, data, 0);
    finish(&mut v, 0xff)
}

/// The key's last `len % 8` bytes (those after its whole words) as a little-endian word. A key of
/// 8 bytes or more ends with a whole word, which holds them at its top: one load and a shift.
/// A shorter key takes at most three loads (a variable-length copy would call `memcpy`).
#[inline(always)]
fn tail(data: &[u8]) -> u64 {
    let n = data.len() % 8;
    if let Some(last) = data.last_chunk::<8>() {
        // `n == 0` would shift by 64: no bytes, so 0.
        return u64::from_le_bytes(*last)
            .checked_shr(8 * (8 - n as u32))
            .unwrap_or(0);
    }
    short_tail(data)
}

/// The bytes of a key shorter than 8 bytes as a little-endian word, in at most three loads.
#[inline(always)]
fn short_tail(rest: &[u8]) -> u64 {
    let mut out = 0u64;
    let mut at = 0;
    if rest.len() >= 4 {
        out = u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
        at = 4;
    }
    if rest.len() - at >= 2 {
        out |= u64::from(u16::from_le_bytes([rest[at], rest[at + 1]])) << (8 * at);
        at += 2;
    }
    if rest.len() > at {
        out |= u64::from(rest[at]) << (8 * at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{KeyDigest, siphash13_64, siphash13_128};
    use siphasher::sip::SipHasher13 as SipHasher13x64;
    use siphasher::sip128::{Hasher128, SipHasher13};
    use std::hash::Hasher;

    #[test]
    fn same_function_as_the_siphasher_crate() {
        let mut x = 0x1234_5678_9abc_def0_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in 0..80usize {
            for _ in 0..20 {
                let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let (k0, k1) = (next(), next());
                let mut reference = SipHasher13::new_with_keys(k0, k1);
                reference.write(&data);
                let r = reference.finish128();
                assert_eq!(siphash13_128(k0, k1, &data), (r.h1, r.h2), "len {len}");
                let mut reference = SipHasher13x64::new_with_keys(k0, k1);
                reference.write(&data);
                assert_eq!(siphash13_64(k0, k1, &data), reference.finish(), "len {len}");
            }
        }
    }

    #[test]
    fn debug_hides_the_secret() {
        let d = KeyDigest::random();
        let shown = format!("{d:?}");
        assert_eq!(shown, "KeyDigest(<secret>)");
        for part in [d.k0, d.k1] {
            assert!(!shown.contains(&part.to_string()));
            assert!(!shown.contains(&format!("{part:x}")));
        }
    }
}
