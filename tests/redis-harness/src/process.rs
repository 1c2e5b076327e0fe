//! Programs that start servers and stop on a signal: [`interrupted`], which they stop on (so
//! that the servers they started go with them), and processes seen from `/proc`, for the tests
//! that check it.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// The pids of the processes running now (those `/proc` lists).
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
}

/// `pid`'s name and the fields of `/proc/<pid>/stat` after it (from the 3rd, its state), or
/// `None` if no such process runs. (`pid (name) state ppid ...`; the name may hold spaces and
/// parentheses: the last `)` ends it.)
fn stat(pid: u32) -> Option<(String, Vec<String>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(').map_or("", |(_, c)| c).to_owned();
    Some((name, rest.split_whitespace().map(str::to_owned).collect()))
}

/// The pids of the processes whose parent is `parent` and whose name is `name`.
pub fn children_named(parent: u32, name: &str) -> Vec<u32> {
    pids()
        .filter(|&pid| {
            stat(pid).is_some_and(|(comm, fields)| {
                comm == name && fields.get(1).and_then(|p| p.parse().ok()) == Some(parent)
            })
        })
        .collect()
}

/// `pid` as `<pid>.<start time>` (the start time in clock ticks since boot, `/proc/<pid>/stat`'s
/// 22nd field), so that a process given the pid of one that ended is not taken for it; `None` if
/// no such process runs.
pub(crate) fn identity(pid: u32) -> Option<String> {
    let (_, fields) = stat(pid)?;
    Some(format!("{pid}.{}", fields.get(19)?))
}

/// What a server's directory name holds before the [`identity`] of the process that started it
/// (`redis-harness-owner-<pid>.<start>-…`), the server's working directory: so that a server left
/// behind by a process that ended without stopping it can be told ([`kill_orphans`]). (Not its
/// environment: `redis-server` writes its process title over it.)
pub(crate) const OWNER_TAG: &str = "owner-";

/// Kills (SIGKILL) the servers this harness started from processes that have ended without
/// stopping them: a test process killed by a signal (a `kill` of it alone, an out-of-memory
/// kill) runs no `Drop`, and its servers would run on, each holding its port and memory, until
/// the machine stops. Found by the owner their working directory's name gives ([`OWNER_TAG`]),
/// removed or not (`./scripts/test.sh` removes the run's temporary directory as it ends). Left
/// alone: the servers of processes that still run, those started in another pid namespace (a
/// container, whose pids mean other processes), and, unless the sweep runs as root, every
/// process of another user (whose working directory cannot be read). Returns the pids killed.
pub(crate) fn kill_orphans() -> Vec<u32> {
    let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let ours = namespace("self");
    let orphans: Vec<u32> = pids()
        .filter(|&pid| {
            if namespace(&pid.to_string()) != ours {
                return false;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !comm.starts_with("redis") {
                return false;
            }
            let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
                return false;
            };
            let Some(owner) = cwd
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("redis-harness-"))
                .and_then(|n| n.split_once(OWNER_TAG))
                .and_then(|(_, rest)| rest.split_once('-'))
                .map(|(owner, _)| owner)
            else {
                return false;
            };
            let Some(owner_pid) = owner
                .split_once('.')
                .and_then(|(p, _)| p.parse::<u32>().ok())
            else {
                return false;
            };
            identity(owner_pid).is_none_or(|alive| alive != owner) && running(pid)
        })
        .collect();
    orphans
        .into_iter()
        .filter(|&pid| send_signal(pid, "-KILL"))
        .collect()
}

/// Whether `pid` still runs (a zombie, killed and not yet reaped, does not).
pub fn running(pid: u32) -> bool {
    stat(pid)
        .is_some_and(|(_, fields)| !matches!(fields.first().map(String::as_str), Some("Z" | "X")))
}

/// The first child of `parent` named `name`, waited for up to `timeout`.
pub fn wait_for_child(parent: u32, name: &str, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(&pid) = children_named(parent, name).first() {
            return Some(pid);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal`, named as `kill` names it (`"-TERM"`, `"-INT"`, `"-HUP"`, `"-QUIT"`,
/// `"-KILL"`, `"-STOP"`, `"-CONT"`), to `pid` with the `kill` system call. False when it could
/// not be sent (the process is gone, or the pid is not one).
///
/// # Panics
///
/// On a name not in that list: a test's mistake, not a process that could not be signalled.
pub fn send_signal(pid: u32, signal: &str) -> bool {
    let signal = match signal {
        "-TERM" => Signal::TERM,
        "-INT" => Signal::INT,
        "-HUP" => Signal::HUP,
        "-QUIT" => Signal::QUIT,
        "-KILL" => Signal::KILL,
        "-STOP" => Signal::STOP,
        "-CONT" => Signal::CONT,
        other => panic!("send_signal: no signal named {other:?}"),
    };
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    kill_process(pid, signal).is_ok()
}

/// `child`'s exit status, waited for up to `timeout`; past it, the child is killed and `None`
/// returned, so that a program that ignores a signal fails its test instead of hanging it.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    // Asked again after 1 ms, then twice as long each time up to 20 ms: a short-lived command
    // (a `redis-cli` call, a few milliseconds) is not kept waiting for a whole 20 ms step.
    let mut pause = Duration::from_millis(1);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Resolves at the first SIGINT, SIGTERM, SIGHUP (its terminal closed) or SIGQUIT from now on (the
/// handlers are in place when this returns); never if none could be listened for. A program that
/// started a `redis-server` selects on it and drops its run, and with it the server (killed when
/// dropped): killed by a signal's default action, the program would leave the server running
/// (`redis-server` ignores SIGHUP). Made before the run
/// starts, so that a signal sent while a server starts finds its handler in place.
pub fn interrupted() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    /// The next signal `listening` receives; pending for good if it could not be listened for.
    async fn next(listening: Option<Signal>) {
        match listening {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    let terminate = next(signal(SignalKind::terminate()).ok());
    let interrupt = next(signal(SignalKind::interrupt()).ok());
    let hangup = next(signal(SignalKind::hangup()).ok());
    let quit = next(signal(SignalKind::quit()).ok());
    async move {
        tokio::select! {
            () = terminate => {}
            () = interrupt => {}
            () = hangup => {}
            () = quit => {}
        }
    }
}
