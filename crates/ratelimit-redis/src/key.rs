//! Redis key layout: `<prefix>:{<user key>}:<algorithm code>:<fingerprint>[:<quota>]`.

use std::fmt::Write as _;
use std::hash::Hasher as _;

use ratelimit_core::{Algorithm, Limit};
use siphasher::sip128::{Hasher128, SipHasher13};

/// The longest user key kept verbatim in a Redis key; longer keys are hashed.
pub const MAX_VERBATIM_KEY: usize = 64;

/// Fixed SipHash keys: every gateway must map a user key to the same Redis key.
const HASH_KEYS: (u64, u64) = (0x7261_7465_6c69_6d69, 0x7420_7265_6469_7321);

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'/' | b'-')
}

/// The hash-tag body for `key`: the key itself if it is short, non-empty and made only of
/// `[A-Za-z0-9._:@/-]` (and does not start with `h:`), else `h:` and the 32 hex digits of its
/// 128-bit SipHash-1-3 under fixed keys. Braces never appear, so the tag cannot be escaped.
/// Passed to `f` from a buffer of its own (no allocation).
fn with_tag<R>(key: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let verbatim = !key.is_empty()
        && key.len() <= MAX_VERBATIM_KEY
        && !key.starts_with(b"h:")
        && key.iter().copied().all(is_safe);
    if verbatim {
        return f(key);
    }
    let mut h = SipHasher13::new_with_keys(HASH_KEYS.0, HASH_KEYS.1);
    h.write(key);
    let d = h.finish128();
    let mut tag = [0u8; 34];
    // 34 bytes exactly: the write cannot fail.
    let _ = std::io::Write::write_fmt(
        &mut &mut tag[..],
        format_args!("h:{:016x}{:016x}", d.h1, d.h2),
    );
    f(&tag)
}

/// Appends the hash-tag body for `key` (see [`with_tag`]).
pub(crate) fn push_encoded(out: &mut String, key: &[u8]) {
    // Every byte of a tag is ASCII.
    with_tag(key, |tag| out.extend(tag.iter().map(|&b| char::from(b))));
}

/// The Redis Cluster hash slot of every Redis key of `key`'s checks, whatever the prefix or the
/// limit: CRC16 (XMODEM) of the hash tag, modulo 16384, as the cluster computes it.
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    with_tag(key, slot_of_tag)
}

/// The hash slot of a hash tag: CRC16 (XMODEM) of it, modulo 16384.
fn slot_of_tag(tag: &[u8]) -> u16 {
    let mut crc = crc16::State::<crc16::XMODEM>::new();
    crc.update(tag);
    crc.get() % 16384
}

/// The hash slot of a Redis key of the store's (`<prefix>:{<tag>}:...`): CRC16 of its tag, as
/// the cluster computes it; of the whole key if it has no tag.
pub(crate) fn slot_of_redis_key(redis_key: &[u8]) -> u16 {
    let tag = redis_key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &redis_key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(redis_key);
    slot_of_tag(tag)
}

/// The algorithm's short name in Redis keys. Short on purpose: the key is hashed, copied and
/// compared by every command of every check, and each 10 bytes measured about 0.1 us of the
/// script's server time (`usec_per_call`). The fingerprint already tells the algorithms apart.
///
/// The code also names the format of the state stored under the key: a script that stores its
/// state differently takes a new code, so that it never reads a state written by an older
/// version as its own (a changed layout would be read shifted, without an error). The two
/// versions' keys then live side by side, and the old ones expire by themselves. (GCRA's code
/// became `gc` when the state moved from a hash to a string, and from its first name.)
pub(crate) fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::Gcra => "gc",
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::SlidingLog => "sl",
        // A later algorithm (`Algorithm` is non-exhaustive) has no script in this version, so no
        // key of it is ever written; its full name keeps it apart all the same.
        other => other.name(),
    }
}

/// Every Redis key of one check: the state hash first, then (sliding log) one list per quota.
pub(crate) fn state_keys(prefix: &str, key: &[u8], limit: &Limit) -> Vec<String> {
    let mut keys = Vec::with_capacity(key_count(limit));
    each_state_key(prefix, key, limit, |k| keys.push(k.to_owned()));
    keys
}

/// How many keys a check of `limit` touches.
pub(crate) fn key_count(limit: &Limit) -> usize {
    match limit.algorithm() {
        Algorithm::SlidingLog => 1 + limit.quotas().len(),
        _ => 1,
    }
}

/// Passes each of [`state_keys`] to `f`, in order, built in one buffer.
pub(crate) fn each_state_key(prefix: &str, key: &[u8], limit: &Limit, mut f: impl FnMut(&str)) {
    let mut base = String::with_capacity(prefix.len() + 100);
    base.push_str(prefix);
    base.push_str(":{");
    push_encoded(&mut base, key);
    let _ = write!(
        base,
        "}}:{}:{:016x}",
        algorithm_code(limit.algorithm()),
        limit.fingerprint()
    );
    f(&base);
    if limit.algorithm() == Algorithm::SlidingLog {
        let len = base.len();
        for i in 0..limit.quotas().len() {
            base.truncate(len);
            let _ = write!(base, ":{i}");
            f(&base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Quota;

    fn enc(key: &[u8]) -> String {
        let mut s = String::new();
        push_encoded(&mut s, key);
        s
    }

    #[test]
    fn safe_short_keys_are_verbatim() {
        assert_eq!(enc(b"user:42"), "user:42");
        assert_eq!(enc(b"10.0.0.1"), "10.0.0.1");
        assert_eq!(enc(b"a@b.c/d-e_f"), "a@b.c/d-e_f");
    }

    #[test]
    fn other_keys_are_hashed_to_a_bounded_length() {
        for k in [
            &b"{evil}"[..],
            b"a}b",
            b"",
            b"\x00\xff",
            b"with space",
            &[b'x'; 65][..],
            b"h:0123456789abcdef0123456789abcdef",
        ] {
            let e = enc(k);
            assert!(e.starts_with("h:") && e.len() == 34, "{k:?} -> {e}");
            assert!(!e.contains('{') && !e.contains('}'));
        }
        assert_ne!(enc(b"{a}"), enc(b"{b}"));
        // The digest's 128 bits in hex, high word first (the layout keys have always had).
        let mut h = SipHasher13::new_with_keys(HASH_KEYS.0, HASH_KEYS.1);
        h.write(b"with space");
        let d = h.finish128();
        assert_eq!(enc(b"with space"), format!("h:{:016x}{:016x}", d.h1, d.h2));
        // Stable across processes and versions (fixed keys): a change renames every hashed key in
        // Redis, and a fleet mixing versions would count such a client twice.
        assert_eq!(enc(b"with space"), "h:b5883e6a5448ccb6c694a0b04ccf8cb0");
    }

    #[test]
    fn hash_slots_are_crc16_xmodem_of_the_tag() {
        // CRC-16/XMODEM's check value (a verbatim key is its own tag).
        assert_eq!(hash_slot(b"123456789"), 0x31c3);
        // A hashed key's slot is its tag's, not its own bytes'.
        let mut crc = crc16::State::<crc16::XMODEM>::new();
        crc.update(enc(b"{evil}").as_bytes());
        assert_eq!(hash_slot(b"{evil}"), crc.get() % 16384);
        crc = crc16::State::<crc16::XMODEM>::new();
        crc.update(b"{evil}");
        assert_ne!(hash_slot(b"{evil}"), crc.get() % 16384);
    }

    #[test]
    fn a_redis_keys_slot_is_its_user_keys() {
        let limit = Limit::single(Algorithm::SlidingLog, Quota::per_second(5).unwrap()).unwrap();
        for user in [&b"user:1"[..], b"{evil}", b"with space", b"", b"h:x"] {
            for redis_key in state_keys("rl", user, &limit) {
                assert_eq!(
                    slot_of_redis_key(redis_key.as_bytes()),
                    hash_slot(user),
                    "{redis_key}"
                );
            }
        }
        // No tag, or an empty one: the whole key, as the cluster computes it.
        assert_eq!(slot_of_redis_key(b"123456789"), 0x31c3);
        assert_eq!(slot_of_redis_key(b"{}123"), slot_of_tag(b"{}123"));
    }

    #[test]
    fn layout() {
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(5).unwrap()).unwrap();
        let keys = state_keys("rl", b"user:1", &limit);
        assert_eq!(
            keys,
            vec![format!("rl:{{user:1}}:tb:{:016x}", limit.fingerprint())]
        );
        let log = Limit::new(
            Algorithm::SlidingLog,
            [
                Quota::per_second(5).unwrap(),
                Quota::per_minute(50).unwrap(),
            ],
        )
        .unwrap();
        let keys = state_keys("rl", b"{x}", &log);
        assert_eq!(keys.len(), 3);
        assert!(keys[1].ends_with(":0") && keys[2].ends_with(":1"));
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        assert!(keys.iter().all(|k| tag(k) == tag(&keys[0])));
    }

    #[test]
    fn keys_are_at_most_153_bytes() {
        let prefix = "p".repeat(64);
        let longest_verbatim = [b'a'; MAX_VERBATIM_KEY];
        let mut longest = 0;
        for algorithm in Algorithm::ALL {
            let quotas = [
                Quota::per_second(5).unwrap(),
                Quota::per_minute(50).unwrap(),
            ];
            let limit = Limit::new(algorithm, quotas).unwrap();
            for key in [&longest_verbatim[..], &[0u8; 1000][..]] {
                for k in state_keys(&prefix, key, &limit) {
                    longest = longest.max(k.len());
                }
            }
        }
        assert_eq!(longest, 153);
    }
}
