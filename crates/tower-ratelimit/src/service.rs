//! The [`RateLimit`] service.

use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use quanta::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use ratelimit_core::{Clock, Decision, Limit, MemoryStore, Store};
use tower_service::Service;

use crate::body::{BodyMode, WrapBody};
use crate::circuit_breaker::{
    Admit, Breaker, BreakerCheck, CircuitState, FRESH, Probe, StoreCheck, TimedOut,
};
use crate::future::ResponseFuture;
use crate::key::{FastKey, KeyBuf};
use crate::log_gate::LogGate;
use crate::metrics::{FailureKind, Metrics};
use crate::policy::{MissingKey, Policy};
use crate::reset::{ResetMark, ResetOn, ResetPlan};
use crate::response::{Bodies, Own, Prepared, Verdict, VerdictKind};
use crate::{FailurePolicy, RateLimitLayer, RequestHead};

/// Middleware that limits requests by a [`Policy`] over a [`Store`].
///
/// Clones share one limiter (the state is behind an `Arc`). `poll_ready` is the inner service's:
/// the layer never applies backpressure; it answers denied requests with a 429 response, so an
/// infallible inner service stays infallible. See the [crate docs](crate).
///
/// `M` is the [`BodyMode`]: responses carry a [`ResponseBody`](crate::ResponseBody) around any
/// inner body by default, or keep the inner body type ([`RateLimitLayer::same_body`]).
pub struct RateLimit<S, St, M = WrapBody> {
    inner: S,
    shared: Arc<Shared<St>>,
    _mode: PhantomData<fn() -> M>,
}

/// On `RateLimit<()>` alone, so that `RateLimit::layer(..)` names no inner service: on every
/// `RateLimit<S, _>` it left `S` to infer, which nothing could (E0282).
impl<St> RateLimit<(), St> {
    /// A layer applying `policy` over `store` (the same as [`RateLimitLayer::new`]).
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Quota};
    /// use tower_ratelimit::{Policy, RateLimit};
    ///
    /// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     .layer(RateLimit::layer(MemoryStore::new(), Policy::new("api", limit)?)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn layer(store: St, policy: Policy) -> Result<RateLimitLayer<St>, crate::Error>
    where
        St: Store,
    {
        RateLimitLayer::new(store, policy)
    }
}

impl<S, St, M> RateLimit<S, St, M> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<St>>) -> Self {
        RateLimit {
            inner,
            shared,
            _mode: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The state of the store's circuit breaker (`None` if the layer has none: it was turned off,
    /// or the store always answers at once and cannot fail). With a store of several failure
    /// domains ([`Store::failure_domains`]), which has a circuit per domain: `Open` if any
    /// domain's circuit is open, else `HalfOpen` if any is probing, else `Closed`.
    pub fn circuit_state(&self) -> Option<CircuitState> {
        self.shared.breaker.as_ref().map(|b| b.state())
    }
}

impl<S: Clone, St, M> Clone for RateLimit<S, St, M> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, St, M> fmt::Debug for RateLimit<S, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", &self.shared.rt.policy)
            .finish_non_exhaustive()
    }
}

/// What every clone of a layer and its services shares.
pub(crate) struct Shared<St> {
    pub(crate) store: St,
    pub(crate) rt: Arc<Rt>,
    pub(crate) timeout: Duration,
    pub(crate) breaker: Option<Arc<Breaker>>,
    pub(crate) fallback: Option<MemoryStore<Arc<dyn Clock>>>,
    /// The store failed, or timed out: logged at most once a second each (without a breaker,
    /// every request of an outage would log one).
    pub(crate) failed_log: LogGate,
    pub(crate) timed_out_log: LogGate,
    /// A reset failed, or timed out: logged at most once a second each too (resets are no
    /// checks, so the breaker never stops them: a reset on every response of a login route,
    /// while resets fail, would log one a request). Shared with the resets' futures.
    pub(crate) reset_logs: Arc<ResetLogs>,
    /// The condition on the inner service's response that resets the client's count
    /// ([`RateLimitLayerBuilder::reset_on`](crate::RateLimitLayerBuilder::reset_on)).
    pub(crate) reset_on: Option<ResetOn<St>>,
    /// A [`Resetter`](crate::Resetter) of this layer has been made: each request let through
    /// with rate-limit fields from the store's answer carries a [`ResetMark`] in its extensions,
    /// which the `Resetter` sets when it resets that request's client, so that the response
    /// tells the full quota (see `Shared::mark`).
    pub(crate) resetters: AtomicBool,
    /// Requests let through go out of line (`call_resettable`), to be marked or given their
    /// verdict: `resetters`, or the policy's
    /// [`verdict_in_request`](crate::Policy::verdict_in_request). One flag, so that the path of
    /// a layer with neither tests one.
    pub(crate) aside: AtomicBool,
    /// Where a `reset_on` reset runs on after its response was dropped (see [`crate::home`]);
    /// none without `reset_on`.
    pub(crate) home: crate::home::Home,
}

/// The log gates of a layer's resets: failed (the store's error), and timed out.
pub(crate) struct ResetLogs {
    pub(crate) failed: LogGate,
    pub(crate) timed_out: LogGate,
}

impl ResetLogs {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        ResetLogs {
            failed: LogGate::new(clock.clone()),
            timed_out: LogGate::new(clock),
        }
    }
}

/// The policy and everything computed from it once.
pub(crate) struct Rt {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) tiers: Box<[Tier]>,
    /// A key holding `<name>\0`, the namespace of extracted keys: each request's key starts as
    /// a copy of it (a copy of the whole buffer took fewer instructions than zeroing one and
    /// appending the namespace).
    pub(crate) key_start: KeyBuf,
    /// Allowed requests get the rate-limit fields (some are on for them, and not a dry run).
    pub(crate) headers_on_allowed: bool,
    /// Allowed requests get neither the fields nor the verdict: nothing travels with them (and
    /// the layer does not reset on a response, which needs the decision's kind).
    pub(crate) nothing_on_allowed: bool,
    /// The same for the other requests let through (no verdict, no reset on a response).
    pub(crate) nothing_on_other: bool,
    /// `<name>\x01`: the namespace of the shared missing-key key.
    pub(crate) shared_prefix: Box<[u8]>,
    pub(crate) bodies: Bodies,
    pub(crate) metrics: Metrics,
    /// Whether an unknown tier name has been warned of (see `Rt::unknown_tier`).
    unknown_tier_warned: AtomicBool,
}

pub(crate) struct Tier {
    pub(crate) name: Option<Cow<'static, str>>,
    pub(crate) limit: Limit,
    /// The local share counted while the store is down, and its header values: a fallback
    /// decision advertises the quota it was made against.
    pub(crate) fallback: Option<(Limit, Prepared)>,
    pub(crate) prepared: Prepared,
}

impl Tier {
    /// The header values for a decision made against the shared limit or, if `fallback`, the
    /// local share.
    fn prepared(&self, fallback: bool) -> &Prepared {
        match (&self.fallback, fallback) {
            (Some((_, local)), true) => local,
            _ => &self.prepared,
        }
    }

    /// What a check of the shared limit tells a client with nothing spent (a peek at a fresh
    /// state: every quota full, the binding one the smallest): the state a reset leaves.
    #[cold]
    fn full(&self) -> Decision {
        let start = ratelimit_core::Timestamp::from_micros(0);
        self.limit
            .check(&mut self.limit.fresh_states(start), start, 0)
    }
}

impl Rt {
    pub(crate) fn new(policy: Policy) -> Result<Rt, crate::Error> {
        // The constructors' checks, again for values built directly (public enum variants).
        policy.missing_key.check()?;
        policy.failure.check()?;
        if !policy.tiers.is_empty() && policy.resolve_tier.is_none() {
            return Err(crate::Error::InvalidSetting {
                name: "tiers",
                reason: "a policy with tiers needs a resolver (`Policy::resolve_tier`): without \
                         one every request gets the base limit",
            });
        }
        let name = policy.name.clone();
        let gateways = match policy.failure {
            FailurePolicy::Fallback { gateways } => Some(gateways),
            _ => None,
        };
        let mut tiers = Vec::with_capacity(1 + policy.tiers.len());
        let all = std::iter::once((None, &policy.limit))
            .chain(policy.tiers.iter().map(|(n, l)| (Some(n.clone()), l)));
        for (tier_name, limit) in all {
            let fallback = match gateways {
                Some(n) => {
                    let local = limit
                        .divided(n)
                        .map_err(|source| crate::Error::FallbackShare {
                            gateways: n,
                            tier: tier_name.as_deref().map(str::to_owned),
                            source,
                        })?;
                    let prepared = Prepared::new(&name, &local);
                    Some((local, prepared))
                }
                None => None,
            };
            tiers.push(Tier {
                name: tier_name,
                limit: limit.clone(),
                fallback,
                prepared: Prepared::new(&name, limit),
            });
        }
        let headers_on_allowed = policy.headers.any_on_allowed() && !policy.dry_run;
        let mut key_start = KeyBuf::new();
        key_start.push(name.as_bytes());
        key_start.push(&[0]);
        let mut shared_prefix = name.as_bytes().to_vec();
        shared_prefix.push(1);
        Ok(Rt {
            bodies: bodies(&policy),
            metrics: Metrics::new(&name, policy.tiers.iter().map(|(n, _)| n.as_ref())),
            tiers: tiers.into_boxed_slice(),
            key_start,
            headers_on_allowed,
            nothing_on_allowed: !headers_on_allowed
                && !policy.verdict
                && !policy.verdict_in_request,
            nothing_on_other: !policy.verdict && !policy.verdict_in_request,
            shared_prefix: shared_prefix.into_boxed_slice(),
            unknown_tier_warned: AtomicBool::new(false),
            name,
            policy,
        })
    }

    #[inline]
    fn tier_for(&self, req: &RequestHead<'_>) -> usize {
        match &self.policy.resolve_tier {
            None => 0,
            Some(resolve) => self.resolved_tier(resolve, req),
        }
    }

    fn resolved_tier(&self, resolve: &crate::policy::TierFn, req: &RequestHead<'_>) -> usize {
        match resolve.resolve(req) {
            Some(wanted) => match self
                .tiers
                .iter()
                .position(|t| t.name.as_deref() == Some(wanted))
            {
                Some(tier) => tier,
                None => {
                    self.unknown_tier(wanted);
                    0
                }
            },
            None => 0,
        }
    }

    /// The resolver named a tier the policy does not have (`"Pro"` for `"pro"`, say): the
    /// policy's own limit applies, as documented, and the first time it happens is a warning,
    /// since every such client is held to that limit without anything else saying so.
    #[cold]
    fn unknown_tier(&self, wanted: &str) {
        if !self.unknown_tier_warned.swap(true, Ordering::Relaxed) {
            let tiers: Vec<&str> = self
                .tiers
                .iter()
                .filter_map(|t| t.name.as_deref())
                .collect();
            tracing::warn!(
                policy = %self.name,
                tier = wanted,
                known = ?tiers,
                "the tier resolver named a tier this policy does not have: such requests get the \
                 policy's own limit (said once)"
            );
        }
    }
}

/// What to do with the request: `W` is what `call` waits for when the store cannot answer at
/// once ([`Pending`]); after the store has answered nothing can wait, and `W` is `Infallible`.
/// The decision and the wait are one enum so that `call` gets either written in place.
pub(crate) enum Step<W = Infallible> {
    /// Call the inner service; then add the headers and the verdict, if there are any to add.
    Forward(Option<Post>),
    /// Answer with the layer's own response (its body becomes the body mode's).
    Respond(Response<Bytes>),
    /// Wait for the store.
    Wait(W),
}

impl<W> Step<W> {
    /// The step of a request let through without the store (it failed, or its circuit is
    /// open): a reset after its response leaves the store alone (see `Shared::reset_plan`).
    fn without_store(mut self) -> Self {
        if let Step::Forward(Some(post)) = &mut self {
            post.without_store = true;
        }
        self
    }
}

/// What to add to the inner service's response: the headers, the verdict, or both; and what a
/// reset after the response needs to know.
pub(crate) struct Post {
    rt: Arc<Rt>,
    kind: VerdictKind,
    decision: Option<Decision>,
    /// The tier's index, in 32 bits (a policy's tiers are far fewer, each holding a `Limit`):
    /// the 8 bytes this saves keep the response future's size when it carries a `Resetter`'s
    /// mark (`Kind::Marked`), so the future the inner service's router moves is no larger.
    tier: u32,
    headers: bool,
    verdict: bool,
    /// Let through without the store's answer (failed open, by the fallback, a dry run's
    /// would-be denial of either, a cached answer while the circuit is open).
    without_store: bool,
}

impl fmt::Debug for Post {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Post")
            .field("kind", &self.kind)
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl Post {
    /// How the request was let through.
    pub(crate) fn kind(&self) -> VerdictKind {
        self.kind
    }

    /// Whether it was let through without the store's answer.
    pub(crate) fn without_store(&self) -> bool {
        self.without_store
    }

    /// Adds the headers and the verdict to `response` where it is.
    pub(crate) fn apply_to<R>(self, response: &mut Response<R>) {
        self.apply(response, false);
    }

    /// [`apply`](Self::apply), out of line: for a request marked for a `Resetter`.
    #[inline(never)]
    pub(crate) fn apply_after_reset<R>(self, response: &mut Response<R>, after_reset: bool) {
        self.apply(response, after_reset);
    }

    /// [`apply_to`](Self::apply_to); if `after_reset`, the fields tell the full quota the
    /// client's count was reset to instead of the check's decision (the verdict keeps the
    /// check's).
    #[inline(always)]
    fn apply<R>(self, response: &mut Response<R>, after_reset: bool) {
        if let (true, Some(d)) = (self.headers, &self.decision) {
            let tier = &self.rt.tiers[self.tier as usize];
            let full;
            let d = if after_reset {
                full = tier.full();
                &full
            } else {
                d
            };
            let fallback = self.kind == VerdictKind::FallbackAllowed;
            tier.prepared(fallback)
                .write(response.headers_mut(), self.rt.policy.headers, d);
        }
        // An inner rate-limit layer's verdict stays: it is the one that decided this response (as
        // its header fields stay), unless it only let the request through and this layer has
        // more to say (a shadow denial, a failed-open or fallback answer).
        if self.verdict && self.kind.outranks(response.extensions().get::<Verdict>()) {
            response.extensions_mut().insert(Verdict::new(
                self.rt,
                self.kind,
                self.decision,
                self.tier as usize,
            ));
        }
    }

    /// `response` with what `post` adds, if anything; if `reset`, the client's count was reset
    /// after its check, and the fields tell the full quota its next request starts from.
    pub(crate) fn apply_some<M: BodyMode<B>, B>(
        post: Option<Post>,
        response: Response<B>,
        reset: bool,
    ) -> Response<M::Body> {
        let mut response = response.map(M::inner);
        if let Some(post) = post {
            post.apply(&mut response, reset);
        }
        response
    }
}

impl<St> Shared<St> {
    /// Puts `post`'s verdict in `req`'s extensions, for the handler, if the policy says so
    /// ([`Policy::verdict_in_request`](crate::Policy::verdict_in_request)).
    pub(crate) fn lend_verdict<B>(&self, req: &mut Request<B>, post: Option<&Post>) {
        if let Some(post) = post
            && self.rt.policy.verdict_in_request
        {
            req.extensions_mut().insert(Verdict::new(
                post.rt.clone(),
                post.kind,
                post.decision,
                post.tier as usize,
            ));
        }
    }

    /// Marks `req`, let through with `post`, for the [`Resetter`](crate::Resetter)s of this
    /// layer, if one has been made and the response gets rate-limit fields from the store's
    /// answer: the returned mark is set once a `Resetter` has reset the client the layer checked
    /// (the key it extracts now), and the response's fields then tell the full quota. Not a
    /// request let through without the store's answer (the fallback's local share counted it,
    /// say): its fields keep that count, as they do after a reset on a response
    /// ([`reset_on`](crate::RateLimitLayerBuilder::reset_on)), which skips the store for such a
    /// request.
    #[inline]
    pub(crate) fn mark<B>(
        &self,
        req: &mut Request<B>,
        post: Option<&Post>,
    ) -> Option<Arc<ResetMark>> {
        let marks = self.resetters.load(Ordering::Relaxed)
            && post.is_some_and(|p| p.headers && p.decision.is_some() && !p.without_store);
        if !marks {
            return None;
        }
        self.mark_for_resetters(req)
    }

    #[cold]
    #[inline(never)]
    fn mark_for_resetters<B>(&self, req: &mut Request<B>) -> Option<Arc<ResetMark>> {
        let rt = &self.rt;
        let mut key = rt.key_start.clone();
        rt.policy
            .key
            .extract(&RequestHead::of(req), &mut key)
            .ok()?;
        Some(ResetMark::put_in(req.extensions_mut(), rt, key))
    }
}

impl<St: Store> Shared<St> {
    /// `decision` by reference, copied only into a `Post`: taken by value, it was copied in
    /// before the check that there is nothing to add.
    #[inline]
    fn forward<W>(&self, kind: VerdictKind, decision: Option<&Decision>, tier: usize) -> Step<W> {
        let rt = &self.rt;
        rt.metrics.decision(kind, tier);
        let allowed = matches!(kind, VerdictKind::Allowed | VerdictKind::FallbackAllowed);
        let headers = allowed && rt.headers_on_allowed;
        let verdict = rt.policy.verdict;
        // One flag for the allowed path (the two it stands for took eight instructions).
        let nothing = if allowed {
            rt.nothing_on_allowed
        } else {
            rt.nothing_on_other
        };
        if nothing {
            // Nothing to add: no reference to the policy travels with the request, and no field
            // of a `Post` is written (`bool::then` wrote them all, then the `None`).
            return Step::Forward(None);
        }
        Step::Forward(Some(Post {
            rt: rt.clone(),
            kind,
            decision: decision.copied(),
            tier: tier as u32,
            headers,
            verdict,
            without_store: false,
        }))
    }

    fn respond<W>(
        &self,
        kind: VerdictKind,
        decision: Option<Decision>,
        tier: usize,
        mut response: Response<Bytes>,
    ) -> Step<W> {
        self.rt.metrics.decision(kind, tier);
        if self.rt.policy.verdict {
            response
                .extensions_mut()
                .insert(Verdict::new(self.rt.clone(), kind, decision, tier));
        }
        Step::Respond(response)
    }

    /// A decision from the store (or the fallback). By reference, copied only into what needs
    /// it: moved through here, it was copied twice on every request (12 instructions), with
    /// nothing to add.
    #[inline]
    fn decide<W>(&self, d: &Decision, tier: usize, fallback: bool) -> Step<W> {
        if d.is_allowed() {
            let kind = if fallback {
                VerdictKind::FallbackAllowed
            } else {
                VerdictKind::Allowed
            };
            self.forward(kind, Some(d), tier)
        } else {
            self.deny(*d, tier, fallback, None)
        }
    }

    /// A denial from the store (or the fallback): a 429, or in a dry run the request forwarded.
    /// `until_store`: for a cost the fallback's share can never admit but the shared limit can,
    /// when the store will be asked again (see `on_failure`). Out of line, so that the allowed
    /// path stays small.
    #[inline(never)]
    fn deny<W>(
        &self,
        d: Decision,
        tier: usize,
        fallback: bool,
        until_store: Option<Duration>,
    ) -> Step<W> {
        let rt = &self.rt;
        if rt.policy.dry_run {
            tracing::debug!(policy = %rt.name, fallback, "rate limit would deny (dry run)");
            return self.forward(VerdictKind::ShadowDenied, Some(&d), tier);
        }
        let kind = if fallback {
            VerdictKind::FallbackDenied
        } else {
            VerdictKind::Denied
        };
        tracing::debug!(
            policy = %rt.name,
            fallback,
            retry_after_ms = d.retry_after().or(until_store).map(|w| w.as_millis() as u64),
            "rate limit denied request"
        );
        let response = rt.bodies.denied(
            &rt.name,
            rt.tiers[tier].name.as_deref(),
            rt.tiers[tier].prepared(fallback),
            rt.policy.headers,
            &d,
            until_store,
        );
        self.respond(kind, Some(d), tier, response)
    }

    /// No key in the request: the configured answer, or `None` with `key` set to the shared
    /// fallback key. A request that sent its key in a form the extractor cannot use
    /// ([`KeyExtractor::unusable`](crate::key::KeyExtractor::unusable)) is not counted under the
    /// shared key: it gets the answer a shared key has none of, 400. Out of line, so that the
    /// key's path stays small; not `#[cold]`, since a policy with a shared fallback key may take
    /// it on many requests.
    #[inline(never)]
    fn missing_key<W>(
        &self,
        tier: usize,
        key: &mut KeyBuf,
        req: &RequestHead<'_>,
    ) -> Option<Step<W>> {
        let rt = &self.rt;
        let challenge = match &rt.policy.missing_key {
            MissingKey::SharedKey(shared_key) if !rt.policy.key.unusable(req) => {
                key.truncate(0);
                key.push(&rt.shared_prefix);
                key.push(shared_key);
                return None;
            }
            _ if rt.policy.dry_run => {
                return Some(self.forward(VerdictKind::ShadowDenied, None, tier));
            }
            MissingKey::Reject(_) | MissingKey::SharedKey(_) => None,
            MissingKey::Unauthorized(challenge) => Some(challenge),
        };
        tracing::debug!(policy = %rt.name, "no rate-limit key in request");
        let mut response = rt.bodies.error(Own::NoKey, None);
        if let Some(challenge) = challenge {
            response
                .headers_mut()
                .insert(http::header::WWW_AUTHENTICATE, challenge.clone());
        }
        Some(self.respond(VerdictKind::NoKey, None, tier, response))
    }

    /// The key's circuit is open: the store is not asked. What a store holds in front of the one
    /// it wraps still answers (a cached denial, units of a lease: [`Store::check_cached`]), so
    /// that a client known to be over its limit is denied during the outage too; else the
    /// failure policy does. Out of line, as the breaker's code is not on the allowed path.
    #[inline(never)]
    fn circuit_open<W>(&self, tier: usize, key: &[u8], cost: u64) -> Step<W> {
        if let Some(d) = self
            .store
            .check_cached(key, &self.rt.tiers[tier].limit, cost)
        {
            // Answered without the store, which is taken to be down.
            return self.decide(&d, tier, false).without_store();
        }
        self.on_failure(FailureKind::CircuitOpen, PART_UNKNOWN, tier, key, cost)
    }

    /// The store could not answer. `part`: the key's circuit, or `PART_UNKNOWN` for this to look
    /// up if it needs it.
    fn on_failure<W>(
        &self,
        kind: FailureKind,
        part: usize,
        tier: usize,
        key: &[u8],
        cost: u64,
    ) -> Step<W> {
        let rt = &self.rt;
        rt.metrics.failure(kind);
        let step = match rt.policy.failure {
            FailurePolicy::FailOpen => self.forward(VerdictKind::FailedOpen, None, tier),
            FailurePolicy::FailClosed { .. } if rt.policy.dry_run => {
                self.forward(VerdictKind::ShadowDenied, None, tier)
            }
            FailurePolicy::FailClosed { retry_after } => {
                let response = rt.bodies.error(Own::FailClosed, Some(retry_after));
                self.respond(VerdictKind::FailedClosed, None, tier, response)
            }
            FailurePolicy::Fallback { .. } => {
                let t = &rt.tiers[tier];
                match (&self.fallback, &t.fallback) {
                    (Some(store), Some((limit, _))) => {
                        let d = store.check_now(key, limit, cost);
                        if d.is_allowed() || d.can_ever_pass() || cost > t.limit.max_cost() {
                            self.decide(&d, tier, true)
                        } else {
                            // A cost above the local share that the shared limit can admit:
                            // denied only until the store is back, so the client is told when
                            // the layer asks the store again (what is left of the cool-down of
                            // the key's circuit, if open, this failure having opened it or not;
                            // at least 1 s, the next request asking it when the circuit is
                            // closed or its probe is out) instead of nothing, which says the cost
                            // will never pass.
                            let next_probe = self
                                .breaker
                                .as_ref()
                                .and_then(|b| b.next_probe_in(self.part(part, key)));
                            let until_store =
                                next_probe.map_or(MIN_UNTIL_STORE, |d| d.max(MIN_UNTIL_STORE));
                            self.deny(d, tier, true, Some(until_store))
                        }
                    }
                    // Built together by `Rt::new` and the layer builder; never apart.
                    _ => self.forward(VerdictKind::FailedOpen, None, tier),
                }
            }
        };
        step.without_store()
    }

    /// The store's answer. A success is evidence of the store's health unless it was answered
    /// from a cache in front of the store ([`Decision::is_cached`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn after_check<W>(
        &self,
        result: Result<Decision, St::Error>,
        part: usize,
        probe: Option<Probe>,
        seen: u64,
        tier: usize,
        key: &[u8],
        cost: u64,
    ) -> Step<W> {
        match &result {
            Ok(d) => {
                if let Some(b) = &self.breaker {
                    self.answered(b, part, d, probe, key);
                }
                self.decide(d, tier, false)
            }
            Err(error) => {
                let part = self.part(part, key);
                if let Some(b) = &self.breaker {
                    b.failure(part, probe, seen);
                }
                if let Some(held_back) = self.failed_log.pass() {
                    tracing::warn!(
                        policy = %self.rt.name,
                        %error,
                        held_back,
                        "rate-limit store failed"
                    );
                }
                self.on_failure(FailureKind::Error, part, tier, key, cost)
            }
        }
    }

    /// The key's circuit (its store's failure domain, modulo the breaker's circuits) and
    /// whether the check may ask the store. Out of line, as the breaker's code is not on the path
    /// of a layer without one (the in-memory store's).
    #[inline(never)]
    fn admit(&self, b: &Breaker, key: &[u8]) -> (usize, Admit) {
        if b.parts() == 1 {
            (0, b.admit(0))
        } else if b.is_clean() {
            (PART_UNKNOWN, Admit::Call)
        } else {
            let part = self.part(PART_UNKNOWN, key);
            (part, b.admit(part))
        }
    }

    /// The store answered `d`: evidence for the key's circuit (none needed from a clean breaker
    /// without a probe out). Out of line, as [`Shared::admit`].
    #[inline(never)]
    fn answered(&self, b: &Breaker, part: usize, d: &Decision, probe: Option<Probe>, key: &[u8]) {
        if part != PART_UNKNOWN || !b.is_clean() {
            b.answered(self.part(part, key), d, probe);
        }
    }

    /// Whether `key`'s circuit is closed (or there is no breaker): a `reset_on` reset, which
    /// holds its response, asks the store only then.
    pub(crate) fn circuit_closed(&self, key: &[u8]) -> bool {
        match &self.breaker {
            Some(b) if !b.is_clean() => {
                b.part_state(self.part(PART_UNKNOWN, key)) == CircuitState::Closed
            }
            _ => true,
        }
    }

    /// Whether a `Resetter`'s reset of `key` asks the store: its circuit is closed (or there is
    /// no breaker), or open and cooled down, its probe not yet taken (a route without checks
    /// since its outage: the store is asked again, as a check would ask it, without taking the
    /// probe, which stays a check's). Not while it cools down (its store is taken to be down),
    /// nor while a probe is out (its single call is the probe's).
    pub(crate) fn circuit_lets_through(&self, key: &[u8]) -> bool {
        match &self.breaker {
            Some(b) if !b.is_clean() => !b.rejects(self.part(PART_UNKNOWN, key)),
            _ => true,
        }
    }

    /// `part`, or `key`'s failure domain (modulo the breaker's circuits) if it was not looked
    /// up ([`PART_UNKNOWN`]).
    fn part(&self, part: usize, key: &[u8]) -> usize {
        match &self.breaker {
            Some(b) if part == PART_UNKNOWN => self.store.failure_domain(key) % b.parts(),
            _ => part,
        }
    }

    fn after_timeout(
        &self,
        part: usize,
        probe: Option<Probe>,
        seen: u64,
        tier: usize,
        key: &[u8],
        cost: u64,
    ) -> Step {
        let part = self.part(part, key);
        if let Some(b) = &self.breaker {
            b.failure(part, probe, seen);
        }
        if let Some(held_back) = self.timed_out_log.pass() {
            tracing::warn!(
                policy = %self.rt.name,
                timeout_ms = self.timeout.as_millis() as u64,
                held_back,
                "rate-limit store timed out"
            );
        }
        self.on_failure(FailureKind::Timeout, part, tier, key, cost)
    }
}

impl<S, St, M, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, St, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    M: BodyMode<ResB>,
    M::Body: Send + 'static,
    St: Store,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The request is read in place (a borrowed head, not `into_parts`, which would copy the
        // head out and `from_parts` back in), and passed on as it came.
        // One place builds the future, so that it is written in place, not built and then copied
        // out (a memcpy of the whole future per request).
        let step = self.shared.next(&RequestHead::of(&req));
        if let Step::Forward(None) = &step {
            // Nothing to add, spelled out so that the empty `Option<Post>` is written as such
            // rather than copied out of the step. The step holds nothing to drop: forgotten, so
            // that its variant is not tested again after the inner call, for its drop.
            std::mem::forget(step);
            return ResponseFuture::inner(self.inner.call(req), None);
        }
        match step {
            Step::Forward(post) => match &self.shared.reset_on {
                None if !self.shared.aside.load(Ordering::Relaxed) => {
                    ResponseFuture::inner(self.inner.call(req), post)
                }
                // Built out of line: a second way of building the inner future here would have
                // it built aside and copied into place on every request. Unwrapped here rather
                // than returned as it is: with a call writing this function's return place,
                // rustc marks that place as one whose address may be captured, and the router's
                // `MapFuture::call` then copied the whole future once more before boxing it (392
                // bytes, 64 instructions a request, whichever way this call went).
                _ => self.call_resettable(req, post).0,
            },
            Step::Respond(response) => {
                let response = self
                    .shared
                    .rt
                    .bodies
                    .for_request(response, &RequestHead::of(&req));
                ResponseFuture::ready(response.map(M::full))
            }
            // The store has to wait: move the check, its timeout and a ready inner service into
            // a boxed future.
            Step::Wait(Pending {
                check,
                start,
                part,
                probe,
                seen,
                tier,
                key,
                cost,
            }) => {
                let shared = self.shared.clone();
                let ready_inner = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready_inner);
                // Made here, not in the async block: the check was sent by the poll in `next`, so
                // a future dropped before its first poll is cancelled too, and a probe's check has
                // to settle the circuit all the same.
                let mut cancelled = Cancelled(Some(shared.rt.metrics.cancelled.clone()));
                // The store's time counts from here, where the check was sent, like a probe's:
                // a caller that polls the response late (a busy executor, a queue between call
                // and poll) does not extend it. Only the deadline is taken here; the timer is
                // made at the first poll, so that `call` needs no Tokio runtime (reading Tokio's
                // clock does not). (A check made outside any runtime is sent at that first
                // poll instead, the Redis store's yielding here: its time still counts from
                // here.)
                // With a breaker, a check whose request is dropped before the answer runs on
                // in a task of its own, and its answer or timeout counts (see `BreakerCheck`):
                // so its circuit is looked up now if the breaker was clean, once for both.
                let part = shared.part(part, key.as_bytes());
                let check = match &shared.breaker {
                    Some(b) => Check::Breaker(BreakerCheck::new(
                        b.clone(),
                        part,
                        probe,
                        seen,
                        check,
                        shared.timeout,
                    )),
                    None => Check::Plain {
                        check,
                        deadline: tokio::time::Instant::now() + shared.timeout,
                    },
                };
                // The key moves into the future as it is (inline up to its buffer size): no copy.
                ResponseFuture::waiting(Box::pin(async move {
                    let mut req = req;
                    let result = match check {
                        Check::Plain { check, deadline } => {
                            tokio::time::timeout_at(deadline, check)
                                .await
                                .map_err(|_| TimedOut)
                        }
                        Check::Breaker(check) => check.await,
                    };
                    cancelled.answered();
                    shared.rt.metrics.store_duration(start.elapsed());
                    let step = match result {
                        Ok(result) => shared.after_check(
                            result,
                            part,
                            probe,
                            seen,
                            tier,
                            key.as_bytes(),
                            cost,
                        ),
                        Err(_elapsed) => {
                            shared.after_timeout(part, probe, seen, tier, key.as_bytes(), cost)
                        }
                    };
                    match step {
                        Step::Forward(post) => {
                            shared.lend_verdict(&mut req, post.as_ref());
                            let plan = shared.reset_plan(post.as_ref(), &RequestHead::of(&req));
                            let mark = shared.mark(&mut req, post.as_ref());
                            let fut = inner.call(req);
                            forwarded::<M, _, _, _, _>(&shared, fut, post, plan, mark).await
                        }
                        Step::Respond(response) => {
                            let response = shared
                                .rt
                                .bodies
                                .for_request(response, &RequestHead::of(&req));
                            Ok(response.map(M::full))
                        }
                        Step::Wait(never) => match never {},
                    }
                }))
            }
        }
    }
}

impl<S, St: Store, M> RateLimit<S, St, M> {
    /// The request let through with `post` by a layer that resets on a response, of which a
    /// [`Resetter`](crate::Resetter) has been made, or that puts its verdict in the request
    /// ([`Policy::verdict_in_request`](crate::Policy::verdict_in_request)): put there first.
    /// With the layer's condition ([`reset_on`](crate::RateLimitLayerBuilder::reset_on)), the
    /// client's count is reset if the inner service's response meets it, before the response is
    /// returned, so that the client's next request counts from a full quota; with a `Resetter`,
    /// the request is marked for it first (see `Shared::mark`). The response's fields tell the
    /// full quota if either reset forgot the client's count. Out of line, off the path of a layer
    /// with none of these. With a
    /// condition the future is boxed (the reset is waited for after the response); a mark alone
    /// needs no box. A request neither applies to (no condition, and not marked: no fields to
    /// add, or let through without the store's answer) goes as through such a layer.
    #[cold]
    #[inline(never)]
    fn call_resettable<ReqB, ResB>(
        &mut self,
        mut req: Request<ReqB>,
        post: Option<Post>,
    ) -> Built<ResponseFuture<S::Future, ResB, S::Error, M>>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResB: Send + 'static,
        M: BodyMode<ResB>,
    {
        self.shared.lend_verdict(&mut req, post.as_ref());
        if self.shared.reset_on.is_none() {
            // A mark alone needs nothing waited for after the response: no box.
            return Built(match self.shared.mark(&mut req, post.as_ref()) {
                Some(mark) => ResponseFuture::marked(self.inner.call(req), post, mark),
                None => ResponseFuture::inner(self.inner.call(req), post),
            });
        }
        let plan = self
            .shared
            .reset_plan(post.as_ref(), &RequestHead::of(&req));
        let mark = self.shared.mark(&mut req, post.as_ref());
        let shared = self.shared.clone();
        let fut = self.inner.call(req);
        Built(ResponseFuture::waiting(Box::pin(async move {
            forwarded::<M, _, _, _, _>(&shared, fut, post, plan, mark).await
        })))
    }
}

/// A response future built out of line, for `call` to take out of this wrapper (see there).
struct Built<F>(F);

/// The inner service's response to a request let through: the reset `plan` asks for if the
/// response meets the layer's condition (waited for), then what `post` adds (the full quota if
/// either that reset or a `Resetter`'s, which sets `mark`, forgot the client's count).
async fn forwarded<M, St, F, ResB, E>(
    shared: &Shared<St>,
    fut: F,
    post: Option<Post>,
    plan: Option<ResetPlan>,
    mark: Option<Arc<ResetMark>>,
) -> Result<Response<M::Body>, E>
where
    M: BodyMode<ResB>,
    F: Future<Output = Result<Response<ResB>, E>>,
{
    let response = fut.await?;
    let reset = match plan.and_then(|plan| shared.reset_after(&response, plan)) {
        Some(reset) => reset.await,
        None => false,
    };
    let reset = reset || mark.is_some_and(|mark| mark.is_set());
    Ok(Post::apply_some::<M, ResB>(post, response, reset))
}

/// A store check that has to wait, cut at its deadline: with a breaker, it settles the circuit
/// even if its request is dropped.
enum Check<F>
where
    F: StoreCheck,
{
    /// No breaker to settle.
    Plain {
        check: F,
        deadline: tokio::time::Instant,
    },
    Breaker(BreakerCheck<F>),
}

/// Counts a check whose request was dropped before the store answered (the client went away, or
/// a caller's timeout fired), unless taken once the answer came.
struct Cancelled(Option<::metrics::Counter>);

impl Cancelled {
    fn answered(&mut self) {
        self.0 = None;
    }
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some(counter) = self.0.take() {
            counter.increment(1);
        }
    }
}

/// A store check that has to wait, and what its answer is for.
struct Pending<F> {
    check: F,
    /// When the check was sent, for the store latency histogram.
    start: Instant,
    /// The circuit the check goes through: its key's failure domain (0 without a breaker;
    /// `PART_UNKNOWN` if a clean breaker did not look it up).
    part: usize,
    probe: Option<Probe>,
    /// The breaker's closes when the check was made (see `Breaker::seen`; 0 without one).
    seen: u64,
    tier: usize,
    key: KeyBuf,
    cost: u64,
}

impl<St: Store> Shared<St> {
    /// The request's decision, if it can be made at once (allow-listed, no key, an open circuit,
    /// or a store that answers at once), or the store check to wait for.
    ///
    /// Inlined into `call`, its one caller (`#[inline]` alone was not taken): the step is then
    /// built where `call` reads it instead of returned through memory (17 fewer instructions a
    /// request; the time it saved is in docs/benchmarks.md).
    #[inline(always)]
    fn next(&self, req: &RequestHead<'_>) -> Step<Pending<St::Future>> {
        let rt = &*self.rt;
        if let Some(allow) = &rt.policy.allow
            && allow(req)
        {
            return self.forward(VerdictKind::AllowListed, None, 0);
        }

        let mut tier = rt.tier_for(req);
        let mut key = rt.key_start.clone();
        let found = match &rt.policy.fast_key {
            #[cfg(feature = "axum")]
            FastKey::ClientIp(k) => crate::key::KeyExtractor::extract(k, req, &mut key),
            FastKey::Dyn => rt.policy.key.extract(req, &mut key),
        };
        if found.is_err() {
            if let Some(step) = self.missing_key(tier, &mut key, req) {
                return step;
            }
            // The shared key is counted under the policy's own limit: the tier was read from the
            // same request that carries no usable key, so a client could otherwise pick the
            // shared bucket of a higher tier.
            tier = 0;
        }
        let cost = rt.policy.cost.as_ref().map_or(1, |cost| cost(req));

        // With a breaker, the key's circuit: one per failure domain of the store (a Redis
        // Cluster's keys fail by master), so that one part's failures stop only its own checks.
        // While every circuit is closed and counts no failure, the part is found only when it
        // matters (the check fails, or has to wait): a denial-cache hit does not pay for it.
        let (part, probe) = match &self.breaker {
            None => (0, None),
            Some(b) => match self.admit(b, key.as_bytes()) {
                // The circuit is left to `on_failure` to find again if it needs it (rarely):
                // carried out of this arm, it cost the allowed path 2 instructions.
                (_, Admit::Reject) => return self.circuit_open(tier, key.as_bytes(), cost),
                (part, Admit::Probe(probe)) => (part, Some(probe)),
                (part, Admit::Call) => (part, None),
            },
        };

        // Store latency: an answer that comes at once (the in-memory store, a cached denial) is
        // timed about one call in TIMING_SAMPLE, since reading the clock twice cost about 20 ns a
        // request (docs/benchmarks.md); an answer that has to wait is always timed, to its answer
        // from its first poll (which sends the command): from the poll's start if this call is
        // sampled, else from its end, which leaves out the time the poll took to hand the
        // command over (not the round trip).
        let sampled = sample_timing().then(Instant::now);
        // Read once for the check and its answer (each `as_bytes` tests where the key is).
        let key_bytes = key.as_bytes();
        let mut check = self.store.check(key_bytes, &rt.tiers[tier].limit, cost);
        // The in-memory store's future is already complete: poll it once here, so that an
        // immediate answer needs no timer, no allocation and no waker. This poll may be outside
        // any runtime (`call` needs none): a store that needs one yields there (the Redis
        // store's does; see `Store`).
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(result) = Pin::new(&mut check).poll(&mut cx) {
            if let Some(start) = sampled {
                rt.metrics.store_duration(start.elapsed());
            }
            // Answered at once: a failure as fresh as the check (`FRESH`).
            return self.after_check(result, part, probe, FRESH, tier, key_bytes, cost);
        }
        Step::Wait(Pending {
            check,
            start: sampled.unwrap_or_else(Instant::now),
            part,
            probe,
            // Read here rather than at admission, off the path of an answer that comes at once:
            // a close in between (microseconds) makes this check's failure count, as a failure
            // of a check made after the close.
            seen: self.breaker.as_ref().map_or(0, |b| b.seen()),
            tier,
            key,
            cost,
        })
    }
}

/// The text of the layer's answer to a request without a key, under `MissingKey::Reject`.
const NO_KEY_TEXT: &str = "No rate-limit key in the request\n";
/// Under `MissingKey::Unauthorized`: what the client lacks is credentials, which are not the rate
/// limiter's business.
const UNAUTHORIZED_TEXT: &str = "Unauthorized: this request needs credentials\n";
/// A fail-closed policy's answer while the store cannot decide.
const FAIL_CLOSED_TEXT: &str = "Service Unavailable: the rate limiter cannot decide\n";

/// The bodies of `policy`'s answers: its 429s and its own error answers.
fn bodies(policy: &Policy) -> Bodies {
    // The missing key's text says what to send, if the key's extractor knows (an API-key
    // header's name, not the app's setup).
    let hint = policy.key.client_hint();
    let no_key = match &policy.missing_key {
        MissingKey::Unauthorized(_) => (StatusCode::UNAUTHORIZED, UNAUTHORIZED_TEXT),
        MissingKey::Reject(status) => (*status, NO_KEY_TEXT),
        // Only to a request that sent its key in a form the extractor cannot use.
        MissingKey::SharedKey(_) => (StatusCode::BAD_REQUEST, NO_KEY_TEXT),
    };
    let no_key_text = match hint {
        Some(hint) => format!("{} (send {hint})\n", no_key.1.trim_end()),
        None => no_key.1.to_owned(),
    };
    Bodies::new(
        policy.body.clone(),
        (no_key.0, no_key_text),
        (StatusCode::SERVICE_UNAVAILABLE, FAIL_CLOSED_TEXT.to_owned()),
    )
}

/// A check's circuit not looked up yet (the breaker was clean: see `Shared::next`).
const PART_UNKNOWN: usize = usize::MAX;

/// The shortest wait said to a request denied by the fallback's share only until the store is
/// back (see `Shared::on_failure`): `Retry-After`'s smallest.
const MIN_UNTIL_STORE: Duration = Duration::from_secs(1);

/// About one in this many store answers that come at once is timed (see [`crate::metrics`]).
pub(crate) const TIMING_SAMPLE: u32 = 64;

thread_local! {
    /// A Weyl sequence (multiples of an odd constant near 2³²/φ), one per thread so no cache line
    /// is shared on the hot path.
    static TIMING_SEQ: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether to time this call: true for one call in [`TIMING_SAMPLE`] (a power of two), those
/// whose step of the sequence lands in the lowest 1/`TIMING_SAMPLE` of its range. Not every
/// 64th call, so that layers whose calls interleave on a thread (a router-wide layer and a route
/// layer) are each sampled, not one of them always: the steps of every other call, or every
/// third, are spread over the range too (the constant's multiples are equidistributed). One
/// add, where the xorshift this replaced took a dozen instructions.
#[inline]
fn sample_timing() -> bool {
    TIMING_SEQ.with(|state| {
        let x = state.get().wrapping_add(0x9E37_79B9);
        state.set(x);
        x < u32::MAX / TIMING_SAMPLE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Headers;
    use ratelimit_core::{Algorithm, Quota};

    fn shared(policy: Policy) -> Shared<MemoryStore> {
        Shared {
            store: MemoryStore::new(),
            rt: Arc::new(Rt::new(policy).unwrap()),
            timeout: Duration::from_millis(50),
            breaker: None,
            fallback: None,
            failed_log: LogGate::new(Arc::new(ratelimit_core::SystemClock::new())),
            timed_out_log: LogGate::new(Arc::new(ratelimit_core::SystemClock::new())),
            reset_logs: Arc::new(ResetLogs::new(Arc::new(ratelimit_core::SystemClock::new()))),
            reset_on: None,
            resetters: AtomicBool::new(false),
            aside: AtomicBool::new(false),
            home: crate::home::Home::none(),
        }
    }

    fn policy() -> Policy {
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(5).unwrap()).unwrap();
        Policy::new("p", limit).unwrap()
    }

    /// One call in `TIMING_SAMPLE` is timed, and so is about one in `TIMING_SAMPLE` of every
    /// other call, or every third or fourth (layers whose calls interleave on a thread).
    #[test]
    fn timing_samples_one_call_in_64_of_any_interleaving() {
        const CALLS: usize = 64 * 4 * 3 * 1_000;
        let picks: Vec<bool> = (0..CALLS).map(|_| sample_timing()).collect();
        for m in 1..=4 {
            for r in 0..m {
                let sampled = picks.iter().skip(r).step_by(m).filter(|&&p| p).count();
                let expected = CALLS / m / TIMING_SAMPLE as usize;
                assert!(
                    sampled.abs_diff(expected) * 50 <= expected,
                    "every {m}th call from {r}: {sampled} timed, {expected} expected"
                );
            }
        }
    }

    /// With neither headers nor the verdict to add, nothing travels with the request: no `Post`,
    /// and no new reference to the policy.
    #[test]
    fn a_request_with_nothing_to_add_carries_nothing() {
        let lean = shared(policy().headers(Headers::none()).verdict(false));
        let d = lean.store.check_now(b"k", &lean.rt.tiers[0].limit, 1);
        let step: Step = lean.decide(&d, 0, false);
        assert!(matches!(step, Step::Forward(None)));
        assert_eq!(Arc::strong_count(&lean.rt), 1);

        for (headers, verdict) in [(Headers::none(), true), (Headers::ietf(), false)] {
            let s = shared(policy().headers(headers).verdict(verdict));
            let d = s.store.check_now(b"k", &s.rt.tiers[0].limit, 1);
            match s.decide::<Infallible>(&d, 0, false) {
                Step::Forward(Some(post)) => {
                    assert_eq!((post.headers, post.verdict), (headers.any(), verdict));
                    assert_eq!(Arc::strong_count(&s.rt), 2);
                }
                _ => panic!("an allowed request is forwarded with what to add"),
            }
        }
    }
}
