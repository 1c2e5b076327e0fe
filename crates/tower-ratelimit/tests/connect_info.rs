//! An app served without connect info: the peer-address keys find no address on any request. The
//! server's setup is at fault, not the client, so the library says so in the log, once per process
//! (a test binary of its own, so that no other test has said it first).

// The peer-address key, the policy's default here, comes with the default `axum` feature.
#![cfg(feature = "axum")]

mod common;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::*;
use ratelimit_core::{Algorithm, Limit, Quota};
use tower_ratelimit::{Policy, RateLimitLayer};

#[tokio::test]
async fn a_missing_connect_info_is_logged_once_as_the_servers_mistake() {
    let (lines, _guard) = Lines::capture();

    let store = store().1;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(10).unwrap()).unwrap();
    // The default key is the peer's address.
    let policy = Policy::new("peer", limit).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    for _ in 0..3 {
        let req = http::Request::get("/").body(Body::empty()).unwrap();
        let res = send(&app, req).await;
        assert_eq!(res.status(), 400);
    }
    // A request with the address is served and logs nothing more.
    assert_eq!(send(&app, request("/")).await.status(), 200);

    let text = lines.text();
    assert_eq!(text.matches("WARN").count(), 1, "{text}");
    assert!(
        text.contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "{text}"
    );
}
