//! The quickstart's command line: an argument that is not UTF-8 is a usage error (status 2)
//! that names it, never a panic.
#![cfg(unix)]

#[path = "../../common/unwritable.rs"]
mod unwritable;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

fn quickstart(args: &[&OsStr]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_example-quickstart"))
        .args(args)
        .output()
        .expect("run the quickstart");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn arguments_that_are_not_utf8_are_usage_errors() {
    let (code, err) = quickstart(&[OsStr::from_bytes(b"--\xff")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown argument `--\u{fffd}`"), "{err}");
    let (code, err) = quickstart(&[OsStr::new("--listen"), OsStr::from_bytes(b"\xff:1")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--listen"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A malformed `--listen` address is a wrong command line (status 2), as a missing one is.
#[test]
fn a_malformed_listen_address_is_a_usage_error() {
    for addr in ["foo", "127.0.0.1:99999", "127.0.0.1"] {
        let (code, err) = quickstart(&[OsStr::new("--listen"), OsStr::new(addr)]);
        assert_eq!(code, Some(2), "{addr}: {err}");
        assert!(
            err.contains("--listen") && err.contains("not an address"),
            "{err}"
        );
    }
}

/// Output to a pipe closed early (`example-quickstart | head -1`) ends it quietly, never a panic
/// (status 101): it ends as it would have, status 0.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let writer = unwritable::closed_pipe();
    let out = Command::new(env!("CARGO_BIN_EXE_example-quickstart"))
        .arg("--help")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("it runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// With stdout and stderr both unwritable, a wrong command line still ends with its status (2),
/// not a panic (101) on the message that cannot be written.
#[cfg(target_os = "linux")]
#[test]
fn nothing_writable_is_not_a_panic() {
    unwritable::assert_usage_error_with_nothing_writable(env!("CARGO_BIN_EXE_example-quickstart"));
}
