//! The [`RateLimitLayer`].

use std::any::TypeId;
use std::convert::Infallible;
use std::fmt;
use std::future::Ready;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Clock, Decision, MemoryStore, Reset, Store, SystemClock};
use tower_layer::Layer;

use crate::body::{SameBody, WrapBody};
use crate::circuit_breaker::{Breaker, CircuitBreaker, CircuitState};
use crate::log_gate::LogGate;
use crate::reset::ResetOn;
use crate::service::{RateLimit, ResetLogs, Rt, Shared};
use crate::{Error, FailurePolicy, Policy, ResponseHead};

/// The default store timeout: 50 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How far above the layer's timeout a store's own response timeout must be, at least, besides
/// twice it, for `build` to warn of it.
const FAR_ABOVE_AT_LEAST: Duration = Duration::from_millis(50);

/// A store call's timeout (the layer's, or a [`Guarded`](crate::Guarded) store's), if in range:
/// 1 ms to an hour.
pub(crate) fn check_timeout(timeout: Duration) -> Result<(), Error> {
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(3_600) {
        return Err(Error::InvalidSetting {
            name: "timeout",
            reason: "must be between 1 ms and one hour",
        });
    }
    Ok(())
}

/// Applies [`RateLimit`] to a service. Clones share one limiter.
///
/// Use it with `Router::layer` (every route, one limit per key across them, and the router's
/// fallback too: an unmatched path is keyed and counted, and answers 400 without a key or 429
/// once the quota is spent, rather than 404), or per route with
/// `route_layer` on the route's method router (`post(login).route_layer(layer)`: the methods the
/// route serves; another method gets axum's 405, not counted). `Router::route_layer` covers
/// every route above it (unmatched paths still get 404, not 429), but axum runs it on each
/// route's 405 too: requests with a method the route does not serve are counted.
///
/// `M` is the [`BodyMode`](crate::BodyMode): by default responses carry a
/// [`ResponseBody`](crate::ResponseBody) around any inner body; [`same_body`](Self::same_body)
/// keeps the inner body type.
pub struct RateLimitLayer<St, M = WrapBody> {
    pub(crate) shared: Arc<Shared<St>>,
    _mode: PhantomData<fn() -> M>,
}

impl<St: Store> RateLimitLayer<St> {
    /// A layer applying `policy` over `store`, with the default timeout (50 ms), circuit breaker
    /// (5 failures, 10 s; none for a store that always answers at once and cannot fail, such as
    /// the in-memory store) and the system clock.
    ///
    /// Fails if the policy has tiers but no tier resolver, or a failure policy or missing-key
    /// answer made from its enum's variants with a setting their constructors refuse (a fallback's
    /// share of a limit, which `Limit::divided` makes for every valid limit, is not expected to).
    pub fn new(store: St, policy: Policy) -> Result<Self, Error> {
        RateLimitLayer::builder(store, policy).build()
    }

    /// Settings beyond the policy: store timeout, circuit breaker, clock.
    pub fn builder(store: St, policy: Policy) -> RateLimitLayerBuilder<St> {
        RateLimitLayerBuilder {
            store,
            policy,
            timeout: DEFAULT_TIMEOUT,
            breaker: Some(CircuitBreaker::default()),
            clock: Arc::new(SystemClock::new()),
            fallback_max_keys: ratelimit_core::DEFAULT_MAX_KEYS,
            reset_on: None,
        }
    }
}

impl<St> RateLimitLayer<St> {
    /// Responses keep the inner service's body type instead of a
    /// [`ResponseBody`](crate::ResponseBody) around it; the layer's own bodies (a 429, a 503) are
    /// made with `From<Bytes>`. For axum (whose `Body` is such a type) this saves the second box
    /// axum would make of a wrapped body, and keeps a stack typed on `Response<Body>` as it is.
    pub fn same_body(self) -> RateLimitLayer<St, SameBody> {
        RateLimitLayer {
            shared: self.shared,
            _mode: PhantomData,
        }
    }
}

impl<St, M> RateLimitLayer<St, M> {
    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.shared.rt.policy
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The state of the store's circuit breaker (`None` if the layer has none: it was turned off,
    /// or the store always answers at once and cannot fail). With a store of several failure
    /// domains ([`Store::failure_domains`]), which has a circuit per domain: `Open` if any
    /// domain's circuit is open, else `HalfOpen` if any is probing, else `Closed`. (A probe
    /// that follows one answered from a cache in front of the store reads as `Open`, as the
    /// `ratelimit_circuit_state` gauge shows it: see the breaker's docs.)
    pub fn circuit_state(&self) -> Option<CircuitState> {
        self.shared.breaker.as_ref().map(|b| b.state())
    }

    /// What the local store that counts while the shared one cannot answer holds now (`None`
    /// unless the policy is [`FailurePolicy::Fallback`]). Each call locks the store's shards in
    /// turn, as a check of one key locks one: for a metrics exporter, not for every request.
    pub fn fallback_stats(&self) -> Option<FallbackStats> {
        self.shared.fallback.as_ref().map(|store| FallbackStats {
            keys: store.len(),
            max_keys: store.max_keys(),
            evictions: store.evictions(),
            memory_bytes: store.memory_bytes(),
        })
    }
}

/// What a layer's local fallback store holds ([`RateLimitLayer::fallback_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FallbackStats {
    /// Keys held now.
    pub keys: usize,
    /// The most it holds: [`fallback_max_keys`](RateLimitLayerBuilder::fallback_max_keys),
    /// rounded down to a multiple of the store's shards.
    pub max_keys: usize,
    /// Keys dropped to make room at the cap, since the layer was built: each may have let its
    /// client pass up to its local share again (see [`MemoryStore::evictions`]).
    pub evictions: u64,
    /// Bytes held by the store's tables ([`MemoryStore::memory_bytes`]).
    pub memory_bytes: usize,
}

impl<St, M> Clone for RateLimitLayer<St, M> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<St, M> fmt::Debug for RateLimitLayer<St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.shared.rt.policy)
            .field("timeout", &self.shared.timeout)
            .field("breaker", &self.shared.breaker)
            .finish_non_exhaustive()
    }
}

impl<S, St, M> Layer<S> for RateLimitLayer<St, M> {
    type Service = RateLimit<S, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`] with settings beyond the policy.
#[must_use]
pub struct RateLimitLayerBuilder<St> {
    store: St,
    policy: Policy,
    timeout: Duration,
    breaker: Option<CircuitBreaker>,
    clock: Arc<dyn Clock>,
    fallback_max_keys: usize,
    reset_on: Option<ResetOn<St>>,
}

impl<St> fmt::Debug for RateLimitLayerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("fallback_max_keys", &self.fallback_max_keys)
            .field("reset_on", &self.reset_on.is_some())
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// How long a store call may take before it counts as failed (default 50 ms; between 1 ms
    /// and one hour, or `build` refuses it).
    /// A store that answers at once (the in-memory store) never arms a timer. The time counts from
    /// `call`, where the store's `check` is made and first polled (so a store must not block in
    /// them), not from the first poll of the response future: a caller that polls it late does
    /// not extend it. Arming the timer needs a Tokio
    /// runtime with its time driver (`#[tokio::main]` has it; a hand-built runtime needs
    /// `enable_time`).
    ///
    /// A store with a response timeout of its own ([`Store::response_timeout`]; the Redis
    /// store's is 500 ms by default) should have it a little above this one (60 ms for the
    /// default 50 ms): `build` logs a warning when it is more than twice this and more than
    /// 50 ms above it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The circuit breaker's settings (default: [`CircuitBreaker::default`]). A store whose future
    /// is `std::future::Ready<Result<Decision, Infallible>>` (the in-memory store, or an `Arc` of
    /// it) gets no breaker: it answers at once and never fails, so it could never trip one.
    ///
    /// Keep the cool-down longer than the [`timeout`](Self::timeout) (the defaults: 10 s and
    /// 50 ms; `build` logs a warning otherwise): a shorter one keeps the circuit open for less
    /// time than one check may wait, and a stalled store is then asked about as often as the
    /// timeout allows. (Checks sent before a circuit opened that fail after a probe closed it do
    /// not count: see the breaker's docs.)
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// No circuit breaker: every request asks the store, however often it fails.
    pub fn no_circuit_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// The clock of the circuit breaker, of the local fallback store and of the once-a-second
    /// store-failure warnings (the system clock by default; a `ManualClock` in tests).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The most keys the local fallback store holds (with [`FailurePolicy::Fallback`]; default
    /// 1,000,000, at least 1; docs/memory-store.md gives the memory per key). The cap is split
    /// over the store's shards: when a shard is full, which can come a little before the store
    /// holds `max_keys` keys (docs/memory-store.md), it drops that shard's keys nearest to
    /// fresh.
    pub fn fallback_max_keys(mut self, max_keys: usize) -> Self {
        self.fallback_max_keys = max_keys;
        self
    }

    /// Forgets the client's count when the inner service's response meets `when`: a login
    /// limited per user name then counts only the failed attempts since the last success, and
    /// a gateway can do it for a login served behind it, whose handler it cannot change. (Within
    /// the app, a handler can call a [`Resetter`](crate::Resetter) instead.)
    ///
    /// The reset is that of [`Resetter::reset`](crate::Resetter::reset) with the request's key
    /// (under every limit of the policy), made after the inner service's response has come and
    /// before it is returned, so that the client's next request counts from a full quota: a
    /// matching response waits for the store's reset (one round trip on Redis, the calls for
    /// the policy's limits sent together; none for the in-memory store), at most the layer's
    /// [`timeout`](Self::timeout) (in a Tokio runtime; elsewhere the store's own, as for a
    /// `Resetter`). If the reset fails or times out the response goes out all the same, and the
    /// count stays. If the response is dropped first (the client went away), a reset already
    /// sent runs on in a task of its own (in a Tokio runtime). Resets are counted in
    /// `ratelimit_resets_total` by outcome, as a `Resetter`'s are (a matching response to a
    /// request without a key counts `no_key` and resets nothing).
    ///
    /// Not reset: an allow-listed request (not counted), and a response the layer wrote itself
    /// (a 429, a 503). A request let through without the store's answer (the store failed and
    /// the request failed open, was counted by the fallback's local share, or was a dry run's
    /// would-be denial; or its circuit is open and a lease answered), or whose circuit has opened
    /// by the time its response comes, resets only the fallback's local share, if there is one:
    /// the store, taken to be down, is not asked (which would hold the response up to the
    /// timeout), and the reset is counted as `skipped`.
    ///
    /// Once the store has reset the count, the response that met the condition carries the
    /// rate-limit fields of a full quota (those a client with nothing spent gets: `r` the binding
    /// quota's limit, no `t`), where the client's next request starts; its
    /// [`Verdict`](crate::Verdict) keeps the decision of its own check, made before the reset.
    /// A reset that failed, timed out or was skipped leaves the check's fields, since the count
    /// stands.
    ///
    /// The condition reads the response's head, not its body or trailers: a gRPC call's status
    /// comes in its trailers (in the headers only for a call that fails at once), so over gRPC
    /// the service marks a success in the head (an extension or a header) for the condition to
    /// read.
    ///
    /// Key the policy by the account being signed in to (a user name), not by client IP: keyed
    /// by IP, an attacker's success on an account of their own would reset the count of their
    /// address, and with it their guesses at other accounts. Failed attempts counted while a
    /// success's reset is on its way are forgotten with it.
    ///
    /// ```
    /// use axum::{Router, http::StatusCode, routing::post};
    /// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
    /// use tower_ratelimit::key::ApiKeyHeader;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Five failed sign-ins a minute per user name; a successful one clears them.
    /// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5)?)?;
    /// let policy = Policy::new("login", limit)?.key(ApiKeyHeader::new("x-user")?);
    /// let layer = RateLimitLayer::builder(MemoryStore::new(), policy)
    ///     .reset_on(|res| res.status().is_success())
    ///     .build()?;
    /// // On the method router: other methods get axum's 405 without spending an attempt.
    /// let app: Router = Router::new()
    ///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }).route_layer(layer));
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_on(
        mut self,
        when: impl Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self
    where
        St: Reset,
    {
        self.reset_on = Some(ResetOn::new(when, &self.policy.name));
        self
    }

    /// Builds the layer, or says which setting is wrong.
    pub fn build(self) -> Result<RateLimitLayer<St>, Error> {
        check_timeout(self.timeout)?;
        if self.fallback_max_keys == 0 {
            return Err(Error::InvalidSetting {
                name: "fallback_max_keys",
                reason: "must be at least 1",
            });
        }
        // A store whose answer is always ready at once and never an error (the in-memory store's
        // future, `Ready` with an `Infallible` error) can neither fail nor time out: it needs no
        // breaker, and its requests skip the breaker's check. A store with an `Infallible` error
        // whose future can wait keeps its breaker, since its timeouts count as failures.
        let always_answers = TypeId::of::<St::Future>()
            == TypeId::of::<Ready<Result<Decision, St::Error>>>()
            && TypeId::of::<St::Error>() == TypeId::of::<Infallible>();
        // (Not for a breaker that is never built.)
        if let Some(b) = &self.breaker
            && !always_answers
            && b.cool_down() <= self.timeout
        {
            tracing::warn!(
                policy = %self.policy.name,
                cool_down_ms = b.cool_down().as_millis() as u64,
                timeout_ms = self.timeout.as_millis() as u64,
                "circuit breaker cool-down not longer than the store timeout: an open circuit \
                 lets the store be asked again before one check may have timed out"
            );
        }
        // Twice, and at least 50 ms above: a store a few milliseconds above a layer of a few
        // milliseconds (the gateway example sets the layer's plus 10 ms) is as meant.
        let far_above = (self.timeout.saturating_mul(2)).max(self.timeout + FAR_ABOVE_AT_LEAST);
        if let Some(store_timeout) = self.store.response_timeout()
            && store_timeout > far_above
        {
            tracing::warn!(
                policy = %self.policy.name,
                store_timeout_ms = store_timeout.as_millis() as u64,
                timeout_ms = self.timeout.as_millis() as u64,
                "the store's own response timeout is more than twice the layer's and 50 ms above \
                 it: checks the layer gave up on wait in the store that long, and a server that stops answering \
                 is found out that much later; set the store's a little above the layer's"
            );
        }
        let fallback = match self.policy.failure {
            FailurePolicy::Fallback { .. } => Some(
                MemoryStore::builder()
                    .max_keys(self.fallback_max_keys)
                    .with_clock(self.clock.clone())
                    .build()?,
            ),
            _ => None,
        };
        let mut rt = Rt::new(self.policy)?;
        // A reset on a response needs the decision's kind to travel with the request.
        if self.reset_on.is_some() {
            rt.nothing_on_allowed = false;
            rt.nothing_on_other = false;
        }
        let verdict_in_request = rt.policy.verdict_in_request;
        let rt = Arc::new(rt);
        let breaker = self.breaker.filter(|_| !always_answers).map(|config| {
            Arc::new(Breaker::new(
                config,
                self.timeout,
                self.clock.clone(),
                &rt.metrics,
                rt.name.clone(),
                self.store.failure_domains(),
            ))
        });
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                rt,
                timeout: self.timeout,
                breaker,
                fallback,
                failed_log: LogGate::new(self.clock.clone()),
                timed_out_log: LogGate::new(self.clock.clone()),
                reset_logs: Arc::new(ResetLogs::new(self.clock)),
                home: match self.reset_on {
                    Some(_) => crate::home::Home::current(),
                    None => crate::home::Home::none(),
                },
                reset_on: self.reset_on,
                resetters: std::sync::atomic::AtomicBool::new(false),
                aside: std::sync::atomic::AtomicBool::new(verdict_in_request),
            }),
            _mode: PhantomData,
        })
    }
}
