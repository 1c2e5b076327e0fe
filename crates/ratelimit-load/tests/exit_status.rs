//! The tool's exit status under `--check`: 0 when the run shows the mode's guarantee, 3 when it
//! does not (here: nobody sent enough to test it), 2 for a check it cannot make (a sweep).

#[path = "../../../examples/common/unwritable.rs"]
mod unwritable;

use std::process::{Command, Output};

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ratelimit-load"))
        .args(["--quiet", "--store", "memory", "--duration", "1"])
        .args(args)
        .output()
        .expect("the tool runs")
}

#[test]
fn check_passes_a_run_that_tests_the_limit() {
    // Two users at 100 times a normal user's rate send about 170 requests each against 100 a
    // minute: they test the bound, and the memory store keeps it.
    let out = tool(&[
        "--check",
        "--users",
        "1000",
        "--abusive",
        "2",
        "--rate",
        "2000",
        "--limit",
        "100/minute",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("users above bound: 0"), "{stdout}");
}

#[test]
fn check_fails_a_run_that_tests_nothing() {
    // A thousand users sharing 200 requests: nobody comes near 100 a minute, so "nobody was
    // admitted above the limit" would hold for any limiter, and the check says so.
    let run = [
        "--users",
        "1000",
        "--abusive",
        "0",
        "--rate",
        "200",
        "--limit",
        "100/minute",
    ];
    let out = tool(&[&["--check"][..], &run].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("nothing was tested"), "{stderr}");
    // Without `--check`, the same run exits 0: its report is the answer.
    let out = tool(&run);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(this run does not test exactness)"));
}

#[test]
fn check_refuses_a_sweep() {
    let out = tool(&["--check", "--steps", "100,200"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--check checks one run"), "{stderr}");
}

/// A Redis setting found wrong is a usage error (2), with what is wrong and no panic: a URL that
/// is not one, a `rediss://` URL (the tool has no TLS; the store's own message named features the
/// tool does not have), a pool size the store refuses (named as such, not as the URL), a
/// `--redis-config` line the server refuses, whatever its message (the harness's panic message
/// was printed before the tool's, and the status was 1). The password is not echoed.
#[test]
fn a_redis_setting_found_wrong_is_a_usage_error() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["--pool-size", "2000"],
            "--pool-size: invalid setting `pool_size`",
        ),
        (
            &["--redis-config", "include /nonexistent/redis.conf"],
            "redis-server refused it",
        ),
        (
            &["--redis-config", "loadmodule /nonexistent/module.so"],
            "redis-server refused it",
        ),
        (&["--redis-url", "notaurl"], "not a Redis URL"),
        (&["--redis-url", "http://127.0.0.1:6379"], "not a Redis URL"),
        (
            &["--redis-url", "rediss://user:secret@127.0.0.1:6379"],
            "built without TLS",
        ),
        (
            &["--redis-config", "bogus-directive"],
            "redis-server refused it",
        ),
    ];
    for (args, says) in cases {
        let out = tool(&[&["--store", "redis", "--rate", "10"][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("secret"), "{args:?}: {stderr}");
    }
}

/// An argument that is not UTF-8 (a file name may be any bytes but 0) is a usage error, exit 2,
/// not a panic (exit 101).
#[cfg(unix)]
#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-load"))
        .args(["--quiet", "--duration", "0.1", "--rate", "10", "--svg"])
        .arg(OsStr::from_bytes(b"plot-\xff.svg"))
        .output()
        .expect("the tool runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not UTF-8"), "{stderr}");
}

/// Output that cannot be written is not a panic (status 101): to a reader gone (`| head`) the
/// run ends as it would have, with `--check`'s 0 here; to a full disk (`/dev/full`) it is a
/// failure, 1.
#[test]
fn output_that_cannot_be_written_is_not_a_panic() {
    let run = |args: &[&str], stdout: std::process::Stdio| {
        Command::new(env!("CARGO_BIN_EXE_ratelimit-load"))
            .args(args)
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("the tool runs")
    };
    let short = [
        "--quiet",
        "--store",
        "memory",
        "--duration",
        "0.1",
        "--rate",
        "10",
    ];
    for args in [
        &["--help"][..],
        &short[..],
        &[&short[..], &["--json"]].concat(),
    ] {
        let out = run(args, unwritable::closed_pipe().into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
    #[cfg(target_os = "linux")]
    for args in [&["--help"][..], &short[..]] {
        let out = run(args, unwritable::full().into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// With stdout and stderr both unwritable, a wrong command line still ends with its status (2).
#[cfg(target_os = "linux")]
#[test]
fn a_usage_error_with_nothing_writable_is_not_a_panic() {
    unwritable::assert_usage_error_with_nothing_writable(env!("CARGO_BIN_EXE_ratelimit-load"));
}
