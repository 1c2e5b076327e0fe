//! Which master serves each hash slot of a Redis Cluster: the store's failure domains.
//!
//! A master serves its slots alone: when it is lost (killed, partitioned, hung) its keys fail and
//! the other masters' keys do not. So a cluster store's failure domain for a key is the master
//! that serves the key's slot, as the store last read it: from `CLUSTER SLOTS` (when it is built,
//! at every new cluster connection, and every [`REREAD`] while checks come) and from each `MOVED`
//! it follows. The tower layer keeps a circuit per domain: a master lost opens one circuit, after
//! the failures of its own keys, and the other masters' keys go on being checked.
//!
//! Each master is given a domain the first time the store sees its address, in turn, and keeps
//! it: a replica that takes over is a new address and gets a domain of its own (the lost master's
//! circuit closes once a probe of the master's slots, now the replica's, is answered). Slots of
//! no known master (before the map is first read) share one domain of their own. A cluster of more
//! masters than domains shares domains among them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;

use crate::store::CLUSTER_FAILURE_DOMAINS;

/// The hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;
/// The domain of the slots whose master is not known: the last one.
pub(crate) const UNKNOWN: usize = CLUSTER_FAILURE_DOMAINS - 1;
/// How often the map is read again while checks come (a resharding moves slots without a
/// `MOVED` to this gateway once the client's own map has followed it).
pub(crate) const REREAD: Duration = Duration::from_secs(10);
/// Masters remembered before the numbering starts again (a cluster whose nodes came and went
/// that many times).
const MAX_REMEMBERED: usize = 4_096;

pub(crate) struct SlotOwners {
    /// Each slot's master's domain; `UNKNOWN` before it is known.
    owner: Box<[AtomicU8]>,
    /// The domain of each master, by the address the cluster gives it.
    domains: Mutex<HashMap<(String, u16), u8>>,
    /// When the map was last read (or a reading failed), in µs from `epoch`.
    read_at: AtomicU64,
    /// Set while a reading runs.
    reading: AtomicBool,
    epoch: Instant,
}

impl SlotOwners {
    pub(crate) fn new() -> SlotOwners {
        SlotOwners {
            owner: (0..SLOTS).map(|_| AtomicU8::new(UNKNOWN as u8)).collect(),
            domains: Mutex::new(HashMap::new()),
            read_at: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// The domain of `slot`'s master (below [`CLUSTER_FAILURE_DOMAINS`]).
    pub(crate) fn domain(&self, slot: u16) -> usize {
        usize::from(self.owner[usize::from(slot) % SLOTS].load(Ordering::Relaxed))
    }

    /// The domain of the master at `host:port`, given in turn at its first sight.
    fn of(&self, host: &str, port: u16) -> u8 {
        let mut domains = self
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&d) = domains.get(&(host.to_owned(), port)) {
            return d;
        }
        if domains.len() >= MAX_REMEMBERED {
            domains.clear();
        }
        // `UNKNOWN` is never a master's.
        let d = (domains.len() % UNKNOWN) as u8;
        domains.insert((host.to_owned(), port), d);
        d
    }

    /// Takes in a `CLUSTER SLOTS` reply: each range's slots go to its master's domain. Ranges
    /// that the reply does not name keep the domain they had.
    pub(crate) fn read(&self, slots: &Value) {
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Some((start, end, host, port)) = master_range(range) else {
                    continue;
                };
                let d = self.of(&host, port);
                for slot in &self.owner[start..=end] {
                    slot.store(d, Ordering::Relaxed);
                }
            }
        }
        self.read_at.store(self.micros(), Ordering::Relaxed);
    }

    /// A `MOVED slot host:port` answer: the slot is that master's now.
    pub(crate) fn moved(&self, slot: u16, host: &str, port: u16) {
        let d = self.of(host, port);
        self.owner[usize::from(slot) % SLOTS].store(d, Ordering::Relaxed);
    }

    /// The next reading of the map, if it is due ([`REREAD`] since the last, or never read) and
    /// no other runs: the caller reads and passes the reply to [`read`](SlotOwners::read). The
    /// reading is let go when the returned guard drops, read or not; a failed one is tried again
    /// a `REREAD` later.
    pub(crate) fn due(self: &Arc<Self>) -> Option<Reading> {
        let read_at = self.read_at.load(Ordering::Relaxed);
        let fresh =
            read_at != 0 && self.micros().saturating_sub(read_at) < REREAD.as_micros() as u64;
        if fresh || self.reading.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Reading(Arc::clone(self)))
    }

    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// A reading of the map in progress (see [`SlotOwners::due`]).
pub(crate) struct Reading(Arc<SlotOwners>);

impl Drop for Reading {
    fn drop(&mut self) {
        let owners = &self.0;
        // A reading that failed counts as one: the next is a `REREAD` later, not at the next check.
        owners.read_at.fetch_max(owners.micros(), Ordering::Relaxed);
        owners.reading.store(false, Ordering::Release);
    }
}

/// A `CLUSTER SLOTS` range (`[start, end, [host, port, ...], replicas...]`): its slots and its
/// master's address, if the reply gives them.
fn master_range(range: &Value) -> Option<(usize, usize, String, u16)> {
    let Value::Array(range) = range else {
        return None;
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(i)) => usize::try_from(*i).ok(),
        _ => None,
    };
    let (start, end) = (int(range.first())?, int(range.get(1))?);
    let Some(Value::Array(master)) = range.get(2) else {
        return None;
    };
    let host = match master.first()? {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let port = u16::try_from(int(master.get(1))?).ok()?;
    (start <= end && end < SLOTS).then_some((start, end, host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.into()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
            Value::Array(vec![
                Value::BulkString(b"10.0.0.9".to_vec()),
                Value::Int(7009),
            ]),
        ])
    }

    #[test]
    fn each_master_is_a_domain_of_its_own() {
        let owners = SlotOwners::new();
        assert_eq!(owners.domain(0), UNKNOWN, "nothing read yet");
        owners.read(&Value::Array(vec![
            range(0, 5460, "10.0.0.1", 7000),
            range(5461, 10922, "10.0.0.2", 7000),
            range(10923, 16383, "10.0.0.3", 7000),
            // Not a range: left out.
            Value::Int(1),
            range(9, 3, "10.0.0.4", 7000),
        ]));
        let (a, b, c) = (owners.domain(0), owners.domain(5461), owners.domain(16383));
        assert!(a != b && b != c && a != c && [a, b, c].iter().all(|&d| d < UNKNOWN));
        assert_eq!(owners.domain(5460), a);
        assert_eq!(owners.domain(10922), b);
        // A slot moved to another master takes its domain; a new master gets a new one.
        owners.moved(100, "10.0.0.2", 7000);
        assert_eq!(owners.domain(100), b);
        owners.moved(101, "10.0.0.7", 7000);
        assert!(![a, b, c, UNKNOWN].contains(&owners.domain(101)));
        // Read again, the map says where every slot is; masters keep their domains.
        owners.read(&Value::Array(vec![
            range(0, 5460, "10.0.0.1", 7000),
            range(5461, 16383, "10.0.0.3", 7000),
        ]));
        assert_eq!((owners.domain(100), owners.domain(5461)), (a, c));
    }

    #[test]
    fn readings_are_due_once_per_reread() {
        let mut owners = SlotOwners::new();
        // As if made 20 s ago.
        owners.epoch = Instant::now()
            .checked_sub(Duration::from_secs(20))
            .expect("a clock past its first 20 s");
        let owners = Arc::new(owners);
        let reading = owners.due().expect("never read");
        assert!(owners.due().is_none(), "one reading at a time");
        drop(reading);
        assert!(
            owners.due().is_none(),
            "a failed reading counts: not again before REREAD"
        );
        owners.read(&Value::Array(vec![]));
        assert!(owners.due().is_none(), "just read");
        // Read 20 s ago.
        owners.read_at.store(1, Ordering::Relaxed);
        assert!(owners.due().is_some(), "due again after REREAD");
    }
}
