//! A Redis-backed [`Store`] for `ratelimit-core`: one atomic Lua script per
//! check, on standalone Redis or Redis Cluster, making the same decisions as the in-memory
//! algorithms.
//!
//! ```no_run
//! use ratelimit_core::{Algorithm, Limit, Quota};
//! use ratelimit_redis::RedisStore;
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .prefix("myapp:rl")
//!     .pool_size(1)
//!     .response_timeout(Duration::from_millis(200))
//!     .build()
//!     .await?;
//!
//! // 10 per second with bursts of 20, and 1,000 per hour: both checked in one script call.
//! let limit = Limit::new(
//!     Algorithm::TokenBucket,
//!     [Quota::per_second(10)?.with_burst(20)?, Quota::per_hour(1_000)?],
//! )?;
//! let decision = store.check(b"user:42", &limit, 1).await?;
//! if decision.is_allowed() {
//!     println!("allowed, {} left", decision.remaining());
//! } else if let Some(wait) = decision.retry_after() {
//!     println!("denied, retry in {wait:?}");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees
//! - **Atomic.** Each check is one `EVALSHA`: the read, the decision and the write run as one
//!   step on the server, so any number of gateways sharing the Redis enforce one limit together.
//!   A limit of several quotas is checked all-or-nothing in the same call.
//! - **Same decisions as `ratelimit-core`.** The scripts port each algorithm's integer arithmetic
//!   (microseconds, bucket levels in `1/scale` token units) exactly; a conformance suite runs the
//!   same sequences through `MemoryStore` and `RedisStore` and compares every field of every
//!   [`Decision`].
//! - **Server time.** By default the time comes from Redis's `TIME`, so clock skew between
//!   gateways cannot change decisions; [`RedisStoreBuilder::client_clock`] uses a client clock.
//! - **Expiring state.** Every write sets the key's expiry to the moment its state is fresh
//!   again: no key lives forever and no cleanup job is needed.
//! - **Bounded, tag-safe keys.** `prefix:{user key}:algorithm code:fingerprint`; long or unusual user
//!   keys are hashed, braces never reach the hash tag.
//! - **Re-sent only when it provably did not run.** After `NOSCRIPT` (and, on Redis Cluster,
//!   `MOVED`, `ASK` and the refusals `TRYAGAIN`, `CLUSTERDOWN`...) a check is sent again; any
//!   other error is returned as is, since replaying a script that may have run would count a
//!   request twice. The cluster client is built with no retries of its own for that reason
//!   (see `docs/redis.md`, "Cluster").
//!
//! Connections: the store keeps [`pool_size`](RedisStoreBuilder::pool_size) multiplexed
//! connections made through a deadpool pool (deadpool-redis's on a standalone server; on a
//! cluster the store's own manager, whose client never re-sends a command by itself) and hands
//! them out in turn, so concurrent checks are pipelined instead of each taking a pooled
//! connection (which would add a health-check round trip per check). A connection that breaks,
//! or (standalone) that answers `READONLY`, is replaced by a task of its slot, which a check that
//! stops waiting does not cancel. One that has left a command unanswered for the response timeout
//! is probed (a `PING`, sent when the next check finds the silence, or by a task that watches
//! the connection once a check has ended without its answer, even if no other check comes) and
//! replaced if the probe fails or stays unanswered for another response timeout (a standalone
//! connection the probe finds broken is dropped at once instead, as any broken one is, and the
//! next check opens a new one; a cluster connection is kept when no new one can be made that
//! reaches every master, since it still serves the masters that answer; the attempts are then
//! spaced out, up to 8 s apart). One that has carried nothing for
//! [`ping_after_idle`](RedisStoreBuilder::ping_after_idle) (10 s) gets a `PING` before the next
//! check, so that a connection Redis or a proxy closed while it was idle is replaced before a
//! check is written on it; every connection has TCP keepalive probes after 60 s idle.
//!
//! Starting while Redis is down: [`build`](RedisStoreBuilder::build) fails when it cannot
//! connect, so that a wrong address is found at start-up;
//! [`build_lazy`](RedisStoreBuilder::build_lazy) gives a [`LazyRedisStore`] instead, whose checks
//! fail at once (the caller's failure policy answers) while it connects in the background.
//!
//! Fewer round trips: [`Coalescing`] merges the concurrent checks of one key on one gateway into
//! one script call ([`RedisStore::check_many`]); with `ratelimit-core`'s `DenialCache` and
//! `Leasing` wrappers, see `docs/round-trips.md` for what each saves and its exact error bounds.
//!
//! See `docs/redis.md` for the key layout, the scripts, expiry and the cluster rules.
//!
//! # Features
//! - `tls`: `rediss://` URLs (TLS, as managed Redis services use; `valkeys://`, which redis-rs
//!   takes as the same, likewise), through the system's OpenSSL
//!   (native-tls; building needs `libssl-dev` and `pkg-config`). Without it, a `rediss://` URL is
//!   refused by [`build`](RedisStoreBuilder::build) with a
//!   [`RedisStoreError::Config`] that says so.
//! - `tls-rustls`: the same through rustls (aws-lc-rs as its crypto provider, which `build`
//!   installs as the process default unless the application installed one; no OpenSSL), where
//!   `RedisStoreBuilder::tls_root_certificate` and `tls_client_certificate` serve Redis Cluster
//!   as well as standalone servers. Choose one of the two: with both on (features unify across a
//!   build), redis-rs connects through rustls but verifies only against a root certificate given
//!   to the builder, so `build` refuses a `rediss://` URL without one.
#![forbid(unsafe_code)]

mod cluster;
mod coalesce;
mod error;
mod in_runtime;
mod key;
mod lazy;
pub mod metrics;
mod reply;
mod scripts;
mod silence;
mod spawn;
mod store;
mod turns;
pub mod watch;

pub use coalesce::{
    CoalesceFuture, Coalescing, CoalescingStats, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_CALLS,
    MAX_BATCH_WINDOW, ScriptStore,
};
pub use error::RedisStoreError;
pub use key::MAX_VERBATIM_KEY;
pub use lazy::LazyRedisStore;
/// The core crate, and the types a check names, so that a store used alone needs this crate only.
pub use ratelimit_core;
pub use ratelimit_core::{Algorithm, Decision, Limit, Quota, Reset, Store};
pub use scripts::{script_sha, script_source};
pub use store::{
    CLUSTER_FAILURE_DOMAINS, CheckFuture, CheckManyFuture, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PING_AFTER_IDLE, DEFAULT_POOL_SIZE, DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT, MAX_TIMEOUT, RedisStore, RedisStoreBuilder, ResetFuture, is_tls_url,
    redact_url,
};
pub use watch::{ResetNotice, ResetWatch};
