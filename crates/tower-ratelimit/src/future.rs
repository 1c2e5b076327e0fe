//! The response future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::service::Post;

pub(crate) type Waiting<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    ///
    /// When the store answered at once (the in-memory store always does), this is the inner
    /// service's future, or a response the layer wrote itself: nothing is boxed. Only a store that
    /// has to wait (a network store) moves the check into a boxed future with its timeout.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // `post` is taken when the inner future completes.
        Inner { #[pin] fut: F, post: Option<Post> },
        Ready { response: Option<Response<ResponseBody<B>>> },
        Waiting { fut: Waiting<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(fut: F, post: Option<Post>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { fut, post },
        }
    }

    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn waiting(fut: Waiting<B, E>) -> Self {
        ResponseFuture {
            kind: Kind::Waiting { fut },
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Ready { .. } => "Ready",
            Kind::Waiting { .. } => "Waiting",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { fut, post } => {
                let response = ready!(fut.poll(cx))?;
                Poll::Ready(Ok(Post::apply_some(post.take(), response)))
            }
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}
