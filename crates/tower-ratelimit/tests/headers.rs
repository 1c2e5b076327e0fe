//! Status, `Retry-After`, the IETF fields, legacy fields and bodies, through an axum `Router`.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use common::*;
use http_body_util::Full;
use ratelimit_core::{Algorithm, Clock, Limit, Quota};
use tower::{ServiceExt, service_fn};
use tower_ratelimit::key::GlobalKey;
use tower_ratelimit::{DenialBody, Headers, Policy, RateLimitLayer, Verdict, VerdictKind};

fn app(store: TestStore, policy: Policy) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap())
}

fn five_a_minute() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(5).unwrap()).unwrap()
}

#[tokio::test]
async fn the_nth_plus_one_request_gets_429_with_exact_fields() {
    let (clock, store) = store();
    let app = app(store, Policy::new("api", five_a_minute()).unwrap());

    for i in 0..5u64 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
        // One token comes back every 12 s: `t` is the time until the next one (draft-10: until
        // more quota is available), whatever the number spent.
        let expected = format!("\"api\";r={};t=12", 4 - i);
        assert_eq!(header(&res, "ratelimit"), Some(expected.as_str()));
        assert_eq!(header(&res, "retry-after"), None);
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=12"));
    assert_eq!(
        header(&res, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let verdict = res.extensions().get::<Verdict>().unwrap().clone();
    assert_eq!(verdict.kind(), VerdictKind::Denied);
    assert_eq!(verdict.policy(), "api");
    assert_eq!(
        verdict.decision().unwrap().retry_after(),
        Some(Duration::from_secs(12))
    );
    assert_eq!(body_text(res).await, "Too Many Requests\n");

    // 11.5 s later the wait is 0.5 s: Retry-After rounds up to 1, never 0.
    clock.advance(Duration::from_millis(11_500));
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=1"));

    clock.advance(Duration::from_millis(500));
    assert_eq!(send(&app, request("/")).await.status(), 200);
}

/// `t` of an allowed response is the time until more of the quota is available (draft-10), for
/// the bucket algorithms the next whole unit, and `X-RateLimit-Reset` the time until the quota is
/// full (its own meaning): 5 a minute, 2 spent, 5 s later the third of the two comes back in 7 s
/// and all of them in 19 s.
#[tokio::test]
async fn t_is_the_time_until_more_quota_and_the_legacy_reset_until_full() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let (clock, store) = store();
        let limit = Limit::single(algorithm, Quota::per_minute(5).unwrap()).unwrap();
        let policy = Policy::new("api", limit)
            .unwrap()
            .headers(Headers::ietf().legacy(true));
        let app = app(store, policy);
        let res = send(&app, request("/")).await;
        assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=4;t=12"));
        assert_eq!(header(&res, "x-ratelimit-reset"), Some("12"));
        let res = send(&app, request("/")).await;
        assert_eq!(
            header(&res, "ratelimit"),
            Some("\"api\";r=3;t=12"),
            "{algorithm:?}"
        );
        assert_eq!(
            header(&res, "x-ratelimit-reset"),
            Some("24"),
            "{algorithm:?}"
        );
        clock.advance(Duration::from_secs(5));
        // A third request spends one more: 2 left, and 5/12 of the next token.
        let res = send(&app, request("/")).await;
        assert_eq!(
            header(&res, "ratelimit"),
            Some("\"api\";r=2;t=7"),
            "{algorithm:?}"
        );
        assert_eq!(
            header(&res, "x-ratelimit-reset"),
            Some("31"),
            "{algorithm:?}"
        );
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some("2"));
        // A full bucket: nothing more to come.
        clock.advance(Duration::from_secs(60));
        let res = send(&app, request("/")).await;
        assert_eq!(
            header(&res, "ratelimit"),
            Some("\"api\";r=4;t=12"),
            "{algorithm:?}"
        );
    }
    // A fixed window: more comes when the window ends, which is when it is full again.
    let (clock, store) = store();
    let limit = Limit::single(Algorithm::FixedWindow, Quota::per_minute(5).unwrap()).unwrap();
    let app = app(
        store,
        Policy::new("w", limit)
            .unwrap()
            .headers(Headers::ietf().legacy(true)),
    );
    clock.advance(Duration::from_secs(15));
    let res = send(&app, request("/")).await;
    let t = header(&res, "ratelimit").unwrap().to_owned();
    assert!(t.starts_with("\"w\";r=4;t="), "{t}");
    assert_eq!(
        t.trim_start_matches("\"w\";r=4;t="),
        header(&res, "x-ratelimit-reset").unwrap()
    );
}

/// For the sliding window and the sliding log too, `t` of an allowed response is the time until
/// more of the quota is available, which comes before the quota is full again (the case draft-10
/// names): 10 per 10 s.
#[tokio::test]
async fn t_of_the_sliding_algorithms_is_the_time_until_more_quota() {
    let limit = |algorithm| {
        Limit::single(
            algorithm,
            Quota::per_period(10, Duration::from_secs(10)).unwrap(),
        )
        .unwrap()
    };
    let policy = |algorithm| {
        Policy::new("s", limit(algorithm))
            .unwrap()
            .headers(Headers::ietf().legacy(true))
    };

    // Sliding-window counter: 10 spent at 1 s fill the window [0, 10 s). At 11 s the previous
    // window still weighs 10 × 9/10 = 9, so one more passes, and the next comes when the
    // weight has slid to 8 (at 12 s): t = 1, while the quota is full only at 30 s (t was 19).
    let (clock, st) = store();
    let router = app(st, policy(Algorithm::SlidingWindow));
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        assert_eq!(send(&router, request("/")).await.status(), 200);
    }
    clock.advance(Duration::from_secs(10));
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "ratelimit"), Some("\"s\";r=0;t=1"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("19"));
    assert_eq!(send(&router, request("/")).await.status(), 429);
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&router, request("/")).await.status(), 200);

    // Sliding log: 4 at 0 s, 3 at 2 s, 3 at 4 s. The 4 slide out at 10 s: t = 6 at 4 s, while the
    // log is empty again only at 14 s (t was 10).
    let (clock, st) = store();
    let router = app(st, policy(Algorithm::SlidingLog));
    for (at, n) in [(0, 4), (2, 3), (4, 3)] {
        clock.set(ratelimit_core::Timestamp::from_secs(at));
        for _ in 0..n {
            assert_eq!(send(&router, request("/")).await.status(), 200);
        }
    }
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 429);
    clock.set(ratelimit_core::Timestamp::from_secs(9));
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "ratelimit"), Some("\"s\";r=0;t=1"));
    clock.set(ratelimit_core::Timestamp::from_secs(10));
    let res = send(&router, request("/")).await;
    assert_eq!(res.status(), 200);
    // 3 left; the next unit comes back with the 3 of 2 s, at 12 s.
    assert_eq!(header(&res, "ratelimit"), Some("\"s\";r=3;t=2"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("10"));
}

#[tokio::test]
async fn sub_second_waits_round_up_to_one() {
    let (_clock, store) = store();
    let limit = Limit::single(Algorithm::Gcra, Quota::per_second(10).unwrap()).unwrap();
    let app = app(store, Policy::new("fast", limit).unwrap());
    for _ in 0..10 {
        assert_eq!(send(&app, request("/")).await.status(), 200);
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "ratelimit"), Some("\"fast\";r=0;t=1"));
}

/// Fields the inner service set are kept as they are. The IETF fields are lists: the layer's
/// items are added beside the inner ones, as lines of their own (the pair always together); the
/// legacy three hold one value each, and are added whole or not at all.
#[tokio::test]
async fn headers_set_by_the_inner_service_are_kept() {
    let inner_sets = |fields: &'static [(&'static str, &'static str)]| {
        let (_clock, store) = store();
        let policy = Policy::new("api", five_a_minute())
            .unwrap()
            .headers(Headers::ietf().legacy(true));
        Router::new()
            .route(
                "/",
                get(move || async move {
                    let mut res = axum::response::Response::new(axum::body::Body::from("ok"));
                    for (name, value) in fields {
                        res.headers_mut().insert(*name, value.parse().unwrap());
                    }
                    res
                }),
            )
            .layer(RateLimitLayer::new(store, policy).unwrap())
    };

    let res = send(
        &inner_sets(&[("ratelimit", "\"inner\";r=1;t=1")]),
        request("/"),
    )
    .await;
    assert_eq!(
        header_lines(&res, "ratelimit"),
        ["\"inner\";r=1;t=1", "\"api\";r=4;t=12"]
    );
    assert_eq!(header_lines(&res, "ratelimit-policy"), ["\"api\";q=5;w=60"]);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("4"));

    let res = send(
        &inner_sets(&[("ratelimit-policy", "\"inner\";q=9;w=9")]),
        request("/"),
    )
    .await;
    assert_eq!(
        header_lines(&res, "ratelimit-policy"),
        ["\"inner\";q=9;w=9", "\"api\";q=5;w=60"]
    );
    assert_eq!(header_lines(&res, "ratelimit"), ["\"api\";r=4;t=12"]);

    // The inner service names an item as this policy does: left as it is, none added (a client
    // could not tell two "api" items apart).
    let res = send(
        &inner_sets(&[
            ("ratelimit-policy", "\"api\";q=9;w=9"),
            ("ratelimit", "\"api\";r=8;t=1"),
        ]),
        request("/"),
    )
    .await;
    assert_eq!(header_lines(&res, "ratelimit-policy"), ["\"api\";q=9;w=9"]);
    assert_eq!(header_lines(&res, "ratelimit"), ["\"api\";r=8;t=1"]);
    // The same without its policy: none added either.
    let res = send(
        &inner_sets(&[("ratelimit", "\"api\";r=8;t=1")]),
        request("/"),
    )
    .await;
    assert_eq!(header_lines(&res, "ratelimit"), ["\"api\";r=8;t=1"]);
    assert!(header_lines(&res, "ratelimit-policy").is_empty());
    // The same name as a Token (`api`, not `"api"`: the draft's later revisions take either
    // form for a policy's name) is the same name: none added.
    let res = send(
        &inner_sets(&[
            ("ratelimit-policy", "api;q=9;w=9"),
            ("ratelimit", "api;r=8;t=1"),
        ]),
        request("/"),
    )
    .await;
    assert_eq!(header_lines(&res, "ratelimit-policy"), ["api;q=9;w=9"]);
    assert_eq!(header_lines(&res, "ratelimit"), ["api;r=8;t=1"]);
    let res = send(
        &inner_sets(&[("ratelimit", "other, api ;r=8;t=1")]),
        request("/"),
    )
    .await;
    assert_eq!(header_lines(&res, "ratelimit"), ["other, api ;r=8;t=1"]);
    assert!(header_lines(&res, "ratelimit-policy").is_empty());
    // A Token that only starts like it, or the name within a string, is another policy.
    for fields in [
        &[("ratelimit-policy", "api2;q=9;w=9")][..],
        &[("ratelimit-policy", "\"x api\";q=9;w=9")],
        &[("ratelimit-policy", "ap;q=9;w=9")],
    ] {
        let res = send(&inner_sets(fields), request("/")).await;
        assert_eq!(
            header_lines(&res, "ratelimit-policy"),
            [fields[0].1, "\"api\";q=5;w=60"]
        );
    }
    // A name that only starts like it is another policy.
    let res = send(
        &inner_sets(&[("ratelimit-policy", "\"api2\";q=9;w=9")]),
        request("/"),
    )
    .await;
    assert_eq!(
        header_lines(&res, "ratelimit-policy"),
        ["\"api2\";q=9;w=9", "\"api\";q=5;w=60"]
    );

    let res = send(&inner_sets(&[("x-ratelimit-reset", "7")]), request("/")).await;
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("7"));
    assert_eq!(header(&res, "x-ratelimit-limit"), None);
    assert_eq!(header(&res, "x-ratelimit-remaining"), None);
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=4;t=12"));
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
}

/// Two layers on one route (a strict route layer inside a router-wide one): each says its own
/// policy, so a client sees the one that binds, whichever it is. The inner layer's 429 carries
/// the outer layer's items too; a request the outer layer denies never reaches the inner one.
#[tokio::test]
async fn stacked_layers_each_add_their_items() {
    let (_clock, store) = store();
    let strict = Policy::new("login", five_a_minute())
        .unwrap()
        .key(GlobalKey);
    let loose = Policy::new(
        "site",
        Limit::single(Algorithm::TokenBucket, Quota::per_minute(7).unwrap()).unwrap(),
    )
    .unwrap()
    .key(GlobalKey);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(store.clone(), strict).unwrap())
        .layer(RateLimitLayer::new(store, loose).unwrap());
    for i in 0..5u64 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            header_lines(&res, "ratelimit-policy"),
            ["\"login\";q=5;w=60", "\"site\";q=7;w=60"]
        );
        // The next unit of each: 12 s for 5 a minute, 60/7 s for 7 a minute.
        let login = format!("\"login\";r={};t=12", 4 - i);
        let site = format!("\"site\";r={};t=9", 6 - i);
        assert_eq!(header_lines(&res, "ratelimit"), [login, site]);
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert_eq!(
        header_lines(&res, "ratelimit"),
        ["\"login\";r=0;t=12", "\"site\";r=1;t=9"]
    );
    // The outer layer's last token; then its own 429, with its items alone.
    assert_eq!(send(&app, request("/")).await.status(), 429);
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        header_lines(&res, "ratelimit-policy"),
        ["\"site\";q=7;w=60"]
    );
    assert_eq!(header_lines(&res, "ratelimit"), ["\"site\";r=0;t=9"]);
}

/// A bucket's burst above its rate: `q` and `w` give the sustained rate, `r` what is left of the
/// burst, and `X-RateLimit-Limit` the burst.
#[tokio::test]
async fn a_burst_above_the_rate_shows_in_r_and_the_legacy_limit() {
    let (_clock, store) = store();
    let quota = Quota::per_second(10).unwrap().with_burst(20).unwrap();
    let limit = Limit::single(Algorithm::TokenBucket, quota).unwrap();
    let policy = Policy::new("api", limit)
        .unwrap()
        .headers(Headers::ietf().legacy(true));
    let res = send(&app(store, policy), request("/")).await;
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=10;w=1"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=19;t=1"));
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("20"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("19"));
}

/// A period that is not whole seconds is advertised over the period rounded up, at its rate.
#[tokio::test]
async fn a_sub_second_period_is_advertised_at_its_rate() {
    let (_clock, store) = store();
    let quota = Quota::per_period(5, Duration::from_millis(100)).unwrap();
    let limit = Limit::single(Algorithm::FixedWindow, quota).unwrap();
    let res = send(
        &app(store, Policy::new("api", limit).unwrap()),
        request("/"),
    )
    .await;
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=50;w=1"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=4;t=1"));
}

#[tokio::test]
async fn legacy_fields_and_denied_only_mode() {
    let (_clock, store) = store();
    let policy = Policy::new("api", five_a_minute())
        .unwrap()
        .headers(Headers::ietf().on_allowed(false).legacy(true));
    let app = app(store, policy);
    for _ in 0..5 {
        let res = send(&app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "ratelimit"), None);
        assert_eq!(header(&res, "x-ratelimit-remaining"), None);
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("5"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("12"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=12"));
}

#[tokio::test]
async fn no_fields_mode_keeps_retry_after() {
    let (_clock, store) = store();
    let policy = Policy::new("api", five_a_minute())
        .unwrap()
        .headers(Headers::none());
    let app = app(store, policy);
    for _ in 0..5 {
        let res = send(&app, request("/")).await;
        assert!(res.headers().get("ratelimit").is_none());
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert!(res.headers().get("ratelimit").is_none());
    assert!(res.headers().get("ratelimit-policy").is_none());
}

/// A group turned on from `none()` goes on every response, as from `ietf()`: `none()` chooses
/// which fields, not where (before, `none().legacy(true)` sent them on 429s only).
#[tokio::test]
async fn a_group_turned_on_from_none_goes_on_every_response() {
    for headers in [
        Headers::none().legacy(true),
        Headers::ietf().with_ietf(false).legacy(true),
    ] {
        let (_clock, store) = store();
        let policy = Policy::new("api", five_a_minute())
            .unwrap()
            .headers(headers);
        let res = send(&app(store, policy), request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "x-ratelimit-remaining"),
            Some("4"),
            "{headers:?}"
        );
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(
        Headers::none().legacy(true),
        Headers::ietf().with_ietf(false).legacy(true)
    );
}

#[tokio::test]
async fn the_verdict_can_be_left_out_of_the_extensions() {
    let (_clock, memory) = store();
    let limited = app(
        memory,
        Policy::new("api", five_a_minute()).unwrap().verdict(false),
    );
    for i in 0..5u64 {
        let res = send(&limited, request("/")).await;
        assert_eq!(res.status(), 200);
        assert!(res.extensions().get::<Verdict>().is_none());
        // The headers do not depend on it.
        let expected = format!("\"api\";r={};t=12", 4 - i);
        assert_eq!(header(&res, "ratelimit"), Some(expected.as_str()));
    }
    let res = send(&limited, request("/")).await;
    assert_eq!(res.status(), 429);
    assert!(res.extensions().get::<Verdict>().is_none());
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert_eq!(body_text(res).await, "Too Many Requests\n");

    // Without headers and without the verdict, an allowed response is the inner one, untouched.
    let (_clock, memory) = store();
    let untouched = app(
        memory,
        Policy::new("api", five_a_minute())
            .unwrap()
            .headers(Headers::none())
            .verdict(false),
    );
    let res = send(&untouched, request("/")).await;
    assert_eq!(res.status(), 200);
    assert!(res.extensions().get::<Verdict>().is_none());
    assert!(res.headers().get("ratelimit").is_none());
    assert_eq!(body_text(res).await, "ok");
}

/// An app whose one policy, "api", counts every request against `limit` and answers its 429s
/// with a problem+json body.
fn problem_app(store: TestStore, limit: Limit) -> Router {
    let policy = Policy::new("api", limit)
        .unwrap()
        .key(GlobalKey)
        .body(DenialBody::ProblemJson);
    app(store, policy)
}

#[tokio::test]
async fn problem_json_body() {
    let (_clock, store) = store();
    let app = problem_app(store, five_a_minute());
    for _ in 0..5 {
        send(&app, request("/")).await;
    }
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    let body = body_text(res).await;
    assert!(body.starts_with(
        "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\""
    ));
    assert!(body.ends_with("\"status\":429,\"violated-policies\":[\"api\"]}"));
}

/// The layer's other answers follow a problem+json policy too: a request without a key (400)
/// gets a problem of type `about:blank` with the plain text's words as its title.
// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn a_problem_json_policy_answers_a_missing_key_in_problem_json() {
    let (_clock, store) = store();
    // The default key is the peer address, which this request lacks.
    let policy = Policy::new("api", five_a_minute())
        .unwrap()
        .body(DenialBody::ProblemJson);
    let res = send(
        &app(store, policy),
        http::Request::new(axum::body::Body::empty()),
    )
    .await;
    assert_eq!(res.status(), 400);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        body_text(res).await,
        "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\"No rate-limit key in the request\"}"
    );
}

#[tokio::test]
async fn a_problem_body_names_the_quota_that_denied() {
    let (clock, store) = store();
    let limit = Limit::new(
        Algorithm::TokenBucket,
        [Quota::per_second(2).unwrap(), Quota::per_minute(3).unwrap()],
    )
    .unwrap();
    let app = problem_app(store, limit);
    let denied_by = |res: http::Response<axum::body::Body>| async move {
        assert_eq!(res.status(), 429);
        let rate_limit = header(&res, "ratelimit").unwrap().to_owned();
        (rate_limit, body_text(res).await)
    };
    send(&app, request("/")).await;
    send(&app, request("/")).await;
    // The third request in the same second: the per-second quota denies.
    let (rate_limit, body) = denied_by(send(&app, request("/")).await).await;
    assert!(rate_limit.starts_with("\"api.0\";"), "{rate_limit}");
    assert!(
        body.ends_with("\"violated-policies\":[\"api.0\"]}"),
        "{body}"
    );
    // A second later the per-second quota has refilled; the per-minute one is spent after one.
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    let (rate_limit, body) = denied_by(send(&app, request("/")).await).await;
    assert!(rate_limit.starts_with("\"api.1\";"), "{rate_limit}");
    assert!(
        body.ends_with("\"violated-policies\":[\"api.1\"]}"),
        "{body}"
    );
}

/// A request that several quotas deny names each of them in `violated-policies`, in the order of
/// `RateLimit-Policy`; `RateLimit` describes the binding one (the longest wait).
#[tokio::test]
async fn a_denial_by_several_quotas_names_each() {
    let (clock, store) = store();
    let limit = Limit::new(
        Algorithm::TokenBucket,
        [
            Quota::per_second(1).unwrap(),
            Quota::per_hour(50).unwrap(),
            Quota::per_minute(2).unwrap(),
        ],
    )
    .unwrap();
    let app = problem_app(store, limit);
    assert_eq!(send(&app, request("/")).await.status(), 200);
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&app, request("/")).await.status(), 200);
    // The third at once: the second is spent (wait 1 s), and the minute too (1/30 of a request
    // came back in that second: wait 29 s). The hour has 48 left.
    let res = send(&app, request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("29"));
    let rate_limit = header(&res, "ratelimit").unwrap().to_owned();
    assert!(rate_limit.starts_with("\"api.2\";r=0;"), "{rate_limit}");
    let body = body_text(res).await;
    assert!(
        body.ends_with("\"violated-policies\":[\"api.0\",\"api.2\"]}"),
        "{body}"
    );
}

/// The answer to the sixth request in a minute under five a minute, with a custom denial body.
async fn sixth_with(store: TestStore, body: DenialBody) -> http::Response<axum::body::Body> {
    let app = app(
        store,
        Policy::new("api", five_a_minute()).unwrap().body(body),
    );
    for _ in 0..5 {
        send(&app, request("/")).await;
    }
    send(&app, request("/")).await
}

#[tokio::test]
async fn custom_body_keeps_its_headers_and_gets_ours() {
    let (_clock, store) = store();
    let body = DenialBody::custom(|denial| {
        http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .header("retry-after", "999")
            .body(bytes::Bytes::from(format!(
                "{{\"policy\":\"{}\",\"wait\":{}}}",
                denial.policy(),
                denial.retry_after_secs().unwrap()
            )))
            .unwrap()
    });
    let res = sixth_with(store, body).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("999"), "not overwritten");
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=12"));
    assert_eq!(body_text(res).await, "{\"policy\":\"api\",\"wait\":12}");
}

/// A custom body's status is kept only if it is an error (4xx or 5xx): a 2xx would tell the
/// client it was served, a 304 to use its cached copy, and a 1xx is not a final answer.
#[tokio::test]
async fn a_custom_body_that_is_not_an_error_becomes_a_429() {
    for (status, want) in [
        (200, 429),
        (204, 429),
        (304, 429),
        (302, 429),
        (103, 429),
        (503, 503),
    ] {
        let (_clock, store) = store();
        let body = DenialBody::custom(move |_| {
            let mut r = http::Response::new(bytes::Bytes::new());
            *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
            r
        });
        let res = sixth_with(store, body).await;
        assert_eq!(res.status(), want, "a custom {status}");
        assert_eq!(header(&res, "retry-after"), Some("12"));
    }
}

/// A quota that is full has nothing more to come: `RateLimit` leaves out `t` (optional in
/// draft-10), which as `t=0` said that more is available now.
#[tokio::test]
async fn a_full_quota_has_no_t() {
    for algorithm in Algorithm::ALL {
        let (_clock, store) = store();
        let limit = Limit::single(algorithm, Quota::per_minute(5).unwrap()).unwrap();
        // A peek (cost 0) spends nothing: the quota stays full.
        let policy = Policy::new("api", limit).unwrap().cost(|_| 0);
        let res = send(&app(store, policy), request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "ratelimit"),
            Some("\"api\";r=5"),
            "{algorithm:?}"
        );
    }
}

/// Of a limit of several quotas, one that is full and has as few left as the others caps the
/// limit for good: nothing more is coming, so no `t`, whatever the other quota's time to full
/// (it was told as the time more comes). Every algorithm: 2 a second and 5 a minute, 2 spent at
/// once, 1 three seconds later, then a peek three seconds after that: 2 left of each, the
/// per-second quota full.
#[tokio::test]
async fn a_full_quota_that_caps_a_limit_of_several_leaves_out_t() {
    for algorithm in Algorithm::ALL {
        let (clock, store) = store();
        let limit = Limit::new(
            algorithm,
            [Quota::per_second(2).unwrap(), Quota::per_minute(5).unwrap()],
        )
        .unwrap();
        let policy = Policy::new("api", limit).unwrap().cost(cost_header);
        let app = app(store, policy);
        let spend = |cost: &str| with_header(request("/"), "x-cost", cost);
        assert_eq!(send(&app, spend("2")).await.status(), 200);
        clock.advance(Duration::from_secs(3));
        assert_eq!(send(&app, spend("1")).await.status(), 200);
        clock.advance(Duration::from_secs(3));
        let peek = send(&app, spend("0")).await;
        assert_eq!(
            header(&peek, "ratelimit"),
            Some("\"api.0\";r=2"),
            "{algorithm:?}"
        );
    }
}

#[tokio::test]
async fn a_cost_that_can_never_pass_is_denied_without_retry_after() {
    let (_clock, store) = store();
    let policy = Policy::new("api", five_a_minute()).unwrap().cost(|_| 6);
    let res = send(&app(store.clone(), policy), request("/")).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), None);
    assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
    // No wait would help, and the fields say the quota is whole, with no `t`: nothing more is
    // coming (`t=0` said "more now", and a client retried at once). The body says why.
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=5"));
    assert_eq!(
        body_text(res).await,
        "Too Many Requests: this request costs more than the limit can ever admit at once\n"
    );
    let policy = Policy::new("api2", five_a_minute())
        .unwrap()
        .cost(|_| 6)
        .body(DenialBody::ProblemJson);
    let body = body_text(send(&app(store, policy), request("/")).await).await;
    assert!(
        body.ends_with(
            "\"violated-policies\":[\"api2\"],\"detail\":\"this request costs more than the \
             limit can ever admit at once\"}"
        ),
        "{body}"
    );
}

/// A 429 for a cost the limit can never admit tells the quota as it stands, as a peek at the same
/// instant does: under the sliding algorithms too, whose `t` is when the next unit frees (it was
/// the time until the whole quota is back). 10 per 10 s, 5 spent at once and 5 more 5 s later;
/// a second after that, the first 5 free in 4 s and the quota is whole in 9.
#[tokio::test]
async fn a_cost_that_can_never_pass_tells_the_quota_as_a_peek_does() {
    for algorithm in Algorithm::ALL {
        let (clock, store) = store();
        let limit = Limit::single(
            algorithm,
            Quota::per_period(10, Duration::from_secs(10)).unwrap(),
        )
        .unwrap();
        let policy = Policy::new("api", limit).unwrap().cost(cost_header);
        let app = app(store, policy);
        let costing = |cost: &str| with_header(request("/"), "x-cost", cost);
        assert_eq!(send(&app, costing("5")).await.status(), 200);
        clock.advance(Duration::from_secs(5));
        assert_eq!(send(&app, costing("5")).await.status(), 200);
        clock.advance(Duration::from_secs(1));
        let peek = send(&app, costing("0")).await;
        let never = send(&app, costing("11")).await;
        assert_eq!(never.status(), 429, "{algorithm:?}");
        assert_eq!(header(&never, "retry-after"), None, "{algorithm:?}");
        assert_eq!(
            header(&never, "ratelimit"),
            header(&peek, "ratelimit"),
            "{algorithm:?}"
        );
        if matches!(algorithm, Algorithm::SlidingLog) {
            assert_eq!(header(&never, "ratelimit"), Some("\"api\";r=0;t=4"));
        }
    }
}

#[tokio::test]
async fn multi_quota_fields_name_the_binding_quota() {
    let (_clock, store) = store();
    let limit = Limit::new(
        Algorithm::FixedWindow,
        [Quota::per_second(3).unwrap(), Quota::per_hour(100).unwrap()],
    )
    .unwrap();
    let app = app(store, Policy::new("api", limit).unwrap());
    let res = send(&app, request("/")).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"api.0\";q=3;w=1, \"api.1\";q=100;w=3600")
    );
    assert_eq!(header(&res, "ratelimit"), Some("\"api.0\";r=2;t=1"));
}

/// A tower service (not axum) whose body is `Full<Bytes>`.
async fn hi(_req: http::Request<String>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    Ok(http::Response::new(Full::new(Bytes::from_static(b"hi"))))
}

/// Sends `n` requests that must pass, then one more: its response.
async fn after<S, B>(svc: S, n: usize) -> http::Response<B>
where
    S: tower::Service<http::Request<String>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    for _ in 0..n {
        let res = svc
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    svc.oneshot(http::Request::new(String::new()))
        .await
        .unwrap()
}

async fn collect<B>(body: B) -> Bytes
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    http_body_util::BodyExt::collect(body)
        .await
        .unwrap()
        .to_bytes()
}

#[tokio::test]
async fn works_with_a_non_axum_body_type() {
    let (_clock, store) = store();
    let layer = RateLimitLayer::new(
        store,
        Policy::new("api", five_a_minute()).unwrap().key(GlobalKey),
    )
    .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(hi));
    let res = after(svc, 5).await;
    assert_eq!(res.status(), 429);
    assert_eq!(&collect(res.into_body()).await[..], b"Too Many Requests\n");
}

#[tokio::test]
async fn same_body_keeps_the_inner_body_type() {
    // The type says it: the inner body, not a wrapper around it.
    async fn text(res: http::Response<Full<Bytes>>) -> Bytes {
        collect(res.into_body()).await
    }
    let (_clock, memory) = store();
    let layer = RateLimitLayer::new(
        memory,
        Policy::new("api", five_a_minute()).unwrap().key(GlobalKey),
    )
    .unwrap()
    .same_body();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(hi));
    for i in 0..5u64 {
        let res = svc
            .clone()
            .oneshot(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let expected = format!("\"api\";r={};t=12", 4 - i);
        assert_eq!(header(&res, "ratelimit"), Some(expected.as_str()));
        assert_eq!(
            res.extensions().get::<Verdict>().unwrap().kind(),
            VerdictKind::Allowed
        );
        assert_eq!(&text(res).await[..], b"hi");
    }
    let res = svc
        .oneshot(http::Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert_eq!(
        header(&res, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(&text(res).await[..], b"Too Many Requests\n");

    // A custom denial body, in the inner body type, keeps its headers and gets ours.
    let (_clock, memory) = store();
    let body = DenialBody::custom(|denial| {
        http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .body(bytes::Bytes::from(format!(
                "{{\"policy\":\"{}\"}}",
                denial.policy()
            )))
            .unwrap()
    });
    let layer = RateLimitLayer::new(
        memory,
        Policy::new("api", five_a_minute())
            .unwrap()
            .key(GlobalKey)
            .body(body),
    )
    .unwrap()
    .same_body();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(hi));
    let res = after(svc, 5).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "content-type"), Some("application/json"));
    assert_eq!(header(&res, "retry-after"), Some("12"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=12"));
    assert_eq!(&text(res).await[..], b"{\"policy\":\"api\"}");
}

// The policy's default key, the peer address, comes with the default `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn same_body_on_an_axum_router_answers_with_axum_bodies() {
    let (_clock, memory) = store();
    // The default key is the peer address: a request without one gets the 400 the layer writes.
    let layer = RateLimitLayer::new(memory, Policy::new("api", five_a_minute()).unwrap())
        .unwrap()
        .same_body();
    let svc = tower::ServiceBuilder::new().layer(layer).service(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .into_service::<axum::body::Body>(),
    );
    let res: http::Response<axum::body::Body> =
        tower::ServiceExt::oneshot(svc.clone(), http::Request::new(axum::body::Body::empty()))
            .await
            .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(body_text(res).await, "No rate-limit key in the request\n");
    let res = tower::ServiceExt::oneshot(svc, request("/")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(body_text(res).await, "ok");
}

/// The fields and the verdict are added when the inner service answers, even if its future is
/// pending at first (they wait in the response future across its polls), in either body mode.
#[tokio::test]
async fn an_inner_future_that_waits_still_gets_the_fields_and_the_verdict() {
    // A handler whose future is pending on its first poll.
    let waits = || async {
        tokio::task::yield_now().await;
        "ok"
    };
    let (_clock, store) = store();
    let policy = Policy::new("api", five_a_minute()).unwrap();
    let layer = RateLimitLayer::new(store, policy).unwrap();
    let wrapped = Router::new().route("/", get(waits)).layer(layer.clone());
    let same = Router::new()
        .route("/", get(waits))
        .layer(layer.same_body());
    for (i, app) in [wrapped, same].iter().enumerate() {
        let res = send(app, request("/")).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=5;w=60"));
        // The two routers share the layer's limit: one token each.
        let expected = format!("\"api\";r={};t=12", 4 - i);
        assert_eq!(header(&res, "ratelimit"), Some(expected.as_str()));
        let verdict = res.extensions().get::<Verdict>().unwrap();
        assert_eq!(verdict.kind(), VerdictKind::Allowed);
        assert_eq!(body_text(res).await, "ok");
    }
}

/// `t` of an allowed bucket answer is never before the next whole unit comes back, and at most
/// one second after (whole seconds, rounded up; when a unit takes a fractional number of
/// microseconds, as 3 per 10 s does, the decision's time to full leaves the unit's time uncertain
/// by a microsecond, and `t` takes the later). Each answer's `t` is checked on a replay of the
/// same requests: `r + 1` requests pass at `t` seconds, and not 1 µs before `t − 1`.
#[tokio::test]
async fn t_is_never_before_the_next_unit_and_at_most_a_second_after() {
    /// The requests' times (µs after the start), and each answer's `r` and `t`.
    async fn run(
        limit: &Limit,
        steps: &[u64],
        then: Option<(u64, u64)>,
    ) -> (Vec<(u64, u64)>, Option<bool>) {
        let (clock, store) = store();
        let start = clock.now().as_micros();
        let since_start = |clock: &ratelimit_core::ManualClock| {
            Duration::from_micros(clock.now().as_micros() - start)
        };
        let policy = Policy::new("b", limit.clone())
            .unwrap()
            .key(tower_ratelimit::key::GlobalKey);
        let app = app(store, policy);
        let mut answers = Vec::new();
        for &at in steps {
            clock.advance(Duration::from_micros(at) - since_start(&clock));
            let res = send(&app, request("/")).await;
            if res.status() != 200 {
                answers.push((u64::MAX, 0));
                continue;
            }
            let field = header(&res, "ratelimit").unwrap().to_owned();
            let r = field
                .split(";r=")
                .nth(1)
                .unwrap()
                .split(';')
                .next()
                .unwrap();
            let t = field.split(";t=").nth(1).map_or(0, |t| t.parse().unwrap());
            answers.push((r.parse().unwrap(), t));
        }
        // Then, at `at`, whether `n` requests in a row all pass.
        let passed = match then {
            None => None,
            Some((at, n)) => {
                clock.advance(Duration::from_micros(at) - since_start(&clock));
                let mut all = true;
                for _ in 0..n {
                    all &= send(&app, request("/")).await.status() == 200;
                }
                Some(all)
            }
        };
        (answers, passed)
    }
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        for (n, period) in [(3, 10), (7, 60), (5, 60)] {
            let quota = Quota::per_period(n, Duration::from_secs(period)).unwrap();
            let limit = Limit::single(algorithm, quota).unwrap();
            // Requests at random instants, some on whole seconds; and a review's case: all spent
            // at 0 s, one more at 7 s, 3 per 10 s, which leaves 1.1 units: the next is back at
            // exactly 3 s, which a time to full of 6,333,334 µs (rounded up from 6,333,333⅓)
            // cannot tell from 3 s and 1 µs, so `t` says 4.
            let mut steps = vec![0; n as usize];
            let mut at = 0;
            for _ in 0..12 {
                at += if next() % 2 == 0 {
                    (next() % 8) * 1_000_000
                } else {
                    next() % 8_000_000
                };
                steps.push(at);
            }
            let reviewed = [0, 0, 0, 7_000_000];
            let runs: &[&[u64]] = if (n, period) == (3, 10) {
                &[&reviewed, &steps]
            } else {
                &[&steps]
            };
            for &steps in runs {
                let (answers, _) = run(&limit, steps, None).await;
                if steps == reviewed {
                    assert_eq!(answers[3], (1, 4), "{algorithm:?}");
                }
                for (i, &(r, t)) in answers.iter().enumerate() {
                    if r == u64::MAX || t == 0 {
                        continue;
                    }
                    let at = steps[i];
                    let upto = &steps[..=i];
                    let (_, on_time) = run(&limit, upto, Some((at + t * 1_000_000, r + 1))).await;
                    assert_eq!(
                        on_time,
                        Some(true),
                        "{algorithm:?} {n}/{period}s step {i}: t={t}, r={r}"
                    );
                    if t >= 1 {
                        let early = (at + (t - 1) * 1_000_000).saturating_sub(1).max(at);
                        let (_, before) = run(&limit, upto, Some((early, r + 1))).await;
                        assert_eq!(
                            before,
                            Some(false),
                            "{algorithm:?} {n}/{period}s step {i}: t={t}, r={r}"
                        );
                    }
                }
            }
        }
    }
}
