//! The response body: the inner service's, or one the layer wrote (a 429, a 503, a 400).
//!
//! A [`BodyMode`] says how the layer's responses carry it. [`WrapBody`], the default, works with
//! any inner body whose data chunks can be made from [`Bytes`] (nearly every body: axum's, hyper's,
//! `Full<Bytes>`; not `Full<&str>`): responses carry a [`ResponseBody`] that is either the inner body or the
//! layer's own. [`SameBody`] ([`RateLimitLayer::same_body`](crate::RateLimitLayer::same_body))
//! keeps the inner body type, for bodies that can be made from [`Bytes`] such as axum's `Body`:
//! axum then has no second box to make, and a stack typed on `Response<axum::body::Body>` needs
//! no mapping.
//!
//! ```
//! use axum::{Router, routing::get};
//! use tower_ratelimit::{Algorithm, Limit, MemoryStore, Quota};
//! use tower_ratelimit::{Policy, RateLimitLayer};
//!
//! let policy = Policy::new("api", Limit::single(Algorithm::Gcra, Quota::per_second(10)?)?)?;
//! let layer = RateLimitLayer::new(MemoryStore::new(), policy)?.same_body();
//! let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// How the responses of [`RateLimit`](crate::RateLimit) carry their body: [`WrapBody`] (the
/// default, any body whose chunks can be made from [`Bytes`]) or [`SameBody`] (the inner body type, for bodies made from [`Bytes`]). See
/// the [module docs](self).
///
/// Sealed: the two modes are the crate's. With [`SameBody`], a body that cannot be made from
/// [`Bytes`] leaves `RateLimit` without a `Service` impl (the compiler says the `Service` bound is
/// not satisfied): use the default mode for such bodies.
pub trait BodyMode<B>: private::Sealed + Send + Sync + 'static {
    /// The body of the layer's responses.
    type Body;

    /// The inner service's body, as the layer's.
    #[doc(hidden)]
    fn inner(body: B) -> Self::Body;

    /// A complete body the layer wrote.
    #[doc(hidden)]
    fn full(data: Bytes) -> Self::Body;

    /// The inner service's future polled, its response's body made this mode's. For
    /// [`SameBody`] this is the inner future's answer as it is, written straight into the
    /// caller's place instead of moved out and back (a copy of the whole response).
    #[doc(hidden)]
    fn poll_inner<F, E>(
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<Self::Body>, E>>
    where
        F: Future<Output = Result<Response<B>, E>>;
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::WrapBody {}
    impl Sealed for super::SameBody {}
}

/// Responses carry a [`ResponseBody<B>`]: the inner body, or the layer's own. Works with any body
/// whose data chunks can be made from [`Bytes`]. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct WrapBody;

impl<B> BodyMode<B> for WrapBody
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Body = ResponseBody<B>;

    #[inline]
    fn inner(body: B) -> ResponseBody<B> {
        ResponseBody::inner(body)
    }

    fn full(data: Bytes) -> ResponseBody<B> {
        ResponseBody::full(data)
    }

    #[inline]
    fn poll_inner<F, E>(
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<Self::Body>, E>>
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        fut.poll(cx)
            .map_ok(|response| response.map(ResponseBody::inner))
    }
}

/// Responses keep the inner service's body type `B`, and the layer's own bodies are made with
/// `B::from(Bytes)`. Chosen with [`RateLimitLayer::same_body`](crate::RateLimitLayer::same_body).
///
/// The layer's own bodies are never empty, except a custom denial body that is, and the gRPC
/// answers of [`DenialBody::Grpc`](crate::DenialBody::Grpc): those become
/// `B::from(Bytes::new())`, and whether that reports the end of the stream at once is up to `B`
/// (axum's `Body` and `Full` do). A gRPC answer needs it: a trailers-only response ends its
/// stream with its headers, and a client such as grpc-go fails the call if an empty data frame
/// follows them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SameBody;

impl<B> BodyMode<B> for SameBody
where
    B: Body + From<Bytes>,
{
    type Body = B;

    #[inline]
    fn inner(body: B) -> B {
        body
    }

    fn full(data: Bytes) -> B {
        B::from(data)
    }

    #[inline]
    fn poll_inner<F, E>(fut: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<Result<Response<B>, E>>
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        fut.poll(cx)
    }
}

pin_project! {
    /// The body of a response from [`RateLimit`](crate::RateLimit): the inner service's body, or
    /// the complete body of an answer the layer gave itself.
    ///
    /// It works with any inner body whose data chunks can be made from [`Bytes`] (axum's `Body`,
    /// `Full<Bytes>`, `String`, ...). Its error type is the inner body's.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

/// An empty body, whatever `B` is. Middleware that answers with a body of its inner service's
/// body type made by `Default` (tower-http's `TimeoutLayer` on a timeout, its `CorsLayer` for a
/// preflight) can then sit outside the layer in its default body mode.
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::full(Bytes::new())
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(B::Data::from(d)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
