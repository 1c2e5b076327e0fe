//! [`Home`]: where the layer's background tasks run (a check run on to its answer after its
//! request was dropped, to settle the circuit breaker; a `reset_on` reset made after its response
//! was dropped).
//!
//! A multi-thread runtime runs its tasks on its workers until it shuts down; a current-thread
//! runtime only while something drives it. A task spawned on one whose `block_on` then returned
//! stays unpolled: a probe's answer never settles its circuit (which refuses every check, on
//! every runtime, until the probe is taken as lost), a dropped check's timeout never counts, a
//! reset's caches never forget the client. So such a task goes to the runtime the layer was
//! built on if that is a multi-thread runtime still running, else to the current runtime, as
//! before. (ratelimit-redis places its store's tasks by the same rule; the two crates share no
//! code, tower-ratelimit depending on no store.)

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
        // Only a multi-thread runtime is ever preferred: no need to watch another.
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

    /// Spawns `task` on the layer's runtime if it is a multi-thread runtime still running, else
    /// on the current runtime; `Err(task)` outside any runtime, when neither can take it.
    pub(crate) fn spawn<F>(&self, task: F) -> Result<JoinHandle<F::Output>, F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if let Some((handle, watch)) = &self.0
            && !watch.gone.load(Ordering::Acquire)
        {
            return Ok(handle.spawn(task));
        }
        match Handle::try_current() {
            Ok(current) => Ok(current.spawn(task)),
            Err(_) => Err(task),
        }
    }
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Home").finish_non_exhaustive()
    }
}
