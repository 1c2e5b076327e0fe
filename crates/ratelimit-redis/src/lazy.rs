//! [`LazyRedisStore`]: a Redis store that an application can make while Redis is down.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use ratelimit_core::{Limit, Reset, Store};

use crate::error::RedisStoreError;
use crate::store::{
    CheckFuture, CheckManyFuture, MAX_TIMEOUT, RedisStore, RedisStoreBuilder, ResetFuture,
};

/// A [`RedisStore`] that is built in the background if Redis cannot be reached when the
/// application starts; made by [`RedisStoreBuilder::build_lazy`].
///
/// [`RedisStoreBuilder::build`] fails when it cannot open its connections, so that a wrong
/// address or password is found at start-up. An application that must start during a Redis
/// outage (a gateway rescheduled while Redis fails over, a cluster whose pods start in any order)
/// builds lazily instead:
///
/// - the first attempt is made at once, by `build_lazy`; an invalid setting is returned as
///   `build` returns it, and so are refused credentials
///   ([`is_refused_credentials`](RedisStoreError::is_refused_credentials): a wrong password is a
///   wrong setting, not Redis being down) and an address that answers but not as a Redis the
///   store can use ([`is_wrong_server`](RedisStoreError::is_wrong_server)), and none is retried;
/// - otherwise a task tries again every `retry_every` (1 ms to an hour), whether checks come or
///   not, each attempt bounded by the builder's timeouts, until one succeeds or the store is
///   dropped (which ends the task at once, not at its next attempt, and abandons an attempt
///   under way rather than let it build a store nobody holds: a connection that attempt was
///   opening is still opened or given up within the builder's `connect_timeout`, then closed);
///   a failure is logged as a warning at most once a minute (with how many attempts failed
///   since the last), the others as `DEBUG` events, unless its cause changed, which is warned
///   of at once: Redis unreachable, reached but not serving checks yet (still loading its data,
///   or a replica), reached but refusing the credentials (rotated during an outage), or reached
///   but not a Redis the store can use (a database it lacks, say: retried all the same, as only
///   the first attempt's refusal ends the building);
/// - meanwhile every check fails at once with the last attempt's error (a
///   [`RedisStoreError::Connection`] when the server cannot be reached), so the layer's failure
///   policy answers (fail open, fail closed, or the local fallback);
/// - once an attempt succeeds, every check goes to the [`RedisStore`] it built, which mends its
///   own connections from then on.
///
/// The task runs on the runtime that made the store if that is a multi-thread runtime still
/// running, else on the runtime of the check that starts it (see
/// [`build`](RedisStoreBuilder::build)). If its runtime shuts down first (a store shared by
/// several runtimes), the next check starts the task again, on its own runtime.
///
/// ```no_run
/// use std::time::Duration;
/// use ratelimit_redis::RedisStore;
///
/// # async fn run() -> Result<(), ratelimit_redis::RedisStoreError> {
/// let store = RedisStore::builder("redis://10.0.0.5:6379")
///     .build_lazy(Duration::from_millis(500))
///     .await?;
/// // Serve now; `store.is_connected()` turns true once Redis answered.
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LazyRedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// What each attempt builds (none for a store made from a built one: never attempted).
    builder: Option<RedisStoreBuilder>,
    /// Whether the store is (to be) on a Redis Cluster: its failure domains are known before it
    /// is built.
    cluster: bool,
    /// The store's response timeout, known before it is built.
    response_timeout: Duration,
    retry_every: Duration,
    store: OnceLock<RedisStore>,
    /// Set while the task that retries runs.
    retrying: AtomicBool,
    /// When the last attempt started, and its error (none if the first one succeeded).
    last: Mutex<(Instant, Option<RedisStoreError>)>,
    /// When a failed attempt was last logged as a warning, and the failures since (see
    /// [`log_failure`]).
    warned: Mutex<Warned>,
    /// Told when the store is dropped, so that the task that retries ends then rather than at
    /// its next attempt (up to `retry_every` later).
    dropped: Arc<tokio::sync::Notify>,
    /// The runtime the store was made on, where the task that retries runs if it is a
    /// multi-thread runtime still running (see [`crate::spawn`]).
    home: crate::spawn::Home,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A permit if the task is not waiting yet: it ends at its wait all the same.
        self.dropped.notify_one();
    }
}

impl fmt::Debug for LazyRedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyRedisStore")
            .field("connected", &self.is_connected())
            .field("retry_every", &self.inner.retry_every)
            .finish_non_exhaustive()
    }
}

impl LazyRedisStore {
    /// Builds the store from `builder` once; see [`RedisStoreBuilder::build_lazy`].
    pub(crate) async fn build(
        builder: RedisStoreBuilder,
        retry_every: Duration,
    ) -> Result<Self, RedisStoreError> {
        if retry_every < Duration::from_millis(1) || retry_every > MAX_TIMEOUT {
            return Err(RedisStoreError::config(
                "retry_every",
                "must be from 1 ms to an hour",
            ));
        }
        let home = crate::spawn::Home::current().ok_or_else(|| {
            RedisStoreError::config("runtime", "the store must be built inside a Tokio runtime")
        })?;
        let started = Instant::now();
        let warned = Mutex::new(Warned::default());
        let (store, error) = match builder.clone().build().await {
            Ok(store) => (OnceLock::from(store), None),
            Err(e @ RedisStoreError::Config { .. }) => return Err(e),
            Err(e) if e.is_refused_credentials() || e.is_wrong_server() => return Err(e),
            Err(e) => {
                log_failure(&warned, &e);
                (OnceLock::new(), Some(e))
            }
        };
        let store = LazyRedisStore {
            inner: Arc::new(Inner {
                cluster: builder.cluster,
                response_timeout: builder.response_timeout,
                builder: Some(builder),
                retry_every,
                store,
                retrying: AtomicBool::new(false),
                last: Mutex::new((started, error)),
                warned,
                dropped: Arc::default(),
                home,
            }),
        };
        if !store.is_connected() {
            store.retry();
        }
        Ok(store)
    }

    /// What a reset watch needs: the builder's settings, or the built store's for a store made
    /// from a built one.
    pub(crate) fn watch_settings(&self) -> Result<crate::watch::Settings, RedisStoreError> {
        match (&self.inner.builder, self.inner.store.get()) {
            (Some(builder), _) => builder.watch_settings(),
            (None, Some(store)) => Ok(store.watch_settings()),
            (None, None) => Err(RedisStoreError::config(
                "watch_resets",
                "the lazy store has neither settings nor a built store",
            )),
        }
    }

    /// Whether the store has been built (an attempt reached Redis).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.inner.store.get().is_some()
    }

    /// The runtime the store was made on (see [`crate::spawn`]).
    pub(crate) fn home(&self) -> &crate::spawn::Home {
        &self.inner.home
    }

    /// The built store, once an attempt reached Redis: for [`RedisStore::state_keys`] and the
    /// like.
    #[must_use]
    pub fn get(&self) -> Option<&RedisStore> {
        self.inner.store.get()
    }

    /// Checks several costs for `key` against `limit` in one script call, as
    /// [`RedisStore::check_many`]; fails at once with the last attempt's error until an attempt
    /// reached Redis, as [`check`](Store::check) does.
    pub fn check_many(&self, key: &[u8], limit: &Limit, costs: &[u64]) -> CheckManyFuture {
        match self.inner.store.get() {
            Some(store) => store.check_many(key, limit, costs),
            None => Box::pin(std::future::ready(Err(self.not_yet()))),
        }
    }

    /// Starts the task that retries, unless it runs.
    fn retry(&self) {
        if self.inner.retrying.swap(true, Ordering::AcqRel) {
            return;
        }
        // Made before the task: the flag is let go however the task ends (connected, the store
        // dropped, or the task dropped with its runtime, even unrun), so that a later check can
        // start it again.
        let retrying = Retrying(Arc::downgrade(&self.inner), Arc::clone(&self.inner.dropped));
        self.inner.home.spawn(retrying.run());
    }

    /// The last attempt's error (and the task that retries started again, if it no longer runs).
    fn not_yet(&self) -> RedisStoreError {
        self.retry();
        let last = self
            .inner
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        last.1
            .clone()
            .unwrap_or_else(|| RedisStoreError::Connection {
                message: "Redis has not been reached yet".into(),
                source: None,
            })
    }
}

/// A store already built: connected from the start. For code that serves either way (built
/// with [`build`](RedisStoreBuilder::build) when Redis must be up at start-up, lazily when it
/// need not) over one store type.
impl From<RedisStore> for LazyRedisStore {
    fn from(store: RedisStore) -> Self {
        LazyRedisStore {
            inner: Arc::new(Inner {
                home: store.home().clone(),
                cluster: store.is_cluster(),
                response_timeout: Store::response_timeout(&store).unwrap_or(MAX_TIMEOUT),
                builder: None,
                retry_every: MAX_TIMEOUT,
                store: OnceLock::from(store),
                retrying: AtomicBool::new(false),
                last: Mutex::new((Instant::now(), None)),
                warned: Mutex::new(Warned::default()),
                dropped: Arc::default(),
            }),
        }
    }
}

/// The task that retries, holding the store weakly (a store dropped ends it, at once through the
/// store's `dropped`); its flag is let go when this drops.
struct Retrying(Weak<Inner>, Arc<tokio::sync::Notify>);

impl Retrying {
    async fn run(self) {
        loop {
            // One attempt per `retry_every` at most, counted from the last one's start.
            let wait = match self.0.upgrade() {
                Some(inner) => {
                    let last = inner.last.lock().unwrap_or_else(PoisonError::into_inner).0;
                    inner.retry_every.saturating_sub(last.elapsed())
                }
                None => return,
            };
            // Told that the store was dropped: ended now, not after the wait.
            if tokio::time::timeout(wait, self.1.notified()).await.is_ok() {
                return;
            }
            let attempt = {
                let Some(inner) = self.0.upgrade() else {
                    return;
                };
                let Some(builder) = &inner.builder else {
                    return;
                };
                if inner.store.get().is_some() {
                    return;
                }
                inner.last.lock().unwrap_or_else(PoisonError::into_inner).0 = Instant::now();
                builder.clone().build()
                // The store is let go while the attempt runs, so that it can be dropped then.
            };
            // Told that the store was dropped: the attempt is abandoned rather than run to the
            // end of its timeouts (the store's own task opening its connection ends within the
            // connect timeout).
            let mut attempt = std::pin::pin!(attempt);
            let mut dropped = std::pin::pin!(self.1.notified());
            let built = std::future::poll_fn(|cx| {
                if dropped.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(None);
                }
                attempt.as_mut().poll(cx).map(Some)
            })
            .await;
            let (Some(built), Some(inner)) = (built, self.0.upgrade()) else {
                return;
            };
            match built {
                Ok(store) => {
                    let _ = inner.store.set(store);
                    tracing::info!("ratelimit-redis: connected to Redis");
                    return;
                }
                Err(error) => {
                    log_failure(&inner.warned, &error);
                    inner.last.lock().unwrap_or_else(PoisonError::into_inner).1 = Some(error);
                }
            }
        }
    }
}

impl Drop for Retrying {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.retrying.store(false, Ordering::Release);
        }
    }
}

/// How often a failing attempt is logged as a warning at most: an outage retried every 500 ms
/// would otherwise write 7,200 warnings an hour. The others are `DEBUG` events.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What [`log_failure`] last warned of.
#[derive(Debug, Default)]
struct Warned {
    /// When, if ever.
    at: Option<Instant>,
    /// Why the attempt failed.
    cause: Cause,
    /// The failed attempts since.
    failed: u64,
}

/// Logs a failed attempt: a warning for the first, and then at most one per [`WARN_EVERY`],
/// which says how many failed since the last; `DEBUG` for the rest. A change of [`Cause`] (Redis
/// reached again but refusing the credentials, rotated during the outage, say) is warned of at
/// once.
fn log_failure(warned: &Mutex<Warned>, error: &RedisStoreError) {
    let cause = Cause::of(error);
    let since = {
        let mut w = warned.lock().unwrap_or_else(PoisonError::into_inner);
        w.failed += 1;
        if w.cause == cause && w.at.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            tracing::debug!(%error, "ratelimit-redis: an attempt to reach Redis failed");
            return;
        }
        let since = w.failed;
        *w = Warned {
            at: Some(Instant::now()),
            cause,
            failed: 0,
        };
        since
    };
    match cause {
        Cause::Refused => {
            tracing::warn!(%error, failed = since, "ratelimit-redis: Redis refused the credentials; retrying in the background");
        }
        Cause::NotServing => {
            tracing::warn!(%error, failed = since, "ratelimit-redis: Redis was reached but cannot serve checks yet; retrying in the background");
        }
        Cause::WrongServer => {
            tracing::warn!(%error, failed = since, "ratelimit-redis: what answers is not a Redis this store can use; retrying in the background");
        }
        Cause::Unreachable => {
            tracing::warn!(%error, failed = since, "ratelimit-redis: Redis cannot be reached yet; retrying in the background");
        }
    }
}

/// Why an attempt failed, as its warning tells it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Cause {
    #[default]
    Unreachable,
    /// Reached, and refusing the credentials.
    Refused,
    /// Reached, and not serving: still loading its data (`LOADING`), or a replica.
    NotServing,
    /// Reached, and not a Redis the store can use (`is_wrong_server`): refused at the first
    /// attempt, and retried only when reached after an outage.
    WrongServer,
}

impl Cause {
    fn of(error: &RedisStoreError) -> Cause {
        use redis::{ErrorKind, ServerErrorKind};
        let kind = match error {
            RedisStoreError::Redis(e)
            | RedisStoreError::Connection {
                source: Some(e), ..
            } => Some(e.kind()),
            _ => None,
        };
        if error.is_refused_credentials() {
            Cause::Refused
        } else if error.is_wrong_server() {
            Cause::WrongServer
        } else if matches!(
            kind,
            Some(ErrorKind::Server(
                ServerErrorKind::BusyLoading | ServerErrorKind::ReadOnly
            ))
        ) {
            Cause::NotServing
        } else {
            Cause::Unreachable
        }
    }
}

impl Store for LazyRedisStore {
    type Error = RedisStoreError;
    type Future = CheckFuture;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> CheckFuture {
        match self.inner.store.get() {
            Some(store) => store.check(key, limit, cost),
            None => Box::pin(std::future::ready(Err(self.not_yet()))),
        }
    }

    /// As the built store's, known before it is built (see [`RedisStore`]'s).
    fn failure_domains(&self) -> usize {
        crate::store::failure_domains(self.inner.cluster)
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        crate::store::failure_domain(self.inner.cluster, key)
    }

    /// The builder's, known before the store is built.
    fn response_timeout(&self) -> Option<Duration> {
        Some(self.inner.response_timeout)
    }
}

impl Reset for LazyRedisStore {
    type ResetFuture = ResetFuture;

    /// The built store's reset; before the store is built, the error a check gets then.
    fn reset(&self, key: &[u8], limit: &Limit) -> ResetFuture {
        match self.inner.store.get() {
            Some(store) => store.reset(key, limit),
            None => Box::pin(std::future::ready(Err(self.not_yet()))),
        }
    }
}
