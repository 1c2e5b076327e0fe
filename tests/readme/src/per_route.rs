use std::net::SocketAddr;
use std::time::Duration;
use axum::{Router, routing::{get, post}};
use tower_ratelimit::{Algorithm, ClientIp, FailurePolicy, Limit, MemoryStore, Policy, Quota};
use tower_ratelimit::{RateLimitLayer, key::{ApiKeyHeader, ClientIpKey}};

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    // One store for both policies (an `Arc<S>` is a store too).
    let store = std::sync::Arc::new(MemoryStore::new());
    // Login: 5 a minute per client IP, behind our two load balancers; if the store is down,
    // refuse (503) rather than let a password-guessing run through. List the balancers' own
    // addresses, not a network with clients in it: a trusted address may name its own key.
    let client_ip = ClientIp::behind_proxies(["10.0.0.10/32", "10.0.0.11/32"])?;
    let login = Policy::new("login", Limit::single(Algorithm::Gcra, Quota::per_minute(5)?)?)?
        .key(ClientIpKey::new(client_ip))
        .failure(FailurePolicy::fail_closed(Duration::from_secs(30)));
    // API: 10 a second with bursts of 20, and 1,000 an hour, per API key; fail open.
    let api_limit = Limit::new(
        Algorithm::TokenBucket,
        [Quota::per_second(10)?.with_burst(20)?, Quota::per_hour(1_000)?],
    )?;
    let api = Policy::new("api", api_limit)?
        .key(ApiKeyHeader::new("x-api-key")?)
        .failure(FailurePolicy::FailOpen);
    // Each policy on its route's methods: a method the route does not serve gets axum's 405
    // without spending the client's quota.
    Ok(Router::new()
        .route(
            "/login",
            post(|| async { "welcome" }).route_layer(RateLimitLayer::new(store.clone(), login)?),
        )
        .route(
            "/api/items",
            get(|| async { "[]" }).route_layer(RateLimitLayer::new(store, api)?),
        ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    // With the peer's address: without it, `ClientIpKey` finds no client and /login answers 400.
    let app = app()?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
