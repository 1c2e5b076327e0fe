//! Exact, deterministic rate limiting: quotas, algorithms, clocks, the [`Store`] trait and a
//! bounded in-memory store.
//!
//! ```
//! use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Outcome, Quota};
//! use std::time::Duration;
//!
//! // 100 requests a minute per user, on a clock the test controls.
//! let clock = ManualClock::new();
//! let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
//! let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
//!
//! for _ in 0..100 {
//!     assert!(store.check_now(b"user:42", &limit, 1).is_allowed());
//! }
//! let denied = store.check_now(b"user:42", &limit, 1);
//! // One token comes back every 600 ms.
//! assert_eq!(denied.outcome(), Outcome::Denied { retry_after: Duration::from_millis(600) });
//!
//! clock.advance(Duration::from_millis(600));
//! assert!(store.check_now(b"user:42", &limit, 1).is_allowed());
//! # Ok::<(), ratelimit_core::ConfigError>(())
//! ```
//!
//! # Pieces
//! - [`Quota`]: a validated rate, with its units in its name (`Quota::per_second(5)` is five per
//!   second).
//! - [`Algorithm`]: token bucket (the default), GCRA, fixed window, sliding-window counter and
//!   sliding log, each a pure function in [`algorithm`] of (quota, state, now, cost).
//! - [`Limit`]: an algorithm over one or more quotas, checked all-or-nothing.
//! - [`Decision`]: allowed or denied, with what to tell the client (remaining, reset, retry-after).
//! - [`Clock`]: [`SystemClock`], [`WallClock`] and [`ManualClock`]. Algorithms never read a clock;
//!   stores do.
//! - [`Store`]: where state lives; [`MemoryStore`] here, a Redis store in `ratelimit-redis`;
//!   [`Reset`] for a store that can forget a client, and [`conformance`], a kit that shows a
//!   store of another crate decides as the algorithms do.
//!
//! This crate depends on no async runtime, no HTTP crate and no Redis client.
//!
//! # Features
//! - `serde`: `Serialize` and `Deserialize` for [`Algorithm`] (its configuration name, such as
//!   `"token_bucket"`); `tower-ratelimit`'s `serde` feature turns it on.
// `unsafe` is denied everywhere but in `prefetch`, which holds the crate's one `unsafe` call (a
// cache prefetch hint; see its docs for why and what it is worth).
#![deny(unsafe_code)]

pub mod algorithm;
mod clock;
pub mod conformance;
mod decision;
mod denial_cache;
mod error;
mod key_digest;
mod lease;
mod limit;
mod memory_store;
mod prefetch;
mod quota;
mod quota_set;
mod reset;
mod store;
mod time;

pub use algorithm::{Algorithm, State};
pub use clock::{Clock, ManualClock, SystemClock, WallClock};
pub use decision::{Decision, Outcome};
pub use denial_cache::{DEFAULT_MAX_DENIALS, DenialCache, DenialCacheFuture, DenialCacheStats};
pub use error::ConfigError;
pub use lease::{
    DEFAULT_MAX_LEASE, DEFAULT_MAX_LEASED_KEYS, DEFAULT_MAX_TTL, LeaseFuture, Leasing,
    LeasingBuilder, LeasingStats,
};
pub use limit::{Limit, MAX_QUOTAS, MAX_SLIDING_LOG_LIMIT};
pub use memory_store::{DEFAULT_MAX_KEYS, MemoryStore, MemoryStoreBuilder};
pub use quota::{MAX_EXACT, Quota};
pub use quota_set::{QuotaSet, QuotaSetIter};
pub use reset::{Forget, Reset, WrapperResetFuture};
pub use store::{NoError, Store};
pub use time::Timestamp;
