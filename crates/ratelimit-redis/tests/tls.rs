//! `rediss://` URLs (with the `tls` or the `tls-rustls` feature): a server with its own CA,
//! verified with the CA's certificate, refused without it, and accepted unverified only when asked
//! (`#insecure`); with `tls-rustls`, a Redis Cluster over TLS with its own CA as well.
//!
//! `cargo test -p ratelimit-redis --features tls --test tls` (native-tls, the system's OpenSSL)
//! and `cargo test -p ratelimit-redis --features tls-rustls --test tls` (rustls).
#![cfg(any(feature = "tls", feature = "tls-rustls"))]

use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, RedisStoreError, ResetNotice};
#[cfg(feature = "tls-rustls")]
use redis_harness::tls::TlsRedisCluster;
use redis_harness::tls::TlsRedisServer;

/// `err` is a configuration error naming the setting `name`.
fn assert_config(err: &RedisStoreError, name: &str) {
    assert!(
        matches!(err, RedisStoreError::Config { name: n, .. } if *n == name),
        "expected a Config error naming {name}: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca() {
    let server = TlsRedisServer::start();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();

    // Verified against the test CA.
    let store = RedisStore::builder(server.url())
        .tls_root_certificate(server.ca_pem())
        .build()
        .await
        .unwrap();
    let d = store.check(b"k", &limit, 1).await.unwrap();
    assert_eq!(d.remaining(), 9);

    // With both features on, redis-rs would verify against no roots at all without the CA:
    // refused, naming the setting (see `both_features_need_the_ca`).
    if cfg!(all(feature = "tls", feature = "tls-rustls")) {
        return;
    }

    // The system's roots do not know the test CA: the handshake fails, nothing is sent.
    let err = RedisStore::builder(server.url()).build().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    // Unverified, only when the URL says so.
    let insecure = RedisStore::builder(format!("{}/#insecure", server.url()))
        .build()
        .await
        .unwrap();
    assert_eq!(
        insecure.check(b"k", &limit, 1).await.unwrap().remaining(),
        8
    );
}

#[tokio::test]
async fn a_plain_url_cannot_reach_a_tls_port() {
    let server = TlsRedisServer::start();
    let url = server.url().replacen("rediss://", "redis://", 1);
    let err = RedisStore::builder(url)
        .response_timeout(std::time::Duration::from_millis(500))
        .connect_timeout(std::time::Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RedisStoreError::Connection { .. }
                | RedisStoreError::Timeout { .. }
                | RedisStoreError::Redis(_)
        ),
        "{err:?}"
    );
}

/// A Redis that asks clients for a certificate (`tls-auth-clients yes`, Redis's default once TLS
/// is on) serves a store presenting one from its CA, and refuses a store without one; a key that
/// cannot be read is named as the setting at `build`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_for_a_server_that_asks_for_one() {
    let server = TlsRedisServer::start_requiring_client_certificates();
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
    let builder = RedisStore::builder(server.url())
        .tls_root_certificate(server.ca_pem())
        .tls_client_certificate(server.client_cert_pem(), server.client_key_pem());
    // The builder's `Debug` tells that the certificates are set, not what they hold.
    let shown = format!("{builder:?}");
    assert!(
        shown.contains("tls_client_certificate: true") && !shown.contains("PRIVATE KEY"),
        "{shown}"
    );
    let store = builder.announce_resets(true).build().await.unwrap();
    assert_eq!(store.check(b"k", &limit, 1).await.unwrap().remaining(), 9);

    // The reset watch makes its own connection, with the same certificates: it subscribes and
    // hears this store's reset.
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let _watch = store
        .watch_resets(move |notice| {
            let _ = tx.send(match notice {
                ResetNotice::Reset { key, .. } => Some(key.to_vec()),
                _ => None,
            });
        })
        .unwrap();
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(5), heard.recv())
            .await
            .expect("the watch heard nothing in time")
            .expect("the watch ended")
    };
    assert_eq!(next().await, None, "subscribed first");
    ratelimit_core::Reset::reset(&store, b"k", &limit)
        .await
        .unwrap();
    assert_eq!(next().await, Some(b"k".to_vec()));

    let err = RedisStore::builder(server.url())
        .tls_root_certificate(server.ca_pem())
        .build()
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    for key in [
        b"not a key".to_vec(),
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_vec(),
        // The CA's certificate where its key should be.
        server.ca_pem(),
    ] {
        let err = RedisStore::builder(server.url())
            .tls_root_certificate(server.ca_pem())
            .tls_client_certificate(server.client_cert_pem(), key)
            .build()
            .await
            .unwrap_err();
        assert_config(&err, "tls_client_certificate");
    }

    // Another key than the certificate's (the server's): rustls compares them at `build`;
    // native-tls finds out at the handshake, as a failed connection.
    let other_key = std::fs::read(server.ca_path().with_file_name("server.key")).unwrap();
    let err = RedisStore::builder(server.url())
        .tls_root_certificate(server.ca_pem())
        .tls_client_certificate(server.client_cert_pem(), other_key)
        .build()
        .await
        .unwrap_err();
    if cfg!(feature = "tls-rustls") {
        assert_config(&err, "tls_client_certificate");
    } else {
        assert!(err.is_unavailable(), "{err:?}");
    }
}

/// rustls presents X.509 v3 certificates only; a v1 one (what `openssl x509 -req` writes without
/// `-extfile`) is refused at `build` in words that say so, not rustls's "invalid peer
/// certificate", which reads as the server's.
#[cfg(feature = "tls-rustls")]
#[tokio::test]
async fn a_version_1_client_certificate_is_refused_by_name_under_rustls() {
    let dir = tempfile::tempdir().unwrap();
    let openssl = |args: &[&str]| redis_harness::tls::openssl(dir.path(), args);
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=client",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-key",
        "client.key",
        "-days",
        "2",
        "-out",
        "client.pem",
    ]);
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let err = RedisStore::builder("rediss://127.0.0.1:1")
        .tls_client_certificate(read("client.pem"), read("client.key"))
        .build()
        .await
        .unwrap_err();
    assert_config(&err, "tls_client_certificate");
    let text = err.to_string();
    assert!(
        text.contains("X.509 v1") && text.contains("v3") && !text.contains("peer"),
        "{text}"
    );
}

/// On native-tls the cluster client takes no certificate (it verifies against the system's roots
/// only, and presents none): a cluster builder given one is refused at `build`, rather than the
/// certificate being silently unused and every connection failing its handshake.
#[cfg(not(feature = "tls-rustls"))]
#[tokio::test]
async fn a_root_certificate_is_refused_for_a_cluster() {
    let err = RedisStore::cluster(["rediss://127.0.0.1:1"])
        .tls_root_certificate(b"-----BEGIN CERTIFICATE-----\n".to_vec())
        .build()
        .await
        .unwrap_err();
    assert_config(&err, "tls_root_certificate");
    let err = RedisStore::cluster(["rediss://127.0.0.1:1"])
        .tls_client_certificate(b"cert".to_vec(), b"key".to_vec())
        .build()
        .await
        .unwrap_err();
    assert_config(&err, "tls_client_certificate");
}

/// With rustls, a cluster whose nodes' certificates come from a private CA and which asks
/// clients for a certificate from it: the store is given one node's URL, the CA and a client
/// certificate, and reaches the other nodes, named by the slot map, through TLS verified against
/// that CA, presenting that certificate. Without the CA, or without the certificate, it reaches
/// none.
#[cfg(feature = "tls-rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_with_a_private_ca() {
    let cluster = TlsRedisCluster::start_requiring_client_certificates(3);
    let seed = cluster.urls().swap_remove(0);
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(3).unwrap()).unwrap();
    let store = RedisStore::cluster([seed.clone()])
        .tls_root_certificate(cluster.ca_pem())
        .tls_client_certificate(cluster.client_cert_pem(), cluster.client_key_pem())
        .build()
        .await
        .unwrap();

    // Keys spread over every master: each is counted exactly, wherever its slot lives.
    let keys: Vec<String> = (0..30).map(|i| format!("user:{i}")).collect();
    for key in &keys {
        let answers: Vec<bool> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(
                    store
                        .check(key.as_bytes(), &limit, 1)
                        .await
                        .unwrap()
                        .is_allowed(),
                );
            }
            v
        };
        assert_eq!(answers, [true, true, true, false], "{key}");
    }
    for node in cluster.nodes() {
        let held: u64 = node.cli(&["dbsize"]).parse().unwrap();
        assert!(held > 0, "node {} holds no state: not reached", node.port());
    }

    // Without the client certificate the nodes refuse the connection.
    let err = RedisStore::cluster([seed.clone()])
        .tls_root_certificate(cluster.ca_pem())
        .build()
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    // The system's roots do not know the test CA: no node's handshake succeeds (with both
    // features on, refused before any: see `both_features_need_the_ca`).
    let err = RedisStore::cluster([seed])
        .tls_client_certificate(cluster.client_cert_pem(), cluster.client_key_pem())
        .build()
        .await
        .unwrap_err();
    if cfg!(all(feature = "tls", feature = "tls-rustls")) {
        assert_config(&err, "url");
    } else {
        assert!(err.is_unavailable(), "{err:?}");
    }
}

/// With both `tls` and `tls-rustls` on (features unify across a build), redis-rs connects
/// through rustls but leaves the system's roots to native-tls, so a `rediss://` store without a
/// root certificate could verify no server: refused at `build`, naming the URL, rather than
/// failing every handshake.
#[cfg(all(feature = "tls", feature = "tls-rustls"))]
#[tokio::test]
async fn both_features_need_the_ca() {
    let server = TlsRedisServer::start();
    let err = RedisStore::builder(server.url()).build().await.unwrap_err();
    assert!(
        matches!(&err, RedisStoreError::Config { name: "url", .. })
            && err.to_string().contains("tls_root_certificate"),
        "{err:?}"
    );
}
