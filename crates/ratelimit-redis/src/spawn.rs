//! [`Home`]: where a store's own tasks run (connections' openings, probes and watches,
//! [`Coalescing`](crate::Coalescing)'s batches, [`LazyRedisStore`](crate::LazyRedisStore)'s
//! attempts).
//!
//! Other runtimes' checks wait on these tasks, and a connection's I/O is driven by a task that
//! redis-rs spawns where the connection is made. A multi-thread runtime runs its tasks on its
//! workers until it shuts down; a current-thread runtime only while something drives it (a
//! check's task left on one whose `block_on` then returned stays unpolled, and every other
//! runtime's checks of its key, or on its connection, wait for it). So a task goes to the
//! runtime the store was built on if that is a multi-thread runtime still running, else to the
//! runtime of the check that needs it (the store's runtime may be gone: a store built on a
//! set-up runtime and used on others), else, outside any runtime, to the store's.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;

/// The runtime a store was built on, and whether it still runs. Public in a private module only
/// for the sealed trait of the stores `Coalescing` wraps.
#[derive(Clone)]
pub struct Home {
    handle: Handle,
    watch: Arc<Watch>,
}

/// Spawns `task` on `handle`, or gives it back if the runtime refused it: tokio cancels a task
/// spawned on a runtime that is shutting down at once, unrun, so that its handle is finished
/// before `spawn` returns, with the task still in its slot (a task that ran took it out).
fn spawn_unless_refused<F>(handle: &Handle, task: F) -> Result<JoinHandle<Option<F::Output>>, F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let slot = Arc::new(Mutex::new(Some(task)));
    let theirs = Arc::clone(&slot);
    let spawned = handle.spawn(async move {
        let task = theirs.lock().unwrap_or_else(PoisonError::into_inner).take();
        match task {
            Some(task) => Some(task.await),
            None => None,
        }
    });
    if spawned.is_finished()
        && let Some(task) = slot.lock().unwrap_or_else(PoisonError::into_inner).take()
    {
        return Err(task);
    }
    Ok(spawned)
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Home")
            .field("gone", &self.is_gone())
            .finish_non_exhaustive()
    }
}

/// Set when the runtime shuts down: by the drop of a task that waits on it for as long as the
/// store lives (a runtime drops its tasks as it shuts down). Dropped with the store's last
/// `Home`, which ends that task.
struct Watch {
    gone: Arc<AtomicBool>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Held by the waiting task: its drop marks the runtime gone (or the store dropped, when no one
/// reads the mark any more).
struct Sentinel(Arc<AtomicBool>);

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Home {
    /// The current runtime, or `None` outside one.
    pub(crate) fn current() -> Option<Home> {
        let handle = Handle::try_current().ok()?;
        let gone = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sentinel = Sentinel(Arc::clone(&gone));
        handle.spawn(async move {
            let _sentinel = sentinel;
            // Ends when the store's last `Home` drops its sender (or with the runtime).
            let _ = stopped.await;
        });
        Some(Home {
            handle,
            watch: Arc::new(Watch { gone, _stop: stop }),
        })
    }

    /// Whether the runtime has shut down.
    pub(crate) fn is_gone(&self) -> bool {
        self.watch.gone.load(Ordering::Acquire)
    }

    /// Spawns `task`: on this runtime if it is a multi-thread runtime still running, else on the
    /// current runtime, else (outside any) on this one, running or not (a task dropped unrun
    /// there is ended by its own guard, as every one of the store's tasks has). A runtime that
    /// refuses the task (shutting down, which may take a while before the watch's own task is
    /// dropped) is marked gone there and then, and the task goes on as if it had been.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task =
            if self.handle.runtime_flavor() != RuntimeFlavor::CurrentThread && !self.is_gone() {
                match spawn_unless_refused(&self.handle, task) {
                    Ok(_) => return,
                    Err(task) => {
                        self.watch.gone.store(true, Ordering::Release);
                        task
                    }
                }
            } else {
                task
            };
        match Handle::try_current() {
            Ok(current) => drop(current.spawn(task)),
            Err(_) => drop(self.handle.spawn(task)),
        }
    }
}
