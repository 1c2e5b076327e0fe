//! The error of this crate.

use std::time::Duration;

/// Why a [`RedisStore`](crate::RedisStore) could not be built, or a check could not be made.
///
/// A denial is never an error: it is a [`Decision`](ratelimit_core::Decision). An error means the
/// store could not answer, and the caller's failure policy decides what to do (allow, deny, fall
/// back to a local limit).
///
/// After a [`Timeout`](RedisStoreError::Timeout) or a [`Connection`](RedisStoreError::Connection)
/// error during a check, the script may or may not have run on the server: the request may have
/// been counted. The store never retries it (retrying could count it twice); it re-sends a check
/// only after an answer that proves the script did not run (`NOSCRIPT`, and on Redis Cluster
/// `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` and the like).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// A setting is invalid (an unparsable URL, a prefix with a brace, a zero pool size...).
    #[error("invalid setting `{name}`: {reason}")]
    Config {
        /// The setting's name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made or taken in time: the server is down or unreachable, the pool
    /// could not create a connection within the connect and wait timeouts
    /// ([`is_unavailable`](Self::is_unavailable)); or the server was reached but refused the
    /// connection's credentials ([`is_refused_credentials`](Self::is_refused_credentials)), or
    /// is not a Redis the store can use ([`is_wrong_server`](Self::is_wrong_server)).
    #[error("could not connect to Redis: {message}")]
    Connection {
        /// What happened.
        message: String,
        /// The Redis client's error, if there was one.
        #[source]
        source: Option<redis::RedisError>,
    },
    /// The check got no answer within the response timeout.
    #[error("Redis did not answer within {after:?}")]
    Timeout {
        /// The response timeout that elapsed.
        after: Duration,
    },
    /// Redis answered with an error (a script error, `OOM` when `maxmemory` is reached with
    /// `noeviction`, `NOPERM` for an ACL user without the needed rights, a broken connection...).
    #[error("Redis error: {}{}", refusal(.0), .0)]
    Redis(#[source] redis::RedisError),
    /// The script answered something this crate does not understand (a script of another version
    /// under the same SHA would be one cause).
    #[error("unexpected reply from the rate-limit script: {0}")]
    UnexpectedReply(String),
    /// The check was polled outside a Tokio runtime after yielding once there: its timers and
    /// connections need one (a runtime with its time driver, as `#[tokio::main]` makes). A check
    /// made outside a runtime and awaited inside one is answered as any other.
    #[error("a Redis check was polled outside a Tokio runtime")]
    NoRuntime,
    /// The client clock gave a time this store cannot compute with exactly (2^52 µs since its
    /// epoch or later, about the year 2112 for Unix time).
    #[error("the client clock's time {micros} us is not below 2^52 us")]
    ClockOutOfRange {
        /// The time the clock gave, in microseconds.
        micros: u64,
    },
}

impl RedisStoreError {
    /// `true` if the store could not be reached (connection or timeout; on a cluster, no
    /// connection to the node that holds the key), or was reached but cannot answer yet: still
    /// loading its data after a start (`LOADING`, which it answers to nearly every command until
    /// it is done), or, on a cluster, down (`CLUSTERDOWN`: a slot without a master), in a slot
    /// migration that holds part of a check's keys (`TRYAGAIN`), or a replica cut off from its
    /// master (`MASTERDOWN`), each answered until the cluster mends (the client resends such a
    /// check for about 2 s, then gives the error); or busy running another client's script past
    /// its `busy-reply-threshold` (`BUSY`, answered until that script ends or is killed). As
    /// opposed to Redis answering with an error that waiting will not mend.
    /// A connection that Redis refused for its credentials
    /// ([`is_refused_credentials`](Self::is_refused_credentials)), or an address where something
    /// other than a usable Redis answered ([`is_wrong_server`](Self::is_wrong_server)), is not
    /// this: the server was reached, and waiting will not help.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            RedisStoreError::Connection { .. } => {
                !self.is_refused_credentials() && !self.is_wrong_server()
            }
            RedisStoreError::Timeout { .. } => true,
            RedisStoreError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
                    || e.code() == Some("BUSY")
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::BusyLoading
                                | redis::ServerErrorKind::ClusterDown
                                | redis::ServerErrorKind::TryAgain
                                | redis::ServerErrorKind::MasterDown
                        )
                    )
            }
            _ => false,
        }
    }

    /// `true` if Redis refused this client's credentials: a wrong password or user
    /// (`WRONGPASS`), none given (`NOAUTH`), or an ACL user without the rights a check needs
    /// (`NOPERM`). Waiting will not help; a corrected setting, or the server's, will.
    ///
    /// The cluster client reports the nodes it could not connect to as one error whose text alone
    /// names the cause, so the text is read too (`tests/cluster.rs`,
    /// `refused_credentials_on_a_cluster_are_told_apart`, pins it on a real cluster).
    #[must_use]
    pub fn is_refused_credentials(&self) -> bool {
        match self {
            RedisStoreError::Connection {
                source: Some(r), ..
            }
            | RedisStoreError::Redis(r) => refused(r),
            _ => false,
        }
    }

    /// `true` if the address answered, but not as a Redis server this store can use: its reply
    /// did not parse (another service listens there: a web server, a database), or the server
    /// refused the set-up as a setting it can never accept (`RedisStore::cluster` pointed at a
    /// server without cluster support, a database number it does not have or one past the 32
    /// bits `SELECT` takes), or is a Redis
    /// Cluster node or a Redis Sentinel given to `RedisStore::builder` (its `HELLO` says `mode`
    /// `cluster` or `sentinel`; with a database in the URL, its refused `SELECT` says so). Like
    /// [`is_refused_credentials`](Self::is_refused_credentials), waiting will not help; a
    /// corrected setting will. Errors that may pass (a server loading its data, one at its
    /// client limit, a cluster that is down) are not this.
    ///
    /// The cluster client reports a failed connection as one error whose text alone names the
    /// cause, so the text is read too (`tests/lazy.rs` pins both on real servers).
    #[must_use]
    pub fn is_wrong_server(&self) -> bool {
        let RedisStoreError::Connection {
            source: Some(r), ..
        } = self
        else {
            return false;
        };
        not_redis(r) || {
            let text = r.to_string();
            [
                "cluster support disabled",
                "DB index is out of range",
                crate::store::CLUSTER_NODE_AS_STANDALONE,
                crate::store::SENTINEL_AS_SERVER,
            ]
            .iter()
            .any(|wrong| text.contains(wrong))
                // A `SELECT` of the URL's database refused for good (the client drops the code,
                // so the server's words are read, and only after the client's own): a number
                // past the 32 bits it takes, a Redis Cluster node (which has no databases), a
                // Sentinel (which has no `SELECT`). Given without a database, the last two are
                // told apart by `HELLO` (above); with one, the `SELECT` fails first.
                || (text.contains(SELECT_REFUSED)
                    && [
                        "out of range",
                        "SELECT is not allowed in cluster mode",
                        "unknown command 'SELECT'",
                    ]
                    .iter()
                    .any(|wrong| text.contains(wrong)))
        }
    }

    /// A connection error naming the store's URLs (their passwords redacted), so that a wrong
    /// address or port, or the server that went down, is plain in the message: `could not
    /// connect to Redis: redis://127.0.0.1:6379: Connection refused`. Any other error as it is.
    pub(crate) fn connecting_to(self, urls: &[String]) -> Self {
        match self {
            RedisStoreError::Connection { message, source } => {
                let urls: Vec<String> = urls.iter().map(|u| crate::redact_url(u)).collect();
                // Said plainly first where the client's words leave it to be guessed (a reply
                // that does not parse, refused credentials).
                let plainly = match &source {
                    Some(r) if not_redis(r) => {
                        "what answers there is not a Redis server (its reply does not parse): "
                    }
                    Some(r) if refused(r) => "Redis refused the credentials: ",
                    _ => "",
                };
                RedisStoreError::Connection {
                    message: format!("{}: {plainly}{}", urls.join(", "), one_line(&message)),
                    source,
                }
            }
            // Refused by the server once connected (`NOAUTH` when it asks a password the URL does
            // not give): said as a refused connection, naming the URL.
            RedisStoreError::Redis(r) if refused(&r) => RedisStoreError::Connection {
                message: r.to_string(),
                source: Some(r),
            }
            .connecting_to(urls),
            other => other,
        }
    }

    pub(crate) fn config(name: &'static str, reason: impl Into<String>) -> Self {
        RedisStoreError::Config {
            name,
            reason: reason.into(),
        }
    }
}

/// The client's words for a `SELECT` of the URL's database that the server refused (followed by
/// the server's, without its error code).
const SELECT_REFUSED: &str = "Redis server refused to switch database";

/// Whether Redis refused the connection's credentials or rights (see
/// [`RedisStoreError::is_refused_credentials`]).
pub(crate) fn refused(r: &redis::RedisError) -> bool {
    r.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(r.code(), Some("WRONGPASS" | "NOPERM"))
        || unauthenticated(r)
        || {
            let text = r.to_string();
            [
                "WRONGPASS",
                "NOPERM",
                "NOAUTH",
                "AuthenticationFailed",
                // A command a script calls that the user may not run: Redis 7 answers it with
                // this text and no `NOPERM` code.
                "user executing the script can't run",
                // `NOPERM`'s own text, where the client drops the code: a `SELECT` the user may
                // not run, for a URL's database ("refused to switch database").
                "has no permissions to run",
            ]
            .iter()
            .any(|refusal| text.contains(refusal))
                // `NOAUTH`'s text, its code dropped the same way: a URL with a database and
                // without the password the server asks.
                || (text.contains(SELECT_REFUSED) && text.contains("Authentication required"))
        }
}

/// Whether the server took the connection as unauthenticated (a password it asks that the
/// connection did not give): `NOAUTH`, or, on a command of more than a few arguments (as the
/// scripts' calls are), "Protocol error: unauthenticated multibulk length", after which it
/// closes the connection. The store gives such a connection up.
pub(crate) fn unauthenticated(r: &redis::RedisError) -> bool {
    r.code() == Some("NOAUTH") || r.to_string().contains("unauthenticated")
}

/// What a Redis error's message says first when it is a refusal of the credentials: the
/// client's own words (`NOAUTH`, `Protocol error: unauthenticated multibulk length`) leave it
/// to be guessed.
fn refusal(r: &redis::RedisError) -> &'static str {
    if refused(r) {
        "Redis refused the credentials: "
    } else {
        ""
    }
}

/// Whether the client could not parse the reply as Redis's protocol: something else listens
/// there. (The cluster client reports it as an I/O error whose text alone says so.)
fn not_redis(r: &redis::RedisError) -> bool {
    r.kind() == redis::ErrorKind::Parse || r.to_string().contains("Parse error")
}

/// `text` on one line, its lines joined with "; " (the client's parse errors span several: a
/// log line or an operator's terminal should get one).
pub(crate) fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join("; ")
}
