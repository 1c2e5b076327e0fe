//! The example gateway as a library: its configuration ([`config`]) and its router ([`app`]), so
//! that the `gateway` binary, the tests and the `fleet` example build the same server.
//!
//! The gateway is a small API server: `POST /login`, `GET /api/items`, `POST /api/items`,
//! `GET /api/items/{id}`, `GET /health`, `GET /metrics` (Prometheus text) and, with an `[admin]`
//! table, `POST /admin/reset` (forgets a client's count, for a request with the admin token).
//! Which of the first four are rate limited, per what key, how hard and what happens when the
//! store fails all come from the configuration file; the others never are.
//!
//! Each configured route becomes one `RateLimitLayer` wrapped around every endpoint its `path`
//! covers; when several routes cover an endpoint, the one listed first is checked first. All
//! layers share one store: an in-memory store, or one Redis store (its own connections) per
//! gateway.

pub mod config;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::RawQuery;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ratelimit_core::{Clock, DenialCache, Forget, MemoryStore, Reset, SystemClock};
use ratelimit_redis::{
    Coalescing, LazyRedisStore, RedisStore, RedisStoreBuilder, RedisStoreError, ResetWatch,
};
use tower_ratelimit::client_ip::ClientIp;
use tower_ratelimit::key::{ApiKeyHeader, ClientIpKey, GlobalKey};
use tower_ratelimit::{
    CircuitBreaker, ForwardedHeader, Policy, RateLimitLayer, ResetError, Resetter,
};

pub use config::{Config, ConfigError};

/// Why the gateway could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is wrong; the message names the field.
    Config(ConfigError),
    /// The Redis store could not be opened (the server is down, refuses us...).
    Store(RedisStoreError),
}

impl StartError {
    /// The process's exit status for this error: 3 when the store could not be reached (Redis
    /// down or restarting: starting again later may succeed, so a supervisor should retry), 2
    /// for everything a restart cannot mend (the file, a setting, credentials Redis refused, an
    /// address where something other than a usable Redis answers).
    pub fn exit_status(&self) -> u8 {
        match self {
            StartError::Store(e) if !e.is_refused_credentials() && !e.is_wrong_server() => 3,
            _ => 2,
        }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::Store(e) => write!(f, "store: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::Store(e) => Some(e),
        }
    }
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> Self {
        StartError::Config(e)
    }
}

/// The buckets of `ratelimit_store_duration_seconds`, in seconds: from 100 µs (a Redis on the
/// same host) to the longest layer timeouts worth alerting on.
pub const STORE_DURATION_BUCKETS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The Prometheus recorder's handle. The first call installs the recorder as the global
/// `metrics` recorder; later calls return the same handle. [`app`] calls it before building any
/// layer, because a layer registers its metrics with the recorder installed at that moment.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // The store latency as a histogram (buckets summed across gateways by
            // `histogram_quantile`), not the recorder's default summary, whose quantiles are
            // per process and fall to 0 when nothing was recorded for a while: an idle route
            // would read as answering in no time, and a stall would leave the p99 within a
            // minute.
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(tower_ratelimit::metrics::STORE_DURATION_SECONDS.to_owned()),
                    &STORE_DURATION_BUCKETS,
                )
                .expect("the buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then /metrics stays empty
            // rather than the gateway refusing to start.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics is empty");
            }
            handle
        })
        .clone()
}

/// The gateway's router for `config`: opens the store (connecting to Redis if configured),
/// builds every route's policy, and wraps each endpoint in the layers of the routes covering it.
///
/// Serve it with `into_make_service_with_connect_info::<SocketAddr>()`: IP keys read the peer
/// address from `ConnectInfo`.
pub async fn app(config: &Config) -> Result<Router, StartError> {
    app_with_clock(config, SystemClock::new()).await
}

/// [`app`], with the in-memory store and the denial caches reading `clock` instead of the
/// system's monotonic clock: tests drive a `ManualClock` through it, so that refills and waits
/// are exact whatever the machine's speed. A Redis store still counts on the server's clock.
pub async fn app_with_clock<C>(config: &Config, clock: C) -> Result<Router, StartError>
where
    C: Clock + Clone + 'static,
{
    config.validate()?;
    let admin_token = config.admin.as_ref().map(|a| a.token()).transpose()?;
    let metrics = metrics_handle();
    let policies = config
        .routes
        .iter()
        .enumerate()
        .map(|(i, route)| Ok((route.path.clone(), policy(config, i)?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let store = &config.store;
    match store.kind {
        config::StoreKind::Memory => {
            let memory = MemoryStore::builder()
                .max_keys(store.max_keys())
                .with_clock(clock)
                .build()
                .map_err(|e| ConfigError::new("store.max_keys", e))?;
            Ok(router(
                config,
                Arc::new(memory),
                policies,
                metrics,
                None,
                admin_token,
            )?)
        }
        config::StoreKind::Redis | config::StoreKind::RedisCluster => {
            // The admin route's resets are announced, so that the gateways that watch for resets
            // end their cached denials of the client at once.
            let builder = redis_builder(store)?.announce_resets(config.admin.is_some());
            let redis = if store.start_without_redis {
                // Retried once a second until Redis can be reached; until then each route's
                // failure policy answers. A wrong setting, refused credentials included, still
                // stops the gateway, as a wrong URL does.
                let lazy = builder
                    .build_lazy(Duration::from_secs(1))
                    .await
                    .map_err(|e| start_error(store, e))?;
                if !lazy.is_connected() {
                    // An event, as the store's own attempts are logged, so that it reads as they do.
                    tracing::warn!(
                        "Redis cannot be reached; starting anyway, retrying every second"
                    );
                }
                lazy
            } else {
                LazyRedisStore::from(builder.build().await.map_err(|e| start_error(store, e))?)
            };
            // The denial cache in front (a cached denial needs no call at all), then the
            // coalescing of the calls that remain. Its clock: the Redis store counts on the
            // server's, and a denial's wait is a duration, timed here.
            Ok(match (store.denial_cache, store.coalesce) {
                (false, false) => router(config, redis, policies, metrics, None, admin_token)?,
                (false, true) => router(
                    config,
                    Coalescing::new(redis),
                    policies,
                    metrics,
                    None,
                    admin_token,
                )?,
                (true, false) => {
                    let cached = DenialCache::new(redis.clone(), clock);
                    let watch = reset_watch(store, &redis, cached.clone())?;
                    router(config, cached, policies, metrics, watch, admin_token)?
                }
                (true, true) => {
                    let cached = DenialCache::new(Coalescing::new(redis.clone()), clock);
                    let watch = reset_watch(store, &redis, cached.clone())?;
                    router(config, cached, policies, metrics, watch, admin_token)?
                }
            })
        }
    }
}

/// With `watch_resets`, a watch of the resets announced through Redis that ends what `heard` (a
/// clone of the gateway's denial cache) holds of each reset client; it lives as long as the
/// router (its `/health` route holds it).
fn reset_watch(
    store: &config::StoreConfig,
    redis: &LazyRedisStore,
    heard: impl Forget + Send + Sync + 'static,
) -> Result<Option<Arc<ResetWatch>>, StartError> {
    if !store.watch_resets {
        return Ok(None);
    }
    let watch = redis
        .watch_resets(move |notice| notice.apply(&heard))
        .map_err(|e| start_error(store, e))?;
    Ok(Some(Arc::new(watch)))
}

/// How much longer the Redis store's own timeout is than the layer's.
const STORE_TIMEOUT_MARGIN: Duration = Duration::from_millis(10);

/// The settings of the Redis store described by `store`.
fn redis_builder(store: &config::StoreConfig) -> Result<RedisStoreBuilder, StartError> {
    let builder = match &store.url {
        Some(url) => RedisStore::builder(url.clone()),
        None => RedisStore::cluster(store.urls.iter().cloned()),
    };
    let builder = builder
        .prefix(store.prefix().to_owned())
        .pool_size(store.pool_size());
    // Only when set: left at the store's default, a cluster client's connect timeout is held
    // to at most a third of the response timeout (see `RedisStoreBuilder::connect_timeout`).
    let builder = match store.connect_timeout_ms {
        Some(ms) => builder.connect_timeout(Duration::from_millis(ms)),
        None => builder,
    };
    let builder = match store.expiry_slack_ms {
        Some(ms) => builder.expiry_slack(Duration::from_millis(ms)),
        None => builder,
    };
    let builder = match store.ping_after_idle_ms {
        Some(ms) => builder.ping_after_idle(Duration::from_millis(ms)),
        None => builder,
    };
    let builder = tls_files(builder, store)?;
    Ok(builder
        // The store's own timer on the layer's budget, so that a longer `timeout_ms` is not cut
        // by the store's default 500 ms, plus 10 ms: the store's timer starts first (the layer
        // polls the check once in `call`, and takes its own deadline just after), and the
        // layer's must fire first for a stall to be counted and logged as a timeout
        // (`kind="timeout"`), not as a store error.
        // Held to the store's longest, which the longest `timeout_ms` would pass.
        .response_timeout(
            (Duration::from_millis(store.timeout_ms) + STORE_TIMEOUT_MARGIN)
                .min(ratelimit_redis::MAX_TIMEOUT),
        ))
}

/// The store trusts the certificates of `store.tls_ca_file`, if set, as its roots, and presents
/// the certificate of `store.tls_client_cert_file` with the key of `store.tls_client_key_file`.
#[cfg(any(feature = "tls", feature = "tls-rustls"))]
fn tls_files(
    builder: RedisStoreBuilder,
    store: &config::StoreConfig,
) -> Result<RedisStoreBuilder, StartError> {
    let builder = match &store.tls_ca_file {
        Some(path) => builder.tls_root_certificate(read_pem(
            "store.tls_ca_file",
            path,
            CERT_BEGIN,
            "certificate",
        )?),
        None => builder,
    };
    Ok(
        match (&store.tls_client_cert_file, &store.tls_client_key_file) {
            (Some(cert), Some(key)) => builder.tls_client_certificate(
                read_pem(
                    "store.tls_client_cert_file",
                    cert,
                    CERT_BEGIN,
                    "certificate",
                )?,
                // `BEGIN PRIVATE KEY`, `BEGIN EC PRIVATE KEY`, `BEGIN RSA PRIVATE KEY`.
                usable_key(
                    key,
                    read_pem(
                        "store.tls_client_key_file",
                        key,
                        "PRIVATE KEY-----",
                        "private key",
                    )?,
                )?,
            ),
            // The configuration has both or neither (`StoreConfig::validate`).
            _ => builder,
        },
    )
}

/// The PEM file at `path`, for the setting `field`: read, and checked to hold a line with
/// `marker` (a `what`), so that a wrong file is named as such rather than showing up as a failed
/// handshake.
#[cfg(any(feature = "tls", feature = "tls-rustls"))]
fn read_pem(
    field: &'static str,
    path: &std::path::Path,
    marker: &str,
    what: &str,
) -> Result<Vec<u8>, StartError> {
    let bad = |reason: String| StartError::Config(ConfigError::new(field, reason));
    let pem = config::read_capped(path)
        .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    if !holds(&pem, marker) {
        return Err(bad(format!(
            "{} holds no PEM {what} (no \"{marker}\" line)",
            path.display()
        )));
    }
    Ok(pem)
}

/// `pem`, the private key read from `path`, if this build's TLS can use it: not encrypted, and
/// with `tls` (native-tls) PKCS#8. Checked here so that the error names the key's file: the
/// store checks the certificate and its key together, as one setting, which the gateway would
/// name after the certificate's file.
#[cfg(any(feature = "tls", feature = "tls-rustls"))]
fn usable_key(path: &std::path::Path, pem: Vec<u8>) -> Result<Vec<u8>, StartError> {
    let has = |marker: &str| holds(&pem, marker);
    let bad = |reason: String| {
        StartError::Config(ConfigError::new(
            "store.tls_client_key_file",
            format!("{} {reason}", path.display()),
        ))
    };
    if has("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        return Err(bad(
            "holds an encrypted private key, which the gateway cannot decrypt: give it the key \
             unencrypted (`openssl pkcs8 -in <file> -out <new file>`)"
                .into(),
        ));
    }
    #[cfg(all(feature = "tls", not(feature = "tls-rustls")))]
    if !has("-----BEGIN PRIVATE KEY-----") {
        return Err(bad(
            "holds a private key in a form the `tls` build (native-tls) cannot use: it takes \
             PKCS#8 (`-----BEGIN PRIVATE KEY-----`; convert with `openssl pkcs8 -topk8 -nocrypt \
             -in <file> -out <new file>`)"
                .into(),
        ));
    }
    Ok(pem)
}

/// Whether `pem` holds the text `marker`.
#[cfg(any(feature = "tls", feature = "tls-rustls"))]
fn holds(pem: &[u8], marker: &str) -> bool {
    pem.windows(marker.len()).any(|w| w == marker.as_bytes())
}

/// The first line of a PEM certificate.
#[cfg(any(feature = "tls", feature = "tls-rustls"))]
const CERT_BEGIN: &str = "-----BEGIN CERTIFICATE-----";

/// Without a TLS feature the configuration refuses the certificate files
/// (`StoreConfig::validate`).
#[cfg(not(any(feature = "tls", feature = "tls-rustls")))]
fn tls_files(
    builder: RedisStoreBuilder,
    _store: &config::StoreConfig,
) -> Result<RedisStoreBuilder, StartError> {
    Ok(builder)
}

/// The start-up error for the store's error `e`: an invalid setting names the configuration's
/// field.
fn start_error(store: &config::StoreConfig, e: RedisStoreError) -> StartError {
    match e {
        RedisStoreError::Config { name, reason } => {
            let field = match name {
                "url" if store.url.is_none() => "urls",
                "connect_timeout" => "connect_timeout_ms",
                "tls_root_certificate" => "tls_ca_file",
                "tls_client_certificate" => "tls_client_cert_file",
                other => other,
            };
            StartError::Config(ConfigError::new(format!("store.{field}"), reason))
        }
        other => StartError::Store(other),
    }
}

/// The router over one store (an `Arc<MemoryStore>` or a `RedisStore`), with the admin route if
/// there is a token.
fn router<St>(
    config: &Config,
    store: St,
    policies: Vec<(String, Policy)>,
    metrics: PrometheusHandle,
    reset_watch: Option<Arc<ResetWatch>>,
    admin_token: Option<Vec<u8>>,
) -> Result<Router, ConfigError>
where
    St: Reset + Clone,
    St::Error: std::error::Error + 'static,
{
    let s = &config.store;
    let mut layers = Vec::with_capacity(policies.len());
    for (i, (path, policy)) in policies.into_iter().enumerate() {
        let builder = RateLimitLayer::builder(store.clone(), policy).timeout(s.timeout());
        let builder = if s.circuit_breaker.enabled {
            let breaker = CircuitBreaker::new(
                s.circuit_breaker.failures,
                Duration::from_millis(s.circuit_breaker.cool_down_ms),
            )
            .map_err(|e| ConfigError::new("store.circuit_breaker", e))?;
            let breaker = if s.circuit_breaker.per_failure_domain {
                breaker
            } else {
                breaker.single_circuit()
            };
            builder.circuit_breaker(breaker)
        } else {
            builder.no_circuit_breaker()
        };
        // The layers stack on axum handlers, whose bodies are axum's `Body`: keeping that type
        // spares axum a box per layer per response.
        let layer = builder
            .build()
            .map_err(|e| ConfigError::new(format!("routes[{i}].policy"), e))?
            .same_body();
        layers.push((path, layer));
    }

    let mut app = Router::new();
    if let Some(token) = admin_token {
        let admin = Arc::new(Admin {
            token,
            policies: layers
                .iter()
                .zip(&config.routes)
                .map(|((_, layer), route)| {
                    let kind = match route.key {
                        config::KeyConfig::Ip { .. } => ClientKind::Ip,
                        config::KeyConfig::Header { .. } => ClientKind::Value,
                        config::KeyConfig::Global {} => ClientKind::Everyone,
                    };
                    (route.policy.name.clone(), (kind, layer.resetter()))
                })
                .collect(),
        });
        // Never rate limited, as `/health` (see `config::ENDPOINTS`).
        app = app.route(
            "/admin/reset",
            post(
                move |headers: HeaderMap,
                      RawQuery(raw): RawQuery,
                      query: Result<Query<ResetParams>, QueryRejection>| {
                    let admin = Arc::clone(&admin);
                    async move { admin.reset(&headers, raw.as_deref(), query).await }
                },
            ),
        );
    }
    for endpoint in config::ENDPOINTS {
        let mut handler = endpoint_handler(endpoint);
        // The last layer added runs first: add them in reverse so the first route is checked
        // first.
        for (path, layer) in layers.iter().rev() {
            if config::covers(path, endpoint) {
                handler = handler.route_layer(layer.clone());
            }
        }
        app = app.route(endpoint, handler);
    }
    // Never limited (see `config::ENDPOINTS`).
    // The reset watch, if any, lives as long as a clone of the router does.
    let health = move || {
        let _watch = &reset_watch;
        health()
    };
    Ok(app.route("/health", get(health)).route(
        "/metrics",
        get(move || {
            let text = metrics.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
        }),
    ))
}

/// The admin route's state: its token, and each policy's resetter by name.
struct Admin<St> {
    token: Vec<u8>,
    policies: HashMap<String, (ClientKind, Resetter<St>)>,
}

/// How a policy names a client: what `POST /admin/reset` needs besides the policy.
#[derive(Clone, Copy)]
enum ClientKind {
    /// By address: `ip`.
    Ip,
    /// By a header's value: `client`.
    Value,
    /// One count for everyone: nothing more.
    Everyone,
}

impl ClientKind {
    /// What a reset under `policy`, which names its clients so, needs in its query.
    fn needs(self, policy: &str) -> String {
        match self {
            ClientKind::Ip => {
                format!("{policy:?} counts per client IP: give ip=ADDR (and no client)")
            }
            ClientKind::Value => format!(
                "{policy:?} counts per header value: give client=VALUE, not empty (and no ip)"
            ),
            ClientKind::Everyone => {
                format!("{policy:?} has one count for everyone: give neither ip nor client")
            }
        }
    }
}

/// The query of `POST /admin/reset`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetParams {
    policy: String,
    /// Only whether it is there: its value is read as bytes from the raw query
    /// ([`client_value`]), since decoding it as text would replace every byte that is not UTF-8.
    #[serde(default)]
    client: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    ip: Option<String>,
}

/// The value of `query`'s `client` parameter as the bytes it encodes (`+` a space, `%XX` a byte),
/// UTF-8 or not; empty if there is none. `Query` has read the query already, so `client` is in it
/// at most once.
fn client_value(query: &str) -> Vec<u8> {
    let decoded = |s: &str| -> Vec<u8> {
        let spaced: Vec<u8> = s
            .bytes()
            .map(|b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&spaced).collect()
    };
    query
        .split('&')
        .find_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decoded(name) == b"client").then(|| decoded(value))
        })
        .unwrap_or_default()
}

/// An answer of the admin route: a status and one line of text.
fn answer(status: StatusCode, text: impl Into<String>) -> axum::response::Response {
    let mut text = text.into();
    text.push('\n');
    (status, text).into_response()
}

impl<St> Admin<St>
where
    St: Reset,
    St::Error: std::error::Error + 'static,
{
    /// `POST /admin/reset?policy=NAME` with `&ip=ADDR` (a policy keyed by client IP) or
    /// `&client=VALUE` (keyed by a header), and `Authorization: Bearer <token>`: forgets the
    /// client's count under every limit of the policy.
    async fn reset(
        &self,
        headers: &HeaderMap,
        raw_query: Option<&str>,
        query: Result<Query<ResetParams>, QueryRejection>,
    ) -> axum::response::Response {
        if !self.authorized(headers) {
            let mut res = answer(StatusCode::UNAUTHORIZED, "an admin token is needed");
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"admin\""),
            );
            return res;
        }
        let Query(params) = match query {
            Ok(q) => q,
            Err(e) => return answer(StatusCode::BAD_REQUEST, e.body_text()),
        };
        let Some((kind, resetter)) = self.policies.get(&params.policy) else {
            return answer(
                StatusCode::NOT_FOUND,
                format!("no route's policy is named {:?}", params.policy),
            );
        };
        // The client value as the bytes the query encodes: decoded as text, each byte that is
        // not UTF-8 (a header value may hold any from 0x80 up) became U+FFFD, and the reset
        // named a client no request has, or another one. Without the ASCII
        // whitespace around it, as the policy keys the header's (`header_value_trimmed`; of
        // that, a header value can hold spaces and tabs only).
        let client = params
            .client
            .as_ref()
            .map(|_| client_value(raw_query.unwrap_or_default()));
        let client = client.as_deref().map(<[u8]>::trim_ascii);
        let done = match (kind, params.ip, client) {
            (ClientKind::Ip, Some(ip), None) => match ip.parse::<std::net::IpAddr>() {
                Ok(addr) => {
                    tracing::info!(policy = %params.policy, ip = %addr, "admin reset");
                    resetter.reset_ip(addr).await
                }
                Err(_) => {
                    return answer(
                        StatusCode::BAD_REQUEST,
                        format!("ip: {ip:?} is not an IP address"),
                    );
                }
            },
            (ClientKind::Value, None, Some(client)) if !client.is_empty() => {
                // The value is a client's credential (an API key): not logged.
                tracing::info!(policy = %params.policy, "admin reset of a client");
                resetter.reset_client(client).await
            }
            (ClientKind::Everyone, None, None) => {
                tracing::info!(policy = %params.policy, "admin reset of the shared count");
                // The one key every request has: any request's.
                let any = axum::http::Request::new(());
                resetter
                    .reset(&tower_ratelimit::RequestHead::of(&any))
                    .await
            }
            (kind, ..) => {
                return answer(StatusCode::BAD_REQUEST, kind.needs(&params.policy));
            }
        };
        match done {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(e @ ResetError::NoKey) => answer(StatusCode::BAD_REQUEST, e.to_string()),
            Err(e) => {
                tracing::warn!(policy = %params.policy, error = %e, "admin reset failed");
                answer(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }

    /// Whether `headers` hold `Authorization: Bearer <token>` (the scheme in any case, one or
    /// more spaces after it, as RFC 9110 allows), compared in a time that does not depend on
    /// where a wrong token first differs.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(given) = headers.get(header::AUTHORIZATION).and_then(|v| {
            let (scheme, rest) = v.as_bytes().split_at_checked(b"Bearer ".len())?;
            scheme
                .eq_ignore_ascii_case(b"Bearer ")
                .then(|| rest.trim_ascii_start())
        }) else {
            return false;
        };
        given.len() == self.token.len()
            && given
                .iter()
                .zip(&self.token)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

/// The handlers of one endpoint.
fn endpoint_handler(endpoint: &str) -> MethodRouter {
    match endpoint {
        "/login" => post(login),
        "/api/items" => get(list_items).post(create_item),
        _ => get(show_item),
    }
}

async fn login() -> impl IntoResponse {
    "logged in (this example checks no password)\n"
}

async fn list_items() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        "[{\"id\":1,\"name\":\"apple\"},{\"id\":2,\"name\":\"pear\"}]\n",
    )
}

async fn create_item() -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        "{\"id\":3}\n",
    )
}

async fn show_item(Path(id): Path<u64>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{{\"id\":{id}}}\n"),
    )
}

async fn health() -> impl IntoResponse {
    "ok\n"
}

/// Route `i`'s policy: the data from its `policy` table, the key, the cost and the tier
/// resolver from the rest of the route.
fn policy(config: &Config, i: usize) -> Result<Policy, ConfigError> {
    let route = &config.routes[i];
    let at = format!("routes[{i}]");
    let policy = route
        .policy
        .clone()
        .into_policy()
        .map_err(|e| config::policy_error(&format!("{at}.policy"), e))?;

    let policy = match &route.key {
        config::KeyConfig::Ip {
            trusted_proxies,
            forwarded_header,
            ipv6_prefix,
        } => {
            let header = match forwarded_header.unwrap_or_default() {
                config::ForwardedHeaderConfig::XForwardedFor => ForwardedHeader::XForwardedFor,
                config::ForwardedHeaderConfig::Forwarded => ForwardedHeader::Forwarded,
                config::ForwardedHeaderConfig::Both => ForwardedHeader::Both,
            };
            let client_ip = ClientIp::behind_proxies(trusted_proxies)
                .map_err(|e| ConfigError::new(format!("{at}.key.trusted_proxies"), e))?
                .header(header)
                .ipv6_prefix(*ipv6_prefix)
                .map_err(|e| ConfigError::new(format!("{at}.key.ipv6_prefix"), e))?;
            policy.key(ClientIpKey::new(client_ip))
        }
        config::KeyConfig::Header { name } => policy.key(
            ApiKeyHeader::new(name).map_err(|e| ConfigError::new(format!("{at}.key.name"), e))?,
        ),
        config::KeyConfig::Global {} => policy.key(GlobalKey),
    };

    let policy = if route.cost_by_method.is_empty() && route.cost == 1 {
        policy
    } else {
        let mut by_method: Vec<(Method, u64)> = route
            .cost_by_method
            .iter()
            .map(|(m, c)| {
                Method::from_bytes(m.as_bytes())
                    .map(|m| (m, *c))
                    .map_err(|e| {
                        let m = config::shown_method(m);
                        ConfigError::new(format!("{at}.cost_by_method.{m}"), e)
                    })
            })
            .collect::<Result<_, _>>()?;
        // A HEAD request runs the GET handler (axum answers it so): it costs what a GET does,
        // unless HEAD has a cost of its own.
        if let Some(&(_, get)) = by_method.iter().find(|(m, _)| *m == Method::GET)
            && !by_method.iter().any(|(m, _)| *m == Method::HEAD)
        {
            by_method.push((Method::HEAD, get));
        }
        let default = route.cost;
        policy.cost(move |req| {
            by_method
                .iter()
                .find(|(m, _)| m == req.method())
                .map_or(default, |(_, c)| *c)
        })
    };

    if route.policy.tiers.is_empty() {
        return Ok(policy);
    }
    let config::KeyConfig::Header { name } = &route.key else {
        return Err(ConfigError::new(
            format!("{at}.key.source"),
            "must be \"header\" for a route with tiers",
        ));
    };
    // API key -> tier, for the tiers this route has.
    let tiers: HashMap<Vec<u8>, String> = config
        .api_keys
        .iter()
        .filter(|(_, tier)| route.policy.tiers.iter().any(|t| t.name == **tier))
        .map(|(key, tier)| (key.as_bytes().to_vec(), tier.clone()))
        .collect();
    let header = axum::http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| ConfigError::new(format!("{at}.key.name"), e))?;
    // The names borrow from the table, which the policy keeps and lends with each request.
    // The key as the route's `ApiKeyHeader` reads it (without spaces and tabs around it, which
    // an HTTP/2 client may send), so that a key counted under a client's bucket gets its tier.
    Ok(policy.resolve_tier_with(tiers, move |tiers, req| {
        let key = req.headers().get(&header)?;
        tiers
            .get(tower_ratelimit::key::header_value_trimmed(key))
            .map(String::as_str)
    }))
}
