//! Per-request cost of the layer through an axum `Router`, against a bare handler and against
//! tower_governor configured alike (peer-IP key, token bucket, rate-limit headers on).
//!
//! Run with: `cargo bench -p tower-ratelimit --bench layer`
//!
//! Every benchmark sends one request through `Router::oneshot` on a current-thread runtime, with
//! the peer address in `ConnectInfo`, so they differ only by the middleware.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::middleware::StateInformationMiddleware;
use http::Request;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_ratelimit::{Headers, Policy, RateLimitLayer};

fn request() -> Request<Body> {
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 5000))));
    req
}

fn bare() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn ours(quota: Quota, headers: Headers) -> Router {
    let limit = Limit::single(Algorithm::TokenBucket, quota).unwrap();
    let policy = Policy::new("bench", limit).unwrap().headers(headers);
    bare().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap())
}

fn governor_with_headers(per_nanos: u64, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .key_extractor(PeerIpKeyExtractor)
        .use_headers()
        .finish()
        .unwrap();
    let layer: GovernorLayer<PeerIpKeyExtractor, StateInformationMiddleware, Body> =
        GovernorLayer::new(Arc::new(config));
    bare().layer(layer)
}

fn governor_plain(per_nanos: u64, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .key_extractor(PeerIpKeyExtractor)
        .finish()
        .unwrap();
    bare().layer(GovernorLayer::new(Arc::new(config)))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Always allowed: a billion a second. Always denied: one an hour, spent before measuring.
    let plenty = Quota::per_second(1_000_000_000).unwrap();
    let scarce = Quota::per_hour(1).unwrap();
    let hour_nanos = 3_600_000_000_000;

    let apps: Vec<(&str, Router, u16)> = vec![
        ("bare", bare(), 200),
        ("ours/allowed/headers", ours(plenty, Headers::ietf()), 200),
        ("ours/denied/headers", ours(scarce, Headers::ietf()), 429),
        (
            "governor/allowed/headers",
            governor_with_headers(1, u32::MAX),
            200,
        ),
        (
            "governor/denied/headers",
            governor_with_headers(hour_nanos, 1),
            429,
        ),
        (
            "ours/allowed/no-headers",
            ours(plenty, Headers::none()),
            200,
        ),
        ("ours/denied/no-headers", ours(scarce, Headers::none()), 429),
        (
            "governor/allowed/no-headers",
            governor_plain(1, u32::MAX),
            200,
        ),
        (
            "governor/denied/no-headers",
            governor_plain(hour_nanos, 1),
            429,
        ),
    ];

    let mut group = c.benchmark_group("layer");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, app, status) in apps {
        // Spend the scarce quota first, and check every app answers as its name says.
        rt.block_on(async {
            let _ = app.clone().oneshot(request()).await.unwrap();
            let res = app.clone().oneshot(request()).await.unwrap();
            assert_eq!(res.status().as_u16(), status, "{name}");
        });
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                let app = app.clone();
                async move {
                    let res = app.oneshot(request()).await.unwrap();
                    // Consume the body as a server would.
                    let _ = http_body_util::BodyExt::collect(res.into_body()).await;
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
