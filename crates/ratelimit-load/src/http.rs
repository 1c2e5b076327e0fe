//! The HTTP side: in-process axum gateways on 127.0.0.1, and a minimal HTTP/1.1 keep-alive
//! client over a `TcpStream` (one request at a time per connection, no allocation per request).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_core::{Limit, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer};

use crate::Error;

/// How long one HTTP request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The header carrying the user's key.
const KEY_HEADER: &str = "x-api-key";

/// The baseline: axum with one route and no limiter.
pub(crate) fn bare() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// The same server with the rate-limit layer over `store`, keyed by the `x-api-key` header.
/// A store failure answers 503 (fail closed), so it shows as an error, never as an admission.
pub(crate) fn layered<S: Store>(store: S, limit: &Limit) -> Result<Router, Error> {
    let policy = Policy::new("load", limit.clone())?
        .key(ApiKeyHeader::new(KEY_HEADER)?)
        .failure(FailurePolicy::fail_closed(Duration::from_secs(1)));
    Ok(bare().layer(RateLimitLayer::new(store, policy)?))
}

/// A server running on a task of this runtime.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    handle: tokio::task::JoinHandle<()>,
}

/// Stops the server when dropped, however the run ends (an error while opening connections
/// included): a detached task would serve on.
impl Drop for Server {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Starts each router on its own loopback port.
pub(crate) async fn serve_all(routers: Vec<Router>) -> Result<Vec<Server>, Error> {
    let mut servers = Vec::with_capacity(routers.len());
    for router in routers {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let handle = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        servers.push(Server { addr, handle });
    }
    Ok(servers)
}

/// A TCP stream to `addr`, with `TCP_NODELAY` on.
async fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One keep-alive HTTP/1.1 connection.
#[derive(Debug)]
pub(crate) struct Conn {
    addr: SocketAddr,
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    buf: Vec<u8>,
    /// The request being written.
    req: Vec<u8>,
    /// An exchange failed or timed out on this stream: a late answer may still arrive on it, and
    /// would be read as the next request's. Never used again; the next request reconnects.
    broken: bool,
    /// How long one exchange may take ([`REQUEST_TIMEOUT`]).
    timeout: Duration,
}

impl Conn {
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Conn, Error> {
        Ok(Conn {
            addr,
            stream: open(addr).await?,
            buf: Vec::with_capacity(4096),
            req: Vec::with_capacity(128),
            broken: false,
            timeout: REQUEST_TIMEOUT,
        })
    }

    /// Sends `GET /` for `key` and returns the response's status, having read its whole body.
    /// After a failed exchange the stream is replaced first (an error if that fails: the old
    /// stream is never written to again, so no answer is ever read as another request's).
    pub(crate) async fn request(&mut self, key: &[u8]) -> Result<u16, Error> {
        if self.broken {
            self.stream = open(self.addr).await?;
            self.buf.clear();
            self.broken = false;
        }
        let outcome = match tokio::time::timeout(self.timeout, self.exchange(key)).await {
            Ok(r) => r.map_err(Error::from),
            Err(_) => Err(Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "no response in time",
            ))),
        };
        self.broken = outcome.is_err();
        outcome
    }

    async fn exchange(&mut self, key: &[u8]) -> io::Result<u16> {
        self.req.clear();
        self.req
            .extend_from_slice(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: ");
        self.req.extend_from_slice(key);
        self.req.extend_from_slice(b"\r\n\r\n");
        self.stream.write_all(&self.req).await?;
        loop {
            if let Some((status, len)) = parse_response(&self.buf)? {
                self.buf.drain(..len);
                return Ok(status);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-response",
                ));
            }
        }
    }
}

/// If `buf` holds a whole response, its status and length in bytes.
fn parse_response(buf: &[u8]) -> io::Result<Option<(u16, usize)>> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = &buf[..head_end];
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
    if head.len() < 12 || !head.starts_with(b"HTTP/1.") {
        return Err(bad("not an HTTP/1.x response"));
    }
    // Three digits, then a space or the line's end (`2001` is not 200).
    let code = &head[9..12];
    if !code.iter().all(u8::is_ascii_digit) || !matches!(head.get(12), None | Some(b' ' | b'\r')) {
        return Err(bad("bad status code"));
    }
    let status = code.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    let body_start = head_end + 4;
    let mut content_length = None;
    let mut chunked = false;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let length = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| bad("bad content-length"))?;
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            && value.eq_ignore_ascii_case(b"chunked")
        {
            chunked = true;
        }
    }
    if chunked {
        // Only the terminating chunk is looked for: bodies here are small and never contain it.
        return Ok(find(&buf[body_start..], b"0\r\n\r\n").map(|end| (status, body_start + end + 5)));
    }
    let len = body_start
        .checked_add(content_length.unwrap_or(0))
        .ok_or_else(|| bad("bad content-length"))?;
    Ok((buf.len() >= len).then_some((status, len)))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_whole_responses_only() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(parse_response(ok).unwrap(), Some((200, ok.len())));
        assert_eq!(parse_response(&ok[..ok.len() - 1]).unwrap(), None);
        assert_eq!(parse_response(&ok[..10]).unwrap(), None);
        let two = [&ok[..], b"HTTP/1.1 429 Too Many"].concat();
        assert_eq!(parse_response(&two).unwrap(), Some((200, ok.len())));
        let chunked = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), Some((429, chunked.len())));
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }

    /// A status is three digits followed by a space or the line's end: `2001` is not 200, nor
    /// `+20` 20. A `Content-Length` that is not a length, or no body could have, is an error,
    /// not a whole response (it overflowed: a panic in a debug build, a response "complete"
    /// before its body in a release one).
    #[test]
    fn malformed_responses_are_errors() {
        let bare = b"HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(parse_response(bare).unwrap(), Some((200, bare.len())));
        for bad in [
            &b"HTTP/1.1 2001 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 4290\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 +20 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: two\r\n\r\nok",
        ] {
            let got = parse_response(bad);
            assert!(got.is_err(), "{:?}: {got:?}", String::from_utf8_lossy(bad));
        }
    }

    /// A server stops listening when dropped: a run that fails after starting its gateways (a
    /// connection it cannot open) leaves none behind.
    #[tokio::test]
    async fn a_dropped_server_stops_listening() {
        let servers = serve_all(vec![Router::new()]).await.unwrap();
        let addr = servers[0].addr;
        drop(TcpStream::connect(addr).await.unwrap());
        drop(servers);
        // The task is aborted at the runtime's next turn: polled until then (for 10 s at most,
        // a bound for a loaded machine, not a timing).
        let since = std::time::Instant::now();
        while TcpStream::connect(addr).await.is_ok() {
            assert!(since.elapsed() < Duration::from_secs(10), "still listening");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A request that timed out may still be answered on its connection: that answer is never
    /// read as the next request's. The next request goes over a new connection, and fails if
    /// none can be made (it wrote to the old one and read the late 429 before).
    #[tokio::test]
    async fn a_late_answer_is_never_read_as_the_next_requests() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = first.read(&mut buf).await.unwrap();
            // The first request's answer, late; then 200 to whatever else comes on it.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let late = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n";
            first.write_all(late).await.unwrap();
            let (mut second, _) = listener.accept().await.unwrap();
            let _ = second.read(&mut buf).await.unwrap();
            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            second.write_all(ok).await.unwrap();
            // Keeps both open until the client is done.
            let _ = second.read(&mut buf).await;
            drop(first);
        });
        let mut conn = Conn::connect(addr).await.unwrap();
        conn.timeout = Duration::from_millis(100);
        assert!(conn.request(b"a").await.is_err(), "no answer in time");
        // Let the late answer arrive on the old connection.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(conn.request(b"b").await.unwrap(), 200, "b's own answer");
        drop(conn);
        server.await.unwrap();

        // No new connection can be made: an error, not the old connection's late answer.
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            drop(listener);
            let mut buf = [0u8; 1024];
            let _ = first.read(&mut buf).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let late = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n";
            first.write_all(late).await.unwrap();
            let _ = first.read(&mut buf).await;
        });
        let mut conn = Conn::connect(addr).await.unwrap();
        conn.timeout = Duration::from_millis(100);
        assert!(conn.request(b"a").await.is_err(), "no answer in time");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let next = conn.request(b"b").await;
        assert!(next.is_err(), "{next:?}");
        drop(conn);
        server.await.unwrap();
    }
}
