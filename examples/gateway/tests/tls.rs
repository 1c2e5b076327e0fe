//! The gateway over `rediss://` (its `tls` or `tls-rustls` feature): a Redis whose certificate
//! comes from a private CA, trusted through `store.tls_ca_file`, against a real TLS redis-server;
//! with `tls-rustls`, a Redis Cluster over TLS with its own CA as well.
//!
//! Run with: cargo test -p example-gateway --features tls --test tls
//! (or `--features tls-rustls`)
#![cfg(any(feature = "tls", feature = "tls-rustls"))]

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use example_gateway::{Config, StartError, app};
use redis_harness::tls::TlsRedisServer;
use tower::ServiceExt;

/// A gateway configuration on `url`: logins limited to 5 a minute per IP, and the CA file's
/// line if given (`tls_ca_file` as written in TOML, quoted).
fn config(url: &str, ca_file: Option<&str>) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"tls\"\ntimeout_ms = 2000\n\
         connect_timeout_ms = 2000\n{}\
         [[routes]]\npath = \"/login\"\nkey = {{ source = \"ip\" }}\n\
         [routes.policy]\nname = \"login\"\nquotas = [{{ limit = 5, per = \"minute\" }}]\n\
         failure = {{ mode = \"closed\", retry_after_secs = 5 }}\n",
        ca_file.map_or(String::new(), |f| format!("tls_ca_file = {f:?}\n")),
    )
}

async fn login(app: &Router, peer: &str) -> u16 {
    let mut req = Request::post("/login").body(Body::empty()).unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    app.clone().oneshot(req).await.unwrap().status().as_u16()
}

async fn start_error(text: &str) -> String {
    let config = Config::from_toml(text).unwrap();
    match app(&config).await {
        Ok(_) => panic!("the gateway started:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Two gateways on one TLS Redis share the limit: the state is in Redis, reached through TLS
/// verified against the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_a_limit_over_rediss_with_a_private_ca() {
    let server = TlsRedisServer::start();
    let ca = server.ca_path();
    let text = config(&server.url(), Some(ca.to_str().unwrap()));
    let config = Config::from_toml(&text).unwrap();
    let a = app(&config).await.unwrap();
    let b = app(&config).await.unwrap();

    let peer = "192.0.2.10:1000";
    for gw in [&a, &b, &a, &b, &a] {
        assert_eq!(login(gw, peer).await, 200);
    }
    assert_eq!(login(&b, peer).await, 429);
    assert_eq!(login(&a, peer).await, 429);
    // Another client is counted apart.
    assert_eq!(login(&b, "192.0.2.11:1000").await, 200);
    // The counts are in the TLS server's keys.
    let keys = server.cli(&["--scan", "--pattern", "tls:*"]);
    assert_eq!(keys.lines().count(), 2, "{keys}");
}

/// A Redis that asks clients for a certificate (`tls-auth-clients yes`): the gateway presents the
/// one of `store.tls_client_cert_file` and `store.tls_client_key_file`; without them it does not
/// start; a key file that is not the certificate's key, or holds no key, is named at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_for_a_redis_that_asks_for_one() {
    let server = TlsRedisServer::start_requiring_client_certificates();
    let ca = server.ca_path();
    let files = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "tls_client_cert_file = {:?}\ntls_client_key_file = {:?}\n",
            cert.to_str().unwrap(),
            key.to_str().unwrap()
        )
    };
    let with = |extra: &str| {
        config(&server.url(), Some(ca.to_str().unwrap())).replacen(
            "[[routes]]",
            &format!("{extra}[[routes]]"),
            1,
        )
    };
    let text = with(&files(
        &server.client_cert_path(),
        &server.client_key_path(),
    ));
    let gw = app(&Config::from_toml(&text).unwrap()).await.unwrap();
    for _ in 0..5 {
        assert_eq!(login(&gw, "192.0.2.10:1000").await, 200);
    }
    assert_eq!(login(&gw, "192.0.2.10:1000").await, 429);

    let config = Config::from_toml(&with("")).unwrap();
    let err = app(&config)
        .await
        .expect_err("started without a client certificate");
    assert!(matches!(err, StartError::Store(_)), "{err:?}");

    // The CA's certificate in place of the key: no key in it.
    let err = start_error(&with(&files(&server.client_cert_path(), &ca))).await;
    assert!(
        err.starts_with("store.tls_client_key_file: ") && err.contains("holds no PEM private key"),
        "{err}"
    );
    // An encrypted key, which the gateway cannot use: named as the key file's problem (the store
    // checks the pair as one setting, which would name the certificate's file). With `tls`, a
    // key that is not PKCS#8 too (native-tls takes no other); rustls takes SEC1 and PKCS#1.
    let dir = tempfile::tempdir().unwrap();
    let relabelled = |label: &str| {
        let pem = std::fs::read_to_string(server.client_key_path()).unwrap();
        let path = dir.path().join(format!("{}.key", label.replace(' ', "-")));
        std::fs::write(&path, pem.replace("PRIVATE KEY", label)).unwrap();
        path
    };
    let encrypted = relabelled("ENCRYPTED PRIVATE KEY");
    let err = start_error(&with(&files(&server.client_cert_path(), &encrypted))).await;
    assert_eq!(
        err,
        format!(
            "store.tls_client_key_file: {} holds an encrypted private key, which the gateway \
             cannot decrypt: give it the key unencrypted (`openssl pkcs8 -in <file> -out <new \
             file>`)",
            encrypted.display()
        )
    );
    if cfg!(not(feature = "tls-rustls")) {
        let sec1 = relabelled("EC PRIVATE KEY");
        let err = start_error(&with(&files(&server.client_cert_path(), &sec1))).await;
        assert_eq!(
            err,
            format!(
                "store.tls_client_key_file: {} holds a private key in a form the `tls` build \
                 (native-tls) cannot use: it takes PKCS#8 (`-----BEGIN PRIVATE KEY-----`; \
                 convert with `openssl pkcs8 -topk8 -nocrypt -in <file> -out <new file>`)",
                sec1.display()
            )
        );
    }
    // A key, but not the certificate's (the server's): rustls tells at start, naming the
    // setting; native-tls at the handshake, as a Redis that cannot be reached.
    let other_key = ca.with_file_name("server.key");
    let text = with(&files(&server.client_cert_path(), &other_key));
    if cfg!(feature = "tls-rustls") {
        let err = start_error(&text).await;
        assert!(err.starts_with("store.tls_client_cert_file: "), "{err}");
    } else {
        let err = app(&Config::from_toml(&text).unwrap())
            .await
            .expect_err("started with another key");
        assert!(matches!(err, StartError::Store(_)), "{err:?}");
    }
}

/// Without the CA file the system's roots do not know the server's CA: the gateway does not
/// start (the handshake fails, as a server that cannot be reached does), rather than starting
/// with every check failing.
#[tokio::test]
async fn without_the_ca_file_the_handshake_fails_at_start() {
    let server = TlsRedisServer::start();
    let config = Config::from_toml(&config(&server.url(), None)).unwrap();
    let err = app(&config).await.expect_err("started without the CA");
    assert!(matches!(err, StartError::Store(_)), "{err:?}");
}

/// A CA file that cannot be read, or that holds no certificate, is named at start as the
/// field's error.
#[tokio::test]
async fn a_wrong_ca_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.pem");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.pem");
    for (file, expected) in [
        (&missing, "cannot read "),
        (&key, "holds no PEM certificate"),
    ] {
        let path = file.to_str().unwrap();
        let err = start_error(&config("rediss://127.0.0.1:6379", Some(path))).await;
        assert!(
            err.starts_with("store.tls_ca_file: ") && err.contains(expected) && err.contains(path),
            "{err}"
        );
    }
}

/// With `tls-rustls`, a `redis_cluster` store over TLS whose nodes' certificates come from a
/// private CA, and which ask clients for a certificate: two gateways given one seed node, the CA
/// file and a client certificate share a limit, whatever node each key's slot is on.
#[cfg(feature = "tls-rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_a_limit_over_a_tls_cluster_with_a_private_ca() {
    let cluster = redis_harness::tls::TlsRedisCluster::start_requiring_client_certificates(3);
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("client.pem"),
        dir.path().join("client.key"),
    );
    std::fs::write(&ca, cluster.ca_pem()).unwrap();
    std::fs::write(&cert, cluster.client_cert_pem()).unwrap();
    std::fs::write(&key, cluster.client_key_pem()).unwrap();
    let text = format!(
        "[store]\nkind = \"redis_cluster\"\nurls = [\"{}\"]\nprefix = \"tls\"\n\
         timeout_ms = 2000\nconnect_timeout_ms = 2000\ntls_ca_file = {:?}\n\
         tls_client_cert_file = {:?}\ntls_client_key_file = {:?}\n\
         [[routes]]\npath = \"/login\"\nkey = {{ source = \"ip\" }}\n\
         [routes.policy]\nname = \"login\"\nquotas = [{{ limit = 5, per = \"minute\" }}]\n\
         failure = {{ mode = \"closed\", retry_after_secs = 5 }}\n",
        cluster.urls()[0],
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let config = Config::from_toml(&text).unwrap();
    let a = app(&config).await.unwrap();
    let b = app(&config).await.unwrap();

    // Clients whose keys land on every node: each gets its five logins, shared by the two.
    let peers: Vec<String> = (1..=40).map(|i| format!("192.0.2.{i}:1000")).collect();
    for peer in &peers {
        for gw in [&a, &b, &a, &b, &a] {
            assert_eq!(login(gw, peer).await, 200, "{peer}");
        }
        assert_eq!(login(&b, peer).await, 429, "{peer}");
    }
    for node in cluster.nodes() {
        let keys = node.cli(&["--scan", "--pattern", "tls:*"]);
        assert!(
            keys.lines().count() > 0,
            "node {} holds no count: not reached",
            node.port()
        );
    }
}
