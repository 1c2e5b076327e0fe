//! Key extraction: which client a request counts against.
//!
//! A [`KeyExtractor`] reads the request's head ([`RequestHead`], borrowed in place) and appends
//! the client's key to a [`KeyBuf`]. The layer prefixes every key with its policy's name (and a
//! store keeps state per limit), so two differently named policies never share state even when
//! they key on the same thing. Two policies of the *same* name and limit on one store do share
//! it: give each layer of an app, and each app on a shared Redis, its own name (nested layers of
//! one name would count a request twice against one bucket).
//!
//! When no key can be found (no API-key header, no user in the extensions, no peer address), the
//! answer is the policy's [`MissingKey`](crate::MissingKey) setting: reject with a chosen status
//! (400 by default) or count the request against one shared fallback key. It is never an
//! internal error: no 500 unless one was chosen as that status.
//!
//! # Built-in extractors
//!
//! | extractor | key |
//! | --- | --- |
//! | [`ApiKeyHeader`] | the value of a header such as `x-api-key` |
//! | [`ExtensionKey`] | a value an earlier layer put in the request extensions (a user id) |
//! | [`PeerIp`] | the TCP peer's address from axum's `ConnectInfo<SocketAddr>` |
//! | [`ClientIpKey`] | the client's address behind trusted proxies (`Forwarded`, `X-Forwarded-For`) |
//! | [`RouteKey`] | the method and matched route of the request |
//! | [`GlobalKey`] | one key for every request |
//! | a closure `Fn(&RequestHead<'_>) -> Option<impl KeyPart>` | whatever it returns |
//! | [`from_fn`]`(\|req, key\| ..)` | what the closure writes (borrowing from the request) |
//! | a tuple `(A, B)` or `(A, B, C)` | every part, in order (route + user) |
//! | [`or`]`(A, B)` | `A`'s key if the request has one, else `B`'s (user, else IP) |
//!
//! ## An API-key header
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//! use tower_ratelimit::key::{ApiKeyHeader, KeyBuf, KeyExtractor};
//!
//! let key = ApiKeyHeader::new("x-api-key")?;
//! let req = http::Request::get("/").header("x-api-key", "k-123").body(())?;
//! let mut buf = KeyBuf::new();
//! key.extract(&RequestHead::of(&req), &mut buf)?;
//! assert_eq!(buf.as_bytes(), b"k-123");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## A user id set by an authentication layer
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//! use tower_ratelimit::key::{ExtensionKey, KeyBuf, KeyExtractor, KeyPart};
//!
//! #[derive(Clone)]
//! struct UserId(u64);
//! impl KeyPart for UserId {
//!     fn write_to(&self, key: &mut KeyBuf) {
//!         self.0.write_to(key)
//!     }
//! }
//!
//! let key = ExtensionKey::<UserId>::new();
//! let mut req = http::Request::new(());
//! req.extensions_mut().insert(UserId(42));
//! let mut buf = KeyBuf::new();
//! key.extract(&RequestHead::of(&req), &mut buf)?;
//! assert_eq!(buf.as_bytes(), 42u64.to_be_bytes());
//! # Ok::<(), tower_ratelimit::key::NoKey>(())
//! ```
//!
//! ## A closure, and a combination (route and user)
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//! use tower_ratelimit::key::{KeyBuf, KeyExtractor, RouteKey};
//!
//! // A tenant an authentication layer in front checked and put in the request's extensions.
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! let tenant = |req: &RequestHead<'_>| req.extensions().get::<Tenant>().map(|t| t.0.clone());
//! let key = (RouteKey::new(), tenant);
//! let mut req = http::Request::post("/upload").body(())?;
//! req.extensions_mut().insert(Tenant("acme".into()));
//! let mut buf = KeyBuf::new();
//! key.extract(&RequestHead::of(&req), &mut buf)?;
//! // Outside a router there is no matched route: the route part is the method and the
//! // `<unmatched>` marker, never the raw path (whose cardinality the client controls). Each part
//! // after the first is followed by its length, so no two combinations give the same key.
//! assert_eq!(buf.as_bytes(), b"POST <unmatched>acme\x04");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A closure given to `Policy::key` as it is needs its argument's type written out
//! (`|req: &RequestHead<'_>|`), and what it returns cannot borrow from the request. [`from_fn`]
//! takes a closure that writes the key itself: its types are inferred, and it can push bytes it
//! borrows, with no copy. A header read by hand should be read as [`ApiKeyHeader`] reads one:
//! once, without the spaces around it (else `acme` and ` acme` are two keys over HTTP/2, and of a
//! header sent twice an authentication layer may check one value while the key is the other).
//! A closure can only answer [`NoKey`], which cannot tell a header sent twice from none: under
//! [`or`] or a policy's [`MissingKey::SharedKey`](crate::MissingKey::SharedKey), where such a
//! request must not count as anonymous (see [`KeyExtractor::unusable`]), read a header with
//! [`ApiKeyHeader`] (alone or in a tuple), or implement [`KeyExtractor`] with `unusable`:
//!
//! ```
//! use tower_ratelimit::{RequestHead, http};
//! use tower_ratelimit::key::{self, KeyBuf, KeyExtractor, NoKey, header_value_trimmed};
//!
//! let tenant = key::from_fn(|req, key| {
//!     let mut values = req.headers().get_all("x-tenant").iter();
//!     let (Some(tenant), None) = (values.next(), values.next()) else {
//!         return Err(NoKey);
//!     };
//!     key.push(header_value_trimmed(tenant));
//!     Ok(())
//! });
//! let req = http::Request::get("/").header("x-tenant", "acme").body(())?;
//! let mut buf = KeyBuf::new();
//! tenant.extract(&RequestHead::of(&req), &mut buf)?;
//! assert_eq!(buf.as_bytes(), b"acme");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The peer address
//!
//! (With the default `axum` feature, as [`PeerIp`] reads axum's `ConnectInfo`.)
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::net::SocketAddr;
//! use axum::extract::ConnectInfo;
//! use tower_ratelimit::{RequestHead, http};
//! use tower_ratelimit::key::{KeyBuf, KeyExtractor, NoKey, PeerIp};
//!
//! let key = PeerIp::new();
//! let mut req = http::Request::new(());
//! req.extensions_mut().insert(ConnectInfo("[2001:db8:1:2:3:4:5:6]:443".parse::<SocketAddr>()?));
//! let mut buf = KeyBuf::new();
//! key.extract(&RequestHead::of(&req), &mut buf)?;
//! // IPv6 clients are grouped by their /64.
//! let mut other = KeyBuf::new();
//! let mut req = http::Request::new(());
//! req.extensions_mut().insert(ConnectInfo("[2001:db8:1:2:ffff::1]:80".parse::<SocketAddr>()?));
//! key.extract(&RequestHead::of(&req), &mut other)?;
//! assert_eq!(buf.as_bytes(), other.as_bytes());
//!
//! // Without `into_make_service_with_connect_info` there is no peer address: no key.
//! let req = http::Request::new(());
//! assert_eq!(key.extract(&RequestHead::of(&req), &mut KeyBuf::new()), Err(NoKey));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//!
//! The client address behind proxies is the job of [`ClientIpKey`], which only trusts
//! `Forwarded` / `X-Forwarded-For` entries appended by proxies in a configured CIDR list.
//!
//! ## A value in the body (a sign-in form's user name)
//!
//! Extractors see the request's head only: the body is the handler's to read, and has not
//! arrived when the layer decides. To key a sign-in route on the user name in its form (so that
//! guessing one user's password from many addresses counts as one client), read it in a
//! middleware in front of the layer: buffer the body (bounded), put the name in the extensions,
//! and pass the request on with the same bytes. The layer keys on [`ExtensionKey`]; with
//! [`or`]`(ExtensionKey::<SignInUser>::new(), PeerIp::new())` a form without the field counts
//! against the client's address instead of getting the missing-key answer.
//!
//! ```
//! use std::collections::HashMap;
//! use axum::body::Body;
//! use axum::extract::{FromRequest, Request};
//! use axum::http::{StatusCode, header};
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::{Form, Router, routing::post};
//! use tower::ServiceExt;
//! use tower_ratelimit::key::{ExtensionKey, KeyBuf, KeyPart};
//! use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
//!
//! /// The user name a sign-in form gives, as the limit counts it.
//! #[derive(Clone)]
//! struct SignInUser(String);
//! impl KeyPart for SignInUser {
//!     fn write_to(&self, key: &mut KeyBuf) {
//!         self.0.write_to(key)
//!     }
//! }
//!
//! /// Reads the form's `user` into the extensions; the handler gets the body as it came.
//! async fn sign_in_user(req: Request, next: Next) -> Result<Response, StatusCode> {
//!     let (mut parts, body) = req.into_parts();
//!     // A sign-in form is small: a larger body is refused, never buffered whole.
//!     let bytes = axum::body::to_bytes(body, 16 * 1024)
//!         .await
//!         .map_err(|_| StatusCode::PAYLOAD_TOO_LARGE)?;
//!     // (A POST: axum's `Form` reads a GET's query string instead.)
//!     let form = Request::post("/")
//!         .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
//!         .body(Body::from(bytes.clone()))
//!         .map_err(|_| StatusCode::BAD_REQUEST)?;
//!     if let Ok(Form(fields)) = Form::<HashMap<String, String>>::from_request(form, &()).await
//!         && let Some(user) = fields.get("user")
//!     {
//!         // One client whatever the case the name is typed in.
//!         parts.extensions.insert(SignInUser(user.trim().to_lowercase()));
//!     }
//!     Ok(next.run(Request::from_parts(parts, Body::from(bytes))).await)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(2)?)?;
//! let policy = Policy::new("sign-in", limit)?.key(ExtensionKey::<SignInUser>::new());
//! let app = Router::new().route(
//!     "/sign-in",
//!     post(|body: String| async move { format!("checked {} bytes", body.len()) })
//!         // The last layer added runs first: the name is read before the limit is checked.
//!         .route_layer(RateLimitLayer::new(MemoryStore::new(), policy)?)
//!         .route_layer(middleware::from_fn(sign_in_user)),
//! );
//! let sign_in = |form: &'static str| {
//!     Request::post("/sign-in")
//!         .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
//!         .body(Body::from(form))
//! };
//! let mut statuses = Vec::new();
//! for form in ["user=alice&password=a", "user=Alice&password=b", "user=alice&password=c"] {
//!     statuses.push(app.clone().oneshot(sign_in(form)?).await?.status().as_u16());
//! }
//! // Bob is another client; a form without a user has no key (400 by default).
//! statuses.push(app.clone().oneshot(sign_in("user=bob&password=d")?).await?.status().as_u16());
//! statuses.push(app.clone().oneshot(sign_in("password=e")?).await?.status().as_u16());
//! assert_eq!(statuses, [200, 200, 429, 200, 400]);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use crate::{Error, RequestHead};

const INLINE: usize = 64;

/// A key being built. Short keys live on the stack; longer ones move to the heap.
///
/// Extractors append bytes with [`push`](KeyBuf::push) (or any [`KeyPart`]).
pub struct KeyBuf {
    inline: [u8; INLINE],
    /// The key's length: up to `INLINE`, its bytes are `inline`'s first (and `heap` is empty,
    /// its room kept); past it, `heap` holds them all. (Told by the length alone, which every
    /// access reads anyway, rather than by whether `heap` is empty: 6 fewer instructions a
    /// request through the layer.)
    len: usize,
    heap: Vec<u8>,
}

impl KeyBuf {
    /// An empty key.
    #[must_use]
    #[inline]
    pub const fn new() -> Self {
        KeyBuf {
            inline: [0; INLINE],
            len: 0,
            heap: Vec::new(),
        }
    }

    /// Appends bytes.
    #[inline]
    pub fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= INLINE {
            copy_short(&mut self.inline[self.len..end], bytes);
            self.len = end;
        } else {
            self.push_heap(bytes);
        }
    }

    fn push_heap(&mut self, bytes: &[u8]) {
        if self.len <= INLINE {
            debug_assert!(
                self.heap.is_empty(),
                "an inline key has nothing on the heap"
            );
            self.heap.reserve((self.len + bytes.len()).max(2 * INLINE));
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.extend_from_slice(bytes);
        self.len = self.heap.len();
    }

    /// Appends one byte.
    pub fn push_byte(&mut self, b: u8) {
        self.push(&[b]);
    }

    /// The bytes so far.
    #[must_use]
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        if self.len <= INLINE {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }

    /// The number of bytes so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if nothing was written.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `n`, the length of a part just written, so that the parts of a combined key can
    /// be told apart from the end: one byte below 255, else the 8 big-endian bytes of `n` and
    /// then 255.
    fn push_part_len(&mut self, n: usize) {
        match u8::try_from(n) {
            Ok(b) if b < u8::MAX => self.push_byte(b),
            _ => {
                self.push(&(n as u64).to_be_bytes());
                self.push_byte(u8::MAX);
            }
        }
    }

    /// Forgets everything written after the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        if self.len <= INLINE {
            self.len = self.len.min(len);
        } else {
            self.heap.truncate(len);
            self.len = self.heap.len();
            if self.len <= INLINE {
                // Back to fitting inline: its bytes go there, as `len` says.
                self.inline[..self.len].copy_from_slice(&self.heap);
                self.heap.clear();
            }
        }
    }
}

/// A copy made without `Vec::clone`'s call when the bytes are inline (every request's key starts
/// as a clone of its policy's namespace); on the heap, with room to grow as `push` would have
/// left it (one allocation for the key, not two).
impl Clone for KeyBuf {
    #[inline]
    fn clone(&self) -> KeyBuf {
        if self.len <= INLINE {
            KeyBuf {
                inline: self.inline,
                len: self.len,
                heap: Vec::new(),
            }
        } else {
            self.clone_heap()
        }
    }
}

impl KeyBuf {
    /// [`clone`](Clone::clone) of a key on the heap (a namespace of 64 bytes or more). Out of
    /// line: inlined, it made the inline case 12 instructions longer.
    #[inline(never)]
    fn clone_heap(&self) -> KeyBuf {
        let mut heap = Vec::with_capacity(self.heap.len().max(2 * INLINE));
        heap.extend_from_slice(&self.heap);
        KeyBuf {
            inline: self.inline,
            len: self.len,
            heap,
        }
    }
}

/// `dst.copy_from_slice(src)` (same lengths) without a call to `memcpy` for up to 32 bytes, the
/// size of nearly every key part: two fixed-size copies that overlap in the middle. A key is built
/// from two or three such parts on every request, and each `memcpy` call cost more than the copy.
#[inline]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    let n = src.len();
    // Tells the compiler the lengths agree, so the copies below need no bounds checks.
    let dst = &mut dst[..n];
    match n {
        0 => {}
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..].copy_from_slice(&src[n - 4..]);
        }
        8..=15 => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        }
        16..=32 => {
            dst[..16].copy_from_slice(&src[..16]);
            dst[n - 16..].copy_from_slice(&src[n - 16..]);
        }
        _ => dst.copy_from_slice(src),
    }
}

impl Default for KeyBuf {
    fn default() -> Self {
        KeyBuf::new()
    }
}

impl fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyBuf")
            .field(&bytes::Bytes::copy_from_slice(self.as_bytes()))
            .finish()
    }
}

/// No key could be extracted from the request. What happens then is the policy's
/// [`MissingKey`](crate::MissingKey) setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoKey;

impl fmt::Display for NoKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no rate-limit key could be extracted from the request")
    }
}

impl std::error::Error for NoKey {}

/// Finds the key a request counts against.
///
/// Implemented by the built-in extractors, by tuples of extractors and by closures
/// `Fn(&RequestHead<'_>) -> Option<R>` where `R:` [`KeyPart`]. A tuple writes its parts in order,
/// each after the first followed by its length, so that no two tuples of values give the same
/// key (with a separator between them instead, `("a,b", "c")` and `("a", "b,c")` would, for any
/// separator a value may contain).
pub trait KeyExtractor: Send + Sync + 'static {
    /// Appends the request's key to `key`, or says there is none.
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey>;

    /// [`extract`](Self::extract), for a caller to whom a request without this key is expected
    /// (the first extractor of [`or`]): an extractor that warns of a missing key as a likely
    /// mistake of the app's setup ([`ExtensionKey`]) does not. The same as `extract` otherwise.
    /// An extractor made of others (a tuple, [`Or`]) passes it on to them.
    fn extract_if_any(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.extract(req, key)
    }

    /// Whether the request sent this extractor's key in a form it cannot use, rather than not at
    /// all: asked only of a request [`extract`](Self::extract) found no key in. `false`, the
    /// default, for an extractor whose key a request either has or lacks. [`ApiKeyHeader`] says
    /// `true` for its header sent empty or more than once; a tuple or [`Or`] if a part does.
    ///
    /// Such a request is not an anonymous one: an authentication layer in front may have
    /// accepted one of its values. So [`or`] does not fall back to its second extractor for it,
    /// and a policy's [`MissingKey::SharedKey`](crate::MissingKey::SharedKey) does not count it
    /// under the shared key: it gets the missing-key answer (400 under a shared key), as it does
    /// under [`MissingKey::Reject`](crate::MissingKey::Reject). Otherwise a client whose
    /// authentication reads the first of two headers could be served as its valid key while its
    /// requests count against its address or the anonymous clients' bucket instead of the key's.
    fn unusable(&self, req: &RequestHead<'_>) -> bool {
        let _ = req;
        false
    }

    /// What a client should send for this extractor to find a key, in a few words that end the
    /// text of the policy's [`MissingKey`](crate::MissingKey) answer ("No rate-limit key in the
    /// request (send one non-empty x-api-key header)"). Read once, when the layer is built.
    ///
    /// `None`, the default, for a key the client cannot supply by itself (its address, a value
    /// that an earlier layer of the app puts in the extensions): the answer then names nothing,
    /// and gives away nothing of the app's setup. [`ApiKeyHeader`] names its header; a tuple
    /// joins the hints of its parts with "and" (", and" after an "either ... or"), [`or`] says
    /// "either ... or" (either part's alone if the other has none). The hint is fixed per
    /// policy: under a tuple of a header and an extension, a request that sent the header but
    /// lacks the extension is told to send the header all the same.
    fn client_hint(&self) -> Option<String> {
        None
    }

    /// Whether this extractor's key is one value that names the client (a header's value, an
    /// extension's `T`), written by its [`KeyPart`] and nothing else: what
    /// [`Resetter::reset_client`](crate::Resetter::reset_client) writes in its place. `true`,
    /// the default, as for a closure that returns one `KeyPart`. `false` for keys of several
    /// parts (a tuple, [`or`]: reset those with [`Resetter::reset`](crate::Resetter::reset) and a
    /// request that carries them), of the client's address ([`PeerIp`], [`ClientIpKey`]: with
    /// [`Resetter::reset_ip`](crate::Resetter::reset_ip)) or of no client value ([`GlobalKey`],
    /// [`RouteKey`]), or written by a [`from_fn`] closure not said to write one
    /// ([`FromFn::one_part`]): `reset_client` then answers
    /// [`ResetError::NotOneValue`](crate::ResetError::NotOneValue) instead of resetting a key
    /// no request has. Say `false` for an extractor of your own that writes anything else.
    fn one_value(&self) -> bool {
        true
    }
}

/// The hints of all of `parts` that there are, joined with "and" (", and" if one is an "either
/// ... or", so that it reads as one choice): `None` if there is none.
fn all_hints(parts: &[Option<String>]) -> Option<String> {
    let hints: Vec<&str> = parts.iter().filter_map(Option::as_deref).collect();
    let and = if hints.iter().any(|h| h.starts_with("either ")) {
        ", and "
    } else {
        " and "
    };
    (!hints.is_empty()).then(|| hints.join(and))
}

impl<F, R> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Option<R> + Send + Sync + 'static,
    R: KeyPart,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        match self(req) {
            Some(part) => {
                part.write_to(key);
                Ok(())
            }
            None => Err(NoKey),
        }
    }
}

/// Appends `part`'s key followed by its length: read from the end, the length says where the part
/// starts, and the key before it is the parts before it. With `if_any`, by
/// [`extract_if_any`](KeyExtractor::extract_if_any).
#[inline]
fn extract_counted(
    part: &impl KeyExtractor,
    req: &RequestHead<'_>,
    key: &mut KeyBuf,
    if_any: bool,
) -> Result<(), NoKey> {
    let start = key.len();
    extract_part(part, req, key, if_any)?;
    key.push_part_len(key.len() - start);
    Ok(())
}

/// `part`'s key, by [`extract_if_any`](KeyExtractor::extract_if_any) if `if_any`: a tuple under
/// the first extractor of [`or`] passes that on to its parts.
#[inline]
fn extract_part(
    part: &impl KeyExtractor,
    req: &RequestHead<'_>,
    key: &mut KeyBuf,
    if_any: bool,
) -> Result<(), NoKey> {
    if if_any {
        part.extract_if_any(req, key)
    } else {
        part.extract(req, key)
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for (A, B) {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.0.extract(req, key)?;
        extract_counted(&self.1, req, key, false)
    }

    fn extract_if_any(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        extract_part(&self.0, req, key, true)?;
        extract_counted(&self.1, req, key, true)
    }

    fn unusable(&self, req: &RequestHead<'_>) -> bool {
        self.0.unusable(req) || self.1.unusable(req)
    }

    fn client_hint(&self) -> Option<String> {
        all_hints(&[self.0.client_hint(), self.1.client_hint()])
    }

    fn one_value(&self) -> bool {
        false
    }
}

impl<A: KeyExtractor, B: KeyExtractor, C: KeyExtractor> KeyExtractor for (A, B, C) {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.0.extract(req, key)?;
        extract_counted(&self.1, req, key, false)?;
        extract_counted(&self.2, req, key, false)
    }

    fn extract_if_any(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        extract_part(&self.0, req, key, true)?;
        extract_counted(&self.1, req, key, true)?;
        extract_counted(&self.2, req, key, true)
    }

    fn unusable(&self, req: &RequestHead<'_>) -> bool {
        self.0.unusable(req) || self.1.unusable(req) || self.2.unusable(req)
    }

    fn client_hint(&self) -> Option<String> {
        all_hints(&[
            self.0.client_hint(),
            self.1.client_hint(),
            self.2.client_hint(),
        ])
    }

    fn one_value(&self) -> bool {
        false
    }
}

/// The key of the first of two extractors that finds one: `first`'s if the request has it, else
/// `second`'s. For a user id when the client is signed in and its address when it is not (with
/// the default `axum` feature, for [`PeerIp`]):
///
/// ```
/// # #[cfg(feature = "axum")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use tower_ratelimit::{RequestHead, http};
/// use tower_ratelimit::key::{self, ExtensionKey, KeyBuf, KeyExtractor, KeyPart, PeerIp};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl KeyPart for UserId {
///     fn write_to(&self, key: &mut KeyBuf) {
///         self.0.write_to(key)
///     }
/// }
///
/// let key = key::or(ExtensionKey::<UserId>::new(), PeerIp::new());
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(ConnectInfo("192.0.2.7:4000".parse::<SocketAddr>()?));
/// let mut anonymous = KeyBuf::new();
/// key.extract(&RequestHead::of(&req), &mut anonymous)?;
/// req.extensions_mut().insert(UserId(42));
/// let mut signed_in = KeyBuf::new();
/// key.extract(&RequestHead::of(&req), &mut signed_in)?;
/// assert_ne!(anonymous.as_bytes(), signed_in.as_bytes());
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "axum"))]
/// # fn main() {}
/// ```
///
/// The two are told apart by a last byte (1 after `first`'s key, 2 after `second`'s), so a user
/// id never shares a key with an address whose bytes happen to be the same. If neither finds a
/// key, the request has none (the policy's [`MissingKey`](crate::MissingKey) answer). A request
/// without `first`'s key is expected here: an [`ExtensionKey`] first does not warn of it.
///
/// A request that sent `first`'s key in a form it cannot use ([`KeyExtractor::unusable`]: an
/// [`ApiKeyHeader`]'s header twice, or empty) has no key either, and is not given `second`'s:
/// an authentication layer that reads the first of two `x-api-key` headers would serve such a
/// request as its key, while its count went to its address instead of the key's.
pub fn or<A: KeyExtractor, B: KeyExtractor>(first: A, second: B) -> Or<A, B> {
    Or { first, second }
}

/// The key of the first of two extractors that finds one: see [`or`].
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A: KeyExtractor, B: KeyExtractor> Or<A, B> {
    /// `second` by [`extract_if_any`](KeyExtractor::extract_if_any) if `if_any`; `first` always.
    fn extract_or(
        &self,
        req: &RequestHead<'_>,
        key: &mut KeyBuf,
        if_any: bool,
    ) -> Result<(), NoKey> {
        let start = key.len();
        if self.first.extract_if_any(req, key).is_ok() {
            key.push_byte(1);
            return Ok(());
        }
        // Whatever `first` wrote before it found no key is not part of `second`'s.
        key.truncate(start);
        if self.first.unusable(req) {
            return Err(NoKey);
        }
        extract_part(&self.second, req, key, if_any)?;
        key.push_byte(2);
        Ok(())
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.extract_or(req, key, false)
    }

    /// Under the first extractor of another `or` (`or(or(a, b), c)`), neither part's key is
    /// expected either.
    fn extract_if_any(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.extract_or(req, key, true)
    }

    fn unusable(&self, req: &RequestHead<'_>) -> bool {
        self.first.unusable(req) || self.second.unusable(req)
    }

    fn client_hint(&self) -> Option<String> {
        match (self.first.client_hint(), self.second.client_hint()) {
            (Some(first), Some(second)) => Some(format!("either {first} or {second}")),
            (first, second) => first.or(second),
        }
    }

    fn one_value(&self) -> bool {
        false
    }
}

/// A value that can be written into a key.
///
/// Integers are written as fixed-width big-endian bytes, addresses as their octets after a tag
/// byte, text as its bytes.
pub trait KeyPart {
    /// Appends this value to `key`.
    fn write_to(&self, key: &mut KeyBuf);
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_to(&self, key: &mut KeyBuf) {
        (**self).write_to(key)
    }
}

impl KeyPart for str {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(self.as_bytes())
    }
}

impl KeyPart for String {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(self.as_bytes())
    }
}

impl KeyPart for [u8] {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(self)
    }
}

impl KeyPart for Vec<u8> {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(self)
    }
}

impl KeyPart for Bytes {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(self)
    }
}

/// The value without the spaces and tabs around it, as [`ApiKeyHeader`] keys on it
/// ([`header_value_trimmed`]).
impl KeyPart for HeaderValue {
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(header_value_trimmed(self))
    }
}

macro_rules! int_key_part {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_to(&self, key: &mut KeyBuf) {
                key.push(&self.to_be_bytes())
            }
        }
    )*};
}
int_key_part!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

impl KeyPart for IpAddr {
    /// The same encoding as the IP extractors' keys ([`key_bytes`](crate::client_ip::key_bytes)).
    fn write_to(&self, key: &mut KeyBuf) {
        key.push(crate::client_ip::key_bytes(*self).as_bytes());
    }
}

/// The value of a request header, such as an API key.
///
/// A request without the header, with an empty value, or with the header more than once has no
/// key: of two values, an authentication layer in front might check one and this layer count the
/// other, so a client could spend someone else's quota under its own valid key. The last two are
/// [`unusable`](KeyExtractor::unusable) keys, which neither [`or`] nor a shared key takes. One
/// line holding two values (`x-api-key: k1, k2`, which HTTP takes as the header sent twice, and a
/// proxy merging repeated lines writes) is one key here, `k1, k2`, made of both: an
/// authentication layer that reads such a line as a list, or only its first value, must refuse
/// it: else a client authenticated as `k1` is counted under a key it can make anew with every
/// request (`k1, 1`, `k1, 2`, ...), and never reaches a limit.
///
/// Spaces and tabs around the value are not part of it ([`header_value_trimmed`]): HTTP/1's
/// parser drops them, but HTTP/2's and HTTP/3's need not, and `"k"`, `"k "` and `" k"` would
/// otherwise be three keys that an authentication layer trimming the value accepts as one. A
/// value of nothing but spaces and tabs is empty.
///
/// The value is whatever the client sent. Unless the key is checked before this layer runs (an
/// authentication layer outside it that rejects unknown keys), a client can send a new made-up
/// key with every request and never reach a limit, or send someone else's key to spend their
/// quota. Put the rate limit behind authentication, or key on the authenticated identity
/// ([`ExtensionKey`]); a second layer keyed on the client's address ([`ClientIpKey`]) also bounds
/// what one address can send under made-up keys.
#[derive(Debug, Clone)]
pub struct ApiKeyHeader {
    name: HeaderName,
}

impl ApiKeyHeader {
    /// Keys on the header `name` (case-insensitive).
    pub fn new(name: &str) -> Result<Self, Error> {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| Error::InvalidHeaderName {
                name: name.to_owned(),
            })?;
        Ok(ApiKeyHeader { name })
    }

    /// Keys on the header `name`.
    #[must_use]
    pub const fn from_header_name(name: HeaderName) -> Self {
        ApiKeyHeader { name }
    }
}

/// What a request sent of an [`ApiKeyHeader`]'s header.
enum Sent<'h> {
    Nothing,
    /// Empty (or only spaces and tabs), or more than once.
    Unusable,
    Key(&'h [u8]),
}

impl ApiKeyHeader {
    #[inline]
    fn sent<'h>(&self, headers: &'h http::HeaderMap) -> Sent<'h> {
        let mut values = headers.get_all(&self.name).iter();
        match (values.next(), values.next()) {
            (None, _) => Sent::Nothing,
            (Some(v), None) => match header_value_trimmed(v) {
                [] => Sent::Unusable,
                value => Sent::Key(value),
            },
            (Some(_), Some(_)) => Sent::Unusable,
        }
    }
}

impl KeyExtractor for ApiKeyHeader {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        match self.sent(req.headers()) {
            Sent::Key(value) => {
                key.push(value);
                Ok(())
            }
            Sent::Nothing | Sent::Unusable => Err(NoKey),
        }
    }

    /// The header sent, but not once with a value (the request would have a key otherwise).
    fn unusable(&self, req: &RequestHead<'_>) -> bool {
        matches!(self.sent(req.headers()), Sent::Unusable)
    }

    fn client_hint(&self) -> Option<String> {
        Some(format!("one non-empty {} header", self.name))
    }
}

/// The bytes of a header value without the spaces and tabs around them (RFC 9110's optional
/// whitespace, which is not part of a field value: HTTP/1's parser drops it, HTTP/2's and
/// HTTP/3's may pass it on), as [`ApiKeyHeader`] keys on them. For code of the app's that reads
/// the same header (a tier lookup by API key) and must agree with the key.
#[must_use]
pub fn header_value_trimmed(value: &HeaderValue) -> &[u8] {
    value.as_bytes().trim_ascii_start().trim_ascii_end()
}

/// A value of type `T` that an earlier layer (authentication, say) put in the request extensions.
///
/// A request without one has no key. Implement [`KeyPart`] for your type, or use a closure
/// `|req: &RequestHead<'_>| req.extensions().get::<User>().map(|u| u.id)` instead.
///
/// The layer that inserts `T` must run *before* the rate limit, that is outside it: with axum's
/// `Router::layer` (each call wraps what is there) add it after the rate-limit layer,
/// `.layer(rate_limit).layer(auth)`; in a tower `ServiceBuilder` (the first listed runs first)
/// list it before, `.layer(auth).layer(rate_limit)`. The other way round no request has a `T`
/// yet when the limiter looks, and every one gets the policy's
/// [`MissingKey`](crate::MissingKey) answer (400 by default). The first request without a `T`
/// is therefore logged at `warn` level, once per `ExtensionKey` (a policy's key, shared by every
/// clone of its layer and services), naming the type and this fix; if some requests carry no
/// `T` on purpose (anonymous clients under
/// [`MissingKey::shared_key`](crate::MissingKey::shared_key)), that one line is all.
pub struct ExtensionKey<T> {
    /// Whether a request without a `T` has been warned of (see `ExtensionKey::missing`).
    warned: AtomicBool,
    _t: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys on the extension of type `T`.
    #[must_use]
    pub const fn new() -> Self {
        ExtensionKey {
            warned: AtomicBool::new(false),
            _t: PhantomData,
        }
    }

    /// A request without a `T`: most likely the layer that inserts it runs after this one, a
    /// mistake of the app's setup that every request then meets. Said once per extractor at
    /// `warn` level, with the fix; out of line, so that the path of a request with a key does
    /// not carry it.
    #[cold]
    #[inline(never)]
    fn missing(&self) -> NoKey {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "rate-limit key: no `{}` found in the request extensions, so ExtensionKey finds \
                 no key and the request gets the policy's missing-key answer (400 by default); \
                 the layer that inserts it (an authentication layer) must run before the rate \
                 limit, outside it: with `Router::layer`, add it after the rate-limit layer \
                 (`.layer(rate_limit).layer(auth)`); with `ServiceBuilder`, list it before \
                 (`.layer(auth).layer(rate_limit)`) (said once; harmless if some requests carry \
                 none on purpose)",
                std::any::type_name::<T>()
            );
        }
        NoKey
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        ExtensionKey::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> KeyExtractor for ExtensionKey<T>
where
    T: KeyPart + Send + Sync + 'static,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.extract_if_any(req, key)
            .map_err(|NoKey| self.missing())
    }

    fn extract_if_any(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        let value = req.extensions().get::<T>().ok_or(NoKey)?;
        value.write_to(key);
        Ok(())
    }
}

/// A key extractor made of a closure that writes the key into the buffer itself (see
/// [`from_fn`]).
#[derive(Clone, Copy)]
pub struct FromFn<F> {
    f: F,
    one_part: bool,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn(..)")
    }
}

/// A key extractor from a closure that appends the request's key to the [`KeyBuf`] it is given
/// (with [`KeyBuf::push`], or any [`KeyPart`]'s `write_to`), or answers [`NoKey`]. Unlike a
/// closure that returns its key, its argument types are inferred, and it can write bytes it
/// borrows from the request without copying them into an owned value first. What it wrote before
/// answering `NoKey` is not used.
///
/// Since the closure may write anything (a tenant and a user, say),
/// [`Resetter::reset_client`](crate::Resetter::reset_client) answers
/// [`ResetError::NotOneValue`](crate::ResetError::NotOneValue) for its key unless told otherwise
/// with [`FromFn::one_part`]; [`Resetter::reset`](crate::Resetter::reset) resets it with a
/// request that carries it.
///
/// It never says that a request sent its key in a form it cannot use
/// ([`KeyExtractor::unusable`]): its `NoKey` reads as no key at all, which [`or`] and a policy's
/// [`MissingKey::SharedKey`](crate::MissingKey::SharedKey) serve as an anonymous request. For a
/// header, use [`ApiKeyHeader`] (see [the module docs](self)).
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&RequestHead<'_>, &mut KeyBuf) -> Result<(), NoKey> + Send + Sync + 'static,
{
    FromFn { f, one_part: false }
}

impl<F> FromFn<F> {
    /// Says that the closure writes one value that names the client, with its [`KeyPart`]'s
    /// `write_to` and nothing else (a header's value, a user id): then
    /// [`Resetter::reset_client`](crate::Resetter::reset_client) resets the client by that
    /// value, written the same way. A closure that writes anything more (a second part, a
    /// separator) would have `reset_client` reset a key no request has: leave this unsaid for it.
    ///
    /// ```
    /// use tower_ratelimit::key::{KeyPart, NoKey, from_fn};
    ///
    /// let user = from_fn(|req, key| {
    ///     req.headers().get("x-user").ok_or(NoKey)?.write_to(key);
    ///     Ok(())
    /// })
    /// .one_part();
    /// # let _ = user;
    /// ```
    #[must_use]
    pub fn one_part(self) -> Self {
        FromFn {
            one_part: true,
            ..self
        }
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&RequestHead<'_>, &mut KeyBuf) -> Result<(), NoKey> + Send + Sync + 'static,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        (self.f)(req, key)
    }

    fn one_value(&self) -> bool {
        self.one_part
    }
}

/// One key for every request: the policy limits the whole route (or app) together.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _req: &RequestHead<'_>, _key: &mut KeyBuf) -> Result<(), NoKey> {
        Ok(())
    }

    /// No client value: reset the one key with [`Resetter::reset`](crate::Resetter::reset) and
    /// any request.
    fn one_value(&self) -> bool {
        false
    }
}

/// The request's method and matched route (axum's `MatchedPath`, such as `/users/{id}`), never
/// the raw path: a client choosing paths cannot create keys at will.
///
/// Nor can it multiply keys with method names: `HEAD` counts as `GET` (axum answers a `HEAD`
/// with the `GET` handler, so the two are one quota), and every method outside RFC 9110's eight
/// and `PATCH` shares the marker `OTHER`. The standard methods count apart, so a route that
/// serves several (`any(..)`) has a quota per method; leave `RouteKey` out of the key, or key
/// on `MatchedPath` alone with a closure, to count them together. Requests with no matched route
/// (outside a router, or a fallback) share the marker `<unmatched>`, and so do the requests below
/// a service mounted with `Router::nest_service` (axum sets no `MatchedPath` for its
/// `{prefix}/{*tail}` route): the paths under every `nest_service` mount share one key per client
/// with the 404s, while the mount's own path and that path with a slash (`/auth`, `/auth/`) are
/// matched routes with a key each (axum 0.8). Mount a `Router` with `Router::nest` instead (its
/// routes are matched: `/api/users/{id}`), or key such a mount with a closure on a fixed prefix.
/// Combine it with a client key to limit each client per route:
/// `(RouteKey::new(), ApiKeyHeader::new("x-api-key")?)`.
///
/// A request built to reset a client ([`Resetter::reset`](crate::Resetter::reset) from an admin
/// route) has no `MatchedPath`, which only a router sets: it names its route with a
/// [`ResetRoute`] in its extensions, else it names `<unmatched>`. A handler's reset with its
/// own request finds the route its router matched: under a `nest_service("/auth", ..)` mount,
/// the mounted router's (`/auth/login`), not the `<unmatched>` a layer outside the mount
/// counted; there, build the request without a route, or put the layer inside the mount.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey {
    _priv: (),
}

impl RouteKey {
    /// The method and matched route.
    #[must_use]
    pub const fn new() -> Self {
        RouteKey { _priv: () }
    }
}

/// The route a request built for a reset names, for [`RouteKey`]: put in its extensions in place
/// of axum's `MatchedPath`, which only a router sets, so that an admin route can reset a client
/// of a policy keyed by the route (a router's `MatchedPath` comes first). Only for requests
/// built for a [`Resetter`](crate::Resetter): in a request the layer checks, it would name the
/// key counted.
///
/// ```
/// use tower_ratelimit::key::{ApiKeyHeader, ResetRoute, RouteKey};
/// use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer, RequestHead, http};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3)?)?;
/// let policy = Policy::new("login", limit)?.key((RouteKey::new(), ApiKeyHeader::new("x-user")?));
/// let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
/// // Support lets alice try `GET /login` again (the route as `MatchedPath` gives it).
/// let mut alice = http::Request::get("/login").header("x-user", "alice").body(())?;
/// alice.extensions_mut().insert(ResetRoute::new("/login"));
/// layer.resetter().reset(&RequestHead::of(&alice)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ResetRoute(std::sync::Arc<str>);

impl ResetRoute {
    /// `route` as axum's `MatchedPath` gives it: the route as declared, after the prefixes of
    /// the `Router::nest` calls above it (`/api/users/{id}` for `/users/{id}` nested at `/api`).
    #[must_use]
    pub fn new(route: &str) -> Self {
        ResetRoute(route.into())
    }
}

impl KeyExtractor for RouteKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        key.push(method_name(req.method()).as_bytes());
        key.push_byte(b' ');
        #[cfg(feature = "axum")]
        if let Some(path) = req.extensions().get::<axum::extract::MatchedPath>() {
            key.push(path.as_str().as_bytes());
            return Ok(());
        }
        // A request built for a reset, naming its route (looked for only here, off the path of
        // matched requests).
        if let Some(route) = req.extensions().get::<ResetRoute>() {
            key.push(route.0.as_bytes());
            return Ok(());
        }
        // A request that only carries a client's address, made by `Resetter::reset_ip`, has
        // no route: none of the client's requests has the key `<unmatched>` would make
        // (looked for only here, off the path of matched requests).
        #[cfg(feature = "axum")]
        if req.extensions().get::<AddressOnly>().is_some() {
            return Err(NoKey);
        }
        key.push(b"<unmatched>");
        Ok(())
    }

    fn one_value(&self) -> bool {
        false
    }
}

/// In the extensions of the request [`Resetter::reset_ip`](crate::Resetter::reset_ip) makes of
/// an address: it carries nothing else of a client's requests, so [`RouteKey`] finds no route
/// in it.
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddressOnly;

/// The method as [`RouteKey`] writes it: `HEAD` as `GET`, and any method that is not standard as
/// `OTHER`, so that neither multiplies a route's quota.
fn method_name(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET | Method::HEAD => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

/// The TCP peer's address, from axum's `ConnectInfo<SocketAddr>` (serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`).
///
/// IPv6 peers are grouped by their first 64 bits by default (one client holds at least a whole
/// /64; see [`ClientIp`](crate::client_ip::ClientIp) on shorter delegations and on link-local
/// peers). A request without `ConnectInfo` has no key.
///
/// Behind a reverse proxy every request comes from the proxy: use [`ClientIpKey`] there.
#[cfg(feature = "axum")]
#[derive(Debug, Clone)]
pub struct PeerIp {
    /// A client-IP key that trusts no proxy, so it never reads the headers.
    inner: ClientIpKey,
}

#[cfg(feature = "axum")]
impl PeerIp {
    /// The peer address, IPv6 grouped by /64.
    #[must_use]
    pub fn new() -> Self {
        PeerIp {
            inner: ClientIpKey::new(crate::client_ip::ClientIp::peer()),
        }
    }

    /// Groups IPv6 peers by their first `bits` bits (0 to 128; 128 keys each address alone).
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, Error> {
        Ok(PeerIp {
            inner: ClientIpKey::new(self.inner.client_ip.ipv6_prefix(bits)?),
        })
    }
}

#[cfg(feature = "axum")]
impl Default for PeerIp {
    fn default() -> Self {
        PeerIp::new()
    }
}

/// The TCP peer: axum's `ConnectInfo<SocketAddr>` (from `into_make_service_with_connect_info`), or
/// in tests the address set with axum's `MockConnectInfo` layer.
#[cfg(feature = "axum")]
#[inline]
fn peer_addr<'a>(req: &RequestHead<'a>) -> Option<&'a std::net::SocketAddr> {
    use axum::extract::ConnectInfo;
    use axum::extract::connect_info::MockConnectInfo;
    use std::net::SocketAddr;
    // A reference, read in place by the caller: copying the `SocketAddr` out first made rustc
    // move its 14 unaligned bytes of a V6 through two overlapping stack words, and reading them
    // back stalled on store forwarding (half of this function's time, per `perf annotate`).
    match req.extensions().get::<ConnectInfo<SocketAddr>>() {
        Some(c) => Some(&c.0),
        None => req
            .extensions()
            .get::<MockConnectInfo<SocketAddr>>()
            .map(|m| &m.0),
    }
}

/// A request without the peer's address: the app is served without connect info, a mistake of
/// the server's setup rather than the client's, which every request then meets. Said once per
/// process at `warn` level, with the fix; each request is still answered as the policy's
/// [`MissingKey`](crate::MissingKey) says.
#[cfg(feature = "axum")]
#[cold]
#[inline(never)]
fn no_connect_info() -> NoKey {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "rate-limit key: the request has no ConnectInfo<SocketAddr>, so PeerIp and ClientIpKey \
             find no client address and every request gets the policy's missing-key answer (400 \
             by default); serve the app with \
             `into_make_service_with_connect_info::<SocketAddr>()` (said once per process)"
        );
    }
    NoKey
}

/// A policy's key extractor as `call` runs it: a built-in extractor whose type is known, run in
/// place (inlined), or any other through the policy's `Arc<dyn KeyExtractor>`. The same
/// extraction either way; the dynamic call and the extractor's own frame cost about 30
/// instructions a request.
#[derive(Debug, Clone)]
pub(crate) enum FastKey {
    /// Through the policy's `Arc<dyn KeyExtractor>`.
    Dyn,
    /// A [`PeerIp`] (a client-IP key that trusts no proxy) or a [`ClientIpKey`].
    #[cfg(feature = "axum")]
    ClientIp(ClientIpKey),
}

impl FastKey {
    /// How `call` runs `key`.
    pub(crate) fn of<K: KeyExtractor>(key: &K) -> FastKey {
        #[cfg(feature = "axum")]
        {
            let any: &dyn std::any::Any = key;
            if let Some(peer) = any.downcast_ref::<PeerIp>() {
                return FastKey::ClientIp(peer.inner.clone());
            }
            if let Some(client_ip) = any.downcast_ref::<ClientIpKey>() {
                return FastKey::ClientIp(client_ip.clone());
            }
        }
        let _ = key;
        FastKey::Dyn
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for PeerIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        self.inner.extract(req, key)
    }

    fn one_value(&self) -> bool {
        false
    }
}

/// The client's address behind trusted reverse proxies: the TCP peer from axum's
/// `ConnectInfo<SocketAddr>`, then `X-Forwarded-For` or `Forwarded` read right to left by a
/// [`ClientIp`](crate::client_ip::ClientIp), skipping only the configured proxies, and grouped by
/// its IPv6 prefix (/64 by default).
///
/// A client that connects directly cannot choose its key by sending the header: the headers are
/// read only when the peer is a trusted proxy. A request without `ConnectInfo` has no key.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use tower_ratelimit::client_ip::ClientIp;
/// use tower_ratelimit::{RequestHead, http};
/// use tower_ratelimit::key::{ClientIpKey, KeyBuf, KeyExtractor, KeyPart};
///
/// // Our load balancers' own addresses (not a network that has clients in it).
/// let key = ClientIpKey::new(ClientIp::behind_proxies(["10.0.0.10/32", "10.0.0.11/32"])?);
/// let request = |peer: &str| -> Result<_, Box<dyn std::error::Error>> {
///     let mut req = http::Request::get("/")
///         .header("x-forwarded-for", "6.6.6.6, 198.51.100.7")
///         .body(())?;
///     req.extensions_mut().insert(ConnectInfo(peer.parse::<SocketAddr>()?));
///     Ok(req)
/// };
/// let ip = |s: &str| -> Result<Vec<u8>, Box<dyn std::error::Error>> {
///     let mut buf = KeyBuf::new();
///     s.parse::<std::net::IpAddr>()?.write_to(&mut buf);
///     Ok(buf.as_bytes().to_vec())
/// };
///
/// // Through our proxy: the entry it appended.
/// let mut buf = KeyBuf::new();
/// key.extract(&RequestHead::of(&request("10.0.0.10:4000")?), &mut buf)?;
/// assert_eq!(buf.as_bytes(), ip("198.51.100.7")?);
///
/// // Straight from the internet: the header is ignored, the peer is the key.
/// let mut buf = KeyBuf::new();
/// key.extract(&RequestHead::of(&request("203.0.113.9:4000")?), &mut buf)?;
/// assert_eq!(buf.as_bytes(), ip("203.0.113.9")?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "axum")]
#[derive(Debug, Clone)]
pub struct ClientIpKey {
    client_ip: crate::client_ip::ClientIp,
}

#[cfg(feature = "axum")]
impl ClientIpKey {
    /// Keys on the client address that `client_ip` finds.
    #[must_use]
    pub fn new(client_ip: crate::client_ip::ClientIp) -> Self {
        ClientIpKey { client_ip }
    }

    /// The configuration.
    #[must_use]
    pub fn client_ip(&self) -> &crate::client_ip::ClientIp {
        &self.client_ip
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for ClientIpKey {
    // Always: `call` runs it in place for a `FastKey::ClientIp` (see there), where `#[inline]`
    // alone was not taken.
    #[inline(always)]
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), NoKey> {
        let peer = peer_addr(req).ok_or_else(no_connect_info)?;
        let client_ip = &self.client_ip;
        match peer {
            // The peer-IP key's IPv4 client, written from the address's 4 bytes: going through
            // the 17-byte `IpAddr` (see `resolve`) split it into bytes and moved them one by one.
            std::net::SocketAddr::V4(v4) if client_ip.trusts_none() => {
                let [a, b, c, d] = client_ip.mask_v4(*v4.ip()).octets();
                key.push(&[crate::client_ip::IpKey::V4_TAG, a, b, c, d]);
            }
            _ => client_ip.resolve(peer.ip(), req.headers()).write_to(key),
        }
        Ok(())
    }

    fn one_value(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy's `PeerIp` or `ClientIpKey` is run in place (`FastKey`), with the same key as
    /// through its `dyn KeyExtractor`, or the same missing key; any other extractor is not.
    #[cfg(feature = "axum")]
    #[test]
    fn fast_key_extracts_as_the_extractor_does() {
        use axum::extract::ConnectInfo;
        use std::net::SocketAddr;
        use std::sync::Arc;

        let extractors: Vec<Arc<dyn KeyExtractor>> = vec![
            Arc::new(PeerIp::new()),
            Arc::new(PeerIp::new().ipv6_prefix(48).unwrap()),
            Arc::new(ClientIpKey::new(
                crate::client_ip::ClientIp::behind_proxies(["10.0.0.10/32"]).unwrap(),
            )),
        ];
        let fast: Vec<FastKey> = vec![
            FastKey::of(&PeerIp::new()),
            FastKey::of(&PeerIp::new().ipv6_prefix(48).unwrap()),
            FastKey::of(&ClientIpKey::new(
                crate::client_ip::ClientIp::behind_proxies(["10.0.0.10/32"]).unwrap(),
            )),
        ];
        let request = |peer: Option<&str>| {
            let mut req = http::Request::get("/")
                .header("x-forwarded-for", "198.51.100.7, 203.0.113.9")
                .body(())
                .unwrap();
            if let Some(peer) = peer {
                req.extensions_mut()
                    .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
            }
            req
        };
        let peers = [
            Some("192.0.2.1:5000"),
            Some("10.0.0.10:4000"),
            Some("[2001:db8:1:2:3:4:5:6]:443"),
            None,
        ];
        for (dynamic, fast) in extractors.iter().zip(&fast) {
            let FastKey::ClientIp(fast) = fast else {
                panic!("a client-IP extractor is run in place")
            };
            for peer in peers {
                let req = request(peer);
                let head = RequestHead::of(&req);
                let (mut a, mut b) = (KeyBuf::new(), KeyBuf::new());
                a.push(b"ns\0");
                b.push(b"ns\0");
                let found = (dynamic.extract(&head, &mut a), fast.extract(&head, &mut b));
                assert_eq!(found.0.is_ok(), found.1.is_ok(), "{peer:?}");
                assert_eq!(a.as_bytes(), b.as_bytes(), "{peer:?}");
            }
        }
        assert!(matches!(FastKey::of(&GlobalKey), FastKey::Dyn));
        assert!(matches!(
            FastKey::of(&ApiKeyHeader::new("x-api-key").unwrap()),
            FastKey::Dyn
        ));
    }

    /// A clone has the same bytes and is independent, inline or on the heap.
    #[test]
    fn keybuf_clone_is_independent() {
        for len in [0usize, 5, INLINE, INLINE + 1, 300] {
            let mut k = KeyBuf::new();
            k.push(&vec![9u8; len]);
            let mut c = k.clone();
            assert_eq!(c.as_bytes(), k.as_bytes());
            assert!(c.heap.capacity() == 0 || c.heap.capacity() >= 2 * INLINE);
            c.push(b"x");
            assert_eq!(k.len(), len);
            assert_eq!(c.as_bytes()[..len], *k.as_bytes());
            assert_eq!(c.as_bytes()[len..], *b"x");
        }
    }

    #[test]
    fn keybuf_spills_to_the_heap_and_back() {
        let mut k = KeyBuf::new();
        k.push(b"abc");
        assert_eq!(k.as_bytes(), b"abc");
        let long = [7u8; 200];
        k.push(&long);
        assert_eq!(k.len(), 203);
        assert_eq!(&k.as_bytes()[..3], b"abc");
        k.truncate(3);
        assert_eq!(k.as_bytes(), b"abc");
        k.push(b"d");
        assert_eq!(k.as_bytes(), b"abcd");
    }

    /// A closure extractor that answers a fixed value (`None`: no key).
    fn fixed(v: Option<Vec<u8>>) -> impl KeyExtractor {
        move |_: &RequestHead<'_>| v.clone()
    }

    fn key_of(extractor: &impl KeyExtractor) -> Option<Vec<u8>> {
        let req = http::Request::new(());
        let mut key = KeyBuf::new();
        extractor
            .extract(&RequestHead::of(&req), &mut key)
            .ok()
            .map(|()| key.as_bytes().to_vec())
    }

    #[test]
    fn combined_keys_are_unambiguous() {
        let s = |v: &[u8]| fixed(Some(v.to_vec()));
        assert_eq!(key_of(&(s(b"ab"), s(b"c"))).unwrap(), b"abc\x01");
        assert_ne!(
            key_of(&(s(b"a\x1fb"), s(b"c"))),
            key_of(&(s(b"a"), s(b"b\x1fc")))
        );
        assert_ne!(
            key_of(&(s(b"a\x01"), s(b""))),
            key_of(&(s(b"a"), s(b"\x01\x00")))
        );
        // A long part's length takes 9 bytes.
        let long = vec![7u8; 300];
        let key = key_of(&(s(b"a"), s(&long))).unwrap();
        assert_eq!(key.len(), 1 + 300 + 9);
        assert_eq!(&key[301..], [0, 0, 0, 0, 0, 0, 1, 44, 255]);
        assert_eq!(key_of(&(s(b"a"), fixed(None))), None);
        assert_eq!(key_of(&(s(b"a"), s(b"b"), fixed(None))), None);
    }

    proptest::proptest! {
        /// Two different tuples of values never give the same key, for pairs and triples of any
        /// bytes (separator-like bytes and long parts included), and equal ones always do. The
        /// second tuple is the first one's bytes split at other places (the way two tuples could
        /// collide), the first one itself, or bytes of its own.
        #[test]
        fn distinct_tuples_give_distinct_keys(
            a in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::prop_oneof![
                        proptest::strategy::Just(0u8),
                        proptest::strategy::Just(1u8),
                        proptest::strategy::Just(0x1fu8),
                        proptest::strategy::Just(0xffu8),
                        proptest::prelude::any::<u8>(),
                    ],
                    0..12,
                ),
                3,
            ),
            own in proptest::collection::vec(proptest::prelude::any::<Vec<u8>>(), 3),
            how in 0u8..3,
            cuts in proptest::prelude::any::<(proptest::sample::Index, proptest::sample::Index)>(),
            long in proptest::prelude::any::<bool>(),
        ) {
            let mut a = a;
            if long {
                a[1].resize(260, 0x1f);
            }
            let b = match how {
                0 => {
                    // The same bytes, split at two other places.
                    let all = a.concat();
                    let (x, y) = (cuts.0.index(all.len() + 1), cuts.1.index(all.len() + 1));
                    let (x, y) = (x.min(y), x.max(y));
                    vec![all[..x].to_vec(), all[x..y].to_vec(), all[y..].to_vec()]
                }
                1 => a.clone(),
                _ => own,
            };
            let s = |v: &Vec<u8>| fixed(Some(v.clone()));
            let pair = |v: &[Vec<u8>]| key_of(&(s(&v[0]), s(&v[1]))).unwrap();
            let triple = |v: &[Vec<u8>]| key_of(&(s(&v[0]), s(&v[1]), s(&v[2]))).unwrap();
            proptest::prop_assert_eq!(pair(&a) == pair(&b), a[..2] == b[..2]);
            proptest::prop_assert_eq!(triple(&a) == triple(&b), a == b);
        }

        /// What an address appends is exactly `key_bytes`, for every address: IPv4, IPv6 and
        /// IPv4-mapped IPv6 (encoded as IPv4), after whatever the key holds already.
        #[test]
        fn written_ip_keys_are_key_bytes(
            v6: u128,
            v4: u32,
            prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            use std::net::{Ipv4Addr, Ipv6Addr};
            let mapped = IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_mapped());
            for addr in [IpAddr::V6(Ipv6Addr::from(v6)), IpAddr::V4(Ipv4Addr::from(v4)), mapped] {
                let mut key = KeyBuf::new();
                key.push(&prefix);
                addr.write_to(&mut key);
                let mut want = prefix.clone();
                want.extend_from_slice(&crate::client_ip::key_bytes(addr));
                proptest::prop_assert_eq!(key.as_bytes(), &want[..]);
            }
        }
    }

    /// The client-IP key is `key_bytes` of what `ClientIp::resolve` answers, on the peer-IP fast
    /// path (an IPv4 peer, no proxy trusted) and off it: IPv4 prefixes, IPv6 and IPv4-mapped
    /// peers, trusted proxies, after a prefix already in the key.
    #[cfg(feature = "axum")]
    #[test]
    fn client_ip_key_is_the_resolved_address() {
        use crate::client_ip::{ClientIp, key_bytes};
        use axum::extract::ConnectInfo;
        use std::net::SocketAddr;
        let configs = [
            ClientIp::peer(),
            ClientIp::peer().ipv4_prefix(24).unwrap(),
            ClientIp::peer().ipv4_prefix(0).unwrap(),
            ClientIp::peer().ipv6_prefix(128).unwrap(),
            ClientIp::behind_proxies(["10.0.0.0/8"]).unwrap(),
        ];
        let peers = [
            "192.0.2.77:1",
            "10.1.2.3:2",
            "[::ffff:192.0.2.77]:3",
            "[::ffff:10.1.2.3]:4",
            "[2001:db8::1:2:3:4]:5",
        ];
        for config in configs {
            let extractor = ClientIpKey::new(config.clone());
            for peer in peers {
                let peer: SocketAddr = peer.parse().unwrap();
                let mut req = http::Request::get("/")
                    .header("x-forwarded-for", "198.51.100.9")
                    .body(())
                    .unwrap();
                req.extensions_mut().insert(ConnectInfo(peer));
                let mut key = KeyBuf::new();
                key.push(b"prefix:");
                extractor.extract(&RequestHead::of(&req), &mut key).unwrap();
                let mut want = b"prefix:".to_vec();
                want.extend_from_slice(&key_bytes(config.resolve(peer.ip(), req.headers())));
                assert_eq!(key.as_bytes(), &want[..], "{config:?} {peer}");
            }
        }
    }

    /// Every length of each of two parts, through the inline copies of every size class and the
    /// spill to the heap, gives the bytes pushed.
    #[test]
    fn keybuf_holds_exactly_the_bytes_pushed() {
        let bytes: Vec<u8> = (0..80u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(1))
            .collect();
        for first in 0..=70 {
            for second in 0..=40 {
                let mut k = KeyBuf::new();
                k.push(&bytes[..first]);
                k.push(&bytes[first..][..second.min(80 - first)]);
                let mut want = bytes[..first].to_vec();
                want.extend_from_slice(&bytes[first..][..second.min(80 - first)]);
                assert_eq!(k.as_bytes(), want, "{first} then {second}");
            }
        }
    }

    #[test]
    fn bad_header_name_is_an_error() {
        assert!(matches!(
            ApiKeyHeader::new("bad header"),
            Err(Error::InvalidHeaderName { .. })
        ));
    }
}
