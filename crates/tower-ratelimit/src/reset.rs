//! [`Resetter`]: forgetting what a client has spent under a layer's policy.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use ratelimit_core::Reset;
use tracing::Instrument;

use http::Response;

use crate::key::{KeyBuf, KeyPart};
use crate::layer::RateLimitLayer;
use crate::metrics::{Metrics, ResetCounters, ResetOutcome};
use crate::response::VerdictKind;
use crate::service::{Post, Rt, Shared};
use crate::{RequestHead, ResponseHead};

/// Forgets what a client has spent under one layer's policy, so that its next request counts
/// from a full quota. Made by [`RateLimitLayer::resetter`] over a store that can reset
/// ([`ratelimit_core::Reset`]: the in-memory store, the Redis store, and `DenialCache` and
/// `Leasing` over either); cheap to clone, and shares the layer's store.
///
/// The client is found as the layer finds it, from a request: [`reset`](Resetter::reset) takes
/// the request's head, extracts its key with the policy's extractor, and forgets that key's
/// state under every limit of the policy (its own and each tier's, since the client's tier may
/// have changed) and under the local share a fallback counts while the store is down. A request
/// without a key is refused ([`ResetError::NoKey`]) rather than resetting the key shared by every
/// client without one.
///
/// The classic use: a login route limited per user name, whose count a successful login forgets,
/// so that only failed attempts add up. A client that is not the one being reset (support
/// lifting a block from an admin tool) is named by a request built for it, with what the
/// extractor reads (a header, an extension).
///
/// ```
/// use axum::{Router, extract::{Request, State}, http::StatusCode, routing::post};
/// use tower_ratelimit::{Policy, RateLimitLayer, Resetter, key::ApiKeyHeader, RequestHead};
/// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Quota};
///
/// async fn login(State(limits): State<Resetter<MemoryStore>>, req: Request) -> StatusCode {
///     let signed_in = req.headers().get("x-password").is_some_and(|p| p == "hunter2");
///     if !signed_in {
///         return StatusCode::UNAUTHORIZED;
///     }
///     // This user's failed attempts are forgotten.
///     if let Err(error) = limits.reset(&RequestHead::of(&req)).await {
///         // The store is down: the sign-in stands, and so does the count.
///         eprintln!("login limit not reset: {error}");
///     }
///     StatusCode::NO_CONTENT
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5)?)?;
/// let policy = Policy::new("login", limit)?.key(ApiKeyHeader::new("x-user")?);
/// let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
/// // On the method router: other methods get axum's 405 without spending an attempt.
/// let app: Router = Router::new()
///     .route("/login", post(login).route_layer(layer.clone()))
///     .with_state(layer.resetter());
/// # Ok(())
/// # }
/// ```
///
/// A reset is not a check: it is counted in `ratelimit_resets_total` by how it ended (see
/// [`metrics`](crate::metrics)), in no decision metric, and leaves the circuit breaker as it is.
/// It does look at it: while the client's circuit is open and cooling down (or half-open, its one
/// call a check's probe) the store is taken to be down and not asked; the fallback's local share
/// is reset and the reset ends at once with [`ResetError::CircuitOpen`] (nothing sends it later:
/// make it again). A reset made once the cool-down is over asks the store, before any check has
/// probed it (a route without traffic since its outage), and the circuit stays open until a
/// check's probe closes it.
/// Each store call that does not complete at once is bounded by the layer's timeout (when polled
/// in a Tokio runtime; elsewhere by the store's own), so that, as for the layer's checks, the
/// in-memory store needs no runtime with a timer. See [`ratelimit_core::Reset`] for what a reset
/// guarantees against concurrent checks, and about what other gateways hold.
pub struct Resetter<St> {
    shared: Arc<Shared<St>>,
    /// By [`ResetOutcome`].
    counters: Arc<ResetCounters>,
}

impl<St, M> RateLimitLayer<St, M> {
    /// A [`Resetter`] of this layer's clients, over its store.
    ///
    /// From then on, each request the layer lets through with rate-limit fields to add, on the
    /// store's answer, carries a mark in its extensions, so that a handler's
    /// [`reset`](Resetter::reset) of its own client makes the response tell the full quota.
    /// That costs such a request the key's extraction a second time and two small allocations
    /// (the mark with the key, and its place among the extensions): about 830 instructions, a
    /// fifth of what the layer costs such a request (docs/benchmarks.md, "A handler's reset").
    /// A layer of which no `Resetter` is made pays one flag read.
    pub fn resetter(&self) -> Resetter<St>
    where
        St: Reset,
    {
        self.shared.resetters.store(true, Ordering::Relaxed);
        self.shared.aside.store(true, Ordering::Relaxed);
        Resetter {
            shared: Arc::clone(&self.shared),
            counters: Arc::new(Metrics::reset_counters(&self.shared.rt.name)),
        }
    }
}

impl<St> Clone for Resetter<St> {
    fn clone(&self) -> Self {
        Resetter {
            shared: Arc::clone(&self.shared),
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<St> fmt::Debug for Resetter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resetter")
            .field("policy", &self.shared.rt.name)
            .finish_non_exhaustive()
    }
}

/// Why a reset did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError<E> {
    /// The request carries no key for the policy's extractor: there is no client to reset.
    #[error("the request carries no rate-limit key")]
    NoKey,
    /// [`Resetter::reset_client`] of a policy whose key is not one client value
    /// ([`KeyExtractor::one_value`](crate::key::KeyExtractor::one_value)): several parts, an
    /// address or no client at all. Nothing was reset; reset with [`Resetter::reset`] and a
    /// request that carries the key, or [`Resetter::reset_ip`] for an address.
    #[error(
        "the policy's rate-limit key is not one client value (several parts, an address, or no \
         client): reset it with a request that carries the key, or by IP address"
    )]
    NotOneValue,
    /// The store did not answer within the layer's timeout. The reset may still happen; if it
    /// does, a denial this process cached or a lease it took before it ran may outlive it
    /// (`ratelimit_core::Reset`, "Failure"): reset again once the store answers.
    #[error("the rate-limit store did not answer the reset within {0:?}")]
    Timeout(Duration),
    /// The store failed. The state may or may not have been forgotten.
    #[error("the rate-limit store failed to reset: {0}")]
    Store(#[source] E),
    /// The circuit breaker's circuit for this client is open and cooling down (or half-open, its
    /// one call a check's probe): the store, taken to be down, was not asked, and the client's
    /// count there stands. The fallback's local share, if the policy has one, was reset. Once
    /// the cool-down is over, the store is asked again.
    #[error("the rate-limit store's circuit is open: the reset was not sent")]
    CircuitOpen,
}

impl<St: Reset> Resetter<St> {
    /// Forgets what the client named `client` has spent, under every limit of the policy: for a
    /// policy keyed by one value, without a request of that client at hand (an admin tool
    /// lifting a block). `client` is written into the key as the policy's extractor writes it:
    /// for [`ApiKeyHeader`](crate::key::ApiKeyHeader), the header's value (a `&str` or a
    /// `HeaderValue`, without surrounding spaces); for
    /// [`ExtensionKey<T>`](crate::key::ExtensionKey), the `T` (its [`KeyPart`]). IP keys, which
    /// the extractors group by network, are reset with [`reset_ip`](Resetter::reset_ip); keys
    /// made of several parts (a tuple, [`or`](crate::key::or)), and keys written by a
    /// [`from_fn`](crate::key::from_fn) closure not said to write one value
    /// ([`FromFn::one_part`](crate::key::FromFn::one_part)), are not one value: reset those
    /// with [`reset`](Resetter::reset) and a request built to carry what the extractor reads
    /// (the route of [`RouteKey`](crate::key::RouteKey): a [`ResetRoute`](crate::key::ResetRoute)).
    /// For any of these (see [`KeyExtractor::one_value`](crate::key::KeyExtractor::one_value)),
    /// this answers [`ResetError::NotOneValue`] (counted as `no_key`) and resets nothing.
    ///
    /// ```
    /// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
    /// use tower_ratelimit::key::ExtensionKey;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Requests carry the authenticated user's id (a `u64`) in their extensions.
    /// let limit = Limit::single(Algorithm::Gcra, Quota::per_minute(60)?)?;
    /// let policy = Policy::new("api", limit)?.key(ExtensionKey::<u64>::new());
    /// let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
    /// // Support lifts user 42's block.
    /// layer.resetter().reset_client(&42u64).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn reset_client(
        &self,
        client: &(impl KeyPart + ?Sized),
    ) -> impl Future<Output = Result<(), ResetError<St::Error>>> + Send + 'static {
        let one_value = self.shared.rt.policy.key.one_value();
        let key = one_value.then(|| {
            let mut key = self.shared.rt.key_start.clone();
            client.write_to(&mut key);
            key
        });
        // Without a key, counted and answered as `NoKey`, told apart here.
        let reset = self.reset_key(key);
        async move {
            match reset.await {
                Err(ResetError::NoKey) if !one_value => Err(ResetError::NotOneValue),
                out => out,
            }
        }
    }

    /// Forgets what the client of `req` has spent: its key as the layer extracts it, under
    /// every limit of the policy. The key is read now, and the returned future owns what it
    /// needs. Each reset is made when its store makes it: the fallback's local share and the
    /// in-memory store at once, a network store when the future is polled (one call per limit
    /// of the policy, all sent at the first poll and waited for together, under one timeout; the
    /// first failure ends it).
    ///
    /// When `req` is the request the layer let through to the handler (its head, or a request
    /// that keeps its extensions), and its key is the one the layer checked, a reset that
    /// completes also makes the layer's rate-limit fields on the handler's response tell the
    /// full quota the client's next request starts from (`r` the binding quota's limit, no
    /// `t`), as with [`reset_on`](crate::RateLimitLayerBuilder::reset_on); the response's
    /// [`Verdict`](crate::Verdict) keeps the decision of its own check. The layer marks the
    /// requests it lets through for this (in their extensions) once a `Resetter` of it has been
    /// made, so make it before serving. Not a request let through without the store's answer
    /// (the store failed and the fallback's local share counted it, say): its fields keep the
    /// count the layer found, as after a reset on a response.
    pub fn reset(
        &self,
        req: &RequestHead<'_>,
    ) -> impl Future<Output = Result<(), ResetError<St::Error>>> + Send + 'static {
        let key = self.key_of(req);
        let mark = key
            .as_ref()
            .and_then(|key| ResetMark::of(req, &self.shared.rt, key));
        let reset = self.reset_key(key);
        async move {
            let out = reset.await;
            if let (Ok(()), Some(mark)) = (&out, mark) {
                mark.set();
            }
            out
        }
    }

    /// Forgets what the client at `ip` has spent, for a policy keyed by the client's address
    /// ([`PeerIp`](crate::key::PeerIp), [`ClientIpKey`](crate::key::ClientIpKey)): its key as
    /// a request straight from `ip` (no proxy in between) gets it, grouped as the extractor
    /// groups addresses, so an IPv6 address resets its whole prefix (/64 by default), as the
    /// limit counts it. A key with other parts (a header, an extension, the route) finds none
    /// in such a request: [`ResetError::NoKey`]; reset those with [`reset`](Resetter::reset)
    /// and a request that carries them. (The request is a `GET /` with no headers: a
    /// [`from_fn`](crate::key::from_fn) closure that reads the method or the path finds them
    /// there, and its key is one no request of the client may have.)
    ///
    /// ```
    /// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
    /// use tower_ratelimit::key::PeerIp;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5)?)?;
    /// let policy = Policy::new("login", limit)?.key(PeerIp::new());
    /// let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
    /// // Support lets an office's address back in.
    /// layer.resetter().reset_ip("203.0.113.9".parse()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "axum")]
    pub fn reset_ip(
        &self,
        ip: std::net::IpAddr,
    ) -> impl Future<Output = Result<(), ResetError<St::Error>>> + Send + 'static {
        let mut req = http::Request::new(());
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::new(ip, 0)));
        req.extensions_mut().insert(crate::key::AddressOnly);
        self.reset_key(self.key_of(&RequestHead::of(&req)))
    }

    /// `req`'s (namespaced) key as the layer extracts it; `None`: it has none.
    fn key_of(&self, req: &RequestHead<'_>) -> Option<KeyBuf> {
        let rt = &*self.shared.rt;
        let mut key = rt.key_start.clone();
        rt.policy.key.extract(req, &mut key).ok().map(|()| key)
    }

    /// Resets the (namespaced) `key` under every limit of the policy; `None`: no key.
    fn reset_key(
        &self,
        key: Option<KeyBuf>,
    ) -> impl Future<Output = Result<(), ResetError<St::Error>>> + Send + 'static {
        reset_key(&self.shared, &self.counters, key, Ask::IfCooledDown)
    }
}

/// Whether a reset asks the store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Not: the layer let the request through without the store's answer.
    No,
    /// If the key's circuit is closed: a `reset_on` reset, which holds its response, does not
    /// wait for a store that has not answered a check since its circuit opened.
    IfClosed,
    /// If the key's circuit is closed, or open and cooled down (`Shared::circuit_lets_through`):
    /// a `Resetter`'s, which no response waits for, and which would otherwise be skipped for as
    /// long as no check probes the store.
    IfCooledDown,
}

/// Resets the (namespaced) `key` under every limit of `shared`'s policy, counting the outcome in
/// `counters`; `None`: no key. The fallback's local share is reset at once and each store call
/// made now (a network store sends its command when the future is first polled); the future
/// waits for all the store's calls together, under one timeout. The store is asked as `ask`
/// says: else it is taken to be down, and the reset is skipped.
fn reset_key<St: Reset>(
    shared: &Shared<St>,
    counters: &Arc<ResetCounters>,
    key: Option<KeyBuf>,
    ask: Ask,
) -> impl Future<Output = Result<(), ResetError<St::Error>>> + Send + 'static {
    let rt = &*shared.rt;
    // The fallback's local share at once; per tier, the store's reset to wait for, unless the
    // store is taken to be down (`None`).
    type Calls<F> = Option<Vec<Option<F>>>;
    let calls: Option<Calls<St::ResetFuture>> = key.map(|key| {
        let key = key.as_bytes();
        shared.reset_local(key);
        let ask_store = match ask {
            Ask::No => false,
            Ask::IfClosed => shared.circuit_closed(key),
            Ask::IfCooledDown => shared.circuit_lets_through(key),
        };
        ask_store.then(|| {
            rt.tiers
                .iter()
                .map(|tier| Some(shared.store.reset(key, &tier.limit)))
                .collect()
        })
    });
    let timeout = shared.timeout;
    let name = rt.name.clone();
    let logs = Arc::clone(&shared.reset_logs);
    let counters = Arc::clone(counters);
    let count = move |o: ResetOutcome| counters[o as usize].increment(1);
    async move {
        let Some(calls) = calls else {
            count(ResetOutcome::NoKey);
            return Err(ResetError::NoKey);
        };
        let Some(mut calls) = calls else {
            tracing::debug!(policy = %name, "rate-limit reset not sent: the store is down");
            count(ResetOutcome::Skipped);
            return Err(ResetError::CircuitOpen);
        };
        // Every call polled at each poll, so that a network store's go out together: done when
        // all are, or at the first failure.
        let mut all = poll_fn(move |cx| {
            let mut waiting = false;
            for slot in calls.iter_mut() {
                if let Some(call) = slot {
                    match Pin::new(call).poll(cx) {
                        Poll::Ready(Ok(())) => *slot = None,
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                        Poll::Pending => waiting = true,
                    }
                }
            }
            if waiting {
                Poll::Pending
            } else {
                Poll::Ready(Ok(()))
            }
        });
        // Polled once first: a reset done at once (the in-memory store's) needs no timer, so no
        // runtime with one, as a check of the layer needs none.
        let first = poll_fn(|cx| Poll::Ready(Pin::new(&mut all).poll(cx))).await;
        let out = match first {
            Poll::Ready(out) => out,
            Poll::Pending if tokio::runtime::Handle::try_current().is_ok() => {
                // The timer runs from the calls' sending, but is made at the next poll: a
                // `reset_on` reset is moved into a task of its own after this first poll, maybe
                // to another runtime, and a timer stays on the runtime it was made on (one that
                // may stop being driven, or shut down).
                let deadline = tokio::time::Instant::now() + timeout;
                let mut yielded = false;
                poll_fn(|cx| {
                    if std::mem::replace(&mut yielded, true) {
                        Poll::Ready(())
                    } else {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                })
                .await;
                match tokio::time::timeout_at(deadline, all).await {
                    Ok(out) => out,
                    Err(_) => {
                        if let Some(held_back) = logs.timed_out.pass() {
                            tracing::warn!(policy = %name, held_back, "rate-limit reset timed out");
                        }
                        count(ResetOutcome::Timeout);
                        return Err(ResetError::Timeout(timeout));
                    }
                }
            }
            Poll::Pending => all.await,
        };
        if let Err(error) = out {
            if let Some(held_back) = logs.failed.pass() {
                tracing::warn!(policy = %name, %error, held_back, "rate-limit reset failed");
            }
            count(ResetOutcome::Error);
            return Err(ResetError::Store(error));
        }
        tracing::debug!(policy = %name, "rate-limit key reset");
        count(ResetOutcome::Reset);
        Ok(())
    }
}

/// Set by a [`Resetter`] once it has reset the client of the request that carries it, so that
/// the layer that let the request through writes the full quota in the response's fields (see
/// `Shared::resetters`). In the request's extensions, among those of every layer that marked it
/// ([`ResetMarks`]), each known by its layer's policy and the key the layer checked.
pub(crate) struct ResetMark {
    /// The layer's policy, known by its address (held, so that the address is not another
    /// layer's while the mark lives).
    layer: Arc<Rt>,
    /// The (namespaced) key the layer checked: a reset of another key leaves the mark.
    key: KeyBuf,
    reset: AtomicBool,
}

/// The [`ResetMark`]s of a request: one per layer that marked it (nested layers, each with a
/// `Resetter`); one, the usual case, without a `Vec` to allocate.
#[derive(Clone)]
enum ResetMarks {
    One(Arc<ResetMark>),
    Many(Vec<Arc<ResetMark>>),
}

impl ResetMark {
    /// A new mark of the layer of `layer` for its check of `key`, put in `extensions`; the layer
    /// keeps the returned one.
    pub(crate) fn put_in(
        extensions: &mut http::Extensions,
        layer: &Arc<Rt>,
        key: KeyBuf,
    ) -> Arc<Self> {
        let mark = Arc::new(ResetMark {
            layer: Arc::clone(layer),
            key,
            reset: AtomicBool::new(false),
        });
        let new = ResetMarks::One(Arc::clone(&mark));
        // One lookup for the usual case, a request no other layer marked; an outer layer's marks
        // are put back with this one.
        if let Some(outer) = extensions.insert(new) {
            let all = match outer {
                ResetMarks::One(first) => vec![first, Arc::clone(&mark)],
                ResetMarks::Many(mut all) => {
                    all.push(Arc::clone(&mark));
                    all
                }
            };
            extensions.insert(ResetMarks::Many(all));
        }
        mark
    }

    /// The mark the layer of `layer` put in `req` for its check of `key`, if any.
    fn of(req: &RequestHead<'_>, layer: &Arc<Rt>, key: &KeyBuf) -> Option<Arc<Self>> {
        let marks = match req.extensions().get::<ResetMarks>()? {
            ResetMarks::One(mark) => std::slice::from_ref(mark),
            ResetMarks::Many(all) => all.as_slice(),
        };
        marks
            .iter()
            .find(|m| Arc::ptr_eq(&m.layer, layer) && m.key.as_bytes() == key.as_bytes())
            .cloned()
    }

    fn set(&self) {
        self.reset.store(true, Ordering::Release);
    }

    /// Whether the request's client has been reset.
    pub(crate) fn is_set(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }
}

/// A reset after a response, made by the layer ([`RateLimitLayerBuilder::reset_on`]): `true`
/// once the store has reset the client's count.
pub(crate) type AfterResponse = Pin<Box<dyn Future<Output = bool> + Send + 'static>>;

/// The reset condition of a layer ([`RateLimitLayerBuilder::reset_on`]), and how its store
/// resets.
pub(crate) struct ResetOn<St> {
    when: Box<dyn Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static>,
    /// `reset_key` over this store, boxed: made where the store is known to reset, since the
    /// service is written for any [`Store`](ratelimit_core::Store).
    run: RunReset<St>,
    /// By [`ResetOutcome`], as a [`Resetter`]'s.
    counters: Arc<ResetCounters>,
}

type RunReset<St> = fn(&Shared<St>, &Arc<ResetCounters>, Option<KeyBuf>, bool) -> AfterResponse;

impl<St: Reset> ResetOn<St> {
    /// The condition `when`, for the layer of the policy named `policy`.
    pub(crate) fn new(
        when: impl Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
        policy: &str,
    ) -> Self {
        fn run<St: Reset>(
            shared: &Shared<St>,
            counters: &Arc<ResetCounters>,
            key: Option<KeyBuf>,
            ask_store: bool,
        ) -> AfterResponse {
            let ask = if ask_store { Ask::IfClosed } else { Ask::No };
            // Its error is logged and counted where it ends; the response goes out as it is.
            let mut reset = Box::pin(reset_key(shared, counters, key, ask));
            let home = shared.home.clone();
            let counters = Arc::clone(counters);
            Box::pin(async move {
                // Done at once (the in-memory store's): nothing to wait for.
                if let Poll::Ready(done) = poll_fn(|cx| Poll::Ready(reset.as_mut().poll(cx))).await
                {
                    return done.is_ok();
                }
                // A network store's: in a task of its own where there is a runtime (the current
                // one if multi-thread, else the layer's if a multi-thread one still running,
                // else the current one: see `crate::home`),
                // so that it is made even if the response is dropped first (the client went
                // away); the response waits for it all the same.
                match home.spawn(reset.in_current_span()) {
                    Ok(task) => matches!(task.await, Ok(Some(Ok(())))),
                    // No runtime: made here (without a timer), as the response is awaited.
                    Err(reset) if tokio::runtime::Handle::try_current().is_err() => {
                        reset.await.is_ok()
                    }
                    // Refused by every runtime at hand, shutting down (its timer would panic
                    // here): its calls were sent at its first poll, but no answer will be
                    // waited for, counted as a reset that got none in time.
                    Err(_) => {
                        counters[ResetOutcome::Timeout as usize].increment(1);
                        false
                    }
                }
            })
        }
        ResetOn {
            when: Box::new(when),
            run: run::<St>,
            counters: Arc::new(Metrics::reset_counters(policy)),
        }
    }
}

/// The reset a forwarded request gets if its response meets the layer's condition.
pub(crate) struct ResetPlan {
    /// The request's key; `None`: it has none, and nothing is reset.
    key: Option<KeyBuf>,
    /// Through the store (and the fallback's local share), or the local share only: the
    /// request was let through without the store (it failed, or its circuit is open), which is
    /// not asked again (it would hold the response up to the timeout).
    with_store: bool,
}

impl<St> Shared<St> {
    /// Forgets `key` under the fallback's local share of every limit, if there is a fallback.
    fn reset_local(&self, key: &[u8]) {
        if let Some(local) = &self.fallback {
            for tier in self.rt.tiers.iter() {
                if let Some((limit, _)) = &tier.fallback {
                    local.reset_now(key, limit);
                }
            }
        }
    }

    /// The reset the request forwarded with `post` gets if its response meets the layer's
    /// condition: none without one, or for an allow-listed request (which was not counted).
    /// The key is read now, before the request moves on.
    pub(crate) fn reset_plan(
        &self,
        post: Option<&Post>,
        req: &RequestHead<'_>,
    ) -> Option<ResetPlan> {
        self.reset_on.as_ref()?;
        let post = post?;
        if post.kind() == VerdictKind::AllowListed {
            return None;
        }
        let rt = &*self.rt;
        let mut key = rt.key_start.clone();
        Some(ResetPlan {
            key: rt.policy.key.extract(req, &mut key).ok().map(|()| key),
            with_store: !post.without_store(),
        })
    }

    /// The reset `plan` asks for, if `response` meets the layer's condition: the fallback's at
    /// once, the store's to wait for.
    pub(crate) fn reset_after<B>(
        &self,
        response: &Response<B>,
        plan: ResetPlan,
    ) -> Option<AfterResponse> {
        let reset_on = self.reset_on.as_ref()?;
        (reset_on.when)(&ResponseHead::of(response))
            .then(|| (reset_on.run)(self, &reset_on.counters, plan.key, plan.with_store))
    }
}
