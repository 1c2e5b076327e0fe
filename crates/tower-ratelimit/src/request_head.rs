//! [`RequestHead`]: the part of a request that key extractors, cost functions, tier resolvers and
//! allow-lists read.
//!
//! It borrows the request in place. Reading a request's head as `http::request::Parts` would mean
//! taking the request apart (`into_parts`) and joining it again (`from_parts`) on every request,
//! two copies of a head of about 220 bytes, since a `Request` does not lend its `Parts`. Its
//! getters are those of `http::Request`, so code written for a `&Request<B>` reads a
//! `&RequestHead` unchanged:
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//!
//! let tenant = |req: &RequestHead<'_>| req.headers().get("x-tenant").cloned();
//!
//! let req = http::Request::builder()
//!     .header("x-tenant", "acme")
//!     .body(())?;
//! assert_eq!(tenant(&RequestHead::of(&req)).unwrap(), "acme");
//! // A head taken apart already reads the same.
//! let (parts, ()) = req.into_parts();
//! assert_eq!(tenant(&RequestHead::from(&parts)).unwrap(), "acme");
//! # Ok::<(), http::Error>(())
//! ```

use std::fmt;

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A request's head, borrowed: its method, URI, version, headers and extensions.
///
/// Made with [`RequestHead::of`] from a `&Request<B>` of any body type, or with `From` from a
/// `&Parts`; read with the getters of `http::Request`. `Copy`, `Send` and `Sync`.
#[derive(Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    version: Version,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`, borrowed in place.
    #[inline]
    pub fn of<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
            version: req.version(),
        }
    }

    /// The request's method.
    #[inline]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request's URI.
    #[inline]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request's HTTP version.
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request's headers.
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request's extensions: what earlier layers put there (`ConnectInfo`, an authenticated
    /// user, a plan, `MatchedPath`).
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

impl<'a> From<&'a Parts> for RequestHead<'a> {
    #[inline]
    fn from(parts: &'a Parts) -> Self {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
            version: parts.version,
        }
    }
}

impl fmt::Debug for RequestHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHead")
            .field("method", self.method)
            .field("uri", self.uri)
            .field("version", &self.version())
            .field("headers", self.headers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_and_sync<T: Send + Sync>(_: &T) {}

    /// Both ways of making a head read the same request.
    #[test]
    fn a_request_and_its_parts_give_the_same_head() {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("https://example.com/a?b=c")
            .version(Version::HTTP_2)
            .header("x-key", "k1")
            .body(())
            .unwrap();
        req.extensions_mut().insert(7u32);
        let head = RequestHead::of(&req);
        send_and_sync(&head);
        assert_eq!(head.method(), Method::POST);
        assert_eq!(head.uri(), "https://example.com/a?b=c");
        assert_eq!(head.version(), Version::HTTP_2);
        assert_eq!(head.headers()["x-key"], "k1");
        assert_eq!(head.extensions().get::<u32>(), Some(&7));
        let debug = format!("{head:?}");
        assert!(
            debug.contains("POST") && debug.contains("HTTP/2.0"),
            "{debug}"
        );
        let (parts, ()) = req.into_parts();
        let head = RequestHead::from(&parts);
        assert_eq!(head.method(), Method::POST);
        assert_eq!(head.uri(), "https://example.com/a?b=c");
        assert_eq!(head.version(), Version::HTTP_2);
        assert_eq!(head.headers()["x-key"], "k1");
        assert_eq!(head.extensions().get::<u32>(), Some(&7));
    }
}
