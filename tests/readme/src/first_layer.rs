use axum::{Router, routing::get};
use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
use tower_ratelimit::key::ApiKeyHeader;

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    // 100 requests a minute per API key, in this process's memory.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(100)?)?;
    let policy = Policy::new("api", limit)?.key(ApiKeyHeader::new("x-api-key")?);
    Ok(Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(MemoryStore::new(), policy)?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app()?).await?;
    Ok(())
}
