//! The boundary example's command line: a chart's path that is not UTF-8 is a path like any
//! other; an unknown argument that is not UTF-8 is a usage error (status 2), never a panic.
#![cfg(unix)]

#[path = "../../common/unwritable.rs"]
mod unwritable;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

fn boundary(args: &[&OsStr]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_example-boundary"))
        .args(args)
        .output()
        .expect("run the boundary example");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_chart_path_that_is_not_utf8_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(OsStr::from_bytes(b"\xff.svg"));
    let (code, err) = boundary(&[OsStr::new("--svg"), path.as_os_str()]);
    assert_eq!(code, Some(0), "{err}");
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{svg:.80}");

    let (code, err) = boundary(&[OsStr::from_bytes(b"--\xff")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown argument"), "{err}");
}

/// Output to a pipe closed early (`example-boundary | head -1`) ends it quietly, never a panic
/// (status 101), and the chart is written all the same.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chart.svg");
    for args in [
        vec![OsStr::new("--help")],
        vec![OsStr::new("--svg"), path.as_os_str()],
    ] {
        let writer = unwritable::closed_pipe();
        let out = Command::new(env!("CARGO_BIN_EXE_example-boundary"))
            .args(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("it runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{svg:.80}");
}

/// A chart that cannot be written fails the run (status 1), after the tables are printed.
#[test]
fn the_tables_are_printed_when_the_chart_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("chart.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_example-boundary"))
        .args([OsStr::new("--svg"), path.as_os_str()])
        .output()
        .expect("it runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("token_bucket"), "{stdout}");
}

/// With stdout and stderr both unwritable, a wrong command line still ends with its status (2),
/// not a panic (101) on the message that cannot be written.
#[cfg(target_os = "linux")]
#[test]
fn nothing_writable_is_not_a_panic() {
    unwritable::assert_usage_error_with_nothing_writable(env!("CARGO_BIN_EXE_example-boundary"));
}
