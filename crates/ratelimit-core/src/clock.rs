//! Clocks: where the current time comes from. Algorithms never read one; stores do.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Timestamp;
use crate::time::duration_to_micros;

/// A source of the current time.
///
/// Implementations must be cheap: the in-memory store reads the clock once per check.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// Wall-clock time since the Unix epoch that never goes backwards.
///
/// It reads the system time once, when created, and then advances with a monotonic clock, so
/// fixed windows line up with real minutes and hours while a wall-clock step (NTP, a VM resume)
/// cannot move decisions backwards. The monotonic clock is [`quanta`]'s: it reads the CPU's
/// invariant time-stamp counter where there is one (a few nanoseconds, against tens for
/// `Instant::now`), and the operating system's monotonic clock where there is not.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_unix_micros: u64,
    anchor: u64,
    /// Microseconds per raw tick as a 64-bit binary fraction (`micros = ticks × this / 2^64`), or
    /// `None` for a counter slower than 1 MHz, whose ticks are scaled by quanta itself.
    micros_per_tick: Option<u64>,
    clock: quanta::Clock,
}

impl SystemClock {
    /// A clock anchored to the system time now.
    #[must_use]
    pub fn new() -> Self {
        // The counter first: its first use may calibrate for up to 200 ms, which must not pass
        // between the two readings of the anchor.
        let clock = quanta::Clock::new();
        let anchor = clock.raw();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        SystemClock {
            anchor_unix_micros: duration_to_micros(unix),
            anchor,
            micros_per_tick: micros_per_tick(&clock),
            clock,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        // Raw ticks to whole microseconds in one multiplication (this runs on every check):
        // quanta's scaling to nanoseconds and a division by 1,000 took 2.7 ns more per check of
        // the memory store's hot-key benchmark.
        let raw = self.clock.raw();
        let elapsed = match self.micros_per_tick {
            Some(per_tick) => {
                let ticks = raw.saturating_sub(self.anchor);
                ((u128::from(ticks) * u128::from(per_tick)) >> 64) as u64
            }
            None => self.clock.delta_as_nanos(self.anchor, raw) / 1_000,
        };
        Timestamp::from_micros(self.anchor_unix_micros.saturating_add(elapsed))
    }
}

/// quanta's calibration of its raw ticks, as microseconds per tick in a 64-bit binary fraction:
/// the nanoseconds quanta gives for 2^44 ticks, times 2^20 / 1,000 (`None` if a tick is a
/// microsecond or longer). quanta scales by a factor over the power of two just above the ticks it
/// calibrated over (at most 200 ms' worth, about 2^30, far below 2^44), so the product is exact.
fn micros_per_tick(clock: &quanta::Clock) -> Option<u64> {
    let nanos = u128::from(clock.delta_as_nanos(0, 1 << 44));
    u64::try_from((nanos << 20) / 1_000).ok()
}

/// A clock that moves only when told to. Clones share one time.
///
/// ```
/// use ratelimit_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let seen_by_store = clock.clone();
/// clock.advance(Duration::from_millis(1_500));
/// assert_eq!(seen_by_store.now().as_micros(), 1_500_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    #[must_use]
    pub fn new() -> Self {
        ManualClock::default()
    }

    /// A clock at `start`.
    #[must_use]
    pub fn starting_at(start: Timestamp) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves the time forward by `d` (whole microseconds), for every clone.
    pub fn advance(&self, d: Duration) {
        let step = duration_to_micros(d);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .micros
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(step))
            });
    }

    /// Sets the time, for every clone. Setting it backwards is allowed: it is how tests show
    /// that time going backwards never grants tokens.
    pub fn set(&self, t: Timestamp) {
        self.micros.store(t.as_micros(), Ordering::Release);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.micros.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_monotonic_and_near_unix_time() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        // After 2020-01-01 and before 2200.
        assert!(a.as_micros() > 1_577_836_800_000_000);
        assert!(a.as_micros() < 7_258_118_400_000_000);
    }

    /// The one-multiplication scaling agrees with quanta's own to the microsecond (quanta's
    /// nanoseconds, divided by 1,000, may round the other way at a microsecond's edge).
    #[test]
    fn ticks_scale_to_microseconds_as_quanta_does() {
        let c = SystemClock::new();
        let Some(per_tick) = c.micros_per_tick else {
            return;
        };
        let mut previous = 0;
        for ticks in [
            0u64,
            1,
            999,
            1_000_000,
            123_456_789,
            1 << 32,
            1 << 45,
            1 << 52,
        ] {
            let ours = ((u128::from(ticks) * u128::from(per_tick)) >> 64) as u64;
            let quanta = c.clock.delta_as_nanos(0, ticks) / 1_000;
            assert!(
                ours.abs_diff(quanta) <= 1,
                "{ticks} ticks: {ours} µs against {quanta}"
            );
            assert!(ours >= previous);
            previous = ours;
        }
    }

    #[test]
    fn manual_clock_clones_share_time() {
        let c = ManualClock::starting_at(Timestamp::from_secs(10));
        let d = c.clone();
        c.advance(Duration::from_micros(7));
        assert_eq!(d.now(), Timestamp::from_micros(10_000_007));
        d.set(Timestamp::from_secs(1));
        assert_eq!(c.now(), Timestamp::from_secs(1));
    }
}
