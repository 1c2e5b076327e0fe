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

/// Wall-clock time since the Unix epoch that never goes backwards, for limits kept in one process.
///
/// It reads the system time once, when created, and then advances with a monotonic clock, so
/// fixed windows line up with real minutes and hours while a wall-clock step (NTP, a VM resume)
/// cannot move decisions backwards. The monotonic clock is [`quanta`]'s: it reads the CPU's
/// invariant time-stamp counter where there is one (a few nanoseconds, against tens for
/// `Instant::now`), and the operating system's monotonic clock where there is not.
///
/// **Drift.** The counter's rate is calibrated once, over a fraction of a second at the first
/// use, and never again, so the clock drifts from the system's wall clock (which NTP keeps in step
/// with other machines) by the calibration's error, for as long as the process runs:
/// `cargo run --release -p ratelimit-core --example clock_drift` measures it. On the machine of
/// `docs/benchmarks.md` it was between −1.1 and +32.5 parts per million, depending on the
/// process (up to 2.8 s a day, so fixed windows start seconds away from the wall clock's minutes
/// after a few days). Within one process that is a rate off by a few hundred thousandths, which
/// no limit notices. A time compared with other machines' (a client clock for the Redis store)
/// must follow the system clock: use [`WallClock`].
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
        SystemClock::on(quanta::Clock::new())
    }

    /// Anchored to the system time now, advancing with `clock` (a mocked one in tests).
    fn on(clock: quanta::Clock) -> Self {
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
/// Rounded up: rounded down, a whole number of microseconds of nanosecond ticks (the operating
/// system's clock, where there is no invariant counter) would read one microsecond short; rounded
/// up, the excess for nanosecond ticks (0.384 × 2^-64 µs a tick) stays below a nanosecond, and
/// the readings exact, for 2^64 / 384 ticks (about a year and a half), and below a microsecond
/// for a thousand times longer.
fn micros_per_tick(clock: &quanta::Clock) -> Option<u64> {
    let nanos = u128::from(clock.delta_as_nanos(0, 1 << 44));
    u64::try_from((nanos << 20).div_ceil(1_000)).ok()
}

/// The operating system's wall clock (`SystemTime`), read at every call: the clock to compare
/// with other machines' (a client clock for the Redis store, `RedisStoreBuilder::client_clock`),
/// since NTP keeps it in step with theirs, where [`SystemClock`] drifts from it.
///
/// It never goes backwards: a read earlier than the latest this clock or a clone of it returned
/// (NTP stepped the clock back, say) returns that latest time instead, so time stands still until
/// the wall clock catches up. A read costs a `clock_gettime` (about 25 ns where Linux serves it
/// without a system call; [`SystemClock`] takes a few) and, when the time moved on, a write to an
/// atomic its clones share, a cache line that moves between the cores that read it.
///
/// ```
/// use ratelimit_core::{Clock, WallClock};
///
/// let clock = WallClock::new();
/// let (a, b) = (clock.now(), clock.clone().now());
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone, Default)]
pub struct WallClock {
    latest: Arc<AtomicU64>,
}

impl WallClock {
    /// The system's wall clock.
    #[must_use]
    pub fn new() -> Self {
        WallClock::default()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Timestamp {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_micros);
        Timestamp::from_micros(never_back(&self.latest, unix))
    }
}

/// `reading`, or the latest time `latest` holds if that is later; `latest` keeps the later of
/// the two. A read that finds the time unchanged writes nothing (many reads fall in one
/// microsecond when checks come fast), so that the shared line is written at most once a
/// microsecond. Relaxed is enough: every read and write of one atomic is in one order, so a
/// thread never reads it earlier than it has before.
fn never_back(latest: &AtomicU64, reading: u64) -> u64 {
    let seen = latest.load(Ordering::Relaxed);
    if reading <= seen {
        return seen;
    }
    latest.fetch_max(reading, Ordering::Relaxed).max(reading)
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
        // quanta's counter ticks at GHz rates, its fallback (the OS's clock) in nanoseconds.
        let per_tick = c
            .micros_per_tick
            .expect("a tick shorter than a microsecond");
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

    /// The whole of `now` on a counter whose ticks are nanoseconds (quanta's mock, as its
    /// fallback to the OS's clock): exact microseconds, scaled by one multiplication and, for a
    /// counter slower than 1 MHz, by quanta.
    #[test]
    fn a_nanosecond_counter_reads_exact_microseconds() {
        let (counter, mock) = quanta::Clock::mock();
        mock.increment(123_456_789);
        let scaled = SystemClock::on(counter.clone());
        assert_eq!(scaled.micros_per_tick, Some(u64::MAX / 1_000 + 1));
        let by_quanta = SystemClock {
            micros_per_tick: None,
            ..scaled.clone()
        };
        let start = scaled.now();
        assert_eq!(by_quanta.now(), start);
        let mut elapsed = 0;
        for (step, micros) in [
            (999, 0),
            (1, 1),
            (1_500_000 - 1_000, 1_500),
            (86_400_000_000_000, 86_400_001_500),
            (365 * 86_400_000_000_000, 366 * 86_400_000_000 + 1_500),
        ] {
            mock.increment(step);
            elapsed += step;
            for c in [&scaled, &by_quanta] {
                let t = c.now().as_micros() - start.as_micros();
                assert_eq!(t, micros, "{elapsed} ns");
            }
        }
    }

    #[test]
    fn wall_clock_follows_the_system_time() {
        let c = WallClock::new();
        let before = duration_to_micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let t = c.now().as_micros();
        let after = duration_to_micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
        assert!(c.clone().now().as_micros() >= t);
    }

    /// A wall clock stepped back (NTP) leaves the time where it was until the clock catches up;
    /// every thread then reads times that never go back, and the latest is kept.
    #[test]
    fn a_wall_clock_stepped_back_stands_still() {
        let latest = AtomicU64::new(0);
        let reads: Vec<u64> = [10, 20, 15, 5, 20, 21, 30]
            .into_iter()
            .map(|r| never_back(&latest, r))
            .collect();
        assert_eq!(reads, [10, 20, 20, 20, 20, 21, 30]);

        let latest = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let latest = latest.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    for i in 0..100_000u64 {
                        // Each thread's readings go up and down by up to 7 around a rising line.
                        let reading = i + (i * (t + 3)) % 8;
                        let now = never_back(&latest, reading);
                        assert!(now >= last && now >= reading);
                        last = now;
                    }
                    last
                })
            })
            .collect();
        let lasts: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let max = latest.load(Ordering::Relaxed);
        assert!(lasts.iter().all(|&l| l <= max));
        assert!(max >= 99_999);
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
