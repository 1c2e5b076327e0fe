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
//! made with the `openssl` command-line tool in the server's temporary directory. The server
//! listens on its TLS port only (`port 0`) and does not ask clients for a certificate
//! (`tls-auth-clients no`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS-only `redis-server` on a free loopback port, with its own CA. Dropping it kills the
/// process.
pub struct TlsRedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl fmt::Debug for TlsRedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsRedisServer")
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
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

/// Writes `ca.crt`, `ca.key`, `server.crt` and `server.key` (P-256 keys) into `dir`.
fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=ratelimit test CA",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-new", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.crt",
            "-extfile",
            "server.ext",
        ],
    );
}

impl TlsRedisServer {
    /// Makes a CA and a server certificate, then starts the server; panics (with the reason) if
    /// it cannot. A port taken by another process between its choice and the server's bind
    /// (tests start servers and proxies in parallel) is given up for another.
    pub fn start() -> TlsRedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redis-harness-tls-")
            .tempdir()
            .expect("create a temporary directory");
        // The certificates first: `openssl` takes a while, and a port chosen before it would
        // stay free but unbound all that time.
        make_certificates(dir.path());
        let mut server = TlsRedisServer {
            port: 0,
            dir,
            child: None,
        };
        for _ in 0..crate::PORT_ATTEMPTS {
            server.port = crate::free_port(false);
            let d = server.dir.path().display();
            let conf = format!(
                "port 0\ntls-port {}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\nsave \"\"\n\
                 appendonly no\ndaemonize no\nlogfile {d}/redis.log\ntls-cert-file {d}/server.crt\n\
                 tls-key-file {d}/server.key\ntls-ca-cert-file {d}/ca.crt\ntls-auth-clients no\n",
                server.port
            );
            // A fresh log for each attempt, so that an earlier attempt's bind error is not read
            // as this one's.
            let _ = std::fs::remove_file(server.dir.path().join("redis.log"));
            server.child = Some(crate::spawn_server(
                &server.dir.path().join("redis.conf"),
                &conf,
            ));
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
        self.dir.path().join("ca.crt")
    }

    /// The CA certificate (PEM) that signed the server's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca_path()).expect("read ca.crt")
    }

    /// Runs one command through `redis-cli --tls`, verifying the server against the test's CA,
    /// and returns its output, trimmed. Panics if `redis-cli` fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli --tls {args:?} failed"))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = crate::output_within(
            Command::new(crate::binary("redis-cli"))
                .arg("--tls")
                .arg("--cacert")
                .arg(self.ca_path())
                .arg("-h")
                .arg("127.0.0.1")
                .arg("-p")
                .arg(self.port.to_string())
                .args(args),
            crate::CLI_TIMEOUT,
        )
        .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
}
