//! Test support: real `redis-server` processes on free loopback ports, in temporary directories.
//!
//! ```no_run
//! use redis_harness::{RedisCluster, RedisServer};
//!
//! let server = RedisServer::start();
//! println!("standalone at {}", server.url());
//!
//! let cluster = RedisCluster::start(3);
//! println!("cluster nodes: {:?}", cluster.urls());
//! // Both are stopped when dropped.
//! ```
//!
//! Nothing here is mocked: every server is the real `redis-server` binary. If it (or `redis-cli`)
//! is not installed, starting one panics with a message that says how to install it; tests that
//! need Redis are never skipped silently.
//!
//! Every wait is bounded (a few seconds), so a broken environment fails the test instead of
//! hanging it.
//!
//! Test processes may run at once (`cargo nextest`, two runs of the tests): each claims the ports
//! it hands out with a lock the others respect (kept through a server's kill and restart), and a
//! test process's first server kills those a process killed by a signal left running.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub mod blackhole;
pub mod process;
pub mod proxy;
pub mod tls;

/// How long a server may take to answer PING after starting.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports a start tries before it gives up (another process may take one between its
/// choice and the server's bind).
const PORT_ATTEMPTS: usize = 5;

/// Writes `text` as the configuration file `conf` and starts `redis-server` on it. It logs to the
/// file the configuration names; what it writes before it opens that file (a configuration
/// error, `*** FATAL CONFIG FILE ERROR`) goes to `redis.stderr` beside `conf`, which
/// [`server_log`] adds to the log. Why not, if the files cannot be written or the process
/// cannot be run.
///
/// The server runs in `conf`'s directory, made by [`server_dir`], whose name tells which process
/// started it ([`process::kill_orphans`]).
fn spawn_server(conf: &Path, text: &str, sentinel: bool) -> Result<Child, String> {
    std::fs::write(conf, text).map_err(|e| format!("write {}: {e}", conf.display()))?;
    let stderr_path = conf.with_file_name("redis.stderr");
    let stderr = std::fs::File::create(&stderr_path)
        .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
    let mut command = Command::new(find("redis-server").ok_or(MISSING)?);
    command.arg(conf);
    if sentinel {
        command.arg("--sentinel");
    }
    if let Some(dir) = conf.parent() {
        command.current_dir(dir);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("run redis-server: {e}"))
}

/// A new directory for a server's files (`redis-harness-<kind>owner-<pid>.<start>-…`), its working
/// directory, named for this process ([`process::identity`]). The first in a process kills, before
/// it is made, the servers left by processes that ended without stopping them (a test process
/// killed by a signal).
pub(crate) fn server_dir(kind: &str) -> std::io::Result<TempDir> {
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let owner = OWNER.get_or_init(|| {
        process::kill_orphans();
        process::identity(std::process::id()).unwrap_or_default()
    });
    let prefix = if owner.is_empty() {
        format!("redis-harness-{kind}")
    } else {
        format!("redis-harness-{kind}{}{owner}-", process::OWNER_TAG)
    };
    tempfile::Builder::new().prefix(&prefix).tempdir()
}

/// The log of the server whose files are in `dir`: its `redis.log`, and what it wrote to stderr
/// (a configuration error is written there, before the log file is opened), if anything.
fn server_log(dir: &Path) -> String {
    let mut log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.join("redis.stderr")).unwrap_or_default();
    if !stderr.trim().is_empty() {
        log.push_str("stderr:\n");
        log.push_str(&stderr);
    }
    log
}

/// Whether a server's log says it exited because its port was taken.
fn port_was_taken(log: &str) -> bool {
    log.contains("Address already in use")
}
/// How long a cluster may take to agree that it is up.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

const MISSING: &str = "redis-server not found: run ./scripts/test.sh, which installs it";

/// Ports handed out by this process, so two servers started at once never pick the same one.
static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// The lock files of the ports this process handed out, held locked until it ends.
static CLAIMS: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

/// Where every process of this harness on the machine claims its ports: a fixed place, not the
/// temporary directory, which `./scripts/test.sh` makes anew for each run.
const CLAIMS_DIR: &str = "/tmp/redis-harness-ports";

/// [`CLAIMS_DIR`], made if missing (then open to every user as /tmp is: sticky, each may remove
/// only its own files), and opened once: `None` if it is not a directory of root's or of this
/// user's (another user's directory, or a symbolic link in its place, is not trusted: its owner
/// could swap the files in it, or lead a root process to make files elsewhere), or cannot be
/// opened. Every lock file is then opened relative to it.
fn claims_dir() -> Option<&'static rustix::fd::OwnedFd> {
    use rustix::fs::{FileType, Mode, OFlags, fchmod, fstat, open};
    static DIR: std::sync::OnceLock<Option<rustix::fd::OwnedFd>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let made = std::fs::create_dir(CLAIMS_DIR).is_ok();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = open(CLAIMS_DIR, flags, Mode::empty()).ok()?;
        let stat = fstat(&dir).ok()?;
        let uid = rustix::process::geteuid().as_raw();
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory
            || (stat.st_uid != 0 && stat.st_uid != uid)
        {
            return None;
        }
        if made {
            let _ = fchmod(&dir, Mode::from_raw_mode(0o1777));
        }
        Some(dir)
    })
    .as_ref()
}

/// Whether `port` is this process's now, among the processes of this harness on the machine
/// (test binaries run at once by `cargo nextest`, or by two runs of the tests): an advisory lock
/// (`flock`) on the port's file in [`CLAIMS_DIR`], which the kernel lets go when the process
/// ends, however it ends. A port another process holds is not taken, even while its server is
/// killed and before its restart, when nothing listens on it. Without a directory to claim in
/// ([`claims_dir`]), or on a file system without locks, the claim is this process's own alone, as
/// [`TAKEN`] is. A port whose file cannot be used (not a regular file: a symbolic link, a FIFO,
/// a socket; or one this user may not open) is not taken. Only a file made here is changed.
fn claim(port: u16) -> bool {
    let Some(dir) = claims_dir() else {
        return true;
    };
    let name = port.to_string();
    // A name removed or replaced between the steps of a claim (another process's test puts a
    // link or a socket there for a moment) is claimed again, from the start.
    for _ in 0..3 {
        match claim_once(dir, &name) {
            Claim::Held(file) => {
                CLAIMS.lock().unwrap_or_else(|e| e.into_inner()).push(file);
                return true;
            }
            Claim::Local => return true,
            Claim::Refused => return false,
            Claim::Again => {}
        }
    }
    false
}

/// What one try at claiming a port's file gave.
enum Claim {
    /// The file, locked: the port is this process's among all.
    Held(std::fs::File),
    /// Nowhere to claim: this process's alone.
    Local,
    /// Another process's, or not a usable file.
    Refused,
    /// Changed while it was claimed: try again.
    Again,
}

/// One try of [`claim`] at the file `name` in the claims directory `dir`.
fn claim_once(dir: &rustix::fd::OwnedFd, name: &str) -> Claim {
    use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, fchmod, flock, fstat};
    use rustix::fs::{openat, statat};
    use rustix::io::Errno;
    // Not followed if a link, not waited on if a FIFO.
    let flags = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let open = |how: OFlags| openat(dir, name, flags | how, Mode::from_raw_mode(0o644));
    let fd = match open(OFlags::RDWR | OFlags::CREATE | OFlags::EXCL) {
        Ok(fd) => {
            // Made here: readable by every user whatever the umask (a lock needs the file
            // open, not writable).
            let _ = fchmod(&fd, Mode::from_raw_mode(0o644));
            fd
        }
        // There already: opened as it is (another user's, readable only), never changed (it
        // may be a hard link to a file elsewhere).
        Err(Errno::EXIST) => match open(OFlags::RDWR).or_else(|_| open(OFlags::RDONLY)) {
            Ok(fd) => fd,
            // Removed meanwhile.
            Err(Errno::NOENT) => return Claim::Again,
            // A link, a socket, or a file this user may not open.
            Err(_) => return Claim::Refused,
        },
        // Not to be made here (a directory this user may not write to, a full or read-only
        // disk, the directory removed meanwhile): nowhere to claim.
        Err(_) => return Claim::Local,
    };
    let Ok(opened) = fstat(&fd) else {
        return Claim::Refused;
    };
    if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile {
        return Claim::Refused;
    }
    let file = std::fs::File::from(fd);
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => return Claim::Refused,
        // A file system without locks.
        Err(_) => return Claim::Local,
    }
    // The name must still be the file locked: one removed meanwhile (or a hard link taken
    // away) would leave the next process to make another file there and lock that.
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(now) if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino) => Claim::Held(file),
        _ => Claim::Again,
    }
}

/// A free loopback TCP port (and, for cluster nodes, its bus port `port + 10000` too).
///
/// It is chosen below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), from which
/// the kernel picks the port of every `bind` to port 0 and of every outgoing connection. A port
/// in that range, left free while its server is killed and before it restarts, can be handed to
/// anything meanwhile: a test's own HTTP server, a proxy, or the local end of a client's
/// connection. Below that range only an explicit `bind` takes it. (Where the range starts too
/// low to leave room, the kernel's choice is taken, as before.)
fn free_port(with_bus: bool) -> u16 {
    let (low, high) = outside_ephemeral(with_bus);
    for attempt in 0..200u64 {
        let port = if low < high {
            let span = u64::from(high - low);
            low + u16::try_from(random(attempt) % span).expect("below the span")
        } else {
            let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
                .expect("bind a loopback port");
            listener.local_addr().expect("local address").port()
        };
        // Ports handed out already are left alone, not even bound to be tried: a killed
        // server's port, bound by a try here at the moment its restart binds it, would fail
        // the restart.
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        if taken.contains(&port) || (with_bus && taken.contains(&(port + 10_000))) {
            continue;
        }
        if with_bus && port > 55_535 {
            continue;
        }
        // Another process's port is skipped, before it is bound to be tried (a killed server's,
        // bound here as its restart binds it, would fail the restart). A port claimed and then
        // found taken stays claimed, and unused, for this process's life (rare: bound by a
        // program outside this harness, or a node's port whose bus port is another's).
        if !claim(port) || (with_bus && !claim(port + 10_000)) {
            continue;
        }
        if !port_is_free(port) || (with_bus && !port_is_free(port + 10_000)) {
            continue;
        }
        taken.push(port);
        if with_bus {
            taken.push(port + 10_000);
        }
        return port;
    }
    panic!("found no free loopback port in 200 tries");
}

/// The ports `[low, high)` to choose a server's port from: from 10000 to the start of the
/// kernel's ephemeral range, less 10000 for a cluster node (its bus port, `port + 10000`, stays
/// below the range too). Empty when the range starts too low.
fn outside_ephemeral(with_bus: bool) -> (u16, u16) {
    const LOWEST: u16 = 10_000;
    let start = ephemeral_start().unwrap_or(32_768);
    let high = if with_bus {
        start.saturating_sub(10_000)
    } else {
        start
    };
    // Fewer than 1000 to choose from: take the kernel's choice instead.
    if high < LOWEST + 1_000 {
        (0, 0)
    } else {
        (LOWEST, high)
    }
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), if readable.
fn ephemeral_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A random number, different for every call (std's randomly keyed SipHash of `n`).
fn random(n: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(n)
}

/// A loopback port with nothing listening on it, that no server of this harness will be started
/// on: for a test that needs a connection refused. (A port bound and dropped by the test itself
/// could be handed to a server started meanwhile by another test of the same binary.)
pub fn closed_port() -> u16 {
    free_port(false)
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn find(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Whether `redis-server`, and the `redis-cli` the harness talks to it with, are on the `PATH`
/// (Debian's `redis-server` package brings both). Starting a server without them panics (as
/// everything in this harness does, for tests); a program that reports errors instead checks
/// this first.
pub fn redis_server_installed() -> bool {
    find("redis-server").is_some() && find("redis-cli").is_some()
}

const CLI_MISSING: &str = "redis-cli not found: run ./scripts/test.sh, which installs redis-tools";

/// `redis-cli` (the harness's one other binary), found on the `PATH`.
fn redis_cli() -> PathBuf {
    find("redis-cli").unwrap_or_else(|| panic!("{CLI_MISSING}"))
}

/// Settings for a [`RedisServer`]: extra `redis.conf` lines.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct RedisServerBuilder {
    lines: Vec<String>,
    cluster: bool,
    sentinel: bool,
}

impl RedisServerBuilder {
    /// Adds one configuration line, as in `redis.conf` (`"maxmemory 10mb"`).
    pub fn config(mut self, line: impl Into<String>) -> Self {
        self.lines.push(line.into());
        self
    }

    /// A Redis Sentinel (`redis-server --sentinel`) instead of a server, watching the primary on
    /// `primary_port` under the name `primary`: it answers `PING`, `INFO` and `HELLO`, but no
    /// data command.
    pub fn sentinel_of(mut self, primary_port: u16) -> Self {
        self.sentinel = true;
        self.config(format!(
            "sentinel monitor primary 127.0.0.1 {primary_port} 1"
        ))
    }

    /// Requires a password for the default user (`requirepass`).
    pub fn password(self, password: &str) -> Self {
        self.config(format!("requirepass {password}"))
    }

    /// Adds an ACL user with a password and full access (`user <name> on ><password> ~* &* +@all`).
    pub fn acl_user(self, user: &str, password: &str) -> Self {
        self.config(format!("user {user} on >{password} ~* &* +@all"))
    }

    /// Limits memory and refuses writes when full (`maxmemory` with `noeviction`).
    pub fn maxmemory_noeviction(self, bytes: u64) -> Self {
        self.config(format!("maxmemory {bytes}"))
            .config("maxmemory-policy noeviction")
    }

    /// Starts the server; panics (with the reason) if it cannot.
    ///
    /// The port is free when chosen, but another process may bind it before `redis-server` does
    /// (any program that asks the kernel for a free port may be given it): a server that exits
    /// because its address is in use is started again on another port, up to five times.
    pub fn start(self) -> RedisServer {
        self.try_start().unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`start`](Self::start), returning why the server did not start instead of panicking:
    /// its log (a configuration line it refused, say), or the temporary directory or files it
    /// could not make, or `redis-server` or `redis-cli` missing, or `redis-server` not runnable.
    /// It still panics if it finds no free port in 200 tries.
    pub fn try_start(self) -> Result<RedisServer, String> {
        let port = free_port(self.cluster);
        self.try_start_on(port)
    }

    /// [`start`](Self::start), trying `port` first.
    #[cfg(test)]
    fn start_on(self, port: u16) -> RedisServer {
        self.try_start_on(port)
            .unwrap_or_else(|why| panic!("{why}"))
    }

    fn try_start_on(self, port: u16) -> Result<RedisServer, String> {
        // Asked once the server runs (its readiness, its process id).
        if find("redis-cli").is_none() {
            return Err(CLI_MISSING.into());
        }
        let dir = server_dir("").map_err(|e| format!("create a temporary directory: {e}"))?;
        let mut server = RedisServer {
            port,
            dir,
            lines: self.lines,
            cluster: self.cluster,
            sentinel: self.sentinel,
            child: None,
        };
        for _ in 1..PORT_ATTEMPTS {
            match server.try_spawn() {
                Ok(()) => return Ok(server),
                Err(Exit::AddressInUse) => {
                    for file in ["redis.log", "nodes.conf"] {
                        let _ = std::fs::remove_file(server.dir.path().join(file));
                    }
                    server.port = free_port(server.cluster);
                }
                Err(Exit::Other(why)) => return Err(why),
            }
        }
        server.spawn_or_why(Ready::Serving)?;
        Ok(server)
    }
}

/// What a started server is waited for to do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ready {
    /// Answer commands.
    Serving,
    /// Answer, if only `LOADING` while it loads its data.
    Loading,
}

/// Why a server did not start.
enum Exit {
    /// It exited because its port was taken in the meantime.
    AddressInUse,
    /// Anything else, described with its log.
    Other(String),
}

/// A `redis-server` process on a free loopback port, in its own temporary directory, without
/// persistence. Dropping it kills the process.
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    lines: Vec<String>,
    cluster: bool,
    sentinel: bool,
    child: Option<Child>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .field("running", &self.child.is_some())
            .finish()
    }
}

impl RedisServer {
    /// Starts a standalone server with the default settings.
    pub fn start() -> RedisServer {
        RedisServer::builder().start()
    }

    /// Settings for a server (extra configuration lines).
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (logs are in `redis.log` there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the process on `self.port` and waits until it answers.
    fn try_spawn(&mut self) -> Result<(), Exit> {
        self.try_spawn_until(Ready::Serving)
    }

    /// Starts the process on `self.port` and waits until it is `ready`.
    fn try_spawn_until(&mut self, ready: Ready) -> Result<(), Exit> {
        let conf = self.dir.path().join("redis.conf");
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nsave \"\"\nappendonly no\n\
             daemonize no\nlogfile {dir}/redis.log\n",
            port = self.port,
            dir = self.dir.path().display()
        );
        if self.cluster {
            text.push_str(&format!(
                "cluster-enabled yes\ncluster-config-file {}/nodes.conf\ncluster-node-timeout 5000\n",
                self.dir.path().display()
            ));
        }
        for line in &self.lines {
            text.push_str(line);
            text.push('\n');
        }
        self.child = Some(spawn_server(&conf, &text, self.sentinel).map_err(Exit::Other)?);
        self.wait_ready(ready)
    }

    /// Starts the process on `self.port`; why not, if it is not `ready`.
    fn spawn_or_why(&mut self, ready: Ready) -> Result<(), String> {
        match self.try_spawn_until(ready) {
            Ok(()) => Ok(()),
            Err(Exit::AddressInUse) => Err(format!(
                "redis-server could not bind port {} (in use); log:\n{}",
                self.port,
                self.log()
            )),
            Err(Exit::Other(why)) => Err(why),
        }
    }

    fn wait_ready(&mut self, ready: Ready) -> Result<(), Exit> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                let log = self.log();
                if port_was_taken(&log) {
                    return Err(Exit::AddressInUse);
                }
                return Err(Exit::Other(format!(
                    "redis-server on port {} exited ({status}); log:\n{log}",
                    self.port
                )));
            }
            // Any reply to PING (PONG, or NOAUTH when a password is set) means a server is
            // serving (`LOADING`: loading its data, when that is what is waited for); its process
            // id says whether it is this one, not another that took the port first (a proxy or a
            // server of another test, given it by the kernel).
            if let Ok(reply) = raw_command(self.port, &["PING"])
                && (reply.starts_with("+PONG")
                    || reply.starts_with("-NOAUTH")
                    || (ready == Ready::Loading && reply.starts_with("-LOADING")))
            {
                let ours = self.child.as_ref().map(Child::id);
                match self.process_id() {
                    Some(pid) if Some(pid) == ours => return Ok(()),
                    Some(_) => {
                        if let Some(mut child) = self.child.take() {
                            let _ = child.kill();
                            let _ = child.wait();
                        }
                        return Err(Exit::AddressInUse);
                    }
                    // Not readable yet (still loading): ask again.
                    None => {}
                }
            }
            if Instant::now() > deadline {
                return Err(Exit::Other(format!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT:?}; log:\n{}",
                    self.port,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `process_id` of the server answering on this port, from `INFO server`.
    fn process_id(&self) -> Option<u32> {
        try_cli(self.port, &self.auth_args(), &["info", "server"])
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    fn log(&self) -> String {
        server_log(self.dir.path())
    }

    /// Kills the process (SIGKILL) and waits for it. The port stays reserved for [`restart`]: no
    /// server of this harness, in this process or another, is given it meanwhile (it is below
    /// the kernel's ephemeral range, so only an explicit `bind` takes it).
    ///
    /// [`restart`]: RedisServer::restart
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (there is no persistence).
    pub fn restart(&mut self) {
        self.restart_until(Ready::Serving);
    }

    /// Starts the server again on the same port, returning as soon as it answers, even if only
    /// `LOADING` (a server loading its data refuses most commands with it). For a server that
    /// was told to `SAVE` (its dump is loaded at start) and given `key-load-delay` and
    /// `loading-process-events-interval-bytes 1024` at start, so that the loading lasts and is
    /// answered during. Panics if it does not answer.
    pub fn restart_loading(&mut self) {
        self.restart_until(Ready::Loading);
    }

    fn restart_until(&mut self, ready: Ready) {
        self.kill();
        let _ = std::fs::remove_file(self.dir.path().join("nodes.conf"));
        let deadline = Instant::now() + START_TIMEOUT;
        while !port_is_free(self.port) {
            assert!(
                Instant::now() < deadline,
                "port {} still busy after kill",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(why) = self.spawn_or_why(ready) {
            panic!("{why}");
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open but nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("the server is not running");
        assert!(process::send_signal(child.id(), sig), "kill {sig} failed");
    }

    /// Runs one command through `redis-cli` against this server and returns its output, trimmed.
    /// Panics if `redis-cli` fails.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, &self.auth_args(), args)
    }

    /// As [`cli`](Self::cli), with `password` in place of the one the server was started with:
    /// for one a test set since (`CONFIG SET requirepass`).
    pub fn cli_with_password(&self, password: &str, args: &[&str]) -> String {
        let auth = ["--no-auth-warning", "-a", password].map(str::to_owned);
        cli(self.port, &auth, args)
    }

    /// Waits (up to 10 s) until this master has at least one replica and every replica is online
    /// (done with its initial sync) and has acknowledged everything the master has written so
    /// far: each `slaveN` line of `INFO replication` says `state=online` and its offset reaches
    /// `master_repl_offset` (a replica still syncing shows offset 0, which an empty master's
    /// offset of 0 would not tell apart). (`WAIT` sent through redis-cli would only
    /// count the writes of redis-cli's own connection: none.) Replicas acknowledge about once a
    /// second. Panics on timeout.
    pub fn wait_replicated(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = self.cli(&["info", "replication"]);
            let written: Option<u64> = info
                .lines()
                .find_map(|l| l.strip_prefix("master_repl_offset:")?.trim().parse().ok());
            // `slave0:ip=...,port=...,state=online,offset=<acknowledged>,lag=...`
            let replicas: Vec<&str> = info.lines().filter(|l| l.starts_with("slave")).collect();
            let acked = |l: &str| -> Option<u64> {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix("offset=")?.trim().parse().ok())
            };
            if let Some(w) = written
                && !replicas.is_empty()
                && replicas
                    .iter()
                    .all(|l| l.contains("state=online") && acked(l).is_some_and(|a| a >= w))
            {
                return;
            }
            assert!(Instant::now() < deadline, "replicas not in sync: {info}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Script calls (`EVAL`, `EVALSHA` and their read-only forms) this server has run since its
    /// statistics were last reset, from `INFO commandstats`.
    pub fn script_calls(&self) -> u64 {
        script_calls(&self.cli(&["INFO", "commandstats"]))
    }

    fn auth_args(&self) -> Vec<String> {
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix("requirepass "))
            .map(|p| {
                vec![
                    "--no-auth-warning".to_owned(),
                    "-a".to_owned(),
                    p.to_owned(),
                ]
            })
            .unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The script calls (`EVAL`, `EVALSHA` and their read-only forms) counted in the text of an
/// `INFO commandstats` reply.
pub fn script_calls(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .filter(|l| {
            [
                "cmdstat_evalsha:",
                "cmdstat_eval:",
                "cmdstat_evalsha_ro:",
                "cmdstat_eval_ro:",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Runs `redis-cli -p <port> <args>` and returns stdout, trimmed.
fn cli(port: u16, auth: &[String], args: &[&str]) -> String {
    try_cli(port, auth, args).unwrap_or_else(|e| panic!("redis-cli {args:?} failed: {e}"))
}

/// How long a `redis-cli` call may take (`--cluster create` included) before it is killed: a
/// server that accepts connections but never answers (paused, or a port taken by another
/// process) fails the call instead of hanging the test.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// `command`'s output, as `Command::output` gives it, unless it runs longer than `timeout`: then
/// it is killed, and the error says so.
fn output_within(command: &mut Command, timeout: Duration) -> Result<Output, String> {
    use std::io::Read;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Read on threads of their own, so that a long output never fills a pipe and stalls it.
    fn read_all<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let status = process::wait_exit(&mut child, timeout)
        .ok_or_else(|| format!("no answer within {timeout:?} (killed)"))?;
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// [`cli`], or why `redis-cli` could not run or failed (its stderr, then its stdout). `options`
/// come before `args`: the credentials, or the TLS settings.
fn try_cli(port: u16, options: &[String], args: &[&str]) -> Result<String, String> {
    let out = output_within(
        Command::new(redis_cli())
            .arg("-h")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(port.to_string())
            .args(options)
            .args(args),
        CLI_TIMEOUT,
    )?;
    if !out.status.success() {
        // Both: `--cluster create` says why it failed on its standard output.
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Sends one inline command over a fresh TCP connection and returns the first reply line.
fn raw_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line)?;
    Ok(line)
}

/// A Redis Cluster of real `redis-server` processes, all masters, created with
/// `redis-cli --cluster create`. Dropping it kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// How many masters every node must know.
    masters: usize,
    /// How many replicas every master must have in sync.
    replicas: usize,
}

impl RedisCluster {
    /// Starts `masters` cluster-enabled servers (at least 3) and joins them into one cluster with
    /// no replicas, then waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        RedisCluster::start_with_replicas(masters, 0, &[])
    }

    /// Starts a cluster of `masters` masters with `replicas` replicas each, every node with the
    /// extra configuration `lines` (`"cluster-node-timeout 1000"` for a quicker failover), and
    /// waits until every node reports `cluster_state:ok` and knows every master.
    pub fn start_with_replicas(masters: usize, replicas: usize, lines: &[&str]) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let mut builder = RedisServerBuilder {
                    cluster: true,
                    ..RedisServerBuilder::default()
                };
                for line in lines {
                    builder = builder.config(*line);
                }
                builder.start()
            })
            .collect();
        let args = cluster_create_args(nodes.iter().map(|n| n.port), replicas);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // With `requirepass` among `lines` (and `masterauth`, for replicas), redis-cli needs it.
        cli(nodes[0].port, &nodes[0].auth_args(), &args);
        let cluster = RedisCluster {
            nodes,
            masters,
            replicas,
        };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let all_ok = self.nodes.iter().all(|n| {
                let info = n.cli(&["cluster", "info"]);
                // Every node must also know every slot's owner.
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            let all_know = all_ok
                && self.nodes.iter().all(|n| {
                    n.cli(&["cluster", "nodes"])
                        .lines()
                        .filter(|l| l.contains("master") && !l.contains("fail"))
                        .count()
                        == self.masters
                });
            // Every master has its replicas connected and in sync.
            let all_synced = all_know
                && self.nodes.iter().all(|n| {
                    let info = n.cli(&["info", "replication"]);
                    !info.contains("role:master")
                        || info.matches("state=online").count() >= self.replicas
                });
            if all_synced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts one more cluster-enabled server and joins it (`CLUSTER MEET`) as a master that owns
    /// no slot, as an operator adds a node before moving slots to it; waits until every node
    /// knows it. Returns the new node.
    pub fn add_empty_master(&mut self) -> &RedisServer {
        let node = RedisServerBuilder {
            cluster: true,
            ..RedisServerBuilder::default()
        }
        .start();
        let port = node.port.to_string();
        assert_eq!(
            self.nodes[0].cli(&["cluster", "meet", "127.0.0.1", &port]),
            "OK"
        );
        self.nodes.push(node);
        self.masters += 1;
        self.wait_ok();
        self.nodes.last().expect("just pushed")
    }

    /// Kills the node on `port` (SIGKILL) and forgets it: [`nodes`](RedisCluster::nodes) and
    /// [`node_for`](RedisCluster::node_for) see only the nodes left.
    pub fn kill_node(&mut self, port: u16) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster");
        self.nodes.remove(i).kill();
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes (all masters).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node that owns `key`'s slot (asks the first node with `CLUSTER KEYSLOT` and
    /// `CLUSTER SLOTS`).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot: u16 = self.nodes[0]
            .cli(&["cluster", "keyslot", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        self.nodes
            .iter()
            .find(|node| self.slots_of(node).iter().any(|r| r.contains(&slot)))
            .unwrap_or_else(|| panic!("no node owns slot {slot}"))
    }

    /// The ranges of hash slots `node` serves, as it says itself (`CLUSTER NODES`).
    pub fn slots_of(&self, node: &RedisServer) -> Vec<std::ops::RangeInclusive<u16>> {
        own_slots(&node.cli(&["cluster", "nodes"]))
    }
}

/// `redis-cli`'s arguments to make a cluster of the nodes on `ports` (loopback), with `replicas`
/// replicas per master.
fn cluster_create_args(ports: impl Iterator<Item = u16>, replicas: usize) -> Vec<String> {
    let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
    args.extend(ports.map(|p| format!("127.0.0.1:{p}")));
    args.extend([
        "--cluster-replicas".to_owned(),
        replicas.to_string(),
        "--cluster-yes".to_owned(),
    ]);
    args
}

/// The ranges of hash slots of the node that answered `CLUSTER NODES` with `nodes` (its
/// `myself` line).
fn own_slots(nodes: &str) -> Vec<std::ops::RangeInclusive<u16>> {
    let me = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("CLUSTER NODES lists myself");
    me.split_whitespace()
        .skip(8)
        .filter_map(|range| {
            let (lo, hi) = match range.split_once('-') {
                Some((a, b)) => (a.parse::<u16>(), b.parse::<u16>()),
                None => (range.parse::<u16>(), range.parse::<u16>()),
            };
            Some(lo.ok()?..=hi.ok()?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a test of claims can run here: not where [`CLAIMS_DIR`] is, as documented, not to
    /// be trusted (another user's, or not a directory) or not to be written to by this user (a
    /// directory root made 0755). Anywhere else (a fresh machine, as root or not) the claims
    /// directory must be there to claim in.
    fn claims_can_be_made() -> bool {
        use std::os::unix::fs::MetadataExt;
        claims_dir();
        let euid = rustix::process::geteuid().as_raw();
        let usable = std::fs::symlink_metadata(CLAIMS_DIR)
            .is_ok_and(|m| m.is_dir() && (m.uid() == 0 || m.uid() == euid))
            && rustix::fs::access(CLAIMS_DIR, rustix::fs::Access::WRITE_OK).is_ok();
        if usable {
            assert!(
                claims_dir().is_some(),
                "{CLAIMS_DIR} is usable, and not opened"
            );
        } else {
            eprintln!("skipped: {CLAIMS_DIR} is another user's, or not writable by this one");
        }
        usable
    }

    /// A server whose process ended without stopping it (killed by a signal, which runs no
    /// `Drop`) is killed by the next process's first start; one of a process that runs is not.
    #[test]
    fn a_server_left_by_an_ended_process_is_killed_and_one_of_a_running_process_is_not() {
        // Started first: the first server of a process sweeps, which would find the orphan below.
        let kept = RedisServer::start();
        // The owner runs until its server answers: another process's first server, started
        // meanwhile, would otherwise find the orphan first.
        let mut ended = Command::new("sleep").arg("30").spawn().unwrap();
        let owner = process::identity(ended.id()).expect("a running process's identity");
        let dir = tempfile::Builder::new()
            .prefix(&format!("redis-harness-{}{owner}-", process::OWNER_TAG))
            .tempdir()
            .unwrap();
        let port = free_port(false);
        let conf = format!(
            "port {port}\nbind 127.0.0.1\nsave \"\"\ndir {}\nlogfile {}/redis.log\n",
            dir.path().display(),
            dir.path().display()
        );
        // Stopped however the test ends (a failed assertion must not leave it running).
        struct Stopped(Child);
        impl Drop for Stopped {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut orphan =
            Stopped(spawn_server(&dir.path().join("redis.conf"), &conf, false).unwrap());
        let deadline = Instant::now() + START_TIMEOUT;
        while raw_command(port, &["PING"]).is_err() {
            assert!(Instant::now() < deadline, "the orphan never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        ended.kill().unwrap();
        ended.wait().unwrap();

        let killed = process::kill_orphans();
        // (Or by another process's first server, in the instant since its owner ended.)
        assert!(
            killed.contains(&orphan.0.id()) || !process::running(orphan.0.id()),
            "{killed:?}"
        );
        assert!(!killed.contains(&kept.child.as_ref().unwrap().id()));
        let status = process::wait_exit(&mut orphan.0, Duration::from_secs(5)).expect("killed");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        assert_eq!(kept.cli(&["ping"]), "PONG");
    }

    /// Runs `check` on a port no process has a file for, with what `make` made in the file's
    /// place (a link, a socket), removed after however `check` ends.
    fn in_a_free_ports_place<T>(
        make: impl Fn(&Path) -> std::io::Result<T>,
        check: impl FnOnce(u16, T),
    ) {
        struct Removed(PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        for attempt in 0..100 {
            let port = 10_000 + u16::try_from(random(attempt) % 20_000).unwrap();
            let path = Path::new(CLAIMS_DIR).join(port.to_string());
            // Made only where nothing is (no port of another process's).
            let Ok(made) = make(&path) else {
                continue;
            };
            let _removed = Removed(path);
            check(port, made);
            return;
        }
        panic!("no port without a lock file in 100 picks");
    }

    /// A symbolic link in a port's place (another user's, aimed at a file elsewhere) is not
    /// followed: nothing is made where it points, and that port is not taken.
    #[test]
    fn a_symbolic_link_in_a_ports_place_is_not_followed() {
        if !claims_can_be_made() {
            return;
        }
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("made");
        in_a_free_ports_place(
            |path| std::os::unix::fs::symlink(&target, path),
            |port, ()| {
                assert!(!claim(port), "port {port} claimed through a symbolic link");
                assert!(!target.exists(), "a file made where the link points");
            },
        );
    }

    /// A socket in a port's place is not taken.
    #[test]
    fn a_socket_in_a_ports_place_is_not_taken() {
        if !claims_can_be_made() {
            return;
        }
        in_a_free_ports_place(
            |path| std::os::unix::net::UnixListener::bind(path),
            |port, _socket| {
                assert!(
                    !claim(port),
                    "port {port} claimed with a socket in its place"
                );
            },
        );
    }

    /// A hard link in a port's place (to a file elsewhere) is opened as it is, its file's mode
    /// left alone.
    #[test]
    fn a_hard_link_in_a_ports_place_is_not_changed() {
        use rustix::fs::{FlockOperation, flock};
        use std::os::unix::fs::PermissionsExt;
        if !claims_can_be_made() {
            return;
        }
        let elsewhere = tempfile::tempdir_in("/tmp").unwrap();
        let outside = elsewhere.path().join("outside");
        std::fs::write(&outside, "").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Held here while it is linked: no process claims the port through the link (and keeps
        // it claimed after the link is gone, when another would claim a new file there).
        let held = std::fs::File::open(&outside).unwrap();
        flock(&held, FlockOperation::NonBlockingLockExclusive).unwrap();
        in_a_free_ports_place(
            |path| std::fs::hard_link(&outside, path),
            |port, ()| {
                assert!(!claim(port), "port {port} claimed while its file is held");
                let mode = std::fs::metadata(&outside).unwrap().permissions().mode();
                assert_eq!(
                    mode & 0o777,
                    0o600,
                    "port {port}: the linked file's mode changed"
                );
            },
        );
    }

    /// A port this harness hands out is locked against every other process of it: its lock
    /// file, opened again (as another process opens it), cannot be locked.
    #[test]
    fn a_port_handed_out_is_claimed_against_other_processes() {
        use rustix::fs::{FlockOperation, flock};
        if !claims_can_be_made() {
            return;
        }
        let port = closed_port();
        let again = std::fs::File::open(Path::new(CLAIMS_DIR).join(port.to_string()))
            .expect("the port's lock file");
        assert_eq!(
            flock(&again, FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK)
        );
    }

    /// A port another process holds (here `flock(1)`, as another test binary's harness holds
    /// its servers' ports, killed or not) is not this process's until that process ends.
    #[test]
    fn a_port_another_process_holds_is_not_claimed_until_it_ends() {
        if !claims_can_be_made() {
            return;
        }
        let (low, high) = outside_ephemeral(false);
        let (low, high) = if low < high {
            (low, high)
        } else {
            (20_000, 30_000)
        };
        for attempt in 0..100 {
            let port = low + u16::try_from(random(attempt) % u64::from(high - low)).unwrap();
            if TAKEN.lock().unwrap().contains(&port) {
                continue;
            }
            let path = Path::new(CLAIMS_DIR).join(port.to_string());
            let mut holder = Command::new("flock")
                .arg("-n")
                .arg(&path)
                .args(["-c", "echo held; cat >/dev/null"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("run flock(1), of util-linux");
            let mut said = String::new();
            BufReader::new(holder.stdout.take().unwrap())
                .read_line(&mut said)
                .unwrap();
            if said.trim() != "held" {
                // Held already (by another process, or by this one): try another port.
                holder.wait().unwrap();
                continue;
            }
            assert!(
                !claim(port),
                "port {port} claimed while another process holds it"
            );
            drop(holder.stdin.take());
            assert!(holder.wait().unwrap().success());
            assert!(
                claim(port),
                "port {port} not claimed after its holder ended"
            );
            return;
        }
        panic!("no port to try in 100 picks");
    }

    #[test]
    fn script_calls_are_summed_from_commandstats() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=300,usec_per_call=2.50,\
                    rejected_calls=0,failed_calls=1\r\ncmdstat_eval:calls=3,usec=9\r\n\
                    cmdstat_info:calls=7,usec=1\r\n";
        assert_eq!(script_calls(info), 123);
        assert_eq!(script_calls(""), 0);
    }

    #[test]
    fn standalone_starts_answers_and_stops() {
        let mut s = RedisServer::start();
        assert_eq!(s.cli(&["ping"]), "PONG");
        assert_eq!(s.cli(&["set", "k", "v"]), "OK");
        assert_eq!(s.cli(&["get", "k"]), "v");
        assert_eq!(s.cli(&["config", "get", "save"]), "save");
        let port = s.port();
        s.restart();
        assert_eq!(s.port(), port);
        assert_eq!(s.cli(&["get", "k"]), "", "a restarted server is empty");
        s.kill();
        assert!(raw_command(port, &["PING"]).is_err());
    }

    #[test]
    fn password_and_extra_config() {
        let s = RedisServer::builder()
            .password("s3cret")
            .maxmemory_noeviction(10 * 1024 * 1024)
            .start();
        assert_eq!(s.cli(&["ping"]), "PONG");
        assert_eq!(
            s.cli(&["config", "get", "maxmemory-policy"]),
            "maxmemory-policy\nnoeviction"
        );
        let raw = raw_command(s.port(), &["PING"]).unwrap();
        assert!(raw.starts_with("-NOAUTH"), "{raw}");
    }

    #[test]
    fn a_command_is_cut_at_its_timeout_and_its_output_read_whole() {
        let started = Instant::now();
        let err = output_within(
            Command::new("sh").args(["-c", "sleep 5"]),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(err.contains("no answer within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(4));
        // More than a pipe holds (64 KiB), on both streams: read while it runs, not after.
        let out = output_within(
            Command::new("sh").args([
                "-c",
                "head -c 200000 /dev/zero; head -c 100000 /dev/zero >&2",
            ]),
            Duration::from_secs(20),
        )
        .unwrap();
        assert!(out.status.success());
        assert_eq!((out.stdout.len(), out.stderr.len()), (200_000, 100_000));
    }

    /// A configuration error is written to stderr before the log file is opened: the panic
    /// says what it was.
    #[test]
    fn a_bad_configuration_line_is_named_in_the_panic() {
        let started = std::panic::catch_unwind(|| {
            RedisServer::builder().config("no-such-directive 1").start()
        });
        let panic = started.expect_err("a server with a bad configuration line does not start");
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        assert!(why.contains("no-such-directive"), "{why}");
    }

    #[test]
    fn pause_freezes_and_resume_thaws() {
        let s = RedisServer::start();
        s.pause();
        assert!(raw_command(s.port(), &["PING"]).is_err());
        s.resume();
        assert!(
            raw_command(s.port(), &["PING"])
                .unwrap()
                .starts_with("+PONG")
        );
    }

    #[test]
    fn cluster_of_three_masters() {
        let c = RedisCluster::start(3);
        assert_eq!(c.urls().len(), 3);
        for n in c.nodes() {
            assert!(n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
        }
        let owners: std::collections::HashSet<u16> = (0..50)
            .map(|i| c.node_for(&format!("key{i}")).port())
            .collect();
        assert_eq!(owners.len(), 3, "50 keys land on all three masters");
    }

    /// A killed server's port stays free for its restart: it lies below the kernel's ephemeral
    /// range, from which every `bind` to port 0 (an HTTP server started meanwhile) and every
    /// outgoing connection's local end is given a port.
    #[test]
    fn a_killed_servers_port_is_not_one_the_kernel_hands_out() {
        let ephemeral_start = ephemeral_start().expect("the kernel's ephemeral range");
        let mut s = RedisServer::start();
        s.kill();
        assert!(
            s.port() < ephemeral_start,
            "port {} is in the kernel's ephemeral range, from {ephemeral_start}",
            s.port()
        );
        let node = free_port(true);
        assert!(
            node + 10_000 < ephemeral_start,
            "bus port {}",
            node + 10_000
        );
        s.restart();
        assert_eq!(s.cli(&["ping"]), "PONG");
    }

    #[test]
    fn a_port_another_server_answers_on_is_replaced() {
        let other = RedisServer::start();
        let s = RedisServer::builder().start_on(other.port());
        assert_ne!(s.port(), other.port());
        assert_eq!(s.process_id(), s.child.as_ref().map(Child::id));
        assert_ne!(other.process_id(), s.process_id());
    }

    #[test]
    fn a_port_taken_before_the_server_binds_it_is_replaced() {
        let holder = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let taken = holder.local_addr().unwrap().port();
        let s = RedisServer::builder().start_on(taken);
        assert_ne!(s.port(), taken);
        assert_eq!(s.cli(&["ping"]), "PONG");
        drop(holder);
    }
}
