//! [`LazyRedisStore`]: a Redis store that an application can make while Redis is down.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ratelimit_core::{Limit, Store};

use crate::error::RedisStoreError;
use crate::store::{CheckFuture, RedisStore, RedisStoreBuilder};

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
///   wrong setting, not Redis being down), and neither is retried;
/// - until an attempt succeeds, every check fails at once with the last attempt's error (a
///   [`RedisStoreError::Connection`] when the server cannot be reached), so the layer's failure
///   policy answers (fail open, fail closed, or the local fallback), and starts an attempt in
///   the background: one at a time, at most one per `retry_every`, each bounded by the builder's
///   timeouts, and each failure logged (`WARN`);
/// - once an attempt succeeds, every check goes to the [`RedisStore`] it built, which mends its
///   own connections from then on.
///
/// A check made outside a Tokio runtime before the store is built fails without starting an
/// attempt; the next check made inside one starts it.
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
    retry_every: Duration,
    store: OnceLock<RedisStore>,
    /// Set while an attempt runs.
    attempting: AtomicBool,
    /// When the last attempt started, and its error (none if the first one succeeded).
    last: Mutex<(Instant, Option<RedisStoreError>)>,
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
        let started = Instant::now();
        let (store, error) = match builder.clone().build().await {
            Ok(store) => (OnceLock::from(store), None),
            Err(e @ RedisStoreError::Config { .. }) => return Err(e),
            Err(e) if e.is_refused_credentials() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "ratelimit-redis: Redis cannot be reached yet; retrying in the background");
                (OnceLock::new(), Some(e))
            }
        };
        Ok(LazyRedisStore {
            inner: Arc::new(Inner {
                builder: Some(builder),
                retry_every,
                store,
                attempting: AtomicBool::new(false),
                last: Mutex::new((started, error)),
            }),
        })
    }

    /// Whether the store has been built (an attempt reached Redis).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.inner.store.get().is_some()
    }

    /// The built store, once an attempt reached Redis: for [`RedisStore::state_keys`] and the
    /// like.
    #[must_use]
    pub fn get(&self) -> Option<&RedisStore> {
        self.inner.store.get()
    }

    /// The last attempt's error; and a new attempt, in the background, if none runs and the last
    /// started `retry_every` ago or more.
    fn not_yet(&self) -> RedisStoreError {
        let inner = &self.inner;
        let mut last = inner.last.lock().unwrap_or_else(PoisonError::into_inner);
        let due = last.0.elapsed() >= inner.retry_every;
        if due
            && tokio::runtime::Handle::try_current().is_ok()
            && !inner.attempting.swap(true, Ordering::AcqRel)
        {
            last.0 = Instant::now();
            // Made before the task: the flag is let go however the task ends (done, panicked,
            // or dropped with its runtime, even unrun), or no attempt would ever be made again.
            let attempt = Attempt(Arc::clone(inner));
            tokio::spawn(async move { attempt.0.attempt().await });
        }
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
                builder: None,
                retry_every: Duration::MAX,
                store: OnceLock::from(store),
                attempting: AtomicBool::new(false),
                last: Mutex::new((Instant::now(), None)),
            }),
        }
    }
}

/// An attempt in progress: its flag is let go when this drops.
struct Attempt(Arc<Inner>);

impl Drop for Attempt {
    fn drop(&mut self) {
        self.0.attempting.store(false, Ordering::Release);
    }
}

impl Inner {
    async fn attempt(&self) {
        let built = match &self.builder {
            Some(builder) => builder.clone().build().await,
            None => Err(RedisStoreError::config("builder", "none to build from")),
        };
        match built {
            Ok(store) => {
                let _ = self.store.set(store);
                tracing::info!("ratelimit-redis: connected to Redis");
            }
            Err(error) => {
                tracing::warn!(%error, "ratelimit-redis: Redis cannot be reached yet; retrying in the background");
                self.last.lock().unwrap_or_else(PoisonError::into_inner).1 = Some(error);
            }
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
}
