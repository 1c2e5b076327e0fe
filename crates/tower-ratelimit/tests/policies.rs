//! Policies through an axum `Router`: per-route policies, shared clones, dry run, several
//! quotas, costs, tiers, the allow-list, metrics, and configuration files.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use common::*;
use ratelimit_core::{Algorithm, Limit, Quota};
use tower::Service;
use tower::ServiceExt;
use tower_ratelimit::key::{ApiKeyHeader, GlobalKey};
use tower_ratelimit::{Policy, RateLimit, RateLimitLayer, Verdict, VerdictKind};

fn per_minute(n: u64) -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(n).unwrap()).unwrap()
}

fn post_req(path: &str) -> http::Request<Body> {
    let mut req = request(path);
    *req.method_mut() = http::Method::POST;
    req
}

#[tokio::test]
async fn per_route_policies_do_not_interfere() {
    let (_clock, store) = store();
    let login =
        RateLimitLayer::new(store.clone(), Policy::new("login", per_minute(2)).unwrap()).unwrap();
    let api = RateLimitLayer::new(store, Policy::new("api", per_minute(5)).unwrap()).unwrap();
    // Each route gets its own policy (a `Router::route_layer` would also cover every route added
    // before it).
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }).route_layer(login))
        .route("/api", get(|| async { "data" }).route_layer(api));
    assert_eq!(
        statuses(&app, || post_req("/login"), 3).await,
        [200, 200, 429]
    );
    let res = send(&app, post_req("/login")).await;
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"login\";q=2;w=60"));
    // Logins spent nothing of the API's quota, from the same client.
    assert_eq!(
        statuses(&app, || request("/api"), 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    let res = send(&app, request("/api")).await;
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
    // Unmatched paths are 404, not limited.
    assert_eq!(send(&app, request("/nope")).await.status(), 404);
}

/// `Router::layer` covers the router's fallback too (axum layers it as it does the routes): a
/// path no route serves is keyed and counted like a route, gets the missing-key answer without a
/// key, and a 429 once the key's quota is spent; `Router::route_layer` leaves it a plain 404. An
/// allow-listed path (a health check) is never counted.
#[tokio::test]
async fn router_layer_counts_unmatched_paths_and_route_layer_does_not() {
    let policy = || {
        Policy::new("api", per_minute(2))
            .unwrap()
            .key(ApiKeyHeader::new("x-api-key").unwrap())
            .allow(|req| req.uri().path() == "/healthz")
    };
    let keyed = |path: &'static str| move || with_header(request(path), "x-api-key", "k");
    let (_clock, first) = store();
    let whole = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(first, policy()).unwrap());
    assert_eq!(send(&whole, request("/nope")).await.status(), 400);
    assert_eq!(statuses(&whole, keyed("/nope"), 3).await, [404, 404, 429]);
    assert_eq!(statuses(&whole, keyed("/"), 1).await, [429]);
    assert_eq!(send(&whole, request("/healthz")).await.status(), 404);

    let (_clock, second) = store();
    let routes = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(second, policy()).unwrap());
    assert_eq!(send(&routes, request("/nope")).await.status(), 404);
    assert_eq!(statuses(&routes, keyed("/nope"), 3).await, [404, 404, 404]);
    assert_eq!(statuses(&routes, keyed("/"), 3).await, [200, 200, 429]);
}

/// A route layer inside a router-wide one: the response carries the verdict of the layer that
/// decided it (the inner one's denial is not relabelled as the outer one's admission), as its
/// header fields do.
#[tokio::test]
async fn nested_layers_keep_the_inner_verdict() {
    let (_clock, store) = store();
    let login =
        RateLimitLayer::new(store.clone(), Policy::new("login", per_minute(1)).unwrap()).unwrap();
    let site = RateLimitLayer::new(store, Policy::new("site", per_minute(100)).unwrap()).unwrap();
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }).route_layer(login))
        .route("/", get(|| async { "home" }))
        .layer(site);
    let verdict = |res: &http::Response<Body>| {
        let v = res.extensions().get::<Verdict>().unwrap();
        (v.policy().to_owned(), v.kind())
    };
    let res = send(&app, post_req("/login")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(verdict(&res), ("login".to_owned(), VerdictKind::Allowed));
    let res = send(&app, post_req("/login")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(verdict(&res), ("login".to_owned(), VerdictKind::Denied));
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"login\";q=1;w=60"));
    // A route without the inner layer gets the outer one's.
    let res = send(&app, request("/")).await;
    assert_eq!(verdict(&res), ("site".to_owned(), VerdictKind::Allowed));

    // An outer layer with more to say than an inner "allowed" (here a dry run's shadow denial)
    // puts its own verdict.
    let (_clock, store) = common::store();
    let login = RateLimitLayer::new(
        store.clone(),
        Policy::new("login", per_minute(100)).unwrap(),
    )
    .unwrap();
    let site = RateLimitLayer::new(
        store,
        Policy::new("site", per_minute(1)).unwrap().dry_run(true),
    )
    .unwrap();
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }).route_layer(login))
        .layer(site);
    let res = send(&app, post_req("/login")).await;
    assert_eq!(verdict(&res), ("login".to_owned(), VerdictKind::Allowed));
    let res = send(&app, post_req("/login")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        verdict(&res),
        ("site".to_owned(), VerdictKind::ShadowDenied)
    );
}

#[tokio::test]
async fn clones_of_the_layer_share_one_limit() {
    let (_clock, store) = store();
    let layer = RateLimitLayer::new(store, Policy::new("shared", per_minute(3)).unwrap()).unwrap();
    let a = Router::new()
        .route("/", get(|| async { "a" }))
        .layer(layer.clone());
    let b = Router::new()
        .route("/", get(|| async { "b" }))
        .layer(layer.clone());
    assert_eq!(send(&a, request("/")).await.status(), 200);
    assert_eq!(send(&b, request("/")).await.status(), 200);
    // A service made by yet another clone, and a clone of that service.
    let mut svc: RateLimit<_, _> = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        }),
    );
    let mut svc2 = svc.clone();
    let res = svc.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(res.status(), 200);
    let res = svc2
        .ready()
        .await
        .unwrap()
        .call(request("/"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(send(&a, request("/")).await.status(), 429);
}

#[tokio::test]
async fn a_multi_quota_policy_never_half_consumes() {
    let (clock, store) = store();
    // 1 a second, and 2 a minute.
    let limit = Limit::new(
        Algorithm::TokenBucket,
        [Quota::per_second(1).unwrap(), Quota::per_minute(2).unwrap()],
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, Policy::new("multi", limit).unwrap()).unwrap());
    assert_eq!(send(&app, request("/")).await.status(), 200);
    // Denied by the per-second quota: must not spend from the per-minute one.
    for _ in 0..5 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 429);
        assert_eq!(header(&res, "ratelimit"), Some("\"multi.0\";r=0;t=1"));
    }
    clock.advance(Duration::from_secs(1));
    // Had the denials consumed per-minute units, this would be denied.
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 200);
    // Both quotas are now empty; the one that takes longer to be full again is reported, with
    // the time until its next unit (30 s a unit, 1/30 of it back already).
    assert_eq!(header(&res, "ratelimit"), Some("\"multi.1\";r=0;t=29"));
    clock.advance(Duration::from_secs(1));
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429, "now the per-minute quota binds");
    assert_eq!(header(&res, "ratelimit"), Some("\"multi.1\";r=0;t=28"));
    assert_eq!(header(&res, "retry-after"), Some("28"));
}

#[tokio::test]
async fn dry_run_never_denies_but_counts() {
    let (_clock, store) = store();
    let (layer, snapshotter) = recorded(|| {
        RateLimitLayer::new(
            store,
            Policy::new("shadow", per_minute(2)).unwrap().dry_run(true),
        )
        .unwrap()
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..5 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert!(
            res.headers().get("ratelimit").is_none(),
            "invisible to clients"
        );
    }
    let res = send(&app, request("/")).await;
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::ShadowDenied
    );
    let m = Recorded::take(&snapshotter);
    assert_eq!(m.outcome("shadow", "allowed"), 2);
    assert_eq!(m.outcome("shadow", "shadow_denied"), 4);
    assert_eq!(m.outcome("shadow", "denied"), 0);
}

/// What the handler of a request sees of the layer's verdict: nothing by default; with
/// `verdict_in_request`, the request's own verdict (its kind, and the requests left), whatever
/// `verdict` says of the response, over a store that answers at once and one that makes the
/// request wait, for an admission, a dry run's would-be denial and a request let through failing
/// open.
#[tokio::test]
async fn the_handler_sees_the_verdict_when_the_policy_lends_it() {
    /// The handler: the verdict it was given, as text.
    async fn seen(verdict: Option<axum::Extension<Verdict>>) -> String {
        match verdict {
            None => "none".to_owned(),
            Some(axum::Extension(v)) => format!(
                "{}:{:?}:{:?}",
                v.policy(),
                v.kind(),
                v.decision().map(|d| d.remaining())
            ),
        }
    }
    async fn body(res: http::Response<Body>) -> String {
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
    fn app<St: tower_ratelimit::Store>(store: St, policy: Policy) -> Router {
        Router::new()
            .route("/", get(seen))
            .layer(RateLimitLayer::new(store, policy).unwrap())
    }
    // By default, nothing: the verdict is the response's.
    let plain = app(store().1, Policy::new("plain", per_minute(2)).unwrap());
    let res = send(&plain, request("/")).await;
    assert!(res.extensions().get::<Verdict>().is_some());
    assert_eq!(body(res).await, "none");

    for verdict in [true, false] {
        let lend = |name| {
            Policy::new(name, per_minute(2))
                .unwrap()
                .verdict(verdict)
                .verdict_in_request(true)
        };
        let waiting = std::sync::Arc::new(SwitchStore::new(store().1));
        for (name, app) in [
            ("at once", app(store().1, lend("lent"))),
            ("waits", app(waiting, lend("lent"))),
        ] {
            let res = send(&app, request("/")).await;
            assert_eq!(
                res.extensions().get::<Verdict>().is_some(),
                verdict,
                "{name}: the response's verdict is `verdict`'s"
            );
            assert_eq!(body(res).await, "lent:Allowed:Some(1)", "{name}");
        }
        let shadow = app(store().1, lend("shadow").dry_run(true));
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(body(send(&shadow, request("/")).await).await);
        }
        assert_eq!(
            seen,
            [
                "shadow:Allowed:Some(1)",
                "shadow:Allowed:Some(0)",
                "shadow:ShadowDenied:Some(0)"
            ],
            "verdict {verdict}"
        );
        let down = std::sync::Arc::new(SwitchStore::new(store().1));
        down.set_down(true);
        let open = app(down, lend("open"));
        assert_eq!(
            body(send(&open, request("/")).await).await,
            "open:FailedOpen:None"
        );
    }
}

/// Each series is described to the recorder when the layer is built: a Prometheus exporter's
/// `# HELP` line, and the store histogram's unit (seconds).
#[test]
fn the_series_are_described_with_their_units() {
    use std::collections::HashMap;
    let (_layer, snapshotter) = recorded(|| {
        RateLimitLayer::builder(
            std::sync::Arc::new(FailingStore::default()),
            Policy::new("described", per_minute(1)).unwrap(),
        )
        .build()
        .unwrap()
    });
    let described: HashMap<String, (Option<metrics::Unit>, String)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, unit, help, _)| {
            let help = help.map(|h| h.to_string()).unwrap_or_default();
            (k.key().name().to_owned(), (unit, help))
        })
        .collect();
    for name in [
        tower_ratelimit::metrics::DECISIONS_TOTAL,
        tower_ratelimit::metrics::STORE_ERRORS_TOTAL,
        tower_ratelimit::metrics::CHECKS_CANCELLED_TOTAL,
        tower_ratelimit::metrics::CIRCUIT_STATE,
        tower_ratelimit::metrics::CIRCUITS_NOT_CLOSED,
        tower_ratelimit::metrics::STORE_DURATION_SECONDS,
    ] {
        let (unit, help) = described
            .get(name)
            .unwrap_or_else(|| panic!("{name} not registered"));
        assert!(help.starts_with("Rate-limit "), "{name}: {help:?}");
        let want = (name == tower_ratelimit::metrics::STORE_DURATION_SECONDS)
            .then_some(metrics::Unit::Seconds);
        assert_eq!(*unit, want, "{name}");
    }
}

/// A router of `/` and an allow-listed `/health` under `policy` (keyed by `x-api-key`) on a
/// memory store, and the metrics its layer records.
fn metered(policy: Policy) -> (Router, metrics_util::debugging::Snapshotter) {
    let (_clock, store) = store();
    let policy = policy
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .allow(|req| req.uri().path() == "/health");
    let (layer, snapshotter) = recorded(|| RateLimitLayer::new(store, policy).unwrap());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/health", get(|| async { "up" }))
        .layer(layer);
    (app, snapshotter)
}

#[tokio::test]
async fn metrics_by_policy_and_outcome() {
    let (app, snapshotter) = metered(Policy::new("m", per_minute(2)).unwrap());
    let keyed = || {
        let mut r = request("/");
        r.headers_mut().insert("x-api-key", "k".parse().unwrap());
        r
    };
    assert_eq!(statuses(&app, keyed, 3).await, [200, 200, 429]);
    assert_eq!(send(&app, request("/")).await.status(), 400);
    assert_eq!(
        statuses(&app, || request("/health"), 3).await,
        [200, 200, 200]
    );
    let m = Recorded::take(&snapshotter);
    assert_eq!(m.outcome("m", "allowed"), 2);
    assert_eq!(m.outcome("m", "denied"), 1);
    assert_eq!(m.outcome("m", "no_key"), 1);
    assert_eq!(m.outcome("m", "allow_listed"), 3);
    // Memory-store answers come at once and only about one in 64 is timed (tests/failure.rs).
    assert!(m.histogram_len("ratelimit_store_duration_seconds", &[("policy", "m")]) <= 3);
    // The in-memory store never fails: its layer has no breaker, and no circuit series.
    assert_eq!(m.gauge("ratelimit_circuit_state", &[("policy", "m")]), None);
    assert_eq!(
        m.gauge("ratelimit_circuits_not_closed", &[("policy", "m")]),
        None
    );
}

/// A policy with tiers counts its decisions by tier too: the tier the resolver chose (also for a
/// request without a key), `""` for the policy's own limit, for a tier name the policy does not
/// have and for an allow-listed request; every series of the policy has the label, and no value
/// comes from the request.
#[tokio::test]
async fn decisions_are_counted_by_tier() {
    let (app, snapshotter) = metered(
        Policy::new("t", per_minute(1))
            .unwrap()
            .tier("pro", per_minute(3))
            .unwrap()
            .tier("enterprise", per_minute(5))
            .unwrap()
            .resolve_tier(|req| req.headers().get("x-plan")?.to_str().ok()),
    );
    let req = |key: Option<&'static str>, plan: Option<&'static str>, path: &'static str| {
        move || {
            let mut r = request(path);
            if let Some(key) = key {
                r = with_header(r, "x-api-key", key);
            }
            if let Some(plan) = plan {
                r = with_header(r, "x-plan", plan);
            }
            r
        }
    };
    assert_eq!(
        statuses(&app, req(Some("a"), Some("pro"), "/"), 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(
        statuses(&app, req(Some("b"), Some("enterprise"), "/"), 1).await,
        [200]
    );
    assert_eq!(
        statuses(&app, req(Some("c"), None, "/"), 2).await,
        [200, 429]
    );
    // A plan the policy does not have: its own limit, counted as such.
    assert_eq!(
        statuses(&app, req(Some("d"), Some("gold"), "/"), 2).await,
        [200, 429]
    );
    // No key: the answer is counted under the tier the resolver chose.
    assert_eq!(statuses(&app, req(None, Some("pro"), "/"), 1).await, [400]);
    // Allow-listed before the resolver runs.
    assert_eq!(
        statuses(&app, req(Some("a"), Some("pro"), "/health"), 2).await,
        [200, 200]
    );

    let m = Recorded::take(&snapshotter);
    let count = |tier: &str, outcome: &str| {
        m.counter(
            "ratelimit_decisions_total",
            &[("policy", "t"), ("outcome", outcome), ("tier", tier)],
        )
    };
    assert_eq!(count("pro", "allowed"), 3);
    assert_eq!(count("pro", "denied"), 1);
    assert_eq!(count("pro", "no_key"), 1);
    assert_eq!(count("enterprise", "allowed"), 1);
    assert_eq!(count("", "allowed"), 2);
    assert_eq!(count("", "denied"), 2);
    assert_eq!(count("", "allow_listed"), 2);
    assert_eq!(count("pro", "allow_listed"), 0);
    // Every decision series has the label, with one of the three values: 3 × 9 series.
    let decisions: Vec<_> =
        m.0.iter()
            .filter(|(name, _, _)| name == "ratelimit_decisions_total")
            .collect();
    assert_eq!(decisions.len(), 3 * VerdictKind::ALL.len());
    for (_, labels, _) in &decisions {
        let tier = labels.iter().find(|(k, _)| k == "tier").map(|(_, v)| v);
        assert!(
            matches!(tier.map(String::as_str), Some("" | "pro" | "enterprise")),
            "{labels:?}"
        );
    }
    let total: u64 = decisions
        .iter()
        .map(|(_, _, v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(total, 12, "one decision per request");
}

/// The request's tier is in its `Verdict` and in what a custom denial body is given, `None` for
/// the policy's own limit (and for an allow-listed request, let through before the resolver).
#[tokio::test]
async fn the_tier_is_in_the_verdict_and_the_custom_body() {
    use tower_ratelimit::DenialBody;
    let body = DenialBody::custom(|denial| {
        let plan = denial.tier().unwrap_or("free");
        http::Response::new(bytes::Bytes::from(format!("the {plan} plan's limit")))
    });
    let (app, _) = metered(
        Policy::new("t", per_minute(1))
            .unwrap()
            .tier("pro", per_minute(2))
            .unwrap()
            .resolve_tier(|req| req.headers().get("x-plan")?.to_str().ok())
            .body(body),
    );
    let pro = || with_header(with_header(request("/"), "x-api-key", "a"), "x-plan", "pro");
    let free = || with_header(request("/"), "x-api-key", "b");
    let tier_of = |res: &http::Response<Body>| {
        let v = res.extensions().get::<Verdict>().unwrap();
        (v.kind(), v.tier().map(str::to_owned))
    };
    let pro_tier = Some("pro".to_owned());
    for _ in 0..2 {
        let res = send(&app, pro()).await;
        assert_eq!(tier_of(&res), (VerdictKind::Allowed, pro_tier.clone()));
    }
    let res = send(&app, pro()).await;
    assert_eq!(tier_of(&res), (VerdictKind::Denied, pro_tier.clone()));
    assert_eq!(body_text(res).await, "the pro plan's limit");

    let res = send(&app, free()).await;
    assert_eq!(tier_of(&res), (VerdictKind::Allowed, None));
    let res = send(&app, free()).await;
    assert_eq!(tier_of(&res), (VerdictKind::Denied, None));
    assert_eq!(body_text(res).await, "the free plan's limit");

    let health = with_header(request("/health"), "x-plan", "pro");
    let res = send(&app, health).await;
    assert_eq!(tier_of(&res), (VerdictKind::AllowListed, None));
}

#[tokio::test]
async fn cost_per_request() {
    let (_clock, store) = store();
    let policy = Policy::new("cost", per_minute(10)).unwrap().cost(|req| {
        if req.method() == http::Method::POST {
            4
        } else {
            1
        }
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }).post(|| async { "posted" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    assert_eq!(statuses(&app, || post_req("/"), 3).await, [200, 200, 429]);
    let res = send(&app, request("/")).await;
    // One left; the next back in 6 s (all nine in 54).
    assert_eq!(header(&res, "ratelimit"), Some("\"cost\";r=1;t=6"));
    assert_eq!(statuses(&app, || request("/"), 2).await, [200, 429]);
}

#[derive(Clone)]
enum Plan {
    Pro,
}

#[tokio::test]
async fn tiers_chosen_per_request() {
    let (_clock, store) = store();
    let policy = Policy::new("tiered", per_minute(1))
        .unwrap()
        .key(GlobalKey)
        .tier("pro", per_minute(3))
        .unwrap()
        .resolve_tier(|req| req.extensions().get::<Plan>().map(|_| "pro"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let pro = || {
        let mut r = request("/");
        r.extensions_mut().insert(Plan::Pro);
        r
    };
    let res = send(&app, pro()).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"tiered\";q=3;w=60")
    );
    assert_eq!(statuses(&app, pro, 3).await, [200, 200, 429]);
    // The free tier is counted apart (per (key, limit)).
    assert_eq!(statuses(&app, || request("/"), 2).await, [200, 429]);
}

/// A plan name known only at run time (a `String` an authentication layer put in the
/// extensions) chooses the tier as it is, borrowed from the request: no `'static` copy.
#[tokio::test]
async fn a_tier_name_borrowed_from_an_extension() {
    #[derive(Clone)]
    struct PlanName(String);
    let (_clock, store) = store();
    let policy = Policy::new("tiered", per_minute(1))
        .unwrap()
        .key(GlobalKey)
        .tier("pro", per_minute(3))
        .unwrap()
        .resolve_tier(|req| req.extensions().get::<PlanName>().map(|p| p.0.as_str()));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let pro = || {
        let mut r = request("/");
        // Made at run time, as a name read from a database would be.
        r.extensions_mut().insert(PlanName(["p", "ro"].concat()));
        r
    };
    let res = send(&app, pro()).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"tiered\";q=3;w=60")
    );
    assert_eq!(statuses(&app, pro, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, || request("/"), 2).await, [200, 429]);
}

/// A table of the app's own, from API key to plan, loaded at run time: `resolve_tier_with`
/// lends it to the resolver with each request, and the name returned borrows from it.
#[tokio::test]
async fn a_tier_name_borrowed_from_the_resolvers_own_table() {
    let (_clock, store) = store();
    // Names made at run time, as read from a file or a database.
    let plans: std::collections::HashMap<Vec<u8>, String> = [
        (b"key-a".to_vec(), ["p", "ro"].concat()),
        (b"key-b".to_vec(), ["ent", "erprise"].concat()),
    ]
    .into_iter()
    .collect();
    let policy = Policy::new("tiered", per_minute(1))
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .tier("pro", per_minute(3))
        .unwrap()
        .tier("enterprise", per_minute(5))
        .unwrap()
        .resolve_tier_with(plans, |plans, req| {
            let key = req.headers().get("x-api-key")?;
            plans.get(key.as_bytes()).map(String::as_str)
        });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let with_key = |key: &'static str| move || with_header(request("/"), "x-api-key", key);
    let res = send(&app, with_key("key-a")()).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"tiered\";q=3;w=60")
    );
    assert_eq!(statuses(&app, with_key("key-a"), 3).await, [200, 200, 429]);
    assert_eq!(
        statuses(&app, with_key("key-b"), 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    // A key not in the table: the policy's own limit.
    assert_eq!(statuses(&app, with_key("key-c"), 2).await, [200, 429]);
}

/// A tier name the policy does not have (a resolver's typo) gets the policy's own limit, as
/// documented, and a warning the first time, since nothing else would say so.
#[tokio::test]
async fn an_unknown_tier_gets_the_base_limit_and_one_warning() {
    let (lines, _guard) = Lines::capture();
    let (_clock, store) = store();
    let policy = Policy::new("tiered", per_minute(1))
        .unwrap()
        .key(GlobalKey)
        .tier("pro", per_minute(3))
        .unwrap()
        .resolve_tier(|_| Some("Pro"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    assert_eq!(statuses(&app, || request("/"), 3).await, [200, 429, 429]);
    let text = lines.text();
    assert_eq!(
        text.matches("the tier resolver named a tier this policy does not have")
            .count(),
        1,
        "{text}"
    );
    assert!(text.contains("tier=\"Pro\""), "{text}");
    assert!(text.contains("known=[\"pro\"]"), "{text}");
}

/// A request without a key is counted against the shared key under the policy's own limit,
/// whatever tier the resolver picks for it: the tier is read from the same request that carries
/// no usable key, so a client could otherwise claim a higher tier's shared bucket (a tier header
/// of its own choosing, say). An API key sent twice, which `ApiKeyHeader` cannot use, is not
/// keyless: it gets 400, not the shared bucket.
#[tokio::test]
async fn a_keyless_request_shares_the_base_tier_whatever_tier_it_claims() {
    use tower_ratelimit::MissingKey;
    let (_clock, store) = store();
    let policy = Policy::new("tiered", per_minute(1))
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .missing_key(MissingKey::shared_key("anon"))
        .tier("gold", per_minute(5))
        .unwrap()
        .resolve_tier(|req| {
            let tier = req.headers().get("x-tier")?;
            (tier == "gold").then_some("gold")
        });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let with = |key: Option<&str>, times: usize| {
        let mut r = request("/");
        r.headers_mut().insert("x-tier", "gold".parse().unwrap());
        for _ in 0..times {
            if let Some(key) = key {
                r.headers_mut().append("x-api-key", key.parse().unwrap());
            }
        }
        r
    };
    let twice = send(&app, with(Some("k-gold"), 2)).await;
    assert_eq!(twice.status(), 400);
    let res = send(&app, with(None, 0)).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"tiered\";q=1;w=60")
    );
    assert_eq!(statuses(&app, || with(None, 0), 2).await, [429, 429]);
    // The same bucket as a request with no key at all.
    assert_eq!(statuses(&app, || request("/"), 1).await, [429]);
    // A key, sent once, has its own bucket at the tier it claims.
    assert_eq!(
        statuses(&app, || with(Some("k-gold"), 1), 6).await,
        [200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test]
async fn the_allow_list_is_never_limited() {
    let (_clock, store) = store();
    let policy = Policy::new("api", per_minute(1))
        .unwrap()
        .allow(|req| req.headers().contains_key("x-internal"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let internal = || {
        let mut r = request("/");
        r.headers_mut().insert("x-internal", "1".parse().unwrap());
        r
    };
    assert_eq!(statuses(&app, internal, 5).await, [200; 5]);
    let res = send(&app, internal()).await;
    assert!(res.headers().get("ratelimit").is_none());
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::AllowListed
    );
    assert_eq!(statuses(&app, || request("/"), 2).await, [200, 429]);
}

/// Where and why the policy configuration `toml` (which parses) is refused by `into_policy`.
#[cfg(feature = "serde")]
fn config_refused(toml: &str) -> (String, tower_ratelimit::Error) {
    let config: tower_ratelimit::config::PolicyConfig = toml::from_str(toml).unwrap();
    let e = config
        .into_policy()
        .err()
        .unwrap_or_else(|| panic!("{toml}: accepted"));
    let message = e.to_string();
    let tower_ratelimit::Error::Config { at, source } = e else {
        panic!("{toml}: {e:?}");
    };
    assert!(message.starts_with(&format!("{at}: ")), "{message}");
    (at, *source)
}

/// An error of a policy from configuration says where the setting is, as the file names it: a
/// tier's second quota is not the policy's own.
#[cfg(feature = "serde")]
#[test]
fn a_configuration_error_names_where_it_is() {
    let refused_at = |toml: &str| config_refused(toml).0;
    let base = "name = \"x\"\nquotas = [{ limit = 10, per = \"second\" }]\n";
    assert_eq!(
        refused_at(&format!(
            "{base}[[tiers]]\nname = \"pro\"\n\
             quotas = [{{ limit = 10, per = \"second\" }}, {{ limit = 0, per = \"hour\" }}]"
        )),
        "tiers[0].quotas[1]"
    );
    assert_eq!(
        refused_at("name = \"x\"\nquotas = [{ limit = 1, per = \"second\" }, { limit = 1 }]"),
        "quotas[1]"
    );
    assert_eq!(
        refused_at(
            "name = \"x\"\nalgorithm = \"fixed_window\"\n\
             quotas = [{ limit = 1, per = \"second\" }, { limit = 5, per = \"hour\", burst = 5 }]"
        ),
        "quotas[1].burst"
    );
    // A sliding window's limit × period must fit in 2^52 µs: 2,000,000 a day does not.
    assert_eq!(
        refused_at(
            "name = \"x\"\nalgorithm = \"sliding_window\"\n\
             quotas = [{ limit = 1, per = \"second\" }, { limit = 2000000, per = \"day\" }]"
        ),
        "quotas[1]"
    );
    assert_eq!(refused_at("name = \"x\"\nquotas = []"), "quotas");
    // Nine quotas are the list's error, even where one of them would be refused alone too.
    let mut nine = ["{ limit = 1, per = \"second\" }"; 9];
    nine[3] = "{ limit = 2000000, per = \"day\" }";
    let (at, e) = config_refused(&format!(
        "name = \"x\"\nalgorithm = \"sliding_window\"\nquotas = [{}]",
        nine.join(", ")
    ));
    assert_eq!(at, "quotas", "{e}");
    assert!(e.to_string().contains("at most 8 quotas (got 9)"), "{e}");
    assert_eq!(
        refused_at(&format!(
            "{base}[[tiers]]\nname = \"pro\"\nquotas = [{{ limit = 5, per = \"second\" }}]\n\
             [[tiers]]\nname = \"pro\"\nquotas = [{{ limit = 5, per = \"second\" }}]"
        )),
        "tiers[1].name"
    );
    assert_eq!(
        refused_at(&format!("{base}missing_key = {{ reject = 200 }}")),
        "missing_key.reject"
    );
    assert_eq!(
        refused_at(&format!(
            "{base}failure = {{ mode = \"fallback\", gateways = 0 }}"
        )),
        "failure.gateways"
    );
    assert_eq!(
        refused_at("name = \"\"\nquotas = [{ limit = 1, per = \"second\" }]"),
        "name"
    );
}

#[cfg(feature = "serde")]
#[tokio::test]
async fn a_policy_from_a_configuration_file() {
    use tower_ratelimit::config::PolicyConfig;
    let config: PolicyConfig = toml::from_str(
        r#"
        name = "from-file"
        algorithm = "fixed_window"
        quotas = [{ limit = 2, per = "minute" }]
        missing_key = { shared_key = "anon" }
        headers = { legacy = true }
        body = "problem_json"
        failure = { mode = "closed", retry_after_secs = 3 }
        "#,
    )
    .unwrap();
    let (_clock, store) = store();
    let policy = config
        .into_policy()
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    assert_eq!(statuses(&app, || request("/"), 2).await, [200, 200]);
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"from-file\";q=2;w=60")
    );
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("2"));
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    assert!(
        res.extensions().get::<tower_ratelimit::Verdict>().is_some(),
        "the verdict is on by default"
    );
    let lean: PolicyConfig =
        toml::from_str("name = \"x\"\nquotas = [{ limit = 1, per = \"second\" }]\nverdict = false")
            .unwrap();
    assert!(!lean.verdict);
    let store2 = common::store().1;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store2, lean.into_policy().unwrap()).unwrap());
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 200);
    assert!(res.extensions().get::<tower_ratelimit::Verdict>().is_none());
    // The verdict lent to the handler instead.
    let lent: PolicyConfig = toml::from_str(
        "name = \"x\"\nquotas = [{ limit = 1, per = \"second\" }]\nverdict = false\n\
         verdict_in_request = true",
    )
    .unwrap();
    assert!(lent.verdict_in_request && !lent.verdict);
    let app = Router::new()
        .route(
            "/",
            get(
                |v: Option<axum::Extension<tower_ratelimit::Verdict>>| async move {
                    v.map_or("none", |_| "lent")
                },
            ),
        )
        .layer(RateLimitLayer::new(common::store().1, lent.into_policy().unwrap()).unwrap());
    let res = send(&app, request("/")).await;
    assert!(res.extensions().get::<tower_ratelimit::Verdict>().is_none());
    let bytes = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
    assert_eq!(&bytes[..], b"lent");

    let bad: Result<PolicyConfig, _> = toml::from_str("name = \"x\"\nquotas = []\nfoo = 1");
    assert!(bad.is_err(), "unknown fields are refused");
    let empty: PolicyConfig = toml::from_str("name = \"x\"\nquotas = []").unwrap();
    assert!(empty.into_policy().is_err(), "a policy needs a quota");
    let both: PolicyConfig =
        toml::from_str("name = \"x\"\nquotas = [{ limit = 1, per = \"second\", period_ms = 5 }]")
            .unwrap();
    assert!(both.into_policy().is_err());
    // Settings that would be silently unused or changed are refused, naming the setting: a burst
    // with a window algorithm (for a tier too), and a fail-closed `Retry-After` of zero.
    let refused = |toml: &str| -> &'static str {
        match config_refused(toml).1 {
            tower_ratelimit::Error::InvalidSetting { name, .. } => name,
            other => panic!("{toml}: {other:?}"),
        }
    };
    assert_eq!(
        refused(
            "name = \"x\"\nalgorithm = \"sliding_window\"\n\
             quotas = [{ limit = 1000, per = \"minute\", burst = 10 }]"
        ),
        "burst"
    );
    assert_eq!(
        refused(
            "name = \"x\"\nquotas = [{ limit = 10, per = \"second\", burst = 20 }]\n\
             [[tiers]]\nname = \"free\"\nalgorithm = \"fixed_window\"\n\
             quotas = [{ limit = 5, per = \"second\", burst = 5 }]"
        ),
        "burst"
    );
    // A tier without a name (`""` is the policy's own limit in the metrics' `tier` label).
    assert_eq!(
        refused(
            "name = \"x\"\nquotas = [{ limit = 10, per = \"second\" }]\n\
             [[tiers]]\nname = \"\"\nquotas = [{ limit = 5, per = \"second\" }]"
        ),
        "tier"
    );
    assert_eq!(
        refused(
            "name = \"x\"\nquotas = [{ limit = 1, per = \"second\" }]\n\
             failure = { mode = \"closed\", retry_after_secs = 0 }"
        ),
        "retry_after_secs",
        "named as the configuration names it"
    );
    // The bucket algorithms take a burst.
    let bursty: PolicyConfig = toml::from_str(
        "name = \"x\"\nalgorithm = \"gcra\"\nquotas = [{ limit = 10, per = \"second\", burst = 20 }]",
    )
    .unwrap();
    assert!(bursty.into_policy().is_ok());
    // A setting of another failure mode next to `mode = "open"` is refused by the parser, not
    // silently dropped (the author meant some other mode).
    let parse = |failure: &str| {
        toml::from_str::<PolicyConfig>(&format!(
            "name = \"x\"\nquotas = [{{ limit = 1, per = \"second\" }}]\nfailure = {failure}"
        ))
    };
    for stray in [
        "{ mode = \"open\", retry_after_secs = 2 }",
        "{ mode = \"open\", gateways = 4 }",
        "{ mode = \"closed\", retry_after_secs = 2, gateways = 4 }",
    ] {
        let err = parse(stray).expect_err(stray).to_string();
        assert!(err.contains("unknown field"), "{stray}: {err}");
    }
    assert_eq!(
        parse("{ mode = \"open\" }").unwrap().failure,
        tower_ratelimit::config::FailureConfig::Open {}
    );
    // The missing-key answer is one of three: two, or none, is refused naming them.
    let missing = |answer: &str| {
        toml::from_str::<PolicyConfig>(&format!(
            "name = \"x\"\nquotas = [{{ limit = 1, per = \"second\" }}]\nmissing_key = {answer}"
        ))
    };
    for (answer, says) in [
        (
            "{ reject = 400, shared_key = \"anon\" }",
            "takes one of `reject`, `unauthorized` or `shared_key`, and has `reject` and `shared_key`",
        ),
        (
            "{}",
            "takes one of `reject`, `unauthorized` or `shared_key`, and has none",
        ),
        ("{ status = 400 }", "unknown field `status`"),
        (
            "\"sk_live_s3cret\"",
            "invalid type: a string, expected a table of one of `reject`",
        ),
        // A date: toml passes it as a table of a private key, not named back.
        (
            "1979-05-27",
            "invalid type: a date or time, expected a table of one of `reject`",
        ),
        (
            "{ reject = \"400\" }",
            "invalid type: string \"400\", expected u16",
        ),
    ] {
        // The message alone (toml's `Display` shows the file's line as well).
        let err = missing(answer).expect_err(answer);
        let err = err.message();
        assert!(err.contains(says), "{answer}: {err}");
        assert!(!err.contains("s3cret"), "{answer}: {err}");
    }
    use tower_ratelimit::config::MissingKeyConfig;
    for (answer, config) in [
        ("{ reject = 403 }", MissingKeyConfig::Reject(403)),
        (
            "{ unauthorized = 'Bearer realm=\"api\"' }",
            MissingKeyConfig::Unauthorized("Bearer realm=\"api\"".to_owned()),
        ),
        (
            "{ shared_key = \"anon\" }",
            MissingKeyConfig::SharedKey("anon".to_owned()),
        ),
    ] {
        assert_eq!(missing(answer).expect(answer).missing_key, config);
    }
    // In JSON too, and only as a map of one answer, each of its own type (as the enum it is
    // read as took it): not a sequence, not `null`.
    #[derive(Debug, serde::Deserialize)]
    struct Holder {
        #[allow(dead_code)]
        m: MissingKeyConfig,
    }
    let json = |v: &str| serde_json::from_str::<Holder>(&format!(r#"{{"m": {v}}}"#));
    assert_eq!(
        json(r#"{"reject": 429}"#).unwrap().m,
        MissingKeyConfig::Reject(429)
    );
    for refused in [
        r#"[400, null, null]"#,
        r#"[null, null, "anon"]"#,
        r#"{"reject": 400, "shared_key": null}"#,
        r#"{"reject": null, "unauthorized": null, "shared_key": "anon"}"#,
        r#"{"reject": 400, "reject": 401}"#,
        r#""reject""#,
        r#"null"#,
    ] {
        assert!(json(refused).is_err(), "{refused}");
    }
    // An answer given twice is named, as serde's derived tables name a field given twice.
    for (twice, name) in [
        (r#"{"reject": 400, "reject": 401}"#, "reject"),
        (
            r#"{"unauthorized": "Bearer", "unauthorized": "Basic"}"#,
            "unauthorized",
        ),
        (r#"{"shared_key": "a", "shared_key": "b"}"#, "shared_key"),
    ] {
        let err = json(twice).unwrap_err().to_string();
        assert!(err.contains(&format!("duplicate field `{name}`")), "{err}");
    }
    // A string is not quoted back in JSON either (an API key pasted there).
    let err = json(r#""sk_live_s3cret""#).unwrap_err().to_string();
    assert!(
        err.contains("invalid type: a string, expected a table") && !err.contains("s3cret"),
        "{err}"
    );
    // A gRPC service's denials: the gRPC status instead of a 429.
    let grpc: PolicyConfig =
        toml::from_str("name = \"x\"\nquotas = [{ limit = 1, per = \"hour\" }]\nbody = \"grpc\"")
            .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }).post(|| async { "ok" }))
        .layer(RateLimitLayer::new(common::store().1, grpc.into_policy().unwrap()).unwrap());
    let grpc_call = || common::grpc_request("/", "application/grpc");
    assert_eq!(send(&app, grpc_call()).await.status(), 200);
    let res = send(&app, grpc_call()).await;
    assert_eq!(res.status(), 200, "gRPC's status is in its headers");
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "content-type"), Some("application/grpc"));
}

#[tokio::test]
async fn router_route_layer_limits_matched_routes_only() {
    let (_clock, store) = store();
    let layer = RateLimitLayer::new(store, Policy::new("routes", per_minute(1)).unwrap()).unwrap();
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .route_layer(layer);
    assert_eq!(send(&app, request("/a")).await.status(), 200);
    // One limit for the client across the routes under the layer.
    assert_eq!(send(&app, request("/b")).await.status(), 429);
    // Unmatched paths never reach the layer: 404, not 429.
    assert_eq!(send(&app, request("/missing")).await.status(), 404);
}

/// A method a route does not serve: axum runs a `Router::route_layer` on the route's 405 too,
/// so such requests are counted (and denied once the quota is spent); a layer on the route's
/// method router (`post(h).route_layer(..)`) covers the methods it serves alone.
#[tokio::test]
async fn a_method_routers_layer_does_not_count_405s_and_a_routers_does() {
    let post_to = || {
        http::Request::post("/login")
            .extension(axum::extract::ConnectInfo(
                "192.0.2.1:4000".parse::<std::net::SocketAddr>().unwrap(),
            ))
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let layer = || {
        let (_clock, store) = store();
        RateLimitLayer::new(store, Policy::new("login", per_minute(2)).unwrap()).unwrap()
    };
    let on_methods = Router::new().route("/login", post(|| async { "ok" }).route_layer(layer()));
    for _ in 0..5 {
        assert_eq!(send(&on_methods, request("/login")).await.status(), 405);
    }
    assert_eq!(send(&on_methods, post_to()).await.status(), 200);
    assert_eq!(send(&on_methods, post_to()).await.status(), 200);

    let on_router = Router::new()
        .route("/login", post(|| async { "ok" }))
        .route_layer(layer());
    assert_eq!(send(&on_router, request("/login")).await.status(), 405);
    assert_eq!(send(&on_router, request("/login")).await.status(), 405);
    // The two GETs spent the quota: the POST is denied.
    assert_eq!(send(&on_router, post_to()).await.status(), 429);
}

/// Settings that the constructors check are checked again when the layer is built, for values
/// built directly (public enum variants) or combined across builders.
#[test]
fn settings_built_directly_or_combined_are_checked_at_build() {
    use tower_ratelimit::{Error, FailurePolicy};
    let (_clock, store) = store();
    let refused =
        |policy: Policy, timeout: Duration, fallback_keys: usize| match RateLimitLayer::builder(
            store.clone(),
            policy,
        )
        .timeout(timeout)
        .fallback_max_keys(fallback_keys)
        .build()
        {
            Err(Error::InvalidSetting { name, .. }) => name,
            other => panic!("expected a refused setting, got {:?}", other.map(|_| ())),
        };
    let base = || Policy::new("p", per_minute(10)).unwrap();
    let ms50 = Duration::from_millis(50);
    // Zero gateways would give each gateway the whole limit while the store is down.
    assert_eq!(
        refused(
            base().failure(FailurePolicy::Fallback { gateways: 0 }),
            ms50,
            10
        ),
        "gateways"
    );
    assert_eq!(
        refused(
            base().failure(FailurePolicy::FailClosed {
                retry_after: Duration::from_secs(86_401)
            }),
            ms50,
            10
        ),
        "retry_after"
    );
    assert_eq!(
        refused(
            base().failure(FailurePolicy::fail_closed(Duration::ZERO)),
            ms50,
            10
        ),
        "retry_after"
    );
    // Tiers that nothing chooses: every request would get the base limit.
    assert_eq!(
        refused(base().tier("pro", per_minute(20)).unwrap(), ms50, 10),
        "tiers"
    );
    assert_eq!(refused(base(), Duration::from_secs(3_601), 10), "timeout");
    assert_eq!(refused(base(), ms50, 0), "fallback_max_keys");
    // A challenge made directly that `MissingKey::unauthorized` would refuse: not visible ASCII.
    assert_eq!(
        refused(
            base().missing_key(tower_ratelimit::MissingKey::Unauthorized(
                http::HeaderValue::from_bytes(b"Bearer realm=\"\xe9\"").unwrap()
            )),
            ms50,
            10
        ),
        "missing_key"
    );
}

/// A fallback share that does not fit its algorithm's exact range is made to fit, always
/// downwards (`Limit::divided`): a burst of 2^52 over 3 gateways has no limit to round to, and
/// its burst is lowered; the layer builds, and the tier's fallback answers within the share.
#[tokio::test]
async fn a_fallback_share_that_does_not_fit_is_made_to_fit() {
    use ratelimit_core::{Algorithm, Limit, Quota};
    use tower_ratelimit::FailurePolicy;
    let huge = Limit::single(
        Algorithm::TokenBucket,
        Quota::per_second(1_000_000)
            .unwrap()
            .with_burst(1 << 52)
            .unwrap(),
    )
    .unwrap();
    let share = huge.divided(3).unwrap().quotas()[0];
    assert_eq!(share.limit(), 333_333);
    assert!(share.burst() < (1 << 52) / 3, "{share:?}");
    let policy = Policy::new("p", per_minute(10))
        .unwrap()
        .tier("pro", huge)
        .unwrap()
        .resolve_tier(|_| Some("pro"))
        .failure(FailurePolicy::fallback(3).unwrap());
    let layer = RateLimitLayer::new(std::sync::Arc::new(FailingStore::default()), policy).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::FallbackAllowed
    );
}

/// A circuit breaker's cool-down is at most an hour: a longer one (`Duration::MAX`) would leave a
/// tripped circuit open for good, every request answered by the failure policy.
#[test]
fn a_cool_down_is_between_a_millisecond_and_an_hour() {
    use tower_ratelimit::{CircuitBreaker, Error};
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(3_601),
        Duration::MAX,
    ] {
        assert!(
            matches!(
                CircuitBreaker::new(5, bad),
                Err(Error::InvalidSetting {
                    name: "cool_down",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
    for good in [Duration::from_millis(1), Duration::from_secs(3_600)] {
        assert_eq!(CircuitBreaker::new(5, good).unwrap().cool_down(), good);
    }
}

/// Any configuration that parses, with numbers anywhere in their types (0, 1, around 2^52, up to
/// `u64::MAX`) and names of any characters, is either refused by `into_policy` with a typed error
/// that names where it is, or taken by `RateLimitLayer::new` and served (a tier's, given its
/// resolver, for every other request): never a panic. A served policy answers each request with
/// a 200 or a 429, its fields well formed.
#[cfg(feature = "serde")]
mod any_configuration {
    use super::*;
    use proptest::prelude::*;
    use tower_ratelimit::config::PolicyConfig;

    fn number() -> impl Strategy<Value = u64> {
        prop_oneof![
            1 => Just(0u64),
            4 => 1u64..=5,
            4 => 1u64..=100_000,
            1 => (1u64 << 51)..=(1 << 53),
            1 => Just(u64::MAX),
            1 => any::<u64>(),
        ]
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-z]{1,8}",
            1 => Just(String::new()),
            1 => any::<String>(),
            1 => "[\"\\\\ ,;=\\t]{1,4}",
        ]
    }

    fn quota() -> impl Strategy<Value = String> {
        (
            number(),
            prop_oneof![
                3 => Just("per = \"second\"".to_owned()),
                1 => Just("per = \"day\"".to_owned()),
                2 => number().prop_map(|ms| format!("period_ms = {}", ms.min(i64::MAX as u64))),
            ],
            proptest::option::weighted(0.2, number()),
        )
            .prop_map(|(limit, per, burst)| {
                // TOML integers are i64.
                let n = |v: u64| v.min(i64::MAX as u64);
                match burst {
                    Some(b) => format!("{{ limit = {}, {per}, burst = {} }}", n(limit), n(b)),
                    None => format!("{{ limit = {}, {per} }}", n(limit)),
                }
            })
    }

    fn config() -> impl Strategy<Value = String> {
        let algorithm = proptest::sample::select(
            &[
                "token_bucket",
                "gcra",
                "fixed_window",
                "sliding_window",
                "sliding_log",
            ][..],
        );
        let failure = prop_oneof![
            Just("{ mode = \"open\" }".to_owned()),
            number().prop_map(|s| format!(
                "{{ mode = \"closed\", retry_after_secs = {} }}",
                s.min(i64::MAX as u64)
            )),
            number().prop_map(|g| format!(
                "{{ mode = \"fallback\", gateways = {} }}",
                g.min(i64::MAX as u64)
            )),
        ];
        let missing = prop_oneof![
            (0u16..=1000).prop_map(|s| format!("{{ reject = {s} }}")),
            name().prop_map(|c| format!("{{ unauthorized = {c:?} }}")),
            name().prop_map(|k| format!("{{ shared_key = {k:?} }}")),
        ];
        (
            name(),
            algorithm,
            prop_oneof![1 => Just(Vec::new()), 8 => proptest::collection::vec(quota(), 1..=2)],
            failure,
            missing,
            proptest::option::weighted(0.3, (name(), proptest::collection::vec(quota(), 1..=2))),
            proptest::sample::select(&["plain_text", "problem_json", "grpc"][..]),
        )
            .prop_map(|(name, algorithm, quotas, failure, missing, tier, body)| {
                let mut toml = format!(
                    "name = {name:?}\nalgorithm = {algorithm:?}\nquotas = [{}]\n\
                     failure = {failure}\nmissing_key = {missing}\nbody = {body:?}\n\
                     headers = {{ legacy = true }}\n",
                    quotas.join(", ")
                );
                if let Some((tier, quotas)) = tier {
                    toml.push_str(&format!(
                        "[[tiers]]\nname = {tier:?}\nquotas = [{}]\n",
                        quotas.join(", ")
                    ));
                }
                toml
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, max_global_rejects: u32::MAX, ..ProptestConfig::default() })]

        #[test]
        fn any_configuration_is_refused_with_a_typed_error_or_serves(
            toml in config(),
            costs in proptest::collection::vec(
                prop_oneof![Just(1u64), Just(0u64), any::<u64>()], 1..6),
        ) {
            // Rust's `{:?}` escapes are TOML's for the names drawn here, but for a few (`\0`,
            // `\u{..}` of a control character) that TOML writes otherwise: such a file does
            // not parse, and is not a configuration.
            let Ok(config) = toml::from_str::<PolicyConfig>(&toml) else {
                return Err(TestCaseError::reject("not TOML"));
            };
            let policy = match config.into_policy() {
                Ok(p) => p,
                Err(e) => {
                    let message = e.to_string();
                    let tower_ratelimit::Error::Config { at, .. } = &e else {
                        panic!("{toml}: an error that names no place: {e:?}");
                    };
                    prop_assert!(message.starts_with(&format!("{at}: ")), "{}", message);
                    return Ok(());
                }
            };
            let policy = policy
                .key(GlobalKey)
                .cost(|req: &tower_ratelimit::RequestHead<'_>| {
                    req.headers()
                        .get("x-cost")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                });
            // A policy with a tier needs its resolver (the layer refuses one without): the
            // tier for requests marked `x-tiered`, the policy's own limit for the others.
            let tier = toml::from_str::<toml::Value>(&toml).ok().and_then(|v| {
                Some(v.get("tiers")?.get(0)?.get("name")?.as_str()?.to_owned())
            });
            let tiered = tier.is_some();
            let policy = match tier {
                Some(tier) => policy.resolve_tier_with(tier, |tier, req| {
                    req.headers().contains_key("x-tiered").then_some(tier.as_str())
                }),
                None => policy,
            };
            // What `into_policy` accepts, the layer takes.
            let layer = match RateLimitLayer::new(ratelimit_core::MemoryStore::new(), policy) {
                Ok(layer) => layer,
                Err(e) => panic!("{toml}: accepted by into_policy, refused by the layer: {e:?}"),
            };
            let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                for (i, cost) in costs.into_iter().enumerate() {
                    let mut req = http::Request::get("/")
                        .header("x-cost", cost)
                        .body(Body::empty())
                        .unwrap();
                    if tiered && i % 2 == 0 {
                        req.headers_mut().insert("x-tiered", http::HeaderValue::from_static("1"));
                    }
                    let res = app.clone().oneshot(req).await.unwrap();
                    let status = res.status().as_u16();
                    assert!(status == 200 || status == 429, "{toml}: {status}");
                    for (name, value) in res.headers() {
                        assert!(
                            value.to_str().is_ok(),
                            "{toml}: {name} is not visible ASCII: {value:?}"
                        );
                    }
                    if status == 429
                        && let Some(v) = res.headers().get("retry-after")
                    {
                        let secs: u64 = v.to_str().unwrap().parse().unwrap();
                        assert!(secs >= 1, "{toml}: Retry-After {secs}");
                    }
                }
            });
        }
    }
}
