//! `rediss://` URLs (with the `tls` feature): a server with its own CA, verified with the CA's
//! certificate, refused without it, and accepted unverified only when asked (`#insecure`).
#![cfg(feature = "tls")]

use ratelimit_core::{Algorithm, Limit, Quota};
use ratelimit_redis::{RedisStore, RedisStoreError};
use redis_harness::tls::TlsRedisServer;

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

/// The cluster client takes no root certificate (on native-tls it verifies against the system's
/// roots only): a cluster builder given one is refused at `build`, rather than the certificate
/// being silently unused and every connection failing its handshake.
#[tokio::test]
async fn a_root_certificate_is_refused_for_a_cluster() {
    let err = RedisStore::cluster(["rediss://127.0.0.1:1"])
        .tls_root_certificate(b"-----BEGIN CERTIFICATE-----\n".to_vec())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RedisStoreError::Config {
                name: "tls_root_certificate",
                ..
            }
        ),
        "{err:?}"
    );
}
