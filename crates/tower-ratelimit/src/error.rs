//! The error of this crate: why a layer's configuration was refused.

use ratelimit_core::ConfigError;

/// Why a policy, key extractor or layer could not be built.
///
/// Every constructor that can be given a bad setting returns this instead of panicking, so a
/// configuration can be checked at start-up with a message that names what is wrong. Requests
/// never produce it: every per-request answer (no key, store down, denied) is a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A quota or limit was refused by `ratelimit-core`.
    #[error("invalid limit: {0}")]
    Limit(#[from] ConfigError),
    /// A header name was not a valid HTTP header name.
    #[error("invalid header name {}", Given(name))]
    InvalidHeaderName {
        /// The name that was given.
        name: String,
    },
    /// A policy name was empty, too long, or had a character other than printable ASCII, or
    /// `"` or `\`.
    #[error(
        "invalid policy name {}: it must be 1 to {max} printable ASCII characters, neither '\"' nor '\\'",
        Given(name),
        max = crate::policy::MAX_NAME_LEN
    )]
    InvalidPolicyName {
        /// The name that was given.
        name: String,
    },
    /// Two tiers of one policy had the same name.
    #[error("the tier `{name}` is defined twice")]
    DuplicateTier {
        /// The repeated tier name.
        name: String,
    },
    /// A status code for an answer was not a client or server error (400 to 599).
    #[error("status {status} is not an error status (400-599)")]
    InvalidStatus {
        /// The status that was given.
        status: u16,
    },
    /// A client-address setting (trusted proxies, prefix lengths) was refused.
    #[error("invalid client address setting: {0}")]
    ClientIp(#[from] crate::client_ip::ClientIpError),
    /// The local share of a limit for the fallback (`FailurePolicy::Fallback`) could not be
    /// made. Not expected: `Limit::divided` makes a share of every valid limit, rounding its
    /// limit down or lowering its burst to fit what its algorithm counts exactly; kept for a
    /// rule a later version of it may add.
    #[error(
        "the fallback's local share of {} for {gateways} gateways is refused: {source}",
        tier.as_deref().map_or_else(|| "the policy's limit".to_owned(), |t| format!("tier `{t}`"))
    )]
    FallbackShare {
        /// The gateways the limit is divided by.
        gateways: u64,
        /// The tier whose limit it is (`None`: the policy's own).
        tier: Option<String>,
        /// Why the share was refused.
        source: ConfigError,
    },
    /// A numeric or duration setting was out of range.
    #[error("invalid setting `{name}`: {reason}")]
    InvalidSetting {
        /// The setting's name.
        name: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// A setting of a policy read from configuration (`config::PolicyConfig`, with the `serde`
    /// feature) was refused: `at` says where, as the configuration names it (`quotas[1]`,
    /// `tiers[0].quotas[2].burst`, `tiers[1].name`, `failure.retry_after_secs`), and `source`
    /// why.
    #[error("{at}: {source}")]
    Config {
        /// Where the refused setting is.
        at: String,
        /// Why it was refused.
        source: Box<Error>,
    },
}

/// A name as given, in an error's message: quoted, or `(empty)` for the empty string, which
/// would otherwise print as an easily missed pair of backticks.
struct Given<'a>(&'a str);

impl std::fmt::Display for Given<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("(empty)")
        } else {
            write!(f, "`{}`", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_name_is_said_to_be_empty() {
        let policy = crate::Policy::new(
            "",
            ratelimit_core::Limit::single(
                ratelimit_core::Algorithm::Gcra,
                ratelimit_core::Quota::per_second(1).unwrap(),
            )
            .unwrap(),
        )
        .unwrap_err();
        assert_eq!(
            policy.to_string(),
            format!(
                "invalid policy name (empty): it must be 1 to {} printable ASCII characters, \
                 neither '\"' nor '\\'",
                crate::policy::MAX_NAME_LEN
            )
        );
        let header = crate::key::ApiKeyHeader::new("").unwrap_err();
        assert_eq!(header.to_string(), "invalid header name (empty)");
        // A name that is there is quoted, as before.
        let header = crate::key::ApiKeyHeader::new("bad header").unwrap_err();
        assert_eq!(header.to_string(), "invalid header name `bad header`");
        let policy = Error::InvalidPolicyName {
            name: "a\nb".into(),
        };
        assert!(
            policy
                .to_string()
                .starts_with("invalid policy name `a\nb`: "),
            "{policy}"
        );
    }
}
