//! [`RequestHead`]: the part of a request that key extractors, cost functions, tier resolvers and
//! allow-lists read.
//!
//! It borrows the request in place. Reading a request's head as `http::request::Parts` would mean
//! taking the request apart (`into_parts`) and joining it again (`from_parts`) on every request,
//! two copies of a head of about 220 bytes, since a `Request` does not lend its `Parts`. The
//! fields have the names of `Parts`' fields, so a closure written for `&Parts` that does not name
//! the type reads a `&RequestHead` unchanged:
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//!
//! let tenant = |req: &RequestHead<'_>| req.headers.get("x-tenant").cloned();
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

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A request's head, borrowed: its method, URI, version, headers and extensions.
///
/// Made with [`RequestHead::of`] from a `&Request<B>` of any body type, or with `From` from a
/// `&Parts`. It is `Copy` (five words).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestHead<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's HTTP version.
    pub version: Version,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions (what earlier layers put there: `ConnectInfo`, an authenticated
    /// user, a plan, `MatchedPath`).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`, borrowed in place.
    #[inline]
    pub fn of<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
}

impl<'a> From<&'a Parts> for RequestHead<'a> {
    #[inline]
    fn from(parts: &'a Parts) -> Self {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (method, uri, version) = (head.method.clone(), head.uri.clone(), head.version);
        assert_eq!(method, Method::POST);
        assert_eq!(uri, "https://example.com/a?b=c");
        assert_eq!(version, Version::HTTP_2);
        assert_eq!(head.headers["x-key"], "k1");
        assert_eq!(head.extensions.get::<u32>(), Some(&7));
        let (parts, ()) = req.into_parts();
        let head = RequestHead::from(&parts);
        assert_eq!(*head.method, method);
        assert_eq!(*head.uri, uri);
        assert_eq!(head.version, version);
        assert_eq!(head.headers["x-key"], "k1");
        assert_eq!(head.extensions.get::<u32>(), Some(&7));
    }
}
