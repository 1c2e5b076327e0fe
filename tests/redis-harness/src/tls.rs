//! A `redis-server` that speaks only TLS, with a certificate authority made for the test.
//!
//! ```no_run
//! use redis_harness::tls::TlsRedisServer;
//!
//! let server = TlsRedisServer::start();
//! println!("{}", server.url()); // rediss://127.0.0.1:<port>
//! let ca_pem: Vec<u8> = server.ca_pem(); // trust this to verify the server
//! assert_eq!(server.cli(&["ping"]), "PONG");
//! ```
//!
//! The CA and the server certificate (valid for `127.0.0.1` and `localhost`, for two days) are
//! made with the `openssl` command-line tool in a temporary directory, with a client certificate
//! from the same CA. The server listens on its TLS port only (`port 0`) and does not ask clients
//! for a certificate (`tls-auth-clients no`), unless started with
//! [`TlsRedisServer::start_requiring_client_certificates`] (`tls-auth-clients yes`, Redis's own
//! default).
//!
//! [`TlsRedisCluster`] is a Redis Cluster of such servers, sharing one CA and certificate, whose
//! nodes talk to each other over TLS too (`tls-cluster yes`) and announce their TLS ports.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS-only `redis-server` on a free loopback port, with its own CA. Dropping it kills the
/// process.
pub struct TlsRedisServer {
    port: u16,
    dir: TempDir,
    /// Where the CA and the server certificate are (shared by a cluster's nodes).
    certs: Arc<TempDir>,
    cluster: bool,
    /// `tls-auth-clients yes`: a client must present a certificate from the CA.
    client_certificates: bool,
    child: Option<Child>,
}

impl fmt::Debug for TlsRedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsRedisServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .field("cluster", &self.cluster)
            .field("client_certificates", &self.client_certificates)
            .finish()
    }
}

/// Runs `openssl` with `args` in `dir`; panics, with its stderr, if it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run openssl ({e}): install it with `apt-get install openssl`"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory with a new CA and a server certificate (see [`make_certificates`]).
fn certificates() -> TempDir {
    let certs = tempfile::Builder::new()
        .prefix("redis-harness-certs-")
        .tempdir()
        .expect("create a temporary directory");
    make_certificates(certs.path());
    certs
}

/// Writes into `dir` a CA (`ca.crt`, `ca.key`), a server certificate (`server.crt`,
/// `server.key`) and a client certificate (`client.crt`, `client.key`), all with P-256 keys, the
/// keys in PKCS#8 (which native-tls needs for a client identity). The server certificate is a
/// client certificate as well: a cluster's nodes present it to each other on the cluster bus, and
/// refuse a peer whose certificate is not for client authentication.
fn make_certificates(dir: &Path) {
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(EC_KEY);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=ratelimit test CA",
    ]);
    openssl(dir, &ca);
    make_leaf(
        dir,
        "server",
        "/CN=localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
    );
    make_leaf(
        dir,
        "client",
        "/CN=ratelimit test client",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    );
}

/// A new P-256 key, for `openssl req`.
const EC_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// Writes `<name>.key` and `<name>.crt`, signed by the CA in `dir`, for `subject` with the
/// extensions `ext` (an OpenSSL extension file's text).
fn make_leaf(dir: &Path, name: &str, subject: &str, ext: &str) {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    let mut req = vec!["req", "-new", "-nodes"];
    req.extend(EC_KEY);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
    openssl(dir, &req);
    std::fs::write(dir.join(&extfile), ext).expect("write the extension file");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &extfile,
        ],
    );
}

impl TlsRedisServer {
    /// Makes a CA and a server certificate, then starts the server; panics (with the reason) if
    /// it cannot. A port taken by another process between its choice and the server's bind
    /// (tests start servers and proxies in parallel) is given up for another.
    pub fn start() -> TlsRedisServer {
        // The certificates first: `openssl` takes a while, and a port chosen before it would
        // stay free but unbound all that time.
        TlsRedisServer::start_with(Arc::new(certificates()), false, false)
    }

    /// [`start`](Self::start), with a server that accepts only clients presenting a certificate
    /// from its CA (`tls-auth-clients yes`), such as [`client_cert_pem`](Self::client_cert_pem).
    pub fn start_requiring_client_certificates() -> TlsRedisServer {
        TlsRedisServer::start_with(Arc::new(certificates()), false, true)
    }

    /// Starts a server with the certificates of `certs`, cluster-enabled (over TLS) if `cluster`,
    /// asking clients for a certificate if `client_certificates`.
    fn start_with(certs: Arc<TempDir>, cluster: bool, client_certificates: bool) -> TlsRedisServer {
        let dir = crate::server_dir("tls-").expect("create a temporary directory");
        let mut server = TlsRedisServer {
            port: 0,
            dir,
            certs,
            cluster,
            client_certificates,
            child: None,
        };
        for _ in 0..crate::PORT_ATTEMPTS {
            // A cluster node also listens on its port + 10,000 (the cluster bus).
            server.port = crate::free_port(cluster);
            let d = server.dir.path().display();
            let c = server.certs.path().display();
            let mut conf = format!(
                "port 0\ntls-port {}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\nsave \"\"\n\
                 appendonly no\ndaemonize no\nlogfile {d}/redis.log\ntls-cert-file {c}/server.crt\n\
                 tls-key-file {c}/server.key\ntls-ca-cert-file {c}/ca.crt\ntls-auth-clients {}\n",
                server.port,
                if client_certificates { "yes" } else { "no" },
            );
            if cluster {
                conf.push_str(&format!(
                    "cluster-enabled yes\ncluster-config-file {d}/nodes.conf\n\
                     cluster-node-timeout 5000\ntls-cluster yes\n"
                ));
            }
            // A fresh log (and node table) for each attempt, so that an earlier attempt's bind
            // error is not read as this one's.
            for file in ["redis.log", "nodes.conf"] {
                let _ = std::fs::remove_file(server.dir.path().join(file));
            }
            server.child = Some(
                crate::spawn_server(&server.dir.path().join("redis.conf"), &conf, false)
                    .unwrap_or_else(|why| panic!("{why}")),
            );
            if server.wait_ready() {
                return server;
            }
        }
        panic!(
            "TLS redis-server: every port tried ({}) was taken",
            crate::PORT_ATTEMPTS
        );
    }

    /// Waits for the server to answer `PING`: `true` once it does, `false` if it exited because
    /// its port was taken; panics on any other failure.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.try_cli(&["ping"]).as_deref() == Some("PONG") {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = self.log();
                if crate::port_was_taken(&log) {
                    self.child = None;
                    return false;
                }
                panic!(
                    "TLS redis-server on port {} exited ({status}); log:\n{log}",
                    self.port
                );
            }
            assert!(
                Instant::now() < deadline,
                "TLS redis-server on port {} did not answer PING within {START_TIMEOUT:?}; log:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        crate::server_log(self.dir.path())
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The TLS port (the server has no plain-text port).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path of the CA certificate (PEM) that signed the server's certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.certs.path().join("ca.crt")
    }

    /// The CA certificate (PEM) that signed the server's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca_path()).expect("read ca.crt")
    }

    /// The path of a client certificate (PEM) from the server's CA, for client authentication.
    pub fn client_cert_path(&self) -> PathBuf {
        self.certs.path().join("client.crt")
    }

    /// The path of the client certificate's private key (PKCS#8 PEM).
    pub fn client_key_path(&self) -> PathBuf {
        self.certs.path().join("client.key")
    }

    /// A client certificate (PEM) from the server's CA.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        std::fs::read(self.client_cert_path()).expect("read client.crt")
    }

    /// The client certificate's private key (PKCS#8 PEM).
    pub fn client_key_pem(&self) -> Vec<u8> {
        std::fs::read(self.client_key_path()).expect("read client.key")
    }

    /// Runs one command through `redis-cli --tls`, verifying the server against the test's CA,
    /// and returns its output, trimmed. Panics if `redis-cli` fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.run_cli(args)
            .unwrap_or_else(|e| panic!("redis-cli --tls {args:?} failed: {e}"))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        self.run_cli(args).ok()
    }

    /// The output of `redis-cli --tls` with `args`, trimmed, or why it failed.
    fn run_cli(&self, args: &[&str]) -> Result<String, String> {
        let path = |p: PathBuf| p.display().to_string();
        let tls = [
            "--tls".to_owned(),
            "--cacert".to_owned(),
            path(self.ca_path()),
            // Presented whether or not the server asks for it.
            "--cert".to_owned(),
            path(self.client_cert_path()),
            "--key".to_owned(),
            path(self.client_key_path()),
        ];
        crate::try_cli(self.port, &tls, args)
    }
}

/// A Redis Cluster of TLS-only servers on free loopback ports: one CA and one certificate for
/// every node, the cluster bus over TLS as well (`tls-cluster yes`), so that the nodes announce
/// their TLS ports in the slot map. Dropping it kills every node.
///
/// ```no_run
/// use redis_harness::tls::TlsRedisCluster;
///
/// let cluster = TlsRedisCluster::start(3);
/// let urls: Vec<String> = cluster.urls(); // rediss://127.0.0.1:<port>, one per node
/// let ca_pem: Vec<u8> = cluster.ca_pem(); // trust this to verify every node
/// assert!(cluster.nodes()[0].cli(&["cluster", "info"]).contains("cluster_state:ok"));
/// ```
#[derive(Debug)]
pub struct TlsRedisCluster {
    nodes: Vec<TlsRedisServer>,
}

impl TlsRedisCluster {
    /// Starts `masters` nodes (at least 3), joins them into one cluster with no replicas (slots
    /// shared evenly, by `redis-cli --cluster create` over TLS), and waits until every node
    /// reports `cluster_state:ok`, owns its slots and knows every master. Panics if it cannot.
    pub fn start(masters: usize) -> TlsRedisCluster {
        TlsRedisCluster::start_with(masters, false)
    }

    /// [`start`](Self::start), with nodes that accept only clients presenting a certificate from
    /// their CA (`tls-auth-clients yes`), such as [`client_cert_pem`](Self::client_cert_pem).
    pub fn start_requiring_client_certificates(masters: usize) -> TlsRedisCluster {
        TlsRedisCluster::start_with(masters, true)
    }

    fn start_with(masters: usize, client_certificates: bool) -> TlsRedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let certs = Arc::new(certificates());
        let nodes: Vec<TlsRedisServer> = (0..masters)
            .map(|_| TlsRedisServer::start_with(Arc::clone(&certs), true, client_certificates))
            .collect();
        let args = crate::cluster_create_args(nodes.iter().map(|n| n.port), 0);
        nodes[0].cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let cluster = TlsRedisCluster { nodes };
        cluster.wait_ok(masters);
        cluster
    }

    fn wait_ok(&self, masters: usize) {
        let deadline = Instant::now() + crate::CLUSTER_TIMEOUT;
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.try_cli(&["cluster", "info"]).is_some_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                }) && n.try_cli(&["cluster", "nodes"]).is_some_and(|nodes| {
                    nodes
                        .lines()
                        .filter(|l| l.contains("master") && !l.contains("fail"))
                        .count()
                        == masters
                })
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the TLS cluster did not reach cluster_state:ok within {:?}",
                crate::CLUSTER_TIMEOUT
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `rediss://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TlsRedisServer::url).collect()
    }

    /// The nodes, in the order they were started.
    pub fn nodes(&self) -> &[TlsRedisServer] {
        &self.nodes
    }

    /// The CA certificate (PEM) that signed every node's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.nodes[0].ca_pem()
    }

    /// A client certificate (PEM) from the nodes' CA.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.nodes[0].client_cert_pem()
    }

    /// The client certificate's private key (PKCS#8 PEM).
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.nodes[0].client_key_pem()
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;

    #[test]
    fn answers_over_tls_only() {
        let s = TlsRedisServer::start();
        assert_eq!(s.cli(&["ping"]), "PONG");
        assert_eq!(s.cli(&["config", "get", "port"]), "port\n0");
        assert!(
            std::str::from_utf8(&s.ca_pem())
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        // A plain-text PING on the TLS port gets no PONG.
        let mut plain = TcpStream::connect(("127.0.0.1", s.port())).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let _ = plain.write_all(b"*1\r\n$4\r\nPING\r\n");
        let mut line = String::new();
        let _ = BufReader::new(&mut plain).read_line(&mut line);
        assert!(!line.starts_with("+PONG"), "{line:?}");
    }

    /// With `tls-auth-clients yes`, the harness's own `redis-cli` (which presents the client
    /// certificate) is served, and one without a certificate is not.
    #[test]
    fn a_server_requiring_client_certificates_refuses_a_client_without_one() {
        let s = TlsRedisServer::start_requiring_client_certificates();
        assert_eq!(s.cli(&["ping"]), "PONG");
        let out = crate::output_within(
            Command::new(crate::redis_cli())
                .args(["--tls", "--cacert"])
                .arg(s.ca_path())
                .args(["-h", "127.0.0.1", "-p", &s.port().to_string(), "ping"]),
            crate::CLI_TIMEOUT,
        )
        .unwrap();
        assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "PONG");
        assert!(
            std::str::from_utf8(&s.client_key_pem())
                .unwrap()
                .contains("BEGIN PRIVATE KEY"),
            "the client key is PKCS#8"
        );
    }

    #[test]
    fn a_cluster_over_tls_announces_its_tls_ports() {
        let c = TlsRedisCluster::start(3);
        let ports: Vec<String> = c.nodes().iter().map(|n| n.port().to_string()).collect();
        // Every node serves a share of the slots and names the others by their TLS ports.
        let table = c.nodes()[1].cli(&["cluster", "nodes"]);
        for port in &ports {
            assert!(table.contains(&format!("127.0.0.1:{port}@")), "{table}");
        }
        for n in c.nodes() {
            assert!(!crate::own_slots(&n.cli(&["cluster", "nodes"])).is_empty());
        }
    }
}
