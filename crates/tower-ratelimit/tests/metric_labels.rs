//! Label cardinality: whatever the requests carry (client keys, paths with ids, missing keys),
//! the layer's series are the bounded set registered when it is built, labelled only by the
//! policy's name, the outcome and the failure kind (and, for a policy with tiers, the tier's
//! configured name: tests/policies.rs). A test binary of its own: it installs the global
//! recorder, so that a series registered while a request is handled (on any thread)
//! would be seen too, not only those registered by the build.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::*;
use metrics_util::debugging::DebuggingRecorder;
use ratelimit_core::{Algorithm, Limit, Quota};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{CircuitBreaker, FailurePolicy, Policy, RateLimitLayer, VerdictKind};

#[tokio::test]
async fn series_are_bounded_whatever_the_requests_carry() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");

    let (_clock, inner) = store();
    let switch = Arc::new(SwitchStore::new(inner));
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(2).unwrap()).unwrap();
    let layer = RateLimitLayer::builder(
        switch.clone(),
        Policy::new("bounded", limit)
            .unwrap()
            .key(ApiKeyHeader::new("x-api-key").unwrap())
            .failure(FailurePolicy::fallback(2).unwrap())
            .allow(|req| req.uri().path() == "/health"),
    )
    .timeout(Duration::from_secs(1))
    .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(60)).unwrap())
    .build()
    .unwrap();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item" }))
        .route("/health", get(|| async { "up" }))
        .layer(layer);

    let keyed = |key: &str, id: u32| {
        let mut req = request(&format!("/items/{id}"));
        req.headers_mut().insert("x-api-key", key.parse().unwrap());
        req
    };
    let mut sent = Vec::new();
    // Allowed and denied: 40 clients, 3 requests each on a limit of 2.
    for c in 0..40u32 {
        let key = format!("client-key-{c}");
        for r in 0..3 {
            send(&app, keyed(&key, 900_000 + c * 10 + r)).await;
        }
        sent.push(key);
    }
    // No key, and allow-listed.
    for _ in 0..3 {
        assert_eq!(send(&app, request("/items/777777")).await.status(), 400);
        assert_eq!(send(&app, request("/health")).await.status(), 200);
    }
    // The store down: errors, then the circuit open, answered by the fallback.
    switch.set_down(true);
    for c in 0..10u32 {
        let key = format!("down-key-{c}");
        send(&app, keyed(&key, 800_000 + c)).await;
        sent.push(key);
    }

    let outcomes: BTreeSet<&str> = VerdictKind::ALL.iter().map(|k| k.as_str()).collect();
    let kinds: BTreeSet<&str> = ["error", "timeout", "circuit_open"].into();
    let mut series = BTreeSet::new();
    let mut counts = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        for (k, v) in &labels {
            match k.as_str() {
                "policy" => assert_eq!(v, "bounded", "{key:?}"),
                "outcome" => assert!(outcomes.contains(v.as_str()), "{key:?}"),
                "kind" => assert!(kinds.contains(v.as_str()), "{key:?}"),
                other => panic!("unexpected label {other:?} on {key:?}"),
            }
            assert!(
                !sent.iter().any(|s| v.contains(s.as_str())) && !v.contains("items"),
                "a label value from a request: {key:?}"
            );
        }
        if let metrics_util::debugging::DebugValue::Counter(n) = value {
            let label = labels.last().map(|(_, v)| v.clone()).unwrap_or_default();
            counts.insert(label, n);
        }
        series.insert((key.name().to_owned(), labels));
    }
    // The requests were handled as meant (so every path above was taken).
    assert_eq!(counts["allowed"], 80, "{counts:?}");
    assert_eq!(counts["denied"], 40, "{counts:?}");
    assert_eq!(counts["no_key"], 3, "{counts:?}");
    assert_eq!(counts["allow_listed"], 3, "{counts:?}");
    assert_eq!(counts["error"], 3, "{counts:?}");
    assert_eq!(counts["circuit_open"], 7, "{counts:?}");
    assert_eq!(counts["fallback_allowed"], 10, "{counts:?}");
    // 9 outcomes, 3 failure kinds, the histogram, the cancelled checks and the two circuit
    // gauges: nothing per client or per path.
    assert_eq!(series.len(), 9 + 3 + 1 + 1 + 2, "{series:#?}");
    let names: BTreeSet<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "ratelimit_checks_cancelled_total",
            "ratelimit_circuit_state",
            "ratelimit_circuits_not_closed",
            "ratelimit_decisions_total",
            "ratelimit_store_duration_seconds",
            "ratelimit_store_errors_total",
        ]
        .into()
    );
}
