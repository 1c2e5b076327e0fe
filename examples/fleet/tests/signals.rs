//! The fleet stopped by a signal stops the `redis-server` it started.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis_harness::process::{running, send_signal, wait_exit, wait_for_child};

#[test]
fn sigterm_ctrl_c_and_a_closed_terminal_stop_the_redis_server_the_fleet_started() {
    if !redis_harness::redis_server_installed() {
        panic!("redis-server is needed (Debian: apt-get install redis-server)");
    }
    // SIGHUP: the terminal closed (its default action left the server running, as redis-server
    // ignores SIGHUP); SIGQUIT: Ctrl-\.
    for signal in ["-TERM", "-INT", "-HUP", "-QUIT"] {
        // Enough users that the run lasts seconds: the signal comes while its requests are sent.
        let mut fleet = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--users", "5000"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the fleet starts");
        let server = wait_for_child(fleet.id(), "redis-server", Duration::from_secs(30))
            .expect("no redis-server started");
        // Sent once the gateways' checks reach the server (a thousand scripts run: each check is
        // one, and nothing else runs one), not while the fleet starts.
        let deadline = Instant::now() + Duration::from_secs(60);
        while scripts_run(server) < 1_000 {
            assert!(
                Instant::now() < deadline,
                "{signal}: no traffic within 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(send_signal(fleet.id(), signal));
        let status = wait_exit(&mut fleet, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{signal}: the fleet did not exit within 30 s"));
        let mut stderr = String::new();
        if let Some(mut e) = fleet.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut stderr);
        }
        assert_eq!(status.code(), Some(130), "{signal}: {status:?} {stderr}");
        assert!(stderr.contains("interrupted"), "{stderr}");
        assert!(
            !running(server),
            "{signal}: redis-server {server} still runs"
        );
    }
}

/// The scripts the `redis-server` of pid `server` has run (`INFO commandstats`; not the commands
/// it has run, which this question adds to), asked on the port its process title gives
/// (`redis-server 127.0.0.1:<port>`); 0 while it cannot tell.
fn scripts_run(server: u32) -> u64 {
    let title = std::fs::read_to_string(format!("/proc/{server}/cmdline")).unwrap_or_default();
    let Some(port) = title.split("127.0.0.1:").nth(1).and_then(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u16>().ok()
    }) else {
        return 0;
    };
    let Ok(out) = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
    else {
        return 0;
    };
    redis_harness::script_calls(&String::from_utf8_lossy(&out.stdout))
}
