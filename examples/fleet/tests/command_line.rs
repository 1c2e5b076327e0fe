//! The fleet's command line: a `rediss://` URL in a build without TLS is refused by name.

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
