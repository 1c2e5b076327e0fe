//! `LogGate`: at most one log line a second for an event that may come with every request (a
//! store failure without a circuit breaker to stop the checks), the lines held back counted in
//! the next one written.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::Clock;

/// The least time between two lines of one gate, µs.
const INTERVAL_MICROS: u64 = 1_000_000;

/// Lets one line a second through (by the layer's clock), and counts the others.
pub(crate) struct LogGate {
    clock: Arc<dyn Clock>,
    /// The clock's time (µs) from which the next line may be written.
    next: AtomicU64,
    /// Lines held back since the last one written.
    held: AtomicU64,
}

impl LogGate {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> LogGate {
        LogGate {
            clock,
            next: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held)` if a line may be written now, `held` being the lines held back since the
    /// last one (each counted in exactly one line written); `None` if it is held back.
    pub(crate) fn pass(&self) -> Option<u64> {
        let now = self.clock.now().as_micros();
        let next = self.next.load(Ordering::Relaxed);
        // The last line written more than a second after `now`: the clock was set back (not
        // read a moment before another thread's line). Let through, or every line would be
        // held back until the clock caught up again (an hour, after a step back of an hour).
        let set_back = next > now.saturating_add(2 * INTERVAL_MICROS);
        if (now >= next || set_back)
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(INTERVAL_MICROS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl std::fmt::Debug for LogGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogGate")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::ManualClock;
    use std::time::Duration;

    #[test]
    fn one_line_a_second_with_the_count_of_those_held_back() {
        let clock = ManualClock::new();
        let gate = LogGate::new(Arc::new(clock.clone()));
        assert_eq!(gate.pass(), Some(0));
        for _ in 0..9 {
            assert_eq!(gate.pass(), None);
        }
        clock.advance(Duration::from_millis(999));
        assert_eq!(gate.pass(), None);
        clock.advance(Duration::from_millis(1));
        assert_eq!(gate.pass(), Some(10), "the ten held back");
        clock.advance(Duration::from_secs(5));
        assert_eq!(gate.pass(), Some(0));
    }

    /// A clock set back (a `ManualClock`, a custom clock that follows the wall clock) does not
    /// hold every line back until it catches up with the time of the last one written.
    #[test]
    fn a_clock_set_back_does_not_silence_the_gate() {
        let clock = ManualClock::starting_at(ratelimit_core::Timestamp::from_micros(3_600_000_000));
        let gate = LogGate::new(Arc::new(clock.clone()));
        assert_eq!(gate.pass(), Some(0));
        clock.set(ratelimit_core::Timestamp::from_micros(1_000_000));
        assert_eq!(gate.pass(), Some(0), "an hour back: a line");
        assert_eq!(gate.pass(), None, "then one a second again");
        clock.advance(Duration::from_secs(1));
        assert_eq!(gate.pass(), Some(1));
    }

    #[test]
    fn every_event_is_counted_once_across_threads() {
        let clock = ManualClock::new();
        let gate = Arc::new(LogGate::new(Arc::new(clock.clone())));
        let written = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let gate = gate.clone();
                    let clock = clock.clone();
                    s.spawn(move || {
                        let mut lines = Vec::new();
                        for i in 0..10_000 {
                            if i % 1_000 == 0 {
                                clock.advance(Duration::from_millis(300));
                            }
                            if let Some(held) = gate.pass() {
                                lines.push(held);
                            }
                        }
                        lines
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect::<Vec<u64>>()
        });
        clock.advance(Duration::from_secs(2));
        let last = gate.pass().unwrap();
        // Each event is a line written or counted in one: 40,000 and the last call.
        let total: u64 = written.len() as u64 + written.iter().sum::<u64>() + 1 + last;
        assert_eq!(total, 40_001);
        assert!(
            written.len() <= 13,
            "about one a second of 12 s: {}",
            written.len()
        );
    }
}
