//! The gateway process: SIGTERM stops it, even with a client stalled in the middle of a request,
//! within `shutdown_timeout_ms` (a graceful shutdown waits for requests in flight, and a request
//! whose head never ends would otherwise hold it until the orchestrator's SIGKILL).
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_harness::process;

/// How long the test waits for the process to exit: far more than the configured 300 ms, far
/// less than the 30 s default or forever.
const EXIT_WITHIN: Duration = Duration::from_secs(15);

/// The gateway's process, killed when the test ends however it ends.
struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn start(config: &std::path::Path) -> (Gateway, String) {
    start_logging(config, "warn")
}

/// [`start`] with `RUST_LOG` set to `rust_log`.
fn start_logging(config: &std::path::Path, rust_log: &str) -> (Gateway, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-gateway"))
        .args(["--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the gateway");
    let addr = address(&mut child);
    (Gateway(child), addr)
}

/// The address a gateway started with its stdout piped prints, its stdout read on meanwhile.
fn address(child: &mut Child) -> String {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // (A gateway that never prints its address ends the output, and this, when it exits.)
    let addr = lines
        .find_map(|l| {
            l.ok()?
                .strip_prefix("gateway listening on http://")
                .map(|a| a.trim_end_matches('/').to_owned())
        })
        .expect("the gateway prints its address");
    // Keep reading its output, so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    addr
}

/// The gateway with the example configuration and a drain of `ms`, its configuration in a
/// temporary directory (kept while the test runs).
fn start_draining_for(ms: u64) -> (tempfile::TempDir, Gateway, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    let text = include_str!("../gateway.toml");
    std::fs::write(&config, format!("shutdown_timeout_ms = {ms}\n{text}")).unwrap();
    let (child, addr) = start(&config);
    (dir, child, addr)
}

/// A client that sends half a request head and stalls: a request in flight for good.
fn stall(addr: &str) -> TcpStream {
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled
        .write_all(b"GET /api/items HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // The gateway has read the half head once its socket's receive queue is empty: a
    // connection that has read nothing is closed at once by a graceful shutdown (hyper), and
    // would not be in flight (a sleep alone would not say so on a loaded machine).
    let (client, server) = (stalled.local_addr().unwrap(), stalled.peer_addr().unwrap());
    if std::fs::metadata("/proc/net/tcp").is_err() {
        // Not Linux: a moment for it instead.
        std::thread::sleep(Duration::from_millis(300));
        return stalled;
    }
    let since = Instant::now();
    while unread(client.port(), server.port()) != Some(0) {
        assert!(
            since.elapsed() < EXIT_WITHIN,
            "the gateway never read the stalled request's head: {:?} bytes unread",
            unread(client.port(), server.port())
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stalled
}

/// The bytes waiting in the receive queue of the gateway's end (local port `server`) of the
/// loopback connection from port `client`, read from `/proc/net/tcp` (Linux; `None` where the
/// connection is not listed).
fn unread(client: u16, server: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, queues) = (fields.get(1)?, fields.get(2)?, fields.get(4)?);
        if port(local)? != server || port(remote)? != client {
            return None;
        }
        u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
    })
}

fn sigterm(child: &Child) {
    assert!(process::send_signal(child.id(), "-TERM"));
}

#[test]
fn sigterm_stops_the_gateway_despite_a_stalled_request() {
    let (_dir, mut child, addr) = start_draining_for(300);

    // A served request first: the gateway is up and answering.
    let mut ok = TcpStream::connect(&addr).unwrap();
    ok.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let stalled = stall(&addr);

    sigterm(&child.0);
    let status = process::wait_exit(&mut child.0, EXIT_WITHIN);
    let status = status.expect("the gateway did not exit after SIGTERM with a request stalled");
    assert!(status.success(), "{status}");
    // It exited by the deadline, with the stalled request in flight, not before accepting it.
    assert!(
        stderr(&mut child.0).contains("still in flight"),
        "the drain's deadline ended the shutdown"
    );
    drop(stalled);
}

/// An operator who does not want to wait for the drain sends the signal again: the gateway exits
/// at once (status 130), however long `shutdown_timeout_ms` is.
#[test]
fn a_second_signal_ends_the_drain_at_once() {
    let (_dir, mut child, addr) = start_draining_for(600_000);
    let stalled = stall(&addr);

    sigterm(&child.0);
    // The first signal drains: the gateway stops accepting connections (its listener closed),
    // and the stalled request holds it.
    let deadline = Instant::now() + EXIT_WITHIN;
    while TcpStream::connect(&addr).is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the first signal drains: the stalled request holds it"
    );
    // Sent again until it exits: two signals that reach a process starved of CPU before it
    // handles the first are one event to it.
    let deadline = Instant::now() + EXIT_WITHIN;
    let status = loop {
        sigterm(&child.0);
        std::thread::sleep(Duration::from_millis(200));
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the second signal ends the drain"
        );
    };
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(
        stderr(&mut child.0).contains("a second signal"),
        "it says why it did not finish the drain"
    );
    drop(stalled);
}

#[test]
fn sigterm_stops_an_idle_gateway_at_once() {
    let (mut child, _addr) = start(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/gateway.toml"
    )));
    sigterm(&child.0);
    let status =
        process::wait_exit(&mut child.0, EXIT_WITHIN).expect("the gateway exits after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        !stderr(&mut child.0).contains("still in flight"),
        "nothing was in flight"
    );
}

/// `RUST_LOG` set but empty (`Environment=RUST_LOG=` in a systemd unit, `docker run -e
/// RUST_LOG=`), or holding only commas and blanks, names no directive: the gateway logs at
/// `info`, as with the variable unset. (Was: tracing-subscriber's parse took it as a filter that
/// lets nothing through, so the store's failures and the circuit breaker went unlogged.)
#[test]
fn an_empty_rust_log_logs_at_info() {
    let config = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml"));
    for rust_log in ["", ",", " , ,"] {
        let (mut child, _addr) = start_logging(config, rust_log);
        sigterm(&child.0);
        let status =
            process::wait_exit(&mut child.0, EXIT_WITHIN).expect("the gateway exits after SIGTERM");
        assert!(status.success(), "{status}");
        let err = stderr(&mut child.0);
        assert!(
            err.contains("INFO") && err.contains("shutting down"),
            "RUST_LOG={rust_log:?}: {err:?}"
        );
        assert!(!err.contains("RUST_LOG"), "no warning for it: {err:?}");
    }
}

/// What an exited process wrote to stderr.
fn stderr(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

/// With stderr unwritable (`2>/dev/full`, a log pipe whose reader has gone), a request that logs
/// (an admin reset) is answered and SIGTERM stops the gateway. (tracing-subscriber reported each
/// line it could not write with `eprintln!`, which panicked there: the reset's connection was
/// dropped unanswered and nothing reset, a store failure's request was dropped instead of getting
/// its route's failure answer, and the signal task's panic left SIGTERM ignored.)
#[test]
fn an_unwritable_stderr_leaves_requests_answered_and_sigterm_obeyed() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    let text = include_str!("../gateway.toml")
        .replace("# [admin]\n", "[admin]\n")
        .replace("# token_env", "token_env");
    assert!(
        text.contains("\n[admin]\ntoken_env"),
        "the example's admin lines moved"
    );
    std::fs::write(&config, text).unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = Gateway(
        Command::new(env!("CARGO_BIN_EXE_example-gateway"))
            .args(["--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env("GATEWAY_ADMIN_TOKEN", "0123456789abcdef0123")
            .stdout(Stdio::piped())
            .stderr(full)
            .spawn()
            .expect("start the gateway"),
    );
    let addr = address(&mut child.0);
    let mut reset = TcpStream::connect(&addr).unwrap();
    reset
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    reset
        .write_all(
            b"POST /admin/reset?policy=login&ip=127.0.0.1 HTTP/1.1\r\nHost: x\r\n\
              Authorization: Bearer 0123456789abcdef0123\r\nContent-Length: 0\r\n\
              Connection: close\r\n\r\n",
        )
        .unwrap();
    let mut answer = String::new();
    let _ = reset.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 204"),
        "the reset's answer: {answer:?}"
    );
    sigterm(&child.0);
    let status = process::wait_exit(&mut child.0, EXIT_WITHIN)
        .expect("the gateway exits after SIGTERM with stderr unwritable");
    assert_eq!(status.code(), Some(0));
}
