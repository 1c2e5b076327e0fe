//! The `Store` trait: where limit state lives.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{Decision, Limit};

/// Where limit state lives: in this process ([`MemoryStore`](crate::MemoryStore)) or shared by a
/// fleet of gateways (the Redis store of the `ratelimit-redis` crate).
///
/// A check is one atomic read-modify-write of the key's state: two concurrent checks never spend
/// the same token. The trait is runtime-agnostic: the in-memory store's future is complete when
/// `check` returns, and a network store's may need a runtime of its choice to make progress.
///
/// A caller may poll the future once where the check is made, on a thread that may have no async
/// runtime at all (the tower layer's `call` does, so that an answer ready at once needs no timer
/// and no allocation). A store whose future needs a runtime there (for a timer or a connection)
/// should then wake its task and return `Pending` rather than panic, and go on at its next poll
/// (the Redis store's does).
///
/// State is kept per (key, limit): the same key under two different limits is two states.
pub trait Store: Send + Sync + 'static {
    /// Why a check could not be made (the store could not be reached, say). A denial is never an
    /// error: it is a [`Decision`].
    type Error: std::error::Error + Send + Sync + 'static;

    /// The future of one check. It owns what it needs (`'static`), so a middleware can hold it,
    /// and is `Unpin`, so that a caller can poll it in place (the tower layer's `call` does, once,
    /// so that an answer ready at once needs no allocation): `std::future::Ready` is, and so is
    /// a boxed future (`Pin<Box<dyn Future ..>>`), which an `async` block needs.
    type Future: Future<Output = Result<Decision, Self::Error>> + Send + Unpin + 'static;

    /// Checks `cost` units for `key` against `limit`, consuming them if allowed.
    ///
    /// A cost of 0 is a peek: it reports the state and consumes nothing. A cost larger than the
    /// limit can ever hold is a denial that says so ([`Outcome::Exceeds`](crate::Outcome::Exceeds)).
    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future;

    /// How many parts of this store can fail apart from one another (at least 1; 1 by default).
    ///
    /// A store whose keys live on several servers (Redis Cluster: each master serves its own
    /// ranges of hash slots) can lose one server while the others answer. A caller that keeps
    /// the store's health, as the tower layer's circuit breaker does, keeps it per part: the
    /// failures of one server's keys then stop the checks of that part only, and the other
    /// servers' keys go on being checked.
    ///
    /// The tower layer reads it once, when it is built, and keeps at most 4,096 circuits (a
    /// larger domain is taken modulo the circuits it keeps).
    fn failure_domains(&self) -> usize {
        1
    }

    /// Which part of this store answers for `key` (below [`failure_domains`](Store::failure_domains);
    /// 0 by default).
    ///
    /// The same key must always map to the same part, whatever happens to the store: a caller's
    /// circuit for a part is probed only by that part's keys, so a part that loses its keys
    /// while its circuit is open stays open for good. (A Redis Cluster store's parts are ranges
    /// of hash slots, not its masters, which change.) It is called on the request path, when a
    /// caller needs the part: make it cheap.
    fn failure_domain(&self, key: &[u8]) -> usize {
        let _ = key;
        0
    }

    /// How long one check may wait for the store before the store itself gives up on it (`None`,
    /// the default: it never waits, as the in-memory store, or sets no bound of its own).
    ///
    /// A caller that gives up sooner (the tower layer, after its timeout) leaves the check
    /// running in the store until then: a store whose connections are judged silent, or
    /// reopened, after this long then reacts that much later to a server that stops answering.
    /// The tower layer reads it once, when it is built, and warns when it is more than twice its
    /// own timeout and more than 50 ms above it. A wrapper of another store passes on the
    /// wrapped store's (as it does [`failure_domains`](Store::failure_domains)); the default
    /// would hide it.
    fn response_timeout(&self) -> Option<Duration> {
        None
    }

    /// The check's answer if this store holds it in front of the store it wraps, without
    /// calling that store: a denial it has cached ([`DenialCache`](crate::DenialCache)), units
    /// of a lease it holds ([`Leasing`](crate::Leasing), which spends them as
    /// [`check`](Store::check) would). `None` (the default) if the answer would need the store.
    /// The answer is marked [`cached`](Decision::is_cached).
    ///
    /// A caller that will not call the store asks this instead: the tower layer does while the
    /// key's circuit is open, so that a client known to be over its limit is still denied during
    /// an outage (rather than let through by a fail-open policy, or answered 503 by a
    /// fail-closed one). A wrapper of another store passes it on, as it does
    /// [`failure_domains`](Store::failure_domains); the default would hide what the wrapped
    /// store holds.
    fn check_cached(&self, key: &[u8], limit: &Limit, cost: u64) -> Option<Decision> {
        let _ = (key, limit, cost);
        None
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    type Error = S::Error;
    type Future = S::Future;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        (**self).check(key, limit, cost)
    }

    fn failure_domains(&self) -> usize {
        (**self).failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        (**self).failure_domain(key)
    }

    fn response_timeout(&self) -> Option<Duration> {
        (**self).response_timeout()
    }

    fn check_cached(&self, key: &[u8], limit: &Limit, cost: u64) -> Option<Decision> {
        (**self).check_cached(key, limit, cost)
    }
}

/// The error of a store that cannot fail.
pub type NoError = Infallible;
