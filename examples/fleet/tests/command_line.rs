//! The fleet's command line: a `rediss://` URL in a build without TLS is refused by name; an
//! argument that is not UTF-8 is a usage error.

use std::process::Command;

#[test]
fn a_rediss_url_without_a_tls_build_names_the_fleets_flag_and_features() {
    let out = Command::new(env!("CARGO_BIN_EXE_example-fleet"))
        .args(["--redis", "rediss://127.0.0.1:1"])
        .output()
        .expect("the fleet runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(any(feature = "tls", feature = "tls-rustls")) {
        // Built with TLS, the URL is taken and the connection then fails, not the setting.
        assert!(!stderr.contains("--features"), "{stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--redis"), "{stderr}");
    assert!(
        stderr.contains("example-fleet") && stderr.contains("--features tls"),
        "{stderr}"
    );
    assert!(!stderr.contains("store.url"), "{stderr}");
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
