//! `RedisStore`: connections, the builder, and the `Store` implementation.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Poll;
use std::time::Duration;

use deadpool_redis::Runtime;
use ratelimit_core::{Algorithm, Clock, Decision, Limit, MAX_EXACT, Reset, Store};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::cluster;
use crate::error::RedisStoreError;
use crate::in_runtime::in_runtime;
use crate::key::{self, each_state_key, key_count, state_keys};
use crate::lazy::LazyRedisStore;
use crate::reply::{self, Shape};
use crate::scripts;
use crate::silence::Silence;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "rl";
/// The default number of multiplexed connections a store keeps open: one. One connection carries
/// any number of concurrent checks, pipelined; fewer connections mean larger batches per read and
/// write on both ends, which measured cheapest for the server (see `docs/redis.md`).
pub const DEFAULT_POOL_SIZE: usize = 1;
/// The default time allowed to open a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default time the pool may wait for room to make a connection (the store takes each one out
/// of the pool, and the pool has room for every opening the store makes at once, so this wait
/// does not happen in practice; a check's wait for a connection being re-opened is bounded by
/// its response timeout).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);
/// The default time a check waits for Redis to answer, connection included.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest `connect_timeout`, `wait_timeout` and `response_timeout` accepted: an hour. A
/// deadline is counted as now + timeout, which would overflow for `Duration::MAX`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);
/// The default [`ping_after_idle`](RedisStoreBuilder::ping_after_idle): a connection that has sent
/// nothing for 10 s is asked with a `PING` before a check is written on it.
pub const DEFAULT_PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// The future of [`RedisStore::check_many`]: one decision per cost, in order.
pub type CheckManyFuture =
    Pin<Box<dyn Future<Output = Result<Vec<Decision>, RedisStoreError>> + Send>>;

/// The future of one [`RedisStore`] check.
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<Decision, RedisStoreError>> + Send>>;

/// The future of a [`RedisStore::reset`].
pub type ResetFuture = Pin<Box<dyn Future<Output = Result<(), RedisStoreError>> + Send>>;

/// A rate-limit [`Store`] on Redis or Redis Cluster, shared by every gateway that points at it.
///
/// Each check is one `EVALSHA` of the algorithm's Lua script: read, decide and write happen in
/// one atomic step on the server, so twenty gateways enforce one limit together and never spend
/// the same token twice. The scripts make the same decisions as `ratelimit-core`'s algorithms, in
/// the same integer microseconds.
///
/// Cloning is cheap and shares the connections.
///
/// See the [crate documentation](crate) for an example and `docs/redis.md` for the key layout,
/// the scripts, expiry and the cluster rules.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    generation: AtomicU64,
    prefix: String,
    /// The URLs given to the builder, named (their passwords redacted) in the error of every
    /// connection that cannot be opened, at start-up or later.
    urls: Box<[String]>,
    response_timeout: Duration,
    /// `ping_after_idle`, in microseconds (`u64::MAX` for never).
    ping_after_idle_us: u64,
    clock: Option<Arc<dyn Clock>>,
    expiry_slack_ms: u64,
    /// The channel a reset announces itself on (`<prefix>:resets`), if it does
    /// (`announce_resets`).
    reset_channel: Option<String>,
    /// The nodes' connection settings, for [`RedisStore::watch_resets`]'s own connection.
    infos: Box<[redis::ConnectionInfo]>,
    connect_timeout: Duration,
    /// The runtime the store was built on, where its own tasks run if it is a multi-thread
    /// runtime still running (see [`crate::spawn`]).
    home: crate::spawn::Home,
    /// The origin of the slots' [`Silence`] times.
    epoch: tokio::time::Instant,
    /// Woken whenever a slot's connection is installed: a check waiting for its own slot's
    /// opening takes the new one instead (see [`Inner::slot_connection`]).
    installed_any: tokio::sync::Notify,
    /// On a cluster, the refusals as unauthenticated that hold checks for the reconnect gap
    /// (see [`Refusals`]).
    refusals: Refusals,
}

/// A cluster master refusing checks' connections as unauthenticated (a password set on the node
/// that the store's URLs do not give). The cluster client opens its link to the node again by
/// itself after each refusal (and after the broken link the server's closing leaves), so every
/// second check of the node's keys would make a connection.
///
/// Which master a key's hash slot is on is not known here, so the slots are told apart by what
/// their checks get: a slot whose check is refused is a suspect, and so is one whose check fails
/// on a broken link while refusals go on (within [`REFUSALS_REMEMBERED`] of the last), until one
/// of its checks is answered. For [`RECONNECT_GAP`] after each such failure, while refusals go
/// on, the suspects' checks fail at once, without being sent: with the refusal, or for a slot
/// whose own check was not refused, as an unavailable store's. One check of each suspect a
/// [`SUSPECT_RETRY`] is sent all the same, which clears it if answered (its master accepts the
/// store again while another still refuses it, or its link broke for another reason). The
/// other slots' checks are sent as always. So the refusing master gets about one connection
/// every two gaps, and one for each two of its slots in use a second, whatever its number of
/// keys, while the other masters' keys are served; a slot whose master accepts the store again
/// is served from its next retry, within a second, and nothing is held a second after the last
/// refusal. A standalone connection gets its gap through its slot's failed openings (see
/// [`Failed`]).
struct Refusals {
    /// Until when the suspects are held, in the store's microseconds (`Inner::micros`); 0 for
    /// none.
    until: AtomicU64,
    /// When the last refusal came (0 for none yet).
    last: AtomicU64,
    error: Mutex<Option<RedisStoreError>>,
    /// Per hash slot, made at the first refusal: 0 for a slot that is no suspect; else when a
    /// check of the slot last went to its master while it was one (µs), shifted left by one,
    /// with the low bit set if the slot's own check was refused.
    slots: OnceLock<Box<[AtomicU64]>>,
}

/// How long after the last refusal as unauthenticated suspects are held, and a broken link makes
/// its slot a suspect (see [`Refusals`]).
const REFUSALS_REMEMBERED: Duration = Duration::from_secs(1);

/// How often a check of a suspect slot is sent all the same (see [`Refusals`]).
const SUSPECT_RETRY: Duration = Duration::from_secs(1);

enum Backend {
    Single(deadpool_redis::Pool),
    Cluster(deadpool::managed::Pool<cluster::Manager>),
}

/// One of a slot's flags (`probing`, `watching`), claimed: a task of that kind runs for the slot,
/// and no other starts. Cleared when this drops, however the task ends (done, panicked, or
/// dropped with its runtime, even unrun), so it is made before the task is spawned.
struct Claimed {
    inner: Arc<Inner>,
    slot: usize,
    flag: fn(&Slot) -> &AtomicBool,
}

impl Claimed {
    /// Slot `slot`'s `flag`, if no one holds it.
    fn claim(inner: &Arc<Inner>, slot: usize, flag: fn(&Slot) -> &AtomicBool) -> Option<Claimed> {
        // SeqCst: a watch letting its flag go then reading the marks, and a check writing a mark
        // then taking the flag, must not both miss the other's write (see `watch`).
        let taken = flag(&inner.slots[slot]).swap(true, Ordering::SeqCst);
        (!taken).then(|| Claimed {
            inner: Arc::clone(inner),
            slot,
            flag,
        })
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        (self.flag)(&self.inner.slots[self.slot]).store(false, Ordering::Release);
    }
}

fn probing(slot: &Slot) -> &AtomicBool {
    &slot.probing
}

fn watching(slot: &Slot) -> &AtomicBool {
    &slot.watching
}

/// A check's command on its way: if the check ends without the answer (its caller gave up, or
/// its deadline passed), the slot's connection is watched, so that its silence is probed even if
/// no other check comes (see [`Inner::watch`]).
struct Unanswered<'a> {
    inner: &'a Arc<Inner>,
    slot: usize,
    generation: u64,
    /// When the command was sent (the silence's clock).
    sent: u64,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            // Marked if the connection has no mark: a command sent while another was marked
            // stays unmarked once that one is answered (see `Silence::unanswered`).
            self.inner.slots[self.slot]
                .silence
                .unanswered(self.generation, self.sent);
            self.inner.watch(self.slot, self.generation);
        }
    }
}

/// A slot's failed openings.
#[derive(Default)]
struct Failed {
    count: u64,
    last: Option<RedisStoreError>,
    at: Option<tokio::time::Instant>,
}

impl Failed {
    /// An opening failed with `e`: the server's answer, which the next opening waits a gap for.
    fn record(&mut self, e: RedisStoreError) {
        self.count += 1;
        self.last = Some(e);
        self.at = Some(tokio::time::Instant::now());
    }

    /// An opening ended before it finished (its task panicked, or its runtime shut down): the
    /// checks waiting for it get `e`, and the next check opens again at once (nothing was heard
    /// from the server).
    fn record_unfinished(&mut self, e: RedisStoreError) {
        self.count += 1;
        self.last = Some(e);
        self.at = None;
    }

    /// The last failure's error if there has been one since the count was `count`.
    fn last_if_newer(&self, count: u64) -> Option<RedisStoreError> {
        (self.count != count).then(|| self.last.clone()).flatten()
    }

    /// The last failure's error if it is less than [`RECONNECT_GAP`] old: the next opening waits
    /// that long, and checks meanwhile fail at once with it.
    fn recent(&self) -> Option<RedisStoreError> {
        let at = self.at?;
        (at.elapsed() < RECONNECT_GAP)
            .then(|| self.last.clone())
            .flatten()
    }
}

/// The least time between a failed opening of a slot's connection and the next. A server that
/// refuses connections (restarting, its port closed) refuses in microseconds: without a gap, every
/// check would open one, thousands a second per gateway, against a server coming back up.
const RECONNECT_GAP: Duration = Duration::from_millis(100);

/// `d` in microseconds.
fn micros_of(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One long-lived multiplexed connection. Checks share it (it pipelines their commands); it is
/// replaced, through the pool, when it breaks or stops answering.
struct Slot {
    conn: Mutex<Option<(u64, Conn)>>,
    /// Set while a task opens this slot's connection.
    opening: AtomicBool,
    /// Woken when an opening ends.
    opened: tokio::sync::Notify,
    /// How many openings have failed, the last one's error, and when it failed.
    failed: Mutex<Failed>,
    /// When the current connection was installed, in the store's microseconds (`Inner::micros`).
    installed: AtomicU64,
    /// When a check last wrote a command on the current connection (or when it was installed), in
    /// the silence's clock (`Inner::micros` plus 1): one idle for the store's `ping_after_idle`
    /// is asked with a `PING` first (see [`Inner::ping_idle`]). One time per failure domain: a
    /// cluster connection links to each master apart, and one master's link may sit idle (and be
    /// closed) while the others are busy.
    used: Box<[AtomicU64]>,
    /// How long the current connection has left a command unanswered: whether the check timed
    /// out in the store or was dropped first by its caller (whose timeout, such as the tower
    /// layer's, may be the shorter), so it may also stand for an answer that came after its
    /// caller left.
    ///
    /// A check that finds it silent for the response timeout starts a probe (see
    /// [`Inner::probe`]): a `PING` on the connection, in a task of its own, which clears it if
    /// answered within the response timeout and replaces the connection if not. A peer that
    /// vanished without closing the connection (power loss, a partition) would otherwise keep it
    /// until the kernel gives up on the socket, many minutes later.
    ///
    /// On a cluster connection (one connection per master, whose answers are not ordered with
    /// each other's) an answer from one master says nothing of another, so only probes clear it:
    /// the probe's `PING` goes to every master.
    silence: Silence,
    /// Set while a probe of this slot's connection runs.
    probing: AtomicBool,
    /// Set while a task watches this slot's connection for silence (see [`Inner::watch`]).
    watching: AtomicBool,
    /// Replacements of this slot's cluster connection tried in a row since it last answered a
    /// probe, each of which kept it (see [`Inner::reopen`]): they space out the next.
    kept: AtomicU32,
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(cluster::Connection),
}

impl Conn {
    /// Sends `cmd` (an `EVALSHA` of `script`) and returns the script's reply. Re-sent only after
    /// an answer that proves the script did not run (`NOSCRIPT`; on a cluster, also redirections
    /// and refusals: see [`cluster`]); never after any other error, since the script may have run.
    async fn eval(&mut self, script: &redis::Script, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cluster::eval_on(c, script, cmd, false, &mut 0).await,
            Conn::Cluster(c) => c.eval(script, cmd).await,
        }
    }

    /// `PING` (on a cluster, every primary), answered `within` (on a cluster, from when it has
    /// its turn into the client).
    async fn ping(
        &mut self,
        within: Duration,
    ) -> Result<Result<(), RedisError>, tokio::time::error::Elapsed> {
        let ping = redis::cmd("PING");
        match self {
            Conn::Single(c) => tokio::time::timeout(within, ping.query_async(c)).await,
            Conn::Cluster(c) => c.ping(&ping, within).await,
        }
    }

    /// `SCRIPT LOAD` (on a cluster, on every node: redis-rs sends it to replicas too).
    async fn load(&mut self, script: &redis::Script) -> Result<(), RedisError> {
        match self {
            Conn::Single(c) => script.load_async(c).await.map(drop),
            Conn::Cluster(c) => c.load(script).await,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisStore")
            .field(
                "backend",
                &match i.backend {
                    Backend::Single(_) => "standalone",
                    Backend::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &i.prefix)
            .field("pool_size", &i.slots.len())
            .field("response_timeout", &i.response_timeout)
            .field("client_clock", &i.clock.is_some())
            .field("expiry_slack_ms", &i.expiry_slack_ms)
            .finish()
    }
}

/// Settings for a [`RedisStore`]; see [`RedisStore::builder`] and [`RedisStore::cluster`].
#[must_use]
#[derive(Clone)]
pub struct RedisStoreBuilder {
    urls: Vec<String>,
    pub(crate) cluster: bool,
    prefix: String,
    pool_size: usize,
    connect_timeout: Duration,
    /// Whether `connect_timeout` was set (the cluster client's is capped only when it was not).
    connect_timeout_set: bool,
    wait_timeout: Duration,
    pub(crate) response_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    /// `None` until set: then zero with the server's clock, the check's timeout with a client
    /// clock (see `client_clock`).
    expiry_slack: Option<Duration>,
    announce_resets: bool,
    ping_after_idle: Duration,
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    root_cert: Option<Vec<u8>>,
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    client_tls: Option<redis::ClientTlsConfig>,
}

/// The certificates a cluster's client is given (`tls-rustls` only: on native-tls it takes none).
#[cfg(feature = "tls-rustls")]
pub(crate) type ClusterCertificates = redis::TlsCertificates;
/// The certificates a cluster's client is given (`tls-rustls` only: on native-tls it takes none).
#[cfg(not(feature = "tls-rustls"))]
pub(crate) type ClusterCertificates = std::convert::Infallible;

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisStoreBuilder");
        d.field("nodes", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("wait_timeout", &self.wait_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("client_clock", &self.clock.is_some())
            .field("expiry_slack", &self.expiry_slack)
            .field("announce_resets", &self.announce_resets)
            .field("ping_after_idle", &self.ping_after_idle);
        // Whether they are set, never what they hold.
        #[cfg(any(feature = "tls", feature = "tls-rustls"))]
        d.field("tls_root_certificate", &self.root_cert.is_some())
            .field("tls_client_certificate", &self.client_tls.is_some());
        d.finish()
    }
}

impl RedisStore {
    /// Whether this store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.backend, Backend::Cluster(_))
    }

    /// The runtime the store was built on, where its own tasks run (see
    /// [`build`](RedisStoreBuilder::build)).
    pub(crate) fn home(&self) -> &crate::spawn::Home {
        &self.inner.home
    }

    /// Settings for a store on one Redis server (or a primary behind a proxy), from a URL:
    /// `redis://[[user]:password@]host[:port][/db]`. An ACL user is given as the URL's user name.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(vec![url.into()], false)
    }

    /// Settings for a store on a Redis Cluster, from the URLs of one or more of its nodes (the
    /// rest are discovered). The store follows `MOVED` and `ASK` redirections itself, and re-sends
    /// a check only after answers that prove its script did not run (see `docs/redis.md`).
    pub fn cluster<I, S>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::new(urls.into_iter().map(Into::into).collect(), true)
    }

    /// The Redis keys holding `key`'s state under `limit`: the state hash first, then, for the
    /// sliding log, one list per quota. For operations (inspecting, deleting a key's state) and
    /// tests.
    #[must_use]
    pub fn state_keys(&self, key: &[u8], limit: &Limit) -> Vec<String> {
        state_keys(&self.inner.prefix, key, limit)
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// What a reset watch needs: the nodes' connection settings, the prefix, and the connect and
    /// response timeouts.
    pub(crate) fn watch_settings(&self) -> crate::watch::Settings {
        let inner = &self.inner;
        crate::watch::Settings {
            infos: inner.infos.clone(),
            cluster: self.is_cluster(),
            prefix: inner.prefix.clone(),
            connect_timeout: inner.connect_timeout,
            response_timeout: inner.response_timeout,
        }
    }

    /// Checks `cost` for `key` against `limit`; the same as [`Store::check`], as an inherent
    /// method so callers need not import the trait.
    pub fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> CheckFuture {
        let script = scripts::script(limit.algorithm());
        self.call(script, key, limit, wire_cost(cost), move |value, shape| {
            reply::decision(value, shape, cost)
        })
    }

    /// Checks several costs for `key` against `limit` in **one** script call: they are decided in
    /// order, each on the state the previous one left, at one instant, exactly as the same checks
    /// made one after another at that instant would be. Returns one decision per cost, in order.
    ///
    /// This is the call [`Coalescing`](crate::Coalescing) sends for a queue of concurrent checks.
    pub fn check_many(&self, key: &[u8], limit: &Limit, costs: &[u64]) -> CheckManyFuture {
        if costs.is_empty() {
            return Box::pin(async { Ok(Vec::new()) });
        }
        // The costs, clamped as for one check, joined by commas in place of the single cost.
        let joined = costs
            .iter()
            .map(|&c| wire_cost(c).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let costs = costs.to_vec();
        let script = scripts::multi_script(limit.algorithm());
        self.call(script, key, limit, joined, move |value, shape| {
            reply::decisions(value, shape, &costs)
        })
    }

    /// Forgets `key`'s state under `limit` (see [`Reset`]): deletes every Redis key a check of
    /// it touches, in one step. Sent as a check is (a script, by `EVALSHA`, within the response
    /// timeout, over the same connections), so a restricted Redis user needs `+del` on the
    /// prefix as well (see `docs/redis.md`). The same as [`Reset::reset`], as an inherent
    /// method.
    pub fn reset(&self, key: &[u8], limit: &Limit) -> ResetFuture {
        let script = scripts::reset_script();
        let mut cmd = evalsha_on_keys(&self.inner.prefix, script, key, limit);
        if let Some(channel) = &self.inner.reset_channel {
            // The channel and the notice: the script deletes the keys, then publishes it, in one
            // step (a refused delete publishes nothing).
            cmd.arg(channel)
                .arg(crate::watch::notice(key, limit.fingerprint()));
        }
        self.send(
            script,
            move |_| Ok(cmd),
            |value| match value {
                Value::Int(_) => Ok(()),
                other => Err(RedisStoreError::UnexpectedReply(format!("{other:?}"))),
            },
        )
    }

    /// One `EVALSHA` of `script` with `cost` (one cost, or several joined), its reply decoded by
    /// `decode`, all within the response timeout. Everything the script needs is encoded now,
    /// into one command the future owns; but a client clock's time, which is read when the
    /// response timeout starts (the future's first poll in a runtime): a future polled late
    /// would otherwise send a time from before it, older than the expiry slack covers (see
    /// `RedisStoreBuilder::client_clock`).
    fn call<T: Send + 'static>(
        &self,
        script: Option<&'static redis::Script>,
        key: &[u8],
        limit: &Limit,
        cost: impl redis::ToRedisArgs,
        decode: impl FnOnce(&Value, Shape) -> Result<T, RedisStoreError> + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<T, RedisStoreError>> + Send>> {
        let Some(script) = script else {
            let alg = limit.algorithm();
            return Box::pin(async move {
                Err(RedisStoreError::config(
                    "limit",
                    format!("ratelimit-redis has no script for the algorithm {alg}"),
                ))
            });
        };
        let shape = Shape::of(limit);
        let decode = move |value: &Value| decode(value, shape);
        if self.inner.clock.is_none() {
            let cmd = command(&self.inner, script, key, limit, cost, None);
            return self.send(script, move |_| Ok(cmd), decode);
        }
        let (key, limit, cost) = (key.to_vec(), limit.clone(), cost.to_redis_args());
        self.send(
            script,
            move |inner| {
                let now = client_time(inner)?;
                Ok(command(inner, script, &key, &limit, cost, now))
            },
            decode,
        )
    }

    /// Sends the command `cmd` makes when the response timeout starts, an `EVALSHA` of `script`,
    /// its reply decoded by `decode`, within the response timeout.
    fn send<T: Send + 'static>(
        &self,
        script: &'static redis::Script,
        cmd: impl FnOnce(&Inner) -> Result<Cmd, RedisStoreError> + Send + 'static,
        decode: impl FnOnce(&Value) -> Result<T, RedisStoreError> + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<T, RedisStoreError>> + Send>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            // Polled first outside a runtime (a check made in the tower layer's `call` on a
            // thread without one), it yields there, and its time counts from the next poll.
            in_runtime().await?;
            let deadline = tokio::time::Instant::now() + inner.response_timeout;
            let cmd = cmd(&inner)?;
            decode(&inner.eval_value(script, cmd, deadline).await?)
        })
    }
}

impl Store for RedisStore {
    type Error = RedisStoreError;
    type Future = CheckFuture;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        RedisStore::check(self, key, limit, cost)
    }

    /// One for a standalone server; [`CLUSTER_FAILURE_DOMAINS`] for a cluster.
    fn failure_domains(&self) -> usize {
        failure_domains(self.is_cluster())
    }

    /// On a cluster, the key's range of 256 hash slots (see [`CLUSTER_FAILURE_DOMAINS`]).
    fn failure_domain(&self, key: &[u8]) -> usize {
        failure_domain(self.is_cluster(), key)
    }

    /// The builder's [`response_timeout`](RedisStoreBuilder::response_timeout) (500 ms by
    /// default): behind the tower layer, set it a little above the layer's timeout.
    fn response_timeout(&self) -> Option<Duration> {
        Some(self.inner.response_timeout)
    }
}

impl Reset for RedisStore {
    type ResetFuture = ResetFuture;

    fn reset(&self, key: &[u8], limit: &Limit) -> ResetFuture {
        RedisStore::reset(self, key, limit)
    }
}

/// The failure domains of a cluster store: its 16,384 hash slots in ranges of 256. A master
/// serves contiguous ranges of slots, so a master lost takes down the domains inside its ranges;
/// behind the tower layer, whose circuit breaker keeps a circuit per domain, the other masters'
/// keys go on being checked. A domain at the edge of the lost master's ranges, shared with another
/// master (with three masters, about 1 % of the keys), fails with it when its failures come in a
/// row. Finer ranges would share less, but each circuit opens on its own keys' failures, so they
/// would take longer to open.
pub const CLUSTER_FAILURE_DOMAINS: usize = 64;

pub(crate) fn failure_domains(cluster: bool) -> usize {
    if cluster { CLUSTER_FAILURE_DOMAINS } else { 1 }
}

pub(crate) fn failure_domain(cluster: bool, key: &[u8]) -> usize {
    if cluster {
        domain_of_slot(key::hash_slot(key))
    } else {
        0
    }
}

/// The failure domain (range of hash slots) a cluster's hash slot is in.
fn domain_of_slot(slot: u16) -> usize {
    usize::from(slot) / (16_384 / CLUSTER_FAILURE_DOMAINS)
}

/// The client clock's time (µs), if the store has one.
fn client_time(inner: &Inner) -> Result<Option<u64>, RedisStoreError> {
    let Some(clock) = &inner.clock else {
        return Ok(None);
    };
    let micros = clock.now().as_micros();
    // From 2^52 on: GCRA's stored time, the time plus up to 2^52 µs of debt, would reach 2^53,
    // which the scripts refuse as malformed state (see prelude.lua).
    if micros >= MAX_EXACT {
        return Err(RedisStoreError::ClockOutOfRange { micros });
    }
    Ok(Some(micros))
}

/// The `EVALSHA` of `script` on `key`'s state under `limit`: the keys, the time (`now`, the
/// client clock's; else the server's), then `cost` (one cost, or several joined by commas) and
/// the quotas.
fn command(
    inner: &Inner,
    script: &redis::Script,
    key: &[u8],
    limit: &Limit,
    cost: impl redis::ToRedisArgs,
    now: Option<u64>,
) -> redis::Cmd {
    let mut cmd = evalsha_on_keys(&inner.prefix, script, key, limit);
    match now {
        None => cmd.arg("s"),
        Some(t) => cmd.arg(t),
    };
    cmd.arg(cost);
    quota_args(limit, inner.expiry_slack_ms, |a| {
        cmd.arg(a);
    });
    cmd
}

/// `EVALSHA` of `script` on every Redis key of `key`'s checks under `limit` (see
/// [`each_state_key`]), its arguments to follow.
fn evalsha_on_keys(prefix: &str, script: &redis::Script, key: &[u8], limit: &Limit) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(key_count(limit));
    each_state_key(prefix, key, limit, |k| {
        cmd.arg(k.as_bytes());
    });
    cmd
}

/// A cost as the scripts receive it: every burst and limit is at most 2^52, so a larger cost
/// compares the same once clamped to 2^52 + 1, which a double still holds exactly.
pub(crate) fn wire_cost(cost: u64) -> u64 {
    cost.min(MAX_EXACT + 1)
}

/// ARGV after the time and the cost (see `src/lua/prelude.lua`): quota count, expiry slack, then
/// each quota's parameters, passed to `push` in order.
fn quota_args(limit: &Limit, slack_ms: u64, mut push: impl FnMut(u64)) {
    let quotas = limit.quotas();
    push(quotas.len() as u64);
    push(slack_ms);
    for q in quotas {
        match limit.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra => {
                for a in [
                    q.burst(),
                    q.scale(),
                    q.refill_per_micro(),
                    q.capacity_units(),
                ] {
                    push(a);
                }
            }
            _ => {
                push(q.limit());
                push(q.period_micros());
            }
        }
    }
}

/// Whether `conn`'s task has ended (its peer closed it), told without waiting: a command on it
/// then fails at its first poll, as it is queued.
fn closed_now(conn: &mut MultiplexedConnection) -> bool {
    let cmd = redis::cmd("PING");
    let mut ping = std::pin::pin!(cmd.query_async::<Value>(conn));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    matches!(ping.as_mut().poll(&mut cx), Poll::Ready(Err(ref e)) if is_broken(e))
}

/// Errors after which a connection is replaced.
pub(crate) fn is_broken(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// A slot's opening in progress: ended (and its waiters woken) when this drops. An opening that
/// did not run to its end (its task dropped with its runtime, even unrun) counts as a failed one,
/// so that its waiters return an error rather than start another opening at once (on a runtime
/// that refuses new tasks, that would spin).
struct Opening {
    inner: Arc<Inner>,
    slot: usize,
    done: bool,
}

impl Opening {
    fn finished(&mut self) {
        self.done = true;
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let slot = &self.inner.slots[self.slot];
        if !self.done {
            lock(&slot.failed).record_unfinished(RedisStoreError::Connection {
                message: "the connection's opening ended before it finished (its task \
                          panicked, or its runtime shut down)"
                    .into(),
                source: None,
            });
        }
        slot.opening.store(false, Ordering::Release);
        slot.opened.notify_waiters();
    }
}

impl Inner {
    /// Sends `cmd` (an `EVALSHA` of `script`) and returns the script's reply, or a timeout at
    /// `deadline` (connection included).
    async fn eval_value(
        self: &Arc<Self>,
        script: &redis::Script,
        cmd: Cmd,
        deadline: tokio::time::Instant,
    ) -> Result<Value, RedisStoreError> {
        let timeout = || RedisStoreError::Timeout {
            after: self.response_timeout,
        };
        // Connections found closed by their idle `PING`, each dropped: then the check takes
        // another. Bounded, so that a server closing every new connection at once cannot keep a
        // check here until its deadline (it is sent on the last one taken, and fails).
        let mut closed = 0;
        let hash_slot = match self.backend {
            Backend::Single(_) => None,
            Backend::Cluster(_) => cluster::first_key(&cmd).map(key::slot_of_redis_key),
        };
        let domain = hash_slot.map_or(0, domain_of_slot);
        if let Some(refused) = hash_slot.and_then(|s| self.held(s)) {
            return Err(refused);
        }
        let (slot, generation, mut conn, sent) = loop {
            let (slot, generation, mut conn) =
                match tokio::time::timeout_at(deadline, self.connection()).await {
                    Ok(c) => c?,
                    Err(_) => return Err(timeout()),
                };
            // One clock read per check: the idle and silence tests and this command's mark.
            let sent = self.micros() + 1;
            let used = self.slots[slot].used[domain].load(Ordering::Relaxed);
            if sent.saturating_sub(used) < self.ping_after_idle_us || closed > self.slots.len() {
                break (slot, generation, conn, sent);
            }
            match self
                .ping_idle(slot, generation, &mut conn, &cmd, sent, deadline)
                .await
            {
                // Answered, but perhaps just at the deadline (a cluster's `PING` waits for its
                // turn first): the check is not sent past it.
                Some(true) if tokio::time::Instant::now() >= deadline => return Err(timeout()),
                Some(true) => break (slot, generation, conn, self.micros() + 1),
                Some(false) => closed += 1,
                None => return Err(timeout()),
            }
        };
        self.slots[slot].used[domain].store(sent, Ordering::Relaxed);
        let mut unanswered = self.sending(slot, generation, &conn, sent);
        let reply = match tokio::time::timeout_at(deadline, conn.eval(script, &cmd)).await {
            Ok(reply) => reply,
            Err(_) => {
                // A command sent just as the connection's task ended (its peer closed it) can be
                // neither answered nor failed: redis-rs queues it on a tokio channel whose
                // receiver is being dropped, and a value sent on a permit taken before that drop
                // is never drained (tokio-rs/tokio#7714). The connection is dead all the same:
                // emptied now, as after a broken reply, not left for the next check to fail on.
                if let Conn::Single(c) = &mut conn
                    && closed_now(c)
                {
                    self.discard(slot, generation);
                }
                // Otherwise the command stays unanswered: the next check on this slot finds it
                // so, and the watch that `unanswered` starts as it drops does if none comes.
                return Err(timeout());
            }
        };
        unanswered.answered = true;
        // A standalone connection that broke is replaced, and so is one to a server that answers
        // READONLY: it was demoted to a replica behind the same address (a failover behind a DNS
        // name or a virtual IP); a new connection finds the new primary. A cluster connection is
        // kept whatever one node did: the client mends its link to that node by itself, the
        // other masters' keys go on being served over it, and a new one could only be made from
        // the seed list, which may be the dead node alone. A cluster connection that stops
        // answering is probed and replaced as a silent one is (see `probe`).
        //
        // So is one that the server takes as unauthenticated (`NOAUTH`, or "unauthenticated
        // multibulk length", after which the server closes it): a password set on the server
        // that the URL does not give (rotated server first). redis-rs lets a new connection's
        // set-up commands be refused without failing the opening, so the refusal comes here.
        // A cluster connection is kept then too (its client reconnects to the node by itself):
        // the refusing master's checks are held for the reconnect gap instead (see `Refusals`).
        let unusable = matches!(&reply, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            || crate::error::unauthenticated(e));
        let replace = matches!(conn, Conn::Single(_))
            && (unusable || matches!(&reply, Err(e) if is_broken(e)));
        if replace {
            // Sent on a connection made less than the gap before: judged by when the command
            // went, not by when the answer came, so that a long round trip does not hide it.
            let young = || {
                let installed = self.slots[slot].installed.load(Ordering::Relaxed);
                Duration::from_micros(sent.saturating_sub(installed)) < RECONNECT_GAP
            };
            // A connection just made answered READONLY too: the address still leads to a replica
            // (a DNS name or virtual IP not yet moved after a failover); or was refused as
            // unauthenticated: the server still asks a password the URL does not give. The next
            // opening waits the reconnect gap, as after a failed one, rather than every check
            // making a connection to the same server. Recorded as the slot is emptied, under its
            // lock: a check that found it empty before the record would open at once, skipping
            // the gap.
            let failure = match &reply {
                Err(e) if unusable && young() => Some(RedisStoreError::Redis(e.clone())),
                _ => None,
            };
            self.discard_with(slot, generation, failure);
        } else if matches!(conn, Conn::Cluster(_)) {
            if let Some(hash_slot) = hash_slot {
                self.heard(hash_slot, &reply);
            }
        } else {
            // An answer, even an error reply: the connection works, and has answered every
            // command sent before this one.
            self.slots[slot].silence.answered(generation, sent);
        }
        reply.map_err(|e| {
            if e.is_timeout() {
                timeout()
            } else {
                RedisStoreError::Redis(e)
            }
        })
    }

    /// A command is sent at `sent` on slot `slot`'s connection (of `generation`): marks it as
    /// outstanding, and probes the connection if an older command has been left unanswered for
    /// the response timeout. The guard it returns has the connection watched if the command's
    /// answer does not come (set `answered` once it does).
    fn sending(
        self: &Arc<Self>,
        slot: usize,
        generation: u64,
        conn: &Conn,
        sent: u64,
    ) -> Unanswered<'_> {
        if let Some(since) = self.slots[slot].silence.sent(generation, sent)
            && Duration::from_micros(sent.saturating_sub(since)) >= self.response_timeout
            && let Some(probing) = Claimed::claim(self, slot, probing)
        {
            // Silent for the response timeout: a probe, in a task of its own so that this
            // check's caller giving up does not cancel it.
            let probe = Arc::clone(self).probe(slot, generation, conn.clone(), probing);
            self.home.spawn(probe);
        }
        Unanswered {
            inner: self,
            slot,
            generation,
            sent,
            answered: false,
        }
    }

    /// Asks slot `slot`'s connection (of `generation`), idle for the store's `ping_after_idle`,
    /// with a `PING` sent at `sent`, before `cmd` is written on it: `Some(true)` if it answered
    /// (even with an error reply), `Some(false)` if it was found closed (it is then dropped, and
    /// the slot opens a new one), `None` if `deadline` passed first. The `PING` is outstanding
    /// as a check's command is: left unanswered, the connection is watched and probed as after
    /// a check.
    ///
    /// A connection the server (or a proxy) closed while it was idle fails the `PING` with a
    /// broken pipe; the check, not yet written, is then sent on another connection. Written on
    /// the closed one, it would have failed, and could not have been sent again.
    ///
    /// On a cluster the `PING` goes to the master of `cmd`'s key. A link found closed is mended
    /// by the cluster client, which meanwhile sends that master's commands to another node it is
    /// linked to: the `PING` is sent again (after a pause, within the deadline) until a node
    /// answers it, and the check follows, answered by the master through its mended link, or
    /// through the other node's `MOVED` and a side connection (see [`cluster`]), which is itself
    /// asked with a `PING` if it was idle.
    async fn ping_idle(
        self: &Arc<Self>,
        slot: usize,
        generation: u64,
        conn: &mut Conn,
        cmd: &Cmd,
        sent: u64,
        deadline: tokio::time::Instant,
    ) -> Option<bool> {
        let mut unanswered = self.sending(slot, generation, conn, sent);
        if let Conn::Cluster(c) = conn {
            let key = cluster::first_key(cmd).unwrap_or_default();
            let mut pause = cluster::FIRST_PAUSE;
            for _ in 0..cluster::MAX_SENDS {
                // The deadline covers the wait for a turn into the client too.
                match tokio::time::timeout_at(deadline, c.ping_master_of(key))
                    .await
                    .ok()?
                {
                    Err(e) if is_broken(&e) => {
                        tracing::debug!(slot, error = %e, "ratelimit-redis: an idle link to a master was closed");
                        // The client's repair of the link starts as this error comes back.
                        tokio::time::timeout_at(deadline, tokio::time::sleep(pause))
                            .await
                            .ok()?;
                        pause = (pause * 2).min(cluster::MAX_PAUSE);
                    }
                    _ => break,
                }
            }
            // Answered, or sent as often as a check may be: the check follows (and fails if the
            // link is still closed).
            unanswered.answered = true;
            return Some(true);
        }
        let within = deadline.saturating_duration_since(tokio::time::Instant::now());
        let answer = conn.ping(within).await.ok()?;
        unanswered.answered = true;
        match answer {
            Err(e) if is_broken(&e) => {
                tracing::debug!(slot, error = %e, "ratelimit-redis: an idle connection was closed");
                self.discard(slot, generation);
                Some(false)
            }
            _ => {
                self.slots[slot].silence.answered(generation, sent);
                Some(true)
            }
        }
    }

    /// Watches slot `i`'s connection (of `generation`), on which a check ended without its answer:
    /// once its oldest unanswered command is a response timeout old, it is probed as a check
    /// would probe it (see [`probe`](Self::probe)), unless answered, replaced or probed by then.
    /// A check that finds the silence starts the probe too, but checks may stop coming: behind
    /// the tower layer, those given up after its 50 ms timeout open the circuit breaker, and no
    /// check reaches the store until the cool-down ends. Without the watch, that first check found
    /// the connection silent, was sent on it all the same and failed, and the circuit opened for
    /// another cool-down. One watch per slot at a time, in a task of its own, made only when a
    /// check is left unanswered. It watches whichever connection the slot has: a connection
    /// installed while it ran and left unanswered found the watch taken (before, it went
    /// unwatched when the watch ended with its own connection's mark gone).
    fn watch(self: &Arc<Self>, i: usize, generation: u64) {
        if self.slots[i].silence.mark(generation).is_none() {
            return;
        }
        let Some(watching) = Claimed::claim(self, i, watching) else {
            return;
        };
        self.home.spawn(async move {
            let mut watching = watching;
            loop {
                let inner = Arc::clone(&watching.inner);
                let slot = &inner.slots[i];
                let rt_us = micros_of(inner.response_timeout);
                // The slot's current connection, whichever it is: one installed while this watch
                // ran and left unanswered found the watch taken.
                let due = loop {
                    // The mark may be answered, or restarted (a kept cluster connection),
                    // meanwhile.
                    let Some((generation, since)) = slot.silence.current_mark() else {
                        break None;
                    };
                    let due = since.saturating_add(rt_us);
                    let now = inner.micros() + 1;
                    if now >= due {
                        break Some(generation);
                    }
                    tokio::time::sleep(Duration::from_micros(due - now)).await;
                };
                let Some(generation) = due else {
                    // Nothing left to watch. A check left unanswered just before the watch is let
                    // go found it taken: look once more after letting it go.
                    drop(watching);
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if slot.silence.current_mark().is_none() {
                        return;
                    }
                    match Claimed::claim(&inner, i, self::watching) {
                        Some(again) => {
                            watching = again;
                            continue;
                        }
                        None => return,
                    }
                };
                let conn = match lock(&slot.conn).as_ref() {
                    Some((g, c)) if *g == generation => c.clone(),
                    _ => return,
                };
                let Some(probing) = Claimed::claim(&inner, i, probing) else {
                    return;
                };
                // The watch ends as the probe starts: a later unanswered check may watch again.
                drop(watching);
                inner.probe(i, generation, conn, probing).await;
                return;
            }
        });
    }

    /// Asks slot `i`'s connection (of `generation`), which has left a command unanswered for the
    /// response timeout, whether it still answers: a `PING` (on a cluster, to every master),
    /// given the response timeout. Answered, the connection is kept: the command's answer came
    /// after its caller had given up, or came late. Not answered, it is replaced; broken, a
    /// standalone server's is dropped (the next check opens one) and a cluster's replaced.
    async fn probe(self: Arc<Self>, i: usize, generation: u64, mut conn: Conn, probing: Claimed) {
        // Lets the next probe start however this one ends: done, panicked, or dropped with its
        // runtime, run or not.
        let _probing = probing;
        let sent = self.micros() + 1;
        let answer = conn.ping(self.response_timeout).await;
        match answer {
            // An answer, even an error reply: the connection works, and is kept.
            Ok(Ok(())) => {}
            Ok(Err(e)) if !is_broken(&e) && !e.is_timeout() => {}
            // A standalone connection found broken serves nothing more: emptied at once, as after
            // a check's broken reply, so that checks wait for a new one (the next opens it)
            // instead of failing on this one while a replacement is made. A cluster connection
            // may still reach the masters that answer: replaced first, as a silent one is.
            Ok(Err(error)) if is_broken(&error) && !matches!(self.backend, Backend::Cluster(_)) => {
                tracing::warn!(slot = i, %error, "ratelimit-redis: a silent connection's probe found it broken");
                self.discard(i, generation);
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(slot = i, %error, "ratelimit-redis: a silent connection's probe failed");
                return self.reopen(i, generation).await;
            }
            Err(_) => {
                tracing::warn!(
                    slot = i,
                    // Silent for a response timeout before the probe, then the probe's own.
                    after_ms = self.response_timeout.saturating_mul(2).as_millis() as u64,
                    "ratelimit-redis: no answer on a connection for twice the response timeout"
                );
                return self.reopen(i, generation).await;
            }
        }
        self.slots[i].kept.store(0, Ordering::Relaxed);
        self.slots[i].silence.answered(generation, sent);
    }

    /// Replaces slot `i`'s connection (of `generation`) with a new one, made before the old one
    /// is let go: checks go on over the old one meanwhile, which on a cluster still reaches every
    /// master that answers. If no new connection can be made, a standalone server's is dropped,
    /// and checks wait for the slot's next opening as after any broken connection; a cluster's is
    /// kept (it still serves the masters that answer), and probed again after another response
    /// timeout.
    async fn reopen(&self, i: usize, generation: u64) {
        let slot = &self.slots[i];
        // Replaced or dropped already (a check found it broken meanwhile): nothing to replace.
        if !matches!(lock(&slot.conn).as_ref(), Some((g, _)) if *g == generation) {
            return;
        }
        let opened = match self.open().await {
            Ok(conn) => self.reaches_every_master(conn).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok(conn) => {
                let replaced = {
                    let mut guard = lock(&slot.conn);
                    let current = matches!(guard.as_ref(), Some((g, _)) if *g == generation);
                    if current {
                        slot.kept.store(0, Ordering::Relaxed);
                        self.install(slot, &mut guard, conn);
                    }
                    current
                };
                // Counted and logged once the slot's lock is let go (see `discard`).
                if replaced {
                    metrics::counter!(crate::metrics::CONNECTIONS_REPLACED_TOTAL).increment(1);
                    tracing::warn!(slot = i, "ratelimit-redis: silent connection replaced");
                }
            }
            Err(error) if matches!(self.backend, Backend::Cluster(_)) => {
                // Kept: a cluster connection still reaches every master that answers, and while
                // one master is silent a new one cannot reach it (`reaches_every_master`).
                // Dropped, it would leave every key, not only the silent master's, without a
                // connection until the node answers or fails over. Its silence is counted again
                // from now, so that the next probe (and attempt) comes a response timeout later,
                // not at the next check; and later still after each further attempt in a row
                // (`reopen_backoff`): a master that stays out of this gateway's reach while the
                // cluster keeps it (a partition on this side only) would otherwise have a whole
                // cluster connection made, and let go, every few seconds for as long as it lasts.
                let kept = slot.kept.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                let wait = reopen_backoff(kept, self.response_timeout);
                let wait_us = micros_of(wait);
                slot.silence.restart(
                    generation,
                    self.micros().saturating_add(1).saturating_add(wait_us),
                );
                tracing::warn!(
                    slot = i,
                    %error,
                    "ratelimit-redis: no new cluster connection; the old one is kept for the \
                     masters that answer"
                );
            }
            Err(error) => {
                tracing::warn!(slot = i, %error, "ratelimit-redis: no new connection for a silent one");
                let _ = self.discard(i, generation);
            }
        }
    }

    /// `conn`, if it is a standalone server's or a cluster connection that reaches every master
    /// (`CLUSTER SLOTS` and a `PING` to each answered within a response timeout each: see
    /// [`cluster::Connection::reaches_every_master`]). A new cluster connection made
    /// while a master is silent, before its replica takes over, has no link to it (the client
    /// connects to each node within its timeouts and goes on without those that fail): the other
    /// nodes would redirect that master's keys to it, and each redirection makes the client
    /// refresh its slot map, which waits for the silent node and holds every key meanwhile. The
    /// old connection, still linked to the silent master, serves the others without that; it is
    /// kept until a new one reaches every master (the replica has taken over, or the master
    /// answers again).
    async fn reaches_every_master(&self, conn: Conn) -> Result<Conn, RedisStoreError> {
        let Conn::Cluster(mut probe) = conn.clone() else {
            return Ok(conn);
        };
        // Two round trips (`CLUSTER SLOTS`, then the `PING`s), a response timeout each.
        let within = self.response_timeout.saturating_mul(2);
        match tokio::time::timeout(within, probe.reaches_every_master()).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(RedisStoreError::Connection {
                message: format!("a new cluster connection does not reach every master: {e}"),
                source: Some(e),
            }),
            Err(_) => Err(RedisStoreError::Connection {
                message: format!(
                    "a master did not answer a new cluster connection within {within:?}"
                ),
                source: None,
            }),
        }
    }

    /// Puts `conn` in `slot` (whose connection lock the caller holds) as a new generation, with
    /// nothing outstanding on it.
    fn install(&self, slot: &Slot, held: &mut Option<(u64, Conn)>, conn: Conn) {
        let g = self.generation.fetch_add(1, Ordering::Relaxed);
        slot.silence.reset(g);
        let now = self.micros();
        slot.installed.store(now, Ordering::Relaxed);
        for used in &slot.used {
            used.store(now + 1, Ordering::Relaxed);
        }
        *held = Some((g, conn));
        self.installed_any.notify_waiters();
    }

    /// Microseconds since the store's epoch.
    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// The refusal that holds a check of cluster hash slot `hash_slot`, if one does (see
    /// [`Refusals`]).
    fn held(&self, hash_slot: u16) -> Option<RedisStoreError> {
        let r = &self.refusals;
        let until = r.until.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let state = r.slots.get()?.get(usize::from(hash_slot))?;
        let v = state.load(Ordering::Relaxed);
        if v == 0 {
            return None;
        }
        let now = self.micros();
        if now >= until {
            // Over: the next checks skip the clock read. A hold set again meanwhile stays.
            let _ = r
                .until
                .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
            return None;
        }
        if now.saturating_sub(r.last.load(Ordering::Relaxed)) >= micros_of(REFUSALS_REMEMBERED) {
            // No refusal for a while (the master accepts the store again, or has not been asked):
            // the check is sent.
            return None;
        }
        if now.saturating_sub(v >> 1) >= micros_of(SUSPECT_RETRY)
            && state
                .compare_exchange(
                    v,
                    now.max(1) << 1 | (v & 1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            // This slot's retry: sent, and its answer clears it (its master accepts the store
            // again, or never refused it).
            return None;
        }
        if v & 1 == 1 {
            return lock(&r.error).clone();
        }
        Some(RedisStoreError::Connection {
            message: "the link to the key's master broke while a master refuses the store's \
                      credentials: its checks are held for the reconnect gap"
                .into(),
            source: None,
        })
    }

    /// What a check of cluster hash slot `hash_slot` got tells whether its master refuses the
    /// store (see [`Refusals`]).
    fn heard(&self, hash_slot: u16, reply: &Result<Value, RedisError>) {
        let r = &self.refusals;
        let i = usize::from(hash_slot);
        match reply {
            Ok(_) => {
                if let Some(state) = r.slots.get().and_then(|t| t.get(i))
                    && state.load(Ordering::Relaxed) != 0
                {
                    state.store(0, Ordering::Relaxed);
                }
            }
            Err(e) if crate::error::unauthenticated(e) => {
                let now = self.micros().max(1);
                *lock(&r.error) = Some(RedisStoreError::Redis(e.clone()));
                r.last.store(now, Ordering::Relaxed);
                let table = r
                    .slots
                    .get_or_init(|| (0..16_384).map(|_| AtomicU64::new(0)).collect());
                if let Some(state) = table.get(i) {
                    state.store(now << 1 | 1, Ordering::Relaxed);
                }
                self.hold_suspects(now);
            }
            Err(e) if is_broken(e) => {
                let last = r.last.load(Ordering::Relaxed);
                let now = self.micros().max(1);
                if last == 0 || now.saturating_sub(last) >= micros_of(REFUSALS_REMEMBERED) {
                    return;
                }
                if let Some(state) = r.slots.get().and_then(|t| t.get(i)) {
                    // A slot refused before stays so; another is tried now.
                    let v = state.load(Ordering::Relaxed);
                    if v & 1 == 0 {
                        state.store(now << 1, Ordering::Relaxed);
                    }
                }
                self.hold_suspects(now);
            }
            Err(_) => {}
        }
    }

    /// Suspects are held for the reconnect gap from `now`.
    fn hold_suspects(&self, now: u64) {
        self.refusals.until.store(
            now.saturating_add(micros_of(RECONNECT_GAP)),
            Ordering::Release,
        );
    }

    /// A connection, round-robin over the slots. A slot without one is re-opened by a task of its
    /// own, which a check that stops waiting (its timeout, a dropped request) does not cancel:
    /// however long opening takes, the next checks find the connection. Meanwhile (and while a
    /// failed opening's gap lasts) the check is served by another slot's connection if one is
    /// open: one broken connection of several does not fail the checks it would have carried.
    async fn connection(self: &Arc<Self>) -> Result<(usize, u64, Conn), RedisStoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.slot_connection(i, true).await
    }

    /// Slot `i`'s connection, opened if it has none; or, if `lend` and it has none yet, another
    /// slot's.
    async fn slot_connection(
        self: &Arc<Self>,
        i: usize,
        lend: bool,
    ) -> Result<(usize, u64, Conn), RedisStoreError> {
        let slot = &self.slots[i];
        loop {
            if let Some((g, c)) = lock(&slot.conn).as_ref() {
                return Ok((i, *g, c.clone()));
            }
            let opened = slot.opened.notified();
            let mut opened = std::pin::pin!(opened);
            opened.as_mut().enable();
            // Another slot's new connection, which a check that may borrow one takes instead of
            // waiting for this slot's opening: that opening may be slow (a lost SYN is resent
            // after a second), and the check would wait for it until its deadline and fail while
            // a connection is open. Enabled before the other slots are looked at, so that a
            // connection installed after that look wakes it.
            let installed = self.installed_any.notified();
            let mut installed = std::pin::pin!(installed);
            installed.as_mut().enable();
            if let Some((g, c)) = lock(&slot.conn).as_ref() {
                return Ok((i, *g, c.clone()));
            }
            let (failures, recent) = {
                let failed = lock(&slot.failed);
                (failed.count, failed.recent())
            };
            if recent.is_none() && !slot.opening.swap(true, Ordering::AcqRel) {
                // An opening may have ended between the look above and the swap: then its
                // connection is there, and a second one would replace it; or it failed, and the
                // next waits out the reconnect gap (its failure is recorded before the flag is
                // let go, so the swap that took the flag sees it).
                if lock(&slot.conn).is_some() || lock(&slot.failed).recent().is_some() {
                    slot.opening.store(false, Ordering::Release);
                    slot.opened.notify_waiters();
                    continue;
                }
                // The guard ends the opening however the task ends: done, panicked, or dropped
                // with its runtime (even unrun), which would otherwise leave the slot "opening"
                // for good and every later check waiting for it.
                let mut opening = Opening {
                    inner: Arc::clone(self),
                    slot: i,
                    done: false,
                };
                self.home.spawn(async move {
                    opening.inner.open_slot(opening.slot).await;
                    opening.finished();
                });
            }
            if lend && let Some(other) = self.open_connection_besides(i) {
                return Ok(other);
            }
            if let Some(e) = recent {
                return Err(e);
            }
            let another = std::future::poll_fn(|cx| {
                if opened.as_mut().poll(cx).is_ready() {
                    Poll::Ready(false)
                } else if lend && installed.as_mut().poll(cx).is_ready() {
                    Poll::Ready(true)
                } else {
                    Poll::Pending
                }
            })
            .await;
            if another {
                // Looked at again from the top: this slot's connection, if it opened meanwhile,
                // else the new one (this slot's opening goes on, for the checks after).
                continue;
            }
            let failed = lock(&slot.failed).last_if_newer(failures);
            if let Some(e) = failed {
                // Another slot's connection may have opened meanwhile.
                if lend && let Some(other) = self.open_connection_besides(i) {
                    return Ok(other);
                }
                return Err(e);
            }
        }
    }

    /// The first open connection of the slots after `i` (round the ring), if any.
    fn open_connection_besides(&self, i: usize) -> Option<(usize, u64, Conn)> {
        let n = self.slots.len();
        (1..n).map(|k| (i + k) % n).find_map(|j| {
            lock(&self.slots[j].conn)
                .as_ref()
                .map(|(g, c)| (j, *g, c.clone()))
        })
    }

    /// Opens slot `i`'s connection and records the outcome; its [`Opening`] then wakes the checks
    /// waiting for it.
    async fn open_slot(&self, i: usize) {
        let slot = &self.slots[i];
        match self.open().await {
            Ok(conn) => {
                self.install(slot, &mut lock(&slot.conn), conn);
                tracing::debug!(slot = i, "ratelimit-redis: connection (re)opened");
            }
            Err(e) => lock(&slot.failed).record(e),
        }
    }

    /// Drops slot `slot`'s connection if it is still of `generation`; `true` if it was.
    fn discard(&self, slot: usize, generation: u64) -> bool {
        self.discard_with(slot, generation, None)
    }

    /// [`discard`](Self::discard), recording `failure` as the slot's last failed opening (which
    /// holds its next opening for the reconnect gap) before its lock is let go, if it was
    /// dropped.
    fn discard_with(&self, slot: usize, generation: u64, failure: Option<RedisStoreError>) -> bool {
        // The connection goes out under the slot's lock, and is dropped, counted and logged after
        // it: every check takes that lock, and a log writer that blocks must not hold them.
        let dropped = {
            let mut guard = lock(&self.slots[slot].conn);
            match guard.as_ref() {
                Some((g, _)) if *g == generation => {
                    if let Some(failure) = failure {
                        lock(&self.slots[slot].failed).record(failure);
                    }
                    guard.take()
                }
                _ => None,
            }
        };
        if dropped.is_none() {
            return false;
        }
        drop(dropped);
        metrics::counter!(crate::metrics::CONNECTIONS_REPLACED_TOTAL).increment(1);
        tracing::warn!(
            slot,
            "ratelimit-redis: connection broken; it will be re-opened"
        );
        true
    }

    /// A new connection from the pool, detached from it: the pool makes connections (with its
    /// connect and wait timeouts); this store keeps them.
    ///
    /// Its error names the URLs, as `build`'s does, so that an operator reading a check's error
    /// long after start-up sees which server could not be reached.
    async fn open(&self) -> Result<Conn, RedisStoreError> {
        let opened = match &self.backend {
            Backend::Single(pool) => pool
                .get()
                .await
                .map(|c| Conn::Single(deadpool_redis::Connection::take(c))),
            Backend::Cluster(pool) => pool
                .get()
                .await
                .map(|c| Conn::Cluster(deadpool::managed::Object::take(c))),
        };
        opened.map_err(|e| pool_error(e).connecting_to(&self.urls))
    }
}

fn pool_error(e: deadpool_redis::PoolError) -> RedisStoreError {
    match e {
        deadpool_redis::PoolError::Backend(source) => RedisStoreError::Connection {
            message: crate::error::one_line(&source.to_string()),
            source: Some(source),
        },
        other => RedisStoreError::Connection {
            message: other.to_string(),
            source: None,
        },
    }
}

/// A mutex's guard, poisoned or not (nothing held under these locks can be left half-updated).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RedisStoreBuilder {
    fn new(urls: Vec<String>, cluster: bool) -> Self {
        RedisStoreBuilder {
            urls,
            cluster,
            prefix: DEFAULT_PREFIX.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connect_timeout_set: false,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            clock: None,
            expiry_slack: None,
            announce_resets: false,
            ping_after_idle: DEFAULT_PING_AFTER_IDLE,
            #[cfg(any(feature = "tls", feature = "tls-rustls"))]
            root_cert: None,
            #[cfg(any(feature = "tls", feature = "tls-rustls"))]
            client_tls: None,
        }
    }

    /// What a reset watch needs, from the settings (a [`LazyRedisStore`]'s watch, which does not
    /// wait for the store to be built).
    pub(crate) fn watch_settings(&self) -> Result<crate::watch::Settings, RedisStoreError> {
        Ok(crate::watch::Settings {
            infos: self
                .urls
                .iter()
                .map(|url| self.connection_info(url))
                .collect::<Result<_, _>>()?,
            cluster: self.cluster,
            prefix: self.prefix.clone(),
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
        })
    }

    /// Trusts `pem` (one or more PEM certificates) as the root for `rediss://` servers, instead of
    /// the system's roots: for a Redis whose certificate comes from a private CA. With the
    /// `tls-rustls` feature, for standalone servers and clusters alike; with `tls` (native-tls),
    /// standalone servers only: [`build`](Self::build) refuses it for a cluster, whose client
    /// on native-tls verifies against the system's roots only.
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_cert = Some(pem.into());
        self
    }

    /// Presents `cert_pem` (the client certificate, then any intermediate ones, in PEM) and its
    /// private key `key_pem` (PEM) to `rediss://` servers that ask for a certificate: a Redis with
    /// `tls-auth-clients yes`, its default once TLS is on. The key is PKCS#8 (`BEGIN PRIVATE
    /// KEY`) with `tls` (native-tls); `tls-rustls` also takes PKCS#1 and SEC1 keys. With
    /// `tls-rustls`, for standalone servers and clusters alike; with `tls`, standalone servers
    /// only, as [`tls_root_certificate`](Self::tls_root_certificate). A certificate or key that
    /// cannot be read is a [`RedisStoreError::Config`] of `build` naming this setting; so is,
    /// with `tls-rustls`, an X.509 v1 certificate (rustls presents v3 only; `tls` takes both).
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// The certificates given to the builder, if any, in redis-rs's form.
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        (self.root_cert.is_some() || self.client_tls.is_some()).then(|| redis::TlsCertificates {
            client_tls: self.client_tls.clone(),
            root_cert: self.root_cert.clone(),
        })
    }

    /// Each certificate setting read alone, so that one redis-rs cannot read is named.
    #[cfg(any(feature = "tls", feature = "tls-rustls"))]
    fn check_certificates(&self) -> Result<(), RedisStoreError> {
        let read = |certs: redis::TlsCertificates, name: &'static str| {
            redis::Client::build_with_tls("rediss://127.0.0.1", certs)
                .map(drop)
                .map_err(|e| RedisStoreError::config(name, format!("cannot be read: {e}")))
        };
        if let Some(pem) = &self.root_cert {
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            };
            read(certs, "tls_root_certificate")?;
        }
        if let Some(client) = &self.client_tls {
            let certs = redis::TlsCertificates {
                client_tls: Some(client.clone()),
                root_cert: None,
            };
            read(certs, "tls_client_certificate")?;
            // redis-rs only decodes the PEM here; rustls reads the key when it connects.
            #[cfg(feature = "tls-rustls")]
            rustls_client_identity(client).map_err(|e| {
                RedisStoreError::config("tls_client_certificate", format!("cannot be used: {e}"))
            })?;
        }
        Ok(())
    }

    /// The certificates for a cluster's client, which makes its own connections to the nodes its
    /// slot map names (with `tls-rustls` only; `build` refuses them without it): given only for
    /// `rediss://` seeds, as they make the client use TLS.
    fn cluster_certificates(&self) -> Option<ClusterCertificates> {
        #[cfg(feature = "tls-rustls")]
        if self.urls.iter().all(|u| is_tls_url(u)) {
            return self.certificates();
        }
        None
    }

    /// The connection settings for `url`, with the certificates if any were given.
    fn connection_info(&self, url: &str) -> Result<redis::ConnectionInfo, RedisStoreError> {
        let bad = |e: RedisError| {
            RedisStoreError::config("url", format!("cannot use `{}`: {e}", redact_url(url)))
        };
        #[cfg(feature = "tls-rustls")]
        if is_tls_url(url) {
            install_crypto_provider();
        }
        #[cfg(any(feature = "tls", feature = "tls-rustls"))]
        if let Some(certs) = self.certificates() {
            let client = redis::Client::build_with_tls(url, certs).map_err(bad)?;
            return Ok(tcp_tuned(client.get_connection_info().clone()));
        }
        redis::IntoConnectionInfo::into_connection_info(url)
            .map(tcp_tuned)
            .map_err(bad)
    }

    /// The prefix of every key (default `rl`): printable ASCII, without braces or spaces, at most
    /// 64 bytes. Set by configuration, never by a client.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many multiplexed connections to keep open (default 1). Each carries many concurrent
    /// checks at once, pipelined; they are handed out in turn and re-opened when they break.
    /// Redis runs commands on one thread, so more connections add no server parallelism; they
    /// can help a many-core gateway spread the client's encoding work.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// How long opening a connection may take (default 1 s). On a cluster, opening a connection
    /// to one node: a cluster connection, made in two rounds of connections (the seeds, then the
    /// nodes their slot map names) with a `PING` to each and the slot map asked in between, may
    /// take twice this plus three response timeouts, so that a node that does not answer fails
    /// alone. [`build`](Self::build) opens the pool's connections one after another, so with a
    /// node silent at startup it may take [`pool_size`](Self::pool_size) times that.
    ///
    /// Left at its default on a cluster, the cluster client's own connections (to the seeds, and
    /// to every node at each refresh of its slot map) take at most a third of the
    /// [`response_timeout`](Self::response_timeout) instead, if that is shorter: each refresh
    /// holds every key's command while it connects, and a master gone from the network (packets
    /// dropped, not refused) would otherwise hold them past their deadline at every redirection
    /// of its keys, until its replica took over. A command may wait for two such refreshes, the
    /// one under way and the next, so a third leaves it a third of its deadline. Set, it is used
    /// as set: such a master then costs the other masters' checks up to twice that during its
    /// outage, and above half the response timeout some of them fail.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self.connect_timeout_set = true;
        self
    }

    /// How long the pool may wait for room to make a connection (default 500 ms). The store takes
    /// each connection out of the pool, so this wait does not happen in practice; a check waiting
    /// for a connection being re-opened is bounded by [`response_timeout`](Self::response_timeout).
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = d;
        self
    }

    /// How long a check may take in all, connection included (default 500 ms; more than zero and
    /// at most [`MAX_TIMEOUT`], an hour, as are the other timeouts). Past it the check fails with
    /// [`RedisStoreError::Timeout`].
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// Takes the time from `clock` on the client instead of from the Redis server's `TIME`.
    ///
    /// By default the scripts read the server's clock, so clock skew between gateways cannot
    /// change a decision. A client clock is for tests (a [`ManualClock`](ratelimit_core::ManualClock))
    /// and for deployments that want it; then every gateway's clock must agree: use a
    /// [`WallClock`](ratelimit_core::WallClock), which reads the system clock that NTP keeps in
    /// step, not a [`SystemClock`](ratelimit_core::SystemClock), which drifts from it by up to
    /// seconds a day.
    ///
    /// A check's time is then read on the gateway when its response timeout starts (its future's
    /// first poll in a runtime), while Redis counts a key's expiry from when the script runs: a
    /// check that waits `d` between the two (for a connection, on the network) reads the key as
    /// of `d` ago, and would find it expired up to `d` before its state is fresh, and decide on a
    /// fresh state. So unless [`expiry_slack`](Self::expiry_slack) is set, a client-clock store
    /// adds its [`response_timeout`](Self::response_timeout) to every expiry: any check whose
    /// answer is used ran within it of its time.
    pub fn client_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Extra time added to every key's expiry (default zero with the server's clock: a key expires
    /// as soon as its state is fresh again, rounded up to the millisecond; with a
    /// [`client_clock`](Self::client_clock), the [`response_timeout`](Self::response_timeout)).
    ///
    /// Expiry runs on the Redis server's real time. With a client clock that does not follow real
    /// time (a `ManualClock` in tests), gateways whose clocks disagree, or checks that wait longer
    /// than the response timeout between reading their time and running, a slack keeps states
    /// alive until every clock agrees they are fresh.
    pub fn expiry_slack(mut self, d: Duration) -> Self {
        self.expiry_slack = Some(d);
        self
    }

    /// Announces every [`reset`](RedisStore::reset) on the Redis channel `<prefix>:resets`
    /// (default off): the reset's script publishes the key and the limit's fingerprint and deletes
    /// the key's state, in one step. Other gateways that
    /// [`watch_resets`](RedisStore::watch_resets) then end their own `DenialCache` denials and
    /// `Leasing` leases of the client at once, instead of at their deadline or expiry. A
    /// restricted Redis user then needs `+publish` and the channel (`&<prefix>:resets`) as well
    /// as `+del` (docs/redis.md, "Access control").
    pub fn announce_resets(mut self, on: bool) -> Self {
        self.announce_resets = on;
        self
    }

    /// How long a connection may have sent nothing before a check is written on it (default
    /// [`DEFAULT_PING_AFTER_IDLE`], 10 s): past it, the check first sends a `PING` on it.
    ///
    /// Servers and what stands between them and the gateway close connections that stay idle:
    /// Redis's own `timeout` setting, a proxy's or load balancer's idle limit, a managed service's,
    /// `CLIENT KILL`. Written on such a connection, a check would fail with a broken pipe, and it
    /// cannot be sent again, since the error alone does not prove that it was not written. The
    /// `PING`'s failure does: the connection is dropped and the check goes on another (or waits
    /// for a new one, within its response timeout). Answered, the check follows on the same
    /// connection. The cost is one round trip more for the first checks on a connection after an
    /// idle spell, and none while checks keep it busy.
    ///
    /// On a Redis Cluster, whose connection links to each master apart, idleness is counted per
    /// range of hash slots (one of the store's failure domains), and the `PING` goes to the
    /// master of the check's key.
    ///
    /// Set it below the shortest idle limit on the way to Redis. `Duration::ZERO` sends a `PING`
    /// before every check; `Duration::MAX` never sends one.
    pub fn ping_after_idle(mut self, d: Duration) -> Self {
        self.ping_after_idle = d;
        self
    }

    /// A store that is built in the background while Redis cannot be reached, for an application
    /// that must start during a Redis outage: see [`LazyRedisStore`]. The first attempt is made
    /// at once; an invalid setting, or credentials Redis refuses, is returned as
    /// [`build`](Self::build) returns it; any other failure is retried by a task every
    /// `retry_every` (1 ms to an hour), while checks fail at once with the last attempt's error.
    pub async fn build_lazy(
        self,
        retry_every: Duration,
    ) -> Result<LazyRedisStore, RedisStoreError> {
        LazyRedisStore::build(self, retry_every).await
    }

    /// Checks the settings, opens the connections and loads the scripts.
    ///
    /// The store's own tasks (its connections' openings and I/O, the probes of a silent
    /// connection, [`Coalescing`](crate::Coalescing)'s batches) run on the Tokio runtime this is
    /// awaited in if that is a multi-thread runtime still running, else on the runtime of the
    /// check that needs one. A current-thread runtime runs its tasks only while something drives
    /// it: a task left on one whose `block_on` returned keeps the other runtimes' checks that
    /// need it waiting (on its connection, or queued for its key), so where checks come from
    /// several runtimes, build the store on a multi-thread one that outlives them. Awaited
    /// outside a Tokio runtime, it fails with a `Config` error (`runtime`).
    pub async fn build(mut self) -> Result<RedisStore, RedisStoreError> {
        crate::metrics::describe();
        let home = crate::spawn::Home::current().ok_or_else(|| {
            RedisStoreError::config("runtime", "the store must be built inside a Tokio runtime")
        })?;
        validate_prefix(&self.prefix)?;
        // The cluster client makes its own connections from the node addresses, and with
        // native-tls it takes no certificate: refused rather than silently unused.
        #[cfg(all(feature = "tls", not(feature = "tls-rustls")))]
        if self.cluster {
            if self.root_cert.is_some() {
                return Err(RedisStoreError::config(
                    "tls_root_certificate",
                    "is not supported for Redis Cluster with the `tls` feature (its cluster \
                     client verifies against the system's roots only): install the CA in the \
                     system's trust store, or use the `tls-rustls` feature",
                ));
            }
            if self.client_tls.is_some() {
                return Err(RedisStoreError::config(
                    "tls_client_certificate",
                    "is not supported for Redis Cluster with the `tls` feature (its cluster \
                     client presents no certificate): use the `tls-rustls` feature",
                ));
            }
        }
        #[cfg(any(feature = "tls", feature = "tls-rustls"))]
        self.check_certificates()?;
        if self.pool_size == 0 || self.pool_size > 1024 {
            return Err(RedisStoreError::config(
                "pool_size",
                "must be between 1 and 1024",
            ));
        }
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("wait_timeout", self.wait_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if d.is_zero() {
                return Err(RedisStoreError::config(name, "must be longer than zero"));
            }
            if d > MAX_TIMEOUT {
                return Err(RedisStoreError::config(name, "must be at most an hour"));
            }
        }
        if self.urls.is_empty() {
            return Err(RedisStoreError::config("url", "at least one URL is needed"));
        }
        let mut infos: Vec<redis::ConnectionInfo> = Vec::with_capacity(self.urls.len());
        for url in &self.urls {
            if cfg!(not(any(feature = "tls", feature = "tls-rustls"))) && is_tls_url(url) {
                return Err(RedisStoreError::config(
                    "url",
                    "rediss:// (TLS) needs ratelimit-redis's `tls` or `tls-rustls` feature",
                ));
            }
            // With both features, redis-rs connects through rustls but loads no system roots
            // (it leaves them to native-tls): such a store could verify no server at all.
            #[cfg(all(feature = "tls", feature = "tls-rustls"))]
            if is_tls_url(url) && self.root_cert.is_none() {
                return Err(RedisStoreError::config(
                    "url",
                    "with both the `tls` and `tls-rustls` features on, redis-rs verifies \
                     rediss:// servers only against a root certificate given with \
                     tls_root_certificate, not the system's: turn one feature off, or give the CA",
                ));
            }
            infos.push(self.connection_info(url)?);
        }
        if !self.cluster && self.urls.len() != 1 {
            return Err(RedisStoreError::config(
                "url",
                "a standalone store takes one URL; use RedisStore::cluster for several nodes",
            ));
        }
        let slack = self.expiry_slack.unwrap_or(if self.clock.is_some() {
            self.response_timeout
        } else {
            Duration::ZERO
        });
        let slack_ms = u64::try_from(slack.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX);
        if slack_ms > 1 << 40 {
            return Err(RedisStoreError::config("expiry_slack", "is too long"));
        }

        // The pool only makes connections (the store takes each one out of it), and each slot
        // makes at most two at a time: an opening (one per slot, `Slot::opening`) and a silent
        // connection's replacement (one per slot, `Slot::probing`). Room for both, so that a
        // slow replacement never makes an opening wait for the pool, fail at its wait timeout
        // and start a reconnect gap.
        let pool_max = self.pool_size.saturating_mul(2);
        let watch_infos = infos.clone().into_boxed_slice();
        let reset_channel = self
            .announce_resets
            .then(|| crate::watch::channel(&self.prefix));
        let backend = if self.cluster {
            let client_connect_timeout = if self.connect_timeout_set {
                self.connect_timeout
            } else {
                cluster::client_connect_timeout(self.connect_timeout, self.response_timeout)
            };
            let manager = cluster::Manager::new(
                home.clone(),
                infos,
                self.cluster_certificates(),
                self.connect_timeout,
                client_connect_timeout,
                self.response_timeout,
                self.ping_after_idle,
            )
            .map_err(|e| {
                RedisStoreError::config("url", format!("cannot use the cluster URLs: {e}"))
            })?;
            let pool = deadpool::managed::Pool::builder(manager)
                .max_size(pool_max)
                .wait_timeout(Some(self.wait_timeout))
                .create_timeout(Some(cluster::create_timeout(
                    self.connect_timeout,
                    self.response_timeout,
                )))
                .recycle_timeout(Some(self.connect_timeout))
                .runtime(Runtime::Tokio1)
                .build()
                .map_err(|e| RedisStoreError::config("pool", e.to_string()))?;
            Backend::Cluster(pool)
        } else {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                // The store bounds each check (connection included) with one timer of its own.
                .set_response_timeout(None);
            let info = infos.swap_remove(0);
            let manager = deadpool_redis::Manager::new_with_config(info, config)
                .map_err(|e| RedisStoreError::config("url", format!("cannot use the URL: {e}")))?;
            let pool = deadpool_redis::Pool::builder(manager)
                .max_size(pool_max)
                .wait_timeout(Some(self.wait_timeout))
                .create_timeout(Some(self.connect_timeout))
                .recycle_timeout(Some(self.connect_timeout))
                .runtime(Runtime::Tokio1)
                .build()
                .map_err(|e| RedisStoreError::config("pool", e.to_string()))?;
            Backend::Single(pool)
        };

        let inner = Arc::new(Inner {
            backend,
            slots: (0..self.pool_size)
                .map(|_| Slot {
                    conn: Mutex::new(None),
                    opening: AtomicBool::new(false),
                    opened: tokio::sync::Notify::new(),
                    failed: Mutex::new(Failed::default()),
                    installed: AtomicU64::new(0),
                    used: (0..failure_domains(self.cluster))
                        .map(|_| AtomicU64::new(0))
                        .collect(),
                    silence: Silence::new(),
                    probing: AtomicBool::new(false),
                    watching: AtomicBool::new(false),
                    kept: AtomicU32::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            prefix: self.prefix,
            urls: std::mem::take(&mut self.urls).into_boxed_slice(),
            response_timeout: self.response_timeout,
            ping_after_idle_us: micros_of(self.ping_after_idle),
            epoch: tokio::time::Instant::now(),
            installed_any: tokio::sync::Notify::new(),
            refusals: Refusals {
                until: AtomicU64::new(0),
                last: AtomicU64::new(0),
                error: Mutex::new(None),
                slots: OnceLock::new(),
            },
            clock: self.clock,
            expiry_slack_ms: slack_ms,
            reset_channel,
            infos: watch_infos,
            connect_timeout: self.connect_timeout,
            home,
        });
        // Open every connection now, so a wrong address or password fails here, and load the
        // scripts (on every node of a cluster) so the first checks need no NOSCRIPT round trip.
        let mut first = None;
        for i in 0..inner.slots.len() {
            // An opening's error names the URLs already (`Inner::open`).
            let (_, _, conn) = inner.slot_connection(i, false).await?;
            first.get_or_insert(conn);
        }
        if let Some(mut conn) = first {
            // Asked first: a Sentinel would fail the scripts' loading with an error that does
            // not say what it is.
            let hello = match &mut conn {
                Conn::Single(c) => tokio::time::timeout(self.response_timeout, server_hello(c))
                    .await
                    .unwrap_or_default(),
                _ => Hello::default(),
            };
            if let Some(mode) = &hello.mode
                && let Some((what, advice)) = match mode.as_str() {
                    "cluster" => Some((
                        CLUSTER_NODE_AS_STANDALONE,
                        "give the cluster's nodes to RedisStore::cluster (a node answers MOVED \
                         for the keys other masters hold, now or after a resharding)",
                    )),
                    "sentinel" => Some((
                        SENTINEL_AS_SERVER,
                        "give the address of the primary it watches (the store does not follow \
                         a Sentinel's failovers: use a name or address that moves with the \
                         primary)",
                    )),
                    _ => None,
                }
            {
                return Err(RedisStoreError::Connection {
                    message: format!("{what}: {advice}"),
                    source: Some(RedisError::from((ErrorKind::InvalidClientConfig, what))),
                }
                .connecting_to(&inner.urls));
            }
            // Every admission would be refused (`READONLY`, at its first write), or, on a
            // replica that takes writes (`replica-read-only no`), counted apart from every other
            // gateway and lost at its next sync with the primary. Unavailable rather than a
            // wrong server: a failover may promote it, or move a name or address to the
            // primary, so a lazy store tries again.
            if hello.role.as_deref() == Some("replica") {
                return Err(RedisStoreError::Connection {
                    message: format!(
                        "{REPLICA_AS_PRIMARY}: give the primary's address (or a name that moves \
                         with it); a replica refuses the checks' writes, or keeps them apart from \
                         the primary's data until its next sync"
                    ),
                    source: Some(RedisError::from((
                        ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                        REPLICA_AS_PRIMARY,
                    ))),
                }
                .connecting_to(&inner.urls));
            }
            let load = async {
                for s in scripts::all() {
                    conn.load(s).await?;
                }
                Ok::<(), RedisError>(())
            };
            match tokio::time::timeout(self.connect_timeout.max(self.response_timeout), load).await
            {
                Ok(Ok(())) => {}
                // A refusal (`NOAUTH`: the server asks a password the URL does not give) is
                // told as the refused connection it is, naming the URL.
                Ok(Err(e)) => return Err(RedisStoreError::Redis(e).connecting_to(&inner.urls)),
                Err(_) => {
                    return Err(RedisStoreError::Timeout {
                        after: self.connect_timeout.max(self.response_timeout),
                    });
                }
            }
        }
        Ok(RedisStore { inner })
    }
}

fn validate_prefix(prefix: &str) -> Result<(), RedisStoreError> {
    if prefix.is_empty() || prefix.len() > 64 {
        return Err(RedisStoreError::config(
            "prefix",
            "must be 1 to 64 bytes long",
        ));
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
    {
        return Err(RedisStoreError::config(
            "prefix",
            "must be printable ASCII without spaces or braces (a brace would move the hash tag)",
        ));
    }
    Ok(())
}

/// How long after the silence's usual response timeout a cluster connection is probed again
/// (and a replacement tried) once `kept` replacements in a row have failed to reach every master:
/// none after the first, then one response timeout, three, seven... (the attempts' spacing
/// doubling), at most [`MAX_REOPEN_BACKOFF`]. Bounded, since the cluster's failover (after its
/// node timeout, 15 s by default) is what a replacement waits for.
fn reopen_backoff(kept: u32, response_timeout: Duration) -> Duration {
    let steps = (1u32 << kept.saturating_sub(1).min(16)) - 1;
    response_timeout
        .saturating_mul(steps)
        .min(MAX_REOPEN_BACKOFF)
}

/// The longest [`reopen_backoff`].
const MAX_REOPEN_BACKOFF: Duration = Duration::from_secs(8);

/// `info` with the store's socket settings ([`tuned`]).
pub(crate) fn tcp_tuned(info: redis::ConnectionInfo) -> redis::ConnectionInfo {
    let tcp = tuned(info.tcp_settings().clone());
    info.set_tcp_settings(tcp)
}

/// How long a connection may carry nothing before the kernel sends it a TCP keepalive probe.
pub(crate) const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);

/// `tcp` with the settings of every connection the store makes:
///
/// - `TCP_NODELAY` on. redis-rs leaves Nagle's algorithm on by default: a command longer than
///   one segment (a check of many quotas with long keys, a coalesced batch) would have its tail
///   held until the server acknowledges the rest, which a server waiting for the whole command
///   delays (about 40 ms on Linux), past the layer's timeout.
/// - TCP keepalive probes after [`TCP_KEEPALIVE_TIME`] idle (redis-rs sets none, and Linux's own
///   default is two hours): a NAT gateway or load balancer on the way forgets an idle flow
///   (AWS's NAT gateway after 350 s, Azure's load balancer after 4 minutes by default), often
///   without telling either end, and the next check on it would go unanswered until its timeout.
///   The probes keep such a flow alive. (Redis's own `timeout` counts commands, not probes: that
///   is what `ping_after_idle` is for.)
pub(crate) fn tuned(tcp: redis::io::tcp::TcpSettings) -> redis::io::tcp::TcpSettings {
    tcp.set_nodelay(true)
        .set_keepalive(redis::io::tcp::socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE_TIME))
}

/// What a standalone store's `build` says of a server that is a Redis Cluster node.
pub(crate) const CLUSTER_NODE_AS_STANDALONE: &str =
    "a Redis Cluster node given as a standalone server";
/// What a standalone store's `build` says of a server that is a Redis Sentinel.
pub(crate) const SENTINEL_AS_SERVER: &str = "a Redis Sentinel given as the server";

/// What a standalone store's `build` says of a server that is a replica.
pub(crate) const REPLICA_AS_PRIMARY: &str = "a replica given as the server";

/// What the server's `HELLO` (without arguments: the protocol is not changed) tells of it: its
/// `mode` (`standalone`, `cluster` or `sentinel`) and `role` (`master` or `replica`), each
/// `None` if it does not say (Redis before 6 knows no `HELLO`; Redis 7.0 answers it to any user,
/// whatever its ACL rights) or the connection failed (the next check will tell).
#[derive(Default)]
struct Hello {
    mode: Option<String>,
    role: Option<String>,
}

async fn server_hello(conn: &mut MultiplexedConnection) -> Hello {
    let Ok(reply) = redis::cmd("HELLO").query_async::<Value>(conn).await else {
        return Hello::default();
    };
    let mut hello = Hello::default();
    let mut read = |k: &Value, v: &Value| {
        let (Ok(key), Ok(value)) = (
            redis::from_redis_value_ref::<String>(k),
            redis::from_redis_value_ref::<String>(v),
        ) else {
            return;
        };
        match key.as_str() {
            "mode" => hello.mode = Some(value),
            "role" => hello.role = Some(value),
            _ => {}
        }
    };
    match &reply {
        Value::Array(items) => items.chunks_exact(2).for_each(|kv| read(&kv[0], &kv[1])),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| read(k, v)),
        _ => {}
    }
    hello
}

/// `url` with its user and password replaced by `***`, for logs and error messages:
/// `redis://user:secret@host:6379/0` becomes `redis://***@host:6379/0`, and the `user`, `pass`
/// and `password` parameters of a query (`redis+unix:///run/redis.sock?pass=secret`, a form the
/// client accepts; their names matched percent-decoded, as the client reads them) become
/// `pass=***`.
///
/// An `@` after a `?` has two readings: a password holding a raw `?` (`redis://u:ab?cd@host`)
/// or a query value holding a raw `@` (`?user=svc@team&pass=secret`, which the client reads as
/// such). Both are hidden: everything from the scheme to the next `&` after the last `@`, and
/// the credentials among the parameters after it.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let first_query = url.find('?');
    let last_at = url.rfind('@');
    if let (Some(q), Some(at)) = (first_query, last_at)
        && q < at
    {
        // Kept only if it is a scheme: a user part may come before it (`u:pw@redis://h`), and a
        // password may hold `://`.
        let scheme = url[..q]
            .find("://")
            .filter(|&s| {
                url[..s]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            })
            .map_or("", |s| &url[..s + 3]);
        let rest = &url[at + 1..];
        let mut out = format!("{scheme}***");
        if let Some(amp) = rest.find('&') {
            out.push('&');
            out.push_str(&redact_params(&rest[amp + 1..]));
        }
        return out;
    }
    let host_at = last_at.map_or(0, |at| at + 1);
    let (base, query) = match url[host_at..].find('?') {
        Some(q) => (&url[..host_at + q], Some(&url[host_at + q + 1..])),
        None => (url, None),
    };
    let mut out = match (base.find("://"), last_at) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &base[..s], &base[at + 1..]),
        // No scheme before the user part (`user:pw@host`, a scheme forgotten): the client refuses
        // the URL, and its error must not carry the password either.
        (_, Some(at)) => format!("***@{}", &base[at + 1..]),
        _ => base.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        out.push_str(&redact_params(query));
    }
    out
}

/// `query`'s parameters, with the values of `user`, `pass` and `password` replaced by `***`.
fn redact_params(query: &str) -> String {
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((k, _))
                if ["user", "pass", "password"]
                    .contains(&&*percent_encoding::percent_decode_str(k).decode_utf8_lossy()) =>
            {
                format!("{k}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    params.join("&")
}

/// Whether `url` is a `rediss://` (TLS) one, or redis-rs's other name for it, `valkeys://`: one
/// that needs the `tls` or `tls-rustls` feature. Told by its scheme, in any case, as redis-rs's
/// URL parser reads it (spaces and control characters before it, and tabs and newlines within
/// it, left out); a URL of that scheme that does not parse (a bad port) is one too, so that its
/// error is the URL's, not a TLS setting's said to need one.
pub fn is_tls_url(url: &str) -> bool {
    // The URL's start as the parser reads it: the scheme is what comes before the first `:`.
    let start: String = url
        .trim_start_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .take("valkeys:".len())
        .collect();
    ["rediss:", "valkeys:"].iter().any(|tls| {
        start
            .get(..tls.len())
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case(tls))
    })
}

/// Whether rustls can present `client`: at least one certificate, and a private key it can sign
/// with that is the first certificate's (rustls compares their public keys), as a connection
/// would find out at its handshake.
#[cfg(feature = "tls-rustls")]
fn rustls_client_identity(client: &redis::ClientTlsConfig) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(&client.client_cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate PEM holds no certificate".to_owned());
    }
    let key =
        PrivateKeyDer::from_pem_slice(&client.client_key).map_err(|e| format!("the key: {e}"))?;
    install_crypto_provider();
    rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(drop)
        .map_err(|e| {
            let text = e.to_string();
            // rustls (webpki) parses X.509 v3 only, and words the refusal of this process's own
            // certificate as of a peer's.
            if matches!(e, rustls::Error::InvalidCertificate(_))
                && text.contains("UnsupportedCertVersion")
            {
                "the certificate is X.509 v1, and rustls presents v3 certificates only: issue it \
                 again with extensions (`openssl x509 -req` with an `-extfile` holding, say, \
                 `extendedKeyUsage=clientAuth`), or build with the `tls` feature (native-tls)"
                    .to_owned()
            } else {
                text
            }
        })
}

/// Installs aws-lc-rs's rustls provider as the process's default, unless one is installed already.
/// redis-rs builds its rustls configurations with the process default, and rustls picks one by
/// itself only when exactly one provider's feature is on in the whole build; with two (another
/// dependency turning on ring's), making a connection would panic. An application that installs
/// its own provider before building the store keeps it.
#[cfg(feature = "tls-rustls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one in between: that one stays, which is as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Quota;

    /// `rediss://` (or `valkeys://`, which redis-rs takes as the same) in any case is a TLS URL,
    /// as the URL parser takes it (an upper-case one went past the check for the TLS feature); a
    /// URL cut inside a multi-byte character is not.
    #[test]
    fn tls_urls_are_told_by_their_scheme_in_any_case() {
        for url in [
            "rediss://h:6380",
            "REDISS://h",
            "Rediss://h/#insecure",
            "valkeys://h:6380",
            "VALKEYS://h",
            " valkeys://h",
            "\trediss://h",
            "\0rediss://h",
            "redi\tss://h",
            "valk\neys://h",
        ] {
            assert!(is_tls_url(url), "{url:?}");
            // As redis-rs takes it: a TLS connection, which it refuses without a TLS feature.
            let info = url.parse::<redis::ConnectionInfo>();
            #[cfg(any(feature = "tls", feature = "tls-rustls"))]
            assert!(
                matches!(
                    info.as_ref().map(|i| i.addr()),
                    Ok(redis::ConnectionAddr::TcpTls { .. })
                ),
                "{url}"
            );
            #[cfg(not(any(feature = "tls", feature = "tls-rustls")))]
            assert!(info.is_err(), "{url}");
        }
        // Written so, but not parsed: TLS URLs all the same, refused for what is wrong in them.
        for url in [
            "rediss://h:99999",
            "rediss://[::1",
            "VALKEYS://h:port",
            " rediss://h:99999",
            "redi\tss://h:99999",
            "\u{1}valk\neys://h:port",
            "rediss:/h",
        ] {
            assert!(is_tls_url(url), "{url:?}");
            assert!(url.parse::<redis::ConnectionInfo>().is_err(), "{url}");
        }
        for url in ["redis://h", "valkey://h", "VALKEY://h"] {
            assert!(!is_tls_url(url), "{url}");
            let info = url.parse::<redis::ConnectionInfo>().expect(url);
            assert!(
                matches!(info.addr(), redis::ConnectionAddr::Tcp(..)),
                "{url}"
            );
        }
        for url in [
            "rediss",
            "",
            "unix:///tmp/r.sock",
            "redisé://h",
            "valkeyé://h",
        ] {
            assert!(!is_tls_url(url), "{url}");
        }
    }

    #[test]
    fn replacements_that_keep_the_old_connection_space_out() {
        let rt = Duration::from_millis(500);
        let waits: Vec<u128> = (1..=7)
            .map(|kept| reopen_backoff(kept, rt).as_millis())
            .collect();
        assert_eq!(waits, [0, 500, 1_500, 3_500, 7_500, 8_000, 8_000]);
        assert_eq!(reopen_backoff(u32::MAX, rt), MAX_REOPEN_BACKOFF);
        assert_eq!(reopen_backoff(40, Duration::MAX), MAX_REOPEN_BACKOFF);
    }

    /// Every connection the store makes has Nagle's algorithm off: the standalone server's, and
    /// the cluster nodes' side connections (made from the first node's settings).
    #[test]
    fn connections_are_made_with_nodelay() {
        for url in ["redis://127.0.0.1:6379", "redis://:pw@localhost:7000/2"] {
            let info = RedisStore::builder(url).connection_info(url).unwrap();
            assert!(info.tcp_settings().nodelay(), "{url}");
            assert!(info.tcp_settings().keepalive().is_some(), "{url}");
        }
        assert!(crate::cluster::tcp_settings().nodelay());
        assert!(crate::cluster::tcp_settings().keepalive().is_some());
    }

    /// Every ARGV after the time, as `command` sends them.
    fn script_args(limit: &Limit, cost: u64, slack_ms: u64) -> Vec<u64> {
        let mut args = vec![wire_cost(cost)];
        quota_args(limit, slack_ms, |a| args.push(a));
        args
    }

    #[test]
    fn args_carry_integer_parameters() {
        let limit = Limit::new(
            Algorithm::TokenBucket,
            [
                Quota::per_second(2).unwrap().with_burst(5).unwrap(),
                Quota::per_day(1000).unwrap(),
            ],
        )
        .unwrap();
        let a = script_args(&limit, u64::MAX, 0);
        assert_eq!(a[..3], [MAX_EXACT + 1, 2, 0]);
        let q = limit.quotas()[0];
        assert_eq!(
            a[3..7],
            [5, q.scale(), q.refill_per_micro(), q.capacity_units()]
        );
        let w = Limit::single(Algorithm::SlidingWindow, Quota::per_minute(100).unwrap()).unwrap();
        assert_eq!(script_args(&w, 1, 3), [1, 1, 3, 100, 60_000_000]);
    }

    #[test]
    fn prefixes_cannot_move_the_hash_tag() {
        assert!(validate_prefix("rl").is_ok());
        assert!(validate_prefix("app:rl").is_ok());
        for bad in ["", "a{b", "}", "with space", &"x".repeat(65)] {
            assert!(validate_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=2&pass=secret&user=me"),
            "redis+unix:///run/redis.sock?db=2&pass=***&user=***"
        );
        // An `@` after a `?`: a password holding a raw `?`, or a query value holding a raw `@`
        // (the client reads the latter); both readings are hidden.
        assert_eq!(
            redact_url("redis://default:ab?cd@redis:6379"),
            "redis://***"
        );
        for url in [
            "redis+unix:///run/redis.sock?user=svc@team&pass=s3cret",
            "redis+unix:///run/redis.sock?pass=hunter2@tail",
            "redis+unix:///run/redis.sock?db=1&pass=a@b&user=c@d",
            "u:s3cret@redis://h:1?x=a@b",
            "u:s3cret://x?y@h",
        ] {
            let r = redact_url(url);
            for secret in ["s3cret", "svc", "hunter2", "tail", "a@b", "c@d"] {
                assert!(!r.contains(secret), "{url} -> {r}");
            }
        }
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?user=svc@team&pass=s3cret&db=2"),
            "redis+unix://***&pass=***&db=2"
        );
        // Keys are matched as the client reads them, percent-decoded.
        assert_eq!(
            redact_url("redis+unix:///s?%70ass=secret&%75ser=me"),
            "redis+unix:///s?%70ass=***&%75ser=***"
        );
        assert_eq!(
            redact_url("redis://u:pw@h:1/0?password=pw&protocol=resp3"),
            "redis://***@h:1/0?password=***&protocol=resp3"
        );
        // Without a scheme before the user part.
        assert_eq!(redact_url("default:s3cret@redis:6379"), "***@redis:6379");
        assert_eq!(redact_url("redis:u:pw@h:1"), "***@h:1");
        assert_eq!(redact_url("u:pw@redis://h:1"), "***@redis://h:1");
    }
}
