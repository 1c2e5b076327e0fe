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
///
/// # Writing a store
///
/// A store of another crate (over a database, say) makes the same decisions as this crate's by
/// keeping one [`State`](crate::State) per quota of the limit, starting from
/// [`Limit::fresh_states`], and running [`Limit::check`] on them, which checks every quota
/// all-or-nothing and reports which quota binds: no algorithm needs writing again. What the rest
/// of this workspace relies on:
///
/// - **Exact decisions.** The wrappers and the tower layer compute from a decision's fields, so
///   they must be the algorithms', not rounded: a denial's `retry_after` is the first instant
///   the same cost passes ([`DenialCache`](crate::DenialCache) denies until then without asking),
///   `remaining` and `reset_after` are exact ([`Leasing`](crate::Leasing) asks for `remaining`
///   units and sizes leases from `reset_after`; the layer's `RateLimit` field is built from
///   them). A store that keeps whole seconds of TTL must not round the reset it reports.
/// - **One atomic step per check.** Read the states, check, and write them back only if the
///   check was allowed with a cost above 0, as one atomic operation of the backend (a
///   transaction, a compare-and-set retried on conflict, a server-side script): two gateways
///   must never spend the same unit. Keep the state of every quota of a limit under one key,
///   so that all or none are written. Let it expire at [`Limit::fresh_at`] (a missing state and
///   a fresh one decide alike).
/// - **The key.** `key` is the client's identity as bytes, from the request: any byte (the tower
///   layer writes `<policy name>\0` before the parts it extracted), any length. Store it under
///   a digest if the backend limits keys (the Redis store hashes keys over 64 bytes), and add
///   [`Limit::fingerprint`] (or the limit's own encoding) so that two limits never share a
///   state.
/// - **The clock.** Read the time once per check, from one clock every writer shares: the
///   backend's own if it has one, else [`WallClock`](crate::WallClock) on synchronised hosts.
///   Gateways whose clocks disagree count the same state at different times.
/// - **Cancellation.** The future may be dropped at any point (the caller's timeout, a client
///   gone) or moved to a task of its own and run to its deadline (the layer's circuit breaker
///   does, to learn the store's health). A check that failed or was dropped may have been
///   counted: never send an ambiguous write again, as it could count a request twice.
/// - **No blocking, no panics.** `check` and the future's polls run on the request path, the
///   first poll outside any runtime and with a waker that does nothing (see above): never block
///   the thread (a synchronous client belongs on a thread pool), and register the waker of each
///   poll, not only the first. A panic unwinds through the caller.
/// - **Errors.** Return `Err` only when the store could not decide. The tower layer counts every
///   `Err` against the store's health (its circuit breaker) and answers it by the route's
///   failure policy; it logs the error's `Display` at WARN, so keep secrets (passwords in
///   connection strings) out of it. An answer made up during an outage is not an error, and is
///   taken as the store's.
/// - **Showing it.** [`conformance::check_store`](crate::conformance::check_store) runs a store
///   on a clock the test sets through a table of 19,275 checks over every algorithm and compares
///   each decision, every field, with the algorithms'. The Redis store (on a client clock) and
///   the example below pass all of it; the in-memory store, which never counts at a time before
///   one it counted at, passes the scenarios whose time never goes back.
///   [`conformance::check_limits_apart`](crate::conformance::check_limits_apart) checks one key
///   under several limits. Neither shows that a check is one atomic step: see the
///   [kit's docs](crate::conformance).
/// - **Resetting.** A store that can forget a client implements [`Reset`](crate::Reset) as well:
///   delete the key's state under the limit in one step, and let a missing state decide as a
///   fresh one ([`conformance::check_reset`](crate::conformance::check_reset) shows it).
///
/// A store over a map in this process (the shape of one over a database: load, check, write
/// back, in one step under a lock):
///
/// ```
/// use std::collections::HashMap;
/// use std::convert::Infallible;
/// use std::sync::Mutex;
/// use ratelimit_core::{Algorithm, Clock, Decision, Limit, ManualClock, Quota, State, Store};
///
/// struct MapStore<C> {
///     clock: C,
///     states: Mutex<HashMap<(Vec<u8>, u64), Vec<State>>>,
/// }
///
/// impl<C: Clock + 'static> Store for MapStore<C> {
///     type Error = Infallible;
///     type Future = std::future::Ready<Result<Decision, Infallible>>;
///
///     fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
///         let now = self.clock.now();
///         let id = (key.to_vec(), limit.fingerprint());
///         let mut map = self.states.lock().unwrap();
///         let mut states = map.get(&id).cloned().unwrap_or_else(|| limit.fresh_states(now));
///         let decision = limit.check(&mut states, now, cost);
///         // Written back only if admitted at a cost: a peek or a denial changes nothing.
///         if decision.is_allowed() && cost > 0 {
///             map.insert(id, states);
///         }
///         std::future::ready(Ok(decision))
///     }
/// }
///
/// fn now<F: std::future::Future>(f: F) -> F::Output {
///     let waker = std::task::Waker::noop();
///     match std::pin::pin!(f).poll(&mut std::task::Context::from_waker(waker)) {
///         std::task::Poll::Ready(out) => out,
///         std::task::Poll::Pending => unreachable!("the map answers at once"),
///     }
/// }
///
/// let clock = ManualClock::new();
/// let store = MapStore { clock: clock.clone(), states: Mutex::default() };
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(2)?)?;
/// let check = |cost| now(store.check(b"client", &limit, cost)).unwrap();
/// assert!(check(1).is_allowed() && check(1).is_allowed());
/// let denied = check(1);
/// assert_eq!(denied.retry_after(), Some(std::time::Duration::from_secs(30)));
///
/// // The same decisions as the algorithms', field by field, in every scenario of the kit.
/// let table = ratelimit_core::conformance::scenarios();
/// let report = now(ratelimit_core::conformance::check_store(&store, &clock, b"kit:", &table));
/// assert_eq!(report.unwrap().decisions, 19_275);
/// // And one key under several limits, each counted apart.
/// let apart = now(ratelimit_core::conformance::check_limits_apart(&store, &clock, b"kit:"));
/// assert_eq!(apart.unwrap().decisions, 100);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
///
/// (A real one also drops states once fresh, as [`MemoryStore`](crate::MemoryStore) does, or lets
/// its backend expire them; one that drops them by the time its checks are given then runs the
/// kit's [monotone](crate::conformance::Scenario::monotone) scenarios, as the in-memory store
/// does: see the [kit's docs](crate::conformance).)
pub trait Store: Send + Sync + 'static {
    /// Why a check could not be made (the store could not be reached, say). A denial is never an
    /// error: it is a [`Decision`]. See [Writing a store](Store#writing-a-store) for what a caller
    /// does with one.
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
