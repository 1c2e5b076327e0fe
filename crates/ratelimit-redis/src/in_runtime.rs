//! [`in_runtime`]: a check's first step, which lets a check made outside a Tokio runtime be
//! polled there without panicking.
//!
//! A check's future starts timers and takes connections, which need a Tokio runtime (with its
//! time driver). A caller may poll it once where the check is made, outside any runtime: the
//! tower layer's `call` does, so that an answer that is ready at once (an in-memory store, a
//! cached denial) needs no timer and no allocation. There the future yields instead of panicking,
//! and goes on at its next poll, inside the runtime that awaits the response. A future polled
//! outside a runtime again (an executor other than Tokio's) gets a typed error.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::RedisStoreError;

/// Ready once polled inside a Tokio runtime. At a first poll outside one it wakes its task and
/// yields; at a later poll still outside one it is [`RedisStoreError::NoRuntime`].
pub(crate) fn in_runtime() -> InRuntime {
    InRuntime { yielded: false }
}

pub(crate) struct InRuntime {
    yielded: bool,
}

impl Future for InRuntime {
    type Output = Result<(), RedisStoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if tokio::runtime::Handle::try_current().is_ok() {
            Poll::Ready(Ok(()))
        } else if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        } else {
            Poll::Ready(Err(RedisStoreError::NoRuntime))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Outside a runtime: one yield that wakes the task, then a typed error; inside one, ready.
    #[test]
    fn yields_once_outside_a_runtime_then_errs_and_is_ready_inside_one() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = count.clone().into();
        let mut cx = Context::from_waker(&waker);
        let mut fut = in_runtime();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "woken to be polled again"
        );
        assert!(matches!(
            Pin::new(&mut fut).poll(&mut cx),
            Poll::Ready(Err(RedisStoreError::NoRuntime))
        ));

        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut fut = in_runtime();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        let _guard = rt.enter();
        assert!(matches!(
            Pin::new(&mut fut).poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }
}
