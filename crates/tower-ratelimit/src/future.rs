//! The response future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::{BodyMode, WrapBody};
use crate::reset::ResetMark;
use crate::service::Post;

pub(crate) type Waiting<R, E> =
    Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send + 'static>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): `F` is the inner service's future,
    /// `B` the inner service's response body, `E` its error, and `M` the [`BodyMode`], which
    /// gives the body of the layer's responses (`ResponseBody<B>` by default).
    ///
    /// When the store answered at once (the in-memory store always does), this is the inner
    /// service's future, or a response the layer wrote itself: nothing is boxed. Only a store that
    /// has to wait (a network store) moves the check into a boxed future with its timeout.
    pub struct ResponseFuture<F, B, E, M = WrapBody>
    where
        M: BodyMode<B>,
    {
        #[pin]
        kind: Kind<F, M::Body, E>,
        // What to add to the inner service's response (`Kind::Inner` and `Kind::Marked` only),
        // taken when it comes.
        // Beside the enum rather than in its variant, so that the inner future is written in
        // place when `call` builds this one.
        post: Option<Post>,
        _mode: PhantomData<fn() -> (B, M)>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, R, E> {
        Inner { #[pin] fut: F },
        // The inner service's future for a request marked for a `Resetter` (see
        // `Shared::mark`): if a handler reset the client, the fields tell the full quota.
        Marked { #[pin] fut: F, mark: Arc<ResetMark> },
        Ready { response: Option<Response<R>> },
        Waiting { fut: Waiting<R, E> },
    }
}

impl<F, B, E, M: BodyMode<B>> ResponseFuture<F, B, E, M> {
    pub(crate) fn inner(fut: F, post: Option<Post>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { fut },
            post,
            _mode: PhantomData,
        }
    }

    /// [`inner`](Self::inner) for a request marked for a `Resetter`.
    pub(crate) fn marked(fut: F, post: Option<Post>, mark: Arc<ResetMark>) -> Self {
        ResponseFuture {
            kind: Kind::Marked { fut, mark },
            post,
            _mode: PhantomData,
        }
    }

    pub(crate) fn ready(response: Response<M::Body>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
            post: None,
            _mode: PhantomData,
        }
    }

    pub(crate) fn waiting(fut: Waiting<M::Body, E>) -> Self {
        ResponseFuture {
            kind: Kind::Waiting { fut },
            post: None,
            _mode: PhantomData,
        }
    }
}

impl<F, B, E, M: BodyMode<B>> fmt::Debug for ResponseFuture<F, B, E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Inner { .. } | Kind::Marked { .. } => "Inner",
            Kind::Ready { .. } => "Ready",
            Kind::Waiting { .. } => "Waiting",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B, E, M> Future for ResponseFuture<F, B, E, M>
where
    F: Future<Output = Result<Response<B>, E>>,
    M: BodyMode<B>,
{
    type Output = Result<Response<M::Body>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            // Nothing to add (no fields, no verdict): the inner future's answer as it is, without
            // moving it through `Post`.
            KindProj::Inner { fut } if this.post.is_none() => M::poll_inner(fut, cx),
            // The response is made this mode's where the inner future writes it, and the fields
            // and verdict are added to it there (no move of the response through `Post`).
            KindProj::Inner { fut } => {
                let mut out = M::poll_inner(fut, cx);
                // Taken only with the response: a pending poll keeps it for the next.
                if let Poll::Ready(Ok(response)) = &mut out
                    && let Some(post) = this.post.take()
                {
                    post.apply_to(response);
                }
                out
            }
            KindProj::Marked { fut, mark } => {
                let mut out = M::poll_inner(fut, cx);
                if let Poll::Ready(Ok(response)) = &mut out
                    && let Some(post) = this.post.take()
                {
                    post.apply_after_reset(response, mark.is_set());
                }
                out
            }
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}
