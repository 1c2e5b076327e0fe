//! The tool stopped by a signal stops the `redis-server` it started.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pids of the processes whose parent is `parent` and whose name is `name` (from `/proc`).
fn children_named(parent: u32, name: &str) -> Vec<u32> {
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
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        !matches!(state, Some("Z" | "X"))
    })
}

#[test]
fn sigterm_stops_the_redis_server_the_tool_started() {
    if !redis_harness::redis_server_installed() {
        panic!("redis-server is needed (Debian: apt-get install redis-server)");
    }
    // Once the run has begun (`settled`), and three times each at once.
    let runs = [true, false, false, false]
        .into_iter()
        .flat_map(|s| [("-TERM", s), ("-INT", s)]);
    for (signal, settled) in runs {
        let mut tool = Command::new(env!("CARGO_BIN_EXE_ratelimit-load"))
            .args([
                "--store",
                "redis",
                "--duration",
                "60",
                "--rate",
                "100",
                "--quiet",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tool starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        let server = loop {
            if let Some(&pid) = children_named(tool.id(), "redis-server").first() {
                break pid;
            }
            assert!(Instant::now() < deadline, "no redis-server started");
            std::thread::sleep(Duration::from_millis(20));
        };
        // At once, while the tool may still be waiting for the server to answer (its handlers
        // must be in place before), or once the run has begun.
        if settled {
            std::thread::sleep(Duration::from_millis(500));
        }
        // Through `sh`, whose `kill` is a builtin: minimal images have `sh` but not always
        // `/bin/kill` (Debian's `procps`), as the Redis harness does.
        let sent = Command::new("sh")
            .args(["-c", "kill \"$0\" \"$1\"", signal, &tool.id().to_string()])
            .status()
            .expect("sh runs");
        assert!(sent.success());
        let status = tool.wait().expect("the tool exits");
        let mut stderr = String::new();
        if let Some(mut e) = tool.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut stderr);
        }
        assert_eq!(
            status.code(),
            Some(130),
            "{signal} (settled: {settled}): {status:?} {stderr}"
        );
        assert!(stderr.contains("interrupted"), "{stderr}");
        assert!(
            !running(server),
            "{signal}: redis-server {server} still runs"
        );
    }
}
