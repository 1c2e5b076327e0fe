//! What the layer tells clients: status, headers and bodies.
//!
//! A denied request gets `429 Too Many Requests` with:
//! - `Retry-After`: whole seconds, rounded up, never 0 (a wait of 1 ms says `1`);
//! - the fields of draft-ietf-httpapi-ratelimit-headers-10:
//!   `RateLimit-Policy: "api";q=100;w=60` (the quota: `q` requests per `w` seconds) and
//!   `RateLimit: "api";r=0;t=17` (`r` left now, `t` seconds until the client may send again);
//! - optionally the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`;
//! - a body: plain text by default, `application/problem+json` (the draft's `quota-exceeded`
//!   problem type), or whatever a closure returns; or, for a gRPC service, no 429 at all but the
//!   gRPC status `RESOURCE_EXHAUSTED` ([`DenialBody::Grpc`]), which gRPC clients understand.
//!
//! On allowed responses `RateLimit` says how many are left and `t` when more is available, as
//! draft-10 defines it: for the token bucket and GCRA, when the next whole unit comes back (a
//! bucket of 5 a minute, two spent: `r=3;t=12`, the third back in 12 s); for a fixed window, its
//! end; for the sliding window and log, when the next unit frees, which the store computes
//! ([`Decision::more_after`](ratelimit_core::Decision::more_after): a sliding log of 10 per 10 s, 4
//! spent at 0 s, 3 at 2 s and 3 at 4 s, one more at 10 s: `r=3;t=2`, the three of 2 s back at 12 s;
//! the quota is full again only at 20 s). A bucket's `t` is never before its next unit, and at
//! most a second after it: when a unit takes a fractional number of microseconds (3 per 10 s),
//! the decision's time to full, in whole microseconds, leaves the unit's time uncertain by one,
//! and `t` takes the later (a unit back at exactly 3 s may read `t=4`). Whatever the algorithm,
//! while the quota is full nothing more can come, and `t`, optional, is left out (`"api";r=5`). A sliding algorithm's answer that
//! does not say (a leased one) gives the seconds until the quota is full again, which bounds it;
//! behind a `Leasing` store a bucket's `t` is later than its next unit by up to the refill time
//! of the lease's unspent units, which the store's reset counts as spent and `r` as left
//! (`docs/round-trips.md`). Of a limit of
//! several quotas, the sliding algorithms' `t` waits for every quota with as few left as the
//! binding one; the buckets' is the binding quota's next unit, and another quota with as few left
//! may free its own later (the decision does not carry the others' levels). `X-RateLimit-Reset`
//! keeps its own meaning on an allowed response, the seconds until the quota is full again (`24`
//! for the bucket above), and on a 429 says the wait, as `Retry-After` does. A quota whose period is not whole seconds is advertised over the period rounded up, with `q` the
//! units granted in it at the quota's rate, rounded down (`100` per 100 ms is `q=1000;w=1`). For
//! the bucket algorithms `q` is the sustained rate: a burst above it shows in `r` (a fresh bucket
//! of 20 refilled at 10 a second says `q=10;w=1` and, after one request, `r=19`), and in
//! `X-RateLimit-Limit`, which gives the burst.
//!
//! What the inner service set is never overwritten. The IETF fields are lists of items, one per
//! policy: if the inner service (an upstream with limits of its own, or another rate-limit layer
//! inside this one) set them, the layer adds its own items as field lines of their own, which a
//! reader joins into one list (RFC 9651, section 3.1), so that a client sees every policy that
//! applies and which one binds; the two go together, so a `RateLimit` item of this layer's never
//! names a policy missing from `RateLimit-Policy`. None are added if an item of the same name is
//! there already. The three legacy fields hold one value each: the layer adds them only if the
//! inner service set none of them. A policy
//! of several quotas lists one `RateLimit-Policy` item per quota (`"api.0"`, `"api.1"`, ...), and
//! `RateLimit` names the quota that binds.
//!
//! Every response that passed through the layer carries a [`Verdict`] in its extensions, unless
//! the policy turned it off ([`Policy::verdict(false)`](crate::Policy::verdict)): read it with
//! `get::<Verdict>()`, which is `None` then.
//!
//! ## Header modes
//!
//! ```
//! use tower_ratelimit::{DenialBody, Headers, Policy};
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//!
//! let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
//! // The default: IETF fields on every response the store decided.
//! let default = Policy::new("api", limit.clone())?.headers(Headers::ietf());
//! // IETF fields on 429s only, plus the legacy X-RateLimit-* fields, and a problem+json body.
//! let both = Policy::new("api", limit.clone())?
//!     .headers(Headers::ietf().on_allowed(false).legacy(true))
//!     .body(DenialBody::ProblemJson);
//! // No rate-limit fields at all (a 429 still has Retry-After).
//! let quiet = Policy::new("api", limit)?.headers(Headers::none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## A custom body
//!
//! ```
//! use tower_ratelimit::{Algorithm, DenialBody, Limit, Policy, Quota, bytes, http};
//!
//! let body = DenialBody::custom(|denial| {
//!     // No wait when retrying can never help (a cost above the burst).
//!     let text = match denial.retry_after_secs() {
//!         Some(secs) => format!("slow down: retry in {secs} s"),
//!         None => "this request costs more than the limit allows".to_owned(),
//!     };
//!     http::Response::builder()
//!         .status(429)
//!         .header("content-type", "text/plain")
//!         .body(bytes::Bytes::from(text))
//!         .unwrap_or_default()
//! });
//! let policy = Policy::new("api", Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?)?
//!     .body(body);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, Entry, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use ratelimit_core::{Algorithm, Decision, Limit, QuotaSet};

use crate::service::Rt;

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT: HeaderName = names::RATELIMIT;
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT_POLICY: HeaderName = names::RATELIMIT_POLICY;
/// The legacy `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = names::X_RATELIMIT_LIMIT;
/// The legacy `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = names::X_RATELIMIT_REMAINING;
/// The legacy `X-RateLimit-Reset` (seconds from now).
pub static X_RATELIMIT_RESET: HeaderName = names::X_RATELIMIT_RESET;

/// The names as constants, for `HeaderMap::entry`, which takes its name by value: a constant is
/// built in place and moved into the map, where a static passed by reference is cloned into it on
/// every response. The public statics above are made from them.
mod names {
    #![allow(clippy::declare_interior_mutable_const)] // Each use is a fresh value; none is mutated.
    use http::HeaderName;
    pub(super) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
    pub(super) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    pub(super) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
    pub(super) const X_RATELIMIT_REMAINING: HeaderName =
        HeaderName::from_static("x-ratelimit-remaining");
    pub(super) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
}

/// The problem type of draft-ietf-httpapi-ratelimit-headers-10 for a 429.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Which rate-limit fields to send, and on which responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Headers {
    ietf: bool,
    legacy: bool,
    on_allowed: bool,
}

impl Headers {
    /// The IETF `RateLimit` and `RateLimit-Policy` fields on every response the store decided,
    /// allowed or denied (the default); none on a response the allow-list, a missing key, a
    /// failure policy (failed open, failed closed) or a dry run answered or let through, which
    /// no count of the client's stands behind.
    pub const fn ietf() -> Self {
        Headers {
            ietf: true,
            legacy: false,
            on_allowed: true,
        }
    }

    /// No rate-limit fields (429s still carry `Retry-After`). A group turned on from here
    /// (`none().legacy(true)`) goes on every response, as from [`ietf`](Self::ietf).
    pub const fn none() -> Self {
        Headers {
            ietf: false,
            legacy: false,
            on_allowed: true,
        }
    }

    /// Whether to send the IETF fields.
    pub const fn with_ietf(mut self, on: bool) -> Self {
        self.ietf = on;
        self
    }

    /// Whether to send the legacy `X-RateLimit-Limit/Remaining/Reset` fields too.
    pub const fn legacy(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }

    /// Whether to send the fields on allowed responses too, or on 429s only.
    pub const fn on_allowed(mut self, on: bool) -> Self {
        self.on_allowed = on;
        self
    }

    pub(crate) const fn any(&self) -> bool {
        self.ietf || self.legacy
    }

    pub(crate) const fn any_on_allowed(&self) -> bool {
        self.any() && self.on_allowed
    }
}

impl Default for Headers {
    fn default() -> Self {
        Headers::ietf()
    }
}

/// What a denial is, for a custom body.
#[derive(Debug, Clone, Copy)]
pub struct Denial<'a> {
    policy: &'a str,
    tier: Option<&'a str>,
    decision: &'a Decision,
    until_store: Option<Duration>,
}

impl Denial<'_> {
    /// The policy's name.
    #[must_use]
    pub fn policy(&self) -> &str {
        self.policy
    }

    /// The name of the request's tier (see [`Policy::tier`](crate::Policy::tier)), whose limit
    /// denied it; `None` for the policy's own limit. A body can name the plan and what the next
    /// one allows.
    #[must_use]
    pub fn tier(&self) -> Option<&str> {
        self.tier
    }

    /// The decision.
    #[must_use]
    pub fn decision(&self) -> &Decision {
        self.decision
    }

    /// What `Retry-After` says: whole seconds rounded up, at least 1; `None` when the request's
    /// cost can never pass. A denial by the fallback's local share (the store down) of a cost
    /// above that share which the shared limit can admit says when the layer asks the store
    /// again: what is left of the cool-down of the key's circuit if it is open, else 1 s. (Its
    /// [`decision`](Self::decision) is the local share's, which can never admit the cost:
    /// `Exceeds`, with no `retry_after`; the `RateLimit` fields describe that share too.)
    #[must_use]
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.decision
            .retry_after()
            .or(self.until_store)
            .map(retry_after_secs)
    }
}

type CustomBody = Arc<dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync>;

/// The body of a 429.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum DenialBody {
    /// `text/plain; charset=utf-8`: `Too Many Requests` and a newline, as the layer's other
    /// plain-text answers end. The default.
    #[default]
    PlainText,
    /// `application/problem+json` with the draft's `quota-exceeded` problem type and the
    /// quota-policy items that denied (as `RateLimit-Policy` names them) in `violated-policies`:
    /// of a policy of several quotas, every quota that did not admit the request
    /// ([`Decision::violated_quotas`](ratelimit_core::Decision::violated_quotas); a store behind
    /// a `DenialCache` names the binding quota alone in a denial answered from the cache). The
    /// layer's other answers (a missing key, failing closed) are then problem+json too, of type
    /// `about:blank`: titled with the status's phrase, the words of their plain text in
    /// `detail`.
    ProblemJson,
    /// For gRPC calls (such as to tonic's services, behind this layer): the denial as gRPC says
    /// it, a trailers-only response with HTTP status 200, the call's own `content-type`
    /// (`application/grpc`, or `application/grpc+proto` for a call sent so),
    /// `grpc-status: 8` (`RESOURCE_EXHAUSTED`, the code for a quota exhausted) and
    /// `grpc-message: Too Many Requests`, and no body. A gRPC client does not read an HTTP 429
    /// as a rate limit: tonic's reads the plain-text body as a gRPC message and fails with
    /// `INTERNAL`, and the gRPC spec maps a 429 without a gRPC status to `UNAVAILABLE`, the code
    /// of a server that is down (`tests/grpc.rs` shows both answers to tonic's client).
    ///
    /// Only a `POST` whose `content-type` is gRPC's is answered so (`application/grpc`,
    /// `application/grpc-web` or `application/grpc-web-text`, with a `+proto`-like suffix or
    /// parameters or not): every gRPC call is a `POST`. Any other request (a REST route under the
    /// same layer, a browser, an `application/grpcx`, a `GET` that sends gRPC's `content-type`)
    /// gets the plain-text 429, never a 200: a 200 to a `GET` is one a shared cache may keep and
    /// serve to every client of that URL.
    ///
    /// The wait goes in `Retry-After` and in `grpc-retry-pushback-ms`, the pushback a gRPC
    /// client's retry policy waits for before its next attempt (grpc-java waits for it even for
    /// a status its policy does not retry, bounded by the call's deadline). A cost that can never
    /// pass sends `-1`, "do not retry", and so does a wait longer than a pushback can say
    /// (2^31 − 1 ms, about 24.8 days, which grpc-java cannot parse: a monthly quota spent early in
    /// the month), which no retry within a call could outlast; `Retry-After` and `RateLimit`
    /// still tell the whole wait (a cost that only the fallback's local share cannot admit, while the store is
    /// down, is told when the store is asked again, as [`Denial::retry_after_secs`] says, in
    /// milliseconds). The rate-limit fields go in as they would on a 429; all of these reach
    /// the client as the status's metadata.
    ///
    /// The layer's other answers to a gRPC call become gRPC statuses too, by the inverse of
    /// `google.rpc.Code`'s HTTP mapping: failing closed is `UNAVAILABLE` (with its wait), a
    /// missing key rejected with 400 is `INVALID_ARGUMENT`, with 401 `UNAUTHENTICATED`, with 403
    /// `PERMISSION_DENIED` (with a pushback of `-1`: the same call would meet the same answer).
    ///
    /// Behind tonic's own server (`tonic::transport::Server`, not axum's `serve`), the default
    /// key, [`PeerIp`](crate::key::PeerIp), finds none: tonic puts its `TcpConnectInfo` in the
    /// extensions, not axum's `ConnectInfo`, and every call would get the missing-key answer
    /// (`INVALID_ARGUMENT`). Key such a server on what its calls carry (an API key in the
    /// metadata, [`ApiKeyHeader`](crate::key::ApiKeyHeader)), or on the peer with a closure:
    /// `|req: &RequestHead<'_>| req.extensions().get::<TcpConnectInfo>()?.remote_addr().map(|a| a.ip())`.
    Grpc,
    /// A response built by a closure. Its status (if 4xx or 5xx; any other becomes 429) and
    /// headers are kept; `Retry-After` and the rate-limit fields are added where absent. A
    /// `Retry-After` of the closure's own is kept as it is, and `RateLimit`'s `t` still says the
    /// store's wait: draft-10 asks that a `Retry-After` not be earlier than `t` (and has clients
    /// follow `Retry-After`), so set one no shorter than [`Denial::retry_after_secs`] unless
    /// meant.
    Custom(CustomBody),
}

impl DenialBody {
    /// A body built by `f` for each denial.
    pub fn custom(f: impl Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync + 'static) -> Self {
        DenialBody::Custom(Arc::new(f))
    }
}

impl fmt::Debug for DenialBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenialBody::PlainText => f.write_str("PlainText"),
            DenialBody::ProblemJson => f.write_str("ProblemJson"),
            DenialBody::Grpc => f.write_str("Grpc"),
            DenialBody::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// How a request was answered, as counted in `ratelimit_decisions_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VerdictKind {
    /// The store allowed it.
    Allowed,
    /// The store denied it: 429 (a gRPC call under [`DenialBody::Grpc`]: `RESOURCE_EXHAUSTED`).
    Denied,
    /// The store could not answer; let through by [`FailurePolicy::FailOpen`](crate::FailurePolicy::FailOpen).
    FailedOpen,
    /// The store could not answer; 503 by [`FailurePolicy::FailClosed`](crate::FailurePolicy::FailClosed)
    /// (a gRPC call under [`DenialBody::Grpc`]: `UNAVAILABLE`).
    FailedClosed,
    /// The store could not answer; the local fallback allowed it.
    FallbackAllowed,
    /// The store could not answer; the local fallback denied it: 429.
    FallbackDenied,
    /// Dry run: it would have been denied, and went through.
    ShadowDenied,
    /// No key could be extracted; rejected by [`MissingKey::Reject`](crate::MissingKey::Reject)
    /// or [`MissingKey::Unauthorized`](crate::MissingKey::Unauthorized), or, under
    /// [`MissingKey::SharedKey`](crate::MissingKey::SharedKey), a key sent in a form the
    /// extractor cannot use (a 400).
    NoKey,
    /// The allow-list let it through unchecked.
    AllowListed,
}

impl VerdictKind {
    /// Every kind, in a fixed order.
    pub const ALL: [VerdictKind; 9] = [
        VerdictKind::Allowed,
        VerdictKind::Denied,
        VerdictKind::FailedOpen,
        VerdictKind::FailedClosed,
        VerdictKind::FallbackAllowed,
        VerdictKind::FallbackDenied,
        VerdictKind::ShadowDenied,
        VerdictKind::NoKey,
        VerdictKind::AllowListed,
    ];

    /// The `outcome` label: `allowed`, `denied`, `failed_open`, `failed_closed`,
    /// `fallback_allowed`, `fallback_denied`, `shadow_denied`, `no_key`, `allow_listed`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Allowed => "allowed",
            VerdictKind::Denied => "denied",
            VerdictKind::FailedOpen => "failed_open",
            VerdictKind::FailedClosed => "failed_closed",
            VerdictKind::FallbackAllowed => "fallback_allowed",
            VerdictKind::FallbackDenied => "fallback_denied",
            VerdictKind::ShadowDenied => "shadow_denied",
            VerdictKind::NoKey => "no_key",
            VerdictKind::AllowListed => "allow_listed",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl VerdictKind {
    /// Whether an outer layer's verdict of this kind goes on a response that has `inner` (an
    /// inner layer's): only over none, or over a plain admission when this one says more.
    pub(crate) fn outranks(self, inner: Option<&Verdict>) -> bool {
        let plain = |k| matches!(k, VerdictKind::Allowed | VerdictKind::AllowListed);
        inner.is_none_or(|inner| plain(inner.kind()) && !plain(self))
    }
}

/// The layer's answer to one request, put in the response extensions (unless the policy says
/// [`verdict(false)`](crate::Policy::verdict): then there is none).
///
/// Under nested layers (a route layer inside a router-wide one) the response keeps the verdict of
/// the innermost layer that gave one, the layer that decided it, as it keeps that layer's header
/// fields: an outer layer puts its own only on a response without one, or over an inner
/// `Allowed` or `AllowListed` when its own says more (`ShadowDenied`, `FailedOpen`,
/// `FallbackAllowed`).
///
/// ```
/// # use tower_ratelimit::{Verdict, VerdictKind};
/// # fn f(response: &http::Response<()>) {
/// if let Some(v) = response.extensions().get::<Verdict>() {
///     assert_eq!(v.policy(), "api");
///     let _ = v.kind() == VerdictKind::Denied;
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct Verdict {
    /// The layer's policy, for its name: the request's own handle moved here, so that a request
    /// touches the shared reference count once, not twice.
    rt: Arc<Rt>,
    kind: VerdictKind,
    decision: Option<Decision>,
    /// The request's tier, an index of `Rt::tiers`.
    tier: usize,
}

impl PartialEq for Verdict {
    fn eq(&self, other: &Self) -> bool {
        self.policy() == other.policy()
            && self.tier() == other.tier()
            && self.kind == other.kind
            && self.decision == other.decision
    }
}

impl Eq for Verdict {}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("policy", &self.policy())
            .field("tier", &self.tier())
            .field("kind", &self.kind)
            .field("decision", &self.decision)
            .finish()
    }
}

impl Verdict {
    pub(crate) fn new(
        rt: Arc<Rt>,
        kind: VerdictKind,
        decision: Option<Decision>,
        tier: usize,
    ) -> Self {
        Verdict {
            rt,
            kind,
            decision,
            tier,
        }
    }

    /// The policy's name.
    #[must_use]
    pub fn policy(&self) -> &str {
        &self.rt.name
    }

    /// The name of the request's tier (see [`Policy::tier`](crate::Policy::tier)); `None` for
    /// the policy's own limit, which also applies to an allow-listed request (let through before
    /// the resolver runs) and to a keyless one counted under the shared key. The same as the
    /// `tier` label of the decision's metric (see [`metrics`](crate::metrics)).
    #[must_use]
    pub fn tier(&self) -> Option<&str> {
        self.rt.tiers[self.tier].name.as_deref()
    }

    /// How the request was answered.
    #[must_use]
    pub fn kind(&self) -> VerdictKind {
        self.kind
    }

    /// The store's (or the fallback's) decision, if one was made.
    #[must_use]
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }
}

/// A quota as `q` units per `w` whole seconds, the form of `RateLimit-Policy`: `w` is the period
/// rounded up to a whole second, and `q` the units the quota grants in `w` at its rate, rounded
/// down (the quota's limit when its period is whole seconds). `100 per 100 ms` is `q=1000;w=1`,
/// not `q=100;w=1`, which would tell clients a tenth of the rate; a period that is not whole
/// seconds never advertises more than the quota grants.
fn in_whole_seconds(q: &ratelimit_core::Quota) -> (u64, u64) {
    let window = secs_ceil(q.period()).max(1);
    let period_us = u128::from(q.period_micros().max(1));
    let units = u128::from(q.limit())
        .checked_mul(u128::from(window) * 1_000_000)
        .map_or(u64::MAX, |n| {
            u64::try_from(n / period_us).unwrap_or(u64::MAX)
        });
    (units, window)
}

/// Whole seconds in `d`, rounded up.
#[must_use]
pub(crate) fn secs_ceil(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The largest integer a structured field may carry (RFC 9651: at most 15 digits). Quotas go up
/// to 2^52, so the IETF fields clamp their numbers to it.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// `Retry-After` seconds: rounded up, at least 1.
#[must_use]
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    secs_ceil(d).max(1)
}

/// The legacy `X-RateLimit-Reset`: seconds until the client may send again when denied, until the
/// quota is full when allowed.
fn reset_secs(d: &Decision) -> u64 {
    match d.retry_after() {
        Some(wait) => retry_after_secs(wait),
        None => secs_ceil(d.reset_after()),
    }
}

/// `units` × `period` / `limit` in 128 bits (µs, saturating at `u64::MAX`): out of line, as
/// only quotas of very long periods or very large limits need it.
#[cold]
#[inline(never)]
fn units_time_wide(units: u64, period: u64, limit: u64) -> u64 {
    let n = u128::from(units) * u128::from(period) / u128::from(limit.max(1));
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Appends the decimal digits of `n`.
fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The decimal digits of 0 to 999, each written once: `0123456789101112...999`.
const DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3;

const fn digits() -> [u8; DIGITS_LEN] {
    let mut out = [0u8; DIGITS_LEN];
    let mut n = 0;
    let mut i = 0;
    while n < 1000 {
        if n >= 100 {
            out[i] = b'0' + (n / 100) as u8;
            i += 1;
        }
        if n >= 10 {
            out[i] = b'0' + (n / 10 % 10) as u8;
            i += 1;
        }
        out[i] = b'0' + (n % 10) as u8;
        i += 1;
        n += 1;
    }
    out
}

const DIGIT_BYTES: [u8; DIGITS_LEN] = digits();
static DIGITS: &str = match std::str::from_utf8(&DIGIT_BYTES) {
    Ok(s) => s,
    Err(_) => panic!("digits are ASCII"),
};

/// `n` as a header value. Values below 1,000 (most `Retry-After`s) are slices of a static
/// string: no allocation.
fn number(n: u64) -> HeaderValue {
    let (start, len) = match n {
        0..=9 => (n as usize, 1),
        10..=99 => (10 + (n as usize - 10) * 2, 2),
        100..=999 => (190 + (n as usize - 100) * 3, 3),
        _ => return HeaderValue::from(n),
    };
    HeaderValue::from_static(&DIGITS[start..start + len])
}

fn push_sf_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for b in s.bytes() {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// The name of quota `i` of a limit of `quotas` quotas, in the IETF fields of the policy `policy`:
/// the policy's name for a limit of one quota, `<policy>.<i>` for each of several. An app that
/// checks its policies' names against one another (two layers a request passes through must not
/// share an item name) names them with this.
#[must_use]
pub fn item_name(policy: &str, i: usize, quotas: usize) -> String {
    if quotas == 1 {
        policy.to_owned()
    } else {
        format!("{policy}.{i}")
    }
}

/// Header values computed once per (policy, limit).
#[derive(Debug)]
pub(crate) struct Prepared {
    policy_value: HeaderValue,
    /// `"name";r=` for each quota.
    items: Box<[Box<[u8]>]>,
    /// For each quota of a bucket algorithm (token bucket, GCRA), its period (µs) and limit: one
    /// unit comes back every period / limit, and `t` says when the next does. `None` for the
    /// window algorithms.
    refills: Box<[Option<(u64, u64)>]>,
    /// The `application/problem+json` body of a denial by each set of quotas, at the set's bits
    /// less one: its `violated-policies` names the quotas' items, as `RateLimit-Policy` and
    /// `RateLimit` do. Made in advance, for the 2ⁿ − 1 sets of a limit of n quotas (at most 255,
    /// a few kilobytes: a limit has at most 8), so that a 429 only clones one.
    problems: Box<[Bytes]>,
}

impl Prepared {
    pub(crate) fn new(name: &str, limit: &Limit) -> Prepared {
        let quotas = limit.quotas();
        let item_name = |i: usize| item_name(name, i, quotas.len());
        let refills = quotas
            .iter()
            .map(|q| {
                matches!(limit.algorithm(), Algorithm::TokenBucket | Algorithm::Gcra)
                    .then(|| (q.period_micros(), q.limit()))
            })
            .collect();
        let mut policy = Vec::new();
        let mut items = Vec::with_capacity(quotas.len());
        let mut names = Vec::with_capacity(quotas.len());
        for (i, q) in quotas.iter().enumerate() {
            let n = item_name(i);
            if i > 0 {
                policy.extend_from_slice(b", ");
            }
            push_sf_string(&mut policy, &n);
            let (units, window) = in_whole_seconds(q);
            policy.extend_from_slice(b";q=");
            push_u64(&mut policy, units.min(SF_INTEGER_MAX));
            policy.extend_from_slice(b";w=");
            push_u64(&mut policy, window.min(SF_INTEGER_MAX));
            let mut item = Vec::new();
            push_sf_string(&mut item, &n);
            item.extend_from_slice(b";r=");
            items.push(item.into_boxed_slice());
            names.push(n);
        }
        // The sets of quotas a decision names (`QuotaSet` bits), below 2^n.
        let problems = (1..1u16 << names.len().min(8))
            .map(|bits| {
                let set = QuotaSet::from_bits(bits as u8);
                problem_body(set.iter().map(|i| names[i].as_str()))
            })
            .collect();
        // Names are printable ASCII (checked by `Policy::new`), so the value is always valid.
        let policy_value = HeaderValue::from_maybe_shared(Bytes::from(policy))
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        Prepared {
            policy_value,
            items: items.into_boxed_slice(),
            refills,
            problems,
        }
    }

    /// The `t` of `RateLimit` (draft-10: seconds until more of the quota is available): when
    /// denied, the wait `Retry-After` says; when allowed or for a cost that can never pass, the
    /// time the store gave for it (`Decision::more_after`: the sliding window and log), else for
    /// a bucket algorithm the time until its next whole unit comes back (none while it is full)
    /// and for a fixed window its end; for a sliding algorithm's answer that does not give it (a
    /// leased one), the time until the quota is full, which bounds it.
    fn more_in_secs(&self, d: &Decision) -> u64 {
        if let Some(wait) = d.retry_after() {
            return retry_after_secs(wait);
        }
        if let Some(more) = d.more_after() {
            return secs_ceil(more);
        }
        let full_in = d.reset_after();
        let refill = self.refills.get(d.quota_index()).copied().flatten();
        match refill {
            // Full in `full_in`, a unit every period / limit: the units after the next take
            // (burst - remaining - 1) of those, and the next one comes before them.
            Some((period, limit)) if d.remaining() < d.limit() && !full_in.is_zero() => {
                let full_in = u64::try_from(full_in.as_micros()).unwrap_or(u64::MAX);
                let units = d.limit() - d.remaining() - 1;
                // Rounded down, so that the difference is never before the unit: the time to
                // full is rounded up to the microsecond, and whether the unit's own time rounds
                // the same way is not in the decision (its level is not); so when a unit takes
                // a fractional number of microseconds, one due exactly on a whole second reads
                // a second more. In 64 bits when the product fits (over a day's period, a burst
                // of up to about 2^27), which spares the allowed path a 128-bit division.
                let after = match units.checked_mul(period) {
                    Some(n) => n / limit.max(1),
                    None => units_time_wide(units, period, limit),
                };
                full_in.saturating_sub(after).max(1).div_ceil(1_000_000)
            }
            _ => secs_ceil(full_in),
        }
    }

    /// The problem body of `d`'s denial, naming the quotas that denied.
    fn problem(&self, d: &Decision) -> Bytes {
        // A decision not of this limit (a custom store's) may name no quota of it: the first.
        let bits = usize::from(d.violated_quotas().bits());
        self.problems
            .get(bits.wrapping_sub(1))
            .or_else(|| self.problems.first())
            .cloned()
            .unwrap_or_default()
    }

    /// `"name";r=…;t=…`, without `t` when `reset` is 0: nothing more is coming (a full quota),
    /// and `t` (optional in draft-10) would say "more now" (its example of a quota with no reset
    /// leaves it out).
    fn rate_limit_value(&self, d: &Decision, reset: u64) -> HeaderValue {
        let item = self
            .items
            .get(d.quota_index())
            .or_else(|| self.items.first())
            .map_or(&[][..], |b| &b[..]);
        let mut r = itoa::Buffer::new();
        let r = r.format(d.remaining().min(SF_INTEGER_MAX)).as_bytes();
        let mut t = itoa::Buffer::new();
        let t = (reset > 0).then(|| t.format(reset.min(SF_INTEGER_MAX)).as_bytes());
        // Built at its exact length, so that `Bytes` takes the vector as it is (a copy through a
        // stack buffer measured 46 instructions more).
        let mut v = Vec::with_capacity(item.len() + r.len() + t.map_or(0, |t| 3 + t.len()));
        v.extend_from_slice(item);
        v.extend_from_slice(r);
        if let Some(t) = t {
            v.extend_from_slice(b";t=");
            v.extend_from_slice(t);
        }
        // Only printable ASCII is ever written (names are checked by `Policy::new`).
        HeaderValue::from_maybe_shared(Bytes::from(v))
            .unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// Adds the rate-limit fields of `mode` for `d`. The IETF fields are lists: if the inner
    /// service set them (another rate-limit layer inside this one, an upstream's own limit), this
    /// policy's items are added as field lines of their own, which a reader joins into one list
    /// (RFC 9651, 3.1), and the inner lines are left as they are; unless an item of this
    /// policy's name is there already. The legacy fields hold one value each: added only if none
    /// of the three is set.
    #[inline]
    pub(crate) fn write(&self, headers: &mut HeaderMap, mode: Headers, d: &Decision) {
        self.write_reset(headers, mode, d, None);
    }

    /// [`write`](Self::write), with `wait` (if any) as the seconds of `t` and
    /// `X-RateLimit-Reset`.
    #[inline]
    fn write_reset(&self, headers: &mut HeaderMap, mode: Headers, d: &Decision, wait: Option<u64>) {
        if mode.ietf {
            let reset = wait.unwrap_or_else(|| self.more_in_secs(d));
            match headers.entry(names::RATELIMIT_POLICY) {
                Entry::Vacant(v) => {
                    v.insert(self.policy_value.clone());
                    match headers.entry(names::RATELIMIT) {
                        Entry::Vacant(v) => {
                            v.insert(self.rate_limit_value(d, reset));
                        }
                        // A `RateLimit` of the inner service's without its policy: ours is one
                        // more item of it, unless it names this policy already (then none).
                        Entry::Occupied(mut o) => {
                            if o.iter().any(|v| self.names_an_item(v)) {
                                headers.remove(names::RATELIMIT_POLICY);
                            } else {
                                o.append(self.rate_limit_value(d, reset));
                            }
                        }
                    }
                }
                Entry::Occupied(_) => self.add_ietf_items(headers, d, reset),
            }
        }
        if mode.legacy
            && !headers.contains_key(names::X_RATELIMIT_LIMIT)
            && !headers.contains_key(names::X_RATELIMIT_REMAINING)
            && !headers.contains_key(names::X_RATELIMIT_RESET)
        {
            headers.insert(names::X_RATELIMIT_LIMIT, number(d.limit()));
            headers.insert(names::X_RATELIMIT_REMAINING, number(d.remaining()));
            headers.insert(
                names::X_RATELIMIT_RESET,
                number(wait.unwrap_or_else(|| reset_secs(d))),
            );
        }
    }

    /// Whether a field line of the inner service's names an item as this policy does: an item
    /// of the list (not text within a string: `"a\"up";` names `a"up`, not `up`) that is one
    /// of this policy's item names, with parameters or without, as a String (`"api"`, as this
    /// layer writes it) or as a Token (`api`, which the draft's revisions after -10 take too).
    #[cold]
    fn names_an_item(&self, value: &HeaderValue) -> bool {
        let value = value.as_bytes();
        // The name as a whole, followed by its parameters, the next item, or the end.
        let names = |start: usize, name: &[u8]| {
            value[start..].strip_prefix(name).is_some_and(|after| {
                matches!(after.first(), None | Some(b';' | b',' | b' ' | b'\t'))
            })
        };
        item_starts(value).any(|start| {
            self.items.iter().any(|item| {
                // `"name";r=` up to the closing quote, and the name inside the quotes.
                let quoted = &item[..item.len() - 3];
                let bare = &quoted[1..quoted.len() - 1];
                names(start, quoted) || (is_token(bare) && names(start, bare))
            })
        })
    }

    /// The IETF fields when the inner service set `RateLimit-Policy`: this policy's items as
    /// lines of their own beside the inner ones, unless one of its items' names is in them (the
    /// same policy twice, or a name the inner service uses: a client could not tell the items
    /// apart). Out of line: only stacked layers, or a service with limits of its own, get here.
    #[inline(never)]
    fn add_ietf_items(&self, headers: &mut HeaderMap, d: &Decision, reset: u64) {
        let named = |value: &HeaderValue| self.names_an_item(value);
        if headers.get_all(names::RATELIMIT_POLICY).iter().any(named)
            || headers.get_all(names::RATELIMIT).iter().any(named)
        {
            return;
        }
        // Through `entry`, as `write` looks the fields up: `HeaderMap::append` here made a 429
        // 28 instructions longer (the map's hashing stopped being inlined into its inserts).
        for (name, value) in [
            (names::RATELIMIT_POLICY, self.policy_value.clone()),
            (names::RATELIMIT, self.rate_limit_value(d, reset)),
        ] {
            match headers.entry(name) {
                Entry::Occupied(mut o) => o.append(value),
                Entry::Vacant(v) => {
                    v.insert(value);
                }
            }
        }
    }
}

/// Whether `s` is a structured-field Token (RFC 9651, 3.3.4): a letter or `*`, then token
/// characters (RFC 9110's `tchar`), `:` or `/`. A name with a `"` or `\`, escaped in its String
/// form, is none.
fn is_token(s: &[u8]) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b);
    matches!(s.first(), Some(b) if b.is_ascii_alphabetic() || *b == b'*')
        && s.iter().all(|&b| tchar(b))
}

/// Where the items of a structured-field list (RFC 9651) start in `value`: at its start and after
/// each comma outside a string, past the whitespace. A string (`"…"`) escapes with `\\`; a display
/// string (`%"…"`) does not (a byte is written `%xx` there, and a `\\` is itself). Tolerant: a
/// malformed value (an unclosed string) only has fewer starts.
fn item_starts(value: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut in_string = false;
    let mut display = false;
    let mut escaped = false;
    let mut at_start = true;
    let mut prev = 0u8;
    value.iter().enumerate().filter_map(move |(i, &b)| {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' if !display => escaped = true,
                // `prev` is still the opening quote.
                b'"' => in_string = false,
                _ => {}
            }
            return None;
        }
        let start = at_start && b != b' ' && b != b'\t';
        if start {
            at_start = false;
        }
        match b {
            b'"' => {
                in_string = true;
                display = prev == b'%';
            }
            b',' => at_start = true,
            _ => {}
        }
        prev = b;
        start.then_some(i)
    })
}

/// How a policy's 429s get their bodies (the problem bodies are computed once per quota, in
/// [`Prepared`]), and its own error answers theirs.
#[derive(Debug)]
pub(crate) struct Bodies {
    kind: DenialBody,
    /// The layer's own error answers, by [`Own`], made once: a fail-closed route answers every
    /// request with one while the store is down.
    own: [OwnAnswer; 2],
}

/// One of the layer's own error answers (see [`Bodies::error`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Own {
    /// No key in the request, under `MissingKey::Reject` or `MissingKey::Unauthorized`.
    NoKey = 0,
    /// The store cannot decide, under `FailurePolicy::FailClosed`.
    FailClosed = 1,
}

/// An error answer of the layer's own, in each form it can take.
#[derive(Debug)]
struct OwnAnswer {
    status: StatusCode,
    /// The plain-text body.
    text: Bytes,
    /// Under [`DenialBody::ProblemJson`], the `about:blank` problem (else empty).
    problem: Bytes,
    /// The text as gRPC's `grpc-message`.
    grpc_message: HeaderValue,
}

impl OwnAnswer {
    fn new(kind: &DenialBody, status: StatusCode, text: String) -> OwnAnswer {
        let problem = match kind {
            DenialBody::ProblemJson => about_blank(status, &text),
            _ => Bytes::new(),
        };
        OwnAnswer {
            status,
            grpc_message: grpc_message(text.trim_end()),
            text: Bytes::from(text),
            problem,
        }
    }
}

/// `text` as a `grpc-message` value: percent-encoded UTF-8, as gRPC asks (every byte outside
/// printable ASCII, and `%`).
fn grpc_message(text: &str) -> HeaderValue {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    // Printable ASCII only: always a valid header value.
    HeaderValue::try_from(out).unwrap_or(HeaderValue::from_static(""))
}

/// `s` as a JSON string, quotes included.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The draft's quota-exceeded problem, naming the quota-policy items `items` (as in
/// `RateLimit-Policy`) in `violated-policies`.
fn problem_body<'a>(items: impl IntoIterator<Item = &'a str>) -> Bytes {
    let mut json = Vec::new();
    json.extend_from_slice(b"{\"type\":\"");
    json.extend_from_slice(QUOTA_EXCEEDED_TYPE.as_bytes());
    json.extend_from_slice(
        b"\",\"title\":\"Too Many Requests: a rate-limit quota is exhausted\",\"status\":429,\"violated-policies\":[",
    );
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        // A policy name is printable ASCII: escaping `"` and `\` makes it a JSON string.
        push_sf_string(&mut json, item);
    }
    json.extend_from_slice(b"]}");
    Bytes::from(json)
}

/// A problem of no more specific type (RFC 9457's `about:blank`), so that an API that answers
/// problem+json does so for the layer's error answers too: titled with the status's phrase, as
/// that type asks, the text's own words in `detail`.
fn about_blank(status: StatusCode, text: &str) -> Bytes {
    let title = status.canonical_reason().unwrap_or("Error");
    let text = text.trim_end();
    let detail = text
        .strip_prefix(title)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(text);
    // The title is a status phrase (plain words); the detail may name a header.
    let mut json = format!(
        "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{},\"detail\":",
        status.as_u16()
    );
    push_json_string(&mut json, detail);
    json.push('}');
    Bytes::from(json)
}

const PLAIN_429: &str = "Too Many Requests\n";
/// Why a request that can never pass was denied (its cost is above what the limit holds): one
/// sentence, in each form a denial takes.
macro_rules! never_detail {
    () => {
        "this request costs more than the limit can ever admit at once"
    };
}
const NEVER_DETAIL: &str = never_detail!();
const PLAIN_NEVER: &str = concat!("Too Many Requests: ", never_detail!(), "\n");
const GRPC_NEVER: HeaderValue =
    HeaderValue::from_static(concat!("Too Many Requests: ", never_detail!()));
const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");

impl Bodies {
    /// Bodies of `kind`, with the (status, text) of the layer's own error answers: `no_key`
    /// ([`Own::NoKey`]) and `fail_closed` ([`Own::FailClosed`]).
    pub(crate) fn new(
        kind: DenialBody,
        no_key: (StatusCode, String),
        fail_closed: (StatusCode, String),
    ) -> Bodies {
        let own = [no_key, fail_closed].map(|(status, text)| OwnAnswer::new(&kind, status, text));
        Bodies { kind, own }
    }

    /// The 429 for `d`, with `Retry-After` and the fields of `mode`; under [`DenialBody::Grpc`],
    /// with the gRPC status that [`for_request`](Self::for_request) gives a gRPC call instead.
    /// `until_store`: the wait to say for a cost that the fallback's local share (`d`) can never
    /// admit but the store can (see [`Denial::retry_after_secs`]).
    pub(crate) fn denied(
        &self,
        name: &str,
        tier: Option<&str>,
        prepared: &Prepared,
        mode: Headers,
        d: &Decision,
        until_store: Option<Duration>,
    ) -> Response<Bytes> {
        let retry_after = d.retry_after().or(until_store);
        // No wait would help: the body says why, since no `Retry-After` does (and the fields
        // say the quota is whole).
        let never = retry_after.is_none() && !d.can_ever_pass();
        let mut res = match &self.kind {
            DenialBody::PlainText | DenialBody::Grpc => {
                let text = if never { PLAIN_NEVER } else { PLAIN_429 };
                let mut r = Response::new(Bytes::from_static(text.as_bytes()));
                r.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
                r
            }
            DenialBody::ProblemJson => {
                let mut problem = prepared.problem(d);
                if never && problem.ends_with(b"}") {
                    let mut with = problem[..problem.len() - 1].to_vec();
                    with.extend_from_slice(b",\"detail\":\"");
                    with.extend_from_slice(NEVER_DETAIL.as_bytes());
                    with.extend_from_slice(b"\"}");
                    problem = Bytes::from(with);
                }
                let mut r = Response::new(problem);
                r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
                r
            }
            DenialBody::Custom(f) => {
                let denial = Denial {
                    policy: name,
                    tier,
                    decision: d,
                    until_store,
                };
                let mut r = f(&denial);
                if !(r.status().is_client_error() || r.status().is_server_error()) {
                    // A denial is an error: a 2xx would tell clients the request was served, a
                    // 304 to use their cached copy, a 3xx to go elsewhere, and a 1xx is not a
                    // final answer.
                    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                }
                r
            }
        };
        if !matches!(self.kind, DenialBody::Custom(_)) {
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        }
        if matches!(self.kind, DenialBody::Grpc) {
            // A cost that can never pass is never worth a retry (one above the fallback's share
            // only, which the store can admit, has its wait in `until_store`).
            let pushback = match retry_after {
                Some(wait) => Pushback::After(wait),
                None => Pushback::Never,
            };
            res.extensions_mut().insert(GrpcForm {
                message: if never {
                    GRPC_NEVER
                } else {
                    HeaderValue::from_static("Too Many Requests")
                },
                pushback,
            });
        }
        let headers = res.headers_mut();
        let wait_secs = retry_after.map(retry_after_secs);
        if let Some(secs) = wait_secs
            && !headers.contains_key(RETRY_AFTER)
        {
            headers.insert(RETRY_AFTER, number(secs));
        }
        if mode.any() {
            // `t` says the wait `Retry-After` says, the store's own included: a cost above the
            // fallback's share waits for the store, not for the local bucket (whole already).
            prepared.write_reset(headers, mode, d, wait_secs);
        }
        res
    }
}

impl Bodies {
    /// An error answer of the layer's own (missing key, fail closed): plain text with its
    /// status, or, under [`DenialBody::Grpc`], the gRPC status that stands for it.
    ///
    /// Under [`DenialBody::ProblemJson`], an `application/problem+json` body of type
    /// `about:blank`, titled with the status's phrase, with the text (less that phrase, if it
    /// starts with it) as its detail.
    pub(crate) fn error(&self, which: Own, retry_after: Option<Duration>) -> Response<Bytes> {
        let own = &self.own[which as usize];
        let mut res = plain(
            own.status,
            own.text.clone(),
            retry_after.map(retry_after_secs),
        );
        if matches!(self.kind, DenialBody::ProblemJson) {
            *res.body_mut() = own.problem.clone();
            res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        }
        if matches!(self.kind, DenialBody::Grpc) {
            res.extensions_mut().insert(GrpcForm {
                message: own.grpc_message.clone(),
                // Without a wait (a missing key), a retry would meet the same answer.
                pushback: retry_after.map_or(Pushback::Never, Pushback::After),
            });
        }
        res
    }

    /// `res`, an answer of the layer's own, for `req`: under [`DenialBody::Grpc`], for a gRPC
    /// call (a `POST` of gRPC's `content-type`), the gRPC status that stands for it. Made here,
    /// once the answer is known, so that the request's `content-type` is read on that path only.
    pub(crate) fn for_request(
        &self,
        mut res: Response<Bytes>,
        req: &crate::RequestHead<'_>,
    ) -> Response<Bytes> {
        if !matches!(self.kind, DenialBody::Grpc) {
            return res;
        }
        let Some(form) = res.extensions_mut().remove::<GrpcForm>() else {
            return res;
        };
        let Some(content_type) = req
            .headers()
            .get(CONTENT_TYPE)
            .filter(|v| *req.method() == http::Method::POST && is_grpc(v))
        else {
            return res;
        };
        let code = grpc_code(res.status());
        *res.status_mut() = StatusCode::OK;
        *res.body_mut() = Bytes::new();
        let headers = res.headers_mut();
        // The call's own (`application/grpc+proto`, `application/grpc-web`...).
        headers.insert(CONTENT_TYPE, content_type.clone());
        headers.remove(CONTENT_LENGTH);
        headers.insert(GRPC_STATUS, HeaderValue::from_static(code));
        headers.insert(GRPC_MESSAGE, form.message);
        // A wait in whole milliseconds if a pushback can say it; else `-1`, as for never.
        let ms = match form.pushback {
            Pushback::After(wait) => i32::try_from(wait.as_micros().div_ceil(1_000).max(1)).ok(),
            Pushback::Never => None,
        };
        let value = ms.map_or(HeaderValue::from_static("-1"), |ms| {
            number(ms.unsigned_abs().into())
        });
        headers.insert(GRPC_RETRY_PUSHBACK_MS, value);
        res
    }
}

/// How an answer of the layer's own is said to a gRPC call (see [`Bodies::for_request`]).
#[derive(Clone)]
struct GrpcForm {
    /// `grpc-message`, percent-encoded already.
    message: HeaderValue,
    pushback: Pushback,
}

/// Whether a request is a gRPC call (`content-type: application/grpc`, `application/grpc+proto`,
/// `application/grpc-web`, `application/grpc-web-text+proto`, with parameters or not): only those
/// are answered with a gRPC status. Another type that starts the same (`application/grpcx`) is
/// not one: its client would read the gRPC form's HTTP 200 as a success.
fn is_grpc(content_type: &HeaderValue) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(rest) = strip_prefix_ignore_case(content_type.as_bytes(), GRPC) else {
        return false;
    };
    let rest = match strip_prefix_ignore_case(rest, b"-web") {
        Some(web) => strip_prefix_ignore_case(web, b"-text").unwrap_or(web),
        None => rest,
    };
    matches!(rest.first(), None | Some(b'+' | b';' | b' ' | b'\t'))
}

/// `value` less `prefix`, if it starts with it in any case.
fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (start, rest) = value.split_at_checked(prefix.len())?;
    start.eq_ignore_ascii_case(prefix).then_some(rest)
}

/// What `grpc-retry-pushback-ms` tells a client's retry policy. A wait beyond what grpc-java
/// parses (2^31 − 1 ms, about 24.8 days) is `-1`, as a cost that can never pass: no retry within
/// a call could outlast it. (Left out, as it was before, the client's retry policy would retry
/// at once with its own backoff, each attempt denied again.)
#[derive(Clone, Copy)]
enum Pushback {
    /// Retry after this wait (rounded up to whole milliseconds, as `Retry-After` is to seconds).
    After(Duration),
    /// Do not retry (`-1`): the same request would meet the same answer.
    Never,
}

/// The gRPC status code for an HTTP status: the inverse of `google.rpc.Code`'s HTTP mapping
/// (`INVALID_ARGUMENT` 400, `UNAUTHENTICATED` 401, `PERMISSION_DENIED` 403, `NOT_FOUND` 404,
/// `ABORTED` 409, `RESOURCE_EXHAUSTED` 429, `CANCELLED` 499, `INTERNAL` 500, `UNIMPLEMENTED` 501,
/// `UNAVAILABLE` 503, `DEADLINE_EXCEEDED` 504); `UNKNOWN` for any other.
fn grpc_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "3",
        401 => "16",
        403 => "7",
        404 => "5",
        409 => "10",
        429 => "8",
        499 => "1",
        500 => "13",
        501 => "12",
        503 => "14",
        504 => "4",
        _ => "2",
    }
}

/// A plain-text error response (missing key, fail closed).
pub(crate) fn plain(status: StatusCode, text: Bytes, retry_after: Option<u64>) -> Response<Bytes> {
    let mut r = Response::new(text);
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
    if let Some(secs) = retry_after {
        r.headers_mut().insert(RETRY_AFTER, number(secs.max(1)));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{Algorithm, Outcome, Quota};

    /// A display string (`%"…"`) does not escape with `\\`: one ending in a backslash ends at its
    /// quote, and the items after it are found (the layer adds no second item of a name the inner
    /// service wrote after one). In a string, `\\"` is still an escaped quote.
    #[test]
    fn items_after_a_display_string_ending_in_a_backslash_are_found() {
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
        let p = Prepared::new("api", &limit);
        let after_display = HeaderValue::from_static("\"inner\";x=%\"a\\\", \"api\";r=1;t=2");
        assert!(p.names_an_item(&after_display));
        let in_a_string = HeaderValue::from_static("\"inner\";x=\"a\\\", \\\"api\";r=1;t=2\"");
        assert!(!p.names_an_item(&in_a_string));

        let mut h = HeaderMap::new();
        h.insert(RATELIMIT.clone(), after_display.clone());
        let d = Decision::new(Outcome::Allowed, 10, 9, Duration::from_secs(6), 0);
        p.write(&mut h, Headers::ietf(), &d);
        assert_eq!(
            h.get_all(RATELIMIT.clone()).iter().collect::<Vec<_>>(),
            [&after_display]
        );
    }

    /// The problem bodies of the layer's own error answers are made once: each answer shares
    /// them (a fail-closed route answers every request so while the store is down). Both answers
    /// may have one status (a missing key answered with 503) and still keep their own texts.
    #[test]
    fn error_problems_are_made_once() {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        let bodies = Bodies::new(
            DenialBody::ProblemJson,
            (status, "Service Unavailable: no key here\n".to_owned()),
            (
                status,
                "Service Unavailable: the store is away\n".to_owned(),
            ),
        );
        let a = bodies.error(Own::FailClosed, None);
        let b = bodies.error(Own::FailClosed, None);
        assert_eq!(a.body().as_ptr(), b.body().as_ptr(), "one body, shared");
        assert_eq!(
            &a.body()[..],
            b"{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
              \"detail\":\"the store is away\"}"
        );
        let no_key = bodies.error(Own::NoKey, None);
        assert_eq!(no_key.status(), status);
        assert_eq!(
            &no_key.body()[..],
            b"{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
              \"detail\":\"no key here\"}"
        );
    }

    /// A text with quotes, backslashes, control characters and non-ASCII (a key extractor's
    /// hint is anyone's text) stays valid JSON in a problem and a valid `grpc-message`.
    #[test]
    fn error_texts_are_escaped_for_json_and_grpc() {
        let text = "Bad Request: send \"x\\y\"\tor caf\u{e9} 100%\n";
        let status = StatusCode::BAD_REQUEST;
        let json = Bodies::new(
            DenialBody::ProblemJson,
            (status, text.to_owned()),
            (status, String::new()),
        );
        assert_eq!(
            std::str::from_utf8(json.error(Own::NoKey, None).body()).unwrap(),
            "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\
             \"detail\":\"send \\\"x\\\\y\\\"\\u0009or caf\u{e9} 100%\"}"
        );
        let plain = Bodies::new(
            DenialBody::PlainText,
            (status, text.to_owned()),
            (status, String::new()),
        );
        let res = plain.error(Own::NoKey, None);
        assert_eq!(&res.body()[..], text.as_bytes(), "plain text as it is");
        assert_eq!(
            grpc_message(text.trim_end()),
            "Bad Request: send \"x\\y\"%09or caf%C3%A9 100%25"
        );
    }

    /// gRPC's content types, with and without a subtype or parameters, in any case; not a type
    /// that only starts the same.
    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc; charset=utf-8",
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
        ] {
            assert!(is_grpc(&HeaderValue::from_static(grpc)), "{grpc}");
        }
        for other in [
            "application/grpcx",
            "application/grpc-webx",
            "application/grpc-text",
            "application/grpc_web",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(&HeaderValue::from_static(other)), "{other}");
        }
    }

    /// An inner service's item names this policy only as an item of the list, not as text
    /// inside another item's string or parameter.
    #[test]
    fn an_item_is_named_only_as_an_item_of_the_list() {
        let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
        let p = Prepared::new("up", &limit);
        let names = |v: &'static str| p.names_an_item(&HeaderValue::from_static(v));
        assert!(names("\"up\";r=1;t=2"));
        assert!(names("\"inner\";r=1;t=2, \"up\";r=3;t=4"));
        assert!(names("\"inner\";r=1;t=2,\t\"up\";q=3;w=4"));
        // An item without parameters (the draft requires some, but a list item may have none):
        // still this policy's name.
        assert!(names("\"up\""));
        assert!(names("\"up\", \"inner\";r=1"));
        assert!(names("\"up\"\t,\"inner\";r=1"));
        assert!(names("\"inner\";r=1, \"up\""));
        assert!(
            !names("\"a\\\"up\";r=1;t=2"),
            "inside a string, after an escaped quote"
        );
        assert!(
            !names("\"inner\";x=\", \\\"up\";r=1;t=2"),
            "inside a parameter's string"
        );
        assert!(!names("\"upstream\";r=1;t=2"));
        assert!(!names("\"upstream\""));
        assert!(!names("\"inner\";r=1;t=2"));
    }

    #[test]
    fn numbers_fit_a_structured_field_integer_and_never_overflow() {
        let huge = Quota::per_period(1 << 52, Duration::from_micros(1 << 20)).unwrap();
        let limit = Limit::single(Algorithm::FixedWindow, huge).unwrap();
        let p = Prepared::new("x", &limit);
        assert_eq!(p.policy_value, "\"x\";q=999999999999999;w=2");
        let d = Decision::new(Outcome::Allowed, 1 << 52, 1 << 52, Duration::ZERO, 0);
        assert_eq!(
            p.rate_limit_value(&d, p.more_in_secs(&d)),
            "\"x\";r=999999999999999"
        );
        assert_eq!(secs_ceil(Duration::MAX), u64::MAX);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);

        // A bucket whose units times its period (µs) pass 64 bits: `t` in 128 bits. A million a
        // year (a unit every 31.536 s), all spent: the next back in 32 s, not in a year; a
        // million in ten years, 316 s.
        let year = Duration::from_secs(365 * 86_400);
        for (algorithm, years, next) in
            [(Algorithm::TokenBucket, 1, 32), (Algorithm::Gcra, 10, 316)]
        {
            let quota = Quota::per_period(1_000_000, year * years).unwrap();
            let p = Prepared::new("b", &Limit::single(algorithm, quota).unwrap());
            let d = Decision::new(Outcome::Allowed, 1_000_000, 0, year * years, 0);
            assert_eq!(p.more_in_secs(&d), next);
            // Half spent: the next one as soon.
            let d = Decision::new(Outcome::Allowed, 1_000_000, 500_000, year * years / 2, 0);
            assert_eq!(p.more_in_secs(&d), next);
        }
    }

    /// Every set of quotas has its body, made in advance; a decision naming no quota of the
    /// limit gets the first quota's.
    #[test]
    fn each_set_of_violated_quotas_has_its_problem_body() {
        let quotas = (1..=8).map(|n| Quota::per_second(n).unwrap());
        let limit = Limit::new(Algorithm::TokenBucket, quotas).unwrap();
        let p = Prepared::new("x", &limit);
        assert_eq!(p.problems.len(), 255);
        let wait = Outcome::Denied {
            retry_after: Duration::from_secs(1),
        };
        let body = |d: &Decision| String::from_utf8(p.problem(d).to_vec()).unwrap();
        let d = Decision::new(wait, 8, 0, Duration::ZERO, 7)
            .with_violated_quotas(QuotaSet::EMPTY.with(0).with(3));
        assert!(
            body(&d).ends_with("\"violated-policies\":[\"x.0\",\"x.3\",\"x.7\"]}"),
            "{}",
            body(&d)
        );
        let alone = Decision::new(wait, 8, 0, Duration::ZERO, 5);
        assert!(body(&alone).ends_with("[\"x.5\"]}"), "{}", body(&alone));
        let stranger = Decision::new(wait, 8, 0, Duration::ZERO, 9);
        assert!(
            body(&stranger).ends_with("[\"x.0\"]}"),
            "{}",
            body(&stranger)
        );
        let single = Limit::single(Algorithm::Gcra, Quota::per_second(1).unwrap()).unwrap();
        let p = Prepared::new("y", &single);
        assert_eq!(p.problems.len(), 1);
        assert!(
            String::from_utf8(p.problem(&alone).to_vec())
                .unwrap()
                .ends_with("[\"y\"]}")
        );
    }

    #[test]
    fn rounding_is_up_and_never_zero() {
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(secs_ceil(Duration::ZERO), 0);
    }

    #[test]
    fn header_values() {
        let limit = Limit::new(
            Algorithm::TokenBucket,
            [
                Quota::per_second(10).unwrap(),
                Quota::per_period(1000, Duration::from_millis(3_600_500)).unwrap(),
            ],
        )
        .unwrap();
        let p = Prepared::new("a\"b", &limit);
        assert_eq!(
            p.policy_value,
            "\"a\\\"b.0\";q=10;w=1, \"a\\\"b.1\";q=1000;w=3601"
        );
        // A period that is not whole seconds: the units granted in the rounded-up window, at the
        // quota's rate, rounded down.
        for (limit, period_ms, want) in [
            (5, 100, "q=50;w=1"),
            (1, 1, "q=1000;w=1"),
            (7, 1_500, "q=9;w=2"),
            (3, 2_000, "q=3;w=2"),
            (1, 86_400_000, "q=1;w=86400"),
        ] {
            let q = Quota::per_period(limit, Duration::from_millis(period_ms)).unwrap();
            let p = Prepared::new("p", &Limit::single(Algorithm::FixedWindow, q).unwrap());
            assert_eq!(
                p.policy_value,
                format!("\"p\";{want}"),
                "{limit} per {period_ms} ms"
            );
        }
        let d = Decision::new(
            Outcome::Denied {
                retry_after: Duration::from_millis(2_500),
            },
            1000,
            0,
            Duration::from_secs(7),
            1,
        );
        assert_eq!(
            p.rate_limit_value(&d, p.more_in_secs(&d)),
            "\"a\\\"b.1\";r=0;t=3"
        );
        let mut v = Vec::new();
        push_u64(&mut v, u64::MAX);
        assert_eq!(v, u64::MAX.to_string().as_bytes());
        for n in (0..1_100).chain([9_999, 10_000, u64::MAX]) {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
        }
    }
}
