//! Printing on stdout without a panic when its reader has gone, for the examples' binaries and
//! the load tool (each includes this file as a module: `#[path = "../../common/say.rs"] mod say;`).
//!
//! `println!` panics when stdout is a pipe whose reader has gone (`example | head -n 1`): Rust
//! ignores `SIGPIPE`, so the write fails with `BrokenPipe`, and `println!` turns every failure
//! into a panic (status 101).

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
