//! Printing on stdout and stderr without a panic when they cannot be written, for the examples'
//! binaries and the load tool (each includes this file as a module:
//! `#[path = "../../common/say.rs"] mod say;`).
//!
//! `println!` panics when stdout is a pipe whose reader has gone (`example | head -n 1`): Rust
//! ignores `SIGPIPE`, so the write fails with `BrokenPipe`, and `println!` turns every failure
//! into a panic (status 101). `eprintln!` does the same on stderr (`2>/dev/full`, a supervisor
//! that closed it), which turned an error's exit status, or a warning the program carries on
//! after, into that panic.

/// Writes `text` and a newline on stdout. A reader that went away is not a failure: the rest of
/// the output is not wanted, and the program carries on (a server serves on). Any other write
/// error (a full disk) is returned.
pub(crate) fn say(text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out
        .write_fmt(text)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}

/// Writes `text` and a newline on stderr, as `eprintln!` would without its panic when stderr
/// cannot be written: the message is lost, and the exit status (or the program carrying on)
/// says the rest.
pub(crate) fn tell(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(text).and_then(|()| err.write_all(b"\n"));
}
