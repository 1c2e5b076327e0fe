//! The gateway's command line: mistakes are usage errors (status 2) that name the argument,
//! never a panic, whatever bytes the arguments hold.
#![cfg(unix)]

#[path = "../../common/unwritable.rs"]
mod unwritable;

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

/// A configuration path to a file that never ends (`/dev/zero`) is refused past 16 MiB, at
/// once, instead of being read until memory runs out.
#[test]
fn an_endless_configuration_file_is_refused() {
    // Killed after a minute (far more than reading 16 MiB takes) should it read on.
    let out = Command::new("timeout")
        .args(["-s", "KILL", "60"])
        .arg(env!("CARGO_BIN_EXE_example-gateway"))
        .args(["--config", "/dev/zero", "--check"])
        .output()
        .expect("run the gateway under timeout(1)");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read /dev/zero: larger than 16 MiB"),
        "{err}"
    );
}

/// A `RUST_LOG` directive that does not parse is named in a warning and left out; the others
/// are kept (was: the whole variable dropped for `info`, without a word).
#[test]
fn a_rust_log_directive_that_does_not_parse_is_named_and_the_others_kept() {
    let check = |rust_log: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_example-gateway"))
            .args(["--config", "gateway.toml", "--check"])
            .env("RUST_LOG", rust_log)
            .output()
            .expect("run the gateway");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = check("debug,hyper=warnn");
    assert!(
        err.contains("warning: RUST_LOG: ignoring `hyper=warnn`"),
        "{err}"
    );
    assert!(!err.contains("no directive that parses"), "{err}");
    // (`warnn` alone would be a target's name, and parse.)
    let err = check("hyper=warnn");
    assert!(err.contains("ignoring `hyper=warnn`"), "{err}");
    assert!(
        err.contains("no directive that parses: logging at info"),
        "{err}"
    );
    let err = check("debug");
    assert!(!err.contains("RUST_LOG"), "{err}");
}

/// `--config=PATH` takes a path that is not UTF-8 as it is, as `--config PATH` does; and
/// `--redis=URL` refuses a URL that is not UTF-8 as `--redis URL` does.
#[test]
fn a_flags_inline_value_is_taken_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(OsStr::from_bytes(b"\xff.toml"));
    std::fs::write(&path, include_str!("../gateway.toml")).unwrap();
    let mut inline = std::ffi::OsString::from("--config=");
    inline.push(&path);
    let out = gateway(&[&inline, OsStr::new("--check")]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = gateway(&[OsStr::from_bytes(b"--redis=redis://\xff:1")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--redis: the URL is not UTF-8"), "{err}");
}

/// Redis unreachable at start is exit status 3, which a supervisor may retry (Redis may be
/// restarting); credentials Redis refuses are status 2, as a wrong file is: no retry mends them.
/// So is an address where something other than a usable Redis answers: another service, a
/// server without cluster support for `redis_cluster`, a database number the server lacks.
#[test]
fn redis_unreachable_at_start_is_status_3_and_refused_credentials_status_2() {
    // The shipped file's 50 ms timeout, on a loaded machine, could cut the answers that tell a
    // wrong server apart (a `HELLO` not answered in time skips the cluster-node check, and a
    // cluster's `CLUSTER SLOTS` timing out is "unreachable", 3): these are about what answers.
    let redis = include_str!("../gateway-redis.toml");
    assert!(redis.contains("timeout_ms = 50\n"));
    let redis = redis.replace("timeout_ms = 50\n", "timeout_ms = 2000\n");
    let with_store = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, text).unwrap();
        let out = gateway(&[
            OsStr::new("--config"),
            path.as_os_str(),
            OsStr::new("--check"),
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_url = |url: &str| {
        with_store(&redis.replace(
            "url = \"redis://127.0.0.1:6379\"",
            &format!("url = \"{url}\""),
        ))
    };
    // A port with nothing listening: refused at once.
    let port = redis_harness::closed_port();
    let (status, err) = with_url(&format!("redis://127.0.0.1:{port}"));
    assert_eq!(status, Some(3), "{err}");
    assert!(err.contains("store: "), "{err}");

    let server = redis_harness::RedisServer::builder()
        .password("right")
        .start();
    let (status, err) = with_url(&format!("redis://:wrong@127.0.0.1:{}", server.port()));
    assert_eq!(status, Some(2), "{err}");
    assert!(!err.contains("wrong"), "the password is not echoed: {err}");

    // Not Redis: a web server's answer does not parse. One line, not the client's several.
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let web_port = web.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for conn in web.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.read(&mut [0u8; 512]);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let (status, err) = with_url(&format!("redis://127.0.0.1:{web_port}"));
    assert_eq!(status, Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let plain = redis_harness::RedisServer::start();
    // A replica of it: every check would be refused; 3, as a failover may promote it.
    let replica = redis_harness::RedisServer::builder()
        .config(format!("replicaof 127.0.0.1 {}", plain.port()))
        .start();
    let (status, err) = with_url(&replica.url());
    assert_eq!(status, Some(3), "{err}");
    assert!(err.contains("a replica given as the server"), "{err}");
    let (status, err) = with_url(&format!("{}/99", plain.url()));
    assert_eq!(status, Some(2), "{err}");
    // Past what `SELECT` takes, and a user that may not run it: 2 as well (they were 3).
    let (status, err) = with_url(&format!("{}/99999999999", plain.url()));
    assert_eq!(status, Some(2), "{err}");
    plain.cli(&[
        "ACL", "SETUSER", "limited", "on", ">pw12345", "~*", "&*", "+@all", "-select",
    ]);
    let (status, err) = with_url(&format!(
        "redis://limited:pw12345@127.0.0.1:{}/1",
        plain.port()
    ));
    assert_eq!(status, Some(2), "{err}");
    assert!(
        err.contains("no permissions to run the 'select' command"),
        "{err}"
    );
    let cluster_of = |url: &str| {
        redis.replace(
            "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
            &format!("kind = \"redis_cluster\"\nurls = [\"{url}\"]"),
        )
    };
    let (status, err) = with_store(&cluster_of(&plain.url()));
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("cluster support disabled"), "{err}");
    let (status, err) = with_store(&cluster_of(&format!("redis://127.0.0.1:{web_port}")));
    assert_eq!(status, Some(2), "{err}");
    // Nothing listening, for a cluster too: 3.
    let (status, err) = with_store(&cluster_of(&format!("redis://127.0.0.1:{port}")));
    assert_eq!(status, Some(3), "{err}");
    // The reverse mistake: a cluster node given as `kind = "redis"`.
    let cluster = redis_harness::RedisCluster::start(3);
    let (status, err) = with_url(&cluster.urls()[0]);
    assert_eq!(status, Some(2), "{err}");
    assert!(
        err.contains("a Redis Cluster node given as a standalone server"),
        "{err}"
    );
}

/// `--redis URL` points a `kind = "redis"` configuration at another server; with any other store
/// it is a usage error that says so.
#[test]
fn redis_from_the_command_line() {
    let redis_toml = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway-redis.toml");
    let server = redis_harness::RedisServer::start();
    let out = gateway(&[
        OsStr::new("--config"),
        OsStr::new(redis_toml),
        OsStr::new("--redis"),
        OsStr::new(&server.url()),
        OsStr::new("--check"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{out:?}"
    );

    // Nothing listening there: the address named, and status 3, as for the file's own.
    let port = redis_harness::closed_port();
    let url = format!("redis://127.0.0.1:{port}");
    let out = gateway(&[
        OsStr::new("--config"),
        OsStr::new(redis_toml),
        OsStr::new("--redis"),
        OsStr::new(&url),
        OsStr::new("--check"),
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&url), "{out:?}");
    // The URL came from the command line, and the error says so.
    assert!(
        err.starts_with(&format!("error in {redis_toml} with --redis: store")),
        "{err}"
    );

    // A URL refused as the file is loaded (TLS without the gateway's TLS feature): the error
    // says it came from the command line too, not from the file (whose own URL is fine).
    if cfg!(not(any(feature = "tls", feature = "tls-rustls"))) {
        let out = gateway(&[
            OsStr::new("--config"),
            OsStr::new(redis_toml),
            OsStr::new("--redis"),
            OsStr::new("rediss://127.0.0.1:1"),
            OsStr::new("--check"),
        ]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with(&format!("error in {redis_toml} with --redis: store.url: ")),
            "{err}"
        );
    }

    // The default configuration keeps its counters in memory.
    let out = gateway(&[OsStr::new("--redis"), OsStr::new(&server.url())]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--redis replaces the url"), "{err}");

    // A file without the url, the server given on the command line only (a URL with a
    // password kept out of the file).
    let text = std::fs::read_to_string(redis_toml).unwrap();
    let line = "url = \"redis://127.0.0.1:6379\"\n";
    assert!(text.contains(line));
    let dir = tempfile::tempdir().unwrap();
    let without_url = dir.path().join("gateway.toml");
    std::fs::write(&without_url, text.replace(line, "")).unwrap();
    let out = gateway(&[
        OsStr::new("--config"),
        without_url.as_os_str(),
        OsStr::new("--redis"),
        OsStr::new(&server.url()),
        OsStr::new("--check"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Without the flag, the file lacks it.
    let out = gateway(&[
        OsStr::new("--config"),
        without_url.as_os_str(),
        OsStr::new("--check"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("store.url: required"), "{err}");

    // `--flag=value` works as `--flag value` does.
    let config = format!("--config={redis_toml}");
    let redis = format!("--redis={}", server.url());
    let out = gateway(&[
        OsStr::new(&config),
        OsStr::new(&redis),
        OsStr::new("--check"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// An unknown `--flag=value` is named without its value, which may be a secret (a Redis URL with
/// its password); a flag that takes no value refuses one.
#[test]
fn an_unknown_flags_value_is_not_echoed() {
    let out = gateway(&[OsStr::new(
        "--redis-url=redis://default:hunter2@10.0.0.5:6379",
    )]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument `--redis-url=…`"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // A URL without its flag.
    let out = gateway(&[OsStr::new("redis://default:hunter2@10.0.0.5:6379")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument `redis://"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // Any other argument with a value: what follows its `=`.
    for arg in [
        "-p=hunter2",
        "password=hunter2",
        "-redis=redis://:hunter2@10.0.0.5",
    ] {
        let out = gateway(&[OsStr::new(arg)]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let name = arg.split_once('=').unwrap().0;
        assert!(
            err.contains(&format!("unknown argument `{name}=…`")),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }

    let out = gateway(&[OsStr::new("--check=yes")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--check takes no value"), "{err}");
}

/// Output to a pipe closed early (`example-gateway --check | head -0`, a supervisor that closed
/// its end) is not a panic (status 101): `--help` and `--check` end as they would have, and a
/// gateway that cannot print its banner serves all the same.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    for args in [vec!["--help"], vec!["--check"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_example-gateway"))
            .args(&args)
            .stdout(unwritable::closed_pipe())
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run the gateway");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
    // A port that was free a moment ago: the banner that would say which is not readable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(unwritable::closed_pipe())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the gateway");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let answered = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the gateway exited ({status}) instead of serving");
        }
        if let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            conn.write_all(b"GET /api/items HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            let _ = conn.read_to_string(&mut answer);
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(answered.starts_with("HTTP/1.1 "), "{answered:?}");
    let running = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        running.is_none(),
        "the gateway exited after its banner: {running:?}"
    );
}

/// With stderr unwritable, a wrong command line still ends with its status (2), and a
/// configuration's warning (which the gateway writes on stderr, then carries on) does not stop
/// it: both were panics (101) on the message that could not be written.
#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_stderr_is_not_a_panic() {
    unwritable::assert_usage_error_with_nothing_writable(env!("CARGO_BIN_EXE_example-gateway"));
    // Two routes of one path: loaded, with a warning.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[[routes]]\npath = \"/api\"\n[routes.policy]\nname = \"a\"\n\
         quotas = [{ limit = 600, per = \"minute\" }]\n\
         [[routes]]\npath = \"/api/\"\n[routes.policy]\nname = \"b\"\n\
         quotas = [{ limit = 60, per = \"minute\" }]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_example-gateway"))
        .args(["--check", "--config"])
        .arg(&path)
        .stderr(unwritable::full())
        .output()
        .expect("run the gateway");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.ends_with(": ok\n"), "{stdout}");
}
