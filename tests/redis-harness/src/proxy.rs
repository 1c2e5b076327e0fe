//! A loopback TCP proxy that makes the network between a client and Redis slow or broken.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_harness::{RedisServer, proxy::Proxy};
//!
//! let server = RedisServer::start();
//! let proxy = Proxy::start(server.port());
//! // Point the client at `proxy.url()` instead of `server.url()`.
//! proxy.set_latency(Duration::from_millis(30)); // every chunk arrives 30 ms late
//! proxy.drop_connections(); // cut every open connection
//! proxy.set_refuse(true); // new connections are closed at once
//! proxy.refuse_next(1); // the next new connection only
//! proxy.set_upstream(server.port()); // new connections go to this port
//! proxy.set_hold_replies(true); // the server's replies wait in the proxy until set back
//! ```
//!
//! Each direction of each connection is a delay line: a reader thread stamps every chunk it reads
//! with the time it must be delivered (now + the latency at that moment) and a writer thread
//! delivers it then. The latency is added once per chunk, not once per byte or per queued chunk,
//! so a pipelined client sees the added latency without its throughput collapsing.
//!
//! Everything runs on plain threads, so the proxy keeps working whatever the test's async runtime
//! is doing. Dropping the proxy stops accepting and cuts every connection.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// A TCP proxy from a free loopback port to `127.0.0.1:<upstream>`, with settable latency and
/// connection cutting. See the [module docs](self).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    upstream: AtomicU16,
    hold_replies: AtomicBool,
    latency_micros: AtomicU64,
    refuse: AtomicBool,
    /// How many of the next new connections to refuse (as `refuse` does), whatever `refuse` says.
    refuse_next: AtomicU64,
    stopped: AtomicBool,
    /// Both ends of every connection, to cut them.
    streams: Mutex<Vec<TcpStream>>,
    accepted: AtomicU64,
}

impl Proxy {
    /// Starts a proxy forwarding to `127.0.0.1:<upstream>`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .expect("bind the proxy's port");
        let port = listener.local_addr().expect("local address").port();
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            ..Shared::default()
        });
        let s = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || accept_loop(&listener, &s))
            .expect("spawn the proxy thread");
        Proxy { port, shared }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk, in both directions, by `latency` (zero by default). Applies to chunks
    /// read from now on.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_micros.store(micros, Ordering::Relaxed);
    }

    /// While `true`, what the server sends is held in the proxy, undelivered (requests still
    /// reach the server): a reply is lost for sure if the connection is cut before this is set
    /// back to `false`.
    pub fn set_hold_replies(&self, hold: bool) {
        self.shared.hold_replies.store(hold, Ordering::Relaxed);
    }

    /// Sends new connections to `127.0.0.1:<upstream>` from now on; open connections keep their
    /// server (as after a failover behind a DNS name or a virtual IP).
    pub fn set_upstream(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::Relaxed);
    }

    /// While `true`, each new connection is accepted and closed at once, before anything is
    /// forwarded (the client sees its connection reset or closed). Open connections are kept.
    pub fn set_refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::Relaxed);
    }

    /// Refuses the next `count` new connections as [`set_refuse`](Proxy::set_refuse) does, then
    /// accepts again (replaces a count not yet used up).
    pub fn refuse_next(&self, count: u64) {
        self.shared.refuse_next.store(count, Ordering::Relaxed);
    }

    /// Cuts every open connection (both ends are shut down); new ones are still accepted unless
    /// [`set_refuse`](Proxy::set_refuse) says otherwise.
    pub fn drop_connections(&self) {
        let streams = std::mem::take(&mut *lock(&self.shared.streams));
        for s in streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// How many connections the proxy has accepted so far (refused ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.drop_connections();
        // Wake the accept loop so its thread ends.
        let _ = TcpStream::connect_timeout(
            &SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port).into(),
            Duration::from_millis(200),
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopped.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let next = shared
            .refuse_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if next || shared.refuse.load(Ordering::Relaxed) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(
            &SocketAddrV4::new(Ipv4Addr::LOCALHOST, shared.upstream.load(Ordering::Relaxed)).into(),
            Duration::from_secs(1),
        ) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let clones = (
            client.try_clone(),
            client.try_clone(),
            server.try_clone(),
            server.try_clone(),
        );
        let (Ok(c_read), Ok(c_keep), Ok(s_read), Ok(s_keep)) = clones else {
            continue;
        };
        lock(&shared.streams).extend([c_keep, s_keep]);
        pipe(c_read, server, Arc::clone(shared), false);
        pipe(s_read, client, Arc::clone(shared), true);
    }
}

/// Forwards `from` to `to` through a delay line: one thread reads, another delivers. `replies`:
/// this direction carries the server's replies (held while `hold_replies` is set).
fn pipe(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>, replies: bool) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader = Arc::clone(&shared);
    let spawned = thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let delay =
                            Duration::from_micros(reader.latency_micros.load(Ordering::Relaxed));
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            let _ = from.shutdown(Shutdown::Both);
        });
    if spawned.is_err() {
        return;
    }
    let _ = thread::Builder::new()
        .name("proxy-write".into())
        .spawn(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                while replies
                    && shared.hold_replies.load(Ordering::Relaxed)
                    && !shared.stopped.load(Ordering::Relaxed)
                {
                    thread::sleep(Duration::from_millis(1));
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Both);
            drop(shared);
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedisServer;
    use std::io::{BufRead, BufReader};

    fn ping(port: u16) -> std::io::Result<(String, Duration)> {
        let start = Instant::now();
        let mut s = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut line = String::new();
        BufReader::new(&mut s).read_line(&mut line)?;
        Ok((line, start.elapsed()))
    }

    #[test]
    fn forwards_delays_cuts_and_refuses() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        assert_eq!(ping(proxy.port()).unwrap().0, "+PONG\r\n");

        proxy.set_latency(Duration::from_millis(100));
        let (line, took) = ping(proxy.port()).unwrap();
        assert_eq!(line, "+PONG\r\n");
        assert!(took >= Duration::from_millis(200), "two chunks, {took:?}");
        proxy.set_latency(Duration::ZERO);

        let mut open = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, proxy.port()))
            .expect("connect");
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // One round trip first: the proxy has then accepted and registered the connection (a
        // fixed wait might not be long enough on a loaded machine).
        open.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut pong = [0u8; 7];
        open.read_exact(&mut pong).unwrap();
        assert_eq!(&pong, b"+PONG\r\n");
        proxy.drop_connections();
        let mut buf = [0u8; 8];
        let cut = open.write_all(b"*1\r\n$4\r\nPING\r\n").is_err()
            || matches!(open.read(&mut buf), Ok(0) | Err(_));
        assert!(cut, "a cut connection answers nothing");

        proxy.set_refuse(true);
        assert!(
            ping(proxy.port())
                .map(|(l, _)| l.is_empty())
                .unwrap_or(true)
        );
        proxy.set_refuse(false);
        assert_eq!(ping(proxy.port()).unwrap().0, "+PONG\r\n");
        assert!(proxy.accepted() >= 4);
    }
}
