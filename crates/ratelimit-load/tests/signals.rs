//! The tool stopped by a signal stops the `redis-server` it started.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis_harness::process::{running, send_signal, wait_exit, wait_for_child};

#[test]
fn sigterm_stops_the_redis_server_the_tool_started() {
    if !redis_harness::redis_server_installed() {
        panic!("redis-server is needed (Debian: apt-get install redis-server)");
    }
    // Once the run has begun (`settled`), and three times each at once; SIGHUP (a closed
    // terminal) and SIGQUIT once the run has begun.
    let runs = [true, false, false, false]
        .into_iter()
        .flat_map(|s| [("-TERM", s), ("-INT", s)])
        .chain([("-HUP", true), ("-QUIT", true)]);
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
        let server = wait_for_child(tool.id(), "redis-server", Duration::from_secs(30))
            .expect("no redis-server started");
        // At once, while the tool may still be waiting for the server to answer (its handlers
        // must be in place before), or once the run has begun: its checks have written a key.
        if settled {
            wait_for_a_key(server);
        }
        assert!(send_signal(tool.id(), signal));
        // Bounded: a tool that ignored the signal fails the test instead of hanging it.
        let status = wait_exit(&mut tool, Duration::from_secs(30)).unwrap_or_else(|| {
            panic!("{signal} (settled: {settled}): the tool did not exit within 30 s")
        });
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

/// Waits (up to 30 s) until the `redis-server` of process `pid` holds a key. Its port is read from
/// its process title (`redis-server 127.0.0.1:<port>`), which it sets once started.
fn wait_for_a_key(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title).replace('\0', " ");
        let port = title
            .split_once("127.0.0.1:")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse::<u16>().ok());
        let keys = port.and_then(|port| {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "dbsize"])
                .stdin(Stdio::null())
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        });
        if keys.is_some_and(|n| n > 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} ({title}) holds no key after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A report written where no one reads (here `--svg` to a FIFO no one opens; or a full pipe)
/// leaves the signals heard: the tool stops on SIGTERM with its status 130, instead of waiting for
/// a reader and then exiting 0 as if nothing had happened.
#[test]
fn sigterm_stops_the_tool_blocked_writing_its_report() {
    let fifo = std::env::temp_dir().join(format!("ratelimit-load-{}.svg", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let mut tool = Command::new(env!("CARGO_BIN_EXE_ratelimit-load"))
        .args(["--quiet", "--json", "--duration", "0.2", "--svg"])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tool starts");
    // The report on stdout comes first (one line of JSON); then the chart, whose file no one
    // opens for reading.
    let mut report = String::new();
    let stdout = tool.stdout.take().expect("piped");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut report)
        .expect("the report is read");
    assert!(report.starts_with('{'), "{report}");
    assert!(send_signal(tool.id(), "-TERM"));
    let status = wait_exit(&mut tool, Duration::from_secs(30));
    let _ = std::fs::remove_file(&fifo);
    let status = status.unwrap_or_else(|| panic!("the tool did not exit within 30 s of SIGTERM"));
    let mut stderr = String::new();
    if let Some(mut e) = tool.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(130), "{status:?} {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
}
