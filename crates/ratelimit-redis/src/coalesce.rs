//! `Coalescing`: concurrent checks of one key on one gateway share a script call.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ratelimit_core::{Decision, Limit, Reset, Store};
use tokio::sync::oneshot;

use crate::store::{CheckFuture, CheckManyFuture, lock};
use crate::{LazyRedisStore, RedisStore, RedisStoreError};

/// The default most checks sent in one script call: 256.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// How many calls' worth of checks (of [`max_batch`](Coalescing::max_batch) each) one key's queue
/// holds by default: 4, so 1,024 with the default `max_batch`.
pub const DEFAULT_QUEUE_CALLS: usize = 4;

/// A [`RedisStore`] (or [`LazyRedisStore`]) wrapper that merges concurrent checks of the same
/// key into one script call.
///
/// Single flight per (key, limit): the first check of a key goes to Redis at once. While it is in
/// flight, later checks of that key on this gateway wait in a queue; when it returns, the whole
/// queue (up to [`max_batch`](Coalescing::max_batch) checks) goes to Redis as **one** call of the
/// algorithm's multi-cost script, and so on until the queue is empty. A hot key therefore costs
/// one call per round trip instead of one per request. With a
/// [`batch_window`](Coalescing::batch_window), the first check also waits that long, to gather
/// the checks arriving just after it.
///
/// ```no_run
/// use ratelimit_core::{Algorithm, Limit, Quota, Store};
/// use ratelimit_redis::{Coalescing, RedisStore};
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379").build().await?;
/// let store = Coalescing::new(store).batch_window(Duration::from_micros(200));
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_second(1_000)?)?;
/// let decision = store.check(b"hot", &limit, 1).await?;
/// # let _ = decision;
/// # Ok(())
/// # }
/// ```
///
/// # Exactness
///
/// The multi-cost script evaluates the costs in queue order, each on the state the previous one
/// left, exactly as the single-check script would have one after another at the instant the script
/// runs (the same code runs for each cost; the conformance test compares them). So a batch admits
/// exactly the checks that the same checks, sent alone in that order at that instant, would have
/// admitted; never more than the limit. The only difference from sending each alone is timing: a
/// check that queued is decided when its batch runs, one round trip (plus the batch window) later
/// than it would have reached Redis alone, or a few more behind a queue longer than one batch, as
/// if the network had delayed it that much. For a limit that does not refill meanwhile, the
/// admitted count is identical.
///
/// Errors: if a batch call fails, every check in it gets the error (the script may or may not have
/// run, as for any failed check; none is retried). Each is one failed request to the tower layer,
/// so one failed call for a hot key's batch of 5 counts 5 failures toward its circuit breaker, as
/// 5 checks pipelined on one connection that breaks would.
///
/// Time: a queued check waits for the call in flight, then rides in the next one, so it can take
/// up to about two response timeouts (plus the batch window, and one more call per `max_batch`
/// checks ahead of it) when Redis is slow. Callers that stop waiting (the layer's timeout, a
/// dropped request) leave the queue: their checks are not sent and spend nothing. (Not a request
/// dropped behind the tower layer's circuit breaker, on by default: the breaker runs such a check
/// on to its answer, to settle its circuit, so it is sent with its batch and spends what it would
/// have spent sent alone; the layer's own timeout does drop it.) If a key's task
/// ends without answering (its runtime shut down), its waiting checks fail at once and the next
/// check of the key starts a new one.
///
/// Load: at most [`max_queue`](Coalescing::max_queue) checks of one key wait (by default
/// [`DEFAULT_QUEUE_CALLS`] calls' worth: 4 × [`max_batch`](Coalescing::max_batch), 1,024), so that
/// a burst of that many rides in a few calls, and a queued check waits at most five calls: 25 ms if
/// Redis takes 5 ms a call, within the tower layer's default timeout of 50 ms (with 16 calls' worth
/// it would not be). A check that finds its key's queue full is sent on its own, as without this
/// wrapper (and so is every check made outside a Tokio runtime, where the key's task cannot be
/// spawned): a key whose checks come faster than one call per round trip can carry gets the plain
/// store's behaviour for the rest, instead of a queue that grows without bound, each check waiting
/// longer than the last. Nothing is refused: a full queue is this gateway's business, not a failure
/// of Redis for a circuit breaker to count. (The places of queued checks whose callers gave up are
/// freed when their turn comes, not for new checks: those would join the back of a queue whose
/// front is already waiting too long.)
///
/// Needs a Tokio runtime to coalesce: each busy key is served by a spawned task, on the runtime
/// the store was built on if that is a multi-thread runtime still running, else on the runtime
/// of the check that starts it (see [`RedisStoreBuilder::build`](crate::RedisStoreBuilder::build)).
///
/// Metrics: `ratelimit_redis_coalesced_checks_total` counts the checks that rode in another's
/// call (store calls saved), `ratelimit_redis_coalescing_overflow_total` the checks sent on their
/// own (past a full queue, or made outside a runtime; counted at their first poll in a runtime);
/// [`stats`](Coalescing::stats) gives the
/// same counts (once the calls in flight have ended: a check whose caller gave up is counted as
/// abandoned when its turn comes).
///
/// Over a [`LazyRedisStore`] (`Coalescing::new(store.build_lazy(..).await?)`), checks fail at
/// once, as the lazy store's own do, until it has reached Redis; then they coalesce.
#[derive(Clone)]
pub struct Coalescing<S = RedisStore> {
    store: S,
    shared: Arc<Shared>,
}

/// A Redis store that [`Coalescing`] can wrap: [`RedisStore`] and [`LazyRedisStore`]. Sealed:
/// a batch is one call of the store's multi-cost script, which only these send.
pub trait ScriptStore:
    Store<Error = RedisStoreError, Future = CheckFuture>
    + Clone
    + Send
    + Sync
    + 'static
    + sealed::Sealed
{
    /// Checks several costs for `key` against `limit` in one script call
    /// ([`RedisStore::check_many`]).
    fn check_many(&self, key: &[u8], limit: &Limit, costs: &[u64]) -> CheckManyFuture;
}

mod sealed {
    pub trait Sealed {
        /// The runtime the store was made on, where a key's task runs if that is a
        /// multi-thread runtime still running (see [`crate::spawn`]).
        fn home(&self) -> &crate::spawn::Home;
    }
    impl Sealed for crate::RedisStore {
        fn home(&self) -> &crate::spawn::Home {
            self.home()
        }
    }
    impl Sealed for crate::LazyRedisStore {
        fn home(&self) -> &crate::spawn::Home {
            self.home()
        }
    }
}

impl ScriptStore for RedisStore {
    fn check_many(&self, key: &[u8], limit: &Limit, costs: &[u64]) -> CheckManyFuture {
        RedisStore::check_many(self, key, limit, costs)
    }
}

impl ScriptStore for LazyRedisStore {
    fn check_many(&self, key: &[u8], limit: &Limit, costs: &[u64]) -> CheckManyFuture {
        LazyRedisStore::check_many(self, key, limit, costs)
    }
}

struct Shared {
    queues: Mutex<HashMap<QueueKey, Queue>>,
    window: Duration,
    max_batch: usize,
    /// Set by [`Coalescing::max_queue`]; else [`DEFAULT_QUEUE_CALLS`] × `max_batch`.
    max_queue: Option<usize>,
    checks: AtomicU64,
    calls: AtomicU64,
    largest: AtomicU64,
    overflowed: AtomicU64,
    abandoned: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct QueueKey {
    key: Box<[u8]>,
    fingerprint: u64,
}

/// The checks of one key waiting for the next call. A queue exists while its key's task runs.
struct Queue {
    limit: Limit,
    waiting: Vec<(u64, oneshot::Sender<Result<Decision, RedisStoreError>>)>,
}

/// Counters of a [`Coalescing`] store, since it was made. The checks that rode in another's call
/// (what `ratelimit_redis_coalesced_checks_total` counts) are `checks − abandoned − store_calls`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoalescingStats {
    /// Checks made.
    pub checks: u64,
    /// Script calls sent to Redis for them (batches, and the checks sent on their own). Over a
    /// [`LazyRedisStore`] not connected yet, the calls it failed at once count too. A check sent
    /// on its own counts from its first poll in a runtime, where the store starts on it, even if
    /// it is given up before its command is written (its connection still opening, or its
    /// command still queued for the connection: redis-rs then drops it, which a busy gateway
    /// whose callers time out sees often), so this may exceed the calls Redis ran.
    pub store_calls: u64,
    /// The most checks sent in one call.
    pub largest_batch: u64,
    /// Checks sent on their own because their key's queue was full, or because they were made
    /// outside a Tokio runtime.
    pub overflowed: u64,
    /// Checks never sent: queued ones whose callers gave up before their call, or whose key's
    /// task ended without answering (its runtime shut down); and checks to be sent on their own
    /// whose callers gave up before polling them in a runtime.
    pub abandoned: u64,
}

impl<S: fmt::Debug> fmt::Debug for Coalescing<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescing")
            .field("store", &self.store)
            .field("batch_window", &self.shared.window)
            .field("max_batch", &self.shared.max_batch)
            .field("max_queue", &self.shared.max_queue())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The longest [`Coalescing::batch_window`]: one second. A window is meant in microseconds; one
/// of `Duration::MAX` would hold every idle key's first check for good.
pub const MAX_BATCH_WINDOW: Duration = Duration::from_secs(1);

impl<S> Coalescing<S> {
    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }

    /// Counters since the wrapper was made.
    pub fn stats(&self) -> CoalescingStats {
        let s = &self.shared;
        CoalescingStats {
            checks: s.checks.load(Ordering::Relaxed),
            store_calls: s.calls.load(Ordering::Relaxed),
            largest_batch: s.largest.load(Ordering::Relaxed),
            overflowed: s.overflowed.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
        }
    }
}

impl<S: ScriptStore> Coalescing<S> {
    /// Coalesces the checks of `store`, with no batch window and at most [`DEFAULT_MAX_BATCH`]
    /// checks per call.
    pub fn new(store: S) -> Self {
        Coalescing {
            store,
            shared: Arc::new(Shared::new(Duration::ZERO, DEFAULT_MAX_BATCH, None)),
        }
    }

    /// The first check of an idle key waits `window` before going to Redis, so that the checks
    /// of that key arriving meanwhile share its call (default zero: only checks arriving while a
    /// call is in flight are merged). A few hundred microseconds suit a hot key. At most
    /// [`MAX_BATCH_WINDOW`] (a longer window is taken as that: every idle key's first check waits
    /// it). Set before the first check.
    #[must_use]
    pub fn batch_window(self, window: Duration) -> Self {
        let s = &self.shared;
        let shared = Shared::new(window.min(MAX_BATCH_WINDOW), s.max_batch, s.max_queue);
        Coalescing {
            store: self.store,
            shared: Arc::new(shared),
        }
    }

    /// At most `n` checks (at least 1) per script call; a longer queue is sent in several calls,
    /// one after another (default [`DEFAULT_MAX_BATCH`]). Bounds how long one script runs on the
    /// server. One key is served by one call at a time, so its checks get at most `n` per round
    /// trip through the queue; the rest go on their own past a full queue (see
    /// [`max_queue`](Self::max_queue)). Set before the first check.
    #[must_use]
    pub fn max_batch(self, n: usize) -> Self {
        let s = &self.shared;
        let shared = Shared::new(s.window, n.max(1), s.max_queue);
        Coalescing {
            store: self.store,
            shared: Arc::new(shared),
        }
    }

    /// At most `n` checks of one key wait for a call, besides those in the call in flight
    /// (default [`DEFAULT_QUEUE_CALLS`] × [`max_batch`](Self::max_batch)); a check that finds the
    /// queue full is sent on its own. A deeper queue lets a larger burst ride in batches, but
    /// under steady overload saves no call (each carries `max_batch` whatever waits) and makes
    /// its checks wait longer: up to the call in flight and `n.div_ceil(max_batch)` more. Zero
    /// sends every check on its own. Set before the first check.
    #[must_use]
    pub fn max_queue(self, n: usize) -> Self {
        let s = &self.shared;
        let shared = Shared::new(s.window, s.max_batch, Some(n));
        Coalescing {
            store: self.store,
            shared: Arc::new(shared),
        }
    }

    /// Checks `cost` for `key` against `limit`, sharing a script call with the concurrent checks
    /// of the same key; the same as [`Store::check`].
    pub fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> CoalesceFuture {
        let shared = &self.shared;
        shared.checks.fetch_add(1, Ordering::Relaxed);
        // The key's task needs a runtime; a check made outside one (to be polled in one later,
        // as the tower layer's `call` allows) goes on its own, as without this wrapper.
        if shared.max_queue() == 0 || tokio::runtime::Handle::try_current().is_err() {
            return self.alone(key, limit, cost);
        }
        let qk = QueueKey {
            key: key.into(),
            fingerprint: limit.fingerprint(),
        };
        let mut queues = lock(&shared.queues);
        if let Some(q) = queues.get_mut(&qk) {
            // Full: on its own. Not into a place a caller that gave up left: the queue is first
            // in, first out, so those are the oldest, and a check put at its back would wait
            // longer than they did (they are cleared when their turn comes).
            if q.waiting.len() >= shared.max_queue() {
                drop(queues);
                return self.alone(key, limit, cost);
            }
            let (tx, rx) = oneshot::channel();
            q.waiting.push((cost, tx));
            return CoalesceFuture {
                state: Answer::Later(rx),
            };
        }
        let (tx, rx) = oneshot::channel();
        queues.insert(
            qk.clone(),
            Queue {
                limit: limit.clone(),
                waiting: vec![(cost, tx)],
            },
        );
        drop(queues);
        // Made before the task is spawned and moved into it, so that the queue is removed
        // even if the task is dropped before its first poll (spawned as its runtime shuts
        // down, or the runtime dropped with it unpolled), or if spawning panics.
        let guard = QueueGuard {
            shared: Arc::clone(shared),
            qk,
            armed: true,
        };
        sealed::Sealed::home(&self.store).spawn(drive(guard, self.store.clone()));
        CoalesceFuture {
            state: Answer::Later(rx),
        }
    }

    /// `key`'s check sent on its own (a full queue, or no runtime): counted as a call at its
    /// first poll in a runtime (see [`Answer::Alone`]).
    fn alone(&self, key: &[u8], limit: &Limit, cost: u64) -> CoalesceFuture {
        CoalesceFuture {
            state: Answer::Alone {
                check: self.store.check(key, limit, cost),
                uncounted: Some(Arc::clone(&self.shared)),
            },
        }
    }
}

/// The store's reset, sent at once: a check queued before it and sent after it counts against
/// the fresh quota, as a check made after the reset would (see [`Reset`]).
impl<S> Reset for Coalescing<S>
where
    S: ScriptStore + Reset<Error = RedisStoreError>,
{
    type ResetFuture = S::ResetFuture;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        self.store.reset(key, limit)
    }
}

impl<S: ScriptStore> Store for Coalescing<S> {
    type Error = RedisStoreError;
    type Future = CoalesceFuture;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        Coalescing::check(self, key, limit, cost)
    }

    fn failure_domains(&self) -> usize {
        self.store.failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.store.failure_domain(key)
    }

    /// The store's: each call it sends is bounded by it (a queued check can wait for the call in
    /// flight and then its own, see [`Coalescing`]).
    fn response_timeout(&self) -> Option<Duration> {
        self.store.response_timeout()
    }
}

impl Shared {
    fn new(window: Duration, max_batch: usize, max_queue: Option<usize>) -> Self {
        Shared {
            queues: Mutex::new(HashMap::new()),
            window,
            max_batch,
            max_queue,
            checks: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            largest: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
        }
    }

    fn max_queue(&self) -> usize {
        self.max_queue
            .unwrap_or_else(|| self.max_batch.saturating_mul(DEFAULT_QUEUE_CALLS))
    }
}

/// Removes a key's queue if its task ends without emptying it (dropped with its runtime, before
/// or after its first poll, or a panic): the waiting checks then fail at once instead of waiting
/// forever, and the next check of the key starts a new task.
struct QueueGuard {
    shared: Arc<Shared>,
    qk: QueueKey,
    /// Cleared when the task ends normally, having removed the empty queue itself (a new queue
    /// of the same key, with its own task, may exist by the time the guard drops).
    armed: bool,
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        if self.armed
            && let Some(q) = lock(&self.shared.queues).remove(&self.qk)
        {
            // Never sent: counted with the checks whose callers gave up.
            let unsent = q.waiting.len() as u64;
            self.shared.abandoned.fetch_add(unsent, Ordering::Relaxed);
        }
    }
}

/// Serves one key's queue until it is empty, one script call at a time.
async fn drive<S: ScriptStore>(mut guard: QueueGuard, store: S) {
    let shared = Arc::clone(&guard.shared);
    let qk = guard.qk.clone();
    if !shared.window.is_zero() {
        tokio::time::sleep(shared.window).await;
    }
    loop {
        let (limit, batch) = {
            let mut queues = lock(&shared.queues);
            let Some(q) = queues.get_mut(&qk) else {
                guard.armed = false;
                return;
            };
            // A check whose caller gave up while it waited (a timeout, a dropped request) is not
            // sent: it spends nothing, as a check never sent would not.
            let before = q.waiting.len();
            q.waiting.retain(|(_, tx)| !tx.is_closed());
            let gone = (before - q.waiting.len()) as u64;
            shared.abandoned.fetch_add(gone, Ordering::Relaxed);
            if q.waiting.is_empty() {
                queues.remove(&qk);
                guard.armed = false;
                return;
            }
            let n = q.waiting.len().min(shared.max_batch);
            let batch: Vec<_> = q.waiting.drain(..n).collect();
            (q.limit.clone(), batch)
        };
        let n = batch.len() as u64;
        shared.calls.fetch_add(1, Ordering::Relaxed);
        shared.largest.fetch_max(n, Ordering::Relaxed);
        if n > 1 {
            metrics::counter!(crate::metrics::COALESCED_CHECKS_TOTAL).increment(n - 1);
        }
        let result = if let [(cost, _)] = batch[..] {
            store.check(&qk.key, &limit, cost).await.map(|d| vec![d])
        } else {
            let costs: Vec<u64> = batch.iter().map(|(c, _)| *c).collect();
            store.check_many(&qk.key, &limit, &costs).await
        };
        match result {
            // One decision per cost: `check_many` refuses a reply of any other length.
            Ok(decisions) => {
                for ((_, tx), d) in batch.into_iter().zip(decisions) {
                    // A check whose caller went away was still counted, as any sent check.
                    let _ = tx.send(Ok(d));
                }
            }
            Err(e) => {
                for (_, tx) in batch {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The future of a [`Coalescing`] check: the answer of the call it rode in, or of its own call.
pub struct CoalesceFuture {
    state: Answer,
}

enum Answer {
    Later(oneshot::Receiver<Result<Decision, RedisStoreError>>),
    /// Sent on its own (a full queue, or no runtime). Counted as a call (and an overflow) at its
    /// first poll inside a Tokio runtime, where the store's future starts on it (a poll outside
    /// one only yields; see `in_runtime`): a caller that gives up before sends nothing, and its
    /// check is counted as abandoned (see `Drop`). A check given up after that poll is a call,
    /// whether or not its command was written yet (its connection may still be opening).
    Alone {
        check: CheckFuture,
        uncounted: Option<Arc<Shared>>,
    },
}

impl fmt::Debug for CoalesceFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            Answer::Later(_) => "queued",
            Answer::Alone { .. } => "alone",
        };
        f.debug_struct("CoalesceFuture")
            .field("state", &state)
            .finish()
    }
}

/// A check sent on its own and given up before its first poll in a runtime sent nothing: counted
/// as abandoned, so that `checks − abandoned − store_calls` stays the checks that rode in
/// another's call.
impl Drop for CoalesceFuture {
    fn drop(&mut self) {
        if let Answer::Alone {
            uncounted: Some(shared),
            ..
        } = &self.state
        {
            shared.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Future for CoalesceFuture {
    type Output = Result<Decision, RedisStoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            Answer::Later(rx) => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(r),
                // The key's task ended without answering: only if the runtime is shutting down.
                Poll::Ready(Err(_)) => Poll::Ready(Err(RedisStoreError::Connection {
                    message: "the coalescing task stopped before answering".to_owned(),
                    source: None,
                })),
                Poll::Pending => Poll::Pending,
            },
            Answer::Alone { check, uncounted } => {
                if uncounted.is_some()
                    && tokio::runtime::Handle::try_current().is_ok()
                    && let Some(shared) = uncounted.take()
                {
                    metrics::counter!(crate::metrics::COALESCING_OVERFLOW_TOTAL).increment(1);
                    shared.overflowed.fetch_add(1, Ordering::Relaxed);
                    shared.calls.fetch_add(1, Ordering::Relaxed);
                    shared.largest.fetch_max(1, Ordering::Relaxed);
                }
                check.as_mut().poll(cx)
            }
        }
    }
}
