//! The gateway's command line: mistakes are usage errors (status 2) that name the argument,
//! never a panic, whatever bytes the arguments hold.
#![cfg(unix)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output};

fn gateway(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_example-gateway"))
        .args(args)
        .output()
        .expect("run the gateway")
}

#[test]
fn arguments_that_are_not_utf8_are_usage_errors() {
    // A path that is not UTF-8 is still a path: it is read, and here it does not exist.
    let missing = OsStr::from_bytes(b"/nonexistent/\xff.toml");
    let out = gateway(&[OsStr::new("--config"), missing, OsStr::new("--check")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = gateway(&[OsStr::from_bytes(b"--\xff")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument"), "{err}");

    let out = gateway(&[OsStr::new("--listen"), OsStr::from_bytes(b"\xff:1")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected IP:PORT"), "{err}");
}
