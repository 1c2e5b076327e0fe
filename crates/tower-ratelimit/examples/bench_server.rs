//! A small server for measuring the denial path with an HTTP load generator such as `wrk`.
//!
//! Run with: `cargo run --release -p tower-ratelimit --example bench_server -- <mode> [port]`
//!
//! `<mode>` is one of `bare`, `ours-allowed`, `ours-denied`, `governor-allowed`,
//! `governor-denied`. Every client is keyed by its peer address; the "denied" modes allow one
//! request an hour, so after the first request every request is a 429. It listens on
//! 127.0.0.1 only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use governor::middleware::StateInformationMiddleware;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_ratelimit::{Policy, RateLimitLayer};

fn app(mode: &str) -> Result<Router, Box<dyn std::error::Error>> {
    let bare = Router::new().route("/", get(|| async { "ok" }));
    let ours = |quota: Quota| -> Result<Router, Box<dyn std::error::Error>> {
        let policy = Policy::new("bench", Limit::single(Algorithm::TokenBucket, quota)?)?;
        Ok(bare
            .clone()
            .layer(RateLimitLayer::new(MemoryStore::new(), policy)?))
    };
    let governor = |per_nanos: u64, burst: u32| -> Result<Router, Box<dyn std::error::Error>> {
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(per_nanos)
            .burst_size(burst)
            .key_extractor(PeerIpKeyExtractor)
            .use_headers()
            .finish()
            .ok_or("bad governor config")?;
        let layer: GovernorLayer<PeerIpKeyExtractor, StateInformationMiddleware, Body> =
            GovernorLayer::new(Arc::new(config));
        Ok(bare.clone().layer(layer))
    };
    Ok(match mode {
        "bare" => bare.clone(),
        "ours-allowed" => ours(Quota::per_second(1_000_000_000)?)?,
        "ours-denied" => ours(Quota::per_hour(1)?)?,
        "governor-allowed" => governor(1, u32::MAX)?,
        "governor-denied" => governor(3_600_000_000_000, 1)?,
        other => return Err(format!("unknown mode {other}").into()),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "ours-denied".into());
    let port: u16 = args.next().map_or(Ok(3000), |p| p.parse())?;
    let app = app(&mode)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("{mode} listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
