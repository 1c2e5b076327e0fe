//! The `Reset` trait: forgetting one client's state.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::{Limit, Store};

/// A [`Store`] that can forget one key's state under one limit, so that the key's next check
/// counts from a full quota, as a new key's would.
///
/// What it is for: letting a client back in at once (support lifting a block), or counting only
/// what should count, as a login limit that forgets a user's failed attempts once they sign in.
/// In the tower layer, `RateLimitLayer::resetter` resets the key a request would be checked
/// under.
///
/// - **Scope.** One (key, limit): the same key under another limit keeps its state. Every state
///   the limit's check reads is forgotten together (all its quotas, and a sliding log's entries).
/// - **Concurrency.** A check that runs concurrently with the reset counts either before it (and
///   is forgotten with the rest) or after it (and counts against the fresh quota), never half of
///   each. A check of this process that had already read the state before the reset completed
///   may answer from what it read, as any check answers from the state of its instant.
/// - **Wrappers.** [`DenialCache`](crate::DenialCache) and [`Leasing`](crate::Leasing) implement
///   it over a store that does. The cache's denials of the key end when the reset completes (or
///   is dropped, since the store may have reset all the same), and a denial read before then is
///   not cached afterwards (a check of another key of the cache in flight across the reset
///   costs one more store call). The key's lease ends when the reset is made and again when it
///   completes, and a lease asked for before then keeps none of its units but its own check's:
///   they were counted against the state the reset forgot, or, if the request reached the store
///   only after the reset (a queue in front of the store, such as `Coalescing`'s, may send it
///   later), against the fresh quota, which then admits up to one lease fewer: never more than
///   a full quota after a reset. What *other* processes hold in front of a shared store is not
///   reached by the reset itself: another gateway's cached denial stands until its deadline (at
///   most its `retry_after`), and its lease until it is spent or expires (at most one lease, as
///   leasing's bound allows anyway), unless that gateway hears of the reset and ends them
///   ([`DenialCache::forget`](crate::DenialCache::forget),
///   [`Leasing::forget`](crate::Leasing::forget); the Redis store announces its resets and
///   watches for other gateways' when asked to).
/// - **Failure.** `Err` means the store could not be reached: the state may or may not have been
///   forgotten (a reset that timed out may still run). Resetting again is harmless. A wrapper's
///   reset dropped before its answer (a caller's timeout) that the store runs later ends the
///   key's cached denials and lease at the drop, not at that run: a denial cached or a lease
///   taken in between outlives the reset (a cached denial up to its `retry_after`; a lease's
///   units on top of the fresh quota). Reset again once the store answers, or, over Redis, watch
///   resets: the late reset's own announcement then ends them.
///
/// ```
/// use std::future::Future;
/// use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota, Reset};
///
/// # fn now<F: Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
/// #         std::task::Poll::Ready(out) => out,
/// #         std::task::Poll::Pending => unreachable!("the in-memory store answers at once"),
/// #     }
/// # }
/// let store = MemoryStore::builder().with_clock(ManualClock::new()).build()?;
/// let login = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3)?)?;
/// for _ in 0..3 {
///     assert!(store.check_now(b"alice", &login, 1).is_allowed());
/// }
/// assert!(!store.check_now(b"alice", &login, 1).is_allowed());
/// // Alice signed in: her failed attempts are forgotten.
/// now(store.reset(b"alice", &login)).unwrap();
/// assert_eq!(store.check_now(b"alice", &login, 1).remaining(), 2);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
pub trait Reset: Store {
    /// The future of one reset. Like [`Store::Future`], it owns what it needs and is `Unpin`.
    type ResetFuture: Future<Output = Result<(), Self::Error>> + Send + Unpin + 'static;

    /// Forgets `key`'s state under `limit`. Resetting a key that holds no state does nothing
    /// and succeeds.
    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture;
}

impl<S: Reset + ?Sized> Reset for Arc<S> {
    type ResetFuture = S::ResetFuture;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        (**self).reset(key, limit)
    }
}

/// A store wrapper that keeps some of a shared store's answers in this process
/// ([`DenialCache`](crate::DenialCache)'s denials, [`Leasing`](crate::Leasing)'s leases), and so
/// must hear of a reset made through another process to end what it holds of the client: what a
/// watch of announced resets hands its notices to (the Redis store's `watch_resets`, whose
/// `ResetNotice::apply` calls these).
pub trait Forget {
    /// Ends what is held of `key` under the limit whose [`fingerprint`](Limit::fingerprint) is
    /// `limit_fingerprint`, as the wrapper's own reset of it does once the store has reset.
    fn forget(&self, key: &[u8], limit_fingerprint: u64);

    /// Resets may have been made that this process did not hear of (its watch was not
    /// subscribed for a while): ends what any of them may have ended. A `DenialCache` drops
    /// every denial ([`clear`](crate::DenialCache::clear): one more store call per client, never
    /// a stale denial); `Leasing` keeps its leases (a lease a missed reset should have ended
    /// admits at most its own units beyond a full quota, within leasing's bound of one lease per
    /// gateway, and ends when spent or expired), whose answers, until the key's next store
    /// answer, imply no denial to a `DenialCache` above (their reset may be the forgotten
    /// state's).
    fn forget_unheard(&self);
}

impl<T: Forget + ?Sized> Forget for Arc<T> {
    fn forget(&self, key: &[u8], limit_fingerprint: u64) {
        (**self).forget(key, limit_fingerprint);
    }

    fn forget_unheard(&self) {
        (**self).forget_unheard();
    }
}

/// The future of a wrapper's reset ([`DenialCache`](crate::DenialCache),
/// [`Leasing`](crate::Leasing)): the wrapped store's reset, then what the wrapper does once it is
/// done (end what it holds of the key), before the answer is returned; also if the future is
/// dropped first, since the store may have reset all the same.
pub struct WrapperResetFuture<F> {
    fut: F,
    /// Run when the reset completes, or when the future is dropped before.
    then: Option<Box<dyn FnOnce() + Send>>,
}

impl<F> WrapperResetFuture<F> {
    /// The wrapped store's reset `fut`, then `then`.
    pub(crate) fn new(fut: F, then: impl FnOnce() + Send + 'static) -> Self {
        WrapperResetFuture {
            fut,
            then: Some(Box::new(then)),
        }
    }

    fn run_then(&mut self) {
        if let Some(then) = self.then.take() {
            then();
        }
    }
}

impl<F> Drop for WrapperResetFuture<F> {
    fn drop(&mut self) {
        self.run_then();
    }
}

impl<F> fmt::Debug for WrapperResetFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrapperResetFuture")
            .field("done", &self.then.is_none())
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for WrapperResetFuture<F>
where
    F: Future<Output = Result<(), E>> + Unpin,
{
    type Output = Result<(), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = std::task::ready!(Pin::new(&mut self.fut).poll(cx));
        // Before the answer is returned, so that a check made after it finds nothing the
        // wrapper held of the key.
        self.run_then();
        Poll::Ready(out)
    }
}
