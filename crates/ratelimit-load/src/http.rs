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
    /// An exchange failed or timed out on this stream (a late answer may still arrive on it, and
    /// would be read as the next request's), or the server said it closes it
    /// (`connection: close`). Never used again; the next request reconnects.
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
        // Bytes no request asked for (one is in flight at a time), left after the last answer
        // or sent since, or the server's close, break the connection: they would be read as
        // this request's answer. One `recv` that finds nothing, on a kept connection.
        if !self.broken {
            self.broken = !self.buf.is_empty()
                || !matches!(
                    self.stream.try_read_buf(&mut self.buf),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock
                );
        }
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
        self.broken |= outcome.is_err();
        outcome
    }

    async fn exchange(&mut self, key: &[u8]) -> io::Result<u16> {
        self.req.clear();
        self.req
            .extend_from_slice(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: ");
        self.req.extend_from_slice(key);
        self.req.extend_from_slice(b"\r\n\r\n");
        self.stream.write_all(&self.req).await?;
        let mut eof = false;
        loop {
            if let Some(whole) = parse_response(&self.buf, eof)? {
                // The server closes this connection: the next request opens another (bytes
                // after this response break it too, at the next request).
                self.broken |= whole.close;
                self.buf.drain(..whole.len);
                return Ok(whole.status);
            }
            if eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-response",
                ));
            }
            eof = self.stream.read_buf(&mut self.buf).await? == 0;
        }
    }
}

/// A whole response found at the start of the read buffer.
#[derive(Debug, PartialEq, Eq)]
struct Whole {
    status: u16,
    /// Its length in bytes, head and body.
    len: usize,
    /// The server closes the connection after it (`connection: close`, HTTP/1.0 without
    /// keep-alive, a body that runs to the close).
    close: bool,
}

/// If `buf` holds a whole response, its status, length and whether it closes the connection;
/// `eof`: the server has closed the connection after the bytes in `buf`. The head is parsed by
/// `httparse`; interim (1xx) responses before the final one are counted in its length; a chunked
/// body is read chunk by chunk (sizes, extensions and trailers), so that a chunk whose data holds
/// `0\r\n\r\n` does not end it; a body with neither a length nor chunks runs to the close
/// (RFC 9112, 6.3).
fn parse_response(buf: &[u8], eof: bool) -> io::Result<Option<Whole>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
    let mut start = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let body_start = match response.parse(&buf[start..]) {
            Ok(httparse::Status::Complete(n)) => start + n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(bad("too many header fields")),
            Err(_) => return Err(bad("not an HTTP/1.x response")),
        };
        let status = response.code.ok_or_else(|| bad("bad status code"))?;
        if !(100..=999).contains(&status) {
            return Err(bad("bad status code"));
        }
        // 101 Switching Protocols ends HTTP on the connection; this client never asks for it.
        if status == 101 {
            return Err(bad("101 Switching Protocols, never asked for"));
        }
        // An interim response (103 Early Hints, say) has no body, and the final one follows.
        if (100..=199).contains(&status) {
            start = body_start;
            continue;
        }
        let mut content_length = None;
        let mut chunked = false;
        let (mut close, mut keep_alive) = (false, false);
        for header in response.headers.iter() {
            let value = header.value.trim_ascii();
            if header.name.eq_ignore_ascii_case("content-length") {
                let length = std::str::from_utf8(value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| bad("bad content-length"))?;
                content_length = Some(length);
            } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if header.name.eq_ignore_ascii_case("connection") {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        // HTTP/1.0 closes the connection after the response unless it says keep-alive; `close`
        // wins over `keep-alive` (RFC 9112, 9.3).
        close |= response.version == Some(0) && !keep_alive;
        let whole = |len, close| Some(Whole { status, len, close });
        // No body: 204 and 304 answers (a `GET` never gets a `HEAD`'s).
        if matches!(status, 204 | 304) {
            return Ok(whole(body_start, close));
        }
        if chunked {
            return Ok(chunked_end(buf, body_start)?.and_then(|len| whole(len, close)));
        }
        let Some(length) = content_length else {
            // The body runs to the close: whole once the server has closed.
            return Ok(eof.then(|| whole(buf.len(), true)).flatten());
        };
        let len = body_start
            .checked_add(length)
            .ok_or_else(|| bad("bad content-length"))?;
        return Ok((buf.len() >= len).then(|| whole(len, close)).flatten());
    }
}

/// Where a chunked body that starts at `at` ends (after its last chunk and trailers), if `buf`
/// holds all of it.
fn chunked_end(buf: &[u8], mut at: usize) -> io::Result<Option<usize>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
    loop {
        let (line, size) = match httparse::parse_chunk_size(&buf[at..]) {
            Ok(httparse::Status::Complete(found)) => found,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(bad("bad chunk size")),
        };
        at += line;
        if size == 0 {
            // Trailer fields, if any, then an empty line.
            let rest = &buf[at..];
            if rest.len() < 2 {
                return Ok(None);
            }
            if rest.starts_with(b"\r\n") {
                return Ok(Some(at + 2));
            }
            return Ok(find(rest, b"\r\n\r\n").map(|end| at + end + 4));
        }
        let data_end = usize::try_from(size)
            .ok()
            .and_then(|size| at.checked_add(size))
            .and_then(|end| end.checked_add(2))
            .ok_or_else(|| bad("bad chunk size"))?;
        if buf.len() < data_end {
            return Ok(None);
        }
        if &buf[data_end - 2..data_end] != b"\r\n" {
            return Err(bad("a chunk not ended by CRLF"));
        }
        at = data_end;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status and length of a whole response that keeps its connection.
    fn kept(status: u16, len: usize) -> Option<Whole> {
        Some(Whole {
            status,
            len,
            close: false,
        })
    }

    #[test]
    fn parses_whole_responses_only() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(parse_response(ok, false).unwrap(), kept(200, ok.len()));
        assert_eq!(parse_response(&ok[..ok.len() - 1], false).unwrap(), None);
        assert_eq!(parse_response(&ok[..10], false).unwrap(), None);
        let two = [&ok[..], b"HTTP/1.1 429 Too Many"].concat();
        assert_eq!(parse_response(&two, false).unwrap(), kept(200, ok.len()));
        let chunked = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked, false).unwrap(),
            kept(429, chunked.len())
        );
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n", false).is_err());
    }

    /// A chunked body ends at its last chunk, read chunk by chunk: not at a `0\r\n\r\n` inside
    /// a chunk's data, and after trailer fields and chunk extensions. Every prefix of each is
    /// incomplete, and the next response after it is left alone.
    #[test]
    fn chunked_bodies_end_at_their_last_chunk() {
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        for body in [
            // Data ending in `0\r\n`, then CRLF: `0\r\n\r\n` inside the chunk.
            "5\r\nab0\r\n\r\n0\r\n\r\n",
            // Data holding the whole terminator.
            "10\r\n\r\n0\r\n\r\n012345678\r\n0\r\n\r\n",
            // Trailer fields.
            "2\r\nok\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n",
            // Chunk extensions, an upper-case size.
            "A;name=value\r\n0123456789\r\n0;e=1\r\n\r\n",
        ] {
            let whole = format!("{head}{body}");
            let next = "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n";
            let two = format!("{whole}{next}");
            assert_eq!(
                parse_response(two.as_bytes(), false).unwrap(),
                kept(200, whole.len()),
                "{body:?}"
            );
            for cut in 0..whole.len() {
                assert_eq!(
                    parse_response(&whole.as_bytes()[..cut], false).unwrap(),
                    None,
                    "{body:?} cut at {cut}"
                );
            }
        }
        for bad in ["zz\r\nok\r\n0\r\n\r\n", "2\r\nokXX0\r\n\r\n"] {
            let got = parse_response(format!("{head}{bad}").as_bytes(), false);
            assert!(got.is_err(), "{bad:?}: {got:?}");
        }
    }

    /// Interim (1xx) responses are read past to the final one, whose status counts and whose
    /// length includes them; an incomplete final response is not whole.
    #[test]
    fn interim_responses_are_read_past() {
        let interim = "HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n\
                       HTTP/1.1 100 Continue\r\n\r\n";
        let last = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let whole = format!("{interim}{last}");
        assert_eq!(
            parse_response(whole.as_bytes(), false).unwrap(),
            kept(200, whole.len())
        );
        assert_eq!(parse_response(interim.as_bytes(), false).unwrap(), None);
    }

    /// An HTTP/1.0 response closes its connection unless it says keep-alive; a body with
    /// neither a length nor chunks runs to the close, and is whole only then.
    #[test]
    fn responses_that_end_with_the_connection_close_it() {
        let old = b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let closes = |buf: &[u8], eof| parse_response(buf, eof).unwrap().map(|w| w.close);
        assert_eq!(closes(old, false), Some(true));
        let kept_alive =
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(closes(kept_alive, false), Some(false));
        let both =
            b"HTTP/1.0 200 OK\r\nconnection: close, keep-alive\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(closes(both, false), Some(true), "close wins");
        // A protocol switch, never asked for, is an error rather than a wait for a final answer.
        assert!(parse_response(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", false).is_err());
        let to_close = b"HTTP/1.1 200 OK\r\n\r\nok";
        assert_eq!(parse_response(to_close, false).unwrap(), None);
        assert_eq!(
            parse_response(to_close, true).unwrap(),
            Some(Whole {
                status: 200,
                len: to_close.len(),
                close: true
            })
        );
        // 204 and 304 have no body, whatever they say.
        let empty = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(
            parse_response(empty, false).unwrap(),
            kept(204, empty.len())
        );
    }

    /// A response saying `connection: close` is told so; the next request goes over a new
    /// connection instead of the closed one.
    #[tokio::test]
    async fn a_connection_the_server_closes_is_not_used_again() {
        let closing =
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            parse_response(closing, false).unwrap(),
            Some(Whole {
                status: 200,
                len: closing.len(),
                close: true
            })
        );
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let (mut first, _) = listener.accept().await.unwrap();
            let _ = first.read(&mut buf).await.unwrap();
            first.write_all(closing).await.unwrap();
            drop(first);
            let (mut second, _) = listener.accept().await.unwrap();
            let _ = second.read(&mut buf).await.unwrap();
            let denied = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n";
            second.write_all(denied).await.unwrap();
            let _ = second.read(&mut buf).await;
        });
        let mut conn = Conn::connect(addr).await.unwrap();
        assert_eq!(conn.request(b"a").await.unwrap(), 200);
        assert_eq!(
            conn.request(b"b").await.unwrap(),
            429,
            "over a new connection"
        );
        drop(conn);
        server.await.unwrap();
    }

    /// A server on 127.0.0.1 for two connections, one after the other: on the first it reads a
    /// request and writes each of `first`'s byte strings after its pause in milliseconds; on the
    /// second it reads a request and answers `second`. Both stay open until the client is done.
    async fn serve_two(
        first: &'static [(u64, &'static [u8])],
        second: &'static [u8],
    ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let (mut one, _) = listener.accept().await.unwrap();
            let _ = one.read(&mut buf).await.unwrap();
            for (pause, bytes) in first {
                tokio::time::sleep(Duration::from_millis(*pause)).await;
                one.write_all(bytes).await.unwrap();
            }
            let (mut two, _) = listener.accept().await.unwrap();
            let _ = two.read(&mut buf).await.unwrap();
            two.write_all(second).await.unwrap();
            let _ = two.read(&mut buf).await;
            drop(one);
        });
        (addr, server)
    }

    /// A server that sends more than the one response asked for: the bytes after it answer no
    /// request (only one is ever in flight), so the next request goes over a new connection
    /// and gets its own answer, not the extra one; whether they come with the answer or a
    /// moment after it (read apart from it).
    #[tokio::test]
    async fn bytes_after_a_response_are_never_read_as_the_next_answer() {
        const DENIED: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n";
        const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        const BOTH: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n\
                              HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        for first in [&[(0, BOTH)][..], &[(0, DENIED), (20, OK)]] {
            let (addr, server) = serve_two(first, DENIED).await;
            let mut conn = Conn::connect(addr).await.unwrap();
            assert_eq!(conn.request(b"a").await.unwrap(), 429);
            // Let an unasked response written later arrive.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(conn.request(b"b").await.unwrap(), 429, "b's own answer");
            drop(conn);
            server.await.unwrap();
        }
    }

    /// A status is three digits followed by a space or the line's end: `2001` is not 200, nor
    /// `+20` 20. A `Content-Length` that is not a length, or no body could have, is an error,
    /// not a whole response (it overflowed: a panic in a debug build, a response "complete"
    /// before its body in a release one).
    #[test]
    fn malformed_responses_are_errors() {
        let bare = b"HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(parse_response(bare, false).unwrap(), kept(200, bare.len()));
        for bad in [
            &b"HTTP/1.1 2001 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 4290\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 +20 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: two\r\n\r\nok",
        ] {
            let got = parse_response(bad, false);
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
        // The first request's answer, late; then 200 to the next, on a new connection.
        let (addr, server) = serve_two(
            &[(
                300,
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n",
            )],
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
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
