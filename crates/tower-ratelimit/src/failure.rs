//! What the layer does when its store cannot answer.
//!
//! A store call fails when the store returns an error, when it does not answer within the
//! layer's timeout (50 ms by default), or when the circuit breaker is open (unless a cache in
//! front of the store answers the check: a cached denial, a leased unit; see
//! [`Store::check_cached`](ratelimit_core::Store::check_cached)). The policy's
//! [`FailurePolicy`] then decides, and the decision is counted in
//! `ratelimit_decisions_total{outcome=...}` and logged with `tracing`.
//!
//! ## Fail open: availability first
//!
//! ```
//! use tower_ratelimit::{FailurePolicy, Policy};
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//!
//! let policy = Policy::new("api", Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?)?
//!     .failure(FailurePolicy::FailOpen);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Fail closed: for routes where a missing limit is worse than an outage (login)
//!
//! The client gets `503 Service Unavailable` with `Retry-After`.
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::{FailurePolicy, Policy};
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//!
//! let policy = Policy::new("login", Limit::single(Algorithm::Gcra, Quota::per_minute(5)?)?)?
//!     .failure(FailurePolicy::fail_closed(Duration::from_secs(2)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Fall back to a local share of the limit
//!
//! Each gateway counts alone in its own memory, with every quota divided by the number of
//! gateways (rounded down, but at least 1), so that together they grant no more than the shared
//! limit would have, unless the limit (or its burst) is smaller than the number of gateways: then
//! each still grants 1, and together up to one per gateway (5 a minute over 10 gateways becomes
//! up to 10). A limit whose share a token bucket or GCRA cannot count exactly is rounded down a
//! little further (10,000,000 a day over 3 gateways gives a rate of 3,333,312 a day each, with a
//! burst of 3,333,333, a third of the shared burst; more for a period
//! with few divisors, or its burst lowered instead; see
//! [`Limit::divided`](ratelimit_core::Limit::divided)), never up. A request whose cost fits the
//! shared limit but not the local share is denied until the store is back, its `Retry-After`
//! saying when the layer asks the store again: what is left of the cool-down of the key's
//! circuit while it is open, else 1 s (closed, the next request asks it; half-open, its
//! probe is out, answered or failed within the layer's timeout). Meanwhile the
//! `RateLimit-Policy` and `RateLimit` fields describe that local share (`q=25` below), the quota
//! the answer was made against, as the legacy `X-RateLimit-Limit` does. The local store holds
//! at most 1,000,000 keys by default
//! ([`fallback_max_keys`](crate::RateLimitLayerBuilder::fallback_max_keys)), dropping those nearest
//! to full again at the cap; [`RateLimitLayer::fallback_stats`](crate::RateLimitLayer::fallback_stats)
//! says what it holds and has dropped.
//!
//! ```
//! use tower_ratelimit::{FailurePolicy, Policy};
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//!
//! // Four gateways: each grants 25 a minute per key while the shared store is down.
//! let policy = Policy::new("api", Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?)?
//!     .failure(FailurePolicy::fallback(4)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use crate::Error;

/// The answer to a request when the store cannot be asked (error, timeout, open circuit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through, unlimited, and record it (`outcome="failed_open"`). The default.
    #[default]
    FailOpen,
    /// Answer `503 Service Unavailable` with `Retry-After` (`outcome="failed_closed"`).
    FailClosed {
        /// What `Retry-After` says (whole seconds, rounded up, at least 1).
        retry_after: Duration,
    },
    /// Count the request in this process's memory against the limit divided by `gateways`
    /// (`outcome="fallback_allowed"` or `"fallback_denied"`).
    Fallback {
        /// How many gateways share the limit (at least 1).
        gateways: u64,
    },
}

impl FailurePolicy {
    /// [`FailurePolicy::FailClosed`] with this `Retry-After` (more than zero and at most a day:
    /// another is refused when the layer is built; sent in whole seconds, rounded up).
    #[must_use]
    pub const fn fail_closed(retry_after: Duration) -> Self {
        FailurePolicy::FailClosed { retry_after }
    }

    /// [`FailurePolicy::Fallback`] with the limit shared by `gateways` gateways (at least 1).
    pub fn fallback(gateways: u64) -> Result<Self, Error> {
        let policy = FailurePolicy::Fallback { gateways };
        policy.check()?;
        Ok(policy)
    }

    /// Refuses settings that would not mean what they say: 0 gateways (each gateway's share
    /// would be the whole limit), or a `Retry-After` of zero (sent as 1 s) or over a day. Checked
    /// again when a layer is built, for the variants built directly.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match *self {
            FailurePolicy::Fallback { gateways: 0 } => Err(Error::InvalidSetting {
                name: "gateways",
                reason: "must be at least 1 (each gateway's share is the limit divided by it)",
            }),
            FailurePolicy::FailClosed { retry_after } if retry_after > MAX_RETRY_AFTER => {
                Err(Error::InvalidSetting {
                    name: "retry_after",
                    reason: "must be at most one day",
                })
            }
            FailurePolicy::FailClosed { retry_after } if retry_after.is_zero() => {
                Err(Error::InvalidSetting {
                    name: "retry_after",
                    reason: "must be more than zero (`Retry-After` is sent in whole seconds, \
                             rounded up)",
                })
            }
            _ => Ok(()),
        }
    }
}

/// The longest `Retry-After` a fail-closed policy may advertise.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);
