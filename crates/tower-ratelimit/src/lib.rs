//! Rate limiting for Tower and Axum over any [`ratelimit_core::Store`].
//!
//! ```
//! use axum::{Router, routing::get};
//! use tower::ServiceExt;
//! use tower_ratelimit::ratelimit_core::ManualClock;
//! use tower_ratelimit::{Algorithm, Limit, MemoryStore, Quota, http};
//! use tower_ratelimit::{FailurePolicy, Policy, RateLimitLayer, key::ApiKeyHeader};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A clock the example moves by hand, so that the waits below are exact (a server uses
//! // `MemoryStore::new()`, on the system clock).
//! let store = MemoryStore::builder().with_clock(ManualClock::new()).build()?;
//! let policy = Policy::new("api", Limit::single(Algorithm::TokenBucket, Quota::per_minute(2)?)?)?
//!     .key(ApiKeyHeader::new("x-api-key")?)
//!     .failure(FailurePolicy::FailOpen);
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(store, policy)?);
//!
//! let request = || http::Request::get("/").header("x-api-key", "k1").body(axum::body::Body::empty());
//! for _ in 0..2 {
//!     let ok = app.clone().oneshot(request()?).await?;
//!     assert_eq!(ok.status(), 200);
//! }
//! let denied = app.clone().oneshot(request()?).await?;
//! assert_eq!(denied.status(), 429);
//! assert_eq!(denied.headers()["retry-after"], "30");
//! assert_eq!(denied.headers()["ratelimit-policy"], "\"api\";q=2;w=60");
//! assert_eq!(denied.headers()["ratelimit"], "\"api\";r=0;t=30");
//! # Ok(())
//! # }
//! ```
//!
//! # What it does
//!
//! For each request the layer
//! 1. lets allow-listed requests through ([`Policy::allow`]);
//! 2. extracts a key ([`key`]) and namespaces it with the policy name; with no key it answers
//!    as the policy's [`MissingKey`] says (400 by default, another error status, 401 with a
//!    `WWW-Authenticate` challenge, or a shared fallback key);
//! 3. checks the request's cost against the policy's limit (or the tier chosen for the request)
//!    in the store, under a timeout and a [`CircuitBreaker`];
//! 4. forwards the request, or answers `429` with `Retry-After` and the IETF `RateLimit` /
//!    `RateLimit-Policy` fields ([`response`]; a gRPC call can get the gRPC status
//!    `RESOURCE_EXHAUSTED` instead, [`DenialBody::Grpc`]); if the store fails, the
//!    [`FailurePolicy`] decides ([`failure`]);
//! 5. counts the outcome ([`metrics`](mod@crate::metrics)) and puts a [`Verdict`] in the
//!    response extensions (unless [`Policy::verdict`] turns that off).
//!
//! A client's count can be forgotten: by the app, through a [`Resetter`]
//! ([`RateLimitLayer::resetter`]), or by the layer when the inner service's response meets a
//! condition ([`RateLimitLayerBuilder::reset_on`]: a successful sign-in).
//!
//! The in-memory path registers no timer and boxes no future (but under `reset_on`, whose
//! requests go through a boxed future that waits for the reset): the store's answer is ready
//! when `call` returns, so a denial is a response built at once. What an allowed request allocates is
//! the `RateLimit` field's value and the [`Verdict`] put in the response extensions (http
//! allocates the extension map, its table and the boxed value on the first insert); an app that
//! never reads the verdict saves those three with `Policy::verdict(false)`. A denial also
//! allocates its response's header map.
//!
//! # Response bodies
//!
//! By default a response's body is a [`ResponseBody`]: the inner service's body, or the layer's
//! own (a 429, a 503), for any inner body whose data chunks can be made from `Bytes`. With [`RateLimitLayer::same_body`] responses keep
//! the inner body type instead, for bodies that can be made from `Bytes` (axum's `Body` among
//! them): axum then does not box the body a second time, and a stack typed on
//! `Response<axum::body::Body>` stays as it is. See [`body`].
//!
//! # Layer order
//!
//! Put authentication before the rate limit if the key is the user (`.layer(rate_limit)` then
//! `.layer(auth)`: the last added runs first). With `route_layer` on a route's method router
//! (`post(login).route_layer(layer)`), each route can have its own policy: a strict one for
//! `/login`, a looser one for the API. (`Router::route_layer` would also count the 405s of a
//! method the route does not serve: see [`RateLimitLayer`].)
//!
//! In a [`tower::ServiceBuilder`](https://docs.rs/tower/latest/tower/struct.ServiceBuilder.html)
//! the order is the other way round: the first layer added is the outermost. With tower-http's
//! middleware, a stack that works (`tests/tower_http.rs` runs it):
//!
//! ```text
//! ServiceBuilder::new()
//!     .layer(TraceLayer::new_for_http())      // outermost: sees every answer, 429s included
//!     .layer(cors)                            // outside the limit (see below)
//!     .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
//!     .layer(RateLimitLayer::new(store, policy)?)
//! ```
//!
//! Put `CorsLayer` outside the rate limit: a 429 then carries the CORS fields (without them a
//! browser reports a CORS failure and the page cannot read the answer), and CORS answers the
//! preflight `OPTIONS` requests itself, which then spend nothing. `Retry-After`, `RateLimit` and
//! `RateLimit-Policy` are not CORS-safelisted: list them in the CORS layer's `expose_headers` for
//! a script to read them. Middleware that makes its own answers with a body of `Default` (the
//! timeout, CORS) fits outside the layer in either body mode ([`ResponseBody`] is `Default`: an
//! empty body).
//!
//! # Without the layer
//!
//! Checks made without HTTP (a chat server's messages, a job dispatcher's starts) get the same
//! timeout and circuit breaker from [`Guarded`], a store wrapper whose failures come back as a
//! [`GuardError`] for the caller to act on.
//!
//! # Re-exports
//!
//! The core's everyday types ([`Algorithm`], [`Limit`], [`Quota`], [`MemoryStore`], [`Store`],
//! [`Decision`], [`QuotaSet`]) are re-exported, and the whole core as [`ratelimit_core`], as are
//! the `http` and `bytes` crates that this crate's API names (`HeaderMap`, `StatusCode`,
//! `Response<Bytes>`): an app with the in-memory store needs this crate alone, at versions that
//! match.
//!
//! # Features
//! - `axum` (default): [`key::PeerIp`], [`key::ClientIpKey`] and the matched route in
//!   [`key::RouteKey`]. [`Policy::new`]'s default key is [`key::PeerIp`] with it, and
//!   [`key::GlobalKey`] (one limit for every client together) without it: with
//!   `default-features = false`, give every policy its key.
//! - `serde`: policies from configuration files (the `config` module).
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
pub mod circuit_breaker;
pub mod client_ip;
#[cfg(feature = "serde")]
pub mod config;
mod error;
pub mod failure;
mod future;
mod guarded;
mod home;
pub mod key;
mod layer;
mod log_gate;
pub mod metrics;
pub mod policy;
mod request_head;
mod reset;
pub mod response;
mod response_head;
mod service;

pub use body::{BodyMode, ResponseBody, SameBody, WrapBody};
pub use circuit_breaker::{CircuitBreaker, CircuitState, MAX_FAILURE_THRESHOLD};
pub use client_ip::{ClientIp, ClientIpError, ForwardedHeader};
pub use error::Error;
pub use failure::FailurePolicy;
pub use future::ResponseFuture;
pub use guarded::{GuardError, Guarded, GuardedBuilder, GuardedFuture};
pub use layer::{DEFAULT_TIMEOUT, FallbackStats, RateLimitLayer, RateLimitLayerBuilder};
pub use policy::{MissingKey, Policy};
pub use request_head::RequestHead;
pub use reset::{ResetError, Resetter};
pub use response::{DenialBody, Headers, Verdict, VerdictKind};
pub use response_head::ResponseHead;
pub use service::RateLimit;

pub use bytes;
pub use http;
pub use ratelimit_core;
pub use ratelimit_core::{Algorithm, Decision, Limit, MemoryStore, Quota, QuotaSet, Reset, Store};
