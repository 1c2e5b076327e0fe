//! The layer in a stack of tower-http's middleware, as applications use it: tracing outermost,
//! CORS outside the limiter (so that its 429s carry the CORS fields a browser needs to read them),
//! a timeout, then the limiter with its default body mode.

mod common;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use http::{Method, Request, StatusCode};
use ratelimit_core::{Algorithm, Limit, Quota};
use tower::ServiceBuilder;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_ratelimit::{Policy, RateLimitLayer};

const ORIGIN: &str = "https://app.example";

fn app(store: TestStore) -> Router {
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap();
    let policy = Policy::new("api", limit).unwrap();
    // Neither field is CORS-safelisted: a browser script reads them only if they are exposed.
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::exact(ORIGIN.parse().unwrap()))
        .allow_methods([Method::GET])
        .expose_headers([
            http::header::RETRY_AFTER,
            "ratelimit".parse().unwrap(),
            "ratelimit-policy".parse().unwrap(),
        ]);
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        )
        // In a `ServiceBuilder` the first layer is the outermost.
        .layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(cors)
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    Duration::from_secs(1),
                ))
                .layer(RateLimitLayer::new(store, policy).unwrap()),
        )
}

fn from_origin(method: Method, path: &str) -> Request<axum::body::Body> {
    let mut req = request(path);
    *req.method_mut() = method;
    req.headers_mut()
        .insert(http::header::ORIGIN, ORIGIN.parse().unwrap());
    req
}

#[tokio::test(start_paused = true)]
async fn a_429_inside_cors_carries_the_cors_fields_and_exposes_the_rate_limit_ones() {
    let (_clock, store) = store();
    let app = app(store);

    // A preflight is answered by the CORS layer outside the limiter: it spends nothing.
    let mut preflight = from_origin(Method::OPTIONS, "/");
    preflight.headers_mut().insert(
        http::header::ACCESS_CONTROL_REQUEST_METHOD,
        "GET".parse().unwrap(),
    );
    let res = send(&app, preflight).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "ratelimit"), None);

    for r in [1, 0] {
        let res = send(&app, from_origin(Method::GET, "/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "ratelimit"),
            // The next unit back in 30 s (2 a minute).
            Some(format!("\"api\";r={r};t=30").as_str())
        );
    }
    let res = send(&app, from_origin(Method::GET, "/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("30"));
    // On a denial, `t` is the wait for the next unit, as `Retry-After`.
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=30"));
    assert_eq!(header(&res, "access-control-allow-origin"), Some(ORIGIN));
    let exposed = header(&res, "access-control-expose-headers").unwrap();
    for name in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(exposed.contains(name), "{exposed}");
    }
    assert_eq!(body_text(res).await, "Too Many Requests\n");
}

/// tower-http's timeout answers with a body of the inner service's body type made by `Default`:
/// the layer's `ResponseBody` has one (an empty body), so the default body mode fits inside it.
#[tokio::test(start_paused = true)]
async fn tower_https_timeout_answers_through_the_default_body_mode() {
    let (_clock, store) = store();
    let app = app(store);
    let res = send(&app, from_origin(Method::GET, "/slow")).await;
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(header(&res, "access-control-allow-origin"), Some(ORIGIN));
    assert_eq!(body_text(res).await, "");
}
