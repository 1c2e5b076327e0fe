//! [`spawn`]: where a store's own tasks run (connections' openings, probes and watches,
//! [`Coalescing`](crate::Coalescing)'s batches, [`LazyRedisStore`](crate::LazyRedisStore)'s
//! attempts).
//!
//! Other runtimes' checks wait on these tasks, and a connection's I/O is driven by a task that
//! redis-rs spawns where the connection is made. A current-thread runtime runs its tasks only
//! while something drives it: a check made in one whose `block_on` then returned would leave
//! its task unpolled, and every other runtime's checks of its key, or on its connection, waiting
//! for good. A multi-thread runtime runs its tasks on its workers until it shuts down.

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;

/// Spawns `task` on the current runtime if it is a multi-thread one, else on `home`, the runtime
/// the store was made on. The current runtime first, so that a store whose home runtime shut
/// down (a store shared by several runtimes) still mends its connections on the others.
pub(crate) fn spawn<F>(home: &Handle, task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match Handle::try_current() {
        Ok(current) if current.runtime_flavor() != RuntimeFlavor::CurrentThread => {
            current.spawn(task)
        }
        _ => home.spawn(task),
    }
}
