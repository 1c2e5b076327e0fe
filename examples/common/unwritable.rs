//! Outputs that cannot be written, for the command-line tests of the examples' binaries and of the
//! load tool, which check that such output is never a panic (status 101). Each test file includes
//! this file as a module: `#[path = "../../common/unwritable.rs"] mod unwritable;`.

// Each test file uses some of these.
#![allow(dead_code)]

/// A pipe whose reader has gone (`| head` once it has read enough): a write to it fails with
/// `BrokenPipe`.
pub(crate) fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    writer
}

/// `/dev/full`: every write to it fails (`ENOSPC`), as on a full disk.
#[cfg(target_os = "linux")]
pub(crate) fn full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full")
}

/// The binary `bin`, given an argument it does not know, with stdout and stderr both unwritable:
/// it ends with a wrong command line's status (2), not a panic (101) on the message it cannot
/// write.
#[cfg(target_os = "linux")]
pub(crate) fn assert_usage_error_with_nothing_writable(bin: &str) {
    let status = std::process::Command::new(bin)
        .arg("--bogus")
        .stdout(full())
        .stderr(full())
        .status()
        .expect("the binary runs");
    assert_eq!(status.code(), Some(2), "{bin}");
}
