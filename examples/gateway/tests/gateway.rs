//! The gateway's router, driven with `oneshot` from the example configuration files; bad
//! configurations; and the Redis configuration against a real redis-server.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Response, StatusCode};
use common::{frozen_app, request, send, status};
use example_gateway::{Config, app};
use http_body_util::BodyExt;
use ratelimit_core::ManualClock;
use std::time::Duration;
use tower::ServiceExt;

const MEMORY: &str = include_str!("../gateway.toml");
const REDIS: &str = include_str!("../gateway-redis.toml");

/// `gateway-redis.toml` with a store timeout long enough for a loaded test machine (the file's
/// 50 ms suits a server, not a CI run that starts a cluster beside these checks): the tests
/// assert exact sequences of 200s and 429s, which a timed-out check would turn into the
/// failure policy's answer.
fn redis_text() -> String {
    assert!(REDIS.contains("timeout_ms = 50\n"));
    REDIS.replace("timeout_ms = 50\n", "timeout_ms = 2000\n")
}

async fn body(res: Response<Body>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// The gateway of `gateway.toml`, on a clock the test moves.
async fn memory_app() -> (Router, ManualClock) {
    frozen_app(&Config::from_toml(MEMORY).unwrap()).await
}

#[tokio::test]
async fn login_allows_5_a_minute_per_ip_then_answers_problem_json() {
    let (app, clock) = memory_app().await;
    // A method the endpoint does not serve gets axum's 405, and is not counted: the policy
    // applies to `POST /login` only.
    for _ in 0..10 {
        assert_eq!(
            status(&app, "GET", "/login", "192.0.2.1:5000", None).await,
            405
        );
    }
    for _ in 0..5 {
        assert_eq!(
            status(&app, "POST", "/login", "192.0.2.1:5000", None).await,
            200
        );
    }
    let res = send(&app, request("POST", "/login", "192.0.2.1:5001", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    // GCRA, 5 a minute: one every 12 s.
    assert_eq!(h["retry-after"], "12");
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(
        h["ratelimit-policy"],
        "\"login.0\";q=5;w=60, \"login.1\";q=20;w=3600"
    );
    assert!(
        body(res)
            .await
            .contains("\"violated-policies\":[\"login.0\"]")
    );
    // Another address is counted apart; the API is not affected.
    assert_eq!(
        status(&app, "POST", "/login", "192.0.2.2:5000", None).await,
        200
    );
    assert_eq!(
        status(&app, "GET", "/api/items", "192.0.2.1:5000", Some("k1")).await,
        200
    );
    // The wait said is the wait: a microsecond short of it, still denied (the last second
    // rounded up); at it, allowed once, and then denied for another 12 s.
    clock.advance(Duration::from_secs(12) - Duration::from_micros(1));
    let res = send(&app, request("POST", "/login", "192.0.2.1:5000", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1");
    clock.advance(Duration::from_micros(1));
    for expected in [200, 429] {
        assert_eq!(
            status(&app, "POST", "/login", "192.0.2.1:5000", None).await,
            expected
        );
    }
}

/// An endpoint under two enforced routes (`/login`, and `/` per IP) gets the IETF items of both
/// (the route listed last, the innermost, adds its items first): the allowed logins say what is
/// left of the strict limit that binds, not only of the loose one.
#[tokio::test]
async fn an_endpoint_under_two_routes_says_both_policies() {
    assert!(MEMORY.contains("dry_run = true\n"));
    let enforced = MEMORY.replace("dry_run = true\n", "dry_run = false\n");
    let (app, _clock) = frozen_app(&Config::from_toml(&enforced).unwrap()).await;
    let lines = |res: &Response<Body>, name: &str| -> Vec<String> {
        res.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    for left in (0..5).rev() {
        let res = send(&app, request("POST", "/login", "192.0.2.9:5000", None)).await;
        assert_eq!(res.status(), StatusCode::OK);
        let items = lines(&res, "ratelimit");
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].starts_with("\"per-ip\";r="), "{items:?}");
        assert!(
            items[1].starts_with(&format!("\"login.0\";r={left};")),
            "{items:?}"
        );
        let policies = lines(&res, "ratelimit-policy");
        assert_eq!(policies.len(), 2, "{policies:?}");
        assert!(policies[0].starts_with("\"per-ip\";q=300;"), "{policies:?}");
        assert!(policies[1].starts_with("\"login.0\";q=5;"), "{policies:?}");
    }
    // The 429 is login's, the route checked first: the per-IP route never saw the request.
    let res = send(&app, request("POST", "/login", "192.0.2.9:5000", None)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let items = lines(&res, "ratelimit");
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(items[0].starts_with("\"login.0\";r=0;t=12"), "{items:?}");
}

#[tokio::test]
async fn api_is_per_key_with_tiers_and_writes_cost_5() {
    let (app, clock) = memory_app().await;
    let peer = "198.51.100.1:4000";
    // No key: 401 with its challenge, not counted against anyone.
    let res = send(&app, request("GET", "/api/items", peer, None)).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        res.headers()["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );

    // A free key: bursts of 20.
    for left in (0..20).rev() {
        let res = send(&app, request("GET", "/api/items", peer, Some("free-1"))).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            res.headers()["x-ratelimit-remaining"],
            left.to_string().as_str()
        );
    }
    let res = send(&app, request("GET", "/api/items/7", peer, Some("free-1"))).await;
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "1");

    // Another free key: 4 writes of 5 use the burst of 20.
    for _ in 0..4 {
        assert_eq!(
            status(&app, "POST", "/api/items", peer, Some("free-2")).await,
            201
        );
    }
    assert_eq!(
        status(&app, "POST", "/api/items", peer, Some("free-2")).await,
        429
    );

    // The pro key: bursts of 100, refilled at 10 a second. A 10 a second refill 1 s later.
    let pro = |expected: u16| {
        let app = app.clone();
        async move {
            let res = send(
                &app,
                request("GET", "/api/items", peer, Some("demo-pro-key")),
            )
            .await;
            assert_eq!(res.status(), expected);
            res
        }
    };
    for _ in 0..100 {
        pro(200).await;
    }
    pro(429).await;
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        pro(200).await;
    }
    let denied = pro(429).await;
    assert_eq!(
        denied.headers()["ratelimit-policy"],
        "\"api.0\";q=600;w=60, \"api.1\";q=100000;w=86400"
    );

    // Health is never limited: no headers.
    let res = send(&app, request("GET", "/health", peer, None)).await;
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("ratelimit").is_none());
}

/// A HEAD request runs the GET handler, so it costs what a GET does unless it has a cost of its
/// own: a client cannot get ten times the GET handler's runs by sending HEAD.
#[tokio::test]
async fn head_costs_what_get_does() {
    let text = |costs: &str| {
        format!(
            "[[routes]]\npath = \"/api\"\ncost_by_method = {costs}\n\
             key = {{ source = \"header\", name = \"x-api-key\" }}\n\
             [routes.policy]\nname = \"api\"\nquotas = [{{ limit = 30, per = \"hour\" }}]\n"
        )
    };
    let get_only = app(&Config::from_toml(&text("{ GET = 10 }")).unwrap())
        .await
        .unwrap();
    let peer = "198.51.100.9:4000";
    let sent = |method| status(&get_only, method, "/api/items", peer, Some("k"));
    assert_eq!(sent("HEAD").await, 200);
    assert_eq!(sent("GET").await, 200);
    assert_eq!(sent("HEAD").await, 200);
    assert_eq!(sent("HEAD").await, 429, "30 spent by three checks of 10");
    // HEAD given its own cost keeps it.
    let own = app(&Config::from_toml(&text("{ GET = 10, HEAD = 1 }")).unwrap())
        .await
        .unwrap();
    for _ in 0..30 {
        assert_eq!(
            status(&own, "HEAD", "/api/items", peer, Some("k")).await,
            200
        );
    }
    assert_eq!(
        status(&own, "HEAD", "/api/items", peer, Some("k")).await,
        429
    );
}

/// `/health` and `/metrics` are never limited, even by a route covering every endpoint: a load
/// balancer's health check answered 429 (or 503 while the store is down) would take the gateway
/// out of service.
#[tokio::test]
async fn health_and_metrics_are_never_limited() {
    let config = Config::from_toml(
        "[[routes]]\npath = \"/\"\n[routes.policy]\nname = \"all\"\n\
         quotas = [{ limit = 1, per = \"minute\" }]\nfailure = { mode = \"closed\", retry_after_secs = 5 }\n",
    )
    .unwrap();
    let app = app(&config).await.unwrap();
    let peer = "192.0.2.60:1";
    assert_eq!(status(&app, "GET", "/api/items", peer, None).await, 200);
    assert_eq!(status(&app, "GET", "/api/items", peer, None).await, 429);
    for _ in 0..3 {
        let res = send(&app, request("GET", "/health", peer, None)).await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
        assert_eq!(status(&app, "GET", "/metrics", peer, None).await, 200);
    }
}

#[tokio::test]
async fn metrics_endpoint_renders_the_decisions() {
    let (app, _clock) = memory_app().await;
    for _ in 0..7 {
        send(&app, request("POST", "/login", "203.0.113.50:1", None)).await;
    }
    // The API route has tiers: its decisions are counted by tier too.
    let peer = "203.0.113.51:1";
    let pro = Some("demo-pro-key");
    assert_eq!(status(&app, "GET", "/api/items", peer, pro).await, 200);
    let free = Some("metrics-test-free-key");
    assert_eq!(status(&app, "GET", "/api/items", peer, free).await, 200);
    let res = send(&app, request("GET", "/metrics", "203.0.113.50:1", None)).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/plain; version=0.0.4");
    let text = body(res).await;
    // Other tests in this binary count too: the numbers are at least this test's.
    let value = |line: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(value("ratelimit_decisions_total{policy=\"login\",outcome=\"denied\"}") >= 2);
    assert!(value("ratelimit_decisions_total{policy=\"login\",outcome=\"allowed\"}") >= 5);
    // The login route has no tiers, hence no `tier` label; the API route's own limit is `""`.
    assert!(
        value("ratelimit_decisions_total{policy=\"api\",outcome=\"allowed\",tier=\"pro\"}") >= 1
    );
    assert!(value("ratelimit_decisions_total{policy=\"api\",outcome=\"allowed\",tier=\"\"}") >= 1);
    assert!(text.contains("# TYPE ratelimit_decisions_total counter"));
}

/// The store latency is a histogram with buckets (summed across gateways, and not falling to 0
/// while a route is idle, as the recorder's default summary's quantiles do).
#[tokio::test]
async fn store_latency_is_a_histogram() {
    let (app, _clock) = memory_app().await;
    // The in-memory store's answers are timed about one in 64.
    for i in 0..2_000u32 {
        let peer = format!("198.51.{}.{}:1", i / 250, i % 250);
        send(&app, request("GET", "/api/items", &peer, Some("demo-free"))).await;
    }
    let res = send(&app, request("GET", "/metrics", "203.0.113.50:1", None)).await;
    let text = body(res).await;
    assert!(
        text.contains("# TYPE ratelimit_store_duration_seconds histogram"),
        "{text}"
    );
    for le in example_gateway::STORE_DURATION_BUCKETS {
        let bucket =
            format!("ratelimit_store_duration_seconds_bucket{{policy=\"api\",le=\"{le}\"}}");
        assert!(text.contains(&bucket), "no {bucket} in\n{text}");
    }
    assert!(
        !text.contains("ratelimit_store_duration_seconds{"),
        "no summary quantiles"
    );
}

#[test]
fn both_example_files_have_the_same_routes_and_keys() {
    let memory = Config::from_toml(MEMORY).unwrap();
    let redis = Config::from_toml(REDIS).unwrap();
    assert_eq!(
        format!("{:?}", memory.routes),
        format!("{:?}", redis.routes)
    );
    assert_eq!(memory.api_keys, redis.api_keys);
    assert_eq!(redis.store.url.as_deref(), Some("redis://127.0.0.1:6379"));
}

/// A configuration with one route whose policy table is `policy`.
fn with_policy(policy: &str) -> String {
    format!(
        "[[routes]]\npath = \"/api\"\nkey = {{ source = \"header\", name = \"x-api-key\" }}\n\
         [routes.policy]\nname = \"api\"\n{policy}\n"
    )
}

#[tokio::test]
async fn bad_configurations_fail_naming_the_field() {
    let cases: Vec<(String, &str)> = vec![
        (
            with_policy("quotas = [{ limit = 5, per = \"minutes\" }]"),
            "routes[0].policy.quotas[0].per: ",
        ),
        (
            with_policy("quotas = [{ limit = 0, per = \"minute\" }]"),
            "routes[0].policy.quotas[0].limit: a quota must allow at least one request",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\", period_ms = 10 }]"),
            "routes[0].policy.quotas[0]: give `per` or `period_ms`, not both",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\", brust = 10 }]"),
            "routes[0].policy.quotas[0].brust: ",
        ),
        (
            with_policy("algorithm = \"leaky\"\nquotas = [{ limit = 5, per = \"minute\" }]"),
            "routes[0].policy.algorithm: ",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"fallback\", gateways = 0 }",
            ),
            "routes[0].policy.failure.gateways: must be at least 1",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]\nmissing_key = { reject = 200 }"),
            "routes[0].policy.missing_key.reject: 200 is not an error status",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]\nmissing_key = { reject = 401 }"),
            "routes[0].policy.missing_key.reject: a 401 must carry a WWW-Authenticate challenge",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]\nmissing_key = { unauthorized = \"\" }"),
            "routes[0].policy.missing_key.unauthorized: ",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[[routes.policy.tiers]]\nname = \"pro\"\nquotas = []\n",
            "routes[0].policy.tiers[0].quotas: at least one quota is needed",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[api_keys]\n\"k\" = \"gold\"\n",
            "api_keys.\"…\": names a tier that no route defines (the tiers are: none)",
        ),
        // A key is a secret: only its first characters are shown.
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[api_keys]\n\"sk_live_0123456789\" = \"gold\"\n",
            "api_keys.\"sk_l…\": names a tier that no route defines (the tiers are: none)",
        ),
        // A table written the wrong way round: the secret, in the tier's place, is not echoed.
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[[routes.policy.tiers]]\nname = \"pro\"\nquotas = [{ limit = 50, per = \"minute\" }]\n\
                   [api_keys]\n\"pro\" = \"sk_live_0123456789\"\n",
            "api_keys.\"p…\": names a tier that no route defines (the tiers are: \"pro\")",
        ),
        // A key a header could never carry.
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[api_keys]\n\"sk_live_0123 \" = \"gold\"\n",
            "api_keys.\"sk_l…\": an API key cannot start or end with whitespace",
        ),
        // A cost no quota can hold would deny every such request, for good.
        (
            "[[routes]]\npath = \"/api\"\ncost = 6\n[routes.policy]\nname = \"a\"\n\
             quotas = [{ limit = 5, per = \"minute\" }]\n"
                .to_owned(),
            "routes[0].cost: 6 is more than the limit can ever admit at once (5)",
        ),
        // A key's value of the wrong type: the key is not shown whole either.
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[api_keys]\n\"sk_live_0123456789\" = 5\n",
            "api_keys.\"sk_l…\": ",
        ),
        (
            with_policy("algorithm = \"fixed_window\"\nquotas = [{ limit = 5, per = \"minute\", burst = 10 }]"),
            "routes[0].policy.quotas[0].burst: only the token bucket and GCRA have a burst",
        ),
        (
            "[store]\nkind = \"redis\"\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.url: required when kind is \"redis\"",
        ),
        (
            "[store]\nkind = \"redis\"\nurls = [\"redis://127.0.0.1:7000\"]\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.urls: only used when kind is \"redis_cluster\"; give one `url`",
        ),
        (
            "[store]\nkind = \"memcached\"\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.kind: ",
        ),
        (
            "[[routes]]\npath = \"/admin\"\n[routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].path: \"/admin\" covers none of the gateway's endpoints",
        ),
        (
            "[[routes]]\npath = \"/login\"\nkey = { source = \"ip\", trusted_proxies = [\"10.0.0.0/33\"] }\n\
             [routes.policy]\nname = \"login\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.trusted_proxies: invalid trusted proxy \"10.0.0.0/33\"",
        ),
        (
            "[[routes]]\npath = \"/login\"\nkey = { source = \"ip\", trusted_proxies = [\"10.0.0.10/8\"] }\n\
             [routes.policy]\nname = \"login\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.trusted_proxies: trusted proxy \"10.0.0.10/8\" has address bits set past \
             its prefix: write 10.0.0.0/8 for the whole block, or the address alone for one proxy",
        ),
        (
            "[[routes]]\npath = \"/login\"\n[routes.policy]\nname = \"login\"\n\
             quotas = [{ limit = 1, per = \"second\" }]\n[[routes.policy.tiers]]\nname = \"pro\"\n\
             quotas = [{ limit = 9, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.source: must be \"header\" for a route with tiers",
        ),
        // A metrics label: a Prometheus exporter would write `a"b` and `a\"b` as one series.
        (
            "[[routes]]\npath = \"/login\"\n[routes.policy]\nname = 'a\\\"b'\n\
             quotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].policy.name: \"a\\\\\\\"b\" must be 1 to 64 printable ASCII characters, \
             neither '\"' nor '\\' (the name is a metrics label)",
        ),
        (
            "[[routes]]\npath = \"/\"\nkey = { source = \"header\", name = \"x-api-key\" }\n\
             [routes.policy]\nname = \"api\"\nquotas = [{ limit = 5, per = \"minute\" }]\n\
             [[routes.policy.tiers]]\nname = 'p\"ro'\nquotas = [{ limit = 50, per = \"minute\" }]\n"
                .to_owned(),
            "routes[0].policy.tiers[0].name: a tier's name holds `\"` or `\\`",
        ),
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]")
                + "[[routes]]\npath = \"/login\"\n[routes.policy]\nname = \"api\"\nquotas = [{ limit = 1, per = \"second\" }]\n",
            "routes[1].policy.name: the name \"api\" is already used by routes[0]",
        ),
        // `login.0` is the first item of `login`'s two quotas: a request under both routes
        // would carry one `"login.0"` item, and the client could not tell which quota it is.
        (
            "[[routes]]\npath = \"/login\"\n[routes.policy]\nname = \"login\"\n\
             quotas = [{ limit = 5, per = \"minute\" }, { limit = 20, per = \"hour\" }]\n\
             [[routes]]\npath = \"/\"\n[routes.policy]\nname = \"login.0\"\n\
             quotas = [{ limit = 300, per = \"minute\" }]\n"
                .to_owned(),
            "routes[1].policy.name: the name \"login.0\" and routes[0]'s \"login\" both name an item \"login.0\"",
        ),
        // The same under a tier of several quotas.
        (
            "[[routes]]\npath = \"/\"\nkey = { source = \"header\", name = \"x-api-key\" }\n\
             [routes.policy]\nname = \"api\"\nquotas = [{ limit = 5, per = \"minute\" }]\n\
             [[routes.policy.tiers]]\nname = \"pro\"\n\
             quotas = [{ limit = 50, per = \"minute\" }, { limit = 500, per = \"hour\" }]\n\
             [[routes]]\npath = \"/login\"\n[routes.policy]\nname = \"api.1\"\n\
             quotas = [{ limit = 3, per = \"minute\" }]\n"
                .to_owned(),
            "routes[1].policy.name: the name \"api.1\" and routes[0]'s \"api\" both name an item \"api.1\"",
        ),
        (
            "[[routes]]\npath = \"/api\"\ncost_by_method = { post = 5 }\n[routes.policy]\nname = \"a\"\n\
             quotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].cost_by_method.post: expected an HTTP method in capitals",
        ),
        // A store setting the chosen kind never reads is refused, not ignored.
        (
            "[store]\npool_size = 4\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.pool_size: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nprefix = \"gw\"\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.prefix: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nexpiry_slack_ms = 5000\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.expiry_slack_ms: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nping_after_idle_ms = 5000\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.ping_after_idle_ms: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nexpiry_slack_ms = 86400001\n"
                .to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.expiry_slack_ms: must be at most 86400000 (one day)",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nmax_keys = 10\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.max_keys: only used when kind is \"memory\"",
        ),
        // A stray setting next to a mode without settings is refused, not ignored.
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"open\", retry_after_secs = 5 }",
            ),
            "routes[0].policy.failure: unknown field `retry_after_secs`",
        ),
        (
            "[[routes]]\npath = \"/api\"\nkey = { source = \"global\", name = \"x-api-key\" }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key: unknown field `name`",
        ),
        // A setting of another source or mode: the message names it whole and says what the
        // table takes (the names it lists once cut the setting's name short, as a secret's).
        (
            "[[routes]]\npath = \"/api\"\nkey = { source = \"ip\", name = \"x\" }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key: unknown field `name`: source \"ip\" takes `trusted_proxies`, \
             `forwarded_header`, `ipv6_prefix` (line 3",
        ),
        (
            "[[routes]]\npath = \"/api\"\nkey = { source = \"header\", name = \"x-api-key\", ipv6_prefix = 48 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key: unknown field `ipv6_prefix`: source \"header\" takes `name` (line 3",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"closed\", gateways = 4 }",
            ),
            "routes[0].policy.failure: unknown field `gateways`: mode \"closed\" takes \
             `retry_after_secs` only (line",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"fallback\", retry_after_secs = 4 }",
            ),
            "routes[0].policy.failure: unknown field `retry_after_secs`: mode \"fallback\" \
             takes `gateways` only (line",
        ),
        (
            "[[routes]]\npath = \"/login\"\nkey = { source = \"ip\", trusted_proxies = [\"0.0.0.0/0\"] }\n\
             [routes.policy]\nname = \"login\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.trusted_proxies: \"0.0.0.0/0\" trusts every address",
        ),
        (
            "[[routes]]\npath = \"/api\"\ncost = 0\n[routes.policy]\nname = \"a\"\n\
             quotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].cost: must be at least 1",
        ),
        (
            "[[routes]]\npath = \"/api\"\ncost_by_method = { GET = 0, POST = 5 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].cost_by_method.GET: must be at least 1",
        ),
        // The forwarding header is read only from trusted proxies: without any, the setting
        // would do nothing.
        (
            "[[routes]]\npath = \"/login\"\nkey = { source = \"ip\", forwarded_header = \"forwarded\" }\n\
             [routes.policy]\nname = \"login\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.forwarded_header: is read only from trusted proxies",
        ),
        (
            "[store]\ncircuit_breaker = { cool_down_ms = 9223372036854775807 }\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.circuit_breaker.cool_down_ms: must be between 1 and 3600000",
        ),
        (
            "[store]\ncoalesce = true\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.coalesce: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\ndenial_cache = true\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.denial_cache: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nwatch_resets = true\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.watch_resets: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nwatch_resets = true\n"
                .to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.watch_resets: needs denial_cache = true",
        ),
        (
            "[store]\ncircuit_breaker = { failures = 2000000 }\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.circuit_breaker.failures: must be from 1 to 1000000",
        ),
        // With the breaker off too: a value a later `enabled = true` would take up.
        (
            "[store]\ncircuit_breaker = { enabled = false, failures = 0 }\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.circuit_breaker.failures: must be from 1 to 1000000",
        ),
        (
            "[store]\ncircuit_breaker = { enabled = false, cool_down_ms = 0 }\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.circuit_breaker.cool_down_ms: must be between 1 and 3600000",
        ),
        (
            "[store]\ntimeout_ms = 86400000\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.timeout_ms: must be between 1 and 3600000",
        ),
        // A rate a bucket cannot count exactly (52,127 a day, prime to a day's microseconds),
        // named by its burst where one was given (a smaller one fits).
        (
            with_policy("quotas = [{ limit = 52127, per = \"day\" }]"),
            "routes[0].policy.quotas[0]: the quota 52127 per 86400000000 µs (burst 52127) is too large for the token_bucket algorithm",
        ),
        // A sliding log's bound is on its limit.
        (
            with_policy("algorithm = \"sliding_log\"\nquotas = [{ limit = 200000, per = \"minute\" }]"),
            "routes[0].policy.quotas[0].limit: the quota 200000 per 60000000 µs is too large for the sliding_log algorithm",
        ),
        (
            with_policy("quotas = [{ limit = 7, per = \"day\", burst = 1000000 }]"),
            "routes[0].policy.quotas[0].burst: the quota 7 per",
        ),
        (
            with_policy("quotas = [{ limit = 5000000000000000, per = \"day\" }]"),
            "routes[0].policy.quotas[0].limit: a quota's limit must be at most 2^52",
        ),
        ("listen = \"localhost\"\nroutes = []\n".to_owned(), "listen: "),
        ("routes = []\n".to_owned(), "routes: at least one route is needed"),
        // A wrong value inside the key or failure table is named at its own field, not at the
        // table (as an internally tagged enum would have it); a setting missing for the chosen
        // source or mode names the table and the setting.
        (
            "[[routes]]\npath = \"/api\"\nkey = { source = \"ip\", ipv6_prefix = 300 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key.ipv6_prefix: invalid value: integer `300`, expected u8",
        ),
        (
            "[[routes]]\npath = \"/api\"\nkey = { source = \"header\" }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 1, per = \"second\" }]\n"
                .to_owned(),
            "routes[0].key: missing field `name` (source \"header\")",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"closed\", retry_after_secs = \"5\" }",
            ),
            "routes[0].policy.failure.retry_after_secs: invalid type: string \"5\", expected u64",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"closed\", retry_after_secs = 0 }",
            ),
            "routes[0].policy.failure.retry_after_secs: must be",
        ),
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\nfailure = { mode = \"fallback\" }",
            ),
            "routes[0].policy.failure: missing field `gateways` (mode \"fallback\")",
        ),
        // A date or time where a table belongs: toml passes it as a table of a private key,
        // which is not named back as an unknown field the file never wrote.
        (
            with_policy("quotas = [{ limit = 5, per = \"minute\" }]\nfailure = 1979-05-27"),
            "routes[0].policy.failure: invalid type: a date or time, expected a table of one of \
             `mode`",
        ),
        (
            with_policy("quotas = [1979-05-27T07:32:00Z]"),
            "routes[0].policy.quotas[0]: invalid type: a date or time, expected a table of one of \
             `limit`",
        ),
        (
            "[store]\ncircuit_breaker = 07:32:00\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "store.circuit_breaker: invalid type: a date or time, expected a table of",
        ),
        (
            "admin = 1979-05-27\n".to_owned()
                + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]"),
            "admin: invalid type: a date or time, expected a table of",
        ),
    ];
    for (text, expected) in cases {
        let err = Config::from_toml(&text).expect_err(&text).to_string();
        assert!(
            err.starts_with(expected),
            "expected `{expected}...`, got:\n{err}\nfor:\n{text}"
        );
    }
    // A string where an array or a table belongs, under `store` or `api_keys`, may be a
    // password or a key: the error names the field and the type, not the value.
    let policy = with_policy("quotas = [{ limit = 5, per = \"minute\" }]");
    for (text, expected) in [
        (
            format!(
                "[store]\nkind = \"redis_cluster\"\nurls = \"redis://:s3cret@10.0.0.5:7000\"\n{policy}"
            ),
            "store.urls: invalid type: a string, expected a sequence (line 3",
        ),
        (
            format!("api_keys = \"sk_live_s3cret\\\" more\"\n{policy}"),
            "api_keys: invalid type: a string, expected a map (line 1",
        ),
        // A key pasted as the missing key's status (where the shared key was meant).
        (
            with_policy(
                "quotas = [{ limit = 5, per = \"minute\" }]\n\
                 missing_key = { reject = \"sk_live_s3cret\" }",
            ),
            "routes[0].policy.missing_key.reject: invalid type: a string, expected u16 (line 7",
        ),
        // A key pasted after the last table belongs to that table: an unknown field, named by
        // its first characters only (a misspelt field is named whole, above).
        (
            format!("{policy}\"sk_live_s3cret0123456789\" = \"gold\"\n"),
            "routes[0].policy: unknown field `sk_l…`, expected one of ",
        ),
        // A name holding what the message goes on with (`` `, `` or `` `: ``) is still the whole
        // name: no part of it shown as the message's rest.
        // Below a `[routes.cost_by_method]` table, or in it inline: named as a method only if
        // it could be one.
        (
            format!("{policy}[routes.cost_by_method]\n\"sk_live_s3cret0123456789\" = \"gold\"\n"),
            "routes[0].cost_by_method.\"sk_l…\": invalid type: ",
        ),
        (
            format!("{policy}[routes.cost_by_method]\n\"sk_live_s3cret0123456789\" = 1\n"),
            "routes[0].cost_by_method.\"sk_l…\": expected an HTTP method in capitals",
        ),
        (
            format!(
                "{policy}[routes.cost_by_method]\nSKLIVEABCDEFGHIJKLMNOPQRSTUVWXYZSECRET = 0\n"
            ),
            "routes[0].cost_by_method.\"SKLI…\": must be at least 1",
        ),
        (
            format!("{policy}[routes.cost_by_method]\nPost = 1\n"),
            "routes[0].cost_by_method.\"Po…\": expected an HTTP method in capitals",
        ),
        (
            format!("{policy}[routes.cost_by_method]\npost = 1\n"),
            "routes[0].cost_by_method.post: expected an HTTP method in capitals",
        ),
        // Above the first table: the file's top level, which the message names by nothing.
        (
            format!("\"sk_live_s3cret0123456789\" = \"gold\"\n{policy}"),
            "unknown field `sk_l…`, expected one of ",
        ),
        (
            format!("\"Pw9`, expected s3cret\" = 1\n{policy}"),
            "unknown field `Pw9`…`, expected one of ",
        ),
        (
            format!("{policy}\"pw`, s3cret\" = 1\n"),
            "routes[0].policy: unknown field `pw`,…`, expected one of ",
        ),
        (
            format!("{policy}\"pw`: s3cret\" = 1\n"),
            "routes[0].policy: unknown field `pw`:…`, expected one of ",
        ),
        (
            format!("[store]\nkind = \"redis://:s3cret@10.0.0.5:6379\"\n{policy}"),
            "store.kind: unknown variant `redi…`, expected one of ",
        ),
        // A known name in another case (or with `-` for `_`) is no secret: shown whole, with
        // the name meant.
        (
            with_policy("quotas = [{ limit = 5, per = \"Minute\" }]"),
            "routes[0].policy.quotas[0].per: unknown variant `Minute`, expected one of `second`, \
             `minute`, `hour`, `day`: names are lowercase, with `_` between words; did you mean \
             `minute`? (line 6",
        ),
        (
            format!(
                "[store]\nkind = \"Redis-Cluster\"\nurls = [\"redis://127.0.0.1:1\"]\n{policy}"
            ),
            "store.kind: unknown variant `Redis-Cluster`, expected one of `memory`, `redis`, \
             `redis_cluster`: names are lowercase, with `_` between words; did you mean \
             `redis_cluster`? (line 2",
        ),
        // A key listed twice: toml's error does not name it.
        (
            format!(
                "{policy}[api_keys]\n\"sk_live_s3cret0123\" = \"gold\"\n\"sk_live_s3cret0123\" = \"gold\"\n"
            ),
            "duplicate key (line 9",
        ),
    ] {
        let err = Config::from_toml(&text).expect_err(&text).to_string();
        assert!(
            err.starts_with(expected),
            "expected `{expected}...`, got:\n{err}\nfor:\n{text}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
    // A cost over each gateway's fallback share (writes refused while Redis is down) may be
    // meant: loaded, with a warning that names it.
    let routes = "[[routes]]\npath = \"/api\"\ncost_by_method = { POST = 5 }\n[routes.policy]\n\
                  name = \"a\"\nquotas = [{ limit = 600, per = \"minute\", burst = 20 }]\n\
                  failure = { mode = \"fallback\", gateways = 5 }\n";
    // With the memory store, which is never down, there is nothing to warn of.
    assert!(Config::from_toml(routes).unwrap().warnings().is_empty());
    let config = Config::from_toml(&format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{routes}"
    ))
    .unwrap();
    assert_eq!(
        config.warnings(),
        [
            "routes[0].cost_by_method.POST: 5 is more than each gateway's fallback share of the \
          limit can admit at once (4): while the store is down, every such request is denied \
          (429, with Retry-After saying when the store is asked again)"
        ]
    );
    assert!(Config::from_toml(MEMORY).unwrap().warnings().is_empty());
    // Costs that never apply are loaded and warned of: not refused for being more than the
    // limit admits, which no request would be. (The last two were refused, as if every such
    // request would be denied.)
    for (toml, warning) in [
        // A cost for a method that no endpoint under the route serves.
        (
            "[[routes]]\npath = \"/api\"\ncost_by_method = { POST = 5, DELETE = 10 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 600, per = \"minute\" }]\n",
            "routes[0].cost_by_method.DELETE: no endpoint under \"/api\" serves DELETE (it is \
             answered 405, never counted): this cost never applies",
        ),
        // A `cost` that no method served under the route pays (each has its own; HEAD pays
        // GET's).
        (
            "[[routes]]\npath = \"/api/items/{id}\"\ncost = 10\ncost_by_method = { GET = 1 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 5, per = \"minute\" }]\n",
            "routes[0].cost: every method served under \"/api/items/{id}\" has a cost of its own \
             in cost_by_method (HEAD pays GET's): this cost never applies",
        ),
        // A cost above the limit for a method no endpoint under the route serves (answered
        // 405, never counted).
        (
            "[[routes]]\npath = \"/login\"\ncost_by_method = { GET = 10 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 5, per = \"minute\" }]\n",
            "routes[0].cost_by_method.GET: no endpoint under \"/login\" serves GET (it is \
             answered 405, never counted): this cost never applies",
        ),
        // A method whose name holds a `-` (a token character, as in `M-SEARCH`) is a method.
        (
            "[[routes]]\npath = \"/api\"\ncost_by_method = { M-SEARCH = 3 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 600, per = \"minute\" }]\n",
            "routes[0].cost_by_method.M-SEARCH: no endpoint under \"/api\" serves M-SEARCH (it is \
             answered 405, never counted): this cost never applies",
        ),
        // A key that passes as a method but could be an API key pasted there (capitals, too
        // long for a method's name) is named by its first characters.
        (
            "[[routes]]\npath = \"/api\"\ncost_by_method = { SKLIVEABCDEFGHIJKLMNOPQRSTUVWXYZSECRET = 1 }\n\
             [routes.policy]\nname = \"a\"\nquotas = [{ limit = 600, per = \"minute\" }]\n",
            "routes[0].cost_by_method.\"SKLI…\": no endpoint under \"/api\" serves \"SKLI…\" (it is \
             answered 405, never counted): this cost never applies",
        ),
    ] {
        assert_eq!(
            Config::from_toml(toml).unwrap().warnings(),
            [warning],
            "{toml}"
        );
    }
    // Where a method pays it (POST under /api/items), the same cost is refused as before.
    let err = Config::from_toml(
        "[[routes]]\npath = \"/api/items\"\ncost = 10\ncost_by_method = { GET = 1 }\n\
         [routes.policy]\nname = \"a\"\nquotas = [{ limit = 5, per = \"minute\" }]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("routes[0].cost: 10 is more than the limit"),
        "{err}"
    );
    // Two routes of one path both apply to its endpoints (stacked, the first listed checked
    // first): loaded, since it may be meant (a per-address limit and a per-key one), with a
    // warning, since a second entry is more often a copy meant to replace the first.
    let config = Config::from_toml(
        "[[routes]]\npath = \"/api\"\n[routes.policy]\nname = \"a\"\n\
         quotas = [{ limit = 600, per = \"minute\" }]\n\
         [[routes]]\npath = \"/login\"\n[routes.policy]\nname = \"b\"\n\
         quotas = [{ limit = 5, per = \"minute\" }]\n\
         [[routes]]\npath = \"/api\"\n[routes.policy]\nname = \"c\"\n\
         quotas = [{ limit = 60, per = \"minute\" }]\n",
    )
    .unwrap();
    assert_eq!(
        config.warnings(),
        [
            "routes[2].path: \"/api\" is routes[0]'s path too: each request there goes through \
             both routes' limits, routes[0]'s first (a second route does not replace the first)"
        ]
    );
    // A trailing slash covers the same endpoints (`covers` trims it): warned of alike.
    let config = Config::from_toml(
        "[[routes]]\npath = \"/api\"\n[routes.policy]\nname = \"a\"\n\
         quotas = [{ limit = 600, per = \"minute\" }]\n\
         [[routes]]\npath = \"/api/\"\n[routes.policy]\nname = \"c\"\n\
         quotas = [{ limit = 60, per = \"minute\" }]\n",
    )
    .unwrap();
    assert_eq!(
        config.warnings(),
        [
            "routes[1].path: \"/api/\" is routes[0]'s path too: each request there goes through \
             both routes' limits, routes[0]'s first (a second route does not replace the first)"
        ]
    );
    // "both" forwarding headers let a client behind a proxy that writes only X-Forwarded-For
    // pick its key with a Forwarded header of its own: loaded (a proxy may write both), with a
    // warning.
    let config = Config::from_toml(
        "[[routes]]\npath = \"/login\"\nkey = { source = \"ip\", trusted_proxies = \
         [\"10.0.0.10/32\"], forwarded_header = \"both\" }\n[routes.policy]\nname = \"a\"\n\
         quotas = [{ limit = 5, per = \"minute\" }]\n",
    )
    .unwrap();
    assert_eq!(config.warnings().len(), 1, "{:?}", config.warnings());
    assert!(
        config.warnings()[0].starts_with("routes[0].key.forwarded_header: \"both\" reads"),
        "{:?}",
        config.warnings()
    );
    // A local share whose plain division would not fit a quota exactly (10,000,000 a day over 3
    // gateways) is rounded down until it does (`Limit::divided`), not refused.
    Config::from_toml(&with_policy(
        "quotas = [{ limit = 10000000, per = \"day\" }]\nfailure = { mode = \"fallback\", gateways = 3 }",
    ))
    .expect("a fallback share that is rounded down to fit");
    // A window algorithm takes it, with no bucket to fit.
    Config::from_toml(&with_policy(
        "algorithm = \"fixed_window\"\nquotas = [{ limit = 52127, per = \"day\" }]\n\
         failure = { mode = \"fallback\", gateways = 2 }",
    ))
    .expect("a fixed window of 52,127 a day");
    // The unknown unit is spelled out with the allowed ones.
    let err = Config::from_toml(&with_policy("quotas = [{ limit = 5, per = \"minutes\" }]"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected one of `second`, `minute`, `hour`, `day`"),
        "{err}"
    );

    // TLS settings: a CA file goes with `rediss://` URLs, of one standalone server, or of a
    // cluster with the `tls-rustls` feature only; without a TLS feature, `rediss://` itself is
    // refused at load, naming the features.
    let tls = cfg!(any(feature = "tls", feature = "tls-rustls"));
    let policy = with_policy("quotas = [{ limit = 5, per = \"minute\" }]");
    let cluster_with_ca = |url: &str| {
        format!(
            "[store]\nkind = \"redis_cluster\"\nurls = [\"{url}\"]\n\
             tls_ca_file = \"ca.pem\"\n{policy}"
        )
    };
    let mut tls_cases = vec![
        (
            format!("[store]\ntls_ca_file = \"ca.pem\"\n{policy}"),
            "store.tls_ca_file: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            format!(
                "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\
                 tls_ca_file = \"ca.pem\"\n{policy}"
            ),
            // In any build: the plain URL is what is wrong, not the build.
            "store.tls_ca_file: only used with a rediss:// url",
        ),
        (
            cluster_with_ca("redis://127.0.0.1:7000"),
            "store.tls_ca_file: only used with rediss:// urls",
        ),
    ];
    if cfg!(feature = "tls-rustls") {
        // The cluster's CA file is taken (it is read when the gateway starts).
        assert!(Config::from_toml(&cluster_with_ca("rediss://127.0.0.1:7000")).is_ok());
    } else {
        tls_cases.push((
            cluster_with_ca("rediss://127.0.0.1:7000"),
            if tls {
                "store.tls_ca_file: only used when kind is \"redis\" with the `tls` feature"
            } else {
                "store.urls: rediss:// (TLS) needs the gateway built with its `tls` feature"
            },
        ));
    }
    // A rediss:// URL that does not parse (its port out of range) is still one: what is wrong
    // is the URL (or the build), not a CA file said to need a rediss:// URL.
    // (Also with what the URL parser leaves out: a space before it, a tab in its scheme.)
    let with_ca = |url: &str| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntls_ca_file = \"ca.pem\"\n{policy}",
            url.escape_debug()
        )
    };
    for url in [
        "rediss://127.0.0.1:99999",
        " rediss://127.0.0.1:99999",
        "redi\tss://127.0.0.1:99999",
    ] {
        let err = Config::from_toml(&with_ca(url))
            .err()
            .map(|e| e.to_string());
        assert!(
            !err.as_deref()
                .is_some_and(|e| e.contains("only used with a rediss:// url")),
            "{url:?}: {err:?}"
        );
    }
    let bad_port = with_ca("rediss://127.0.0.1:99999");
    if !tls {
        tls_cases.push((
            bad_port,
            "store.url: rediss:// (TLS) needs the gateway built with its `tls` feature",
        ));
    }
    // A client certificate comes with its key, and goes where the CA file goes.
    let standalone = "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:6379\"\n";
    tls_cases.extend([
        (
            format!("[store]\ntls_client_cert_file = \"c.pem\"\n{policy}"),
            "store.tls_client_cert_file: only used when kind is \"redis\" or \"redis_cluster\"",
        ),
        (
            format!("{standalone}tls_client_cert_file = \"c.pem\"\n{policy}"),
            if tls {
                "store.tls_client_key_file: is needed with tls_client_cert_file"
            } else {
                "store.url: rediss:// (TLS) needs the gateway built with its `tls` feature"
            },
        ),
        (
            format!("{standalone}tls_client_key_file = \"c.key\"\n{policy}"),
            if tls {
                "store.tls_client_cert_file: is needed with tls_client_key_file"
            } else {
                "store.url: rediss:// (TLS) needs the gateway built with its `tls` feature"
            },
        ),
        (
            format!(
                "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\
                 tls_client_cert_file = \"c.pem\"\ntls_client_key_file = \"c.key\"\n{policy}"
            ),
            "store.tls_client_cert_file: only used with a rediss:// url",
        ),
    ]);
    if !tls {
        tls_cases.push((
            format!("[store]\nkind = \"redis\"\nurl = \"REDISS://127.0.0.1:6379\"\n{policy}"),
            "store.url: rediss:// (TLS) needs the gateway built with its `tls` feature \
             (cargo run -p example-gateway --features tls)",
        ));
    }
    for (text, expected) in tls_cases {
        let err = Config::from_toml(&text).expect_err(&text).to_string();
        assert!(
            err.starts_with(expected),
            "expected `{expected}...`, got:\n{err}\nfor:\n{text}"
        );
    }

    // A store URL that cannot be parsed is named when the store is opened.
    let config = Config::from_toml(
        &("[store]\nkind = \"redis\"\nurl = \"http://nowhere\"\n".to_owned()
            + &with_policy("quotas = [{ limit = 5, per = \"minute\" }]")),
    )
    .unwrap();
    let err = app(&config).await.unwrap_err().to_string();
    assert!(err.starts_with("store.url: "), "{err}");
}

#[tokio::test]
async fn redis_config_shares_limits_between_gateways_and_falls_back_when_redis_dies() {
    let mut server = redis_harness::RedisServer::start();
    let text = redis_text().replace("redis://127.0.0.1:6379", &server.url());
    let config = Config::from_toml(&text).unwrap();
    // Two gateways, each with its own connections, like two processes.
    let a = app(&config).await.unwrap();
    let b = app(&config).await.unwrap();

    // The login limit is shared: 3 logins through one, 2 through the other, then 429 on both.
    let peer = "192.0.2.77:1000";
    for gw in [&a, &a, &a, &b, &b] {
        assert_eq!(status(gw, "POST", "/login", peer, None).await, 200);
    }
    assert_eq!(status(&a, "POST", "/login", peer, None).await, 429);
    assert_eq!(status(&b, "POST", "/login", peer, None).await, 429);

    // So is the API key's burst of 20.
    for i in 0..20 {
        let gw = if i % 2 == 0 { &a } else { &b };
        assert_eq!(status(gw, "GET", "/api/items", peer, Some("k")).await, 200);
    }
    assert_eq!(status(&b, "GET", "/api/items", peer, Some("k")).await, 429);
    let keys = server.cli(&["--scan", "--pattern", "gateway:*"]);
    assert!(keys.lines().count() >= 3, "{keys}");

    // Redis goes away: login fails closed (503), the API falls back to a local quarter of its
    // limit (a burst of 5) on each gateway.
    server.kill();
    let res = send(&a, request("POST", "/login", "192.0.2.78:1", None)).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "5");
    let fresh = "fresh-key";
    for _ in 0..5 {
        assert_eq!(
            status(&a, "GET", "/api/items", peer, Some(fresh)).await,
            200
        );
    }
    assert_eq!(
        status(&a, "GET", "/api/items", peer, Some(fresh)).await,
        429
    );
    // The other gateway has its own local share.
    assert_eq!(
        status(&b, "GET", "/api/items", peer, Some(fresh)).await,
        200
    );
}

/// `denial_cache` and `coalesce` cut the calls to Redis without changing an answer: a client
/// Redis denied (or whose admission took its last unit) is answered 429 from the gateway's
/// memory until its wait is over (each gateway asks at most once), and the concurrent checks of one key share script calls, admitting exactly the
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_denial_cache_and_coalescing_ask_redis_less_with_the_same_answers() {
    let server = redis_harness::RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"dc\"\ntimeout_ms = 2000\n\
         denial_cache = true\ncoalesce = true\n\
         [[routes]]\npath = \"/login\"\nkey = {{ source = \"ip\" }}\n\
         [routes.policy]\nname = \"login\"\nquotas = [{{ limit = 5, per = \"minute\" }}]\n\
         [[routes]]\npath = \"/api\"\nkey = {{ source = \"header\", name = \"x-api-key\" }}\n\
         [routes.policy]\nname = \"api\"\nquotas = [{{ limit = 20, per = \"minute\" }}]\n",
        server.url()
    );
    let config = Config::from_toml(&text).unwrap();
    let a = app(&config).await.unwrap();
    let b = app(&config).await.unwrap();

    let peer = "192.0.2.90:1";
    for _ in 0..5 {
        assert_eq!(status(&a, "POST", "/login", peer, None).await, 200);
    }
    let before = server.script_calls();
    let first = send(&a, request("POST", "/login", peer, None)).await;
    assert_eq!(first.status(), 429);
    let wait: u64 = first.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // The admission that took the last unit said when one comes back: that denial was cached
    // with it.
    assert_eq!(
        server.script_calls(),
        before,
        "implied by the last admission"
    );
    for _ in 0..20 {
        let res = send(&a, request("POST", "/login", peer, None)).await;
        assert_eq!(res.status(), 429);
        let again: u64 = res.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=wait).contains(&again), "{again} after {wait}");
        assert!(res.headers().contains_key("ratelimit"));
    }
    assert_eq!(server.script_calls(), before, "answered here");
    // Another gateway asks once, then answers from its own cache.
    for _ in 0..5 {
        assert_eq!(status(&b, "POST", "/login", peer, None).await, 429);
    }
    assert_eq!(
        server.script_calls(),
        before + 1,
        "another gateway asks once"
    );

    // 40 requests of one key at once: exactly the 20 of the limit pass, in fewer calls.
    let before = server.script_calls();
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { status(&a, "GET", "/api/items", peer, Some("hot")).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let calls = server.script_calls() - before;
    println!("40 concurrent requests of one key: {calls} script calls");
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 20);
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 20);
    assert!(calls < 40, "{calls} calls for 40 requests");
}

/// `watch_resets`: a client that a process outside the gateways (an admin tool whose store
/// announces its resets) lets back in is let in at once by gateways that watch, while one that
/// does not answers its cached 429 until the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_gateway_lets_a_reset_client_in_at_once() {
    use ratelimit_core::{Algorithm, Limit, Quota};
    let server = redis_harness::RedisServer::start();
    let text = |watch: bool| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"wr\"\ntimeout_ms = 2000\n\
             denial_cache = true\nwatch_resets = {watch}\n\
             [[routes]]\npath = \"/api\"\nkey = {{ source = \"header\", name = \"x-api-key\" }}\n\
             [routes.policy]\nname = \"api\"\nalgorithm = \"gcra\"\n\
             quotas = [{{ limit = 3, per = \"minute\" }}]\n",
            server.url()
        )
    };
    let watching = Config::from_toml(&text(true)).unwrap();
    let (a, b) = (app(&watching).await.unwrap(), app(&watching).await.unwrap());
    let c = app(&Config::from_toml(&text(false)).unwrap())
        .await
        .unwrap();
    // Both watches subscribed (Redis counts them).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while server.cli(&["pubsub", "numsub", "wr:resets"]) != "wr:resets\n2" {
        assert!(
            std::time::Instant::now() < deadline,
            "the watches did not subscribe"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let peer = "192.0.2.91:1";
    let get = |app: &Router| {
        let app = app.clone();
        async move { status(&app, "GET", "/api/items", peer, Some("k")).await }
    };
    for gateway in [&a, &b, &c] {
        let _ = get(gateway).await;
    }
    for gateway in [&a, &b, &c] {
        assert_eq!(get(gateway).await, 429);
    }
    // Each gateway now answers from its cache: no more calls to Redis.
    let calls = server.script_calls();
    for gateway in [&a, &b, &c] {
        assert_eq!(get(gateway).await, 429);
    }
    assert_eq!(server.script_calls(), calls);

    // An admin tool resets the key (the layer's key: the policy's name, a 0 byte, the header).
    let admin = ratelimit_redis::RedisStore::builder(server.url())
        .prefix("wr")
        .announce_resets(true)
        .build()
        .await
        .unwrap();
    let limit = Limit::single(Algorithm::Gcra, Quota::per_minute(3).unwrap()).unwrap();
    admin.reset(b"api\0k", &limit).await.unwrap();
    // The watching gateways let the client in once their watches have heard; the other keeps
    // its cached denial.
    for gateway in [&a, &b] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while get(gateway).await != 200 {
            assert!(std::time::Instant::now() < deadline, "still denied");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    assert_eq!(get(&c).await, 429);
    assert_eq!(get(&a).await, 200);
    assert_eq!(get(&a).await, 429);
}

/// The longest `timeout_ms` the configuration accepts (an hour) starts a Redis gateway: the
/// store's own timeout (the layer's plus 10 ms) is held to the store's longest, an hour, instead
/// of refusing the file with an error about a field it does not have.
#[tokio::test]
async fn the_longest_timeout_starts_a_redis_gateway() {
    let server = redis_harness::RedisServer::start();
    let text = redis_text()
        .replace("redis://127.0.0.1:6379", &server.url())
        .replace("timeout_ms = 2000\n", "timeout_ms = 3600000\n");
    let config = Config::from_toml(&text).unwrap();
    let app = app(&config).await.unwrap();
    assert_eq!(
        status(&app, "POST", "/login", "192.0.2.80:1", None).await,
        200
    );
}

#[tokio::test]
async fn redis_cluster_config_shares_limits_between_gateways() {
    let cluster = redis_harness::RedisCluster::start(3);
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let text = redis_text().replace(
        "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        &format!("kind = \"redis_cluster\"\nurls = [{}]", urls.join(", ")),
    );
    let config = Config::from_toml(&text).unwrap();
    assert_eq!(config.store.urls.len(), 3);
    let a = app(&config).await.unwrap();
    let b = app(&config).await.unwrap();
    // Several clients, so their keys land on different nodes; each gets 5 logins in all.
    for client in 1..=6 {
        let peer = format!("192.0.2.{client}:1000");
        for gw in [&a, &b, &a, &b, &a] {
            assert_eq!(status(gw, "POST", "/login", &peer, None).await, 200);
        }
        assert_eq!(status(&b, "POST", "/login", &peer, None).await, 429);
    }
}

#[tokio::test]
async fn start_without_redis_still_refuses_a_wrong_password() {
    let server = redis_harness::RedisServer::builder()
        .password("right")
        .start();
    let url = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let text = redis_text().replace(
        "url = \"redis://127.0.0.1:6379\"",
        &format!("url = \"{url}\"\nstart_without_redis = true"),
    );
    let config = Config::from_toml(&text).unwrap();
    assert!(config.store.start_without_redis);
    let err = app(&config).await.unwrap_err().to_string();
    assert!(err.starts_with("store: "), "{err}");
    assert!(!err.contains("wrong"), "the password is not echoed: {err}");
}

/// The same on a cluster, whose client reports a node that refused the password as an I/O error
/// ("Failed to create initial connections") that names the refusal only in its text.
#[tokio::test]
async fn start_without_redis_still_refuses_a_wrong_password_on_a_cluster() {
    let cluster = redis_harness::RedisCluster::start(3);
    // Set once the cluster is formed: its bus does not use the password.
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["config", "set", "requirepass", "right"]), "OK");
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("\"redis://:wrong@127.0.0.1:{}\"", n.port()))
        .collect();
    let text = redis_text().replace(
        "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        &format!(
            "kind = \"redis_cluster\"\nurls = [{}]\nstart_without_redis = true",
            urls.join(", ")
        ),
    );
    let config = Config::from_toml(&text).unwrap();
    assert!(config.store.start_without_redis);
    let err = app(&config).await.unwrap_err().to_string();
    assert!(err.starts_with("store: "), "{err}");
    assert!(!err.contains("wrong"), "the password is not echoed: {err}");
}

#[tokio::test]
async fn start_without_redis_follows_the_failure_policies_until_redis_comes_up() {
    let mut server = redis_harness::RedisServer::start();
    server.kill();
    let text = redis_text().replace(
        "url = \"redis://127.0.0.1:6379\"",
        &format!(
            "url = \"{}\"\nstart_without_redis = true\ncircuit_breaker = {{ cool_down_ms = 200 }}",
            server.url()
        ),
    );
    let config = Config::from_toml(&text).unwrap();
    assert!(config.store.start_without_redis);
    // Without the setting, the gateway refuses to start.
    let strict =
        Config::from_toml(&redis_text().replace("redis://127.0.0.1:6379", &server.url())).unwrap();
    let err = app(&strict).await.unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "store: could not connect to Redis: {}: ",
            server.url()
        )),
        "{err}"
    );

    let gw = app(&config).await.unwrap();
    let peer = "192.0.2.200:1";
    assert_eq!(status(&gw, "POST", "/login", peer, None).await, 503);
    for _ in 0..5 {
        assert_eq!(status(&gw, "GET", "/api/items", peer, Some("k")).await, 200);
    }
    assert_eq!(status(&gw, "GET", "/api/items", peer, Some("k")).await, 429);

    // Redis comes up: within a few seconds the gateway connects and logins are counted there.
    server.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status(&gw, "POST", "/login", peer, None).await != 200 {
        assert!(std::time::Instant::now() < deadline, "never connected");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let keys = server.cli(&["--scan", "--pattern", "gateway:*"]);
    assert!(!keys.is_empty());
}

/// `expiry_slack_ms` reaches the Redis store: a key lives that much longer than its state takes
/// to be fresh again (36 s after one request under 100 an hour), and without it no longer.
#[tokio::test]
async fn the_expiry_slack_reaches_the_redis_keys() {
    let server = redis_harness::RedisServer::start();
    let pttls = |prefix: &str| -> Vec<u64> {
        let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
        keys.lines()
            .map(|k| server.cli(&["pttl", k]).trim().parse().unwrap())
            .collect()
    };
    for (prefix, slack) in [("slack", Some(30_000)), ("noslack", None)] {
        let text = format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"{prefix}\"\ntimeout_ms = 2000\n{}\
             [[routes]]\npath = \"/api\"\nkey = {{ source = \"header\", name = \"x-api-key\" }}\n\
             [routes.policy]\nname = \"api\"\nquotas = [{{ limit = 100, per = \"hour\" }}]\n",
            server.url(),
            slack.map_or(String::new(), |ms| format!("expiry_slack_ms = {ms}\n")),
        );
        let gw = app(&Config::from_toml(&text).unwrap()).await.unwrap();
        assert_eq!(
            status(&gw, "GET", "/api/items", "192.0.2.5:1", Some("k")).await,
            200
        );
        let ttls = pttls(prefix);
        assert_eq!(ttls.len(), 1, "{prefix}: {ttls:?}");
        // Fresh 36 s after one request (a unit of 100 an hour), plus the slack; the time
        // between the request and PTTL (milliseconds; two runs of redis-cli) only lowers it,
        // and the key outlives it whatever the machine's load.
        let highest: u64 = 36_000 + slack.unwrap_or(0);
        let lowest = highest - 10_000;
        assert!(
            (lowest..=highest).contains(&ttls[0]),
            "{prefix}: pttl {} outside {lowest}..={highest}",
            ttls[0]
        );
    }
}

/// `ping_after_idle_ms` reaches the Redis store: after Redis closed the gateway's connection, a
/// request idle past it is answered by Redis (its count goes on), not by the failure policy.
#[tokio::test]
async fn a_connection_closed_while_idle_fails_no_request() {
    let server = redis_harness::RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"idle\"\ntimeout_ms = 2000\n\
         ping_after_idle_ms = 100\n\
         [[routes]]\npath = \"/api\"\nkey = {{ source = \"header\", name = \"x-api-key\" }}\n\
         [routes.policy]\nname = \"api\"\nquotas = [{{ limit = 100, per = \"minute\" }}]\n\
         failure = {{ mode = \"closed\", retry_after_secs = 5 }}\nheaders = {{ legacy = true }}\n",
        server.url(),
    );
    let gw = app(&Config::from_toml(&text).unwrap()).await.unwrap();
    let remaining = async || {
        let req = request("GET", "/api/items", "192.0.2.5:1", Some("k"));
        let res = gw.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        res.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(remaining().await, "99");
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert_eq!(killed.trim(), "1", "the gateway's connection closed");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(remaining().await, "98");
}

/// `config::methods` says what the router serves: each listed method reaches the endpoint's
/// handler, any other is answered 405.
#[tokio::test]
async fn the_methods_table_matches_the_router() {
    let config = Config::from_toml(MEMORY).unwrap();
    let app = app(&config).await.unwrap();
    for endpoint in example_gateway::config::ENDPOINTS {
        let uri = endpoint.replace("{id}", "1");
        for method in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"] {
            // A limit reached is a 429, which is not a 405 either: one client will do.
            let req = request(method, &uri, "198.51.100.1:1", Some("demo-free"));
            let res = app.clone().oneshot(req).await.unwrap();
            let listed = example_gateway::config::methods(endpoint).contains(&method);
            assert_eq!(
                res.status() != 405,
                listed,
                "{method} {uri}: {} (listed: {listed})",
                res.status()
            );
        }
    }
}

/// A syntax error is placed by line and by column in characters, not bytes, on lines with
/// non-ASCII text; and a file cut anywhere (each prefix of one full of multi-byte characters) is
/// an error message or a config, never a panic.
#[test]
fn syntax_errors_are_placed_in_characters_and_never_panic() {
    let text = "# Réglages — 🙂\nlisten = \"ключ\" x\n";
    let err = Config::from_toml(text).expect_err(text).to_string();
    assert!(err.contains("(line 2, column 17)"), "{err}");
    let full = format!("# Réglages — 🙂 ключ\n{MEMORY}# fin: ✓ 🙂\nlisten = \"é🙂\"\n");
    let mut errors = 0;
    for (at, _) in full.char_indices() {
        if let Err(e) = Config::from_toml(&full[..at]) {
            assert!(!e.to_string().is_empty());
            errors += 1;
        }
    }
    assert!(errors > 0, "some prefixes are not valid configurations");
}

/// `[store.circuit_breaker]` reaches the layer: with `failures = 1`, a Redis that is down opens
/// the circuit at the first failure and the next checks are refused without asking it
/// (`kind="circuit_open"`); with `enabled = false`, every check asks it (`kind="error"` each).
#[tokio::test]
async fn the_breaker_settings_reach_the_layer() {
    let mut server = redis_harness::RedisServer::start();
    server.kill();
    let gateway = |name: &str, breaker: &str| {
        let text = format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\nstart_without_redis = true\n\
             timeout_ms = 2000\ncircuit_breaker = {{ {breaker} }}\n\
             [[routes]]\npath = \"/login\"\nkey = {{ source = \"ip\" }}\n\
             [routes.policy]\nname = \"{name}\"\nquotas = [{{ limit = 5, per = \"minute\" }}]\n\
             failure = {{ mode = \"closed\", retry_after_secs = 5 }}\n",
            server.url()
        );
        Config::from_toml(&text).unwrap()
    };
    let on = app(&gateway(
        "breaker-on",
        "failures = 1, cool_down_ms = 600000",
    ))
    .await
    .unwrap();
    let off = app(&gateway("breaker-off", "enabled = false"))
        .await
        .unwrap();
    for app in [&on, &off] {
        for _ in 0..3 {
            assert_eq!(
                status(app, "POST", "/login", "192.0.2.7:1", None).await,
                503
            );
        }
    }
    // The metrics of the whole binary: these two policies are this test's alone.
    let text = body(send(&on, request("GET", "/metrics", "192.0.2.7:1", None)).await).await;
    let value = |series: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let errors = |policy: &str, kind: &str| {
        value(&format!(
            "ratelimit_store_errors_total{{policy=\"{policy}\",kind=\"{kind}\"}}"
        ))
        .unwrap_or(0)
    };
    assert_eq!(errors("breaker-on", "error"), 1, "{text}");
    assert_eq!(errors("breaker-on", "circuit_open"), 2, "{text}");
    assert_eq!(errors("breaker-off", "error"), 3, "{text}");
    assert_eq!(errors("breaker-off", "circuit_open"), 0, "{text}");
}

/// `per_failure_domain` reaches the layer: on a cluster that is down, the keys of ten clients
/// open the circuits of their failure domains (several), or the one circuit of the whole store
/// when false.
#[tokio::test]
async fn a_circuit_per_failure_domain_unless_told_otherwise() {
    let cluster = redis_harness::RedisCluster::start(3);
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    drop(cluster);
    let gateway = |name: &str, per_domain: bool| {
        let text = format!(
            "[store]\nkind = \"redis_cluster\"\nurls = [{}]\nstart_without_redis = true\n\
             timeout_ms = 2000\n\
             circuit_breaker = {{ failures = 1, cool_down_ms = 600000, per_failure_domain = {per_domain} }}\n\
             [[routes]]\npath = \"/login\"\nkey = {{ source = \"ip\" }}\n\
             [routes.policy]\nname = \"{name}\"\nquotas = [{{ limit = 5, per = \"minute\" }}]\n\
             failure = {{ mode = \"closed\", retry_after_secs = 5 }}\n",
            urls.join(", ")
        );
        Config::from_toml(&text).unwrap()
    };
    let apps = [
        app(&gateway("domains-on", true)).await.unwrap(),
        app(&gateway("domains-off", false)).await.unwrap(),
    ];
    for app in &apps {
        for client in 1..=10 {
            let peer = format!("192.0.2.{client}:1");
            assert_eq!(status(app, "POST", "/login", &peer, None).await, 503);
        }
    }
    let text = body(send(&apps[0], request("GET", "/metrics", "192.0.2.1:1", None)).await).await;
    let not_closed = |policy: &str| -> f64 {
        let series = format!("ratelimit_circuits_not_closed{{policy=\"{policy}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series)?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert!(not_closed("domains-on") >= 2.0, "{text}");
    assert_eq!(not_closed("domains-off"), 1.0, "{text}");
}

/// `[store.circuit_breaker] per_failure_domain`: a circuit per failure domain of the store by
/// default, one for the whole store when false.
#[test]
fn the_breaker_keeps_a_circuit_per_failure_domain_unless_told_otherwise() {
    let policy = with_policy("quotas = [{ limit = 5, per = \"minute\" }]");
    let default = Config::from_toml(&policy).unwrap();
    assert!(default.store.circuit_breaker.per_failure_domain);
    let one = Config::from_toml(
        &("[store]\ncircuit_breaker = { per_failure_domain = false }\n".to_owned() + &policy),
    )
    .unwrap();
    assert!(!one.store.circuit_breaker.per_failure_domain);
    assert_eq!(
        one.store.circuit_breaker.failures, 5,
        "the rest as by default"
    );
}
