//! A circuit breaker per layer: stop calling a failing store, and recover by itself.
//!
//! - **Closed**: every request asks the store. After `failure_threshold` consecutive failures
//!   (errors or timeouts) the circuit opens.
//! - **Open**: no request asks the store; each gets the policy's
//!   [`FailurePolicy`](crate::FailurePolicy) at once. After `cool_down` the next request is let
//!   through as the probe, and the circuit is half-open.
//! - **Half-open**: exactly one probe asks the store; the others are answered as when open. If the
//!   probe succeeds the circuit closes; if it fails, or is cancelled while it waits for the store
//!   (a caller's timeout), it opens again for another `cool_down`. A probe cancelled before its
//!   response future ran (its client went away at once) tells nothing about the store: the
//!   circuit stays open, cooled down, and the next request probes.
//!
//! Only answers that asked the store are evidence of its health. An answer from a cache in front
//! of the store (a [`DenialCache`](ratelimit_core::DenialCache) hit, a unit of a
//! [`Leasing`](ratelimit_core::Leasing) lease) comes marked
//! ([`Decision::is_cached`](ratelimit_core::Decision::is_cached)): it neither resets the failure
//! count nor closes the circuit (a probe answered that way hands the probe to the next request).
//! Every other answer counts, whether it had to wait or was ready at once: a store wrapper of
//! your own that answers some checks without asking the store marks those answers with
//! [`Decision::cached`](ratelimit_core::Decision::cached).
//! Failures always count.
//!
//! Time is read from the layer's [`ratelimit_core::Clock`], so tests drive it with a
//! `ManualClock` instead of sleeping.
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::CircuitBreaker;
//!
//! let breaker = CircuitBreaker::new(3, Duration::from_secs(5))?;
//! assert_eq!(breaker.failure_threshold(), 3);
//! # Ok::<(), tower_ratelimit::Error>(())
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{Clock, Timestamp};

use crate::Error;

/// Circuit-breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct CircuitBreaker {
    failure_threshold: u32,
    cool_down: Duration,
}

impl CircuitBreaker {
    /// Opens after `failure_threshold` consecutive failures (at least 1), for `cool_down` (at
    /// least 1 ms) before a probe.
    pub fn new(failure_threshold: u32, cool_down: Duration) -> Result<Self, Error> {
        if failure_threshold == 0 {
            return Err(Error::InvalidSetting {
                name: "failure_threshold",
                reason: "must be at least 1",
            });
        }
        if cool_down < Duration::from_millis(1) {
            return Err(Error::InvalidSetting {
                name: "cool_down",
                reason: "must be at least 1 ms",
            });
        }
        Ok(CircuitBreaker {
            failure_threshold,
            cool_down,
        })
    }

    /// Consecutive failures that open the circuit.
    #[must_use]
    pub const fn failure_threshold(&self) -> u32 {
        self.failure_threshold
    }

    /// How long the circuit stays open before a probe.
    #[must_use]
    pub const fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

impl Default for CircuitBreaker {
    /// 5 consecutive failures, 10 s cool-down.
    fn default() -> Self {
        CircuitBreaker {
            failure_threshold: 5,
            cool_down: Duration::from_secs(10),
        }
    }
}

/// The state of a circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Requests ask the store.
    Closed,
    /// Requests get the failure policy without asking the store.
    Open,
    /// One probe is asking the store.
    HalfOpen,
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
/// The state's bits in the breaker's word; the time it last opened (µs) is above them.
const STATE: u64 = 0b11;

/// Whether a request may ask the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Call,
    Probe,
    Reject,
}

pub(crate) struct Breaker {
    config: CircuitBreaker,
    /// The state and the time it last opened, in one word (`opened_at_µs << 2 | state`), so that
    /// the two always change together.
    word: AtomicU64,
    failures: AtomicU32,
    clock: Arc<dyn Clock>,
    gauge: metrics::Gauge,
    policy: Arc<str>,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("config", &self.config)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Breaker {
    pub(crate) fn new(
        config: CircuitBreaker,
        clock: Arc<dyn Clock>,
        gauge: metrics::Gauge,
        policy: Arc<str>,
    ) -> Breaker {
        Breaker {
            config,
            word: AtomicU64::new(CLOSED),
            failures: AtomicU32::new(0),
            clock,
            gauge,
            policy,
        }
    }

    pub(crate) fn state(&self) -> CircuitState {
        match self.word.load(Ordering::Acquire) & STATE {
            CLOSED => CircuitState::Closed,
            OPEN => CircuitState::Open,
            _ => CircuitState::HalfOpen,
        }
    }

    pub(crate) fn admit(&self) -> Admit {
        let word = self.word.load(Ordering::Acquire);
        match word & STATE {
            CLOSED => Admit::Call,
            OPEN => {
                let opened = Timestamp::from_micros(word >> 2);
                let cooled = self.clock.now().saturating_since(opened) >= self.config.cool_down;
                if cooled
                    && self
                        .word
                        .compare_exchange(
                            word,
                            (word & !STATE) | HALF_OPEN,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                {
                    self.gauge.set(HALF_OPEN as f64);
                    tracing::info!(policy = %self.policy, "rate-limit store circuit half-open: probing");
                    Admit::Probe
                } else {
                    Admit::Reject
                }
            }
            _ => Admit::Reject,
        }
    }

    pub(crate) fn success(&self, probe: bool) {
        if probe {
            self.failures.store(0, Ordering::Release);
            self.word.store(CLOSED, Ordering::Release);
            self.gauge.set(CLOSED as f64);
            tracing::info!(policy = %self.policy, "rate-limit store circuit closed");
        } else if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Release);
        }
    }

    pub(crate) fn failure(&self, probe: bool) {
        if probe {
            self.open(HALF_OPEN);
            return;
        }
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if n >= self.config.failure_threshold && self.state() == CircuitState::Closed {
            self.open(CLOSED);
        }
    }

    /// The probe was answered without asking the store: the circuit stays open, cooled down, so
    /// that the next request probes.
    pub(crate) fn probe_not_asked(&self) {
        let reopened = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & STATE == HALF_OPEN).then_some((w & !STATE) | OPEN)
            })
            .is_ok();
        if reopened {
            self.gauge.set(OPEN as f64);
        }
    }

    /// Opens the circuit if it is still in state `from` (a thread that saw it closed long ago
    /// must not re-open a circuit whose probe is out).
    fn open(&self, from: u64) {
        let stamped = (self.clock.now().as_micros().min(u64::MAX >> 2) << 2) | OPEN;
        let opened = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & STATE == from).then_some(stamped)
            })
            .is_ok();
        if !opened {
            // Someone else moved it: a late failure must not restart the cool-down either.
            return;
        }
        self.failures.store(0, Ordering::Release);
        self.gauge.set(OPEN as f64);
        tracing::warn!(
            policy = %self.policy,
            cool_down_ms = self.config.cool_down.as_millis() as u64,
            "rate-limit store circuit open"
        );
    }
}

/// Settles a probe dropped before its result is known. Dropped before the response future first
/// ran (its client went away at once), it says nothing about the store: the probe is handed on
/// (the circuit stays open, cooled down). Dropped while it was waiting for the store (a caller's
/// timeout shorter than the layer's), it counts as a failure, as the layer's own timeout would:
/// a store that stalls must not get a probe on every request.
pub(crate) struct ProbeGuard {
    breaker: Option<Arc<Breaker>>,
    waited: bool,
}

impl ProbeGuard {
    pub(crate) fn new(breaker: Option<Arc<Breaker>>) -> Self {
        ProbeGuard {
            breaker,
            waited: false,
        }
    }

    /// The response future runs: from now on a drop counts as a failure.
    pub(crate) fn waiting(&mut self) {
        self.waited = true;
    }

    pub(crate) fn disarm(&mut self) {
        self.breaker = None;
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            if self.waited {
                b.failure(true);
            } else {
                b.probe_not_asked();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::ManualClock;

    fn breaker(clock: &ManualClock) -> Breaker {
        Breaker::new(
            CircuitBreaker::new(2, Duration::from_secs(5)).unwrap(),
            Arc::new(clock.clone()),
            metrics::Gauge::noop(),
            "p".into(),
        )
    }

    #[test]
    fn opens_half_opens_and_closes() {
        let clock = ManualClock::new();
        let b = breaker(&clock);
        b.failure(false);
        assert_eq!(b.admit(), Admit::Call);
        b.success(false);
        b.failure(false);
        assert_eq!(b.state(), CircuitState::Closed, "success reset the count");
        b.failure(false);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(), Admit::Reject);
        clock.advance(Duration::from_secs(5));
        assert_eq!(b.admit(), Admit::Probe);
        assert_eq!(b.admit(), Admit::Reject, "one probe at a time");
        b.failure(true);
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(4));
        assert_eq!(b.admit(), Admit::Reject);
        clock.advance(Duration::from_secs(1));
        assert_eq!(b.admit(), Admit::Probe);
        b.success(true);
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.admit(), Admit::Call);
    }

    #[test]
    fn a_dropped_probe_hands_the_probe_on() {
        let clock = ManualClock::new();
        let b = Arc::new(breaker(&clock));
        b.failure(false);
        b.failure(false);
        clock.advance(Duration::from_secs(5));
        assert_eq!(b.admit(), Admit::Probe);
        drop(ProbeGuard::new(Some(b.clone())));
        assert_eq!(b.state(), CircuitState::Open);
        // Still cooled down: the next request probes, without another cool-down.
        assert_eq!(b.admit(), Admit::Probe);
        // A disarmed guard (the probe's answer came) changes nothing.
        let mut guard = ProbeGuard::new(Some(b.clone()));
        guard.disarm();
        drop(guard);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        // A probe dropped while it waited for the store counts as a failure: another cool-down.
        let mut guard = ProbeGuard::new(Some(b.clone()));
        guard.waiting();
        drop(guard);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(), Admit::Reject);
        clock.advance(Duration::from_secs(5));
        assert_eq!(b.admit(), Admit::Probe);
    }

    /// A request's failure checks that the circuit is closed, then opens it; between the two,
    /// other requests can open it, the cool-down pass and a probe go out. The late half of that
    /// failure must not re-open the circuit under the probe (the probe's success would be lost).
    /// A circuit opened, cooled down and probing, then the delayed second half of
    /// `failure(false)` from a request that saw it `CLOSED`.
    fn probing_then_a_late_failure(clock: &ManualClock) -> Breaker {
        let b = breaker(clock);
        b.failure(false);
        b.failure(false);
        clock.advance(Duration::from_secs(5));
        assert_eq!(b.admit(), Admit::Probe);
        b.open(CLOSED);
        b
    }

    #[test]
    fn a_failure_that_saw_the_circuit_closed_does_not_reopen_it_under_a_probe() {
        let clock = ManualClock::new();
        let b = probing_then_a_late_failure(&clock);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.success(true);
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// Nor does it restart the cool-down: once cooled, a circuit whose probe was answered without
    /// asking the store lets the next request probe at once.
    #[test]
    fn a_late_failure_does_not_restart_the_cool_down() {
        let clock = ManualClock::new();
        let b = probing_then_a_late_failure(&clock);
        b.probe_not_asked();
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(), Admit::Probe, "still cooled down");
    }

    #[test]
    fn settings_are_validated() {
        assert!(CircuitBreaker::new(0, Duration::from_secs(1)).is_err());
        assert!(CircuitBreaker::new(1, Duration::ZERO).is_err());
    }
}
