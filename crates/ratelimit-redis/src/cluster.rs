//! Redis Cluster: connections that never send a script twice, and the redirections they follow.
//!
//! redis-rs's cluster client re-sends a command by itself after an I/O error or a dropped
//! connection (up to 16 times by default). For a rate-limit script that is wrong: the first copy
//! may have run on the master before the connection dropped, and a second copy spends a second
//! token for the same request. So the store builds its cluster client with **no** retries, and
//! re-sends only after an answer that proves the script did not run:
//!
//! - `MOVED slot host:port`: the node does not serve the slot; the script is sent to the named
//!   node over a side connection of the store's own (the client refreshes its slot map
//!   meanwhile);
//! - `ASK slot host:port`: the slot is being migrated and the key is not on this node; `ASKING`
//!   and the script are sent to the named node over a side connection in one write, so no other
//!   command on the shared connection can come between them;
//! - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY`, or no connection to the
//!   slot's node: refused before anything ran (a script on a read-only replica fails at its first
//!   write); sent again after a short pause, within the check's response timeout;
//! - `NOSCRIPT`: loaded on the node that answered it (the slot's master, or the node named by a
//!   redirection), then sent again to the same node; up to [`MAX_LOADS`] times in one check.
//!
//! Every other error, and every I/O error, is returned: the check fails, and the layer's failure
//! policy decides what the request gets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{self, RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError,
    ServerErrorKind, Value,
};
use tokio::sync::watch;

use crate::scripts;
use crate::store::{is_broken, lock};
use crate::turns::Turns;

/// How many times one check may be sent (the first time included) while it is redirected or
/// refused. The check's response timeout bounds the time spent as well.
pub(crate) const MAX_SENDS: u32 = 16;
/// The first pause after a refusal; each further refusal doubles it, up to [`MAX_PAUSE`].
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(5);
pub(crate) const MAX_PAUSE: Duration = Duration::from_millis(200);
/// How many times one check may load its script, each after a `NOSCRIPT` (which proves it did
/// not run): scripts flushed again while a check reloads (an operator's `SCRIPT FLUSH` run
/// twice, a failover to a node that lost them) are loaded again, a server that keeps losing
/// them is not chased further.
pub(crate) const MAX_LOADS: u32 = 3;
/// How many side connections (to nodes that redirections named) are kept.
const MAX_SIDE_CONNECTIONS: usize = 64;

/// Makes cluster connections for the store's pool: a deadpool manager around a redis-rs
/// [`ClusterClient`] built with no retries (deadpool-redis's own cluster manager keeps the
/// default of 16).
pub(crate) struct Manager {
    client: ClusterClient,
    nodes: Arc<Nodes>,
}

impl Manager {
    /// `client_connect_timeout` is the cluster client's (see [`client_connect_timeout`]);
    /// `connect_timeout` the side connections'.
    /// `certs`, with the `tls-rustls` feature only, are the roots the client verifies the nodes
    /// against and the certificate it presents to them.
    pub(crate) fn new(
        home: crate::spawn::Home,
        infos: Vec<ConnectionInfo>,
        certs: Option<crate::store::ClusterCertificates>,
        connect_timeout: Duration,
        client_connect_timeout: Duration,
        response_timeout: Duration,
        ping_after_idle: Duration,
    ) -> Result<Self, RedisError> {
        let template = infos.first().cloned();
        // Each node's answers are bounded by the response timeout, those the client waits for
        // itself included: the `PING` to every node that making a connection and refreshing the
        // slot map send, and `CLUSTER SLOTS`. Without one, a node that stops answering without
        // closing its connection (a frozen process, a partition) held a refresh, and with it
        // every key, until it answered again, and no new connection could ever be made.
        let builder = ClusterClientBuilder::new(infos)
            .retries(0)
            .connection_timeout(client_connect_timeout)
            .response_timeout(response_timeout)
            .tcp_settings(tcp_settings());
        #[cfg(feature = "tls-rustls")]
        let builder = match certs {
            Some(certs) => builder.certs(certs),
            None => builder,
        };
        #[cfg(not(feature = "tls-rustls"))]
        if let Some(never) = certs {
            match never {}
        }
        let client = builder.build()?;
        Ok(Manager {
            client,
            nodes: Arc::new(Nodes {
                home,
                template,
                connect_timeout,
                ping_after_idle,
                side: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// The cluster client's connect timeout when the store's is left at its default: that, but at
/// most a third of the response timeout.
/// The client refreshes its slot map after every `MOVED` (retries or not), holding the write lock
/// of its connection table while it connects to every node the map names; a master gone from the
/// network (its host down, its packets dropped, not refused) holds each refresh for the whole
/// connect timeout, and with it every key of every master. Every check of that master's keys is
/// redirected to it and starts another refresh, so with the default connect timeout (1 s) longer
/// than the response timeout (500 ms) the other masters' checks failed too, until the failover.
/// A command can wait for two refreshes, not one: the rest of the refresh under way when it is
/// sent, then, if a `MOVED` answer reaches the client before its own answer does, the whole next
/// one (the client polls none of its commands during a refresh). At half the response timeout,
/// two refreshes took it all and such checks failed (2 in each of four runs of
/// `a_master_gone_from_the_network_leaves_the_other_masters_answering`, the slowest answered at
/// 501 ms); at a third they took 338 ms at most, with 4 or 16 of the dead master's checks at once.
pub(crate) fn client_connect_timeout(
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Duration {
    connect_timeout.min(response_timeout / 3)
}

/// How long making a cluster connection may take: the client connects to every seed (each within
/// the connect timeout, then a `PING` within the response timeout), asks one for the slot map,
/// then connects to every node the map names, the same way. A node that does not answer takes its
/// whole timeouts in each round; the pool's limit leaves room for that, so that such a node
/// fails alone instead of failing every new connection.
pub(crate) fn create_timeout(connect_timeout: Duration, response_timeout: Duration) -> Duration {
    connect_timeout
        .saturating_mul(2)
        .saturating_add(response_timeout.saturating_mul(3))
}

/// The cluster client's socket settings (it takes them from its builder, not from the nodes'
/// connection infos): those of every connection the store makes
/// ([`tuned`](crate::store::tuned)).
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    crate::store::tuned(redis::io::tcp::TcpSettings::default())
}

impl managed::Manager for Manager {
    type Type = Connection;
    type Error = RedisError;

    async fn create(&self) -> Result<Connection, RedisError> {
        Ok(Connection {
            conn: self.client.get_async_connection().await?,
            nodes: Arc::clone(&self.nodes),
            turns: Arc::new(Turns::new()),
        })
    }

    async fn recycle(&self, conn: &mut Connection, _: &Metrics) -> RecycleResult<RedisError> {
        // The store detaches its connections from the pool, so this runs only if one is ever
        // returned to it: check it answers.
        redis::cmd("PING")
            .query_async::<()>(&mut conn.conn)
            .await
            .map_err(managed::RecycleError::Backend)
    }
}

/// A cluster connection (it multiplexes over one connection per master and follows topology
/// changes) and the store's side connections.
#[derive(Clone)]
pub(crate) struct Connection {
    conn: ClusterConnection,
    nodes: Arc<Nodes>,
    /// Its turns into the client (see [`crate::turns`]), shared by its clones.
    turns: Arc<Turns>,
}

/// The store's own connections to nodes that redirections name (`MOVED`, `ASK`), made from the
/// first node's settings, kept per node and shared by the store's connections.
struct Nodes {
    /// The store's runtime, where side connections are made (and so driven) if it is a
    /// multi-thread runtime still running (see [`crate::spawn`]).
    home: crate::spawn::Home,
    /// The first node's settings (credentials, TLS), for connecting to other nodes.
    template: Option<ConnectionInfo>,
    connect_timeout: Duration,
    /// The store's `ping_after_idle`: a side connection idle that long gets a `PING` before the
    /// next check (see `side_send`).
    ping_after_idle: Duration,
    /// Per node, its connection once made (by the first check that needs it; see `side_send`).
    side: Mutex<HashMap<(String, u16), Arc<SideConnection>>>,
}

/// A node's side connection: made once, in a task of its own started by the first check
/// redirected to the node, while the others wait for it (see `side_connection`).
type SideConnection = Mutex<SideState>;

#[derive(Default)]
struct SideState {
    conn: Option<MultiplexedConnection>,
    /// When a check was last sent on `conn`.
    used: Option<tokio::time::Instant>,
    /// The opening in flight, if any: its answer, once it has one.
    opening: Option<watch::Receiver<Option<Result<MultiplexedConnection, RedisError>>>>,
}

/// Where a check is sent.
#[derive(Clone, Debug, PartialEq)]
enum Route {
    /// To the master of the keys' slot, as the client's slot map says.
    Slot,
    /// To this node (after `MOVED`).
    Node(String, u16),
    /// To this node, preceded by `ASKING` (after `ASK`).
    Asking(String, u16),
}

/// What to do after an error.
enum Next {
    /// The script may have run, or cannot run: return the error.
    Fail,
    /// Send again, to this route, at once.
    Resend(Route),
    /// Send again, to this route, after a pause.
    Pause(Route),
    /// Load the script, then send again to the same route.
    Load,
}

impl Connection {
    /// `ping` (a `PING`), which the client sends to every primary, answered `within` from when
    /// it has its turn: a probe of a busy connection is not failed by the checks queued for
    /// turns ahead of it.
    pub(crate) async fn ping(
        &mut self,
        ping: &Cmd,
        within: Duration,
    ) -> Result<Result<(), RedisError>, tokio::time::error::Elapsed> {
        let turn = self.turns.turn().await;
        let answer = self.turns.hold(turn, ping.query_async(&mut self.conn));
        tokio::time::timeout(within, answer).await
    }

    /// A `PING` to the master of `key`'s slot (by the client's slot map), in its turn into the
    /// client (the caller bounds both).
    pub(crate) async fn ping_master_of(&mut self, key: &[u8]) -> Result<(), RedisError> {
        let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
            cluster_routing::Route::with_key(key, cluster_routing::SlotAddr::Master),
        ));
        self.turns
            .send(self.conn.route_command(redis::cmd("PING"), to))
            .await
            .and_then(Value::extract_error)
            .map(drop)
    }

    /// Whether this connection reaches every master that the cluster names now (`CLUSTER SLOTS`,
    /// answered by a node this connection reaches): a `PING` to every primary, each answer
    /// kept apart, must come from each of them. The client sends such a `PING` only to the
    /// primaries it has a connection to, and answers `PONG` if those do: a connection made while
    /// a master was silent (the client goes on without the nodes it cannot connect to) would pass
    /// without reaching that master. Nor by address, one `PING` per master: asked for a node it
    /// has no connection to, the client rebuilds every connection from its seeds.
    pub(crate) async fn reaches_every_master(&mut self) -> Result<(), RedisError> {
        let slots: Value = self
            .turns
            .send(
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut self.conn),
            )
            .await?;
        // No response policy: one answer per primary, keyed by its address.
        let to =
            RoutingInfo::MultiNode((cluster_routing::MultipleNodeRoutingInfo::AllMasters, None));
        let answers = self
            .turns
            .send(self.conn.route_command(redis::cmd("PING"), to))
            .await?;
        let reached = answered_by(&answers);
        match masters_of(&slots).difference(&reached).next() {
            None => Ok(()),
            Some((host, port)) => Err(RedisError::from((
                ErrorKind::ClusterConnectionNotFound,
                "no link to a master",
                format!("{host}:{port}"),
            ))),
        }
    }

    /// `SCRIPT LOAD` on every node (redis-rs sends it to replicas too).
    pub(crate) async fn load(&mut self, script: &redis::Script) -> Result<(), RedisError> {
        self.turns
            .send(script.load_async(&mut self.conn))
            .await
            .map(drop)
    }

    /// `SCRIPT LOAD` on the node that answered `NOSCRIPT` to `cmd` sent by the slot map: the
    /// master of the key's slot (a redirected check's side connection loads it itself). Not on
    /// every node, as [`load`](Self::load) does, which fails if any node is down: one shard's
    /// outage (a cluster serving without full coverage) must not keep a healthy master that lost
    /// its scripts (a restart, a failover) from answering.
    async fn load_for(&mut self, script: &redis::Script, cmd: &Cmd) -> Result<(), RedisError> {
        let to = first_key(cmd).map(|key| {
            SingleNodeRoutingInfo::SpecificNode(cluster_routing::Route::with_key(
                key,
                cluster_routing::SlotAddr::Master,
            ))
        });
        match (to, scripts::source_of(script)) {
            (Some(to), Some(source)) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(source);
                self.turns
                    .send(self.conn.route_command(load, RoutingInfo::SingleNode(to)))
                    .await
                    .and_then(Value::extract_error)
                    .map(drop)
            }
            _ => self.load(script).await,
        }
    }

    /// Sends `cmd` (an `EVALSHA` of `script`), following the redirections and refusals that
    /// prove the script did not run, and returns the script's reply.
    pub(crate) async fn eval(
        &mut self,
        script: &redis::Script,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        let mut route = Route::Slot;
        let mut pause = FIRST_PAUSE;
        let mut loads = 0;
        let mut sends = 0;
        loop {
            sends += 1;
            let error = match self.send(&route, script, cmd, &mut loads).await {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            if sends >= MAX_SENDS {
                return Err(error);
            }
            let next = next(&error, &route);
            if !matches!(next, Next::Fail) {
                tracing::debug!(%error, "ratelimit-redis: cluster check sent again");
            }
            match next {
                Next::Fail => return Err(error),
                Next::Resend(to) => route = to,
                Next::Pause(to) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                    route = to;
                }
                // A side connection loads the script itself (`eval_on`): still missing, it
                // cannot be loaded there.
                Next::Load if route != Route::Slot => return Err(error),
                Next::Load if loads < MAX_LOADS => {
                    loads += 1;
                    self.load_for(script, cmd).await?;
                }
                Next::Load => return Err(error),
            }
        }
    }

    /// `loads`: how many times the check has loaded its script so far (a side connection loads it
    /// itself, within the same [`MAX_LOADS`]).
    async fn send(
        &mut self,
        route: &Route,
        script: &redis::Script,
        cmd: &Cmd,
        loads: &mut u32,
    ) -> Result<Value, RedisError> {
        match route {
            Route::Slot => self.turns.send(cmd.query_async(&mut self.conn)).await,
            // A redirection goes over a side connection, never through the cluster client by
            // address: asked for a node it has no connection to (a dead master, whose keys the
            // other nodes redirect to it until it fails over; a new master), the client rebuilds
            // every connection from its seed list, stalling every key, and did so at every such
            // check (`a_dead_masters_checks_do_not_reconnect_the_whole_cluster`).
            Route::Node(host, port) => {
                self.nodes
                    .side_send(host, *port, false, script, cmd, loads)
                    .await
            }
            Route::Asking(host, port) => {
                self.nodes
                    .side_send(host, *port, true, script, cmd, loads)
                    .await
            }
        }
    }
}

/// A side connection's check, until its reply: if dropped without one, or with a broken
/// connection's error, the connection leaves the node's cell (unless another has taken its place)
/// and the next check redirected there makes a new one.
struct Unanswered<'a> {
    nodes: &'a Nodes,
    key: &'a (String, u16),
    cell: &'a Arc<SideConnection>,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.nodes.forget(self.key, self.cell);
        }
    }
}

/// `cmd` (an `EVALSHA` of `script`) on the connection to one server: a standalone server, or a
/// cluster node reached directly (after `ASKING`, in the same write, if `asking`). `NOSCRIPT`
/// proves the script did not run: it is loaded on that server and `cmd` sent once more, while
/// the check has loaded it fewer than [`MAX_LOADS`] times (`loads`, which a cluster check
/// redirected here after loading it on its slot's master carries on counting).
pub(crate) async fn eval_on(
    conn: &mut MultiplexedConnection,
    script: &redis::Script,
    cmd: &Cmd,
    asking: bool,
    loads: &mut u32,
) -> Result<Value, RedisError> {
    let send = async |conn: &mut MultiplexedConnection| {
        if asking {
            one_reply(conn.req_packed_commands(&self::asking(cmd), 1, 1).await?)
        } else {
            cmd.query_async(conn).await
        }
    };
    loop {
        match send(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                if *loads >= MAX_LOADS {
                    return Err(e);
                }
                *loads += 1;
                script.load_async(&mut *conn).await?;
            }
            reply => return reply,
        }
    }
}

/// `ASKING` and `cmd`, to be written together: on a multiplexed connection no other command can
/// then come between them and take the `ASKING`.
fn asking(cmd: &Cmd) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    pipe
}

/// The one reply of a pipeline read from its second command on, server errors as errors.
fn one_reply(mut replies: Vec<Value>) -> Result<Value, RedisError> {
    match replies.pop() {
        Some(value) if replies.is_empty() => value.extract_error(),
        _ => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "ASKING and EVALSHA did not answer one reply",
        ))),
    }
}

impl Nodes {
    /// Sends `cmd` (after `ASKING` if `asking`) over a side connection to `host:port`. The node
    /// is not one the cluster client loads scripts on, so `NOSCRIPT` is answered here: the script
    /// is loaded on that node and sent once more (while the check has made fewer than
    /// [`MAX_LOADS`] loads, counted in `loads`).
    async fn side_send(
        self: &Arc<Self>,
        host: &str,
        port: u16,
        asking: bool,
        script: &redis::Script,
        cmd: &Cmd,
        loads: &mut u32,
    ) -> Result<Value, RedisError> {
        let key = (host.to_owned(), port);
        let mut cell = self.cell(&key);
        let mut conn = self.side_connection(&key, &cell).await?;
        // Side connections sit idle between redirections, and the node (its `timeout`), a proxy
        // or `CLIENT KILL` may close one meanwhile: one idle for the store's `ping_after_idle`
        // is asked first, as the store's own connections are, and one found closed is replaced
        // before the check is written on it.
        let idle = lock(&cell)
            .used
            .is_some_and(|used| used.elapsed() >= self.ping_after_idle);
        if idle {
            // Left unanswered (the check's deadline cut it), or found closed, the connection is
            // forgotten as the guard drops, as after a check.
            let mut pinging = Unanswered {
                nodes: self,
                key: &key,
                cell: &cell,
                armed: true,
            };
            let ping = redis::cmd("PING").query_async::<()>(&mut conn).await;
            let closed = matches!(&ping, Err(e) if is_broken(e));
            pinging.armed = closed;
            drop(pinging);
            if closed {
                tracing::debug!(
                    host,
                    port,
                    "ratelimit-redis: an idle side connection was closed"
                );
                cell = self.cell(&key);
                conn = self.side_connection(&key, &cell).await?;
            }
        }
        lock(&cell).used = Some(tokio::time::Instant::now());
        // Dropped before the reply (the check's deadline), the connection goes too: side
        // connections sit idle between redirections, and one that a firewall or a NAT has
        // silently dropped meanwhile would otherwise hold every check redirected to its node
        // until its deadline, for as long as the kernel keeps the dead socket (minutes).
        let mut unanswered = Unanswered {
            nodes: self,
            key: &key,
            cell: &cell,
            armed: true,
        };
        let reply = eval_on(&mut conn, script, cmd, asking, loads).await;
        unanswered.armed = matches!(&reply, Err(e) if is_broken(e));
        reply
    }

    /// The node `key`'s cell, made if it has none.
    fn cell(&self, key: &(String, u16)) -> Arc<SideConnection> {
        let mut side = lock(&self.side);
        if side.len() >= MAX_SIDE_CONNECTIONS && !side.contains_key(key) {
            // Connections in use stay with their checks; later ones make new ones.
            side.clear();
        }
        Arc::clone(side.entry(key.clone()).or_default())
    }

    /// Drops the node `key`'s cell if it is still `cell`: the next check redirected there makes
    /// a new connection.
    fn forget(&self, key: &(String, u16), cell: &Arc<SideConnection>) {
        let mut side = lock(&self.side);
        if side.get(key).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            side.remove(key);
        }
    }

    /// `cell`'s connection to the node `key`, made if there is none. One connection is made at
    /// a time per node, whatever the number of checks redirected to it at once (a slot's move, a
    /// failover: every check of the slot in flight is redirected): the others wait for it
    /// instead of each making its own. It is made in a task of its own (within the connect
    /// timeout), which a check giving up (its deadline, or its caller's) does not cancel: a node
    /// slower to reach than a check's deadline is reached all the same, for the checks after it.
    async fn side_connection(
        self: &Arc<Self>,
        key: &(String, u16),
        cell: &Arc<SideConnection>,
    ) -> Result<MultiplexedConnection, RedisError> {
        let mut opening = {
            let mut state = lock(cell);
            if let Some(conn) = &state.conn {
                return Ok(conn.clone());
            }
            match &state.opening {
                Some(opening) => opening.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.opening = Some(rx.clone());
                    let (nodes, cell, (host, port)) =
                        (Arc::clone(self), Arc::clone(cell), key.clone());
                    let home = nodes.home.clone();
                    home.spawn(async move {
                        let made = nodes.connect(&host, port).await;
                        {
                            let mut state = lock(&cell);
                            if let Ok(conn) = &made {
                                state.conn = Some(conn.clone());
                            }
                            state.opening = None;
                        }
                        let _ = tx.send(Some(made));
                    });
                    rx
                }
            }
        };
        let made = opening
            .wait_for(Option::is_some)
            .await
            .map(|made| made.clone());
        if let Ok(Some(made)) = made {
            return made;
        }
        // The task ended without an answer (dropped with its runtime): the next check opens
        // anew.
        let mut state = lock(cell);
        if state
            .opening
            .as_ref()
            .is_some_and(|o| o.same_channel(&opening))
        {
            state.opening = None;
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "the side connection's opening ended unfinished",
        )))
    }

    async fn connect(&self, host: &str, port: u16) -> Result<MultiplexedConnection, RedisError> {
        let Some(template) = &self.template else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "no node settings to connect with",
            )));
        };
        let Some(addr) = address_like(template.addr(), host, port) else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "cluster nodes are reached over TCP",
            )));
        };
        let client = redis::Client::open(template.clone().set_addr(addr))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
}

/// The masters that a `CLUSTER SLOTS` reply names (each slot range's first node), by the address
/// the cluster client connects to. Ranges whose master has no usable address (an empty or
/// wildcard host, which the client replaces with the answering node's; `?`, an unknown
/// endpoint, which it skips) are left out: the client's own map is what they are checked against,
/// and it cannot be matched without the answering node.
fn masters_of(slots: &Value) -> std::collections::BTreeSet<(String, u16)> {
    slot_ranges(slots)
        .filter_map(|range| range.get(2).and_then(node_address))
        .collect()
}

/// The slot ranges of a `CLUSTER SLOTS` reply, each `[first, last, master, replicas...]`.
pub(crate) fn slot_ranges(slots: &Value) -> impl Iterator<Item = &[Value]> {
    let ranges: &[Value] = match slots {
        Value::Array(ranges) => ranges,
        _ => &[],
    };
    ranges.iter().filter_map(|range| match range {
        Value::Array(range) => Some(range.as_slice()),
        _ => None,
    })
}

/// A node's address in a `CLUSTER SLOTS` range (`[host, port, id, ...]`), if it has a usable one:
/// not an empty or wildcard host (which the client replaces with the answering node's), nor `?`
/// (an unknown endpoint, which it skips).
pub(crate) fn node_address(node: &Value) -> Option<(String, u16)> {
    let Value::Array(node) = node else {
        return None;
    };
    let host = match node.first() {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => return None,
    };
    let port = match node.get(1) {
        Some(Value::Int(p)) => u16::try_from(*p).ok()?,
        _ => return None,
    };
    let unusable = host.is_empty() || host == "?" || host == "0.0.0.0" || host == "::";
    (!unusable).then_some((host, port))
}

/// `host:port` reached as `template` reaches its node (plain TCP, or TLS with its settings);
/// `None` for a template that is not TCP.
pub(crate) fn address_like(
    template: &ConnectionAddr,
    host: &str,
    port: u16,
) -> Option<ConnectionAddr> {
    match template {
        ConnectionAddr::Tcp(..) => Some(ConnectionAddr::Tcp(host.to_owned(), port)),
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => Some(ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        }),
        _ => None,
    }
}

/// The nodes that answered a `PING` sent to every primary with no response policy (a map of
/// each node's `host:port` to its answer), errors left out.
fn answered_by(answers: &Value) -> std::collections::BTreeSet<(String, u16)> {
    let Value::Map(answers) = answers else {
        return std::collections::BTreeSet::new();
    };
    answers
        .iter()
        .filter(|(_, answer)| !matches!(answer, Value::ServerError(_)))
        .filter_map(|(addr, _)| {
            let addr = match addr {
                Value::BulkString(b) => std::str::from_utf8(b).ok()?,
                Value::SimpleString(s) => s.as_str(),
                _ => return None,
            };
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// The first key of `cmd`, an `EVALSHA sha numkeys key ...`.
pub(crate) fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    match cmd.args_iter().nth(3)? {
        redis::Arg::Simple(key) => Some(key),
        _ => None,
    }
}

/// What an error proves, and where to send the check next.
fn next(error: &RedisError, route: &Route) -> Next {
    // The node a redirection names: `None` if it names none; `Some(None)` if its endpoint is
    // empty (Redis 7 with `cluster-preferred-endpoint-type unknown-endpoint`: `MOVED 3999 :6381`,
    // the host the command was sent to, at that port) and the check went by the slot map, whose
    // host for the slot is the cluster client's, not known here.
    let redirect = || {
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse::<u16>().ok()?;
        if !host.is_empty() && host != "?" {
            return Some(Some((host.to_owned(), port)));
        }
        match route {
            Route::Node(host, _) | Route::Asking(host, _) => Some(Some((host.clone(), port))),
            Route::Slot => Some(None),
        }
    };
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => match redirect() {
            Some(Some((host, port))) => Next::Resend(Route::Node(host, port)),
            // The MOVED makes the cluster client refresh its slot map, in which an unknown
            // endpoint is the host of the node that answered it: go by the refreshed map.
            Some(None) => Next::Pause(Route::Slot),
            None => Next::Fail,
        },
        ErrorKind::Server(ServerErrorKind::Ask) => match redirect() {
            Some(Some((host, port))) => Next::Resend(Route::Asking(host, port)),
            // A slot being migrated is still its source's in the slot map, which would answer
            // `ASK` again: the key cannot be checked until the migration ends (documented).
            Some(None) | None => Next::Fail,
        },
        ErrorKind::Server(ServerErrorKind::NoScript) => Next::Load,
        // Keys of a migrating slot are split between two nodes: ask the same node again.
        ErrorKind::Server(ServerErrorKind::TryAgain) => Next::Pause(route.clone()),
        // Refused by a node that cannot serve now, or never sent: go by the (refreshed) slot map.
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => Next::Pause(Route::Slot),
        _ => Next::Fail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_harness::{RedisServer, proxy::Proxy};

    /// `Nodes` whose connections go through `proxy`, a script answering 7, and its `EVALSHA`.
    fn side_nodes(proxy: &Proxy, connect_timeout: Duration) -> (Arc<Nodes>, redis::Script, Cmd) {
        side_nodes_idle(
            proxy,
            connect_timeout,
            crate::store::DEFAULT_PING_AFTER_IDLE,
        )
    }

    /// [`side_nodes`], whose side connections get a `PING` after `ping_after_idle`.
    fn side_nodes_idle(
        proxy: &Proxy,
        connect_timeout: Duration,
        ping_after_idle: Duration,
    ) -> (Arc<Nodes>, redis::Script, Cmd) {
        use redis::IntoConnectionInfo;
        let nodes = Arc::new(Nodes {
            home: crate::spawn::Home::current().unwrap(),
            template: Some(proxy.url().into_connection_info().unwrap()),
            connect_timeout,
            ping_after_idle,
            side: Mutex::new(HashMap::new()),
        });
        let script = redis::Script::new("return 7");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(0);
        (nodes, script, cmd)
    }

    /// `proxy` goes silent (its next chunk held for an hour; new connections served at once):
    /// the check `send` makes is given up after 200 ms; then, the proxy forwarding again, the
    /// next is answered on one new connection (`accepted` so far).
    async fn silent_then_back<F: Future<Output = Result<Value, RedisError>>>(
        proxy: &Proxy,
        send: impl Fn() -> F,
        accepted: u64,
    ) {
        proxy.set_latency(Duration::from_secs(3_600));
        let gave_up = tokio::time::timeout(Duration::from_millis(200), send()).await;
        assert!(gave_up.is_err(), "a silent connection answered");
        proxy.set_latency(Duration::ZERO);
        let next = tokio::time::timeout(Duration::from_secs(2), send()).await;
        assert_eq!(
            next.expect("answered on a new connection").unwrap(),
            Value::Int(7)
        );
        assert_eq!(proxy.accepted(), accepted + 1, "one new connection");
    }

    /// A side connection idle for `ping_after_idle` is asked with a `PING` before the next check.
    /// Found closed (the node's `timeout`, a proxy's idle limit), it is replaced before the check
    /// is written on it: the check is answered. Silent, it is dropped by the check whose `PING`
    /// it leaves unanswered, as by one whose script it leaves unanswered: the next check makes a
    /// new connection and is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn side_connections_idle_are_asked_first() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let (nodes, script, cmd) =
            side_nodes_idle(&proxy, Duration::from_secs(1), Duration::from_millis(100));
        let send = async || {
            let mut loads = 0;
            nodes
                .side_send("127.0.0.1", proxy.port(), false, &script, &cmd, &mut loads)
                .await
        };
        assert_eq!(send().await.unwrap(), Value::Int(7));
        // Closed at both ends while idle.
        let accepted = proxy.accepted();
        proxy.drop_connections();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(send().await.unwrap(), Value::Int(7));
        assert_eq!(proxy.accepted(), accepted + 1, "one new connection");
        // Silent while idle.
        let accepted = proxy.accepted();
        tokio::time::sleep(Duration::from_millis(300)).await;
        silent_then_back(&proxy, send, accepted).await;
    }

    /// A side connection that goes silent (a firewall or a NAT dropped it while it sat idle
    /// between redirections) is dropped by the first check it leaves unanswered: the next check
    /// redirected to the node makes a new connection and is answered, instead of waiting on the
    /// dead one until its own deadline, check after check.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_side_connection_left_unanswered_is_replaced() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let (nodes, script, cmd) = side_nodes(&proxy, Duration::from_secs(1));
        let send = async || {
            let mut loads = 0;
            nodes
                .side_send("127.0.0.1", proxy.port(), false, &script, &cmd, &mut loads)
                .await
        };
        assert_eq!(send().await.unwrap(), Value::Int(7));
        let accepted = proxy.accepted();
        silent_then_back(&proxy, send, accepted).await;
    }

    /// A node slower to reach than a check's deadline: the check that starts the opening gives
    /// up, the opening goes on in its own task, and the next check is answered on the connection
    /// it made (one connection in all), instead of starting an opening of its own that it would
    /// give up too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_side_connection_opening_outlives_the_check_that_started_it() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let (nodes, script, cmd) = side_nodes(&proxy, Duration::from_secs(10));
        let send = async || {
            let mut loads = 0;
            nodes
                .side_send("127.0.0.1", proxy.port(), false, &script, &cmd, &mut loads)
                .await
        };
        // Every chunk of the opening's exchange takes 200 ms each way.
        proxy.set_latency(Duration::from_millis(200));
        let gave_up = tokio::time::timeout(Duration::from_millis(50), send()).await;
        assert!(gave_up.is_err(), "answered through a slow node in 50 ms");
        let key = ("127.0.0.1".to_owned(), proxy.port());
        let made = || {
            lock(&nodes.side)
                .get(&key)
                .is_some_and(|c| lock(c).conn.is_some())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !made() {
            assert!(
                std::time::Instant::now() < deadline,
                "the opening goes on after its check gave up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.set_latency(Duration::ZERO);
        let next = tokio::time::timeout(Duration::from_secs(2), send()).await;
        assert_eq!(next.expect("answered").unwrap(), Value::Int(7));
        assert_eq!(proxy.accepted(), 1, "one connection made");
    }

    /// The masters of a `CLUSTER SLOTS` reply, once each, without replicas or unusable hosts.
    #[test]
    fn masters_are_read_from_cluster_slots() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start: i64, end: i64, nodes: Vec<Value>| {
            let mut v = vec![Value::Int(start), Value::Int(end)];
            v.extend(nodes);
            Value::Array(v)
        };
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
            ),
            range(5461, 10922, vec![node("10.0.0.2", 7001)]),
            range(10923, 12000, vec![node("10.0.0.1", 7000)]),
            range(12001, 13000, vec![node("", 7005)]),
            range(13001, 14000, vec![node("?", 7006)]),
            range(14001, 15000, vec![node("0.0.0.0", 7007)]),
            range(15001, 16383, vec![node("10.0.0.3", 70_000)]),
            Value::Array(vec![Value::Int(1)]),
            Value::Nil,
        ]);
        let masters: Vec<_> = masters_of(&reply).into_iter().collect();
        assert_eq!(
            masters,
            [("10.0.0.1".to_owned(), 7000), ("10.0.0.2".to_owned(), 7001)]
        );
        assert!(masters_of(&Value::Nil).is_empty());

        let pong =
            |addr: &str, answer: Value| (Value::BulkString(addr.as_bytes().to_vec()), answer);
        let answers = Value::Map(vec![
            pong("10.0.0.1:7000", Value::Okay),
            pong("::1:7001", Value::SimpleString("PONG".into())),
            pong(
                "10.0.0.3:7002",
                Value::ServerError(server_error("LOADING").try_into().unwrap()),
            ),
            pong("no-port", Value::Okay),
        ]);
        let reached: Vec<_> = answered_by(&answers).into_iter().collect();
        assert_eq!(
            reached,
            [("10.0.0.1".to_owned(), 7000), ("::1".to_owned(), 7001)]
        );
        assert!(answered_by(&Value::Okay).is_empty());
    }

    fn server_error(text: &str) -> RedisError {
        let parsed = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        parsed.extract_error().unwrap_err()
    }

    #[test]
    fn only_answers_that_prove_the_script_did_not_run_are_resent() {
        let slot = Route::Slot;
        assert!(matches!(
            next(&server_error("MOVED 3999 127.0.0.1:6381"), &slot),
            Next::Resend(Route::Node(h, 6381)) if h == "127.0.0.1"
        ));
        assert!(matches!(
            next(&server_error("ASK 3999 10.0.0.7:7000"), &slot),
            Next::Resend(Route::Asking(h, 7000)) if h == "10.0.0.7"
        ));
        // An empty endpoint (`cluster-preferred-endpoint-type unknown-endpoint`): the host the
        // check was sent to; by the slot map, the refreshed map after a MOVED.
        let node = Route::Node("10.0.0.7".into(), 7000);
        for empty in ["MOVED 3999 :6381", "MOVED 3999 ?:6381"] {
            assert!(
                matches!(
                    next(&server_error(empty), &node),
                    Next::Resend(Route::Node(h, 6381)) if h == "10.0.0.7"
                ),
                "{empty}"
            );
            assert!(
                matches!(next(&server_error(empty), &slot), Next::Pause(Route::Slot)),
                "{empty}"
            );
        }
        assert!(matches!(
            next(&server_error("ASK 3999 :6381"), &node),
            Next::Resend(Route::Asking(h, 6381)) if h == "10.0.0.7"
        ));
        assert!(matches!(
            next(&server_error("ASK 3999 :6381"), &slot),
            Next::Fail
        ));
        let asking = Route::Asking("h".into(), 1);
        assert!(matches!(
            next(&server_error("TRYAGAIN Multiple keys request during rehashing of slot"), &asking),
            Next::Pause(r) if r == asking
        ));
        for refused in [
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
        ] {
            assert!(
                matches!(
                    next(&server_error(refused), &asking),
                    Next::Pause(Route::Slot)
                ),
                "{refused}"
            );
        }
        assert!(matches!(
            next(&server_error("NOSCRIPT No matching script."), &slot),
            Next::Load
        ));
        // The script may have run, or will fail the same way again: never re-sent.
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        for e in [
            io,
            server_error("ERR user_script:1: something went wrong"),
            server_error("OOM command not allowed when used memory > 'maxmemory'."),
            server_error("MOVED not-a-slot"),
        ] {
            assert!(matches!(next(&e, &slot), Next::Fail), "{e}");
        }
    }
}
