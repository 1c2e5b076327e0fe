//! Announced resets: one gateway's resets heard by the others ([`RedisStore::watch_resets`]).
//!
//! A `DenialCache` or `Leasing` in front of the store ends its own cached denials or lease of a
//! client that it resets, but another gateway's stand until their deadline or expiry: a client
//! whose block support lifted through one gateway stays blocked on the others. A store built
//! with [`announce_resets`](crate::RedisStoreBuilder::announce_resets) publishes each reset on a
//! channel of its prefix, from the reset's own script; a watch subscribes to that channel on a
//! connection of its own and hands every notice to the application, which ends what its wrappers
//! hold of that client ([`ResetNotice::apply`]: `DenialCache::forget`, `Leasing::forget`).
//!
//! Redis's pub/sub delivers at most once: a notice published while a watch is not subscribed (its
//! connection lost, Redis restarting) is not delivered later. So the watch tells its handler each
//! time it has (re)subscribed ([`ResetNotice::Subscribed`]), and the handler drops everything its
//! wrappers hold that a missed reset may have ended (`DenialCache::clear`, through
//! [`Forget::forget_unheard`]): one more store call per client, never a stale denial. A
//! subscription that goes silent (a frozen server, a partition that closes nothing) is found by a
//! `PING` after a second without a message, given up after the store's response timeout, and
//! made again. One on a server that its address no longer leads to (a failover behind a proxy or
//! a DNS name: the old primary, made a replica, answers the `PING`s, but resets are published on
//! the new one) is found by asking, every 5 s on a new connection, which server the address leads
//! to (`INFO server`'s `run_id`; a user without `+info` is not checked so), and made again there.
//! (Not on a Redis Cluster, whose every node hears every publication: an address that leads to
//! another node of it loses nothing.)
//! If that question goes unanswered before a subscription (a timeout, a connection that fails,
//! an error reply other than a refusal such as `LOADING`), it is asked again every 5 s while
//! subscribed, and the subscription is made again once it is answered, so that the watch knows
//! which server it is on.

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_core::Stream;
use ratelimit_core::Forget;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{ConnectionInfo, RedisError, Value};

use crate::{LazyRedisStore, RedisStore, RedisStoreError, metrics};

/// How long a subscription may be silent before the watch sends a `PING` to see it is alive.
const PING_AFTER: Duration = Duration::from_secs(1);
/// How often the watch asks, on a new connection, which server its address leads to now.
const SERVER_CHECK_EVERY: Duration = Duration::from_secs(5);
/// The first wait before subscribing again after a failure; doubled after each, up to
/// [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The channel on which a store of key prefix `prefix` announces its resets.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:resets")
}

/// A reset's notice: the limit's fingerprint (8 bytes, big-endian), then the key as the store
/// was given it.
pub(crate) fn notice(key: &[u8], limit_fingerprint: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&limit_fingerprint.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The key and the limit's fingerprint of a notice; `None` for a message that is not one.
fn parse(payload: &[u8]) -> Option<(&[u8], u64)> {
    let (fingerprint, key) = payload.split_first_chunk::<8>()?;
    Some((key, u64::from_be_bytes(*fingerprint)))
}

/// What a reset watch tells its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetNotice<'a> {
    /// A store of this prefix (on any gateway, this one included) reset `key` under the limit
    /// whose [`fingerprint`](ratelimit_core::Limit::fingerprint) is `limit_fingerprint`: end what
    /// is held of it (`DenialCache::forget(key, limit_fingerprint)`, `Leasing::forget`).
    Reset {
        /// The key, as the store was given it (the tower layer's: the policy's name and the
        /// client's key).
        key: &'a [u8],
        /// The limit's fingerprint.
        limit_fingerprint: u64,
    },
    /// The watch has subscribed, first or again: resets announced before now, while it was not
    /// subscribed, were not heard. Drop what a missed reset may have ended
    /// (`DenialCache::clear`).
    Subscribed,
}

impl ResetNotice<'_> {
    /// Hands this notice to a wrapper that holds answers of the store in this process: a reset
    /// to its [`forget`](Forget::forget), a subscription to its
    /// [`forget_unheard`](Forget::forget_unheard) (a `DenialCache` then drops every denial, since
    /// resets may have gone unheard before it). The handler of a watch over a `DenialCache`
    /// (or an `Arc` of one) is then `move |notice| notice.apply(&cache)`; over a `DenialCache` and
    /// a `Leasing`, apply it to each, the innermost first (`apply(&leasing)`, then
    /// `apply(&cache)`): applied to the cache first, a check between the two can spend a unit of
    /// the old lease, which leaves none, and the cache then holds a denial that outlives the reset.
    pub fn apply(&self, to: &(impl Forget + ?Sized)) {
        match *self {
            ResetNotice::Reset {
                key,
                limit_fingerprint,
            } => to.forget(key, limit_fingerprint),
            ResetNotice::Subscribed => to.forget_unheard(),
        }
    }
}

/// A running reset watch ([`RedisStore::watch_resets`]): a task of its own, which ends when this
/// is dropped.
pub struct ResetWatch {
    task: tokio::task::JoinHandle<()>,
    subscribed: Arc<AtomicBool>,
}

impl ResetWatch {
    /// Whether the watch is subscribed now (false while it subscribes, first or again, and once
    /// its task has ended: its runtime shut down, or its handler panicked).
    pub fn is_subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Acquire)
    }
}

impl Drop for ResetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl fmt::Debug for ResetWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResetWatch")
            .field("subscribed", &self.is_subscribed())
            .finish_non_exhaustive()
    }
}

type Handler = dyn Fn(ResetNotice<'_>) + Send + Sync + 'static;

/// What a watch needs of a store's settings.
pub(crate) struct Settings {
    pub(crate) infos: Box<[ConnectionInfo]>,
    /// The nodes are a Redis Cluster's: a publication reaches every node, so which node an
    /// address leads to is not asked.
    pub(crate) cluster: bool,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl Settings {
    /// The watch, spawned on the current Tokio runtime.
    fn spawn(
        self,
        handler: impl Fn(ResetNotice<'_>) + Send + Sync + 'static,
    ) -> Result<ResetWatch, RedisStoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            RedisStoreError::config("watch_resets", "must be called within a Tokio runtime")
        })?;
        let subscribed = Arc::new(AtomicBool::new(false));
        let task = runtime.spawn(watch(
            self.infos,
            self.cluster,
            channel(&self.prefix),
            self.connect_timeout + self.response_timeout,
            self.response_timeout,
            Arc::new(handler),
            Arc::clone(&subscribed),
        ));
        Ok(ResetWatch { task, subscribed })
    }
}

impl RedisStore {
    /// Hears the resets that stores of this prefix announce
    /// ([`announce_resets`](crate::RedisStoreBuilder::announce_resets)), on every gateway, and
    /// hands each to `handler`, on a task of its own, for as long as the returned watch is kept:
    /// the way a gateway's `DenialCache` and `Leasing` learn that another gateway reset a
    /// client. The handler runs on the watch's task, one notice at a time: keep it short (ending a
    /// key's entry is), and do not let it panic (the watch's task would end with it).
    ///
    /// The watch subscribes on a connection of its own (a cluster's seed nodes in turn, then the
    /// nodes it names in `CLUSTER SLOTS`, learned at each subscription, so that a watch given one
    /// seed goes on once that node is gone; a cluster delivers a publication to every node, and a
    /// node that serves no slot of it is left), and again whenever that connection is lost or
    /// goes silent, or a standalone server's address leads to another server (a failover behind
    /// a proxy or a DNS name, asked every 5 s; not on a cluster, where any node hears every
    /// reset), waiting 100 ms doubled up to 5 s between failed attempts; after each subscription
    /// it tells the handler [`ResetNotice::Subscribed`] (see the [module docs](crate::watch) for
    /// why).
    ///
    /// Must be called within a Tokio runtime (the watch is spawned on it); outside one, it is a
    /// [`RedisStoreError::Config`] error.
    ///
    /// ```no_run
    /// use ratelimit_core::{DenialCache, SystemClock};
    /// use ratelimit_redis::{RedisStore, ResetNotice};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisStore::builder("redis://127.0.0.1:6379")
    ///     .announce_resets(true)
    ///     .build()
    ///     .await?;
    /// let cache = DenialCache::new(redis.clone(), SystemClock::new());
    /// let heard = cache.clone(); // shares the cache's denials
    /// let _watch = redis.watch_resets(move |notice: ResetNotice<'_>| notice.apply(&heard))?;
    /// // ... the layer over `cache`; keep `_watch` for as long as it serves.
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch_resets(
        &self,
        handler: impl Fn(ResetNotice<'_>) + Send + Sync + 'static,
    ) -> Result<ResetWatch, RedisStoreError> {
        self.watch_settings().spawn(handler)
    }
}

impl LazyRedisStore {
    /// [`RedisStore::watch_resets`], from the store's settings: the watch starts now, without
    /// waiting for the store to be built, and subscribes as soon as Redis can be reached (its
    /// [`ResetNotice::Subscribed`] then comes as for any subscription).
    pub fn watch_resets(
        &self,
        handler: impl Fn(ResetNotice<'_>) + Send + Sync + 'static,
    ) -> Result<ResetWatch, RedisStoreError> {
        self.watch_settings()?.spawn(handler)
    }
}

/// Subscribes to `channel` on each node of `infos` in turn, hands every notice to `handler`, and
/// subscribes again when the subscription is lost, for as long as the task runs.
async fn watch(
    infos: Box<[ConnectionInfo]>,
    cluster: bool,
    channel: String,
    subscribe_within: Duration,
    response_timeout: Duration,
    handler: Arc<Handler>,
    subscribed: Arc<AtomicBool>,
) {
    // Not subscribed once the task ends, however it ends (the watch dropped, the runtime shut
    // down, a handler that panicked).
    struct Unsubscribed(Arc<AtomicBool>);
    impl Drop for Unsubscribed {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let _unsubscribed = Unsubscribed(Arc::clone(&subscribed));
    let mut wait = RETRY_MIN;
    // A cluster's seeds, then the nodes it names (learned at each subscription): a watch given
    // one seed subscribes on another node once that one is gone, as the store's cluster client
    // goes on without it.
    let mut nodes = infos.into_vec();
    let seeds = nodes.len();
    let mut turn = 0;
    loop {
        let Some(info) = nodes.get(turn % nodes.len().max(1)).cloned() else {
            return;
        };
        turn += 1;
        let info = &info;
        // Which server the address leads to, asked before subscribing (a failover between the
        // two makes the next check find another server, and subscribe again: the safe side).
        // Not on a cluster (see `Server::ClusterNode`): subscribing again on another node of it
        // would only tell the handler to forget all it holds (`Subscribed`).
        let server = if cluster {
            Server::ClusterNode
        } else {
            run_id(info, subscribe_within).await
        };
        match subscribe(info, &channel, subscribe_within).await {
            // On a cluster, the nodes it names, learned before the handler hears of the
            // subscription (a seed lost just after it leaves them known). A node that names none
            // has left the cluster (or not joined it): it hears no publication, and another is
            // tried.
            Ok(_) if cluster && !learn_nodes(&mut nodes, seeds, info, subscribe_within).await => {
                tracing::warn!(%channel, retry_in = ?wait, "the reset watch could not subscribe: the node serves no slot of a cluster");
            }
            Ok((sink, stream)) => {
                subscribed.store(true, Ordering::Release);
                ::metrics::counter!(metrics::RESET_WATCH_SUBSCRIPTIONS_TOTAL).increment(1);
                tracing::debug!(%channel, "the reset watch is subscribed");
                handler(ResetNotice::Subscribed);
                wait = RETRY_MIN;
                let lost = listen(
                    sink,
                    stream,
                    &*handler,
                    response_timeout,
                    (info, server, subscribe_within),
                )
                .await;
                subscribed.store(false, Ordering::Release);
                tracing::warn!(%channel, reason = %lost, "the reset watch lost its subscription: subscribing again");
            }
            Err(error) => {
                tracing::warn!(%channel, %error, retry_in = ?wait, "the reset watch could not subscribe");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// A connection of its own to `info`'s node, subscribed to `channel`, within `within`.
async fn subscribe(
    info: &ConnectionInfo,
    channel: &str,
    within: Duration,
) -> Result<(PubSubSink, PubSubStream), String> {
    let attempt = async {
        let client = redis::Client::open(info.clone())?;
        let (mut sink, stream) = client.get_async_pubsub().await?.split();
        sink.subscribe(channel).await?;
        Ok::<_, RedisError>((sink, stream))
    };
    match tokio::time::timeout(within, attempt).await {
        Ok(Ok(pair)) => Ok(pair),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no subscription within {within:?}")),
    }
}

/// The most nodes a cluster's watch learns beyond its seeds.
const MAX_LEARNED_NODES: usize = 64;

/// Learns the nodes that `info`'s node names in `CLUSTER SLOTS` (masters and replicas, every one
/// of which hears every publication), asked on a new connection within `within`: `nodes` becomes
/// its first `seeds` (the cluster's seed nodes) and those, each reached with `info`'s settings
/// (its TLS and credentials) at its own address. `false` if the node names no slot range: it
/// serves no slot of a cluster (it left one, or never joined). Unanswered, nothing is learned,
/// and the node is taken as it is (`true`); so is one whose ranges name no usable address (a
/// cluster announcing unknown endpoints behind one address), though nothing is learned from it.
async fn learn_nodes(
    nodes: &mut Vec<ConnectionInfo>,
    seeds: usize,
    info: &ConnectionInfo,
    within: Duration,
) -> bool {
    let Some((ranges, named)) = cluster_nodes(info, within).await else {
        return true;
    };
    if ranges == 0 {
        return false;
    }
    nodes.truncate(seeds);
    for (host, port) in named {
        if nodes.len() >= seeds + MAX_LEARNED_NODES {
            break;
        }
        let Some(addr) = crate::cluster::address_like(info.addr(), &host, port) else {
            break;
        };
        if !nodes.iter().any(|n| *n.addr() == addr) {
            nodes.push(info.clone().set_addr(addr));
        }
    }
    true
}

/// How many slot ranges `info`'s node names in `CLUSTER SLOTS`, and the nodes it names there that
/// have a usable address (a cluster that announces unknown endpoints, `?`, names none), asked on
/// a new connection within `within`; `None` if unanswered.
async fn cluster_nodes(
    info: &ConnectionInfo,
    within: Duration,
) -> Option<(usize, Vec<(String, u16)>)> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let slots = ask::<Value>(info, &cmd, within).await?.ok()?;
    Some((
        crate::cluster::slot_ranges(&slots).count(),
        nodes_of(&slots),
    ))
}

/// `cmd`'s answer from `info`'s node, asked on a new connection of its own; `None` if none came
/// within `within`.
async fn ask<T: redis::FromRedisValue>(
    info: &ConnectionInfo,
    cmd: &redis::Cmd,
    within: Duration,
) -> Option<Result<T, RedisError>> {
    let attempt = async {
        let client = redis::Client::open(info.clone())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        cmd.query_async::<T>(&mut conn).await
    };
    tokio::time::timeout(within, attempt).await.ok()
}

/// Every node a `CLUSTER SLOTS` reply names (each slot range's master and replicas), by the
/// address it announces; those without a usable one (an empty or wildcard host, `?`) left out.
fn nodes_of(slots: &Value) -> Vec<(String, u16)> {
    let mut found = Vec::new();
    let named = crate::cluster::slot_ranges(slots)
        .flat_map(|range| range.iter().skip(2))
        .filter_map(crate::cluster::node_address);
    for addr in named {
        if !found.contains(&addr) {
            found.push(addr);
        }
    }
    found
}

/// What a question of which server an address leads to found.
enum Server {
    /// The server's `run_id`.
    Is(String),
    /// No answer (a timeout, a connection that failed, an error reply other than a refusal):
    /// asked again.
    Unanswered,
    /// Not to be asked: `INFO` refused to the user (no `+info`), or a server that tells no
    /// `run_id`.
    Untold,
    /// A Redis Cluster's node: which one is not asked (every node hears every publication, and
    /// an address that leads to another node of it loses nothing), but whether it still serves
    /// a slot of the cluster.
    ClusterNode,
}

/// Which server `info`'s address leads to now, asked on a new connection (`INFO server`'s
/// `run_id`), within `within`.
async fn run_id(info: &ConnectionInfo, within: Duration) -> Server {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("server");
    match ask::<String>(info, &cmd, within).await {
        Some(Ok(text)) => text
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map_or(Server::Untold, |id| Server::Is(id.trim().to_owned())),
        Some(Err(error)) if crate::error::refused(&error) => Server::Untold,
        Some(Err(_)) | None => Server::Unanswered,
    }
}

/// Hands each message of `stream` to `handler` until the subscription is lost: the connection
/// closed, or a `PING` sent after [`PING_AFTER`] of silence went unanswered for
/// `response_timeout`; or, `server` being the address, which server it led to when the
/// subscription was made, and how long to wait for an answer, the address leads to another
/// server now, asked every [`SERVER_CHECK_EVERY`]: a failover behind one address (a proxy, a DNS
/// name), whose old primary, made a replica, keeps the subscription and answers its `PING`s, but
/// is not where resets are published now. If the question had gone unanswered, the first answer
/// ends the subscription too, to be made again where the server is known. A cluster's node
/// ([`Server::ClusterNode`]) is asked instead, as often, whether it still serves a slot of the
/// cluster: one that left it hears no publication. Returns why.
async fn listen(
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    handler: &Handler,
    response_timeout: Duration,
    mut server: (&ConnectionInfo, Server, Duration),
) -> String {
    let heard = ::metrics::counter!(metrics::RESET_NOTICES_TOTAL);
    let mut check_at = tokio::time::Instant::now() + SERVER_CHECK_EVERY;
    loop {
        let (info, subscribed_to, within) = &mut server;
        if !matches!(subscribed_to, Server::Untold) && tokio::time::Instant::now() >= check_at {
            check_at = tokio::time::Instant::now() + SERVER_CHECK_EVERY;
            // Not known now (the server down): the `PING`s say whether the subscription is alive.
            if let Server::ClusterNode = subscribed_to {
                if cluster_nodes(info, *within)
                    .await
                    .is_some_and(|(ranges, _)| ranges == 0)
                {
                    return "its node serves no slot of a cluster now (it left the cluster)"
                        .to_owned();
                }
            } else {
                match (run_id(info, *within).await, &*subscribed_to) {
                    (Server::Is(now), Server::Is(was)) if now != *was => {
                        return format!(
                            "its address now leads to another server (run_id {now}, subscribed on {was})"
                        );
                    }
                    (Server::Is(now), Server::Unanswered) => {
                        return format!(
                            "which server it subscribed on was not known (no answer then); its \
                             address leads to run_id {now}"
                        );
                    }
                    // Refused now (the user's rights changed): no longer checked.
                    (Server::Untold, _) => *subscribed_to = Server::Untold,
                    _ => {}
                }
            }
        }
        let next = poll_fn(|cx| Pin::new(&mut stream).poll_next(cx));
        match tokio::time::timeout(PING_AFTER, next).await {
            Ok(Some(message)) => match parse(message.get_payload_bytes()) {
                Some((key, limit_fingerprint)) => {
                    heard.increment(1);
                    handler(ResetNotice::Reset {
                        key,
                        limit_fingerprint,
                    });
                }
                None => tracing::debug!("a message that is not a reset notice, ignored"),
            },
            Ok(None) => return "the connection closed".to_owned(),
            Err(_silent) => {
                match tokio::time::timeout(response_timeout, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return error.to_string(),
                    Err(_) => return format!("no answer to a PING within {response_timeout:?}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node of every range, masters and replicas, once each; none without a usable
    /// address.
    #[test]
    fn the_nodes_a_cluster_names_are_read_from_cluster_slots() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |from: i64, to: i64, nodes: Vec<Value>| {
            let mut r = vec![Value::Int(from), Value::Int(to)];
            r.extend(nodes);
            Value::Array(r)
        };
        let slots = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
            ),
            range(5461, 10922, vec![node("10.0.0.2", 7001), node("?", 7004)]),
            range(10923, 12000, vec![node("", 7002), node("10.0.0.1", 7000)]),
            range(
                12001,
                16383,
                vec![node("0.0.0.0", 7005), node("10.0.0.3", 70_000)],
            ),
        ]);
        assert_eq!(
            nodes_of(&slots),
            [
                ("10.0.0.1".to_owned(), 7000),
                ("10.0.0.4".to_owned(), 7003),
                ("10.0.0.2".to_owned(), 7001),
            ]
        );
        assert!(nodes_of(&Value::Nil).is_empty());
    }

    #[test]
    fn a_notice_reads_back_as_it_was_written() {
        for key in [&b""[..], b"login\0alice", &[0xff; 300]] {
            let n = notice(key, 0x0123_4567_89ab_cdef);
            assert_eq!(parse(&n), Some((key, 0x0123_4567_89ab_cdef)));
        }
        assert_eq!(parse(b"short"), None);
        assert_eq!(channel("myapp:rl"), "myapp:rl:resets");
    }
}
