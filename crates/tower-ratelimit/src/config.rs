//! Policies from configuration files (the `serde` feature).
//!
//! A [`PolicyConfig`] is the data part of a [`Policy`]: name, algorithm, quotas, tiers, header
//! mode, verdict, body, failure policy, missing-key answer and dry run. What is code (the key extractor,
//! the cost function, the tier resolver, the allow-list) is added to the built policy.
//!
//! ```
//! use tower_ratelimit::config::PolicyConfig;
//! use tower_ratelimit::key::ApiKeyHeader;
//!
//! let config: PolicyConfig = toml::from_str(r#"
//!     name = "api"
//!     algorithm = "gcra"
//!     quotas = [{ limit = 10, per = "second", burst = 20 }, { limit = 1000, per = "hour" }]
//!     failure = { mode = "fallback", gateways = 4 }
//!     missing_key = { unauthorized = 'ApiKey header="x-api-key"' }
//!     headers = { legacy = true, on_allowed = false }
//!     body = "problem_json"
//!
//!     [[tiers]]
//!     name = "pro"
//!     quotas = [{ limit = 100, per = "second" }]
//! "#)?;
//! let policy = config.into_policy()?.key(ApiKeyHeader::new("x-api-key")?);
//! assert_eq!(policy.name(), "api");
//! assert_eq!(policy.limit().quotas().len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use ratelimit_core::{Algorithm, Limit, Quota};
use serde::Deserialize;

use crate::{DenialBody, Error, FailurePolicy, Headers, MissingKey, Policy};

/// A policy as written in a configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The policy name.
    pub name: String,
    /// The algorithm (default `token_bucket`).
    #[serde(default)]
    pub algorithm: Algorithm,
    /// One or more quotas, checked all-or-nothing.
    pub quotas: Vec<QuotaConfig>,
    /// Other limits, chosen per request by a resolver set in code.
    #[serde(default)]
    pub tiers: Vec<TierConfig>,
    /// Dry run (shadow mode).
    #[serde(default)]
    pub dry_run: bool,
    /// Which rate-limit fields to send.
    #[serde(default)]
    pub headers: HeadersConfig,
    /// Whether to put a `Verdict` in the response extensions (default `true`; see
    /// [`Policy::verdict`]).
    #[serde(default = "yes")]
    pub verdict: bool,
    /// Whether to put the `Verdict` in the extensions of each request let through, for the
    /// handler (default `false`; see [`Policy::verdict_in_request`]).
    #[serde(default)]
    pub verdict_in_request: bool,
    /// The body of a 429.
    #[serde(default)]
    pub body: BodyConfig,
    /// What to do when the store cannot answer.
    #[serde(default)]
    pub failure: FailureConfig,
    /// What to answer when no key is found.
    #[serde(default)]
    pub missing_key: MissingKeyConfig,
}

/// One quota: `limit` requests `per` unit (or per `period_ms`), with an optional burst.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QuotaConfig {
    /// Requests per period.
    pub limit: u64,
    /// The period as a unit. Give this or `period_ms`.
    #[serde(default)]
    pub per: Option<Per>,
    /// The period in milliseconds. Give this or `per`.
    #[serde(default)]
    pub period_ms: Option<u64>,
    /// The bucket capacity (default: `limit`). Token bucket and GCRA only: refused with a window
    /// algorithm, which has none.
    #[serde(default)]
    pub burst: Option<u64>,
}

/// A unit of time for a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Per {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (86,400 seconds).
    Day,
}

impl Per {
    /// The period this unit names.
    #[must_use]
    pub const fn period(self) -> Duration {
        Duration::from_secs(match self {
            Per::Second => 1,
            Per::Minute => 60,
            Per::Hour => 3_600,
            Per::Day => 86_400,
        })
    }
}

/// A tier: a named limit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// The tier's name, as the resolver returns it.
    pub name: String,
    /// The algorithm (default: the policy's).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// The tier's quotas.
    pub quotas: Vec<QuotaConfig>,
}

/// Which rate-limit fields to send (every field is optional).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct HeadersConfig {
    /// The IETF `RateLimit` and `RateLimit-Policy` fields (default true).
    pub ietf: bool,
    /// The legacy `X-RateLimit-*` fields (default false).
    pub legacy: bool,
    /// On allowed responses too (default true).
    pub on_allowed: bool,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        HeadersConfig {
            ietf: true,
            legacy: false,
            on_allowed: true,
        }
    }
}

/// The body of a 429: `"plain_text"`, `"problem_json"`, or `"grpc"` (a gRPC
/// `RESOURCE_EXHAUSTED` status instead of a 429: see [`DenialBody::Grpc`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BodyConfig {
    /// `text/plain; charset=utf-8` ([`DenialBody::PlainText`]).
    #[default]
    PlainText,
    /// `application/problem+json`.
    ProblemJson,
    /// A gRPC `RESOURCE_EXHAUSTED` status ([`DenialBody::Grpc`]).
    Grpc,
}

/// The failure policy: `{ mode = "open" }`, `{ mode = "closed", retry_after_secs = 2 }` or
/// `{ mode = "fallback", gateways = 4 }`. A setting of another mode is refused (`unknown field`),
/// and a value of the wrong type is reported at its own field (`failure.gateways`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "FailureTable")]
#[non_exhaustive]
pub enum FailureConfig {
    /// [`FailurePolicy::FailOpen`] (a stray setting next to it, such as `retry_after_secs`, is
    /// refused instead of silently ignored).
    Open {},
    /// [`FailurePolicy::FailClosed`].
    Closed {
        /// `Retry-After` in seconds, 1 to 86,400 (0 is refused).
        retry_after_secs: u64,
    },
    /// [`FailurePolicy::Fallback`].
    Fallback {
        /// How many gateways share the limit.
        gateways: u64,
    },
}

impl Default for FailureConfig {
    fn default() -> Self {
        FailureConfig::Open {}
    }
}

/// A failure table as written: every mode's settings, matched to the `mode` by `TryFrom`. (Read
/// as an internally tagged enum, the table would be buffered before its fields are read, and a
/// deserializer that tracks where it is, such as `serde_path_to_error`, would name the table
/// only, not the field whose value is wrong.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailureTable {
    mode: FailureMode,
    retry_after_secs: Option<u64>,
    gateways: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailureMode {
    Open,
    Closed,
    Fallback,
}

impl TryFrom<FailureTable> for FailureConfig {
    type Error = String;

    fn try_from(t: FailureTable) -> Result<Self, String> {
        let (mode, allowed) = match t.mode {
            FailureMode::Open => ("open", ""),
            FailureMode::Closed => ("closed", "retry_after_secs"),
            FailureMode::Fallback => ("fallback", "gateways"),
        };
        for (field, set) in [
            ("retry_after_secs", t.retry_after_secs.is_some()),
            ("gateways", t.gateways.is_some()),
        ] {
            if set && field != allowed {
                return Err(format!(
                    "unknown field `{field}`: mode \"{mode}\" takes {}",
                    if allowed.is_empty() {
                        "no setting".to_owned()
                    } else {
                        format!("`{allowed}` only")
                    }
                ));
            }
        }
        let missing = |field: &str| format!("missing field `{field}` (mode \"{mode}\")");
        Ok(match t.mode {
            FailureMode::Open => FailureConfig::Open {},
            FailureMode::Closed => FailureConfig::Closed {
                retry_after_secs: t
                    .retry_after_secs
                    .ok_or_else(|| missing("retry_after_secs"))?,
            },
            FailureMode::Fallback => FailureConfig::Fallback {
                gateways: t.gateways.ok_or_else(|| missing("gateways"))?,
            },
        })
    }
}

/// The missing-key answer: `{ reject = 400 }`, `{ unauthorized = 'Bearer realm="api"' }` (401
/// with this `WWW-Authenticate` challenge) or `{ shared_key = "anonymous" }`: exactly one of the
/// three (a table with two, or none, is refused, naming them).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "MissingKeyTable")]
#[non_exhaustive]
pub enum MissingKeyConfig {
    /// Reject with this status (not 401, 405, 407 or 426).
    Reject(u16),
    /// Reject with 401 and this `WWW-Authenticate` challenge.
    Unauthorized(String),
    /// Use this shared key.
    SharedKey(String),
}

/// A missing-key table as written: the three answers, of which `TryFrom` takes the one set.
/// (Read as an enum, a table with two or none was refused as "wanted exactly 1 element", which
/// names neither the answers nor what was wrong.) Read as a map only, each answer's value as its
/// type, as the enum was: not from a sequence, and not `null` (as a derived struct of `Option`s
/// would take them, in JSON say). Read through `deserialize_any`, as a self-describing format
/// (TOML, JSON, YAML) can: a configuration's.
struct MissingKeyTable {
    reject: Option<u16>,
    unauthorized: Option<String>,
    shared_key: Option<String>,
}

/// The names of a missing-key table's answers.
const MISSING_KEY_ANSWERS: &[&str] = &["reject", "unauthorized", "shared_key"];

/// How the `toml` crate passes a date or time: as a table of one key of this name, which the
/// file never wrote.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// A key of a missing-key table: an answer's name, or the key a date or time comes as. Any
/// other is refused as it is read (`unknown field`), so that a path-tracking deserializer names
/// it (`missing_key.status`).
enum MissingKeyName {
    Reject,
    Unauthorized,
    SharedKey,
    TomlDatetime,
}

impl<'de> Deserialize<'de> for MissingKeyName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = MissingKeyName;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`reject`, `unauthorized` or `shared_key`")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<MissingKeyName, E> {
                Ok(match name {
                    "reject" => MissingKeyName::Reject,
                    "unauthorized" => MissingKeyName::Unauthorized,
                    "shared_key" => MissingKeyName::SharedKey,
                    TOML_DATETIME_KEY => MissingKeyName::TomlDatetime,
                    other => return Err(E::unknown_field(other, MISSING_KEY_ANSWERS)),
                })
            }
        }
        d.deserialize_identifier(Name)
    }
}

impl<'de> Deserialize<'de> for MissingKeyTable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Table;
        impl<'de> serde::de::Visitor<'de> for Table {
            type Value = MissingKeyTable;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table of one of `reject`, `unauthorized` or `shared_key`")
            }

            // A string where the table belongs is not quoted back (an API key pasted as
            // `missing_key = "…"`, say), as the enum's unknown variant was not by the gateway.
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<MissingKeyTable, E> {
                Err(E::invalid_type(
                    serde::de::Unexpected::Other("a string"),
                    &self,
                ))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<MissingKeyTable, A::Error> {
                use serde::de::Error as _;
                let mut t = MissingKeyTable {
                    reject: None,
                    unauthorized: None,
                    shared_key: None,
                };
                while let Some(answer) = map.next_key::<MissingKeyName>()? {
                    // The answer's name if it was given already (a format that lets a key come
                    // twice: JSON, YAML), named as serde's derived tables name theirs.
                    let twice = match answer {
                        MissingKeyName::Reject => {
                            t.reject.replace(map.next_value()?).map(|_| "reject")
                        }
                        MissingKeyName::Unauthorized => t
                            .unauthorized
                            .replace(map.next_value()?)
                            .map(|_| "unauthorized"),
                        MissingKeyName::SharedKey => t
                            .shared_key
                            .replace(map.next_value()?)
                            .map(|_| "shared_key"),
                        MissingKeyName::TomlDatetime => {
                            return Err(A::Error::invalid_type(
                                serde::de::Unexpected::Other("a date or time"),
                                &self,
                            ));
                        }
                    };
                    if let Some(name) = twice {
                        return Err(A::Error::duplicate_field(name));
                    }
                }
                Ok(t)
            }
        }
        // `any`, not `map`: a format's own map reading (serde_json's) refuses a string quoting
        // it, before this visitor could say otherwise.
        d.deserialize_any(Table)
    }
}

impl TryFrom<MissingKeyTable> for MissingKeyConfig {
    type Error = String;

    fn try_from(t: MissingKeyTable) -> Result<Self, String> {
        let set: Vec<&str> = [
            ("reject", t.reject.is_some()),
            ("unauthorized", t.unauthorized.is_some()),
            ("shared_key", t.shared_key.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        match (t.reject, t.unauthorized, t.shared_key) {
            (Some(status), None, None) => Ok(MissingKeyConfig::Reject(status)),
            (None, Some(challenge), None) => Ok(MissingKeyConfig::Unauthorized(challenge)),
            (None, None, Some(key)) => Ok(MissingKeyConfig::SharedKey(key)),
            _ if set.is_empty() => Err(
                "takes one of `reject`, `unauthorized` or `shared_key`, and has none".to_owned(),
            ),
            _ => Err(format!(
                "takes one of `reject`, `unauthorized` or `shared_key`, and has {}",
                set.iter()
                    .map(|name| format!("`{name}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            )),
        }
    }
}

impl Default for MissingKeyConfig {
    fn default() -> Self {
        MissingKeyConfig::Reject(400)
    }
}

impl QuotaConfig {
    fn to_quota(&self) -> Result<Quota, Error> {
        let period = match (self.per, self.period_ms) {
            (Some(per), None) => per.period(),
            (None, Some(ms)) => Duration::from_millis(ms),
            _ => {
                return Err(Error::InvalidSetting {
                    name: "quotas",
                    reason: "each quota needs exactly one of `per` and `period_ms`",
                });
            }
        };
        let burst = self.burst.unwrap_or(self.limit);
        Ok(Quota::per_period_with_burst(self.limit, period, burst)?)
    }
}

/// `e`, said to be at `at` in the configuration.
fn at(at: impl Into<String>, e: impl Into<Error>) -> Error {
    Error::Config {
        at: at.into(),
        source: Box::new(e.into()),
    }
}

/// The limit of `quotas` (`prefix` + `quotas` in the configuration: an error names the quota).
fn limit(algorithm: Algorithm, quotas: &[QuotaConfig], prefix: &str) -> Result<Limit, Error> {
    // The window algorithms count at most `limit` per period and have no burst: a burst given
    // with them would be silently unused (a `burst = 10` under 1,000 a minute admitting 1,000 at
    // once).
    if !algorithm.uses_burst()
        && let Some(i) = quotas.iter().position(|q| q.burst.is_some())
    {
        return Err(at(
            format!("{prefix}quotas[{i}].burst"),
            Error::InvalidSetting {
                name: "burst",
                reason: "is used only by the token bucket and GCRA; the window algorithms admit \
                         at most `limit` per period",
            },
        ));
    }
    let quotas = quotas
        .iter()
        .enumerate()
        .map(|(i, q)| {
            q.to_quota()
                .map_err(|e| at(format!("{prefix}quotas[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Limit::new(algorithm, quotas.iter().copied()).map_err(|e| {
        // A quota its algorithm cannot count is named, by the very error it gives alone; any
        // other error (the number of quotas) is the list's, even where a quota of it would be
        // refused alone too.
        let i = quotas
            .iter()
            .position(|&q| Limit::single(algorithm, q).err().as_ref() == Some(&e));
        match i {
            Some(i) => at(format!("{prefix}quotas[{i}]"), e),
            None => at(format!("{prefix}quotas"), e),
        }
    })
}

fn yes() -> bool {
    true
}

impl PolicyConfig {
    /// Builds the policy, or says which setting is wrong: an [`Error::Config`] whose `at` names
    /// it as the configuration does (`tiers[0].quotas[1]`). Set the key extractor (and any cost
    /// function, tier resolver or allow-list) on the result.
    /// [`RateLimitLayer::new`](crate::RateLimitLayer::new), which sees the whole policy, checks
    /// later that `[[tiers]]` come with a tier resolver.
    pub fn into_policy(self) -> Result<Policy, Error> {
        let mut policy = Policy::new(&self.name, limit(self.algorithm, &self.quotas, "")?)
            .map_err(|e| at("name", e))?;
        for (k, tier) in self.tiers.into_iter().enumerate() {
            let algorithm = tier.algorithm.unwrap_or(self.algorithm);
            let l = limit(algorithm, &tier.quotas, &format!("tiers[{k}]."))?;
            policy = policy
                .tier(tier.name, l)
                .map_err(|e| at(format!("tiers[{k}].name"), e))?;
        }
        let failure = match self.failure {
            FailureConfig::Open {} => FailurePolicy::FailOpen,
            FailureConfig::Closed { retry_after_secs } => {
                let policy = FailurePolicy::fail_closed(Duration::from_secs(retry_after_secs));
                // Named as the configuration names it.
                policy.check().map_err(|e| match e {
                    Error::InvalidSetting {
                        name: "retry_after",
                        reason,
                    } => at(
                        "failure.retry_after_secs",
                        Error::InvalidSetting {
                            name: "retry_after_secs",
                            reason,
                        },
                    ),
                    other => at("failure", other),
                })?;
                policy
            }
            FailureConfig::Fallback { gateways } => {
                FailurePolicy::fallback(gateways).map_err(|e| at("failure.gateways", e))?
            }
        };
        let missing = match self.missing_key {
            MissingKeyConfig::Reject(status) => {
                MissingKey::reject(status).map_err(|e| at("missing_key.reject", e))?
            }
            MissingKeyConfig::Unauthorized(challenge) => MissingKey::unauthorized(&challenge)
                .map_err(|e| at("missing_key.unauthorized", e))?,
            MissingKeyConfig::SharedKey(key) => MissingKey::shared_key(key),
        };
        let h = self.headers;
        Ok(policy
            .dry_run(self.dry_run)
            .verdict(self.verdict)
            .verdict_in_request(self.verdict_in_request)
            .headers(
                Headers::ietf()
                    .with_ietf(h.ietf)
                    .legacy(h.legacy)
                    .on_allowed(h.on_allowed),
            )
            .body(match self.body {
                BodyConfig::PlainText => DenialBody::PlainText,
                BodyConfig::ProblemJson => DenialBody::ProblemJson,
                BodyConfig::Grpc => DenialBody::Grpc,
            })
            .failure(failure)
            .missing_key(missing))
    }
}
