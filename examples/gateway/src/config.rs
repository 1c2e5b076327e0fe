//! The gateway's configuration file: where to listen, which store, which API key has which
//! tier, and one rate-limit policy per route. Every field is described in
//! `docs/configuration.md`.
//!
//! Loading is strict: an unknown field, a value of the wrong type or a setting out of range stops
//! the gateway at start with a message naming the field, such as
//!
//! ```text
//! routes[1].policy.quotas[0].per: unknown variant `minutes`, expected one of `second`, `minute`, `hour`, `day` (line 29, column 30)
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, Quota};
use serde::Deserialize;
use tower_ratelimit::config::{FailureConfig, MissingKeyConfig, PolicyConfig, QuotaConfig};

/// The gateway's endpoints that a route's `path` can cover. `/health` and `/metrics` are never
/// limited: a load balancer's health check answered 429 or 503 would take the gateway out of
/// service, and a scrape would leave a gap in the figures.
pub const ENDPOINTS: [&str; 3] = ["/login", "/api/items", "/api/items/{id}"];

/// The methods each endpoint of [`ENDPOINTS`] serves (`HEAD` with `GET`); any other is answered
/// `405` before a route's layer, and never counted.
#[must_use]
pub fn methods(endpoint: &str) -> &'static [&'static str] {
    match endpoint {
        "/login" => &["POST"],
        "/api/items" => &["GET", "HEAD", "POST"],
        "/api/items/{id}" => &["GET", "HEAD"],
        _ => &[],
    }
}

/// A configuration that cannot be used: the field (`routes[1].policy.quotas[0].per`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the problem is, as a path into the file (empty for the file as a whole).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, message: impl fmt::Display) -> Self {
        ConfigError {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to listen (default `127.0.0.1:8080`); the `--listen` flag overrides it.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How long Ctrl-C or SIGTERM waits for the requests in flight before the gateway exits
    /// anyway (default 30,000 ms; at most an hour): a client that stalls mid-request cannot hold
    /// a shutdown for ever.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// Where the counters live (default: in this process's memory).
    #[serde(default)]
    pub store: StoreConfig,
    /// API key to tier name. A route with tiers looks the request's API key up here; keys not
    /// listed get the route's own limit.
    #[serde(default)]
    pub api_keys: BTreeMap<String, String>,
    /// The rate-limited routes, checked in this order.
    pub routes: Vec<RouteConfig>,
    /// The operators' route, `POST /admin/reset`, which forgets a client's count (absent: the
    /// gateway has no such route).
    #[serde(default)]
    pub admin: Option<AdminConfig>,
}

/// The fewest bytes an admin token may have: 16 (128 bits if drawn at random, as
/// `openssl rand -hex 16` draws 32 hexadecimal digits), too many to guess through the route.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// Where the admin route's token comes from: an environment variable or a file (such as a
/// container's secret), read at start. Exactly one of the two.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The name of the environment variable that holds the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// A file that holds the token (a relative path from the working directory; one newline at
    /// its end is not part of the token).
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
}

impl AdminConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        match (&self.token_env, &self.token_file) {
            (Some(_), Some(_)) | (None, None) => Err(ConfigError::new(
                "admin",
                "give the token's source: token_env or token_file (one of them)",
            )),
            (Some(name), None) if name.is_empty() || name.contains(['=', '\0']) => {
                Err(ConfigError::new(
                    "admin.token_env",
                    "must be the name of an environment variable (not empty, without '=')",
                ))
            }
            _ => Ok(()),
        }
    }

    /// The token, read from its source. The errors name the source, never the token.
    pub fn token(&self) -> Result<Vec<u8>, ConfigError> {
        let (field, token) = match (&self.token_env, &self.token_file) {
            (Some(name), _) => {
                let field = "admin.token_env";
                // The name is not shown: a token written in its place would be.
                let value = std::env::var_os(name).ok_or_else(|| {
                    ConfigError::new(field, "the environment variable it names is not set")
                })?;
                (field, value.into_encoded_bytes())
            }
            (None, Some(path)) => {
                let field = "admin.token_file";
                // The path is not shown either: a token written in its place would be.
                let mut bytes = read_capped(path).map_err(|e| {
                    ConfigError::new(field, format!("cannot read the file it names: {e}"))
                })?;
                if bytes.ends_with(b"\r\n") {
                    bytes.truncate(bytes.len() - 2);
                } else if bytes.ends_with(b"\n") {
                    bytes.pop();
                }
                (field, bytes)
            }
            (None, None) => return Err(ConfigError::new("admin", "no token source")),
        };
        // What a client can send after `Bearer ` in a header: visible ASCII, no spaces.
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::new(
                field,
                "the token must be visible ASCII characters without spaces",
            ));
        }
        if token.len() < MIN_ADMIN_TOKEN_BYTES {
            return Err(ConfigError::new(
                field,
                format!(
                    "the token has {} bytes, fewer than {MIN_ADMIN_TOKEN_BYTES} (draw one with \
                     `openssl rand -hex 16`)",
                    token.len()
                ),
            ));
        }
        Ok(token)
    }
}

/// Which store, and the settings every route's layer shares.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory`, `redis` or `redis_cluster`.
    #[serde(default)]
    pub kind: StoreKind,
    /// The Redis URL (`kind = "redis"`).
    #[serde(default)]
    pub url: Option<String>,
    /// URLs of one or more cluster nodes (`kind = "redis_cluster"`).
    #[serde(default)]
    pub urls: Vec<String>,
    /// The prefix of every Redis key (default `rl`; see [`StoreConfig::prefix`]).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Multiplexed Redis connections (default 1, `ratelimit_redis::DEFAULT_POOL_SIZE`).
    #[serde(default)]
    pub pool_size: Option<usize>,
    /// How long opening a Redis connection may take, in milliseconds (default 1000,
    /// `ratelimit_redis::DEFAULT_CONNECT_TIMEOUT`).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// How long one check may take before it counts as a store failure, in milliseconds
    /// (default 50).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Milliseconds added to every Redis key's expiry (default 0: a key expires as soon as its
    /// state is fresh again; `ratelimit_redis::RedisStoreBuilder::expiry_slack`). A few seconds
    /// spare Redis the expiry and re-creation of the keys of clients that come back within them,
    /// which sets the tail latency of a busy server (docs/operations.md), for that much longer
    /// in memory per idle key. No decision changes: an expired key and a fresh one answer alike.
    #[serde(default)]
    pub expiry_slack_ms: Option<u64>,
    /// Milliseconds a Redis connection may sit idle before the next check on it is preceded by a
    /// `PING` (default 10000; `ratelimit_redis::RedisStoreBuilder::ping_after_idle`): a
    /// connection that Redis's `timeout`, a proxy or a load balancer closed while idle is found
    /// so by the `PING` and replaced, instead of failing the check written on it. Set it below
    /// the shortest idle limit between the gateway and Redis; 0 sends a `PING` before every check.
    #[serde(default)]
    pub ping_after_idle_ms: Option<u64>,
    /// A PEM file of the certificates to trust as roots for `rediss://` servers, instead of the
    /// system's: for a Redis whose certificate comes from a private CA (`rediss://` URLs; the
    /// gateway's `tls` feature for `kind = "redis"`, `tls-rustls` for either kind). Read at
    /// start; a relative path is taken from the working directory.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// A PEM file of the certificate the gateway presents to a Redis that asks for one
    /// (`tls-auth-clients yes`, Redis's default with TLS), with `tls_client_key_file`; the same
    /// kinds and features as `tls_ca_file`. Read at start.
    #[serde(default)]
    pub tls_client_cert_file: Option<std::path::PathBuf>,
    /// A PEM file of the private key of `tls_client_cert_file` (PKCS#8 with `tls`; `tls-rustls`
    /// also takes PKCS#1 and SEC1). Read at start.
    #[serde(default)]
    pub tls_client_key_file: Option<std::path::PathBuf>,
    /// Start even if Redis cannot be reached (default false: the gateway refuses to start).
    /// Until a connection is made, every check is a store failure answered by the route's
    /// failure policy; the gateway keeps trying to connect, once a second.
    #[serde(default)]
    pub start_without_redis: bool,
    /// The most keys the in-memory store holds (default 1,000,000; `kind = "memory"`).
    #[serde(default)]
    pub max_keys: Option<usize>,
    /// Stop asking a failing store for a while.
    #[serde(default)]
    pub circuit_breaker: BreakerConfig,
    /// Answer a client that Redis denied from this gateway's memory until its wait is over,
    /// instead of asking Redis again at each of its requests (`ratelimit_core::DenialCache`;
    /// default false). Exact: a denial stands until its `Retry-After`, whatever other gateways
    /// do meanwhile, since no check gives units back.
    #[serde(default)]
    pub denial_cache: bool,
    /// End this gateway's cached denials of a client as soon as any process resets the client
    /// through Redis with its resets announced (`ratelimit_redis::RedisStore::watch_resets`;
    /// default false): a client an admin tool lets back in is let in here at once, not at the
    /// end of its cached wait. Needs `denial_cache`.
    #[serde(default)]
    pub watch_resets: bool,
    /// Merge the checks of one key that arrive while one of them is on its way to Redis into
    /// one script call (`ratelimit_redis::Coalescing`; default false). Exact: the checks are
    /// decided in order at the instant the call runs.
    #[serde(default)]
    pub coalesce: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Memory,
            url: None,
            urls: Vec::new(),
            prefix: None,
            pool_size: None,
            connect_timeout_ms: None,
            expiry_slack_ms: None,
            ping_after_idle_ms: None,
            tls_ca_file: None,
            tls_client_cert_file: None,
            tls_client_key_file: None,
            timeout_ms: default_timeout_ms(),
            start_without_redis: false,
            max_keys: None,
            circuit_breaker: BreakerConfig::default(),
            denial_cache: false,
            watch_resets: false,
            coalesce: false,
        }
    }
}

/// Where the counters live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// In this process: each gateway counts alone.
    #[default]
    Memory,
    /// One Redis server, shared by every gateway.
    Redis,
    /// A Redis Cluster, shared by every gateway.
    RedisCluster,
}

/// The circuit breaker, a circuit per failure domain of the store (one for a single Redis
/// server, 64 ranges of hash slots for a cluster): after `failures` failures in a row of its
/// keys (each within `cool_down_ms` of the one before), a circuit does not ask the store for
/// `cool_down_ms` (the failure policy answers at once), then tries one request.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Whether to use one (default true).
    pub enabled: bool,
    /// Failures in a row (of one circuit's keys, each within `cool_down_ms` of the one before)
    /// that open a circuit (default 5).
    pub failures: u32,
    /// How long it stays open, in milliseconds (default 10000).
    pub cool_down_ms: u64,
    /// A circuit per failure domain of the store (a Redis Cluster's ranges of hash slots), or
    /// one for the whole store (default true).
    pub per_failure_domain: bool,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            failures: 5,
            cool_down_ms: 10_000,
            per_failure_domain: true,
        }
    }
}

/// One rate-limited route: which endpoints, who is counted, what a request costs, and the
/// policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// A path prefix, whole segments: `/api` covers `/api/items` and `/api/items/{id}`, `/`
    /// covers every endpoint.
    pub path: String,
    /// Who a request counts against (default: the client IP).
    #[serde(default)]
    pub key: KeyConfig,
    /// What a request costs (default 1).
    #[serde(default = "default_cost")]
    pub cost: u64,
    /// What a request costs by HTTP method, overriding `cost` (`{ POST = 5 }`). `HEAD` costs what
    /// `GET` does unless given its own.
    #[serde(default)]
    pub cost_by_method: BTreeMap<String, u64>,
    /// The policy: name, algorithm, quotas, tiers, headers, body, failure policy, dry run.
    pub policy: PolicyConfig,
}

/// Who a request counts against. A setting of another source is refused (`unknown field`), and a
/// value of the wrong type is reported at its own field (`key.ipv6_prefix`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "KeyTable")]
pub enum KeyConfig {
    /// The client's IP address: the TCP peer, or behind trusted proxies the address they saw.
    Ip {
        /// Proxies whose forwarding header is believed (CIDR blocks or addresses; default none).
        trusted_proxies: Vec<String>,
        /// Which header the trusted proxies append to (default `x_forwarded_for`). Only with
        /// `trusted_proxies`: the header is read from no one else.
        forwarded_header: Option<ForwardedHeaderConfig>,
        /// IPv6 clients are grouped by this prefix length (default 64).
        ipv6_prefix: u8,
    },
    /// The value of a request header, such as an API key.
    Header {
        /// The header name (`x-api-key`).
        name: String,
    },
    /// One key for every request: the route is limited as a whole (a stray setting next to it,
    /// such as `name`, is refused instead of silently ignored).
    Global {},
}

/// A key table as written: every source's settings, matched to the `source` by `TryFrom`. (Read as
/// an internally tagged enum, the table would be buffered before its fields are read, and
/// `serde_path_to_error` would name the table only, not the field whose value is wrong.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyTable {
    source: KeySource,
    trusted_proxies: Option<Vec<String>>,
    forwarded_header: Option<ForwardedHeaderConfig>,
    ipv6_prefix: Option<u8>,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum KeySource {
    Ip,
    Header,
    Global,
}

impl TryFrom<KeyTable> for KeyConfig {
    type Error = String;

    fn try_from(t: KeyTable) -> Result<Self, String> {
        let (source, allowed): (&str, &[&str]) = match t.source {
            KeySource::Ip => (
                "ip",
                &["trusted_proxies", "forwarded_header", "ipv6_prefix"],
            ),
            KeySource::Header => ("header", &["name"]),
            KeySource::Global => ("global", &[]),
        };
        for (field, set) in [
            ("trusted_proxies", t.trusted_proxies.is_some()),
            ("forwarded_header", t.forwarded_header.is_some()),
            ("ipv6_prefix", t.ipv6_prefix.is_some()),
            ("name", t.name.is_some()),
        ] {
            if set && !allowed.contains(&field) {
                let takes = if allowed.is_empty() {
                    "no setting".to_owned()
                } else {
                    let names: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
                    names.join(", ")
                };
                return Err(format!(
                    "unknown field `{field}`: source \"{source}\" takes {takes}"
                ));
            }
        }
        Ok(match t.source {
            KeySource::Ip => KeyConfig::Ip {
                trusted_proxies: t.trusted_proxies.unwrap_or_default(),
                forwarded_header: t.forwarded_header,
                ipv6_prefix: t.ipv6_prefix.unwrap_or_else(default_ipv6_prefix),
            },
            KeySource::Header => KeyConfig::Header {
                name: t.name.ok_or("missing field `name` (source \"header\")")?,
            },
            KeySource::Global => KeyConfig::Global {},
        })
    }
}

impl Default for KeyConfig {
    fn default() -> Self {
        KeyConfig::Ip {
            trusted_proxies: Vec::new(),
            forwarded_header: None,
            ipv6_prefix: default_ipv6_prefix(),
        }
    }
}

/// The header trusted proxies append the client address to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardedHeaderConfig {
    /// `X-Forwarded-For`.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239).
    Forwarded,
    /// `Forwarded` if present, else `X-Forwarded-For`.
    Both,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
/// The longest timeout or cool-down a configuration may set: one hour.
const MAX_MS: u64 = 3_600_000;

/// Why a TLS setting is refused by a gateway built without its `tls` feature.
const NO_TLS: &str = "rediss:// (TLS) needs the gateway built with its `tls` feature \
                      (cargo run -p example-gateway --features tls), which builds against OpenSSL, \
                      or its `tls-rustls` feature (rustls)";

/// The longest `store.expiry_slack_ms`: a day (an idle key then stays at most a day longer).
const MAX_SLACK_MS: u64 = 86_400_000;

fn default_timeout_ms() -> u64 {
    50
}
fn default_shutdown_timeout_ms() -> u64 {
    30_000
}
fn default_cost() -> u64 {
    1
}
fn default_ipv6_prefix() -> u8 {
    64
}

impl Config {
    /// Parses and checks a configuration, or says which field is wrong.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config = Config::parse(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a configuration, not yet checked.
    fn parse(text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error("", &e, text))?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let mut field = e.path().to_string();
            // An unknown field's path may end with the field. One that may be a secret (see
            // `hide_unknown_names`) is left out: the path is the table it was found in.
            if let Some(parent) = unknown_field(e.inner().message())
                .filter(|name| !could_be_misspelt(name))
                .and_then(|name| field.strip_suffix(name))
                // At the top level the path is the name alone: no table to name.
                .and_then(|parent| parent.strip_suffix('.').or(parent.is_empty().then_some("")))
            {
                field = parent.to_owned();
            }
            // A string of the wrong type under `store` (`urls = "redis://:pw@…"` where an
            // array belongs), `api_keys` (`api_keys = "sk_live_…"`), `admin` (`admin = "<the
            // token>"`) or a route's `missing_key` (`reject = "sk_live_…"`, a key pasted where
            // its shared key was meant) may be a password, a key or the admin token: serde's
            // message quotes it whole, so it is not shown.
            let secret = ["store", "api_keys", "admin"].iter().any(|table| {
                field
                    .strip_prefix(table)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            }) || field.split('.').any(|part| part == "missing_key");
            let field = match field.strip_prefix("api_keys.") {
                _ if field == "." => String::new(),
                Some(key) => format!("api_keys.{}", redact_key(key.trim_matches('"'))),
                // A method's name is the file's own text too (an API key pasted below a
                // `[routes.cost_by_method]` table belongs to it).
                None => match field.split_once(".cost_by_method.") {
                    Some((route, method)) => {
                        format!("{route}.cost_by_method.{}", shown_method(method))
                    }
                    None => field,
                },
            };
            let mut error = toml_error(&field, e.inner(), text);
            if secret {
                error.message = hide_strings(&error.message);
            }
            error
        })?;
        Ok(config)
    }

    /// Reads, parses and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_redis(path, None)
    }

    /// [`load`](Config::load), with `redis_url` (the command line's `--redis`) as the `url` of
    /// a `kind = "redis"` store, whether the file gives one or not (so that a URL holding a
    /// password can stay out of the file). Not applied to another kind of store, whose check
    /// is the caller's.
    pub fn load_with_redis(path: &Path, redis_url: Option<&str>) -> Result<Config, ConfigError> {
        let text = read_capped(path)
            .and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "stream did not contain valid UTF-8",
                    )
                })
            })
            .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
        let mut config = Config::parse(&text)?;
        if let Some(url) = redis_url
            && config.store.kind == StoreKind::Redis
        {
            config.store.url = Some(url.to_owned());
        }
        config.validate()?;
        Ok(config)
    }

    /// What a valid configuration may not mean to do, one line each (printed at start and by
    /// `--check`): a cost that each gateway's fallback share cannot admit, so that every such
    /// request is denied while the store is down (a shared store's only: the memory store
    /// cannot be down).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let can_fail = self.store.kind != StoreKind::Memory;
        for (i, route) in self.routes.iter().enumerate() {
            let _ = route.validate(&format!("routes[{i}]"), can_fail, &mut warnings);
            // Compared as `covers` matches them: "/api/" covers what "/api" does.
            let same =
                |r: &RouteConfig| r.path.trim_end_matches('/') == route.path.trim_end_matches('/');
            if let Some(j) = self.routes[..i].iter().position(same) {
                warnings.push(format!(
                    "routes[{i}].path: {:?} is routes[{j}]'s path too: each request there goes \
                     through both routes' limits, routes[{j}]'s first (a second route does not \
                     replace the first)",
                    route.path
                ));
            }
        }
        warnings
    }

    /// Checks what the types cannot: ranges, combinations, references between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shutdown_timeout_ms == 0 || self.shutdown_timeout_ms > MAX_MS {
            return Err(ConfigError::new(
                "shutdown_timeout_ms",
                "must be between 1 and 3600000 (one hour)",
            ));
        }
        self.store.validate()?;
        if let Some(admin) = &self.admin {
            admin.validate()?;
        }
        if self.routes.is_empty() {
            return Err(ConfigError::new("routes", "at least one route is needed"));
        }
        for (i, route) in self.routes.iter().enumerate() {
            route.validate(&format!("routes[{i}]"), true, &mut Vec::new())?;
            let name = &route.policy.name;
            if let Some(j) = self.routes[..i].iter().position(|r| r.policy.name == *name) {
                return Err(ConfigError::new(
                    format!("routes[{i}].policy.name"),
                    format!("the name {name:?} is already used by routes[{j}]"),
                ));
            }
            // A request under two routes carries both routes' IETF items, unless one's item
            // names another's: then the outer route's items are left out (the same policy
            // twice, to the layer), and a client would read the inner route's as the other's.
            let items = item_names(&route.policy);
            for (j, other) in self.routes[..i].iter().enumerate() {
                if let Some(item) = item_names(&other.policy)
                    .into_iter()
                    .find(|item| items.contains(item))
                {
                    return Err(ConfigError::new(
                        format!("routes[{i}].policy.name"),
                        format!(
                            "the name {name:?} and routes[{j}]'s {:?} both name an item \
                             {item:?} in the RateLimit headers (a policy of several quotas \
                             names one item per quota, <name>.0, <name>.1, ...): a client \
                             could not tell them apart",
                            other.policy.name
                        ),
                    ));
                }
            }
        }
        let mut tiers: Vec<&str> = self
            .routes
            .iter()
            .flat_map(|r| r.policy.tiers.iter().map(|t| t.name.as_str()))
            .collect();
        tiers.sort_unstable();
        tiers.dedup();
        for (key, tier) in &self.api_keys {
            if key.is_empty() {
                return Err(ConfigError::new("api_keys", "an API key cannot be empty"));
            }
            // A header value never starts or ends with whitespace (the server trims it) and holds
            // no control characters: such a key could never match, and its tier never apply.
            if key.starts_with([' ', '\t'])
                || key.ends_with([' ', '\t'])
                || key.contains(char::is_control)
            {
                return Err(ConfigError::new(
                    format!("api_keys.{}", redact_key(key)),
                    "an API key cannot start or end with whitespace or hold control characters \
                     (no request's header could carry it)",
                ));
            }
            if !tiers.contains(&tier.as_str()) {
                // The value is not echoed: a table written the wrong way round (`"pro" =
                // "sk_live_…"`) has the secret there.
                return Err(ConfigError::new(
                    format!("api_keys.{}", redact_key(key)),
                    format!(
                        "names a tier that no route defines (the tiers are: {})",
                        if tiers.is_empty() {
                            "none".to_owned()
                        } else {
                            tiers
                                .iter()
                                .map(|t| format!("{t:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// An API key as error messages show it: a secret, so only its first few characters (at most
/// half of them, and 4), escaped and quoted: `"sk_l…"`.
fn redact_key(key: &str) -> String {
    let shown: String = key.chars().take((key.chars().count() / 2).min(4)).collect();
    format!("\"{}…\"", shown.escape_debug())
}

/// `message` with every string serde quotes in it (`invalid type: string "…", expected …`)
/// replaced by `a string`. A quote inside the string is escaped (`\"`), so the first unescaped
/// quote ends it.
fn hide_strings(message: &str) -> String {
    const OPEN: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        out.push_str("a string");
        let quoted = &rest[at + OPEN.len()..];
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| match c {
            '\\' if !escaped => {
                escaped = true;
                None
            }
            '"' if !escaped => Some(i + 1),
            _ => {
                escaped = false;
                None
            }
        });
        // Unterminated: the rest is the string.
        rest = end.map_or("", |end| &quoted[end..]);
    }
    out.push_str(rest);
    out
}

/// The most bytes a file the gateway reads at start (its configuration, the admin token, a PEM
/// file) may hold: 16 MiB. Each is a few KiB; a path to `/dev/zero`, a device or a growing log
/// would otherwise be read until memory runs out, the gateway never starting nor saying why.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The file at `path`, refused (`InvalidData`) past [`MAX_FILE_BYTES`].
pub(crate) fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} MiB", MAX_FILE_BYTES >> 20),
        ));
    }
    Ok(bytes)
}

/// A `cost_by_method` key as an error names it: whole if it could be a method, misspelt or in
/// the wrong case (letters and `-` in one case, 32 at most: `PSOT`, `post`); else, as it may be
/// an API key pasted in the wrong place, by its first characters, as an API key is shown.
pub(crate) fn shown_method(method: &str) -> String {
    let one_case = method.bytes().all(|b| b.is_ascii_uppercase() || b == b'-')
        || method.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    if !method.is_empty() && method.len() <= 32 && one_case {
        method.to_owned()
    } else {
        redact_key(method.trim_matches('"'))
    }
}

/// The names an error message quotes from the file as unknown: serde's `unknown field `…`` and
/// `unknown variant `…``. (toml's `duplicate key` does not quote the key.)
const QUOTED_NAMES: [&str; 2] = ["unknown field `", "unknown variant `"];

/// How the key and failure tables' messages go on after the setting they quote as unknown (a
/// setting of another source or mode): `` unknown field `name`: source "ip" takes … ``.
const OWN_MESSAGES: [&str; 2] = ["`: source \"", "`: mode \""];

/// Where the name quoted at the start of `quoted` ends: where the message goes on (serde's
/// `` `, expected … `` or `` `, there are no … ``; the key and failure tables' `` `: source "ip"
/// takes `a`, `b` ``), else at its last backtick. The last such place, not the first: the names
/// listed after it are known ones, which hold none of these, while a name written in the file
/// may hold any of them, and ended early it would show the rest of itself as the message.
fn quoted_name_end(quoted: &str) -> usize {
    ["`, expected ", "`, there are no ", "`: "]
        .iter()
        .filter_map(|goes_on| quoted.rfind(goes_on))
        .max()
        .or_else(|| quoted.rfind('`'))
        .unwrap_or(quoted.len())
}

/// The field name an `unknown field` message quotes.
fn unknown_field(message: &str) -> Option<&str> {
    let quoted = &message[message.find(QUOTED_NAMES[0])? + QUOTED_NAMES[0].len()..];
    Some(&quoted[..quoted_name_end(quoted)])
}

/// Whether a name the file wrote could be a misspelt name of this file's, and so may be shown
/// whole: lowercase letters, `_` and `-`, 32 characters at most. An API key or a password
/// almost always holds a digit or a capital (a random key of 20 characters of 62 kinds holds
/// neither about once in 35 million).
fn could_be_misspelt(name: &str) -> bool {
    name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '-')
}

/// `message` with each name it quotes from the file as unknown shown whole only if
/// it [could be misspelt](could_be_misspelt). Any other may be an API key or a password written
/// in the wrong place (a key pasted below the last table belongs to that table; a URL as
/// `kind`), and is shown as an API key is, by its first characters.
fn hide_unknown_names(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((at, open)) = QUOTED_NAMES
        .iter()
        .filter_map(|open| rest.find(open).map(|at| (at, open.len())))
        .min()
    {
        let start = at + open;
        out.push_str(&rest[..start]);
        let quoted = &rest[start..];
        let end = quoted_name_end(quoted);
        let name = &quoted[..end];
        let meant = meant_variant(name, &quoted[end..]);
        // The key and failure tables' own messages quote a setting of theirs, never the file's
        // text (`ipv6_prefix`, which holds a digit, included).
        let own = OWN_MESSAGES.iter().any(|m| quoted[end..].starts_with(m));
        if could_be_misspelt(name) || meant.is_some() || own {
            out.push_str(name);
        } else {
            out.push_str(redact_key(name.trim_matches('"')).trim_matches('"'));
        }
        rest = &quoted[end..];
        if let Some(meant) = meant {
            // After the list of expected names, which runs to the end of serde's message.
            out.push_str(rest);
            out.push_str(&format!(
                ": names are lowercase, with `_` between words; did you mean `{meant}`?"
            ));
            rest = "";
        }
    }
    out.push_str(rest);
    out
}

/// The name `name` meant, if `after` (what follows it in serde's message: `` `, expected one
/// of `a`, `b` ``) lists one that `name` spells in another case, or with `-` for `_` (`Minute`,
/// `Redis-Cluster`): a known name, so no secret.
fn meant_variant<'m>(name: &str, after: &'m str) -> Option<&'m str> {
    let list = after.strip_prefix("`, expected ")?;
    let wanted = name.to_ascii_lowercase().replace('-', "_");
    // The names are the backticked parts: every other piece of the split.
    list.split('`')
        .skip(1)
        .step_by(2)
        .find(|&known| known == wanted)
}

/// How the `toml` crate passes a date or time: as a table of one key of this name, which the
/// file never wrote.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// `message`, or, if it refuses the key a date or time comes as (a date where a table belongs:
/// `failure = 1979-05-27`), what it is: `` invalid type: a date or time, expected a table of one
/// of `mode`, … `` rather than an unknown field the file never wrote.
fn date_for_table(message: &str) -> std::borrow::Cow<'_, str> {
    let quoted = format!("{}{TOML_DATETIME_KEY}`", QUOTED_NAMES[0]);
    let Some(at) = message.find(&quoted) else {
        return message.into();
    };
    // serde's list of the names the table takes, if it gave one.
    let table = match message[at + quoted.len()..].strip_prefix(", expected ") {
        Some(expected) => format!("a table of {expected}"),
        None => "a table".to_owned(),
    };
    format!(
        "{}invalid type: a date or time, expected {table}",
        &message[..at]
    )
    .into()
}

/// `field: message (line L, column C)`, from one of toml's errors.
fn toml_error(field: &str, e: &toml::de::Error, text: &str) -> ConfigError {
    let mut message = hide_unknown_names(&date_for_table(e.message().trim_end()));
    if let Some(span) = e.span() {
        // The text before the error, cut at a character boundary (a span inside a character
        // would make the slice panic).
        let mut at = span.start.min(text.len());
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        message.push_str(&format!(" (line {line}, column {column})"));
    }
    ConfigError::new(field, message)
}

impl StoreConfig {
    /// The prefix of every Redis key: `prefix`, or `ratelimit_redis::DEFAULT_PREFIX` (`rl`).
    pub fn prefix(&self) -> &str {
        self.prefix
            .as_deref()
            .unwrap_or(ratelimit_redis::DEFAULT_PREFIX)
    }

    /// `pool_size`, or `ratelimit_redis::DEFAULT_POOL_SIZE`.
    pub fn pool_size(&self) -> usize {
        self.pool_size.unwrap_or(ratelimit_redis::DEFAULT_POOL_SIZE)
    }

    /// `connect_timeout_ms`, or `ratelimit_redis::DEFAULT_CONNECT_TIMEOUT` in milliseconds.
    pub fn connect_timeout_ms(&self) -> u64 {
        self.connect_timeout_ms
            .unwrap_or(ratelimit_redis::DEFAULT_CONNECT_TIMEOUT.as_millis() as u64)
    }

    /// `max_keys`, or `ratelimit_core::DEFAULT_MAX_KEYS` (1,000,000).
    pub fn max_keys(&self) -> usize {
        self.max_keys.unwrap_or(ratelimit_core::DEFAULT_MAX_KEYS)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let redis = self.kind != StoreKind::Memory;
        match self.kind {
            StoreKind::Memory => {
                if self.url.is_some() || !self.urls.is_empty() {
                    return Err(ConfigError::new(
                        if self.url.is_some() {
                            "store.url"
                        } else {
                            "store.urls"
                        },
                        "only used when kind is \"redis\" or \"redis_cluster\"",
                    ));
                }
            }
            StoreKind::Redis => {
                // `urls` first: given alone, it is most likely meant for a cluster.
                if !self.urls.is_empty() {
                    return Err(ConfigError::new(
                        "store.urls",
                        "only used when kind is \"redis_cluster\"; give one `url`",
                    ));
                }
                if self.url.is_none() {
                    return Err(ConfigError::new(
                        "store.url",
                        "required when kind is \"redis\" (for example \"redis://127.0.0.1:6379\")",
                    ));
                }
            }
            StoreKind::RedisCluster => {
                if self.urls.is_empty() {
                    return Err(ConfigError::new(
                        "store.urls",
                        "required when kind is \"redis_cluster\": the URL of at least one node",
                    ));
                }
                if self.url.is_some() {
                    return Err(ConfigError::new(
                        "store.url",
                        "only used when kind is \"redis\"; give the nodes in `urls`",
                    ));
                }
            }
        }
        // A setting the chosen store never reads is a mistake (a kind changed, a line left
        // behind), not something to ignore.
        let redis_only = [
            ("store.start_without_redis", self.start_without_redis),
            ("store.prefix", self.prefix.is_some()),
            ("store.pool_size", self.pool_size.is_some()),
            (
                "store.connect_timeout_ms",
                self.connect_timeout_ms.is_some(),
            ),
            ("store.expiry_slack_ms", self.expiry_slack_ms.is_some()),
            (
                "store.ping_after_idle_ms",
                self.ping_after_idle_ms.is_some(),
            ),
            // The in-memory store answers at once, and keeps its own memo of denials.
            ("store.denial_cache", self.denial_cache),
            ("store.watch_resets", self.watch_resets),
            ("store.coalesce", self.coalesce),
        ];
        if !redis
            && let Some((field, _)) = redis_only
                .into_iter()
                .chain(self.tls_files())
                .find(|(_, set)| *set)
        {
            return Err(ConfigError::new(
                field,
                "only used when kind is \"redis\" or \"redis_cluster\"",
            ));
        }
        if self.watch_resets && !self.denial_cache {
            return Err(ConfigError::new(
                "store.watch_resets",
                "needs denial_cache = true: without the cache this gateway holds nothing a reset \
                 must end",
            ));
        }
        self.validate_tls()?;
        if redis && self.max_keys.is_some() {
            return Err(ConfigError::new(
                "store.max_keys",
                "only used when kind is \"memory\" (a route's fallback store is sized by the layer)",
            ));
        }
        if redis && (self.pool_size() == 0 || self.pool_size() > 1024) {
            return Err(ConfigError::new(
                "store.pool_size",
                "must be between 1 and 1024",
            ));
        }
        if redis && self.connect_timeout_ms() == 0 {
            return Err(ConfigError::new(
                "store.connect_timeout_ms",
                "must be at least 1",
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_MS {
            return Err(ConfigError::new(
                "store.timeout_ms",
                "must be between 1 and 3600000 (one hour)",
            ));
        }
        if redis && self.connect_timeout_ms() > MAX_MS {
            return Err(ConfigError::new(
                "store.connect_timeout_ms",
                "must be at most 3600000 (one hour)",
            ));
        }
        if self.expiry_slack_ms.is_some_and(|ms| ms > MAX_SLACK_MS) {
            return Err(ConfigError::new(
                "store.expiry_slack_ms",
                "must be at most 86400000 (one day)",
            ));
        }
        if self.max_keys() == 0 {
            return Err(ConfigError::new("store.max_keys", "must be at least 1"));
        }
        // Checked with the breaker off too: a value left there is one a later `enabled = true`
        // would take up.
        let cb = self.circuit_breaker;
        if !(1..=tower_ratelimit::MAX_FAILURE_THRESHOLD).contains(&cb.failures) {
            return Err(ConfigError::new(
                "store.circuit_breaker.failures",
                "must be from 1 to 1000000 (checked with enabled = false too)",
            ));
        }
        if cb.cool_down_ms == 0 || cb.cool_down_ms > MAX_MS {
            return Err(ConfigError::new(
                "store.circuit_breaker.cool_down_ms",
                "must be between 1 and 3600000 (one hour)",
            ));
        }
        Ok(())
    }

    /// The certificate files' fields, each with whether it is set.
    fn tls_files(&self) -> [(&'static str, bool); 3] {
        [
            ("store.tls_ca_file", self.tls_ca_file.is_some()),
            (
                "store.tls_client_cert_file",
                self.tls_client_cert_file.is_some(),
            ),
            (
                "store.tls_client_key_file",
                self.tls_client_key_file.is_some(),
            ),
        ]
    }

    /// `rediss://` URLs need the gateway's `tls` or `tls-rustls` feature, and the certificate
    /// files go with `rediss://` URLs: one standalone server's, or (with `tls-rustls` only) a
    /// cluster's; a client certificate comes with its key.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let tls_url = |u: &String| ratelimit_redis::is_tls_url(u);
        let file = self
            .tls_files()
            .into_iter()
            .find(|(_, set)| *set)
            .map(|(field, _)| field);
        // (A certificate file with a plain redis:// URL is told so below, in any build: the URL
        // is what is most likely wrong.)
        if !cfg!(any(feature = "tls", feature = "tls-rustls")) {
            let field = if self.url.as_ref().is_some_and(tls_url) {
                Some("store.url")
            } else if self.urls.iter().any(tls_url) {
                Some("store.urls")
            } else {
                None
            };
            if let Some(field) = field {
                return Err(ConfigError::new(field, NO_TLS));
            }
        }
        match (&self.tls_client_cert_file, &self.tls_client_key_file) {
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "store.tls_client_key_file",
                    "is needed with tls_client_cert_file (the certificate's private key)",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "store.tls_client_cert_file",
                    "is needed with tls_client_key_file (the certificate of that key)",
                ));
            }
            _ => {}
        }
        if let Some(field) = file {
            if self.kind == StoreKind::RedisCluster {
                if self.urls.is_empty() || !self.urls.iter().all(tls_url) {
                    return Err(ConfigError::new(field, "only used with rediss:// urls"));
                }
                if !cfg!(feature = "tls-rustls") {
                    return Err(ConfigError::new(
                        field,
                        "only used when kind is \"redis\" with the `tls` feature: its cluster \
                         client takes no certificate, verifying against the system's roots only \
                         (add the CA to them, or build the gateway with `tls-rustls` instead)",
                    ));
                }
            } else if !self.url.as_ref().is_some_and(tls_url) {
                return Err(ConfigError::new(field, "only used with a rediss:// url"));
            }
        }
        Ok(())
    }

    /// The per-check timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

impl RouteConfig {
    /// `store_can_fail`: whether to warn of what happens while the store is down.
    fn validate(
        &self,
        at: &str,
        store_can_fail: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        if !self.path.starts_with('/') {
            return Err(ConfigError::new(
                format!("{at}.path"),
                format!("{:?} must start with '/'", self.path),
            ));
        }
        if !ENDPOINTS.iter().any(|e| covers(&self.path, e)) {
            return Err(ConfigError::new(
                format!("{at}.path"),
                format!(
                    "{:?} covers none of the gateway's endpoints ({})",
                    self.path,
                    ENDPOINTS.join(", ")
                ),
            ));
        }
        if let KeyConfig::Header { name } = &self.key
            && axum::http::HeaderName::from_bytes(name.as_bytes()).is_err()
        {
            return Err(ConfigError::new(
                format!("{at}.key.name"),
                format!("{name:?} is not a valid header name"),
            ));
        }
        if let KeyConfig::Ip {
            trusted_proxies,
            forwarded_header,
            ipv6_prefix,
        } = &self.key
        {
            if let Err(e) = tower_ratelimit::ClientIp::behind_proxies(trusted_proxies) {
                return Err(ConfigError::new(format!("{at}.key.trusted_proxies"), e));
            }
            if forwarded_header.is_some() && trusted_proxies.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.key.forwarded_header"),
                    "is read only from trusted proxies, and none are set: add trusted_proxies \
                     (without them the key is the TCP peer's address)",
                ));
            }
            // Safe only behind proxies that strip or write both headers: a client's own
            // `Forwarded` (even an empty one) is read in place of the `X-Forwarded-For` a proxy
            // appended to, and names any key it likes.
            if *forwarded_header == Some(ForwardedHeaderConfig::Both) {
                warnings.push(format!(
                    "{at}.key.forwarded_header: \"both\" reads a client's own Forwarded header \
                     in place of the X-Forwarded-For your proxies append to, unless every trusted \
                     proxy strips or appends to Forwarded too: a client could then pick its key \
                     (name the one header your proxies write)"
                ));
            }
            if *ipv6_prefix > 128 {
                return Err(ConfigError::new(
                    format!("{at}.key.ipv6_prefix"),
                    "must be between 0 and 128",
                ));
            }
        }
        if self.cost == 0 {
            return Err(ConfigError::new(
                format!("{at}.cost"),
                "must be at least 1 (a cost of 0 counts nothing: the route would be unlimited)",
            ));
        }
        for (method, cost) in &self.cost_by_method {
            // Capitals, and `-` between them (a token character: `M-SEARCH`).
            let ok = method.bytes().any(|b| b.is_ascii_uppercase())
                && method.bytes().all(|b| b.is_ascii_uppercase() || b == b'-')
                && axum::http::Method::from_bytes(method.as_bytes()).is_ok();
            if !ok {
                return Err(ConfigError::new(
                    format!("{at}.cost_by_method.{}", shown_method(method)),
                    "expected an HTTP method in capitals, such as POST",
                ));
            }
            if *cost == 0 {
                return Err(ConfigError::new(
                    format!("{at}.cost_by_method.{}", shown_method(method)),
                    "must be at least 1 (a cost of 0 counts nothing: the method would be \
                     unlimited)",
                ));
            }
        }
        // The methods the endpoints under the route serve (a method may be listed more than once).
        let served: Vec<&str> = ENDPOINTS
            .iter()
            .filter(|e| covers(&self.path, e))
            .flat_map(|e| methods(e).iter().copied())
            .collect();
        // A method no endpoint under the route serves is answered 405 and never counted: its
        // cost can never apply (loaded, with a warning, as the configuration may be shared with
        // a gateway that serves more).
        for method in self.cost_by_method.keys() {
            if !served.contains(&method.as_str()) {
                let method = shown_method(method);
                warnings.push(format!(
                    "{at}.cost_by_method.{method}: no endpoint under {:?} serves {method} (it is \
                     answered 405, never counted): this cost never applies",
                    self.path
                ));
            }
        }
        let policy = &self.policy;
        let mut limits = vec![check_limit(
            policy.algorithm,
            &policy.quotas,
            &format!("{at}.policy"),
        )?];
        for (k, tier) in policy.tiers.iter().enumerate() {
            limits.push(check_limit(
                tier.algorithm.unwrap_or(policy.algorithm),
                &tier.quotas,
                &format!("{at}.policy.tiers[{k}]"),
            )?);
        }
        let mut shares = Vec::new();
        if let FailureConfig::Fallback { gateways } = policy.failure
            && gateways > 0
        {
            // Each gateway's local share must be a valid limit too.
            for limit in &limits {
                shares.push(limit.divided(gateways).map_err(|e| {
                    ConfigError::new(
                        format!("{at}.policy.failure.gateways"),
                        format!(
                            "the local share of each of {gateways} gateways is not a limit: {e}"
                        ),
                    )
                })?);
            }
        }
        // `cost` is what the methods served under the route without a cost of their own pay
        // (HEAD pays GET's, if GET has one). If every method served has its own, it never
        // applies: not checked against the limit below, and warned of if it was set.
        let own = |m: &str| {
            self.cost_by_method.contains_key(m)
                || (m == "HEAD" && self.cost_by_method.contains_key("GET"))
        };
        let cost_applies = served.is_empty() || served.iter().any(|m| !own(m));
        if !cost_applies && self.cost != 1 {
            warnings.push(format!(
                "{at}.cost: every method served under {:?} has a cost of its own in \
                 cost_by_method (HEAD pays GET's): this cost never applies",
                self.path
            ));
        }
        // A cost no quota can ever hold is a 429 for every such request, for good: a mistake,
        // refused here. Over a fallback share it is so only while the store is down, which may
        // be meant (writes refused in degraded mode): a warning. Only costs that apply are
        // checked: not `cost` when every method has its own, nor the cost of a method that no
        // endpoint under the route serves (both warned of above).
        let default_cost = cost_applies.then(|| ("cost".to_owned(), self.cost));
        let costs = default_cost.into_iter().chain(
            self.cost_by_method
                .iter()
                .filter(|(m, _)| served.contains(&m.as_str()))
                .map(|(m, &c)| (format!("cost_by_method.{m}"), c)),
        );
        for (field, cost) in costs {
            if let Some(limit) = limits.iter().find(|l| cost > l.max_cost()) {
                return Err(ConfigError::new(
                    format!("{at}.{field}"),
                    format!(
                        "{cost} is more than the limit can ever admit at once ({}): every such \
                         request would be denied",
                        limit.max_cost()
                    ),
                ));
            }
            if let Some(share) = shares.iter().find(|l| cost > l.max_cost())
                && store_can_fail
            {
                warnings.push(format!(
                    "{at}.{field}: {cost} is more than each gateway's fallback share of the limit \
                     can admit at once ({}): while the store is down, every such request is \
                     denied (429, with Retry-After saying when the store is asked again)",
                    share.max_cost()
                ));
            }
        }
        // The library's rule, worded for the file.
        if tower_ratelimit::policy::validate_name(&policy.name).is_err() {
            return Err(ConfigError::new(
                format!("{at}.policy.name"),
                format!(
                    "{:?} must be 1 to {} printable ASCII characters, neither '\"' nor '\\' \
                     (the name is a metrics label)",
                    policy.name,
                    tower_ratelimit::policy::MAX_NAME_LEN
                ),
            ));
        }
        if let FailureConfig::Fallback { gateways: 0 } = policy.failure {
            return Err(ConfigError::new(
                format!("{at}.policy.failure.gateways"),
                "must be at least 1",
            ));
        }
        // The library's own rules (an error status, and not 401, 405, 407 or 426; a valid challenge),
        // named by the field.
        let refused = match &policy.missing_key {
            MissingKeyConfig::Reject(status) if !(400..=599).contains(status) => {
                return Err(ConfigError::new(
                    format!("{at}.policy.missing_key.reject"),
                    format!("{status} is not an error status (400 to 599)"),
                ));
            }
            MissingKeyConfig::Reject(status) => tower_ratelimit::MissingKey::reject(*status)
                .err()
                .map(|e| ("reject", e)),
            MissingKeyConfig::Unauthorized(challenge) => {
                tower_ratelimit::MissingKey::unauthorized(challenge)
                    .err()
                    .map(|e| ("unauthorized", e))
            }
            _ => None,
        };
        if let Some((form, e)) = refused {
            let reason = match e {
                tower_ratelimit::Error::InvalidSetting { reason, .. } => reason.to_owned(),
                e => e.to_string(),
            };
            return Err(ConfigError::new(
                format!("{at}.policy.missing_key.{form}"),
                reason,
            ));
        }
        for (k, tier) in policy.tiers.iter().enumerate() {
            if policy.tiers[..k].iter().any(|t| t.name == tier.name) {
                return Err(ConfigError::new(
                    format!("{at}.policy.tiers[{k}].name"),
                    format!("the tier {:?} is defined twice", tier.name),
                ));
            }
        }
        // Anything the checks above missed, as the library words it; at its own field where the
        // library names one.
        let _ = policy
            .clone()
            .into_policy()
            .map_err(|e| policy_error(&format!("{at}.policy"), e))?;
        if !policy.tiers.is_empty() && !matches!(self.key, KeyConfig::Header { .. }) {
            return Err(ConfigError::new(
                format!("{at}.key.source"),
                "must be \"header\" for a route with tiers: the tier is found from the API key \
                 in [api_keys]",
            ));
        }
        Ok(())
    }
}

/// A refused policy (`at` is where it is) as the library words it, at the field it names (a
/// setting's rule alone: `routes[0].policy.failure.retry_after_secs: must be …`).
pub(crate) fn policy_error(at: &str, e: tower_ratelimit::Error) -> ConfigError {
    match e {
        tower_ratelimit::Error::Config { at: field, source } => match *source {
            tower_ratelimit::Error::InvalidSetting { reason, .. } => {
                ConfigError::new(format!("{at}.{field}"), reason)
            }
            source => ConfigError::new(format!("{at}.{field}"), source),
        },
        e => ConfigError::new(at, e),
    }
}

/// Whether the route prefix `prefix` covers the endpoint `endpoint`, by whole segments.
pub fn covers(prefix: &str, endpoint: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || endpoint == prefix
        || endpoint
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Builds each quota of a limit on its own, so an error names the quota.
fn check_limit(
    algorithm: Algorithm,
    quotas: &[QuotaConfig],
    at: &str,
) -> Result<Limit, ConfigError> {
    if quotas.is_empty() {
        return Err(ConfigError::new(
            format!("{at}.quotas"),
            "at least one quota is needed",
        ));
    }
    let mut built = Vec::with_capacity(quotas.len());
    for (j, q) in quotas.iter().enumerate() {
        let field = format!("{at}.quotas[{j}]");
        let period = match (q.per, q.period_ms) {
            (Some(per), None) => per.period(),
            (None, Some(ms)) => Duration::from_millis(ms),
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    field,
                    "give `per` or `period_ms`, not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::new(
                    field,
                    "missing `per` (second, minute, hour, day) or `period_ms`",
                ));
            }
        };
        if q.burst.is_some() && !algorithm.uses_burst() {
            return Err(ConfigError::new(
                format!("{field}.burst"),
                format!(
                    "only the token bucket and GCRA have a burst; {algorithm} allows `limit` per \
                     period (remove it, or choose algorithm = \"token_bucket\")"
                ),
            ));
        }
        let quota = Quota::per_period_with_burst(q.limit, period, q.burst.unwrap_or(q.limit))
            .map_err(|e| {
                let part = match e {
                    ratelimit_core::ConfigError::ZeroLimit => ".limit",
                    ratelimit_core::ConfigError::ZeroBurst => ".burst",
                    ratelimit_core::ConfigError::AboveExact { what: "burst", .. }
                        if q.burst.is_some() =>
                    {
                        ".burst"
                    }
                    ratelimit_core::ConfigError::AboveExact { .. } => ".limit",
                    _ if q.period_ms.is_some() => ".period_ms",
                    _ => "",
                };
                ConfigError::new(format!("{field}{part}"), e)
            })?;
        // Each quota alone first, so that a quota too large for the algorithm is named (its
        // burst, if one was given: a smaller one makes a bucket fit).
        Limit::single(algorithm, quota).map_err(|e| {
            let part = match e {
                // A sliding log's bound is on its limit alone.
                ratelimit_core::ConfigError::TooLarge {
                    algorithm: ratelimit_core::Algorithm::SlidingLog,
                    ..
                } => ".limit",
                ratelimit_core::ConfigError::TooLarge { .. } if q.burst.is_some() => ".burst",
                _ => "",
            };
            ConfigError::new(format!("{field}{part}"), e)
        })?;
        built.push(quota);
    }
    Limit::new(algorithm, built).map_err(|e| ConfigError::new(format!("{at}.quotas"), e))
}

/// The names of `policy`'s items in the IETF `RateLimit` and `RateLimit-Policy` fields, under its
/// own limit and every tier's: the policy's name for a limit of one quota, `<name>.<i>` for each
/// quota of a limit of several (as `tower_ratelimit` writes them).
fn item_names(policy: &PolicyConfig) -> std::collections::BTreeSet<String> {
    std::iter::once(policy.quotas.len())
        .chain(policy.tiers.iter().map(|t| t.quotas.len()))
        .flat_map(|n| (0..n).map(move |i| tower_ratelimit::response::item_name(&policy.name, i, n)))
        .collect()
}
