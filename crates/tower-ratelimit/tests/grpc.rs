//! `DenialBody::Grpc` end to end: a real server on 127.0.0.1 speaking HTTP/2, and tonic's own
//! client, which reads a denial as the gRPC status `RESOURCE_EXHAUSTED` with the wait in its
//! metadata.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Response, StatusCode};
use axum::routing::post;
use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};
use tower_ratelimit::key::{ApiKeyHeader, GlobalKey};
use tower_ratelimit::{DenialBody, FailurePolicy, MissingKey, Policy, RateLimitLayer};

/// Messages as the bytes they are: no schema needed to call a method.
#[derive(Debug, Default, Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The service behind the layer: every call is answered with the gRPC status `UNIMPLEMENTED`
/// (a trailers-only response), which tells a call that reached it from one the layer denied.
async fn unimplemented() -> Response<axum::body::Body> {
    let mut res = Response::new(axum::body::Body::empty());
    *res.status_mut() = StatusCode::OK;
    let h = res.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static("12"));
    h.insert(
        "grpc-message",
        HeaderValue::from_static("reached the service"),
    );
    res
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The service at `/test.Echo/Call`, to put a layer on.
/// A router whose `/` answers as an unimplemented gRPC method.
fn root() -> Router {
    Router::new().route("/", post(unimplemented))
}

fn echo() -> Router {
    Router::new().route("/test.Echo/Call", post(unimplemented))
}

/// `n` calls of `/test.Echo/Call` at `addr` by tonic's client over HTTP/2: their statuses.
async fn calls(addr: SocketAddr, n: usize) -> Vec<Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    let mut statuses = Vec::new();
    for _ in 0..n {
        client.ready().await.unwrap();
        let status = client
            .unary(
                tonic::Request::new(Bytes::from_static(b"hello")),
                PathAndQuery::from_static("/test.Echo/Call"),
                Raw,
            )
            .await
            .unwrap_err();
        statuses.push(status);
    }
    statuses
}

/// Two calls through a layer allowing one an hour, answering denials with `body`: the first
/// call's status and the second's.
async fn two_calls(body: DenialBody) -> (Status, Status) {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let policy = Policy::new("grpc", limit)
        .unwrap()
        .key(GlobalKey)
        .body(body);
    let addr = serve(echo().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap())).await;
    let mut statuses = calls(addr, 2).await.into_iter();
    (statuses.next().unwrap(), statuses.next().unwrap())
}

#[tokio::test]
async fn a_grpc_client_reads_a_denial_as_resource_exhausted_with_its_wait() {
    let (first, denied) = two_calls(DenialBody::Grpc).await;
    assert_eq!(first.code(), Code::Unimplemented, "{first:?}");
    assert_eq!(first.message(), "reached the service");
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(denied.message(), "Too Many Requests");
    let meta = denied.metadata();
    let text = |name: &str| meta.get(name).map(|v| v.to_str().unwrap().to_owned());
    // The wait is just under an hour (the time since the first call): in whole seconds rounded
    // up, an hour; in milliseconds rounded up, a few short of 3,600,000.
    assert_eq!(text("retry-after").as_deref(), Some("3600"));
    let pushback: u64 = text("grpc-retry-pushback-ms").unwrap().parse().unwrap();
    assert!(
        (3_590_000..=3_600_000).contains(&pushback),
        "{pushback} ms: {meta:?}"
    );
    assert_eq!(
        text("ratelimit-policy").as_deref(),
        Some("\"grpc\";q=1;w=3600")
    );
    assert_eq!(text("ratelimit").as_deref(), Some("\"grpc\";r=0;t=3600"));
}

/// Why the mode is there: a plain 429 does not reach a gRPC client as a rate limit. tonic reads
/// its text body as a gRPC message and fails with `INTERNAL` ("protocol error: ... invalid
/// compression flag"); the gRPC spec maps a 429 without a gRPC status to `UNAVAILABLE`, the code
/// of a server that is down.
#[tokio::test]
async fn a_grpc_client_reads_a_plain_429_as_an_internal_error() {
    let (first, denied) = two_calls(DenialBody::PlainText).await;
    assert_eq!(first.code(), Code::Unimplemented, "{first:?}");
    assert_eq!(denied.code(), Code::Internal, "{denied:?}");
    assert!(denied.message().contains("429"), "{denied:?}");
}

/// The layer's other answers are gRPC statuses too under `DenialBody::Grpc`: failing closed is
/// `UNAVAILABLE` with its wait, and a request without a key is `INVALID_ARGUMENT` (a rejection
/// with 400), or `UNAUTHENTICATED` (with 401).
#[tokio::test]
async fn failing_closed_and_missing_keys_are_grpc_statuses_too() {
    let limit = || Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let closed = Policy::new("closed", limit())
        .unwrap()
        .key(GlobalKey)
        .body(DenialBody::Grpc)
        .failure(FailurePolicy::fail_closed(Duration::from_secs(7)));
    let store = Arc::new(common::FailingStore::default());
    let addr = serve(echo().layer(RateLimitLayer::new(store, closed).unwrap())).await;
    let status = calls(addr, 1).await.remove(0);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status.message(),
        "Service Unavailable: the rate limiter cannot decide"
    );
    let meta = status.metadata();
    assert_eq!(meta.get("retry-after").unwrap(), "7");
    assert_eq!(meta.get("grpc-retry-pushback-ms").unwrap(), "7000");

    for (answer, code, message) in [
        (
            MissingKey::reject(400).unwrap(),
            Code::InvalidArgument,
            "No rate-limit key in the request (send one non-empty x-api-key header)",
        ),
        (
            MissingKey::unauthorized("Bearer").unwrap(),
            Code::Unauthenticated,
            "Unauthorized: this request needs credentials (send one non-empty x-api-key header)",
        ),
    ] {
        let keyed = Policy::new("keyed", limit())
            .unwrap()
            .key(ApiKeyHeader::new("x-api-key").unwrap())
            .missing_key(answer)
            .body(DenialBody::Grpc);
        let addr =
            serve(echo().layer(RateLimitLayer::new(MemoryStore::new(), keyed).unwrap())).await;
        let status = calls(addr, 1).await.remove(0);
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(status.message(), message);
    }
}

/// A gRPC policy answers only gRPC calls with a gRPC status: any other request under the same
/// layer (a REST route, a browser) gets the plain 429, never a 200 that reads as success.
#[tokio::test]
async fn other_requests_under_a_grpc_policy_get_a_plain_429() {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let policy = Policy::new("mixed", limit)
        .unwrap()
        .key(GlobalKey)
        .body(DenialBody::Grpc);
    let app = Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    assert_eq!(common::send(&app, common::request("/")).await.status(), 200);
    let res = common::send(&app, common::request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(common::header(&res, "grpc-status"), None);
    assert_eq!(common::header(&res, "retry-after"), Some("3600"));
    assert_eq!(common::body_text(res).await, "Too Many Requests\n");
    // A `GET` or `HEAD` that sends gRPC's content type is no gRPC call (every one is a `POST`):
    // the plain 429, not an empty 200 that a shared cache could keep for the URL.
    for method in [http::Method::GET, http::Method::HEAD] {
        let mut req = common::grpc_request("/", "application/grpc");
        *req.method_mut() = method.clone();
        let res = common::send(&app, req).await;
        assert_eq!(res.status(), 429, "{method}");
        assert_eq!(common::header(&res, "grpc-status"), None, "{method}");
        assert_eq!(common::header(&res, "retry-after"), Some("3600"));
    }
}

/// `grpc-retry-pushback-ms: -1` ("do not retry") where a retry would meet the same answer: a
/// cost the limit can never admit, a call without a key. A cost that only the fallback's local
/// share cannot admit is told when the store is asked again: it may be back for the retry.
#[tokio::test]
async fn calls_that_a_retry_cannot_mend_are_told_not_to_retry() {
    let grpc_call = |cost: &'static str| {
        let mut req = common::grpc_request("/", "application/grpc");
        req.headers_mut()
            .insert("x-cost", HeaderValue::from_static(cost));
        req
    };
    let cost = common::cost_header;
    let pushback = |res: &Response<axum::body::Body>| {
        common::header(res, "grpc-retry-pushback-ms").map(str::to_owned)
    };
    // 3 an hour: a cost of 4 can never pass.
    let limit = || Limit::single(Algorithm::TokenBucket, Quota::per_hour(3).unwrap()).unwrap();
    let policy = Policy::new("costly", limit())
        .unwrap()
        .key(GlobalKey)
        .cost(cost)
        .body(DenialBody::Grpc);
    let app = root().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let res = common::send(&app, grpc_call("4")).await;
    assert_eq!(common::header(&res, "grpc-status"), Some("8"));
    assert_eq!(pushback(&res).as_deref(), Some("-1"));
    assert_eq!(
        common::header(&res, "grpc-message"),
        Some("Too Many Requests: this request costs more than the limit can ever admit at once")
    );
    assert_eq!(common::header(&res, "retry-after"), None);

    let keyed = Policy::new("keyed", limit())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .body(DenialBody::Grpc);
    let app = root().layer(RateLimitLayer::new(MemoryStore::new(), keyed).unwrap());
    let res = common::send(&app, grpc_call("1")).await;
    assert_eq!(common::header(&res, "grpc-status"), Some("3"));
    assert_eq!(pushback(&res).as_deref(), Some("-1"));

    // The store is down; each of 3 gateways counts 1 an hour alone: a cost of 2 fits the
    // shared limit, not the local share, so it is told when the store is asked again (the next
    // request, the circuit being closed: 1 s), not `-1`.
    let fallback = Policy::new("fallback", limit())
        .unwrap()
        .key(GlobalKey)
        .cost(cost)
        .failure(FailurePolicy::fallback(3).unwrap())
        .body(DenialBody::Grpc);
    let store = Arc::new(common::FailingStore::default());
    let app = root().layer(RateLimitLayer::new(store, fallback).unwrap());
    let res = common::send(&app, grpc_call("2")).await;
    assert_eq!(common::header(&res, "grpc-status"), Some("8"));
    assert_eq!(pushback(&res).as_deref(), Some("1000"));
    assert_eq!(common::header(&res, "retry-after"), Some("1"));
    // A cost of 4 fits neither.
    let res = common::send(&app, grpc_call("4")).await;
    assert_eq!(pushback(&res).as_deref(), Some("-1"));
}

/// A wait longer than a pushback can say (2^31 − 1 ms, about 24.8 days: a monthly quota spent
/// early in the month) is `-1`, "do not retry": no retry within a call could pass. `Retry-After`
/// and `RateLimit` still tell the whole wait.
#[tokio::test]
async fn a_wait_past_what_a_pushback_can_say_is_do_not_retry() {
    let thirty_days = Duration::from_secs(30 * 86_400);
    // A token bucket: its wait counts from the spending, not from a window's start.
    let monthly = Limit::single(
        Algorithm::TokenBucket,
        Quota::per_period(1, thirty_days).unwrap(),
    )
    .unwrap();
    let policy = Policy::new("monthly", monthly)
        .unwrap()
        .key(GlobalKey)
        .body(DenialBody::Grpc);
    let app = root().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let call = || common::grpc_request("/", "application/grpc");
    let res = common::send(&app, call()).await;
    assert_eq!(
        common::header(&res, "grpc-status"),
        Some("12"),
        "admitted: the handler's own"
    );
    let res = common::send(&app, call()).await;
    assert_eq!(common::header(&res, "grpc-status"), Some("8"));
    assert_eq!(common::header(&res, "grpc-retry-pushback-ms"), Some("-1"));
    let retry_after: u64 = common::header(&res, "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (29 * 86_400..=30 * 86_400).contains(&retry_after),
        "{retry_after}"
    );
}

/// The answer made after waiting for the store (here its timeout, failing closed) is a gRPC
/// status too, in the call's own content-type. (Paused time: the timeout is not waited for.)
#[tokio::test(start_paused = true)]
async fn an_answer_made_after_waiting_for_the_store_is_a_grpc_status() {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let policy = Policy::new("waits", limit)
        .unwrap()
        .key(GlobalKey)
        .failure(FailurePolicy::fail_closed(Duration::from_secs(3)))
        .body(DenialBody::Grpc);
    let layer = RateLimitLayer::builder(Arc::new(common::HangingStore::default()), policy)
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let app = root().layer(layer);
    let req = common::grpc_request("/", "application/grpc+proto");
    let res = common::send(&app, req).await;
    assert_eq!(res.status(), 200);
    assert_eq!(common::header(&res, "grpc-status"), Some("14"));
    assert_eq!(
        common::header(&res, "content-type"),
        Some("application/grpc+proto")
    );
    assert_eq!(common::header(&res, "grpc-retry-pushback-ms"), Some("3000"));
    assert_eq!(common::header(&res, "retry-after"), Some("3"));
    assert!(common::body_text(res).await.is_empty());
}

/// Behind tonic's own server the default key (`PeerIp`, axum's `ConnectInfo`) finds none, and
/// every call gets the missing-key answer, `INVALID_ARGUMENT`; keyed by a closure on tonic's
/// `TcpConnectInfo`, as `DenialBody::Grpc`'s docs show, calls count against their peer.
// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn behind_tonics_own_server_a_closure_keys_calls_by_their_peer() {
    use tonic::transport::server::TcpConnectInfo;
    use tower_ratelimit::RequestHead;
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let default_key = Policy::new("tonic", limit.clone())
        .unwrap()
        .body(DenialBody::Grpc);
    let by_peer = Policy::new("tonic", limit)
        .unwrap()
        .body(DenialBody::Grpc)
        .key(|req: &RequestHead<'_>| {
            req.extensions()
                .get::<TcpConnectInfo>()?
                .remote_addr()
                .map(|a| a.ip())
        });
    let mut codes = Vec::new();
    for policy in [default_key, by_peer] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let layer = RateLimitLayer::new(MemoryStore::new(), policy).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(layer)
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(incoming),
        );
        codes.push(
            calls(addr, 2)
                .await
                .iter()
                .map(Status::code)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        codes,
        [
            [Code::InvalidArgument, Code::InvalidArgument],
            [Code::Unimplemented, Code::ResourceExhausted]
        ]
    );
}
