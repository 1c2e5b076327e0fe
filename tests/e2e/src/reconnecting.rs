//! A Redis store that an application can create while Redis is down.
//!
//! [`RedisStoreBuilder::build`] opens its connections at once and fails if Redis cannot be
//! reached: a configuration mistake is then found at start-up. An application that must start
//! during a Redis outage wraps the builder in a [`ReconnectingStore`]: until a store could be
//! built, each check fails at once with [`RedisStoreError::Connection`] (so the layer's failure
//! policy answers) and starts one background attempt to build it, at most one attempt at a time
//! and one per `retry_every`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ratelimit_core::{Limit, Store};
use ratelimit_redis::{CheckFuture, RedisStore, RedisStoreBuilder, RedisStoreError};

type Make = Box<dyn Fn() -> RedisStoreBuilder + Send + Sync>;

/// A [`RedisStore`] built lazily, retried in the background until Redis answers. See the
/// [module docs](self).
#[derive(Clone)]
pub struct ReconnectingStore {
    inner: Arc<Inner>,
}

struct Inner {
    make: Make,
    store: OnceLock<RedisStore>,
    connecting: AtomicBool,
    last_attempt: Mutex<Option<Instant>>,
    retry_every: Duration,
}

impl std::fmt::Debug for ReconnectingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconnectingStore")
            .field("connected", &self.is_connected())
            .field("retry_every", &self.inner.retry_every)
            .finish()
    }
}

impl ReconnectingStore {
    /// Tries once to build the store from `make()`; whatever the outcome, returns a store that
    /// keeps trying (in the background, at most every `retry_every`) until it succeeds.
    pub async fn connect(
        make: impl Fn() -> RedisStoreBuilder + Send + Sync + 'static,
        retry_every: Duration,
    ) -> ReconnectingStore {
        let inner = Arc::new(Inner {
            make: Box::new(make),
            store: OnceLock::new(),
            connecting: AtomicBool::new(true),
            last_attempt: Mutex::new(Some(Instant::now())),
            retry_every,
        });
        attempt(&inner).await;
        ReconnectingStore { inner }
    }

    /// Whether the Redis store has been built.
    pub fn is_connected(&self) -> bool {
        self.inner.store.get().is_some()
    }

    fn reconnect_in_background(&self) {
        let due = {
            let last = self
                .inner
                .last_attempt
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            last.is_none_or(|t| t.elapsed() >= self.inner.retry_every)
        };
        if !due || self.inner.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        *self
            .inner
            .last_attempt
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { attempt(&inner).await });
    }
}

async fn attempt(inner: &Inner) {
    match (inner.make)().build().await {
        Ok(store) => {
            let _ = inner.store.set(store);
            tracing::info!("rate-limit store connected to Redis");
        }
        Err(error) => {
            tracing::warn!(%error, "rate-limit store cannot reach Redis yet; retrying");
        }
    }
    inner.connecting.store(false, Ordering::Release);
}

impl Store for ReconnectingStore {
    type Error = RedisStoreError;
    type Future = CheckFuture;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> CheckFuture {
        if let Some(store) = self.inner.store.get() {
            return store.check(key, limit, cost);
        }
        self.reconnect_in_background();
        Box::pin(std::future::ready(Err(RedisStoreError::Connection {
            message: "Redis was unreachable at start-up; connecting in the background".into(),
            source: None,
        })))
    }
}
