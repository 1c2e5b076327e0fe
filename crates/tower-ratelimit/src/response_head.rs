//! [`ResponseHead`]: the part of a response that a reset condition reads
//! ([`RateLimitLayerBuilder::reset_on`](crate::RateLimitLayerBuilder::reset_on)).
//!
//! It borrows the inner service's response in place, as [`RequestHead`](crate::RequestHead)
//! borrows a request: its getters are those of `http::Response`, and it is the same for every
//! body type, so that one condition serves any inner service.
//!
//! ```
//! use tower_ratelimit::{ResponseHead, http};
//!
//! // A sign-in succeeded: a 2xx, or a handler's marker in the extensions.
//! #[derive(Clone)]
//! struct SignedIn;
//! let signed_in = |res: &ResponseHead<'_>| {
//!     res.status().is_success() || res.extensions().get::<SignedIn>().is_some()
//! };
//!
//! let res = http::Response::builder().status(204).body(())?;
//! assert!(signed_in(&ResponseHead::of(&res)));
//! let (parts, ()) = http::Response::builder().status(401).body(())?.into_parts();
//! assert!(!signed_in(&ResponseHead::from(&parts)));
//! # Ok::<(), http::Error>(())
//! ```

use std::fmt;

use http::response::Parts;
use http::{Extensions, HeaderMap, Response, StatusCode, Version};

/// A response's head, borrowed: its status, version, headers and extensions.
///
/// Made with [`ResponseHead::of`] from a `&Response<B>` of any body type, or with `From` from a
/// `&Parts`; read with the getters of `http::Response`. `Copy`, `Send` and `Sync`.
#[derive(Clone, Copy)]
pub struct ResponseHead<'a> {
    status: StatusCode,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> ResponseHead<'a> {
    /// The head of `res`, borrowed in place.
    #[inline]
    pub fn of<B>(res: &'a Response<B>) -> Self {
        ResponseHead {
            status: res.status(),
            version: res.version(),
            headers: res.headers(),
            extensions: res.extensions(),
        }
    }

    /// The response's status.
    #[inline]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response's HTTP version.
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The response's headers.
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The response's extensions: what the handler and inner layers put there.
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

impl<'a> From<&'a Parts> for ResponseHead<'a> {
    #[inline]
    fn from(parts: &'a Parts) -> Self {
        ResponseHead {
            status: parts.status,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }
}

impl fmt::Debug for ResponseHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseHead")
            .field("status", &self.status)
            .field("version", &self.version)
            .field("headers", self.headers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_and_sync<T: Send + Sync>(_: &T) {}

    /// Both ways of making a head read the same response.
    #[test]
    fn a_response_and_its_parts_give_the_same_head() {
        let mut res = Response::builder()
            .status(StatusCode::CREATED)
            .version(Version::HTTP_2)
            .header("x-signed-in", "yes")
            .body(())
            .unwrap();
        res.extensions_mut().insert(7u32);
        let head = ResponseHead::of(&res);
        send_and_sync(&head);
        assert_eq!(head.status(), StatusCode::CREATED);
        assert_eq!(head.version(), Version::HTTP_2);
        assert_eq!(head.headers()["x-signed-in"], "yes");
        assert_eq!(head.extensions().get::<u32>(), Some(&7));
        let debug = format!("{head:?}");
        assert!(
            debug.contains("201") && debug.contains("HTTP/2.0"),
            "{debug}"
        );
        let (parts, ()) = res.into_parts();
        let head = ResponseHead::from(&parts);
        assert_eq!(head.status(), StatusCode::CREATED);
        assert_eq!(head.version(), Version::HTTP_2);
        assert_eq!(head.headers()["x-signed-in"], "yes");
        assert_eq!(head.extensions().get::<u32>(), Some(&7));
    }
}
