//! A circuit breaker per layer: stop calling a failing store, and recover by itself.
//!
//! The breaker keeps a circuit per failure domain of its store
//! ([`Store::failure_domains`](ratelimit_core::Store::failure_domains)): one for a single Redis
//! server, 64 ranges of hash slots for a Redis Cluster, whose masters fail apart. Each circuit
//! counts the failures of its own keys and opens, probes and closes by itself, as below, so that a
//! master lost stops the checks of its own keys only.
//!
//! - **Closed**: every request asks the store. After `failure_threshold` consecutive failures
//!   (errors or timeouts; no success in between, each within `cool_down` of the one before) the
//!   circuit opens. A failure more than a cool-down after the last starts a new count: failures
//!   that come far apart (a route with little traffic, a failure now and then) open nothing,
//!   while a store that fails for a whole cool-down opens the circuit even for a request every
//!   few seconds.
//! - **Open**: no request asks the store; each gets the policy's
//!   [`FailurePolicy`](crate::FailurePolicy) at once. After `cool_down` the next request is let
//!   through as the probe, and the circuit is half-open.
//! - **Half-open**: exactly one probe asks the store; the others are answered as when open. If the
//!   probe succeeds the circuit closes; if it fails or times out, it opens again for another
//!   `cool_down`. Only the store decides: a probe whose request is dropped before the store
//!   answered (its client went away, or a caller's timeout fired) runs on in a task of its own,
//!   under the layer's timeout, and its answer settles the circuit, so clients that cancel their
//!   requests cannot keep it open. (The task runs on the runtime current at the drop if it is a
//!   multi-thread one, else on the runtime the layer was built on if that is a multi-thread
//!   runtime still running, else on the current one: a current-thread runtime whose `block_on`
//!   returned would leave it unpolled, the circuit half-open until the probe is taken as lost.
//!   With no runtime to take it, the probe is handed on: the circuit stays open, cooled down,
//!   and the next request probes.) A probe that
//!   nothing settles within a cool-down, or twice the layer's timeout if that is longer (its
//!   store panicked before there was a check to wait for), is taken as lost, and the next
//!   request probes again; a probe still waiting for the store is never doubled. A probe taken as
//!   lost that answers after all closes the circuit only if it is still half-open.
//!
//! Only answers that asked the store are evidence of its health. An answer from a cache in front
//! of the store (a [`DenialCache`](ratelimit_core::DenialCache) hit, a unit of a
//! [`Leasing`](ratelimit_core::Leasing) lease) comes marked
//! ([`Decision::is_cached`](ratelimit_core::Decision::is_cached)): it neither resets the failure
//! count nor closes the circuit (a probe answered that way hands the probe to the next request,
//! which takes it without logging or publishing the circuit half-open again: a key answered from
//! a cache would otherwise do so at every request).
//! Every other answer counts, whether it had to wait or was ready at once: a store wrapper of
//! your own that answers some checks without asking the store marks those answers with
//! [`Decision::cached`](ratelimit_core::Decision::cached).
//! While a key's circuit is open the store is not asked, but such a cache still answers before
//! the failure policy does ([`Store::check_cached`](ratelimit_core::Store::check_cached)): a
//! client the denial cache knows to be over its limit is denied (not let through by
//! `FailOpen`, nor answered 503 by `FailClosed`), and a unit of a live lease is spent.
//! Failures count, and so do those of checks whose requests were dropped: in any state, a check
//! dropped before the store answered runs on to the layer's timeout in a task of its own, and its
//! answer or timeout counts as it would have for the request. So callers that give up sooner than
//! the layer's timeout (a gRPC deadline, an outer timeout) still open the circuit over a hanging
//! store, instead of each waiting on it until it gives up while the failure policy never acts.
//! Left uncounted: a lost probe's failure that arrives after another probe was sent (older
//! evidence than that probe's), and a dropped check with no runtime to finish it on (neither the
//! layer's nor one current at the drop); and the failure of a check sent before its circuit last closed (one that times out after
//! the probe that closed it, its timer late on a loaded machine, or sent just before the
//! opening with a cool-down near the timeout): older evidence than that probe's, it would
//! otherwise open a circuit over a store that had just answered.
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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use ratelimit_core::{Clock, Decision, Timestamp};

use crate::log_gate::LogGate;
use crate::metrics::{FailureKind, Metrics};

use crate::Error;

/// Circuit-breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct CircuitBreaker {
    failure_threshold: u32,
    cool_down: Duration,
    per_failure_domain: bool,
}

/// The largest [`CircuitBreaker::new`] takes: a million failures in a row. (A breaker that
/// should never open is no breaker: leave it out.)
pub const MAX_FAILURE_THRESHOLD: u32 = 1_000_000;

impl CircuitBreaker {
    /// A circuit opens after `failure_threshold` consecutive failures of its keys (1 to
    /// [`MAX_FAILURE_THRESHOLD`]), each within `cool_down` of the one before, for `cool_down`
    /// (between 1 ms and one hour: a longer one would leave a tripped circuit open, and its
    /// requests answered by the failure policy, for as good as ever) before a probe.
    pub fn new(failure_threshold: u32, cool_down: Duration) -> Result<Self, Error> {
        if failure_threshold == 0 || failure_threshold > MAX_FAILURE_THRESHOLD {
            return Err(Error::InvalidSetting {
                name: "failure_threshold",
                reason: "must be from 1 to 1,000,000",
            });
        }
        if cool_down < Duration::from_millis(1) || cool_down > Duration::from_secs(3_600) {
            return Err(Error::InvalidSetting {
                name: "cool_down",
                reason: "must be between 1 ms and one hour",
            });
        }
        Ok(CircuitBreaker {
            failure_threshold,
            cool_down,
            per_failure_domain: true,
        })
    }

    /// One circuit for the whole store, whatever its failure domains. By default a layer keeps
    /// a circuit per failure domain of its store (a Redis Cluster's 64 ranges of hash slots), so
    /// that one master lost stops its own keys only; but while the whole store is down, each of
    /// those circuits probes with the first of its keys' requests after every cool-down. A
    /// gateway with little traffic then probes with a large share of its requests (at R requests
    /// a second and a cool-down of C seconds, about 64 / (R × C) of them), each waiting the
    /// timeout; with one circuit, one request per cool-down does. See docs/operations.md.
    pub fn single_circuit(mut self) -> Self {
        self.per_failure_domain = false;
        self
    }

    /// Whether the layer keeps a circuit per failure domain of its store (the default; see
    /// [`single_circuit`](CircuitBreaker::single_circuit)).
    #[must_use]
    pub const fn per_failure_domain(&self) -> bool {
        self.per_failure_domain
    }

    /// Consecutive failures that open the circuit (each within a cool-down of the one before).
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
    /// 5 consecutive failures, 10 s cool-down, a circuit per failure domain of the store.
    fn default() -> Self {
        CircuitBreaker {
            failure_threshold: 5,
            cool_down: Duration::from_secs(10),
            per_failure_domain: true,
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

/// The most circuits a breaker keeps (one per failure domain of its store); a store that names
/// more shares them out (domain modulo this).
const MAX_FAILURE_DOMAINS: usize = 4096;

/// The state a word (or state bits) holds.
fn state_of(word: u64) -> CircuitState {
    match word & STATE {
        CLOSED => CircuitState::Closed,
        OPEN => CircuitState::Open,
        _ => CircuitState::HalfOpen,
    }
}

/// The bits of [`Part::failures`] that count the failures in a row: up to 2²⁰ − 1, more than
/// [`MAX_FAILURE_THRESHOLD`].
const COUNT_BITS: u32 = 20;
const COUNT: u64 = (1 << COUNT_BITS) - 1;
/// The time of the last failure, in microseconds modulo 2⁴⁴ (203 days): two failures count in a
/// row only within a cool-down of each other (at most an hour), either way round the wrap.
const TIME: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// `t` as [`Part::failures`] keeps it.
fn failure_time(t: Timestamp) -> u64 {
    t.as_micros() & TIME
}

/// `t` in the breaker's word, above the state's bits and [`QUIET`].
fn stamp(t: Timestamp) -> u64 {
    t.as_micros().min(u64::MAX >> 3) << 3
}

/// When the state in `word` began (what [`stamp`] put there).
fn stamped_at(word: u64) -> Timestamp {
    Timestamp::from_micros(word >> 3)
}

/// What is left of `wait` begun at `since`, at `now`. A state begun after `now` means the clock
/// was set back (each state is stamped with a time read before it is seen): it counts as waited
/// out, or a circuit opened before a step back of an hour would stay open for that hour.
fn left_of_wait(since: Timestamp, now: Timestamp, wait: Duration) -> Duration {
    if since > now {
        return Duration::ZERO;
    }
    wait.saturating_sub(now.saturating_since(since))
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
/// The state's bits in the breaker's word; when the state began (µs: opened, or the probe sent)
/// is above them and [`QUIET`].
const STATE: u64 = 0b11;
/// Set on an open circuit whose probe was handed on (answered from a cache in front of the
/// store, or dropped with no runtime to finish its check on: see [`Breaker::probe_not_asked`]),
/// and on the probe taken from it: taking that probe is not news (not logged, not published,
/// and counted as open by the gauge), so that a key answered from a cache cannot log and publish
/// a half-open circuit at every request. An opening clears it.
const QUIET: u64 = 0b100;

/// The closes as a check answered at once saw them: all of them (its failure counts).
pub(crate) const FRESH: u64 = u64::MAX;

/// Whether a request may ask the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Call,
    Probe(Probe),
    Reject,
}

/// A probe: the breaker's word when it went out (half-open, stamped with its sending). Its
/// failure re-opens the circuit only while the word is still its own, so that a probe taken as
/// lost and settled late cannot re-open the circuit under the probe sent after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe(std::num::NonZeroU64);

pub(crate) struct Breaker {
    config: CircuitBreaker,
    /// Failures of checks settled in the background (their requests dropped) and of store
    /// futures that panicked while waited for, by [`FailureKind`] (`Error`, `Timeout`): counted
    /// here, as the layer counts those of the requests it answers.
    errors: [metrics::Counter; 2],
    /// One circuit per failure domain of the store ([`Store::failure_domains`]).
    parts: Box<[Part]>,
    /// How long a probe may stay unsettled before it is taken as lost: a cool-down, and never
    /// less than twice the layer's timeout (a probe waits for the store at most one timeout; the
    /// second allows for a timer that fires late on a loaded machine), so that a probe still
    /// waiting for its answer is never doubled.
    lost_after: Duration,
    clock: Arc<dyn Clock>,
    gauge: metrics::Gauge,
    not_closed: metrics::Gauge,
    /// How many parts are not closed, plus how many count failures: while it is 0 (a healthy
    /// store), a check need not find its key's part (a store's `failure_domain` may hash the
    /// key), unless it fails. Each change of a part is counted once, by the atomic operation that
    /// makes it; a part's count is raised *before* the change that makes it dirty (opening, its
    /// first failure) and lowered *after* the one that makes it clean (closing, its failures
    /// cleared), so that a reader that finds 0 found every part closed and counting nothing at
    /// that moment. (Transiently it may be above the truth, never below for long: the safe side.)
    dirty: AtomicI64,
    /// How many times a probe has closed a circuit (any part's): what a check made now has
    /// seen ([`seen`](Breaker::seen)), so that its failure can be told from one older than its
    /// part's last close (see [`Part::closed_at`]).
    closes: AtomicU64,
    policy: Arc<str>,
    /// The runtime the layer was built on, where a check dropped before its answer may run on
    /// (see [`crate::home`]).
    home: crate::home::Home,
    /// The line of a check that failed after its request was dropped: one a second at most, as
    /// the layer's own failure lines (when every request's client gives up before the layer's
    /// timeout, each failure is one of these).
    dropped_failed_log: LogGate,
}

/// The circuit of one failure domain.
#[derive(Default)]
struct Part {
    /// The state and when it began (opened; or half-open, when the probe went out), in one word
    /// (`since_µs << 3 | quiet | state`), so that the two always change together.
    word: AtomicU64,
    /// The failures counted in a row (the low [`COUNT_BITS`]) and when the last came (the rest,
    /// in microseconds of the clock, modulo 2⁴⁴), in one word, so that a failure reads and
    /// writes both at once; 0 while none is counted.
    failures: AtomicU64,
    /// [`Breaker::closes`] as this part's last close left it: a check made before it (its `seen`
    /// below this) was sent before the circuit opened, and its failure, however late it
    /// comes (a timer late on a loaded machine), is older evidence than the probe that closed the
    /// circuit: it counts for nothing.
    closed_at: AtomicU64,
    /// Held by a failure counted from closed (its test that the circuit is closed and has not
    /// closed since its check was made, its count, and the opening it may make) and by a probe's
    /// close: one cannot fall between the other's steps. Without it, a failure that passed its
    /// test and was preempted could be counted after the circuit opened, cooled down and closed
    /// again meanwhile (older evidence than the probe that closed it, counted in the new streak),
    /// or re-open that circuit, over a store whose probe had just answered. Neither path is a
    /// request's path while the store answers: only failures and closes take it.
    turn: Mutex<()>,
}

impl Part {
    fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("config", &self.config)
            .field("state", &self.state())
            .field("parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// How long until part `part`'s circuit lets the store be asked again: `None` while it is
    /// closed (the next request asks), what is left of the cool-down while it is open, and zero
    /// while half-open (the probe out is answered within the layer's timeout, or, lost, is sent
    /// again after `lost_after`).
    pub(crate) fn next_probe_in(&self, part: usize) -> Option<Duration> {
        let word = self.part(part).word.load(Ordering::Acquire);
        match word & STATE {
            CLOSED => None,
            OPEN => Some(left_of_wait(
                stamped_at(word),
                self.clock.now(),
                self.config.cool_down,
            )),
            _ => Some(Duration::ZERO),
        }
    }

    /// The breaker of a store with `failure_domains` of them (`Store::failure_domains`): a
    /// circuit per domain, or one if `config` says so (`single_circuit`).
    pub(crate) fn new(
        config: CircuitBreaker,
        timeout: Duration,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
        policy: Arc<str>,
        failure_domains: usize,
    ) -> Breaker {
        let parts = if config.per_failure_domain() {
            failure_domains
        } else {
            1
        };
        let gauge = Metrics::circuit_gauge(&policy);
        gauge.set(CLOSED as f64);
        let not_closed = Metrics::circuits_not_closed_gauge(&policy);
        not_closed.set(0.0);
        Breaker {
            config,
            errors: [
                metrics.failure_counter(FailureKind::Error),
                metrics.failure_counter(FailureKind::Timeout),
            ],
            parts: (0..parts.clamp(1, MAX_FAILURE_DOMAINS))
                .map(|_| Part::default())
                .collect(),
            lost_after: config.cool_down.max(timeout.saturating_mul(2)),
            dropped_failed_log: LogGate::new(clock.clone()),
            clock,
            gauge,
            not_closed,
            dirty: AtomicI64::new(0),
            closes: AtomicU64::new(0),
            policy,
            home: crate::home::Home::current(),
        }
    }

    /// How many circuits: one per failure domain of the store.
    pub(crate) fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The closes so far, as a check made now has seen them: passed back with its failure.
    pub(crate) fn seen(&self) -> u64 {
        self.closes.load(Ordering::SeqCst)
    }

    /// Whether every circuit is closed and counts no failure: a check's part then matters only
    /// if it fails.
    pub(crate) fn is_clean(&self) -> bool {
        self.dirty.load(Ordering::Acquire) == 0
    }

    /// Clears part `part`'s failure count.
    fn clear_failures(&self, part: &Part) {
        if part.failures.load(Ordering::Relaxed) != 0
            && part.failures.swap(0, Ordering::AcqRel) != 0
        {
            self.dirty.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Part `part`'s circuit (`part` is taken modulo the number of parts: a store that names a
    /// domain out of its own range gets a circuit all the same, not a panic).
    fn part(&self, part: usize) -> &Part {
        self.indexed(part).1
    }

    /// Part `part`'s index (modulo the number of parts, as [`part`](Breaker::part)) and circuit.
    fn indexed(&self, part: usize) -> (usize, &Part) {
        let index = part % self.parts.len();
        (index, &self.parts[index])
    }

    /// The state of the whole, as the gauge shows it (open if any part is open, else half-open if
    /// any is, else closed), and how many parts are not closed: one pass over the parts. A part
    /// whose quiet probe is out ([`QUIET`]) counts as open, as published when its first probe
    /// was handed on.
    fn summary(&self) -> (u64, usize) {
        let (mut open, mut half_open) = (0, 0);
        for p in &*self.parts {
            let word = p.word.load(Ordering::Acquire);
            match word & STATE {
                OPEN => open += 1,
                HALF_OPEN if word & QUIET != 0 => open += 1,
                HALF_OPEN => half_open += 1,
                _ => {}
            }
        }
        let state = match (open, half_open) {
            (0, 0) => CLOSED,
            (0, _) => HALF_OPEN,
            _ => OPEN,
        };
        (state, open + half_open)
    }

    /// Sets the gauges to the state, after a transition. Transitions and gauge writes of two
    /// threads can interleave (one closes, another opens, and the closer's write lands last): each
    /// writer reads the state again after writing and writes again if it moved, so the last write
    /// follows the last transition and the gauges end on the state.
    fn publish(&self) {
        loop {
            let summary = self.summary();
            self.gauge.set(summary.0 as f64);
            self.not_closed.set(summary.1 as f64);
            // The re-read must not move before the gauges' writes.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.summary() == summary {
                return;
            }
        }
    }

    /// The state of the whole: open if any part is open, else half-open if any is, else closed.
    pub(crate) fn state(&self) -> CircuitState {
        state_of(self.summary().0)
    }

    /// The state of part `part`'s circuit.
    pub(crate) fn part_state(&self, part: usize) -> CircuitState {
        state_of(self.part(part).word.load(Ordering::Acquire))
    }

    /// How many parts' circuits are not closed.
    pub(crate) fn parts_not_closed(&self) -> usize {
        self.summary().1
    }

    /// Whether a part whose word is `word` still waits at `now` before a check may probe it: open
    /// and cooling down, or half-open with its probe out for less than `lost_after`.
    fn waits(&self, word: u64, now: Timestamp) -> bool {
        let wait = if word & STATE == OPEN {
            self.config.cool_down
        } else {
            self.lost_after
        };
        !left_of_wait(stamped_at(word), now, wait).is_zero()
    }

    /// Whether [`admit`](Breaker::admit) would reject a check of part `part` now, without taking
    /// a probe: for a check made now and sent later, which is admitted when it is sent.
    pub(crate) fn rejects(&self, part: usize) -> bool {
        let word = self.part(part).word.load(Ordering::Acquire);
        word & STATE != CLOSED && self.waits(word, self.clock.now())
    }

    pub(crate) fn admit(&self, part: usize) -> Admit {
        let (index, part) = self.indexed(part);
        let word = part.word.load(Ordering::Acquire);
        match word & STATE {
            CLOSED => Admit::Call,
            // Open: the first request after the cool-down probes. Half-open: the probe is out;
            // one that has had no answer for `lost_after` (a cool-down, or twice the timeout if
            // longer) is taken as lost (its request's task panicked, say, with nothing left to
            // settle it) and the next request probes again, so that no lost probe can keep the
            // circuit from closing.
            state => {
                let now = self.clock.now();
                if self.waits(word, now) {
                    return Admit::Reject;
                }
                let probe = stamp(now) | (word & QUIET) | HALF_OPEN;
                #[cfg(test)]
                tests::widen_the_race();
                let probing = part
                    .word
                    .compare_exchange(word, probe, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                let Some(probe) = probing.then_some(probe).and_then(std::num::NonZeroU64::new)
                else {
                    return Admit::Reject;
                };
                // A probe handed on (quiet) is not news: the circuit was logged and published
                // half-open when its first probe went out, and open again when that one was
                // handed on.
                if state == OPEN && word & QUIET == 0 {
                    self.publish();
                    tracing::info!(
                        policy = %self.policy,
                        domain = index,
                        "rate-limit store circuit half-open: probing"
                    );
                } else if state != OPEN {
                    tracing::warn!(
                        policy = %self.policy,
                        domain = index,
                        lost_after_ms = self.lost_after.as_millis() as u64,
                        "rate-limit store probe settled by nothing: probing again"
                    );
                }
                Admit::Probe(Probe(probe))
            }
        }
    }

    pub(crate) fn success(&self, part: usize, probe: Option<Probe>) {
        let (index, part) = self.indexed(part);
        if probe.is_some() {
            // Only a half-open circuit closes: a probe taken as lost that answers after the one
            // sent after it failed (its future polled late) would close a circuit opened on
            // newer evidence. Any probe's success closes it: the store answered.
            // The close, its mark and the failures cleared as one step for a failure counted
            // from closed (see `Part::turn`).
            let turn = part.turn();
            let closed = part
                .word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    (w & STATE == HALF_OPEN).then_some(CLOSED)
                })
                .is_ok();
            if closed {
                #[cfg(test)]
                tests::hold("close");
                // After the close, so that only a close that happened marks the checks sent
                // before it (a check made in between reads the count before this: its failure,
                // should it come, is taken for an older one).
                let closes = self.closes.fetch_add(1, Ordering::SeqCst) + 1;
                // The largest: a close stalled here must not set back a later one's.
                part.closed_at.fetch_max(closes, Ordering::SeqCst);
                self.dirty.fetch_sub(1, Ordering::AcqRel);
                self.clear_failures(part);
                drop(turn);
                self.publish();
                tracing::info!(
                    policy = %self.policy,
                    domain = index,
                    "rate-limit store circuit closed"
                );
                return;
            }
            if part.word.load(Ordering::Acquire) & STATE != CLOSED {
                return;
            }
            // Closed already (by the probe sent before it, answering late): a success like any
            // other.
        }
        self.clear_failures(part);
    }

    /// The store answered `d`: evidence of its health unless it came from a cache in front of
    /// it (then a probe is handed on).
    pub(crate) fn answered(&self, part: usize, d: &Decision, probe: Option<Probe>) {
        if !d.is_cached() {
            self.success(part, probe);
        } else if let Some(probe) = probe {
            self.probe_not_asked(part, probe);
        }
    }

    /// A check failed: `seen` is what it saw when it was made ([`seen`](Breaker::seen)), or
    /// [`FRESH`].
    pub(crate) fn failure(&self, part: usize, probe: Option<Probe>, seen: u64) {
        if let Some(probe) = probe {
            // Only this probe's circuit re-opens: one taken as lost and failing late (its future
            // polled after the timeout) would otherwise re-open it under the probe sent after it,
            // whose success would then find it open and be lost, leaving a healthy store's
            // circuit open for another cool-down.
            self.open(part, probe.0.get());
            return;
        }
        let circuit = self.part(part);
        let stale = || {
            circuit.closed_at.load(Ordering::SeqCst) > seen
                || circuit.word.load(Ordering::Acquire) & STATE != CLOSED
        };
        // Sent before the circuit last closed: older evidence than the probe that closed it. Or
        // the circuit is open, or its probe out: only the probe's answer counts then (failures
        // counted meanwhile would all be cleared at the close, and one counted as it closes could
        // open it again at once). Tested without the part's turn first (a store that is down
        // fails every request while its circuit is open), then again holding it, until the
        // count and the opening are done: no close comes in between.
        if stale() {
            return;
        }
        let turn = circuit.turn();
        if stale() {
            return;
        }
        // Raised first (see `dirty`), and lowered again unless this was the part's first.
        self.dirty.fetch_add(1, Ordering::AcqRel);
        let window = u64::try_from(self.config.cool_down.as_micros()).unwrap_or(u64::MAX);
        let mut n = 0;
        let before = circuit
            .failures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                // Read at each attempt: one whose compare-and-swap failed (another failure came
                // in between) reads it again, so that a thread preempted after reading it never
                // writes an older time over a later failure's.
                let now = failure_time(self.clock.now());
                #[cfg(test)]
                tests::hold("failure");
                let (count, last) = (f & COUNT, f >> COUNT_BITS);
                // Within a cool-down of the last, either way: another thread's failure, stamped
                // just after this one read the clock, is as recent as this one. Only a streak's
                // last failure counts (a word with none holds time 0), and only a recent one
                // earlier than this failure keeps its time: else this failure's is kept, so that
                // an old time, read across the wrap of 2⁴⁴ µs, never stays.
                let gap = now.wrapping_sub(last) & TIME;
                let back = last.wrapping_sub(now) & TIME;
                let recent = count != 0 && gap.min(back) <= window;
                let streak = if recent { count } else { 0 };
                n = (streak + 1).min(COUNT);
                let at = if recent && back < gap { last } else { now };
                Some((at << COUNT_BITS) | n)
            })
            .unwrap_or_else(|f| f);
        if before != 0 {
            self.dirty.fetch_sub(1, Ordering::AcqRel);
        }
        if n >= u64::from(self.config.failure_threshold)
            && circuit.word.load(Ordering::Acquire) & STATE == CLOSED
            && self.turn_open(part, CLOSED)
        {
            // Told once the turn is let go: a subscriber's or a recorder's time (a log line
            // written to a slow terminal) is not another failure's wait.
            drop(turn);
            self.opened(part);
        }
    }

    /// A failure that no request's answer counts (a check settled in a task after its request
    /// was dropped, or a store future that panicked): counted here, in `errors` and the circuit.
    fn failure_unseen(&self, kind: FailureKind, part: usize, probe: Option<Probe>, seen: u64) {
        self.errors[kind as usize].increment(1);
        self.failure(part, probe, seen);
    }

    /// The probe was answered without asking the store: the circuit stays open, cooled down, so
    /// that the next request probes (unless another probe went out since), quietly ([`QUIET`]).
    pub(crate) fn probe_not_asked(&self, part: usize, probe: Probe) {
        // Stamped a cool-down ago: cooled down already, so that the next request probes.
        let cool_down = u64::try_from(self.config.cool_down.as_micros()).unwrap_or(u64::MAX);
        let cooled = stamp(Timestamp::from_micros(
            self.clock.now().as_micros().saturating_sub(cool_down),
        ));
        let reopened = self
            .part(part)
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w == probe.0.get()).then_some(cooled | QUIET | OPEN)
            })
            .is_ok();
        // A quiet probe's taking was not published: the published state is still open.
        if reopened && probe.0.get() & QUIET == 0 {
            self.publish();
        }
    }

    /// Opens the circuit if it is still `from`: closed (`CLOSED`, a thread that saw it closed long
    /// ago must not re-open a circuit whose probe is out), or a probe's own word.
    fn open(&self, part: usize, from: u64) {
        if self.turn_open(part, from) {
            self.opened(part);
        }
    }

    /// [`open`](Breaker::open)'s change of state, without its news: whether it opened.
    fn turn_open(&self, part: usize, from: u64) -> bool {
        let part = self.part(part);
        let stamped = stamp(self.clock.now()) | OPEN;
        // An opening from closed makes the part dirty: counted first (see `dirty`).
        if from == CLOSED {
            self.dirty.fetch_add(1, Ordering::AcqRel);
        }
        let opened = part
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let still = if from == CLOSED {
                    w & STATE == CLOSED
                } else {
                    w == from
                };
                still.then_some(stamped)
            })
            .is_ok();
        if !opened {
            if from == CLOSED {
                self.dirty.fetch_sub(1, Ordering::AcqRel);
            }
            // Someone else moved it: a late failure must not restart the cool-down either.
            return false;
        }
        self.clear_failures(part);
        true
    }

    /// The news of an opening: the gauges, and a log line.
    fn opened(&self, part: usize) {
        let (index, _) = self.indexed(part);
        self.publish();
        tracing::warn!(
            policy = %self.policy,
            domain = index,
            circuits_not_closed = self.parts_not_closed(),
            circuits = self.parts.len(),
            cool_down_ms = self.config.cool_down.as_millis() as u64,
            "rate-limit store circuit open"
        );
    }
}

/// A store's check as a waiting request holds it: one name for the bounds that `BreakerCheck`
/// and the layer's waiting future would each write out (pin-project-lite takes no `+` in them).
pub(crate) trait StoreCheck:
    Future<Output = Result<Decision, Self::Error>> + Send + Unpin + 'static
{
    /// The store's error.
    type Error: Send + 'static;
}

impl<F, E> StoreCheck for F
where
    F: Future<Output = Result<Decision, E>> + Send + Unpin + 'static,
    E: Send + 'static,
{
    type Error = E;
}

pin_project_lite::pin_project! {
    /// A store check with the layer's timeout, whose answer settles the breaker even if its request is
    /// dropped first: the future a waiting request awaits, when the layer has a breaker.
    ///
    /// Dropped before the store answered (the client went away, or a caller's timeout shorter than
    /// the layer's fired), it does not guess: the check (its command already sent by the poll in
    /// `call`, or by the first poll of `Guarded`'s, which makes this there) runs on in a task of
    /// its own, under the same timeout (counted from when the check was sent, not started again),
    /// and the store's answer or timeout counts as it would have for the request. So clients
    /// cannot decide the circuit's state by cancelling: a probe they cancel is still settled by
    /// the store, and checks they cancel over a hanging store still time out and open the circuit
    /// (callers with deadlines shorter than the layer's timeout, a gRPC deadline or an outer
    /// timeout, would otherwise wait on a hung store for ever, the failure policy never acting).
    /// The task runs on the runtime current at the drop if it is a multi-thread one, else on the
    /// runtime the layer was built on if that is a multi-thread runtime still running, else on
    /// the current one (see [`crate::home`]: a current-thread runtime whose `block_on` returned
    /// would leave it unpolled). Where none can take it (no runtime current at the drop, even
    /// one made by a panic of the caller's), or the task is dropped while it waits or unrun (its
    /// runtime shutting down, even by a panic's unwinding), a probe is handed on (the circuit
    /// stays open, cooled down, and the next request probes) and any other check counts for
    /// nothing.
    pub(crate) struct BreakerCheck<F>
    where
        F: StoreCheck,
    {
        breaker: Arc<Breaker>,
        // The circuit it goes through: its key's failure domain.
        part: usize,
        // The probe this check is, if the circuit sent it half-open.
        probe: Option<Probe>,
        // The closes it saw when it was made, which is when it was sent (see `Breaker::seen`).
        seen: u64,
        // The layer's timeout, counted from the check's making, which is when it was sent (the
        // layer's first poll of the store's check in `call`, `Guarded`'s first poll): neither a
        // later poll nor a drop starts it again, and a probe is settled within a timeout of being
        // sent.
        deadline: tokio::time::Instant,
        // The store's check until it is answered or cut; taken out while it is polled, so that
        // a check whose poll panics is not run on by the drop.
        check: Option<F>,
        // The timer, made at the first poll (making the check needs no runtime). In place, not
        // boxed: a drop moves only the check into its task, with a timer of its own at the same
        // deadline.
        #[pin]
        timer: Option<tokio::time::Sleep>,
    }

    impl<F> PinnedDrop for BreakerCheck<F>
    where
        F: StoreCheck,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let Some(check) = this.check.take() else {
                return;
            };
            let mut unsettled = Unsettled {
                held: Some((this.breaker.clone(), *this.part, *this.probe, *this.seen)),
                polling: false,
            };
            let deadline = *this.deadline;
            let mut check = check;
            let task = async move {
                // The timer is made in the task (a runtime without timers panics there, not in a
                // drop), and only if the check has no answer yet.
                let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
                let answer = std::future::poll_fn(|cx| {
                    // Set while the check, or the timer, is polled: a panic meanwhile is the
                    // check's (see `Unsettled`).
                    unsettled.polling = true;
                    let polled = match Pin::new(&mut check).poll(cx) {
                        Poll::Ready(answer) => Poll::Ready(Ok(answer)),
                        Poll::Pending => timer
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)))
                            .as_mut()
                            .poll(cx)
                            .map(|()| Err(TimedOut)),
                    };
                    unsettled.polling = false;
                    polled
                })
                .await;
                unsettled.settle(answer);
            };
            // No runtime to finish the check on (`call` needs none): dropped unrun, it counts
            // for nothing, and a probe is handed on; even if dropped by a panic of the caller's,
            // which says nothing of the store.
            let _ = this.breaker.home.spawn(task);
        }
    }
}

/// A check cut at its deadline.
#[derive(Debug)]
pub(crate) struct TimedOut;

impl<F> BreakerCheck<F>
where
    F: StoreCheck,
{
    /// The breaker's hold on `check`, sent now (polled once, its command sent; or about to be, by
    /// the poll that makes this): dropped before its answer, even unpolled since, it runs on in a
    /// task of its own.
    pub(crate) fn new(
        breaker: Arc<Breaker>,
        part: usize,
        probe: Option<Probe>,
        seen: u64,
        check: F,
        timeout: Duration,
    ) -> Self {
        BreakerCheck {
            breaker,
            part,
            probe,
            seen,
            deadline: tokio::time::Instant::now() + timeout,
            check: Some(check),
            timer: None,
        }
    }
}

impl<F> Future for BreakerCheck<F>
where
    F: StoreCheck,
{
    type Output = Result<Result<Decision, F::Error>, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Should the store's future (or making the timer) panic, the check counts as failed as
        // the panic unwinds (a probe is not left half-open with nothing to settle it).
        let _on_panic = FailOnPanic(this.breaker, *this.part, *this.probe, *this.seen);
        let mut check = this
            .check
            .take()
            .expect("BreakerCheck polled after completion");
        // The check first, as `timeout_at` does: an answer that came before a late poll wins.
        // (The caller settles the check with the answer: `after_check`, `after_timeout`.)
        if let Poll::Ready(answer) = Pin::new(&mut check).poll(cx) {
            return Poll::Ready(Ok(answer));
        }
        if this.timer.is_none() {
            this.timer
                .set(Some(tokio::time::sleep_until(*this.deadline)));
        }
        match this.timer.as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Pending) => {
                *this.check = Some(check);
                Poll::Pending
            }
            _ => Poll::Ready(Err(TimedOut)),
        }
    }
}

/// Counts the check as failed if dropped while its thread panics (a poll of its store's future
/// panicked): the request's future unwinds without reaching the layer's own count.
struct FailOnPanic<'a>(&'a Breaker, usize, Option<Probe>, u64);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .failure_unseen(FailureKind::Error, self.1, self.2, self.3);
        }
    }
}

/// A check (a probe, or not) whose answer is still to come: settled by it, or, if dropped without
/// one, a probe is handed on.
struct Unsettled {
    held: Option<(Arc<Breaker>, usize, Option<Probe>, u64)>,
    /// Set while its task polls the check or its timer: dropped while its thread panics then, the
    /// check (its store's future, or making the timer) panicked; otherwise the task was dropped
    /// between polls or unrun, by the unwinding of a panic that says nothing of the store (a
    /// runtime dropped by it).
    polling: bool,
}

impl Unsettled {
    fn settle<E>(&mut self, answer: Result<Result<Decision, E>, TimedOut>) {
        let Some((b, part, probe, seen)) = self.held.take() else {
            return;
        };
        let kind = match answer {
            Ok(Ok(d)) => {
                b.answered(part, &d, probe);
                tracing::debug!(
                    policy = %b.policy,
                    probe = probe.is_some(),
                    domain = part,
                    state = ?b.part_state(part),
                    "rate-limit store check settled after its request was dropped"
                );
                return;
            }
            Ok(Err(_)) => FailureKind::Error,
            Err(_) => FailureKind::Timeout,
        };
        b.failure_unseen(kind, part, probe, seen);
        if let Some(held_back) = b.dropped_failed_log.pass() {
            tracing::warn!(
                policy = %b.policy,
                probe = probe.is_some(),
                domain = part,
                kind = kind.as_str(),
                held_back,
                "rate-limit store check failed (its request was dropped before the answer)"
            );
        }
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some((b, part, probe, seen)) = self.held.take() {
            if self.polling && std::thread::panicking() {
                // The check panicked in its task: a failure, as in the request's own future.
                b.failure_unseen(FailureKind::Error, part, probe, seen);
            } else if let Some(probe) = probe {
                b.probe_not_asked(part, probe);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::ManualClock;

    /// A breaker of 2 failures and a 5 s cool-down, for a layer timeout of 50 ms, of `parts`
    /// circuits.
    fn breaker_of(clock: &ManualClock, parts: usize) -> Breaker {
        breaker_opened_by(clock, 2, parts)
    }

    /// The same, its circuits opened by `failures` in a row.
    fn breaker_opened_by(clock: &ManualClock, failures: u32, parts: usize) -> Breaker {
        Breaker::new(
            CircuitBreaker::new(failures, Duration::from_secs(5)).unwrap(),
            Duration::from_millis(50),
            Arc::new(clock.clone()),
            &Metrics::new("p", std::iter::empty()),
            "p".into(),
            parts,
        )
    }

    fn breaker(clock: &ManualClock) -> Breaker {
        breaker_of(clock, 1)
    }

    #[test]
    fn each_part_has_a_circuit_of_its_own() {
        let clock = ManualClock::new();
        let b = breaker_of(&clock, 4);
        assert_eq!(b.parts(), 4);
        // Failures of parts 1 and 2 interleaved: neither has two in a row of its own... until
        // part 1 has.
        b.failure(1, None, FRESH);
        b.failure(2, None, FRESH);
        b.success(2, None);
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(1, None, FRESH);
        assert_eq!(b.part_state(1), CircuitState::Open);
        assert_eq!(b.admit(1), Admit::Reject);
        for part in [0, 2, 3] {
            assert_eq!(b.part_state(part), CircuitState::Closed, "part {part}");
            assert_eq!(b.admit(part), Admit::Call, "part {part}");
        }
        // The whole reads as its worst part; a domain out of range wraps instead of panicking.
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.parts_not_closed(), 1);
        assert_eq!(b.admit(5), Admit::Reject, "5 is part 1");
        // Part 1 probes and closes alone; the others' counts are their own.
        clock.advance(Duration::from_secs(5));
        let Admit::Probe(p) = b.admit(1) else {
            panic!("part 1 cooled down")
        };
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.failure(3, None, FRESH);
        b.success(1, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(3, None, FRESH);
        assert_eq!(
            b.part_state(3),
            CircuitState::Open,
            "two in a row on part 3"
        );
        assert_eq!(b.parts_not_closed(), 1);
    }

    /// Failures count in a row only while each comes within a cool-down of the one before: two
    /// far apart (a quiet route, a failure now and then) open nothing; two close together do.
    #[test]
    fn failures_a_cool_down_apart_start_a_new_count() {
        let clock = ManualClock::new();
        let b = breaker(&clock);
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_millis(5_001));
        b.failure(0, None, FRESH);
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "5.001 s apart: a new count"
        );
        assert!(!b.is_clean(), "the second failure is counted");
        // Exactly a cool-down after the last: still in a row.
        clock.advance(Duration::from_secs(5));
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        // Closed again by a probe; then a failure, a long quiet time, a failure, and one more
        // soon after: the last two open it.
        clock.advance(Duration::from_secs(5));
        let Admit::Probe(p) = b.admit(0) else {
            panic!("cooled down")
        };
        b.success(0, Some(p));
        assert!(b.is_clean());
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_secs(3_600));
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Closed);
        clock.advance(Duration::from_secs(1));
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// A threshold is counted up to the largest allowed, and one above it is refused.
    #[test]
    fn the_largest_threshold_is_counted_to() {
        assert!(CircuitBreaker::new(MAX_FAILURE_THRESHOLD + 1, Duration::from_secs(1)).is_err());
        let clock = ManualClock::new();
        let b = Breaker::new(
            CircuitBreaker::new(MAX_FAILURE_THRESHOLD, Duration::from_secs(1)).unwrap(),
            Duration::from_millis(50),
            Arc::new(clock.clone()),
            &Metrics::new("p", std::iter::empty()),
            "p".into(),
            1,
        );
        for _ in 1..MAX_FAILURE_THRESHOLD {
            b.failure(0, None, FRESH);
        }
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// `is_clean` follows every transition: a failure, a success that clears it, an opening
    /// (which clears its count), a probe's success; and the counts come back to nothing after
    /// threads fail and succeed on every part at once.
    #[test]
    fn clean_while_every_circuit_is_closed_and_counts_no_failure() {
        let clock = ManualClock::new();
        let b = breaker_of(&clock, 4);
        assert!(b.is_clean());
        b.failure(1, None, FRESH);
        assert!(!b.is_clean());
        b.success(1, None);
        assert!(b.is_clean());
        b.failure(2, None, FRESH);
        b.failure(2, None, FRESH);
        assert_eq!(b.part_state(2), CircuitState::Open);
        assert!(!b.is_clean(), "open");
        clock.advance(Duration::from_secs(5));
        let Admit::Probe(p) = b.admit(2) else {
            panic!("cooled down")
        };
        b.failure(2, Some(p), FRESH);
        assert!(!b.is_clean(), "open again");
        clock.advance(Duration::from_secs(5));
        let Admit::Probe(p) = b.admit(2) else {
            panic!("cooled down")
        };
        b.success(2, Some(p));
        assert!(b.is_clean(), "closed");

        let b = Arc::new(breaker_of(&clock, 4));
        std::thread::scope(|s| {
            for t in 0..4 {
                let b = &b;
                s.spawn(move || {
                    for i in 0..10_000usize {
                        if (i + t) % 3 == 0 {
                            b.success(i % 4, None);
                        } else {
                            b.failure(i % 4, None, FRESH);
                        }
                    }
                });
            }
        });
        // Close every circuit: probes after the cool-down, then a success on each part.
        clock.advance(Duration::from_secs(5));
        for part in 0..4 {
            if let Admit::Probe(p) = b.admit(part) {
                b.success(part, Some(p));
            }
            b.success(part, None);
        }
        assert_eq!(b.parts_not_closed(), 0);
        assert!(b.is_clean(), "the counts came back to nothing");
    }

    #[test]
    fn opens_half_opens_and_closes() {
        let clock = ManualClock::new();
        let b = breaker(&clock);
        b.failure(0, None, FRESH);
        assert_eq!(b.admit(0), Admit::Call);
        b.success(0, None);
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Closed, "success reset the count");
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(0), Admit::Reject);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        assert_eq!(b.admit(0), Admit::Reject, "one probe at a time");
        b.failure(0, Some(p), FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(4));
        assert_eq!(b.admit(0), Admit::Reject);
        clock.advance(Duration::from_secs(1));
        let p = probe(&b);
        b.success(0, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.admit(0), Admit::Call);
    }

    /// A clock set back (a custom clock that follows the wall clock, stepped back by an hour)
    /// does not hold a circuit open, or a lost probe unanswered, until it catches up again: a
    /// state stamped after `now` counts as waited out, as the log gate's does.
    #[test]
    fn a_clock_set_back_does_not_hold_the_circuit_open() {
        let clock = ManualClock::starting_at(Timestamp::from_micros(7_200_000_000));
        let b = breaker(&clock);
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.next_probe_in(0), Some(Duration::from_secs(5)));
        clock.set(Timestamp::from_micros(3_600_000_000));
        assert_eq!(b.next_probe_in(0), Some(Duration::ZERO));
        let _lost = probe(&b);
        assert_eq!(b.admit(0), Admit::Reject, "one probe at a time");
        // Half-open, its probe lost, and the clock set back again.
        clock.set(Timestamp::from_micros(1_800_000_000));
        assert_eq!(b.next_probe_in(0), Some(Duration::ZERO));
        let p = probe(&b);
        b.success(0, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// A probe that nothing settles (its request's task panicked before its check was made) is
    /// taken as lost after a cool-down: the next request probes, and only one.
    #[test]
    fn a_probe_lost_for_a_cool_down_is_sent_again() {
        let clock = ManualClock::new();
        let (b, _lost) = probing(&clock);
        clock.advance(Duration::from_millis(4_999));
        assert_eq!(b.admit(0), Admit::Reject, "the probe may still answer");
        clock.advance(Duration::from_millis(1));
        let p = probe(&b);
        assert_eq!(b.admit(0), Admit::Reject);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.success(0, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// A probe taken as lost that answers after all (its future polled late) closes nothing once
    /// the probe sent after it has failed: the circuit stays open for its cool-down.
    #[test]
    fn a_lost_probes_late_success_does_not_close_a_reopened_circuit() {
        let clock = ManualClock::new();
        let (b, lost) = probing(&clock);
        clock.advance(Duration::from_secs(5));
        let second = probe(&b);
        b.failure(0, Some(second), FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        b.success(0, Some(lost));
        assert_eq!(b.state(), CircuitState::Open, "a stale probe closed it");
        assert_eq!(b.admit(0), Admit::Reject);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        b.success(0, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// A probe taken as lost that fails late (its future polled after its timeout) re-opens
    /// nothing while the probe sent after it is out: that probe's success closes the circuit
    /// instead of finding it open for another cool-down.
    #[test]
    fn a_lost_probes_late_failure_does_not_reopen_the_circuit_under_the_next_probe() {
        let clock = ManualClock::new();
        let (b, lost) = probing(&clock);
        clock.advance(Duration::from_secs(5));
        let second = probe(&b);
        b.failure(0, Some(lost), FRESH);
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen,
            "the stale probe re-opened it"
        );
        assert_eq!(b.admit(0), Admit::Reject, "still one probe at a time");
        b.success(0, Some(second));
        assert_eq!(b.state(), CircuitState::Closed);

        // Nor does its answer from a cache hand the second probe's turn to a third.
        let (b, lost) = probing(&clock);
        clock.advance(Duration::from_secs(5));
        let second = probe(&b);
        b.probe_not_asked(0, lost);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        assert_eq!(b.admit(0), Admit::Reject);
        b.failure(0, Some(second), FRESH);
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// The other way round: the probe taken as lost answers first and closes the circuit; the
    /// later probe's success then counts as any success does, forgetting the failures since.
    #[test]
    fn a_second_probes_success_on_a_closed_circuit_resets_its_failures() {
        let clock = ManualClock::new();
        let (b, lost) = probing(&clock);
        clock.advance(Duration::from_secs(5));
        let second = probe(&b);
        b.success(0, Some(lost));
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(0, None, FRESH);
        b.success(0, Some(second));
        b.failure(0, None, FRESH);
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "one failure since the last success"
        );
    }

    /// A probe is not taken as lost while it may still be waiting for the store: with a timeout
    /// longer than the cool-down (5 s against 1 s), not before twice the timeout.
    #[test]
    fn a_probe_waiting_out_a_long_timeout_is_not_doubled() {
        let clock = ManualClock::new();
        let b = Breaker::new(
            CircuitBreaker::new(1, Duration::from_secs(1)).unwrap(),
            Duration::from_secs(5),
            Arc::new(clock.clone()),
            &Metrics::new("p", std::iter::empty()),
            "p".into(),
            1,
        );
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_secs(1));
        assert!(
            matches!(b.admit(0), Admit::Probe(_)),
            "open for one cool-down"
        );
        for _ in 0..9 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(b.admit(0), Admit::Reject, "the probe may still be waiting");
        }
        clock.advance(Duration::from_secs(1));
        let p = probe(&b);
        b.failure(0, Some(p), FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(1));
        assert!(
            matches!(b.admit(0), Admit::Probe(_)),
            "a failed probe re-opens for one cool-down"
        );
    }

    /// A probe's close makes the failures of checks admitted before it on its own circuit count
    /// for nothing; another circuit's close leaves them counting.
    #[test]
    fn only_a_circuits_own_close_makes_older_failures_stale() {
        let clock = ManualClock::new();
        let b = breaker_of(&clock, 2);
        let before = b.seen();
        b.failure(1, None, before);
        b.failure(1, None, before);
        assert_eq!(b.part_state(1), CircuitState::Open);
        clock.advance(Duration::from_secs(5));
        let Admit::Probe(p) = b.admit(1) else {
            panic!("a probe after the cool-down")
        };
        b.success(1, Some(p));
        assert_eq!(b.part_state(1), CircuitState::Closed);
        assert!(b.seen() > before);

        b.failure(1, None, before);
        b.failure(1, None, before);
        assert_eq!(
            b.part_state(1),
            CircuitState::Closed,
            "older than the close"
        );
        assert!(b.is_clean(), "stale failures are not counted");
        b.failure(0, None, before);
        b.failure(0, None, before);
        assert_eq!(
            b.part_state(0),
            CircuitState::Open,
            "another circuit's close"
        );
        let after = b.seen();
        b.failure(1, None, after);
        b.failure(1, None, after);
        assert_eq!(b.part_state(1), CircuitState::Open, "newer than the close");
    }

    /// A probe retaken after one was handed on is quiet: the circuit reads open, as its gauge was
    /// last published, whichever publish comes next; an opening ends the quiet.
    #[test]
    fn a_quiet_probe_reads_as_open_until_an_opening() {
        let clock = ManualClock::new();
        let b = breaker(&clock);
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.probe_not_asked(0, p);
        assert_eq!(b.state(), CircuitState::Open);
        let quiet = probe(&b);
        assert_eq!(b.state(), CircuitState::Open, "a quiet probe out");
        assert_eq!(b.parts_not_closed(), 1);
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        assert_eq!(
            b.state(),
            CircuitState::Open,
            "only the probe's answer counts"
        );
        b.failure(0, Some(quiet), FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(5));
        let loud = probe(&b);
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen,
            "the opening ended the quiet"
        );
        b.success(0, Some(loud));
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(0, None, FRESH);
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "no failure kept from while it was open"
        );
    }

    thread_local! {
        /// Set by a test's threads: `admit` then waits half a millisecond between reading the
        /// circuit and swapping in the probe, so that threads let go together overlap there.
        static WIDEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A place where a test's thread is held: where it was set for, it tells the test it got
    /// there, and waits for its go, once.
    type Hold = (
        &'static str,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<()>,
    );

    thread_local! {
        /// Set by a test's thread: the place `hold` stops it at.
        static HOLD: std::cell::RefCell<Option<Hold>> = const { std::cell::RefCell::new(None) };
    }

    /// Called (test builds only) by `failure` once it has read the clock, before its
    /// compare-and-swap (`"failure"`), and by a probe's `success` between its close and the
    /// close's mark (`"close"`): a thread preempted there.
    pub(super) fn hold(place: &'static str) {
        let held = HOLD.with(|h| {
            let mut h = h.borrow_mut();
            if h.as_ref().is_some_and(|(at, ..)| *at == place) {
                h.take()
            } else {
                None
            }
        });
        if let Some((_, reached, go)) = held {
            let _ = reached.send(());
            let _ = go.recv();
        }
    }

    /// A failure (with `seen`) held in `failure` after reading the clock, while `meanwhile`
    /// runs on a thread of its own; then let go. The held failure has the part's turn: a
    /// `meanwhile` that fails or closes the circuit waits for it (which is what is tested), so it
    /// is given a while (200 ms) to finish first, as it would without the turn, before the held
    /// failure is let go.
    fn failure_held_while(b: &Arc<Breaker>, seen: u64, meanwhile: impl FnOnce() + Send + 'static) {
        let b = Arc::clone(b);
        held_while("failure", move || b.failure(0, None, seen), meanwhile);
    }

    /// `act` run on a thread of its own and held at `place` (see `hold`) while `meanwhile` runs
    /// on another, given 200 ms to finish first; then let go.
    fn held_while(
        place: &'static str,
        act: impl FnOnce() + Send + 'static,
        meanwhile: impl FnOnce() + Send + 'static,
    ) {
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let held = std::thread::spawn(move || {
            HOLD.with(|h| *h.borrow_mut() = Some((place, reached_tx, go_rx)));
            act();
        });
        reached.recv().unwrap();
        let (done_tx, done) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            meanwhile();
            let _ = done_tx.send(());
        });
        let _ = done.recv_timeout(Duration::from_millis(200));
        go.send(()).unwrap();
        held.join().unwrap();
        other.join().unwrap();
    }

    /// A failure whose thread read the clock, was preempted, and records it around another
    /// failure a cool-down later: the streak that follows that later failure still opens the
    /// circuit (the held failure does not write its older time over the later one's).
    #[test]
    fn a_failure_held_after_reading_the_clock_does_not_hide_the_streak_after_it() {
        let clock = ManualClock::new();
        let b = Arc::new(breaker(&clock));
        // Another failure 6 s after the held one read the clock (the cool-down is 5 s): not in
        // a row with it.
        let (later, clock2) = (Arc::clone(&b), clock.clone());
        failure_held_while(&b, FRESH, move || {
            clock2.advance(Duration::from_secs(6));
            later.failure(0, None, FRESH);
        });
        assert_eq!(b.state(), CircuitState::Closed);
        // One more a second after the later one: two in a row within the cool-down.
        clock.advance(Duration::from_secs(1));
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// A failure with `seen` held inside `failure` while another opens the circuit (it fails
    /// too) and, after the cool-down, a probe closes it.
    fn failure_held_across_an_open_and_a_close(b: &Arc<Breaker>, clock: &ManualClock, seen: u64) {
        let (other, clock) = (Arc::clone(b), clock.clone());
        failure_held_while(b, seen, move || {
            other.failure(0, None, seen);
            clock.advance(Duration::from_secs(5));
            let p = probe(&other);
            other.success(0, Some(p));
        });
    }

    /// A failure made while the circuit was closed, held inside `failure` while others open the
    /// circuit and, after the cool-down, a probe closes it: its count and its opening do not
    /// land after that close (older evidence than the probe's, the store had just answered).
    #[test]
    fn a_failure_held_across_an_open_and_a_close_does_not_reopen_the_circuit() {
        let clock = ManualClock::new();
        let b = Arc::new(opened_by_one_failure(&clock));
        failure_held_across_an_open_and_a_close(&b, &clock, b.seen());
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "re-opened by a failure older than the probe that closed it"
        );
    }

    /// The same with a threshold of 2 and one failure before: the held one is not counted in
    /// the streak after the close, where one failure more would then open the circuit.
    #[test]
    fn a_failure_held_across_an_open_and_a_close_is_not_counted_after_it() {
        let clock = ManualClock::new();
        let b = Arc::new(breaker(&clock));
        let seen = b.seen();
        b.failure(0, None, seen);
        failure_held_across_an_open_and_a_close(&b, &clock, seen);
        assert_eq!(b.state(), CircuitState::Closed);
        b.failure(0, None, b.seen());
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "opened by one failure after the close"
        );
    }

    /// A breaker of one part whose circuit opens at one failure.
    fn opened_by_one_failure(clock: &ManualClock) -> Breaker {
        breaker_opened_by(clock, 1, 1)
    }

    /// A probe's close held between closing the circuit and marking the close, while a failure
    /// of a check sent before the close comes: that failure waits for the mark, and is then
    /// known to be older than the close (without the close's turn it found the circuit closed
    /// and not yet marked, counted, and re-opened it).
    #[test]
    fn a_failure_from_before_a_close_that_comes_during_it_is_not_counted() {
        let clock = ManualClock::new();
        let b = Arc::new(opened_by_one_failure(&clock));
        b.failure(0, None, FRESH);
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        let seen = b.seen();
        let (closer, other) = (Arc::clone(&b), Arc::clone(&b));
        held_while(
            "close",
            move || closer.success(0, Some(p)),
            move || other.failure(0, None, seen),
        );
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "re-opened by a failure sent before the close"
        );
    }

    /// Called by `admit` between its read and its compare-and-swap (test builds only).
    pub(super) fn widen_the_race() {
        if WIDEN.with(std::cell::Cell::get) {
            // A sleep, not a spin: on a loaded machine the other threads may need the core.
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// However many threads ask at once after the cool-down, exactly one gets the probe. Each
    /// round re-opens the circuit and lets the threads go at once (they spin on a shared round
    /// number, which releases them within nanoseconds of each other, where a `Barrier` wakes the
    /// waiting ones tens of microseconds after the last arrival), and each asks once: the race
    /// is the first admission after the cool-down, between its read and its compare-and-swap,
    /// which these threads widen to half a millisecond (`widen_the_race`). (With a plain store
    /// in place of the compare-and-swap, most rounds hand out more than one probe.)
    #[test]
    fn one_probe_among_concurrent_requests() {
        use std::sync::atomic::AtomicUsize;
        const THREADS: usize = 3;
        const ROUNDS: usize = 300;
        let clock = ManualClock::new();
        let b = Arc::new(breaker(&clock));
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        let round = Arc::new(AtomicUsize::new(0));
        let probes: Arc<Vec<AtomicUsize>> =
            Arc::new((0..=ROUNDS).map(|_| AtomicUsize::new(0)).collect());
        let done = Arc::new(AtomicUsize::new(0));
        let spin_until = |ready: &dyn Fn() -> bool| {
            let mut spins = 0u32;
            while !ready() {
                spins += 1;
                if spins < 10_000 {
                    std::hint::spin_loop();
                } else {
                    // Two cores and more threads: let the others run.
                    std::thread::yield_now();
                }
            }
        };
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                let (b, round, probes, done) = (&b, &round, &probes, &done);
                scope.spawn(move || {
                    WIDEN.with(|w| w.set(true));
                    for r in 1..=ROUNDS {
                        spin_until(&|| round.load(Ordering::Acquire) >= r);
                        if let Admit::Probe(p) = b.admit(0) {
                            probes[r].fetch_add(1, Ordering::Relaxed);
                            // Failed at once: open again, for the next round.
                            b.failure(0, Some(p), FRESH);
                        }
                        done.fetch_add(1, Ordering::AcqRel);
                    }
                });
            }
            // No assertion inside: a failed one would leave the threads waiting for good.
            for r in 1..=ROUNDS {
                clock.advance(Duration::from_secs(5));
                round.store(r, Ordering::Release);
                spin_until(&|| done.load(Ordering::Acquire) >= r * THREADS);
            }
        });
        let not_one: Vec<(usize, usize)> = (1..=ROUNDS)
            .map(|r| (r, probes[r].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n != 1)
            .collect();
        assert_eq!(
            not_one,
            [],
            "(round, probes) not one probe after the cool-down"
        );
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// A circuit opened by two failures and cooled down, its probe out.
    fn probing(clock: &ManualClock) -> (Arc<Breaker>, Probe) {
        let b = Arc::new(breaker(clock));
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        (b, p)
    }

    /// The probe `b` admits next (it must admit one).
    fn probe(b: &Breaker) -> Probe {
        match b.admit(0) {
            Admit::Probe(p) => p,
            other => panic!("expected a probe, admitted {other:?}"),
        }
    }

    type Answer = Result<Decision, std::io::Error>;
    type Sent = Pin<Box<dyn Future<Output = Answer> + Send>>;

    /// A store check whose answer the test sends when it likes (never, if it drops the sender).
    fn check() -> (tokio::sync::oneshot::Sender<Answer>, Sent) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fut = Box::pin(async move {
            match rx.await {
                Ok(answer) => answer,
                Err(_) => std::future::pending().await,
            }
        });
        (tx, fut)
    }

    fn allowed() -> Decision {
        let limit = ratelimit_core::Limit::single(
            ratelimit_core::Algorithm::TokenBucket,
            ratelimit_core::Quota::per_second(1).unwrap(),
        )
        .unwrap();
        ratelimit_core::MemoryStore::new().check_now(b"k", &limit, 1)
    }

    /// Waits until the spawned settlements have run (time is paused: a sleep only advances it).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Dropped before the store answered, the probe is settled by the store's answer, whenever it
    /// comes: a client that cancels its request cannot re-open a healthy store's circuit.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_is_settled_by_the_stores_answer() {
        let clock = ManualClock::new();
        // Dropped before it was polled.
        let (b, p) = probing(&clock);
        let (tx, fut) = check();
        drop(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        assert_eq!(b.state(), CircuitState::HalfOpen);
        tx.send(Ok(allowed())).unwrap();
        settle().await;
        assert_eq!(b.state(), CircuitState::Closed);

        // Dropped while it waited; the store then fails: another cool-down.
        let (b, p) = probing(&clock);
        let (tx, fut) = check();
        let mut probe = Box::pin(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        assert!(futures_poll(&mut probe).is_pending());
        drop(probe);
        settle().await;
        assert_eq!(b.state(), CircuitState::HalfOpen, "no answer yet");
        tx.send(Err(std::io::Error::other("down"))).unwrap();
        settle().await;
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(0), Admit::Reject);

        // Dropped while it waited; the store never answers: the layer's timeout settles it.
        let (b, p) = probing(&clock);
        let (tx, fut) = check();
        let mut probe = Box::pin(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        assert!(futures_poll(&mut probe).is_pending());
        drop(probe);
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(b.state(), CircuitState::HalfOpen);
        tokio::time::sleep(Duration::from_millis(2)).await;
        settle().await;
        assert_eq!(b.state(), CircuitState::Open);
        drop(tx);
    }

    /// An answer from a cache in front of the store says nothing of it: the probe is handed on.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_answered_from_a_cache_is_handed_on() {
        let clock = ManualClock::new();
        let (b, p) = probing(&clock);
        let (tx, fut) = check();
        drop(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        tx.send(Ok(allowed().cached())).unwrap();
        settle().await;
        assert_eq!(b.state(), CircuitState::Open);
        assert!(matches!(b.admit(0), Admit::Probe(_)), "still cooled down");
    }

    /// With no runtime to finish the check on, or a task that never runs, the probe is handed on
    /// rather than lost (a circuit left half-open with no probe out would never close).
    #[test]
    fn a_dropped_probe_without_a_runtime_is_handed_on() {
        let clock = ManualClock::new();
        let (b, p) = probing(&clock);
        let (_tx, fut) = check();
        drop(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        assert_eq!(b.state(), CircuitState::Open);
        let p = probe(&b);

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (_tx, fut) = check();
        {
            let _in_rt = rt.enter();
            drop(BreakerCheck::new(
                b.clone(),
                0,
                Some(p),
                FRESH,
                fut,
                Duration::from_secs(1),
            ));
        }
        // A quiet probe (the one before it was handed on): the part is half-open, the whole
        // reads open, as published.
        assert_eq!(
            b.part_state(0),
            CircuitState::HalfOpen,
            "its task is spawned"
        );
        assert_eq!(b.state(), CircuitState::Open);
        drop(rt);
        assert_eq!(b.state(), CircuitState::Open, "and dropped unrun");
        assert!(matches!(b.admit(0), Admit::Probe(_)));
    }

    /// A store future that panics while the probe polls it fails the probe as it unwinds: the
    /// circuit is not left half-open with nothing to settle it.
    #[tokio::test(start_paused = true)]
    async fn a_probe_whose_check_panics_fails() {
        let clock = ManualClock::new();
        let (b, p) = probing(&clock);
        let fut: Sent = Box::pin(async { panic!("a store bug") });
        let mut probe = Box::pin(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| futures_poll(&mut probe)));
        assert!(polled.is_err());
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(0), Admit::Reject, "a new cool-down");
        drop(probe);
        settle().await;
        assert_eq!(b.state(), CircuitState::Open);
    }

    /// Polled to the end, the probe leaves the settling to its caller.
    #[tokio::test(start_paused = true)]
    async fn a_finished_probe_check_settles_nothing_itself() {
        let clock = ManualClock::new();
        let (b, p) = probing(&clock);
        let (tx, fut) = check();
        let mut probe = Box::pin(BreakerCheck::new(
            b.clone(),
            0,
            Some(p),
            FRESH,
            fut,
            Duration::from_secs(1),
        ));
        tx.send(Ok(allowed())).unwrap();
        assert!(matches!((&mut probe).await, Ok(Ok(_))));
        drop(probe);
        settle().await;
        assert_eq!(b.state(), CircuitState::HalfOpen);
    }

    fn futures_poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    /// A request's failure checks that the circuit is closed, then opens it; between the two,
    /// other requests can open it, the cool-down pass and a probe go out. The late half of that
    /// failure must not re-open the circuit under the probe (the probe's success would be lost).
    /// A circuit opened, cooled down and probing, then the delayed second half of
    /// `failure(None)` from a request that saw it `CLOSED`.
    fn probing_then_a_late_failure(clock: &ManualClock) -> (Breaker, Probe) {
        let b = breaker(clock);
        b.failure(0, None, FRESH);
        b.failure(0, None, FRESH);
        clock.advance(Duration::from_secs(5));
        let p = probe(&b);
        b.open(0, CLOSED);
        (b, p)
    }

    #[test]
    fn a_failure_that_saw_the_circuit_closed_does_not_reopen_it_under_a_probe() {
        let clock = ManualClock::new();
        let (b, p) = probing_then_a_late_failure(&clock);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.success(0, Some(p));
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// Nor does it restart the cool-down: once cooled, a circuit whose probe was answered without
    /// asking the store lets the next request probe at once.
    #[test]
    fn a_late_failure_does_not_restart_the_cool_down() {
        let clock = ManualClock::new();
        let (b, p) = probing_then_a_late_failure(&clock);
        b.probe_not_asked(0, p);
        assert_eq!(b.state(), CircuitState::Open);
        assert!(matches!(b.admit(0), Admit::Probe(_)), "still cooled down");
    }

    #[test]
    fn settings_are_validated() {
        assert!(CircuitBreaker::new(0, Duration::from_secs(1)).is_err());
        assert!(CircuitBreaker::new(1, Duration::ZERO).is_err());
    }
}
