//! The fleet's command line: a `rediss://` URL in a build without TLS is refused by name; an
//! argument that is not UTF-8 is a usage error.

#[path = "../../common/unwritable.rs"]
mod unwritable;

use std::process::Command;

#[test]
fn a_rediss_url_without_a_tls_build_names_the_fleets_flag_and_features() {
    // The scheme in any case, as the URL parser takes it.
    for url in ["rediss://127.0.0.1:1", "REDISS://127.0.0.1:1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--redis", url])
            .output()
            .expect("the fleet runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if cfg!(any(feature = "tls", feature = "tls-rustls")) {
            // Built with TLS, the URL is taken and the connection then fails, not the setting.
            assert!(!stderr.contains("--features"), "{url}: {stderr}");
            continue;
        }
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains("--redis"), "{url}: {stderr}");
        assert!(
            stderr.contains("example-fleet") && stderr.contains("--features tls"),
            "{url}: {stderr}"
        );
        assert!(!stderr.contains("store.url"), "{url}: {stderr}");
    }
}

/// A `--redis` URL with a control character (a newline that would end the gateways' TOML string
/// and add a setting) is a usage error that names the flag, not a TOML error about a file the
/// user never wrote.
#[test]
fn a_redis_url_with_a_control_character_is_a_usage_error() {
    for url in ["redis://:sec\nret@127.0.0.1:1", "redis://127.0.0.1:1/\u{1}"] {
        let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--redis", url])
            .output()
            .expect("the fleet runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--redis") && stderr.contains("control"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("sec"),
            "the password is not shown: {stderr}"
        );
    }
}

/// A fleet that needs more open files than the soft limit (a common 1,024 is about 480
/// gateways) raises it up to the hard limit and runs; past the hard limit it says so at once,
/// rather than failing midway with "Too many open files".
#[cfg(unix)]
#[test]
fn a_low_open_file_limit_is_raised_or_named() {
    if !redis_harness::redis_server_installed() {
        panic!("redis-server is needed (Debian: apt-get install redis-server)");
    }
    let under = |ulimit: &str| {
        Command::new("sh")
            .args(["-c", &format!("ulimit {ulimit} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--gateways", "100", "--users", "2"])
            .output()
            .expect("the fleet runs")
    };
    // 100 gateways need about 264 open files.
    let out = under("-Sn 200");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("2 of 2 users admitted exactly their limit"),
        "{stdout}"
    );
    let out = under("-n 200");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("100 gateways sharing Redis need about 264 open files")
            && stderr.contains("at most 200"),
        "{stderr}"
    );
}

/// An argument that is not UTF-8 is a usage error (status 2) that names it, never a panic.
#[cfg(unix)]
#[test]
fn arguments_that_are_not_utf8_are_usage_errors() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
        .arg(std::ffi::OsStr::from_bytes(b"--\xff"))
        .output()
        .expect("the fleet runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown argument"), "{stderr}");
}

/// A count beyond what the fleet can run is a usage error, at once: before, `--gateways` of
/// 2^64 − 1 built gateways until the memory ran out (15 GB in minutes, seen), deaf to SIGTERM,
/// and the requests' count overflowed.
#[test]
fn counts_out_of_range_are_usage_errors() {
    for (flag, value) in [
        ("--gateways", "18446744073709551615"),
        ("--gateways", "1001"),
        ("--users", "18446744073709551615"),
        ("--users", "100001"),
    ] {
        let mut fleet = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args([flag, value, "--alone"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the fleet runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = fleet.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = fleet.kill();
                let _ = fleet.wait();
                panic!("{flag} {value}: still running after 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut fleet.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("at most"),
            "{flag} {value}: {stderr}"
        );
    }
}

/// A `--redis` value that is not a Redis URL is a wrong command line (status 2) named by the
/// fleet's flag, as a `rediss://` URL without TLS is: not a failure of the run (1) in terms of
/// `store.url`, a setting of a file the user never wrote.
#[test]
fn a_malformed_redis_url_is_a_usage_error() {
    for url in [
        "notaurl",
        "--alone",
        "redis://127.0.0.1:notaport",
        "redis://user:hunter2@127.0.0.1:1/notadb",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
            .args(["--redis", url, "--users", "1", "--gateways", "1"])
            .output()
            .expect("the fleet runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains("--redis"), "{url}: {stderr}");
        assert!(!stderr.contains("store.url"), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
    }
}

/// Output to a pipe closed early (`example-fleet | head -1`) ends the fleet quietly, never a
/// panic (status 101): it ends as it would have, status 0.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let writer = unwritable::closed_pipe();
    let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
        .args(["--alone", "--users", "2", "--gateways", "1"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the fleet runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// Help that cannot be written (a full disk: `/dev/full`) is a failure of the run (status 1),
/// not a wrong command line (2).
#[cfg(target_os = "linux")]
#[test]
fn help_that_cannot_be_written_is_a_failure_not_a_usage_error() {
    let full = unwritable::full();
    let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
        .arg("--help")
        .stdout(full)
        .output()
        .expect("the fleet runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write the output"), "{stderr}");
}

/// With stdout and stderr both unwritable, a wrong command line still ends with its status (2),
/// not a panic (101) on the message that cannot be written.
#[cfg(target_os = "linux")]
#[test]
fn nothing_writable_is_not_a_panic() {
    unwritable::assert_usage_error_with_nothing_writable(env!("CARGO_BIN_EXE_example-fleet"));
}

/// A `redis-server` the fleet cannot start (here, no temporary directory for its files) ends the
/// run with a message and status 1, never a panic (status 101).
#[test]
fn a_redis_server_that_cannot_start_is_a_failure_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
        .args(["--users", "2", "--gateways", "1"])
        .env("TMPDIR", "/nonexistent/ratelimit-fleet-test")
        .output()
        .expect("the fleet runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not start redis-server")
            && stderr.contains("create a temporary directory"),
        "{stderr}"
    );
}
