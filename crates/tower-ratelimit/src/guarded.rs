//! `Guarded`: the layer's timeout and circuit breaker around a store used without the layer.
//!
//! See the documentation of the type.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ratelimit_core::{Clock, Decision, Limit, Store, SystemClock};

use crate::circuit_breaker::{
    Admit, Breaker, BreakerCheck, CircuitBreaker, CircuitState, Probe, TimedOut,
};
use crate::layer::DEFAULT_TIMEOUT;
use crate::metrics::{FailureKind, Metrics};
use crate::{Error, VerdictKind};

/// A store wrapper that gives every check the [layer's](crate::RateLimitLayer) timeout and
/// [circuit breaker](crate::circuit_breaker), for checks made without the layer: a chat server's
/// messages, a job dispatcher's starts, a WebSocket's frames.
///
/// A check that the store does not answer within the timeout fails with
/// [`GuardError::TimedOut`]; after `failure_threshold` failures in a row the key's circuit
/// opens, and its checks fail at once with [`GuardError::CircuitOpen`] (saying when the store
/// will be asked again) without asking the store, until a probe after the cool-down finds it
/// answering. The circuits, probes, and checks dropped while they wait for their answer behave
/// as under the layer ([`circuit_breaker`](crate::circuit_breaker) says how), and are counted in
/// `ratelimit_checks_cancelled_total`. A check is sent at its first poll (as the layer's is in
/// `call`), and the breaker admits it then:
/// - one dropped before it (a `select!` that took another branch) asks the store nothing (a
///   store that decides as the check is made, as the in-memory store does, has counted it
///   already) and takes no probe;
/// - one made while its circuit was closed and first polled after it opened is a check of the
///   open circuit: it fails at once with [`GuardError::CircuitOpen`], the store not asked, so
///   that a batch of checks made together over a hanging store waits `failure_threshold`
///   timeouts, not one per check;
/// - one made while its circuit was open is not sent, even if polled after the cool-down or
///   the circuit's close (the store's future is not made: a store such as the in-memory one
///   counts a check as it is made): it fails with [`GuardError::CircuitOpen`] at its first
///   poll, whose `retry_in` is the time to the next probe then (zero once the cool-down is
///   over: the next check made asks the store), and counts for nothing if dropped unpolled (a
///   cache inside the store, asked instead, answers it as it is made: a `Leasing` unit is
///   spent then, and the decision counted at the first poll);
/// - a probe's timeout, and the time after which it is taken as lost, run from its sending.
///
/// What to do on an error is the caller's: let the message through, refuse it, or count it
/// against a local share of the limit ([`Limit::divided`]), as the layer's failure policies do.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Quota, Store};
/// use tower_ratelimit::{GuardError, Guarded};
///
/// /// Whether `user` may send a message: asked of the shared store (a `RedisStore`, say), or,
/// /// while it is slow or down, of this process's share of the limit.
/// async fn may_send<St: Store>(
///     shared: &Guarded<St>,
///     local: &MemoryStore,
///     user: &[u8],
///     limit: &Limit,
///     local_share: &Limit,
/// ) -> bool {
///     match shared.check(user, limit, 1).await {
///         Ok(decision) => decision.is_allowed(),
///         // Timed out, failed, or not even asked while the store's circuit is open.
///         Err(GuardError::CircuitOpen { .. } | GuardError::TimedOut { .. } | GuardError::Store(_)) => {
///             local.check_now(user, local_share, 1).is_allowed()
///         }
///         Err(_) => false,
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The shared store: a `RedisStore` (crate ratelimit-redis) in production.
/// let redis = MemoryStore::new();
/// let limit = Limit::single(Algorithm::Gcra, Quota::per_period(20, Duration::from_secs(10))?)?;
/// let local_share = limit.divided(4)?; // four processes
/// let shared = Guarded::builder(redis, "chat").timeout(Duration::from_millis(20)).build()?;
/// let local = MemoryStore::new();
/// assert!(may_send(&shared, &local, b"user:42", &limit, &local_share).await);
/// # Ok(())
/// # }
/// ```
///
/// A check may be made outside a Tokio runtime (its timer is made at its first poll), but is
/// polled inside one with timers (`#[tokio::main]`'s). Its answer or failure is counted in the
/// metrics of the layer, under the `policy` label given as the name: `ratelimit_decisions_total` (`allowed`,
/// `denied`), `ratelimit_store_duration_seconds` (every answer, those ready at once too, which the
/// layer times one in about 64 of), `ratelimit_store_errors_total` (`error`,
/// `timeout`, `circuit_open`) and the circuit gauges (docs/operations.md). Under the layer, give
/// the layer the plain store: it has this timeout and breaker of its own.
///
/// An answer from a cache in front of the store ([`Decision::is_cached`]: a `DenialCache` hit,
/// a `Leasing` unit) is no evidence of the store's health, as under the layer; and while a key's
/// circuit is open, such a cache inside this wrapper still answers what it holds
/// ([`Store::check_cached`]) to a check made then, before the check fails. (A check made before
/// the circuit opened asked the store's own `check` when it was made, whose cache may have
/// answered then; first polled after the circuit opened, that answer is not used.)
#[derive(Clone)]
pub struct Guarded<St> {
    store: St,
    shared: Arc<Shared>,
}

struct Shared {
    name: Arc<str>,
    timeout: Duration,
    breaker: Option<Arc<Breaker>>,
    metrics: Metrics,
}

impl<St> fmt::Debug for Guarded<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("name", &self.shared.name)
            .field("timeout", &self.shared.timeout)
            .field("breaker", &self.shared.breaker)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`Guarded`] store, from [`Guarded::builder`].
#[must_use]
pub struct GuardedBuilder<St> {
    store: St,
    name: String,
    timeout: Duration,
    breaker: Option<CircuitBreaker>,
    clock: Arc<dyn Clock>,
}

impl<St> fmt::Debug for GuardedBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedBuilder")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl<St: Store> Guarded<St> {
    /// Settings for guarding `store`, named `name` in the metrics (their `policy` label) and
    /// the logs, with the layer's defaults: a timeout of [`DEFAULT_TIMEOUT`] and
    /// [`CircuitBreaker::default`].
    pub fn builder(store: St, name: impl Into<String>) -> GuardedBuilder<St> {
        GuardedBuilder {
            store,
            name: name.into(),
            timeout: DEFAULT_TIMEOUT,
            breaker: Some(CircuitBreaker::default()),
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &St {
        &self.store
    }

    /// The worst state of the store's circuits (`None` without a breaker).
    pub fn circuit_state(&self) -> Option<CircuitState> {
        self.shared.breaker.as_ref().map(|b| b.state())
    }
}

impl<St: Store> GuardedBuilder<St> {
    /// How long a check may wait for the store (default [`DEFAULT_TIMEOUT`], 50 ms; 1 ms to an
    /// hour), counted from the check's first poll, which sends it (checks made together and
    /// awaited in turn each have the whole timeout). A check cut at it fails with
    /// [`GuardError::TimedOut`] and counts as a failure of its circuit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The circuit breaker's settings (default [`CircuitBreaker::default`]).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// No circuit breaker: every check asks the store, with its timeout.
    pub fn no_circuit_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// The breaker's clock (the system clock by default; a `ManualClock` in tests).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The guarded store, or the setting that is out of range: a timeout outside 1 ms to an
    /// hour, or a name that is not 1 to 64 printable ASCII characters, neither `"` nor `\` (it
    /// goes in the metrics' labels, as a policy's name).
    pub fn build(self) -> Result<Guarded<St>, Error> {
        crate::layer::check_timeout(self.timeout)?;
        crate::policy::validate_name(&self.name)?;
        let name: Arc<str> = self.name.into();
        let metrics = Metrics::new(&name, std::iter::empty());
        let breaker = self.breaker.map(|config| {
            Arc::new(Breaker::new(
                config,
                self.timeout,
                self.clock,
                &metrics,
                name.clone(),
                self.store.failure_domains(),
            ))
        });
        Ok(Guarded {
            store: self.store,
            shared: Arc::new(Shared {
                name,
                timeout: self.timeout,
                breaker,
                metrics,
            }),
        })
    }
}

/// Why a [`Guarded`] check has no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError<E> {
    /// The key's circuit is open: the store was not asked. While the circuit cools down,
    /// `retry_in` is what is left of the cool-down, and the first check after it asks the store
    /// (the probe). While that probe is out, `retry_in` is zero, but checks are refused until the
    /// probe settles (answered, or failed at the timeout from its sending): a caller that waits
    /// `retry_in` and tries again should wait a little more than zero then (the layer's
    /// `Retry-After` is at least 1 s).
    #[error("the store's circuit is open: not asked (the next probe in {retry_in:?})")]
    CircuitOpen {
        /// How long until a check asks the store again.
        retry_in: Duration,
    },
    /// The store did not answer within the timeout.
    #[error("the store did not answer within {timeout:?}")]
    TimedOut {
        /// The timeout it was given.
        timeout: Duration,
    },
    /// The store answered with an error.
    #[error("the store failed: {0}")]
    Store(#[source] E),
}

impl<St> Store for Guarded<St>
where
    St: Store,
{
    type Error = GuardError<St::Error>;
    type Future = GuardedFuture<St::Future, St::Error>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let s = &self.shared;
        let Some(b) = &s.breaker else {
            return GuardedFuture {
                shared: s.clone(),
                start: None,
                state: State::Plain {
                    check: self.store.check(key, limit, cost),
                    timer: None,
                },
                waiting: false,
            };
        };
        let part = if b.parts() == 1 {
            0
        } else {
            self.store.failure_domain(key) % b.parts()
        };
        if b.rejects(part) {
            // Not made of the store (one such as the in-memory store counts a check as it is
            // made): a cache's answer, or the refusal, told and counted at the first poll.
            let state = match self.store.check_cached(key, limit, cost) {
                Some(d) => State::Cached(d),
                None => State::Refused { part },
            };
            return GuardedFuture {
                shared: s.clone(),
                start: None,
                state,
                waiting: false,
            };
        }
        // Admitted (or not, or as the probe) at the first poll, which sends it.
        GuardedFuture {
            shared: s.clone(),
            start: None,
            state: State::Unsent {
                check: self.store.check(key, limit, cost),
                part,
            },
            waiting: false,
        }
    }

    fn failure_domains(&self) -> usize {
        self.store.failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.store.failure_domain(key)
    }

    fn response_timeout(&self) -> Option<Duration> {
        Some(self.shared.timeout)
    }

    fn check_cached(&self, key: &[u8], limit: &Limit, cost: u64) -> Option<Decision> {
        self.store.check_cached(key, limit, cost)
    }
}

impl Shared {
    /// Counts a decision of the store (or of a cache in it).
    fn decided(&self, d: Decision) -> Decision {
        let kind = if d.is_allowed() {
            VerdictKind::Allowed
        } else {
            VerdictKind::Denied
        };
        self.metrics.decision(kind, 0);
        d
    }

    /// Counts a check not sent because part `part`'s circuit is open, and returns its error.
    fn circuit_open<E>(&self, b: &Breaker, part: usize) -> GuardError<E> {
        self.metrics.failure(FailureKind::CircuitOpen);
        GuardError::CircuitOpen {
            retry_in: b.next_probe_in(part).unwrap_or_default(),
        }
    }

    /// Counts and logs a failure of the store, and returns it.
    fn failed<E: std::error::Error>(&self, error: GuardError<E>) -> GuardError<E> {
        let kind = match error {
            GuardError::TimedOut { .. } => FailureKind::Timeout,
            _ => FailureKind::Error,
        };
        self.metrics.failure(kind);
        tracing::debug!(name = %self.name, %error, "guarded rate-limit store check failed");
        error
    }
}

/// The future of a [`Guarded`] check.
pub struct GuardedFuture<F, E> {
    shared: Arc<Shared>,
    /// When the check was sent (its first poll), for its duration in the metrics.
    start: Option<Instant>,
    state: State<F, E>,
    /// Polled, and waiting for the store's answer: dropped now, the check is counted in
    /// `ratelimit_checks_cancelled_total`, as the layer counts a request dropped while its
    /// check waits. (Dropped before its first poll, a network store's check was never sent.)
    waiting: bool,
}

impl<F, E> Drop for GuardedFuture<F, E> {
    fn drop(&mut self) {
        // Dropped unpolled (`State::Unsent`), a check was never sent nor admitted by the
        // breaker: it counts for nothing, and holds no probe.
        if self.waiting {
            self.shared.metrics.cancelled.increment(1);
        }
    }
}

impl<F, E> fmt::Debug for GuardedFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedFuture").finish_non_exhaustive()
    }
}

/// A check through the breaker: the store's answer, or its timeout.
type BoxedCheck<E> = Pin<Box<dyn Future<Output = Result<Result<Decision, E>, TimedOut>> + Send>>;

// Nothing is pinned in place: the check is `Unpin` (as every store's future) or boxed, and the
// error is only moved out.
impl<F: Unpin, E> Unpin for GuardedFuture<F, E> {}

enum State<F, E> {
    /// Answered.
    Done,
    /// Made while part `part`'s circuit was open: not sent, and answered `CircuitOpen` at the
    /// first poll, with the time to the next probe as it is then (counted then too: dropped
    /// unpolled, it counts for nothing).
    Refused { part: usize },
    /// Made while the circuit was open, and answered by a cache in the store as it was made:
    /// counted at the first poll.
    Cached(Decision),
    /// No breaker: the check, and its timer, made at the first poll (which sends the check: the
    /// timeout counts from there, and making a check needs no runtime).
    Plain {
        check: F,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    },
    /// Not polled yet: not sent, its timeout not started (checks made together and awaited in
    /// turn each have the whole timeout), and not yet admitted by the breaker, which is asked at
    /// the first poll (a check made before its circuit opened and sent after is a check of the
    /// open circuit, and a probe's time runs from its sending).
    Unsent { check: F, part: usize },
    /// Sent through the breaker (the shared one), which the answer settles (boxed: its timer is
    /// not `Unpin`).
    Breaker {
        check: BoxedCheck<E>,
        part: usize,
        probe: Option<Probe>,
        seen: u64,
    },
}

impl<F, E> Future for GuardedFuture<F, E>
where
    F: Future<Output = Result<Decision, E>> + Send + Unpin + 'static,
    E: std::error::Error + Send + 'static,
{
    type Output = Result<Decision, GuardError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let timeout = this.shared.timeout;
        if let State::Refused { part } = this.state {
            this.state = State::Done;
            let Some(breaker) = &this.shared.breaker else {
                unreachable!("a refusal without a breaker")
            };
            return Poll::Ready(Err(this.shared.circuit_open(breaker, part)));
        }
        if let State::Cached(d) = this.state {
            this.state = State::Done;
            return Poll::Ready(Ok(this.shared.decided(d)));
        }
        if matches!(this.state, State::Unsent { .. }) {
            let State::Unsent { check, part } = std::mem::replace(&mut this.state, State::Done)
            else {
                unreachable!("matched above")
            };
            // This state is made only by a store with a breaker.
            let Some(breaker) = &this.shared.breaker else {
                unreachable!("a breaker check without a breaker")
            };
            let probe = match breaker.admit(part) {
                Admit::Call => None,
                Admit::Probe(p) => Some(p),
                Admit::Reject => {
                    // The circuit opened (or its probe went out) since the check was made: not
                    // sent (the store's future, made with it, is dropped unpolled).
                    return Poll::Ready(Err(this.shared.circuit_open(breaker, part)));
                }
            };
            // Sent now: its timeout counts from this poll, and the closes it has seen are read
            // now (a check made before a close and sent after it is a check of the closed
            // circuit, whose failure counts).
            let seen = breaker.seen();
            let check = BreakerCheck::new(breaker.clone(), part, probe, seen, check, timeout);
            this.state = State::Breaker {
                check: Box::pin(check),
                part,
                probe,
                seen,
            };
        }
        if !matches!(this.state, State::Done) && this.start.is_none() {
            // The first poll: the check is sent now.
            this.start = Some(Instant::now());
        }
        let answer = match &mut this.state {
            State::Done => panic!("GuardedFuture polled after completion"),
            State::Plain { check, timer } => {
                if let Poll::Ready(answer) = Pin::new(check).poll(cx) {
                    answer.map_err(GuardError::Store)
                } else {
                    // Made at the first poll, which sent the check.
                    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    match timer.as_mut().poll(cx) {
                        Poll::Pending => {
                            this.waiting = true;
                            return Poll::Pending;
                        }
                        Poll::Ready(()) => Err(GuardError::TimedOut { timeout }),
                    }
                }
            }
            State::Unsent { .. } | State::Refused { .. } | State::Cached(_) => {
                unreachable!("taken above")
            }
            State::Breaker {
                check,
                part,
                probe,
                seen,
            } => {
                let answer = match check.as_mut().poll(cx) {
                    Poll::Pending => {
                        this.waiting = true;
                        return Poll::Pending;
                    }
                    Poll::Ready(answer) => answer,
                };
                // This state is made only by a store with a breaker.
                let Some(breaker) = &this.shared.breaker else {
                    unreachable!("a breaker check without a breaker")
                };
                match answer {
                    Ok(Ok(d)) => {
                        breaker.answered(*part, &d, *probe);
                        Ok(d)
                    }
                    Ok(Err(e)) => {
                        breaker.failure(*part, *probe, *seen);
                        Err(GuardError::Store(e))
                    }
                    Err(_timed_out) => {
                        breaker.failure(*part, *probe, *seen);
                        Err(GuardError::TimedOut { timeout })
                    }
                }
            }
        };
        this.state = State::Done;
        this.waiting = false;
        let shared = &this.shared;
        if let Some(start) = this.start {
            shared.metrics.store_duration(start.elapsed());
        }
        Poll::Ready(match answer {
            Ok(d) => Ok(shared.decided(d)),
            Err(e) => Err(shared.failed(e)),
        })
    }
}
