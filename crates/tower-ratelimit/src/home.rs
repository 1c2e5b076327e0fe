//! [`Home`]: where the layer's background tasks run (a check run on to its answer after its
//! request was dropped, to settle the circuit breaker; a `reset_on` reset made after its response
//! was dropped).
//!
//! A multi-thread runtime runs its tasks on its workers until it shuts down; a current-thread
//! runtime only while something drives it. A task spawned on one whose `block_on` then returned
//! stays unpolled: a probe's answer never settles its circuit (which refuses every check, on
//! every runtime, until the probe is taken as lost), a dropped check's timeout never counts, a
//! reset's caches never forget the client. So such a task goes to the current runtime if it is a
//! multi-thread one (unless it refuses it, shutting down), else to the runtime the layer was built
//! on if that is a multi-thread runtime still running, else to the current (current-thread)
//! runtime, as before. The layer's runtime must then have timers (`Runtime::new` and
//! `#[tokio::main]` enable them): a task's timer made on one without panics there, a dropped
//! check counting as a store failure. These tasks end within the layer's timeout, so the runtime at hand is preferred to
//! one that may have been configured otherwise (without timers, say) or be shutting down.
//! (ratelimit-redis places its store's long-lived tasks, connections among them, by a like rule
//! that prefers the store's own runtime; the crates share no code, tower-ratelimit depending on
//! no store.)

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;

/// The runtime the layer was built on, if it was built in one, and whether that still runs.
#[derive(Clone)]
pub(crate) struct Home(Option<(Handle, Arc<Watch>)>);

/// Set when the runtime shuts down, by the drop of a task that waits on it for as long as the
/// layer lives (a runtime drops its tasks as it shuts down). Dropped with the layer's last
/// `Home`, which ends that task.
struct Watch {
    gone: Arc<AtomicBool>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Held by the waiting task: its drop marks the runtime gone (or the layer dropped, when no one
/// reads the mark any more).
struct Sentinel(Arc<AtomicBool>);

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Home {
    /// No runtime: tasks go to the current one.
    pub(crate) fn none() -> Home {
        Home(None)
    }

    /// The current runtime, if any.
    pub(crate) fn current() -> Home {
        let Ok(handle) = Handle::try_current() else {
            return Home(None);
        };
        // Only a multi-thread runtime is ever preferred: no need to watch another. (Its timers
        // are taken on trust: tokio tells whether a runtime has them only by panicking at the
        // making of one, which a panic hook sees, and `panic = "abort"` cannot catch.)
        if handle.runtime_flavor() == RuntimeFlavor::CurrentThread {
            return Home(None);
        }
        let gone = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sentinel = Sentinel(Arc::clone(&gone));
        handle.spawn(async move {
            let _sentinel = sentinel;
            // Ends when the layer's last `Home` drops its sender (or with the runtime).
            let _ = stopped.await;
        });
        Home(Some((handle, Arc::new(Watch { gone, _stop: stop }))))
    }

    /// Spawns `task` on the current runtime if it is a multi-thread one, else on the layer's
    /// runtime if it is a multi-thread runtime still running, else on the current runtime;
    /// `Err(task)` when none can take it: outside any runtime, or every runtime at hand shutting
    /// down (then the task is not to be run in place either). A runtime that refuses the task
    /// (shutting down: the drop that makes it may be its own shutdown's) hands it on to the
    /// next; the layer's, refusing, is marked gone there and then (its watch's own task may be
    /// dropped well after). The handle's output is `None` only for a task that a current-thread
    /// runtime refused (dropped unrun).
    pub(crate) fn spawn<F>(&self, task: F) -> Result<JoinHandle<Option<F::Output>>, F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let current = Handle::try_current().ok();
        if let Some(current) = &current
            && current.runtime_flavor() != RuntimeFlavor::CurrentThread
        {
            return match spawn_unless_refused(current, task) {
                Ok(spawned) => Ok(spawned),
                Err(task) => self.spawn_home(task),
            };
        }
        match (self.spawn_home(task), current) {
            (Ok(spawned), _) => Ok(spawned),
            (Err(task), Some(current)) => Ok(current.spawn(async move { Some(task.await) })),
            (Err(task), None) => Err(task),
        }
    }

    /// Spawns `task` on the layer's runtime if it is still running, else gives it back.
    fn spawn_home<F>(&self, task: F) -> Result<JoinHandle<Option<F::Output>>, F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some((handle, watch)) if !watch.gone.load(Ordering::Acquire) => {
                spawn_unless_refused(handle, task).inspect_err(|_| {
                    watch.gone.store(true, Ordering::Release);
                })
            }
            _ => Err(task),
        }
    }
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
        f.debug_struct("Home").finish_non_exhaustive()
    }
}
