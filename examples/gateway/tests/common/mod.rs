//! What the gateway's test files share: requests as a server gets them, sent through the router.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use example_gateway::{Config, app_with_clock};
use ratelimit_core::ManualClock;
use tower::ServiceExt;

/// The gateway of `config` on its in-memory store, with a clock that moves only when the test
/// advances it: refills and waits come out exact however long the test takes.
pub(crate) async fn frozen_app(config: &Config) -> (Router, ManualClock) {
    let clock = ManualClock::new();
    let app = app_with_clock(config, clock.clone()).await.unwrap();
    (app, clock)
}

/// A request from `peer`, with an API key if given. The peer address is what
/// `into_make_service_with_connect_info` would put in the extensions.
pub(crate) fn request(method: &str, uri: &str, peer: &str, api_key: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    let mut req = builder.body(Body::empty()).unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

pub(crate) async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

pub(crate) async fn status(
    app: &Router,
    method: &str,
    uri: &str,
    peer: &str,
    key: Option<&str>,
) -> u16 {
    send(app, request(method, uri, peer, key))
        .await
        .status()
        .as_u16()
}
