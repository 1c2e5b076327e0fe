use axum::{Router, extract::{Request, State}, http::StatusCode, routing::post};
use tower_ratelimit::{Algorithm, Limit, MemoryStore, Policy, Quota, RateLimitLayer};
use tower_ratelimit::{RequestHead, Resetter, key::ApiKeyHeader};

async fn login(State(limits): State<Resetter<MemoryStore>>, req: Request) -> StatusCode {
    if req.headers().get("x-password").is_none_or(|p| p != "hunter2") {
        return StatusCode::UNAUTHORIZED;
    }
    if let Err(error) = limits.reset(&RequestHead::of(&req)).await {
        eprintln!("login limit not reset: {error}"); // the store is down: the count stays
    }
    StatusCode::NO_CONTENT
}

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(5)?)?;
    let layer = RateLimitLayer::new(
        MemoryStore::new(),
        Policy::new("login", limit)?.key(ApiKeyHeader::new("x-user")?),
    )?;
    // On the method router, as above: `GET /login` gets axum's 405 and spends nothing.
    Ok(Router::new()
        .route("/login", post(login).route_layer(layer.clone()))
        .with_state(layer.resetter()))
}
