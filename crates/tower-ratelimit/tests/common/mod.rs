//! Helpers shared by the integration tests: clocks, stores that fail or hang, requests.
#![allow(dead_code, unreachable_pub)]

use std::fmt;
use std::future::{Pending, Ready, pending, ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use ratelimit_core::{Decision, Limit, ManualClock, MemoryStore, Reset, Store};
use tower::ServiceExt;

pub type TestStore = Arc<MemoryStore<ManualClock>>;

/// A memory store on a manual clock.
pub fn store() -> (ManualClock, TestStore) {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .with_clock(clock.clone())
        .build()
        .unwrap();
    (clock, Arc::new(store))
}

/// A GET request from `peer`.
pub fn request_from(path: &str, peer: &str) -> Request<Body> {
    let mut req = Request::get(path).body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    req
}

/// A GET request from 192.0.2.1.
pub fn request(path: &str) -> Request<Body> {
    request_from(path, "192.0.2.1:5000")
}

/// A gRPC call to `path` (a `POST` with `content-type` `content_type`, such as
/// `application/grpc`).
#[allow(dead_code)]
pub fn grpc_request(path: &str, content_type: &'static str) -> Request<Body> {
    let mut req = request(path);
    *req.method_mut() = http::Method::POST;
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    req
}

pub async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

/// `req` with the header `name: value`.
pub fn with_header(mut req: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    req.headers_mut().insert(name, value.parse().unwrap());
    req
}

/// The statuses of `n` requests made by `make`, in turn.
pub async fn statuses(app: &Router, make: impl Fn() -> Request<Body>, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(app, make()).await.status().as_u16());
    }
    out
}

/// The cost of a request, from its `x-cost` header (1 without): a cost function for policies.
pub fn cost_header(req: &tower_ratelimit::RequestHead<'_>) -> u64 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

pub fn header<'a, B>(res: &'a Response<B>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Asserts that `res`, a response whose client the layer's `"login"` policy (3 a minute, IETF
/// and legacy fields) found with its last unit and then reset, tells the full quota the
/// client's next request starts from, while its verdict keeps the check's decision (none left).
pub fn assert_tells_the_full_quota_after_its_last_unit<B>(res: &Response<B>) {
    use tower_ratelimit::{Verdict, VerdictKind};
    assert_eq!(header(res, "ratelimit"), Some("\"login\";r=3"));
    assert_eq!(header(res, "ratelimit-policy"), Some("\"login\";q=3;w=60"));
    assert_eq!(header(res, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(res, "x-ratelimit-remaining"), Some("3"));
    assert_eq!(header(res, "x-ratelimit-reset"), Some("0"));
    let verdict = res.extensions().get::<Verdict>().unwrap();
    assert_eq!(verdict.kind(), VerdictKind::Allowed);
    assert_eq!(verdict.decision().map(Decision::remaining), Some(0));
}

/// Every line of the field `name`, in order.
#[allow(dead_code)]
pub fn header_lines<'a, B>(res: &'a Response<B>, name: &str) -> Vec<&'a str> {
    res.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

pub async fn body_text(res: Response<Body>) -> String {
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[derive(Debug)]
pub struct StoreDown;

impl fmt::Display for StoreDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("store is down")
    }
}

impl std::error::Error for StoreDown {}

/// A store that always fails at once.
#[derive(Debug, Default)]
pub struct FailingStore {
    pub calls: AtomicU64,
}

impl Store for FailingStore {
    type Error = StoreDown;
    type Future = Ready<Result<Decision, StoreDown>>;

    fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ready(Err(StoreDown))
    }
}

impl Reset for FailingStore {
    type ResetFuture = Ready<Result<(), StoreDown>>;

    fn reset(&self, _key: &[u8], _limit: &Limit) -> Self::ResetFuture {
        ready(Err(StoreDown))
    }
}

/// A store that never answers.
#[derive(Debug, Default)]
pub struct HangingStore {
    pub calls: AtomicU64,
}

impl Store for HangingStore {
    type Error = StoreDown;
    type Future = Pending<Result<Decision, StoreDown>>;

    fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        pending()
    }
}

impl Reset for HangingStore {
    type ResetFuture = Pending<Result<(), StoreDown>>;

    fn reset(&self, _key: &[u8], _limit: &Limit) -> Self::ResetFuture {
        pending()
    }
}

/// A memory store behind a switch (up or down) that answers asynchronously (after one yield, or
/// after `delay_ms` of tokio's time), like a network store would, and counts its calls.
#[derive(Debug)]
pub struct SwitchStore {
    pub inner: Arc<MemoryStore<ManualClock>>,
    pub down: AtomicBool,
    pub calls: AtomicU64,
    pub delay_ms: AtomicU64,
}

impl SwitchStore {
    pub fn new(inner: Arc<MemoryStore<ManualClock>>) -> Self {
        SwitchStore {
            inner,
            down: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
        }
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst)
    }
}

type BoxFut = Pin<Box<dyn std::future::Future<Output = Result<Decision, StoreDown>> + Send>>;

impl Store for SwitchStore {
    type Error = StoreDown;
    type Future = BoxFut;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let result = if self.down.load(Ordering::SeqCst) {
            Err(StoreDown)
        } else {
            Ok(self.inner.check_now(key, limit, cost))
        };
        let delay = self.delay_ms.load(Ordering::SeqCst);
        Box::pin(async move {
            if delay == 0 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            result
        })
    }
}

/// Resets the memory store while up; fails while down.
impl Reset for SwitchStore {
    type ResetFuture = Ready<Result<(), StoreDown>>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        if self.down.load(Ordering::SeqCst) {
            return ready(Err(StoreDown));
        }
        self.inner.reset_now(key, limit);
        ready(Ok(()))
    }
}

/// What `build` makes (a layer, whose metric handles are registered as it is built), with the
/// handles recorded by a recorder of their own, and the snapshotter that reads them.
#[allow(dead_code)]
pub fn recorded<T>(build: impl FnOnce() -> T) -> (T, metrics_util::debugging::Snapshotter) {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    (metrics::with_local_recorder(&recorder, build), snapshotter)
}

/// The resets of the policy named `policy` recorded so far (`ratelimit_resets_total`), by
/// outcome.
#[allow(dead_code)]
pub fn resets(
    snapshotter: &metrics_util::debugging::Snapshotter,
    policy: &'static str,
) -> impl Fn(&str) -> u64 {
    let recorded = Recorded::take(snapshotter);
    move |outcome| {
        recorded.counter(
            "ratelimit_resets_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    }
}

/// A login policy per `x-user` of six a minute, shared by two gateways: while the store is down,
/// the fallback lets each count three.
#[allow(dead_code)]
pub fn shared_login_policy() -> tower_ratelimit::Policy {
    let limit = Limit::single(
        ratelimit_core::Algorithm::TokenBucket,
        ratelimit_core::Quota::per_minute(6).unwrap(),
    )
    .unwrap();
    tower_ratelimit::Policy::new("login", limit)
        .unwrap()
        .key(tower_ratelimit::key::ApiKeyHeader::new("x-user").unwrap())
        .failure(tower_ratelimit::FailurePolicy::fallback(2).unwrap())
}

/// Metrics recorded by a `DebuggingRecorder`, looked up by name and labels.
pub type Entry = (
    String,
    Vec<(String, String)>,
    metrics_util::debugging::DebugValue,
);

pub struct Recorded(pub Vec<Entry>);

impl Recorded {
    pub fn take(snapshotter: &metrics_util::debugging::Snapshotter) -> Self {
        Recorded(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(k, _, _, v)| {
                    let key = k.key();
                    let labels = key
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (key.name().to_owned(), labels, v)
                })
                .collect(),
        )
    }

    /// The series named `name` that have (at least) these labels.
    fn matching(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Vec<&metrics_util::debugging::DebugValue> {
        self.0
            .iter()
            .filter(|(n, ls, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| v)
            .collect()
    }

    fn find(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<&metrics_util::debugging::DebugValue> {
        self.matching(name, labels).into_iter().next()
    }

    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(name, labels) {
            Some(metrics_util::debugging::DebugValue::Counter(n)) => *n,
            _ => 0,
        }
    }

    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.find(name, labels) {
            Some(metrics_util::debugging::DebugValue::Gauge(g)) => Some(g.into_inner()),
            _ => None,
        }
    }

    pub fn histogram_len(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        match self.find(name, labels) {
            Some(metrics_util::debugging::DebugValue::Histogram(h)) => h.len(),
            _ => 0,
        }
    }

    /// Decisions of `policy` with `outcome`, over all its tiers (a policy with tiers has a series
    /// per tier).
    pub fn outcome(&self, policy: &str, outcome: &str) -> u64 {
        self.matching(
            "ratelimit_decisions_total",
            &[("policy", policy), ("outcome", outcome)],
        )
        .into_iter()
        .map(|v| match v {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
    }
}

/// Log lines written by a test's subscriber, shared with the test.
#[derive(Clone, Default)]
pub struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Collects the warnings (and errors) logged on this thread while the guard lives.
    pub fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
        Lines::capture_from(tracing::Level::WARN)
    }

    /// Collects what is logged at `level` or above on this thread while the guard lives.
    pub fn capture_from(level: tracing::Level) -> (Lines, tracing::subscriber::DefaultGuard) {
        keep_a_second_dispatcher();
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish();
        (lines, tracing::subscriber::set_default(subscriber))
    }

    /// What has been written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Registers, once, a dispatcher that lives as long as the process and takes no interest in
/// anything. With one dispatcher registered, tracing works out a callsite's interest, when some
/// thread first reaches it, from that thread's dispatcher alone, and caches it for every thread:
/// a test without a subscriber reaching a callsite first, while one capture's subscriber was the
/// only one alive, silenced that callsite for the capture. With two, it asks every registered
/// one.
pub fn keep_a_second_dispatcher() {
    static KEPT: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::new()));
}

/// A memory store that says it has a response timeout of its own, as a network store does.
#[derive(Clone)]
pub struct TimedStore {
    pub inner: TestStore,
    pub response_timeout: std::time::Duration,
}

impl Store for TimedStore {
    type Error = std::convert::Infallible;
    type Future = Ready<Result<Decision, std::convert::Infallible>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.inner.check(key, limit, cost)
    }

    fn response_timeout(&self) -> Option<std::time::Duration> {
        Some(self.response_timeout)
    }
}

/// A layer over `store` that fails closed (503, `Retry-After: 1`) with a breaker of 3 failures and
/// a 10 s cool-down, on `clock`.
pub fn closed_with_breaker<St: Store>(
    store: St,
    policy: tower_ratelimit::Policy,
    clock: &ratelimit_core::ManualClock,
) -> tower_ratelimit::RateLimitLayer<St> {
    tower_ratelimit::RateLimitLayer::builder(
        store,
        policy.failure(tower_ratelimit::FailurePolicy::fail_closed(
            std::time::Duration::from_secs(1),
        )),
    )
    .circuit_breaker(
        tower_ratelimit::CircuitBreaker::new(3, std::time::Duration::from_secs(10)).unwrap(),
    )
    .clock(clock.clone())
    .build()
    .unwrap()
}

/// A limit of `algorithm` over `quotas`, if `Limit::new` takes it, the window algorithms' quotas
/// given their limit as burst (they take no other): for property tests that draw quotas for any
/// algorithm.
pub fn fitted_limit(
    algorithm: ratelimit_core::Algorithm,
    quotas: Vec<ratelimit_core::Quota>,
) -> Option<Limit> {
    let quotas = quotas
        .into_iter()
        .map(|q| {
            if algorithm.uses_burst() {
                Some(q)
            } else {
                q.with_burst(q.limit()).ok()
            }
        })
        .collect::<Option<Vec<_>>>()?;
    Limit::new(algorithm, quotas).ok()
}
