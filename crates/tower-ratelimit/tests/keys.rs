//! Key extraction through an axum `Router`: API keys, users, peers, clients behind proxies,
//! combinations, and the answer when there is no key.

// The peer-address extractors these tests use come with the default `axum` feature.
#![cfg(feature = "axum")]

mod common;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::routing::get;
use common::*;
use http::StatusCode;
use ratelimit_core::{Algorithm, Limit, Quota};
use tower_ratelimit::key::{
    self, ApiKeyHeader, ClientIpKey, ExtensionKey, KeyBuf, KeyExtractor, KeyPart, NoKey, PeerIp,
    RouteKey,
};
use tower_ratelimit::{
    ClientIp, MissingKey, Policy, RateLimitLayer, RequestHead, Verdict, VerdictKind,
};

fn two_a_minute() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap()
}

fn app(store: TestStore, policy: Policy) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/other", get(|| async { "other" }))
        .layer(RateLimitLayer::new(store, policy).unwrap())
}

#[tokio::test]
async fn api_keys_have_separate_limits() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap());
    let app = app(store, policy);
    let a = || with_header(request("/"), "x-api-key", "alice");
    let b = || with_header(request("/"), "x-api-key", "bob");
    assert_eq!(statuses(&app, a, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, b, 3).await, [200, 200, 429]);
}

/// `key::from_fn`: a closure given to `Policy::key` without written types, writing bytes it
/// borrows from the request; `NoKey` is the missing-key answer.
#[tokio::test]
async fn a_key_written_by_a_closure() {
    let (_clock, store) = store();
    let policy =
        Policy::new("tenants", two_a_minute())
            .unwrap()
            .key(tower_ratelimit::key::from_fn(|req, key| {
                let tenant = req
                    .headers()
                    .get("x-tenant")
                    .ok_or(tower_ratelimit::key::NoKey)?;
                key.push(tenant.as_bytes());
                Ok(())
            }));
    let app = app(store, policy);
    let acme = || with_header(request("/"), "x-tenant", "acme");
    let globex = || with_header(request("/"), "x-tenant", "globex");
    assert_eq!(statuses(&app, acme, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, globex, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, || request("/"), 1).await, [400]);
}

#[tokio::test]
async fn a_missing_key_gets_400_by_default_never_500() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap());
    let res = send(&app(store, policy), request("/")).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::NoKey
    );
    // The answer says what to send: the header's name, nothing of the app's setup.
    assert_eq!(
        body_text(res).await,
        "No rate-limit key in the request (send one non-empty x-api-key header)\n"
    );
}

/// The missing-key answer names what the client can send, joined over the key's parts, and
/// nothing the client cannot send itself (an extension an earlier layer sets, its address).
#[tokio::test]
async fn a_missing_key_answer_names_only_what_a_client_can_send() {
    #[derive(Clone)]
    struct UserId(u64);
    impl KeyPart for UserId {
        fn write_to(&self, key: &mut KeyBuf) {
            self.0.write_to(key)
        }
    }
    async fn text(key: impl KeyExtractor) -> String {
        let (_clock, store) = store();
        let policy = Policy::new("api", two_a_minute()).unwrap().key(key);
        body_text(send(&app(store, policy), request("/")).await).await
    }
    let header = |name: &str| ApiKeyHeader::new(name).unwrap();
    assert_eq!(
        text((RouteKey::new(), header("x-api-key"))).await,
        "No rate-limit key in the request (send one non-empty x-api-key header)\n"
    );
    assert_eq!(
        text(key::or(header("x-api-key"), header("x-tenant"))).await,
        "No rate-limit key in the request (send either one non-empty x-api-key header or one \
         non-empty x-tenant header)\n"
    );
    assert_eq!(
        text((
            key::or(header("x-api-key"), header("x-tenant")),
            header("x-region")
        ))
        .await,
        "No rate-limit key in the request (send either one non-empty x-api-key header or one \
         non-empty x-tenant header, and one non-empty x-region header)\n"
    );
    // A part without a hint leaves the other's alone.
    assert_eq!(
        key::or(header("x-api-key"), PeerIp::new()).client_hint(),
        Some("one non-empty x-api-key header".to_owned())
    );
    assert_eq!(
        text((header("x-api-key"), RouteKey::new(), header("x-tenant"))).await,
        "No rate-limit key in the request (send one non-empty x-api-key header and one \
         non-empty x-tenant header)\n"
    );
    // (Asked directly: a request without the extension would log this file's warning, which
    // another test counts.)
    assert_eq!(ExtensionKey::<UserId>::new().client_hint(), None);
    assert_eq!(PeerIp::new().client_hint(), None);
    let closure =
        |req: &RequestHead<'_>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec());
    assert_eq!(text(closure).await, "No rate-limit key in the request\n");
}

#[tokio::test]
async fn an_api_key_header_sent_twice_is_no_key() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap());
    let app = app(store, policy);
    // Two values: which one an authentication layer checked is unknown, so neither is the key.
    let twice = || {
        let mut req = with_header(request("/"), "x-api-key", "victim");
        req.headers_mut()
            .append("x-api-key", "mine".parse().unwrap());
        req
    };
    let res = send(&app, twice()).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        res.extensions().get::<Verdict>().unwrap().kind(),
        VerdictKind::NoKey
    );
    // The victim's quota is untouched.
    let victim = || with_header(request("/"), "x-api-key", "victim");
    assert_eq!(statuses(&app, twice, 3).await, [400, 400, 400]);
    assert_eq!(statuses(&app, victim, 3).await, [200, 200, 429]);
}

/// Spaces and tabs around an API key, which HTTP/1's parser drops but HTTP/2's passes on, are
/// not part of it: `"k"`, `"k "` and `" k\t"` are one key (an authentication layer that trims
/// the value accepts all three as `k`), and a value of only spaces is no key.
#[tokio::test]
async fn spaces_around_an_api_key_are_not_part_of_it() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap());
    let app = app(store, policy);
    let spellings = ["k", "k ", " k\t", "\t k  "];
    let sent = std::cell::Cell::new(0);
    let next = || {
        sent.set(sent.get() + 1);
        with_header(request("/"), "x-api-key", spellings[sent.get() - 1])
    };
    assert_eq!(statuses(&app, next, 4).await, [200, 200, 429, 429]);
    let blank = || with_header(request("/"), "x-api-key", " \t ");
    assert_eq!(statuses(&app, blank, 1).await, [400]);
    // A key part of a header value is trimmed alike.
    let mut part = KeyBuf::new();
    http::HeaderValue::from_static(" k ").write_to(&mut part);
    assert_eq!(part.as_bytes(), b"k");
}

#[tokio::test]
async fn a_missing_key_can_get_a_chosen_status() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .missing_key(MissingKey::reject(403).unwrap());
    let res = send(&app(store, policy), request("/")).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(res.headers().get("www-authenticate").is_none());
}

/// A 401 carries the `WWW-Authenticate` challenge HTTP requires of it; a bare 401 (and a 405 or
/// 407, which need headers of their own) is refused, even built directly.
#[tokio::test]
async fn a_missing_key_can_get_a_401_with_its_challenge() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .missing_key(MissingKey::unauthorized("ApiKey header=\"x-api-key\"").unwrap());
    let res = send(&app(store.clone(), policy), request("/")).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        res.headers()["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );
    // About the credentials the client lacks, not about the rate limiter.
    assert_eq!(
        body_text(res).await,
        "Unauthorized: this request needs credentials (send one non-empty x-api-key header)\n"
    );
    let refused = [
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
        MissingKey::Reject(StatusCode::METHOD_NOT_ALLOWED),
        MissingKey::Reject(StatusCode::PROXY_AUTHENTICATION_REQUIRED),
        MissingKey::Unauthorized(http::HeaderValue::from_static("")),
    ];
    for status in refused {
        let policy = Policy::new("api", two_a_minute())
            .unwrap()
            .missing_key(status.clone());
        assert!(
            matches!(
                RateLimitLayer::new(store.clone(), policy),
                Err(tower_ratelimit::Error::InvalidSetting {
                    name: "missing_key",
                    ..
                })
            ),
            "{status:?}"
        );
    }
}

#[test]
fn a_missing_key_status_that_is_not_an_error_is_refused_even_when_built_directly() {
    let (_clock, store) = store();
    for status in [StatusCode::OK, StatusCode::FOUND, StatusCode::CONTINUE] {
        let policy = Policy::new("api", two_a_minute())
            .unwrap()
            .missing_key(MissingKey::Reject(status));
        assert!(
            matches!(
                RateLimitLayer::new(store.clone(), policy),
                Err(tower_ratelimit::Error::InvalidStatus { status: s }) if s == status.as_u16()
            ),
            "{status:?}"
        );
    }
}

#[tokio::test]
async fn keyless_requests_can_share_one_fallback_key() {
    let (_clock, store) = store();
    let policy = Policy::new("api", two_a_minute())
        .unwrap()
        .key(ApiKeyHeader::new("x-api-key").unwrap())
        .missing_key(MissingKey::shared_key("anonymous"));
    let app = app(store, policy);
    // Keyless requests from different peers share one bucket...
    assert_eq!(
        send(&app, request_from("/", "192.0.2.1:1")).await.status(),
        200
    );
    assert_eq!(
        send(&app, request_from("/", "192.0.2.2:1")).await.status(),
        200
    );
    assert_eq!(
        send(&app, request_from("/", "192.0.2.3:1")).await.status(),
        429
    );
    // ...which is not the bucket of a client whose key happens to be "anonymous".
    let named = || with_header(request("/"), "x-api-key", "anonymous");
    assert_eq!(statuses(&app, named, 3).await, [200, 200, 429]);
}

/// A request with the API key header twice, `first` then `second`: an authentication layer that
/// reads the first value accepts it as `first`'s.
fn sent_twice(first: &str, second: &str) -> http::Request<Body> {
    let mut req = with_header(request("/"), "x-api-key", first);
    req.headers_mut()
        .append("x-api-key", second.parse().unwrap());
    req
}

/// A key sent in a form the extractor cannot use (its header twice, or empty) is not a keyless
/// request: `or` does not count it under its second extractor (the client's address), which
/// would let a client whose authentication layer reads the first header be served as its key
/// after the key's quota is spent, each address with a quota of its own.
#[tokio::test]
async fn or_does_not_fall_back_for_an_unusable_key() {
    let (_clock, store) = store();
    let policy = Policy::new("keys-or-ips", two_a_minute())
        .unwrap()
        .key(key::or(
            ApiKeyHeader::new("x-api-key").unwrap(),
            PeerIp::new(),
        ));
    let app = app(store, policy);
    let good = || with_header(request("/"), "x-api-key", "good");
    assert_eq!(statuses(&app, good, 3).await, [200, 200, 429]);
    for peer in ["192.0.2.1:1", "192.0.2.2:1", "198.51.100.9:1"] {
        let mut twice = sent_twice("good", "other");
        twice.extensions_mut().insert(axum::extract::ConnectInfo(
            peer.parse::<std::net::SocketAddr>().unwrap(),
        ));
        let res = send(&app, twice).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{peer}");
        assert_eq!(
            res.extensions().get::<Verdict>().unwrap().kind(),
            VerdictKind::NoKey
        );
        let empty = with_header(request_from("/", peer), "x-api-key", " ");
        assert_eq!(send(&app, empty).await.status(), 400, "{peer}");
    }
    // Without the header, a request is anonymous: its address's key, untouched by the above.
    let anonymous = || request_from("/", "192.0.2.1:1");
    assert_eq!(statuses(&app, anonymous, 3).await, [200, 200, 429]);
}

/// Under a shared key for keyless requests, a key sent in a form the extractor cannot use gets
/// `400` (counted as no key) instead of the anonymous clients' bucket, which it would spend while
/// an authentication layer served it as a key; in a dry run it is let through as a would-be
/// denial.
#[tokio::test]
async fn a_shared_key_does_not_take_an_unusable_key() {
    for dry_run in [false, true] {
        let (_clock, store) = store();
        let policy = Policy::new("api", two_a_minute())
            .unwrap()
            .key(ApiKeyHeader::new("x-api-key").unwrap())
            .missing_key(MissingKey::shared_key("anonymous"))
            .dry_run(dry_run);
        let app = app(store, policy);
        for req in [
            sent_twice("good", "good"),
            with_header(request("/"), "x-api-key", ""),
        ] {
            let res = send(&app, req).await;
            let kind = res.extensions().get::<Verdict>().unwrap().kind();
            if dry_run {
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(kind, VerdictKind::ShadowDenied);
            } else {
                assert_eq!(res.status(), StatusCode::BAD_REQUEST);
                assert_eq!(kind, VerdictKind::NoKey);
                assert_eq!(
                    body_text(res).await,
                    "No rate-limit key in the request (send one non-empty x-api-key header)\n"
                );
            }
        }
        // The anonymous bucket is whole: two keyless requests pass, the third is denied (as a
        // would-be denial in the dry run).
        let keyless = || request("/");
        let expected: &[u16] = if dry_run {
            &[200, 200, 200]
        } else {
            &[200, 200, 429]
        };
        assert_eq!(statuses(&app, keyless, 3).await, expected);
    }
}

/// What `unusable` says of a request `extract` found no key in, for the built-in extractors and
/// their combinations.
#[test]
fn which_keys_are_unusable() {
    let header = || ApiKeyHeader::new("x-api-key").unwrap();
    let head_of = |req: &http::Request<Body>| header().unusable(&RequestHead::of(req));
    assert!(!head_of(&request("/")), "absent");
    assert!(
        head_of(&with_header(request("/"), "x-api-key", " \t")),
        "empty"
    );
    assert!(head_of(&sent_twice("a", "b")), "twice");
    assert!(
        !head_of(&with_header(request("/"), "x-api-key", "k")),
        "one value"
    );

    let twice = sent_twice("a", "b");
    let twice = RequestHead::of(&twice);
    let absent = request("/");
    let absent = RequestHead::of(&absent);
    assert!((RouteKey::new(), header()).unusable(&twice));
    assert!((header(), RouteKey::new(), PeerIp::new()).unusable(&twice));
    assert!(!(RouteKey::new(), header()).unusable(&absent));
    assert!(key::or(PeerIp::new(), header()).unusable(&twice));
    assert!(key::or(header(), PeerIp::new()).unusable(&twice));
    assert!(!key::or(header(), PeerIp::new()).unusable(&absent));
    assert!(!PeerIp::new().unusable(&twice));
    assert!(!ExtensionKey::<UserId>::new().unusable(&twice));
    // A closure's key is either there or not.
    let closure = |req: &RequestHead<'_>| req.headers().get("x-api-key").cloned();
    assert!(!closure.unusable(&twice));
}

#[derive(Clone)]
struct UserId(u64);

impl KeyPart for UserId {
    fn write_to(&self, key: &mut KeyBuf) {
        self.0.write_to(key)
    }
}

/// A stand-in authentication layer: `authorization: user <id>` becomes a `UserId` extension.
async fn auth(mut req: Request, next: Next) -> axum::response::Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("user "))
        .and_then(|id| id.parse().ok());
    if let Some(id) = user {
        req.extensions_mut().insert(UserId(id));
    }
    next.run(req).await
}

#[tokio::test]
async fn a_user_id_from_an_auth_layer() {
    let (_clock, store) = store();
    let policy = Policy::new("users", two_a_minute())
        .unwrap()
        .key(ExtensionKey::<UserId>::new());
    // The last layer added runs first: auth, then the rate limit.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap())
        .layer(middleware::from_fn(auth));
    let u1 = || with_header(request("/"), "authorization", "user 1");
    let u2 = || with_header(request("/"), "authorization", "user 2");
    assert_eq!(statuses(&app, u1, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, u2, 1).await, [200]);
    assert_eq!(send(&app, request("/")).await.status(), 400, "anonymous");
}

/// A signed-in client counts as its user, an anonymous one as its address; the two never share a
/// key, and a first extractor that wrote part of a key before finding none leaves no trace.
#[tokio::test]
async fn the_user_if_signed_in_else_the_address() {
    let (lines, _guard) = Lines::capture();
    let (_clock, store) = store();
    let policy = Policy::new("users-or-ips", two_a_minute())
        .unwrap()
        .key(key::or(ExtensionKey::<UserId>::new(), PeerIp::new()));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(store, policy).unwrap())
        .layer(middleware::from_fn(auth));
    let u1 = || with_header(request("/"), "authorization", "user 1");
    let anonymous = || request("/");
    assert_eq!(statuses(&app, u1, 3).await, [200, 200, 429]);
    // The same address, not signed in: a key of its own.
    assert_eq!(statuses(&app, anonymous, 3).await, [200, 200, 429]);
    let elsewhere = || request_from("/", "198.51.100.9:1234");
    assert_eq!(statuses(&app, elsewhere, 1).await, [200]);

    let partial = key::from_fn(|_req, key| {
        key.push(b"half-written");
        Err(NoKey)
    });
    let either = key::or(partial, PeerIp::new());
    let req = request("/");
    let mut written = KeyBuf::new();
    either
        .extract(&RequestHead::of(&req), &mut written)
        .unwrap();
    let mut alone = KeyBuf::new();
    PeerIp::new()
        .extract(&RequestHead::of(&req), &mut alone)
        .unwrap();
    alone.push_byte(2);
    assert_eq!(written.as_bytes(), alone.as_bytes());
    // Anonymous clients are expected here: no warning of a missing `UserId`.
    let text = lines.text();
    assert!(!text.contains("WARN"), "{text}");
}

/// An `ExtensionKey` inside the first extractor of `or` (in a tuple with the route, or in another
/// `or`) is expected to be missing too: anonymous requests get the second extractor's key, and no
/// warning of a misplaced authentication layer.
#[tokio::test]
async fn an_extension_key_nested_in_ors_first_extractor_does_not_warn() {
    let (lines, _guard) = Lines::capture();
    let (_clock, store) = store();
    let nested = Policy::new("route-users-or-ips", two_a_minute())
        .unwrap()
        .key(key::or(
            (RouteKey::new(), ExtensionKey::<UserId>::new()),
            (RouteKey::new(), PeerIp::new()),
        ));
    let deeper = Policy::new("users-or-users-or-ips", two_a_minute())
        .unwrap()
        .key(key::or(
            key::or(ExtensionKey::<UserId>::new(), ExtensionKey::<UserId>::new()),
            PeerIp::new(),
        ));
    for policy in [nested, deeper] {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(store.clone(), policy).unwrap())
            .layer(middleware::from_fn(auth));
        let u1 = || with_header(request("/"), "authorization", "user 1");
        assert_eq!(statuses(&app, u1, 3).await, [200, 200, 429]);
        assert_eq!(statuses(&app, || request("/"), 3).await, [200, 200, 429]);
    }
    let text = lines.text();
    assert!(!text.contains("WARN"), "{text}");
}

/// The test support's capture sees a line even when another thread, without a subscriber, is
/// the first to reach its callsite while the capture's subscriber is the only one alive: tracing
/// then caches the callsite's interest from that thread's dispatcher (none) for every thread,
/// unless another dispatcher stays registered, as `Lines::capture` keeps one. (Without it, the
/// test below missed its line in one CI run, another test having reached the callsite first.)
#[test]
fn a_capture_sees_a_line_whose_callsite_another_thread_reached_first() {
    fn say() {
        tracing::warn!("said");
    }
    let (lines, guard) = Lines::capture();
    std::thread::spawn(say).join().unwrap();
    say();
    drop(guard);
    let text = lines.text();
    assert_eq!(text.matches("said").count(), 1, "{text}");
}

/// The authentication layer put inside the rate limit (so it runs after it): no request has a
/// `UserId` yet when the limiter looks, and each gets the missing-key answer. The app's setup is
/// at fault, so the library says so once, at `warn`, naming the type and the order to use.
#[tokio::test]
async fn an_auth_layer_inside_the_limit_is_logged_once_with_the_fix() {
    let (lines, _guard) = Lines::capture();
    let (_clock, store) = store();
    let policy = Policy::new("users", two_a_minute())
        .unwrap()
        .key(ExtensionKey::<UserId>::new());
    // The wrong order: the last layer added runs first, so here the rate limit runs first.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(middleware::from_fn(auth))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let u1 = || with_header(request("/"), "authorization", "user 1");
    assert_eq!(statuses(&app, u1, 20).await, [400; 20]);

    let text = lines.text();
    assert_eq!(text.matches("WARN").count(), 1, "{text}");
    assert!(
        text.contains(&format!(
            "no `{}` found in the request extensions",
            std::any::type_name::<UserId>()
        )),
        "{text}"
    );
    assert!(text.contains("must run before the rate limit"), "{text}");
    assert!(text.contains("`.layer(rate_limit).layer(auth)`"), "{text}");
}

#[tokio::test]
async fn route_and_user_combined() {
    let (_clock, store) = store();
    let policy = Policy::new("per-route", two_a_minute())
        .unwrap()
        .key((RouteKey::new(), ApiKeyHeader::new("x-api-key").unwrap()));
    let app = app(store, policy);
    let root = || with_header(request("/"), "x-api-key", "k");
    let other = || with_header(request("/other"), "x-api-key", "k");
    assert_eq!(statuses(&app, root, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, other, 3).await, [200, 200, 429]);
}

/// Under a `nest_service` mount, axum sets no `MatchedPath` for the paths below the mount: they
/// share `<unmatched>` with the 404s, while the mount's own path and that path with a slash are
/// matched routes of their own (as `RouteKey`'s docs say).
#[tokio::test]
async fn route_keys_under_a_nest_service_mount() {
    let (_clock, store) = store();
    let one_a_minute =
        Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    let policy = Policy::new("per-route", one_a_minute)
        .unwrap()
        .key((RouteKey::new(), ApiKeyHeader::new("x-api-key").unwrap()));
    let mounted = Router::new()
        .route("/", get(|| async { "root" }))
        .route("/login", get(|| async { "login" }));
    let app = Router::new()
        .route("/other", get(|| async { "other" }))
        .nest_service("/auth", mounted)
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let status = |path: &'static str| {
        let app = app.clone();
        async move {
            send(&app, with_header(request(path), "x-api-key", "k"))
                .await
                .status()
                .as_u16()
        }
    };
    // A 404 spends the client's `<unmatched>` unit, which the paths below the mount share.
    assert_eq!(status("/nope").await, 404);
    assert_eq!(status("/auth/login").await, 429);
    // The mount's own path, with and without its slash, and another route: a key each.
    assert_eq!(status("/auth").await, 200);
    assert_eq!(status("/auth").await, 429);
    assert_eq!(status("/auth/").await, 200);
    assert_eq!(status("/other").await, 200);
}

#[tokio::test]
async fn a_client_choosing_methods_does_not_multiply_a_route_quota() {
    let (_clock, store) = store();
    let policy = Policy::new("per-route", two_a_minute())
        .unwrap()
        .key((RouteKey::new(), ApiKeyHeader::new("x-api-key").unwrap()));
    let app = Router::new()
        .route("/search", get(|| async { "found" }))
        .route("/any", axum::routing::any(|| async { "any" }))
        .layer(RateLimitLayer::new(store, policy).unwrap());
    let with_method = |method: &str, path: &str| {
        let mut req = with_header(request(path), "x-api-key", "k");
        *req.method_mut() = method.parse().unwrap();
        req
    };
    // axum answers HEAD with the GET handler: one quota for both.
    assert_eq!(
        send(&app, with_method("GET", "/search")).await.status(),
        200
    );
    assert_eq!(
        send(&app, with_method("HEAD", "/search")).await.status(),
        200
    );
    assert_eq!(
        send(&app, with_method("HEAD", "/search")).await.status(),
        429
    );
    assert_eq!(
        send(&app, with_method("GET", "/search")).await.status(),
        429
    );
    // Invented methods share one key: a client cannot make a fresh bucket per method name.
    assert_eq!(send(&app, with_method("FOO1", "/any")).await.status(), 200);
    assert_eq!(send(&app, with_method("FOO2", "/any")).await.status(), 200);
    assert_eq!(send(&app, with_method("FOO3", "/any")).await.status(), 429);
    // Standard methods still count apart.
    assert_eq!(send(&app, with_method("POST", "/any")).await.status(), 200);
    assert_eq!(
        send(&app, with_method("DELETE", "/any")).await.status(),
        200
    );
}

#[tokio::test]
async fn a_closure_key() {
    let (_clock, store) = store();
    let policy = Policy::new("tenant", two_a_minute()).unwrap().key(
        |req: &tower_ratelimit::RequestHead<'_>| {
            req.headers()
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_ascii_lowercase)
        },
    );
    let app = app(store, policy);
    let upper = || with_header(request("/"), "x-tenant", "ACME");
    let lower = || with_header(request("/"), "x-tenant", "acme");
    assert_eq!(statuses(&app, upper, 2).await, [200, 200]);
    assert_eq!(statuses(&app, lower, 1).await, [429]);
}

#[tokio::test]
async fn peer_ip_is_the_default_key_and_groups_ipv6_by_64() {
    let (_clock, store) = store();
    let app = app(store, Policy::new("ip", two_a_minute()).unwrap());
    let v4 = || request_from("/", "198.51.100.1:1234");
    assert_eq!(statuses(&app, v4, 3).await, [200, 200, 429]);
    assert_eq!(
        send(&app, request_from("/", "[2001:db8:0:1::1]:1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        send(&app, request_from("/", "[2001:db8:0:1::ffff]:1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        send(&app, request_from("/", "[2001:db8:0:1:9::]:1"))
            .await
            .status(),
        429
    );
    assert_eq!(
        send(&app, request_from("/", "[2001:db8:0:2::1]:1"))
            .await
            .status(),
        200
    );
    // Served without ConnectInfo: no key, the configured answer.
    let no_peer = http::Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(send(&app, no_peer).await.status(), 400);
}

fn proxied(peer: &str, xff: &str) -> http::Request<Body> {
    with_header(request_from("/", peer), "x-forwarded-for", xff)
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let (_clock, store) = store();
    let client_ip = ClientIp::behind_proxies(["10.0.0.0/8"]).unwrap();
    let policy = Policy::new("ip", two_a_minute())
        .unwrap()
        .key(ClientIpKey::new(client_ip));
    let app = app(store, policy);
    // An attacker connecting directly rotates X-Forwarded-For on every request: the header is
    // not believed, the attacker's own address is the key.
    for (i, expected) in [200, 200, 429, 429].into_iter().enumerate() {
        let spoof = format!("1.2.3.{i}");
        let res = send(&app, proxied("203.0.113.66:4000", &spoof)).await;
        assert_eq!(res.status(), expected, "spoofed request {i}");
    }
}

#[tokio::test]
async fn the_entry_appended_by_a_trusted_proxy_is_used() {
    let (_clock, store) = store();
    let client_ip = ClientIp::behind_proxies(["10.0.0.0/8"]).unwrap();
    let policy = Policy::new("ip", two_a_minute())
        .unwrap()
        .key(ClientIpKey::new(client_ip));
    let app = app(store, policy);
    // Two clients behind our proxy 10.0.0.2. The first puts garbage of its own to the left.
    let c1 = || proxied("10.0.0.2:80", "6.6.6.6, 198.51.100.7");
    let c2 = || proxied("10.0.0.2:80", "198.51.100.8");
    assert_eq!(statuses(&app, c1, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&app, c2, 3).await, [200, 200, 429]);
    // The proxy itself is not limited as one client...
    let c3 = || proxied("10.0.0.3:80", "198.51.100.9");
    assert_eq!(statuses(&app, c3, 1).await, [200]);
    // ...and the same client through a second proxy hop is still the same client.
    let via_two = || proxied("10.0.0.2:80", "198.51.100.7, 10.9.9.9");
    assert_eq!(statuses(&app, via_two, 1).await, [429]);
}

#[tokio::test]
async fn two_policies_on_one_store_never_share_state() {
    let (_clock, store) = store();
    let key = || ApiKeyHeader::new("x-api-key").unwrap();
    // Same limit, same key, same store: only the policy name differs.
    let a = RateLimitLayer::new(
        store.clone(),
        Policy::new("a", two_a_minute()).unwrap().key(key()),
    )
    .unwrap();
    let b =
        RateLimitLayer::new(store, Policy::new("b", two_a_minute()).unwrap().key(key())).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(a)
        .layer(b);
    let k = || with_header(request("/"), "x-api-key", "k");
    assert_eq!(statuses(&app, k, 3).await, [200, 200, 429]);
}

/// Policy names that are prefixes of each other ("api", "api-admin") never share a key: the
/// name ends before the client's key, so "api" with the key "-adminvictim" is not "api-admin"
/// with "victim". (A mutation dropping the name's end survived every test of this crate.)
#[tokio::test]
async fn policy_names_that_prefix_each_other_never_share_state() {
    let (_clock, store) = store();
    let key = || ApiKeyHeader::new("x-api-key").unwrap();
    let api = RateLimitLayer::new(
        store.clone(),
        Policy::new("api", two_a_minute()).unwrap().key(key()),
    )
    .unwrap();
    let admin = RateLimitLayer::new(
        store,
        Policy::new("api-admin", two_a_minute()).unwrap().key(key()),
    )
    .unwrap();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }).route_layer(api))
        .route("/admin", get(|| async { "ok" }).route_layer(admin));
    let attacker = || with_header(request("/api"), "x-api-key", "-adminvictim");
    assert_eq!(statuses(&app, attacker, 3).await, [200, 200, 429]);
    let victim = || with_header(request("/admin"), "x-api-key", "victim");
    assert_eq!(statuses(&app, victim, 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn forwarded_from_a_trusted_proxy_groups_ipv6_clients() {
    use tower_ratelimit::ForwardedHeader;
    let (_clock, store) = store();
    let client_ip = ClientIp::behind_proxies(["10.0.0.0/8"])
        .unwrap()
        .header(ForwardedHeader::Forwarded);
    let policy = Policy::new("fwd", two_a_minute())
        .unwrap()
        .key(ClientIpKey::new(client_ip));
    let app = app(store, policy);
    let fwd = |peer: &str, value: &str| with_header(request_from("/", peer), "forwarded", value);
    // Two addresses of one IPv6 /64 behind the proxy are one client.
    let a = || fwd("10.0.0.2:80", "for=6.6.6.6, for=\"[2001:db8:7:7::1]:4711\"");
    let b = || fwd("10.0.0.2:80", "for=\"[2001:db8:7:7::2]\"");
    assert_eq!(statuses(&app, a, 2).await, [200, 200]);
    assert_eq!(statuses(&app, b, 1).await, [429]);
    // The same header sent straight from the internet is not believed.
    let spoof = || fwd("203.0.113.5:80", "for=\"[2001:db8:9:9::1]\"");
    assert_eq!(statuses(&app, spoof, 3).await, [200, 200, 429]);
    let other = || fwd("203.0.113.6:80", "for=\"[2001:db8:9:9::1]\"");
    assert_eq!(statuses(&app, other, 1).await, [200]);
}

#[tokio::test]
async fn peer_ip_reads_axums_mock_connect_info_in_tests() {
    use axum::extract::connect_info::MockConnectInfo;
    use std::net::SocketAddr;
    use tower_ratelimit::key::PeerIp;

    let (_clock, store) = store();
    let policy = || {
        Policy::new("ip", two_a_minute())
            .unwrap()
            .key(PeerIp::new())
    };
    // Requests without `ConnectInfo` (as `oneshot` sends them): the mock's address is the key.
    let bare = || http::Request::get("/").body(Body::empty()).unwrap();
    let mocked = |peer: &str| {
        let peer: SocketAddr = peer.parse().unwrap();
        app(store.clone(), policy()).layer(MockConnectInfo(peer))
    };
    let seven = mocked("192.0.2.7:5555");
    assert_eq!(statuses(&seven, bare, 3).await, [200, 200, 429]);
    // Another mocked peer has a bucket of its own (the same store and policy name).
    let eight = mocked("192.0.2.8:5555");
    assert_eq!(statuses(&eight, bare, 3).await, [200, 200, 429]);
    // The same peer's port does not matter.
    assert_eq!(statuses(&mocked("192.0.2.7:1"), bare, 1).await, [429]);
    // Without the mock, no address: the missing-key answer.
    assert_eq!(statuses(&app(store, policy()), bare, 1).await, [400]);
}
