//! The admin route, `POST /admin/reset`: it forgets one client's count under a route's policy,
//! for a request with the token only; its mistakes are named; its token is read at start from a
//! file or an environment variable, and a missing or weak one stops the gateway.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode};
use common::{frozen_app, send, status};
use example_gateway::{Config, app};
use http_body_util::BodyExt;

const MEMORY: &str = include_str!("../gateway.toml");
const REDIS: &str = include_str!("../gateway-redis.toml");
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// `text` with an `[admin]` table whose token is in a file of `dir`.
fn with_admin(text: &str, dir: &tempfile::TempDir) -> Config {
    let path = dir.path().join("admin-token");
    // As `echo ... > file` writes it: the newline is not part of the token.
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    let text = format!(
        "{text}\n[admin]\ntoken_file = {:?}\n",
        path.display().to_string()
    );
    Config::from_toml(&text).unwrap()
}

/// `POST /admin/reset?<query>` with `authorization` (if any): the status and the body.
async fn admin(app: &Router, query: &str, authorization: Option<&str>) -> (u16, String) {
    let mut builder = Request::post(format!("/admin/reset?{query}"));
    if let Some(a) = authorization {
        builder = builder.header("authorization", a);
    }
    let res = send(app, builder.body(Body::empty()).unwrap()).await;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

#[tokio::test]
async fn a_reset_lets_a_client_back_in_and_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    // A frozen clock: the counts that must stand (bob's, k2's) get nothing back meanwhile.
    let (app, _clock) = frozen_app(&with_admin(MEMORY, &dir)).await;
    let (alice, bob) = ("192.0.2.1:5000", "192.0.2.2:5000");
    for who in [alice, bob] {
        for _ in 0..5 {
            assert_eq!(status(&app, "POST", "/login", who, None).await, 200);
        }
        assert_eq!(status(&app, "POST", "/login", who, None).await, 429);
    }

    // Without the token, or with another, nothing is reset.
    let query = "policy=login&ip=192.0.2.1";
    let res = send(
        &app,
        Request::post(format!("/admin/reset?{query}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["www-authenticate"], "Bearer realm=\"admin\"");
    let wrong = format!("Bearer {}", TOKEN.replace('0', "1"));
    let short = format!("Bearer {}", &TOKEN[..31]);
    for authorization in [
        wrong.as_str(),
        short.as_str(),
        TOKEN,
        "Basic YWRtaW46YWRtaW4=",
    ] {
        assert_eq!(admin(&app, query, Some(authorization)).await.0, 401);
    }
    assert_eq!(status(&app, "POST", "/login", alice, None).await, 429);

    // With it, alice's address starts from a full quota; bob's count stands.
    assert_eq!(
        admin(&app, query, Some(&bearer())).await,
        (204, String::new())
    );
    for _ in 0..5 {
        assert_eq!(status(&app, "POST", "/login", alice, None).await, 200);
    }
    assert_eq!(status(&app, "POST", "/login", alice, None).await, 429);
    assert_eq!(status(&app, "POST", "/login", bob, None).await, 429);
    // The scheme in any case, with any number of spaces after it (RFC 9110).
    for authorization in [format!("bearer {TOKEN}"), format!("BEARER   {TOKEN}")] {
        assert_eq!(
            admin(&app, query, Some(&authorization)).await,
            (204, String::new())
        );
    }
    assert_eq!(status(&app, "POST", "/login", alice, None).await, 200);
    assert_eq!(status(&app, "POST", "/login", bob, None).await, 429);

    // An IPv6 address resets its /64, as the limit counts it.
    for _ in 0..5 {
        assert_eq!(
            status(&app, "POST", "/login", "[2001:db8::1]:1", None).await,
            200
        );
    }
    assert_eq!(
        status(&app, "POST", "/login", "[2001:db8::2]:1", None).await,
        429
    );
    let (code, _) = admin(&app, "policy=login&ip=2001:db8::ffff", Some(&bearer())).await;
    assert_eq!(code, 204);
    assert_eq!(
        status(&app, "POST", "/login", "[2001:db8::3]:1", None).await,
        200
    );

    // A policy keyed by a header resets one value; another key keeps its count.
    for key in ["k1", "k2"] {
        for _ in 0..20 {
            assert_eq!(
                status(&app, "GET", "/api/items", "192.0.2.3:1", Some(key)).await,
                200
            );
        }
        assert_eq!(
            status(&app, "GET", "/api/items", "192.0.2.3:1", Some(key)).await,
            429
        );
    }
    let (code, _) = admin(&app, "policy=api&client=k1", Some(&bearer())).await;
    assert_eq!(code, 204);
    assert_eq!(
        status(&app, "GET", "/api/items", "192.0.2.3:1", Some("k1")).await,
        200
    );
    assert_eq!(
        status(&app, "GET", "/api/items", "192.0.2.3:1", Some("k2")).await,
        429
    );
    // Spaces around the value are not part of it, as they are not of the header's value.
    let (code, _) = admin(&app, "policy=api&client=%20k2%09+", Some(&bearer())).await;
    assert_eq!(code, 204);
    assert_eq!(
        status(&app, "GET", "/api/items", "192.0.2.3:1", Some("k2")).await,
        200
    );
}

/// A client value is the bytes the query encodes: a header value may hold any byte from 0x80 up,
/// and `client=k%FF` resets the client that sent `k` and the byte 0xFF, not the one whose value is
/// `k` and the UTF-8 of U+FFFD (what decoding the query as text made of it: that reset answered
/// 204, let that other client back in, and left the named one denied).
#[tokio::test]
async fn a_client_value_that_is_not_utf8_is_reset_by_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _clock) = frozen_app(&with_admin(MEMORY, &dir)).await;
    let get = |key: &'static [u8]| {
        let mut req = Request::get("/api/items")
            .header("x-api-key", HeaderValue::from_bytes(key).unwrap())
            .body(Body::empty())
            .unwrap();
        let peer: SocketAddr = "192.0.2.3:1".parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    };
    let raw: &'static [u8] = b"k\xff";
    let replaced: &'static [u8] = "k\u{FFFD}".as_bytes();
    for key in [raw, replaced] {
        for _ in 0..20 {
            assert_eq!(send(&app, get(key)).await.status(), 200);
        }
        assert_eq!(send(&app, get(key)).await.status(), 429);
    }
    assert_eq!(
        admin(&app, "policy=api&client=k%FF", Some(&bearer())).await,
        (204, String::new())
    );
    assert_eq!(send(&app, get(raw)).await.status(), 200, "the named client");
    assert_eq!(
        send(&app, get(replaced)).await.status(),
        429,
        "another client"
    );
    // Spaces around it, encoded or as `+`, are not part of it, as for any value.
    for _ in 0..19 {
        assert_eq!(send(&app, get(raw)).await.status(), 200);
    }
    assert_eq!(send(&app, get(raw)).await.status(), 429);
    assert_eq!(
        admin(&app, "policy=api&client=+k%FF%09", Some(&bearer()))
            .await
            .0,
        204
    );
    assert_eq!(send(&app, get(raw)).await.status(), 200);
}

#[tokio::test]
async fn mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = app(&with_admin(MEMORY, &dir)).await.unwrap();
    let auth = Some(bearer());
    let auth = auth.as_deref();
    let cases = [
        (
            "policy=nope&ip=192.0.2.1",
            404,
            "no route's policy is named \"nope\"",
        ),
        (
            "policy=login&client=k1",
            400,
            "\"login\" counts per client IP: give ip=ADDR",
        ),
        ("policy=login", 400, "\"login\" counts per client IP"),
        (
            "policy=login&ip=192.0.2.1&client=k1",
            400,
            "\"login\" counts per client IP",
        ),
        (
            "policy=login&ip=300.1.2.3",
            400,
            "ip: \"300.1.2.3\" is not an IP address",
        ),
        (
            "policy=api&ip=192.0.2.1",
            400,
            "\"api\" counts per header value: give client=VALUE",
        ),
        ("policy=api&client=", 400, "\"api\" counts per header value"),
        (
            "policy=api&client=%20+",
            400,
            "\"api\" counts per header value",
        ),
        ("ip=192.0.2.1", 400, "missing field `policy`"),
        // Named twice, even once encoded: which one was meant is not guessed.
        (
            "policy=api&client=k1&cl%69ent=k2",
            400,
            "duplicate field `client`",
        ),
        (
            "policy=login&ip=192.0.2.1&user=x",
            400,
            "unknown field `user`",
        ),
    ];
    for (query, code, says) in cases {
        let (got, body) = admin(&gateway, query, auth).await;
        assert_eq!(got, code, "{query}: {body}");
        assert!(body.contains(says), "{query}: {body}");
    }
    // A `GET` is not a reset.
    let res = send(
        &gateway,
        Request::get("/admin/reset?policy=login&ip=192.0.2.1")
            .header("authorization", bearer())
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);

    // A policy with one count for everyone is reset without a client.
    let global = MEMORY.replace(
        "path = \"/login\"\n",
        "path = \"/login\"\nkey = { source = \"global\" }\n",
    );
    let global = global.replacen("key = { source = \"ip\" }\n", "", 1);
    let (app, _clock) = frozen_app(&with_admin(&global, &dir)).await;
    for peer in [
        "192.0.2.1:1",
        "192.0.2.2:1",
        "192.0.2.3:1",
        "192.0.2.4:1",
        "192.0.2.5:1",
    ] {
        assert_eq!(status(&app, "POST", "/login", peer, None).await, 200);
    }
    assert_eq!(
        status(&app, "POST", "/login", "192.0.2.6:1", None).await,
        429
    );
    let (code, body) = admin(&app, "policy=login&ip=192.0.2.1", auth).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("one count for everyone"), "{body}");
    assert_eq!(admin(&app, "policy=login", auth).await.0, 204);
    assert_eq!(
        status(&app, "POST", "/login", "192.0.2.7:1", None).await,
        200
    );
}

/// Without an `[admin]` table there is no such route: a reset request is a 404, token or not.
#[tokio::test]
async fn no_admin_table_no_route() {
    let app = app(&Config::from_toml(MEMORY).unwrap()).await.unwrap();
    let (code, _) = admin(&app, "policy=login&ip=192.0.2.1", Some(&bearer())).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_missing_or_weak_token_stops_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let file = |contents: &str| {
        let path = dir.path().join(format!("t{}", contents.len()));
        std::fs::write(&path, contents).unwrap();
        format!("[admin]\ntoken_file = {:?}\n", path.display().to_string())
    };
    let missing = dir.path().join("none").display().to_string();
    let cases = [
        ("[admin]\n".to_owned(), "admin: give the token's source"),
        (
            format!("[admin]\ntoken_env = \"X\"\ntoken_file = {missing:?}\n"),
            "admin: give the token's source",
        ),
        (
            "[admin]\ntoken_env = \"\"\n".to_owned(),
            "admin.token_env: must be the name",
        ),
        (
            "[admin]\ntoken_env = \"RATELIMIT_TEST_SURELY_UNSET_TOKEN\"\n".to_owned(),
            "admin.token_env: the environment variable it names is not set",
        ),
        // The token written where its source belongs is not shown.
        (
            format!("[admin]\ntoken_env = \"{TOKEN}\"\n"),
            "admin.token_env: the environment variable it names is not set",
        ),
        (
            format!("[admin]\ntoken_file = {missing:?}\n"),
            "admin.token_file: cannot read",
        ),
        // Nor the token written where its file's path belongs.
        (
            format!("[admin]\ntoken_file = \"{TOKEN}\"\n"),
            "admin.token_file: cannot read the file it names",
        ),
        (
            file("short-secret\n"),
            "admin.token_file: the token has 12 bytes, fewer than 16",
        ),
        (
            file("0123456789abcdef 0123456789abcdef"),
            "admin.token_file: the token must be visible ASCII characters without spaces",
        ),
        (
            "[admin]\ntoken = \"x\"\n".to_owned(),
            "admin.token: unknown field",
        ),
    ];
    for (admin, says) in cases {
        let text = format!("{MEMORY}\n{admin}");
        let err = match Config::from_toml(&text) {
            Err(e) => e.to_string(),
            Ok(config) => app(&config).await.expect_err("refused").to_string(),
        };
        assert!(err.starts_with(says), "{admin}: {err}");
        assert!(!err.contains("short-secret"), "{err}");
        assert!(!err.contains(TOKEN), "{err}");
    }
    // Nor a token given as the table itself.
    let err = Config::from_toml(&format!("admin = \"{TOKEN}\"\n{MEMORY}"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("admin: invalid type: a string"), "{err}");
    assert!(!err.contains(TOKEN), "{err}");
}

/// The token from the environment, through the binary (a test cannot set its own environment
/// safely while others run): `--check` starts with it and stops without it, naming the setting
/// and not echoing anything of a weak token.
#[cfg(unix)]
#[test]
fn the_binary_reads_the_token_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!("{MEMORY}\n[admin]\ntoken_env = \"GATEWAY_ADMIN_TOKEN\"\n"),
    )
    .unwrap();
    let check = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_example-gateway"));
        cmd.arg("--config").arg(&path).arg("--check");
        cmd.env_remove("GATEWAY_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("GATEWAY_ADMIN_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(check(Some(TOKEN)).0, Some(0));
    let (code, err) = check(None);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("admin.token_env: the environment variable it names is not set"),
        "{err}"
    );
    let (code, err) = check(Some("hunter2hunter2"));
    assert_eq!(code, Some(2));
    assert!(err.contains("fewer than 16"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// Over Redis, with the denial cache, coalescing and `watch_resets`: the reset reaches Redis and
/// ends this gateway's cached denial at once, and, announced, the other gateway's as soon as its
/// watch hears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_over_redis_ends_the_cached_denials_of_every_watching_gateway() {
    let server = redis_harness::RedisServer::start();
    let text = REDIS
        .replace(
            "url = \"redis://127.0.0.1:6379\"",
            &format!("url = {:?}", server.url()),
        )
        .replace("timeout_ms = 50\n", "timeout_ms = 2000\n");
    for setting in [
        "denial_cache = true",
        "coalesce = true",
        "watch_resets = true",
    ] {
        assert!(text.contains(setting), "{setting}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = with_admin(&text, &dir);
    let (a, b) = (app(&config).await.unwrap(), app(&config).await.unwrap());
    let peer = "192.0.2.50:1";
    for _ in 0..5 {
        assert_eq!(status(&a, "POST", "/login", peer, None).await, 200);
    }
    for gateway in [&a, &b] {
        assert_eq!(status(gateway, "POST", "/login", peer, None).await, 429);
    }
    // Answered from the caches now: Redis is not asked.
    let calls = server.script_calls();
    for gateway in [&a, &b] {
        assert_eq!(status(gateway, "POST", "/login", peer, None).await, 429);
    }
    assert_eq!(server.script_calls(), calls);

    let (code, _) = admin(&a, "policy=login&ip=192.0.2.50", Some(&bearer())).await;
    assert_eq!(code, 204);
    assert_eq!(status(&a, "POST", "/login", peer, None).await, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while status(&b, "POST", "/login", peer, None).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "b still answers its cached denial"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A full quota again, shared: 2 admitted so far, 3 more.
    for _ in 0..3 {
        assert_eq!(status(&b, "POST", "/login", peer, None).await, 200);
    }
    assert_eq!(status(&a, "POST", "/login", peer, None).await, 429);
}
