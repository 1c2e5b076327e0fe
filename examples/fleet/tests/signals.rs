//! The fleet stopped by a signal stops the `redis-server` it started.

use std::process::{Command, Stdio};
use std::time::Duration;

use redis_harness::process::{running, send_signal, wait_exit, wait_for_child};

#[test]
fn sigterm_ctrl_c_and_a_closed_terminal_stop_the_redis_server_the_fleet_started() {
    if !redis_harness::redis_server_installed() {
        panic!("redis-server is needed (Debian: apt-get install redis-server)");
    }
    // SIGHUP: the terminal closed (its default action left the server running, as redis-server
    // ignores SIGHUP); SIGQUIT: Ctrl-\.
    for signal in ["-TERM", "-INT", "-HUP", "-QUIT"] {
        // Enough users that the run lasts seconds: the signal comes while it runs.
        let mut fleet = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--users", "5000"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the fleet starts");
        let server = wait_for_child(fleet.id(), "redis-server", Duration::from_secs(30))
            .expect("no redis-server started");
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
