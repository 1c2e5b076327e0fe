//! Processes seen from `/proc`, for tests that stop a program by a signal and check that the
//! `redis-server` it started went with it.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The pids of the processes whose parent is `parent` and whose name is `name`.
pub fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            // `pid (comm) state ppid ...`; the name may hold spaces, the last ')' ends it.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let comm = head.split_once('(').map_or("", |(_, c)| c);
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            comm == name && ppid == Some(parent)
        })
        .collect()
}

/// Whether `pid` still runs (a zombie, killed and not yet reaped, does not).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        !matches!(state, Some("Z" | "X"))
    })
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

/// Sends `signal` (`"-TERM"`, `"-INT"`) to `pid`, through `sh`, whose `kill` is a builtin:
/// minimal images have `sh` but not always `/bin/kill` (Debian's `procps`).
pub fn send_signal(pid: u32, signal: &str) -> bool {
    Command::new("sh")
        .args(["-c", "kill \"$0\" \"$1\"", signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// `child`'s exit status, waited for up to `timeout`; past it, the child is killed and `None`
/// returned, so that a program that ignores a signal fails its test instead of hanging it.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
