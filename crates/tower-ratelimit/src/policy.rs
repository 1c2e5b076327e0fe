//! Policies: what a layer limits, how, and what it answers.
//!
//! A [`Policy`] has a name (used in the `RateLimit` headers, in metrics labels and to namespace
//! store keys), a [`Limit`] (one algorithm over one or more quotas, checked all-or-nothing), a
//! [`KeyExtractor`], and optional per-request parts: a cost function, tiers chosen per request,
//! an allow-list, dry-run mode, the header mode, the denial body and the failure policy.
//!
//! ## Several quotas, a cost per request
//!
//! ```
//! use tower_ratelimit::{Algorithm, Limit, Policy, Quota, http};
//!
//! // 10 a second with bursts of 20, and 1,000 an hour; uploads cost 5.
//! let limit = Limit::new(
//!     Algorithm::TokenBucket,
//!     [Quota::per_second(10)?.with_burst(20)?, Quota::per_hour(1_000)?],
//! )?;
//! let policy = Policy::new("api", limit)?
//!     .cost(|req| if req.method() == http::Method::POST { 5 } else { 1 });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Tiers: the quota depends on the request
//!
//! ```
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//! use tower_ratelimit::Policy;
//!
//! #[derive(Clone)]
//! enum Plan { Free, Pro }
//!
//! let policy = Policy::new("api", Limit::single(Algorithm::Gcra, Quota::per_minute(60)?)?)?
//!     .tier("pro", Limit::single(Algorithm::Gcra, Quota::per_minute(6_000)?)?)?
//!     .resolve_tier(|req| match req.extensions().get::<Plan>() {
//!         Some(Plan::Pro) => Some("pro"),
//!         _ => None, // the policy's own limit
//!     });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Allow-list and dry run
//!
//! ```
//! use tower_ratelimit::{Algorithm, Limit, Quota};
//! use tower_ratelimit::Policy;
//!
//! let policy = Policy::new("api", Limit::single(Algorithm::TokenBucket, Quota::per_second(50)?)?)?
//!     // Health checks are never limited.
//!     .allow(|req| req.uri().path() == "/health")
//!     // Count would-be denials (`outcome="shadow_denied"`) but let everything through.
//!     .dry_run(true);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::StatusCode;
use ratelimit_core::Limit;

use crate::key::{FastKey, KeyExtractor};
use crate::response::{DenialBody, Headers};
use crate::{Error, FailurePolicy, RequestHead};

/// The longest policy name, in characters.
pub const MAX_NAME_LEN: usize = 64;

pub(crate) type CostFn = Arc<dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync>;
pub(crate) type AllowFn = Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;
/// A tier resolver: the name it returns may borrow from the request (a plan's name in an
/// extension) or from the resolver itself (a table of its own), not only be `'static`.
pub(crate) type TierFn = Arc<dyn ResolveTier>;

/// A tier resolver, whichever of [`Policy::resolve_tier`] and [`Policy::resolve_tier_with`] set
/// it: one lifetime for itself and the request, so that its answer may borrow from either.
pub(crate) trait ResolveTier: Send + Sync {
    fn resolve<'a>(&'a self, req: &'a RequestHead<'_>) -> Option<&'a str>;
}

/// A resolver of [`Policy::resolve_tier`]: the request alone.
struct FromRequest<F>(F);

impl<F> ResolveTier for FromRequest<F>
where
    F: for<'a> Fn(&'a RequestHead<'_>) -> Option<&'a str> + Send + Sync,
{
    fn resolve<'a>(&'a self, req: &'a RequestHead<'_>) -> Option<&'a str> {
        (self.0)(req)
    }
}

/// A resolver of [`Policy::resolve_tier_with`]: its state and the request.
struct WithState<T, F> {
    state: T,
    resolve: F,
}

impl<T, F> ResolveTier for WithState<T, F>
where
    T: Send + Sync,
    F: for<'a> Fn(&'a T, &'a RequestHead<'_>) -> Option<&'a str> + Send + Sync,
{
    fn resolve<'a>(&'a self, req: &'a RequestHead<'_>) -> Option<&'a str> {
        (self.resolve)(&self.state, req)
    }
}

/// What to answer when the key extractor finds no key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Reject the request with this status (400 by default) and a body in the policy's
    /// [`DenialBody`] format (plain text by default: `No rate-limit key in
    /// the request`, followed by what to send if the key's extractor says: see
    /// [`KeyExtractor::client_hint`]; a gRPC call gets its status mapping, as
    /// [`DenialBody::Grpc`] says);
    /// counted as `outcome="no_key"`. Not 401, 405, 407 or 426, which HTTP requires to carry a
    /// header of their own (for 401 see [`Unauthorized`](MissingKey::Unauthorized)).
    Reject(StatusCode),
    /// Reject the request with `401 Unauthorized`, which HTTP requires to carry a
    /// `WWW-Authenticate` challenge: this value (`Bearer realm="api"`, `ApiKey
    /// header="x-api-key"`), and a body in the policy's format as for
    /// [`Reject`](MissingKey::Reject) (plain text by default: `Unauthorized: this request needs
    /// credentials`, followed by what to send). Counted as `outcome="no_key"`.
    Unauthorized(http::HeaderValue),
    /// Count every keyless request against this one shared key (kept apart from every extracted
    /// key, even an equal one). A request that sent its key in a form the extractor cannot use
    /// (an [`ApiKeyHeader`](crate::key::ApiKeyHeader)'s header twice or empty:
    /// [`KeyExtractor::unusable`]) is not keyless: it gets `400 Bad Request`, counted as
    /// `outcome="no_key"`, with the text of [`Reject`](MissingKey::Reject).
    SharedKey(bytes::Bytes),
}

impl MissingKey {
    /// Rejects keyless requests with `status`, which must be a client or server error, and not
    /// 401, 405, 407 or 426 (each needs a header of its own; for 401 use
    /// [`unauthorized`](MissingKey::unauthorized)).
    pub fn reject(status: u16) -> Result<Self, Error> {
        let s = StatusCode::from_u16(status).map_err(|_| Error::InvalidStatus { status })?;
        let answer = MissingKey::Reject(s);
        answer.check()?;
        Ok(answer)
    }

    /// Refuses a status that is not a client or server error, which would tell clients and
    /// proxies that a keyless request was served (checked again when a layer is built, for the
    /// variant built directly).
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self {
            MissingKey::Reject(s) if !(s.is_client_error() || s.is_server_error()) => {
                Err(Error::InvalidStatus { status: s.as_u16() })
            }
            MissingKey::Reject(s) if *s == StatusCode::UNAUTHORIZED => Err(Error::InvalidSetting {
                name: "missing_key",
                reason: "a 401 must carry a WWW-Authenticate challenge: use \
                         `MissingKey::unauthorized` (`{ unauthorized = \"...\" }` in a \
                         configuration)",
            }),
            MissingKey::Reject(s)
                if *s == StatusCode::METHOD_NOT_ALLOWED
                    || *s == StatusCode::PROXY_AUTHENTICATION_REQUIRED
                    || *s == StatusCode::UPGRADE_REQUIRED =>
            {
                Err(Error::InvalidSetting {
                    name: "missing_key",
                    reason: "405, 407 and 426 must carry a header of their own (Allow, \
                             Proxy-Authenticate, Upgrade) and do not mean a missing key: use \
                             400 or 403",
                })
            }
            // Checked again here for a variant made directly, not by `unauthorized`.
            MissingKey::Unauthorized(challenge) if challenge.to_str().is_err() => {
                Err(Error::InvalidSetting {
                    name: "missing_key",
                    reason: "a WWW-Authenticate challenge must be a visible-ASCII header value",
                })
            }
            MissingKey::Unauthorized(challenge)
                if challenge.as_bytes().iter().all(u8::is_ascii_whitespace) =>
            {
                Err(Error::InvalidSetting {
                    name: "missing_key",
                    reason: "a WWW-Authenticate challenge must not be empty",
                })
            }
            MissingKey::Unauthorized(challenge)
                if !starts_with_auth_scheme(challenge.as_bytes()) =>
            {
                Err(Error::InvalidSetting {
                    name: "missing_key",
                    reason: "a WWW-Authenticate challenge must start with its scheme (a token, \
                             then a space, a comma or nothing): `Bearer realm=\"api\"`, `ApiKey`",
                })
            }
            _ => Ok(()),
        }
    }

    /// Rejects keyless requests with `401 Unauthorized` and `WWW-Authenticate: challenge`
    /// (`Bearer realm="api"`, say), which HTTP requires of a 401. The challenge must be a valid
    /// header value that starts with its scheme: a token, then a space, a comma (a list of
    /// challenges) or nothing.
    pub fn unauthorized(challenge: &str) -> Result<Self, Error> {
        let value = http::HeaderValue::from_str(challenge).map_err(|_| Error::InvalidSetting {
            name: "missing_key",
            reason: "a WWW-Authenticate challenge must be a visible-ASCII header value",
        })?;
        let answer = MissingKey::Unauthorized(value);
        answer.check()?;
        Ok(answer)
    }

    /// Counts keyless requests (not those whose key is [unusable](KeyExtractor::unusable): see
    /// [`SharedKey`](MissingKey::SharedKey)) against one shared key named `key`, under the
    /// policy's own limit
    /// whatever tier [`Policy::resolve_tier`] picks for them: the tier comes from the same
    /// request that carries no usable key, so it is not trusted to choose a larger shared bucket.
    pub fn shared_key(key: impl Into<bytes::Bytes>) -> Self {
        MissingKey::SharedKey(key.into())
    }
}

/// Whether `challenge` starts as RFC 9110's `challenge = auth-scheme [ 1*SP ( token68 /
/// #auth-param ) ]` does: a token, then a space, the end, or the comma of a list of challenges
/// (`Negotiate, NTLM`).
fn starts_with_auth_scheme(challenge: &[u8]) -> bool {
    let scheme = challenge.iter().take_while(|b| is_tchar(**b)).count();
    scheme > 0 && matches!(challenge.get(scheme), None | Some(b' ' | b','))
}

/// RFC 9110's `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// A named limit with everything needed to apply it to a request. See the [module
/// docs](crate::policy).
#[derive(Clone)]
#[must_use]
pub struct Policy {
    pub(crate) name: Arc<str>,
    pub(crate) limit: Limit,
    pub(crate) tiers: Vec<(Cow<'static, str>, Limit)>,
    pub(crate) resolve_tier: Option<TierFn>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    /// `key` again if it is a built-in extractor the layer runs without the dynamic call.
    pub(crate) fast_key: FastKey,
    pub(crate) missing_key: MissingKey,
    pub(crate) cost: Option<CostFn>,
    pub(crate) allow: Option<AllowFn>,
    pub(crate) dry_run: bool,
    pub(crate) headers: Headers,
    pub(crate) verdict: bool,
    pub(crate) verdict_in_request: bool,
    pub(crate) body: DenialBody,
    pub(crate) failure: FailurePolicy,
}

impl Policy {
    /// A policy named `name` holding each key to `limit`.
    ///
    /// The name must be 1 to [`MAX_NAME_LEN`] printable ASCII characters, neither `"` nor `\`
    /// (it is a label of the [metrics](crate::metrics), which some exporters would not tell
    /// apart from another name with them escaped). It names the policy's
    /// items in the IETF fields: the name itself for a limit of one quota, `<name>.0`,
    /// `<name>.1`, ... for each quota of several. Layers a request passes through one inside the
    /// other each add their items, unless an item of the same name is there already (the same
    /// policy twice): so give no policy the name of another's item (`api.0` beside an `api` of
    /// two quotas), whose items would then be left out. The defaults: the key is
    /// the peer address ([`PeerIp`](crate::key::PeerIp); [`GlobalKey`](crate::key::GlobalKey)
    /// without the `axum` feature), each request costs 1, a missing key is rejected with 400,
    /// IETF headers on every response the store or the fallback store decided (those of a
    /// fallback describing its local share; none on one the allow-list, a missing key, failing
    /// open or closed, or a dry run answered or let through), a plain-text 429 body, and
    /// [`FailurePolicy::FailOpen`].
    ///
    /// The peer address comes from axum's `ConnectInfo`: serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()` (and, in tests through `oneshot`,
    /// add `MockConnectInfo`), or every request gets the missing-key answer, a 400 that alerting
    /// on 5xx does not see (the layer warns of it once). Behind a proxy the peer is the proxy:
    /// key on [`ClientIpKey`](crate::key::ClientIpKey) with the proxies trusted, or on an API key
    /// or user.
    pub fn new(name: &str, limit: Limit) -> Result<Self, Error> {
        validate_name(name)?;
        #[cfg(feature = "axum")]
        let (key, fast_key): (Arc<dyn KeyExtractor>, _) = {
            let key = crate::key::PeerIp::new();
            let fast_key = FastKey::of(&key);
            (Arc::new(key), fast_key)
        };
        #[cfg(not(feature = "axum"))]
        let (key, fast_key): (Arc<dyn KeyExtractor>, _) =
            (Arc::new(crate::key::GlobalKey), FastKey::Dyn);
        Ok(Policy {
            name: name.into(),
            limit,
            tiers: Vec::new(),
            resolve_tier: None,
            key,
            fast_key,
            missing_key: MissingKey::default(),
            cost: None,
            allow: None,
            dry_run: false,
            headers: Headers::default(),
            verdict: true,
            verdict_in_request: false,
            body: DenialBody::default(),
            failure: FailurePolicy::default(),
        })
    }

    /// The name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The default limit (used when no tier applies).
    #[must_use]
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Which client a request counts against.
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.fast_key = FastKey::of(&key);
        self.key = Arc::new(key);
        self
    }

    /// What to answer when no key is found (default: reject with 400).
    pub fn missing_key(mut self, answer: MissingKey) -> Self {
        self.missing_key = answer;
        self
    }

    /// The cost of each request (default 1). A cost of 0 checks without consuming, and the limit
    /// always lets it through (a store that cannot answer still gets the failure policy's answer, a
    /// 503 when failing closed): a cost computed from the request (say its body's length in KiB)
    /// should be at least 1 (`(len / 1024).max(1)`) unless small requests are meant to be free. A
    /// cost larger than the limit can ever hold is denied with no `Retry-After` (it would never
    /// pass); its `RateLimit` field reports the quota as it stands (no `t` when it is full), and
    /// the body (or the problem's `detail`, or the gRPC message) says that the request costs more
    /// than the limit can ever admit at once.
    ///
    /// The cost is decided from the request's head, before its body is read: a body's length is
    /// its `Content-Length`, which a chunked request (HTTP/1.1 `Transfer-Encoding: chunked`, or
    /// HTTP/2 without the field) does not send. Charge such a request what a body can be at most
    /// (the app's body size limit, `axum::extract::DefaultBodyLimit`, in the cost's units), or
    /// refuse it in front of this layer, or it costs the minimum whatever it carries.
    ///
    /// The rate-limit fields then count cost units, not requests: `q` and `r` are in the units
    /// the costs are in, while draft-10 reads them as requests unless `qu` says otherwise, and
    /// its registry has no unit for "what the API charges" (`content-bytes` fits a cost that is
    /// the body's length in bytes). Say in the API's documentation what each request costs, or
    /// clients will read `r=15` as 15 requests where 3 writes of 5 remain.
    pub fn cost(mut self, cost: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Adds a tier: another limit, chosen per request by [`resolve_tier`](Policy::resolve_tier).
    /// Tier names must be distinct, not empty, and hold neither `"` nor `\` (the name is the
    /// `tier` label of the [metrics](crate::metrics), where `""` stands for the policy's own
    /// limit, and some exporters would not tell `a"b` from `a\"b` there).
    pub fn tier(mut self, name: impl Into<Cow<'static, str>>, limit: Limit) -> Result<Self, Error> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::InvalidSetting {
                name: "tier",
                reason: "a tier's name is empty: give it the name the resolver returns",
            });
        }
        if name.contains(['"', '\\']) {
            return Err(Error::InvalidSetting {
                name: "tier",
                reason: "a tier's name holds `\"` or `\\`: a metrics label that some exporters \
                         would not tell apart from another name's",
            });
        }
        if self.tiers.iter().any(|(n, _)| *n == name) {
            return Err(Error::DuplicateTier {
                name: name.into_owned(),
            });
        }
        self.tiers.push((name, limit));
        Ok(self)
    }

    /// Chooses the tier of each request (a plan found in the extensions, say). `None`, or a name
    /// that is not a tier, means the policy's own limit (a name that is not a tier is logged as
    /// a warning the first time: a resolver's typo would hold every such client to that limit).
    /// A request without a key that is counted against [`MissingKey::shared_key`] is always
    /// under the policy's own limit.
    ///
    /// The name returned may be a literal (`Some("pro")`) or borrowed from the request: a plan
    /// name known only at run time, kept in an extension by an authentication layer, needs no
    /// `'static` copy. To look names up in a table of your own (API key to plan), use
    /// [`resolve_tier_with`](Policy::resolve_tier_with), whose answer may borrow from the table:
    /// a closure cannot return a borrow of what it captured.
    ///
    /// ```
    /// use tower_ratelimit::{Algorithm, Limit, Quota};
    /// use tower_ratelimit::Policy;
    ///
    /// // Put in the extensions by an authentication layer that runs before the limiter.
    /// #[derive(Clone)]
    /// struct Plan {
    ///     name: String,
    /// }
    ///
    /// let policy = Policy::new("api", Limit::single(Algorithm::Gcra, Quota::per_minute(60)?)?)?
    ///     .tier("pro", Limit::single(Algorithm::Gcra, Quota::per_minute(6_000)?)?)?
    ///     .resolve_tier(|req| req.extensions().get::<Plan>().map(|p| p.name.as_str()));
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve_tier(
        mut self,
        resolve: impl for<'a> Fn(&'a RequestHead<'_>) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Self {
        self.resolve_tier = Some(Arc::new(FromRequest(resolve)));
        self
    }

    /// [`resolve_tier`](Policy::resolve_tier) with a state of its own that `resolve` is lent
    /// with each request, so that the name it returns may borrow from either: a table from API
    /// key to plan, loaded at start-up, with no `'static` copy of its names.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use tower_ratelimit::{Algorithm, Limit, Quota};
    /// use tower_ratelimit::Policy;
    /// use tower_ratelimit::key::{ApiKeyHeader, header_value_trimmed};
    ///
    /// // Keyed by the API key's bytes, looked up as `ApiKeyHeader` keys on them (trimmed): a
    /// // lookup that read the value otherwise (` key-of-acme` over HTTP/2) would count the same
    /// // key under another tier's limit, a budget of its own.
    /// let plans: HashMap<Vec<u8>, String> =
    ///     [(b"key-of-acme".to_vec(), "pro".to_owned())].into_iter().collect();
    /// let policy = Policy::new("api", Limit::single(Algorithm::Gcra, Quota::per_minute(60)?)?)?
    ///     .tier("pro", Limit::single(Algorithm::Gcra, Quota::per_minute(6_000)?)?)?
    ///     .key(ApiKeyHeader::new("x-api-key")?)
    ///     .resolve_tier_with(plans, |plans, req| {
    ///         let key = header_value_trimmed(req.headers().get("x-api-key")?);
    ///         plans.get(key).map(String::as_str)
    ///     });
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve_tier_with<T: Send + Sync + 'static>(
        mut self,
        state: T,
        resolve: impl for<'a> Fn(&'a T, &'a RequestHead<'_>) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Self {
        self.resolve_tier = Some(Arc::new(WithState { state, resolve }));
        self
    }

    /// Requests for which `allow` returns `true` are never limited (`outcome="allow_listed"`).
    pub fn allow(
        mut self,
        allow: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.allow = Some(Arc::new(allow));
        self
    }

    /// Dry run (shadow mode): decisions are made and counted, but the layer never answers in
    /// place of the inner service. Every request goes through and no rate-limit header is added;
    /// what would have been a rejection (a 429, a fail-closed 503, a missing-key rejection) is
    /// counted as `outcome="shadow_denied"`.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Which rate-limit headers to send, and on which responses.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Whether to put a [`Verdict`](crate::Verdict) in the extensions of every response (default
    /// `true`).
    ///
    /// The first extension of a response makes http allocate its map, its table and the boxed
    /// value: about a tenth of the layer's cost per request on the in-memory store. An app that
    /// never reads the verdict can turn it off; the decision is still counted in the metrics and
    /// written in the headers.
    pub fn verdict(mut self, verdict: bool) -> Self {
        self.verdict = verdict;
        self
    }

    /// Whether to put the [`Verdict`](crate::Verdict) in the extensions of each request the
    /// layer lets through, for the handler (default `false`): its kind, and the store's
    /// [`Decision`](crate::Decision) with the requests left, for a body that tells them or a log
    /// line. Independent of [`verdict`](Self::verdict), which puts it on the response.
    ///
    /// It is the verdict of the request's own check: under nested layers that both put one, the
    /// handler sees the innermost's (the last put in). A request answered in place of the
    /// handler (a 429, a fail-closed 503) reaches no handler. Each request let through makes
    /// http allocate its extensions' map, if nothing else has, and the verdict's box.
    ///
    /// ```
    /// use axum::{Extension, Router, routing::get};
    /// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer, Verdict};
    ///
    /// async fn search(Extension(verdict): Extension<Verdict>) -> String {
    ///     let left = verdict.decision().map_or(0, |d| d.remaining());
    ///     format!("results... ({left} searches left this minute)")
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = Limit::single(Algorithm::Gcra, Quota::per_minute(30)?)?;
    /// let policy = Policy::new("search", limit)?.verdict_in_request(true);
    /// let app: Router = Router::new()
    ///     .route("/search", get(search))
    ///     .layer(RateLimitLayer::new(MemoryStore::new(), policy)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn verdict_in_request(mut self, verdict_in_request: bool) -> Self {
        self.verdict_in_request = verdict_in_request;
        self
    }

    /// The body of a 429.
    pub fn body(mut self, body: DenialBody) -> Self {
        self.body = body;
        self
    }

    /// What to do when the store cannot answer.
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("tiers", &self.tiers)
            .field("missing_key", &self.missing_key)
            .field("cost", &self.cost.is_some())
            .field("allow", &self.allow.is_some())
            .field("dry_run", &self.dry_run)
            .field("headers", &self.headers)
            .field("verdict", &self.verdict)
            .field("verdict_in_request", &self.verdict_in_request)
            .field("body", &self.body)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// Checks a policy's name as [`Policy::new`] does: 1 to [`MAX_NAME_LEN`] printable ASCII
/// characters, neither `"` nor `\` ([`Error::InvalidPolicyName`] if not), for a name checked
/// before its policy is made (a configuration file's). It goes in the metrics' `policy` label,
/// where a Prometheus exporter takes a `\"` for an escaped `"` (metrics-exporter-prometheus:
/// `a"b` and `a\"b` were written as one series), and in the IETF fields' strings, which escape
/// both.
///
/// ```
/// use tower_ratelimit::policy::validate_name;
///
/// assert!(validate_name("login").is_ok());
/// assert!(validate_name("a\"b").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidPolicyName { name: name.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{Algorithm, Quota};

    fn limit() -> Limit {
        Limit::single(Algorithm::TokenBucket, Quota::per_second(1).unwrap()).unwrap()
    }

    #[test]
    fn names_are_validated() {
        assert!(Policy::new("api v1", limit()).is_ok());
        // Neither `"` nor `\`: a Prometheus exporter takes `\"` in a label for an escaped `"`,
        // and would give `a"b` and `a\"b` one series.
        for bad in [
            "",
            "caf\u{e9}",
            "a\nb",
            &"x".repeat(65),
            "a\"b",
            "a\\b",
            "a\\\"b",
        ] {
            assert!(matches!(
                Policy::new(bad, limit()),
                Err(Error::InvalidPolicyName { .. })
            ));
        }
    }

    #[test]
    fn tiers_are_distinct_and_statuses_are_errors() {
        let p = Policy::new("p", limit())
            .unwrap()
            .tier("pro", limit())
            .unwrap();
        assert!(matches!(
            p.clone().tier("pro", limit()),
            Err(Error::DuplicateTier { .. })
        ));
        // A metrics label, as the policy's name.
        for bad in ["p\"ro", "p\\ro"] {
            assert!(matches!(
                p.clone().tier(bad, limit()),
                Err(Error::InvalidSetting { name: "tier", .. })
            ));
        }
        // `""` is the policy's own limit in the metrics' `tier` label.
        assert!(matches!(
            p.tier("", limit()),
            Err(Error::InvalidSetting { name: "tier", .. })
        ));
        assert_eq!(
            MissingKey::reject(200),
            Err(Error::InvalidStatus { status: 200 })
        );
        for status in [401, 405, 407, 426] {
            assert!(
                matches!(
                    MissingKey::reject(status),
                    Err(Error::InvalidSetting {
                        name: "missing_key",
                        ..
                    })
                ),
                "{status}"
            );
        }
        assert_eq!(
            MissingKey::reject(403),
            Ok(MissingKey::Reject(StatusCode::FORBIDDEN))
        );
        assert_eq!(
            MissingKey::unauthorized("Bearer realm=\"api\""),
            Ok(MissingKey::Unauthorized(http::HeaderValue::from_static(
                "Bearer realm=\"api\""
            )))
        );
        assert!(MissingKey::unauthorized(" ").is_err());
        assert!(MissingKey::unauthorized("Bearer\nrealm").is_err());
        // A challenge starts with its scheme, a token.
        for ok in [
            "ApiKey",
            "Bearer realm=\"api\"",
            "Basic realm=\"a\", charset=\"UTF-8\"",
            "Negotiate, NTLM",
            "Bearer, Basic realm=\"api\"",
        ] {
            assert!(MissingKey::unauthorized(ok).is_ok(), "{ok}");
        }
        for bad in ["\"x\"", "realm=api", " Bearer", ",Bearer", "Be(arer"] {
            assert!(MissingKey::unauthorized(bad).is_err(), "{bad}");
        }
    }
}
