//! Per-request cost of the layer through an axum `Router`, against a bare handler and against
//! tower_governor configured alike (peer-IP key, token bucket, rate-limit headers on or off). The
//! `ours` rows use the default policy, which also puts a `Verdict` in the response extensions and
//! wraps the body in `ResponseBody`; the `lean` rows do neither (`Policy::verdict(false)`,
//! `RateLimitLayer::same_body`), as tower_governor has nothing like them.
//!
//! Run with: `cargo bench -p tower-ratelimit --bench layer`
//!
//! Every benchmark sends one request through `Router::oneshot` on a current-thread runtime, with
//! the peer address in `ConnectInfo`, so they differ only by the middleware. The routers are
//! given their state once, as a server does (see `apps`).
//!
//! The `clients` group sends each request from the next of many clients (10 thousand, whose
//! states stay in the CPU's caches, and a million, whose states do not), each with a quota it
//! never spends, so that every client's state stays in the store as a gateway's clients' do.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{Criterion, criterion_group};
use governor::middleware::StateInformationMiddleware;
use http::Request;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_ratelimit::{Headers, Policy, RateLimitLayer};

// Out of line: `callgrind.sh` counts requests by the calls of this function.
#[inline(never)]
fn request() -> Request<Body> {
    request_from(SocketAddr::from(([192, 0, 2, 1], 5000)))
}

/// The peer address of client `i` of many (in 10.0.0.0/8).
fn client(i: u32) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::from(0x0a00_0000 | (i & 0x00ff_ffff)), 5000))
}

/// A request from `peer`.
#[inline]
fn request_from(peer: SocketAddr) -> Request<Body> {
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

fn bare() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// Our layer with the default policy (`lean == false`), or configured as tower_governor is
/// (`lean`): no `Verdict` in the response extensions, and the inner body type kept
/// (`same_body`), since tower_governor has neither.
fn ours(quota: Quota, headers: Headers, lean: bool) -> Router {
    ours_on(MemoryStore::new(), quota, headers, lean)
}

fn ours_on(store: MemoryStore, quota: Quota, headers: Headers, lean: bool) -> Router {
    let limit = Limit::single(Algorithm::TokenBucket, quota).unwrap();
    let policy = Policy::new("bench", limit)
        .unwrap()
        .headers(headers)
        .verdict(!lean);
    let layer = RateLimitLayer::new(store, policy).unwrap();
    if lean {
        bare().layer(layer.same_body())
    } else {
        bare().layer(layer)
    }
}

/// Our layer with the default policy and the fields, of which a `Resetter` has been made (and
/// dropped: the layer marks its requests all the same), as a gateway's admin route or a sign-in
/// route makes one. Every allowed request carries a mark for a handler's reset.
fn ours_resetting(quota: Quota) -> Router {
    let limit = Limit::single(Algorithm::TokenBucket, quota).unwrap();
    let policy = Policy::new("bench", limit)
        .unwrap()
        .headers(Headers::ietf());
    let layer = RateLimitLayer::new(MemoryStore::new(), policy).unwrap();
    drop(layer.resetter());
    bare().layer(layer)
}

fn governor_with_headers(per_nanos: u64, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .key_extractor(PeerIpKeyExtractor)
        .use_headers()
        .finish()
        .unwrap();
    let layer: GovernorLayer<PeerIpKeyExtractor, StateInformationMiddleware, Body> =
        GovernorLayer::new(Arc::new(config));
    bare().layer(layer)
}

fn governor_plain(per_nanos: u64, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .key_extractor(PeerIpKeyExtractor)
        .finish()
        .unwrap();
    bare().layer(GovernorLayer::new(Arc::new(config)))
}

/// A layer that does nothing but pass the request on and wrap the inner future: the floor of any
/// such layer's overhead in an axum router.
mod noop {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http::{Request, Response};
    use tower::{Layer, Service};

    #[derive(Clone)]
    pub(crate) struct NoopLayer;

    #[derive(Clone)]
    pub(crate) struct Noop<S>(S);

    impl<S> Layer<S> for NoopLayer {
        type Service = Noop<S>;
        fn layer(&self, inner: S) -> Noop<S> {
            Noop(inner)
        }
    }

    pin_project_lite::pin_project! {
        pub(crate) struct NoopFuture<F> { #[pin] fut: F }
    }

    impl<F: Future> Future for NoopFuture<F> {
        type Output = F::Output;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.project().fut.poll(cx)
        }
    }

    impl<S, ReqB, B> Service<Request<ReqB>> for Noop<S>
    where
        S: Service<Request<ReqB>, Response = Response<B>>,
    {
        type Response = Response<B>;
        type Error = S::Error;
        type Future = NoopFuture<S::Future>;
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }
        fn call(&mut self, req: Request<ReqB>) -> Self::Future {
            std::hint::black_box(&req);
            NoopFuture {
                fut: self.0.call(req),
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn apps() -> Vec<(&'static str, Router, u16)> {
    // Always allowed: a billion a second. Always denied: one an hour, spent before measuring.
    let plenty = Quota::per_second(1_000_000_000).unwrap();
    let scarce = Quota::per_hour(1).unwrap();
    let hour_nanos = 3_600_000_000_000;
    let apps = vec![
        ("bare", bare(), 200),
        ("noop", bare().layer(noop::NoopLayer), 200),
        (
            "ours/allowed/headers",
            ours(plenty, Headers::ietf(), false),
            200,
        ),
        ("ours/allowed/headers/resetter", ours_resetting(plenty), 200),
        (
            "ours/denied/headers",
            ours(scarce, Headers::ietf(), false),
            429,
        ),
        (
            "lean/allowed/headers",
            ours(plenty, Headers::ietf(), true),
            200,
        ),
        (
            "lean/denied/headers",
            ours(scarce, Headers::ietf(), true),
            429,
        ),
        (
            "governor/allowed/headers",
            governor_with_headers(1, u32::MAX),
            200,
        ),
        (
            "governor/denied/headers",
            governor_with_headers(hour_nanos, 1),
            429,
        ),
        (
            "ours/allowed/no-headers",
            ours(plenty, Headers::none(), false),
            200,
        ),
        (
            "ours/denied/no-headers",
            ours(scarce, Headers::none(), false),
            429,
        ),
        (
            "lean/allowed/no-headers",
            ours(plenty, Headers::none(), true),
            200,
        ),
        (
            "lean/denied/no-headers",
            ours(scarce, Headers::none(), true),
            429,
        ),
        (
            "governor/allowed/no-headers",
            governor_plain(1, u32::MAX),
            200,
        ),
        (
            "governor/denied/no-headers",
            governor_plain(hour_nanos, 1),
            429,
        ),
    ];
    // Routes made once, as `axum::serve` does for each connection: a router whose handlers have
    // not been given their state yet turns each into a route on every request, which re-applies
    // every layer to it (a clone of the layer, its `Layer::layer` and a boxed service per request).
    apps.into_iter()
        .map(|(name, app, status)| (name, app.with_state(()), status))
        .collect()
}

async fn one(app: &Router) {
    send(app, request()).await;
}

async fn one_from(app: &Router, peer: SocketAddr) -> u16 {
    send(app, request_from(peer)).await
}

/// Sends `req` through `app` and reads the response's body, as a server would; its status.
async fn send(app: &Router, req: Request<Body>) -> u16 {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let _ = http_body_util::BodyExt::collect(res.into_body()).await;
    status
}

/// How many clients each `clients` benchmark cycles through: 10 thousand and a million under
/// `cargo bench`; a thousand when `cargo test --all-targets` runs each benchmark once as a test,
/// in a debug build.
fn clients() -> [(&'static str, u32); 2] {
    let full = std::env::args().any(|a| a == "--bench");
    [
        ("10k", if full { 10_000 } else { 1_000 }),
        ("1M", if full { 1_000_000 } else { 1_000 }),
    ]
}

/// The routers of the `clients` group for `n` clients. Each client may send a million requests
/// at once and gets one more a second: never denied here, and its state never returns to fresh
/// (which the memory store would drop), so the store holds every client, as tower_governor's
/// map does. Our store is sized for them, as a gateway's would be.
fn client_apps(n: u32) -> Vec<(&'static str, Router)> {
    let quota = Quota::per_second(1).unwrap().with_burst(1_000_000).unwrap();
    let store = || {
        MemoryStore::builder()
            .max_keys((2 * n as usize).max(ratelimit_core::DEFAULT_MAX_KEYS))
            .build()
            .unwrap()
    };
    let second = 1_000_000_000;
    let apps = vec![
        ("bare", bare()),
        (
            "ours/allowed/headers",
            ours_on(store(), quota, Headers::ietf(), false),
        ),
        (
            "lean/allowed/headers",
            ours_on(store(), quota, Headers::ietf(), true),
        ),
        (
            "governor/allowed/headers",
            governor_with_headers(second, 1_000_000),
        ),
        (
            "lean/allowed/no-headers",
            ours_on(store(), quota, Headers::none(), true),
        ),
        (
            "governor/allowed/no-headers",
            governor_plain(second, 1_000_000),
        ),
    ];
    apps.into_iter()
        .map(|(name, app)| (name, app.with_state(())))
        .collect()
}

/// One request from each of the `n` clients, so that every client has a state before measuring;
/// checks that all were allowed.
fn fill(rt: &tokio::runtime::Runtime, name: &str, app: &Router, n: u32) {
    rt.block_on(async {
        for i in 0..n {
            assert_eq!(one_from(app, client(i)).await, 200, "{name}, client {i}");
        }
    });
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let apps = apps();
    let mut group = c.benchmark_group("layer");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, app, status) in apps {
        // Spend the scarce quota first, and check every app answers as its name says.
        rt.block_on(async {
            let _ = app.clone().oneshot(request()).await.unwrap();
            let res = app.clone().oneshot(request()).await.unwrap();
            assert_eq!(res.status().as_u16(), status, "{name}");
        });
        group.bench_function(name, |b| b.to_async(&rt).iter(|| one(&app)));
    }
    group.finish();

    let mut group = c.benchmark_group("clients");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (size, n) in clients() {
        for (name, app) in client_apps(n) {
            let mut i = 0;
            let mut filled = false;
            // Filled on the first call, which criterion makes only for a benchmark its filter
            // selects (`callgrind.sh` runs one benchmark alone, under valgrind).
            group.bench_function(format!("{size}/{name}"), |b| {
                if !filled {
                    fill(&rt, name, &app, n);
                    filled = true;
                }
                b.to_async(&rt).iter(|| {
                    i = (i + 1) % n;
                    one_from(&app, client(i))
                })
            });
        }
    }
    group.finish();
}

/// Ratios from interleaved rounds: each round times a batch of every app in turn, and each app
/// keeps its fastest batch. On a shared machine the minimum is far steadier than a mean, and
/// interleaving exposes every app to the same background load.
fn ratios() {
    const ROUNDS: usize = 25;
    const BATCH: u32 = 2_000;
    let rt = runtime();
    let apps = apps();
    let mut best = vec![f64::INFINITY; apps.len()];
    rt.block_on(async {
        for (_, app, _) in &apps {
            one(app).await;
        }
        for _ in 0..ROUNDS {
            for (i, (_, app, _)) in apps.iter().enumerate() {
                let start = std::time::Instant::now();
                for _ in 0..BATCH {
                    one(app).await;
                }
                let ns = start.elapsed().as_nanos() as f64 / f64::from(BATCH);
                best[i] = best[i].min(ns);
            }
        }
    });
    let ns = |name: &str| best[apps.iter().position(|(n, _, _)| *n == name).unwrap()];
    let bare = ns("bare");
    println!("\nInterleaved minimum over {ROUNDS} rounds of {BATCH} requests (ns per request):");
    for (i, (name, _, _)) in apps.iter().enumerate() {
        println!(
            "  {name:<28} {:>8.0} ns   overhead over bare {:>8.0} ns",
            best[i],
            best[i] - bare
        );
    }
    // Above the no-op layer: the limiter's own work, without what axum charges any layer.
    let floor = ns("noop") - bare;
    for mode in ["headers", "no-headers"] {
        for who in ["ours", "lean", "governor"] {
            let allowed = ns(&format!("{who}/allowed/{mode}"));
            let denied = ns(&format!("{who}/denied/{mode}"));
            println!(
                "  {who:<8} {mode:<10} denied/allowed = {:.2}  (overhead {:.0} ns allowed)",
                denied / allowed,
                allowed - bare
            );
        }
        let governor = ns(&format!("governor/allowed/{mode}")) - bare;
        for who in ["ours", "lean"] {
            let ours = ns(&format!("{who}/allowed/{mode}")) - bare;
            println!(
                "  {mode}: {who} allowed overhead / tower_governor's = {:.2}  (above the no-op layer's: {:.2})",
                ours / governor,
                (ours - floor) / (governor - floor)
            );
        }
    }
}

/// `ratios` for the `clients` routers: each batch continues through the clients where the last
/// batch of the same router stopped.
fn client_ratios() {
    const ROUNDS: usize = 15;
    const BATCH: u32 = 20_000;
    let rt = runtime();
    for (size, n) in clients() {
        let apps = client_apps(n);
        for (name, app) in &apps {
            fill(&rt, name, app, n);
        }
        let mut best = vec![f64::INFINITY; apps.len()];
        let mut next = vec![0u32; apps.len()];
        rt.block_on(async {
            for _ in 0..ROUNDS {
                for (i, (_, app)) in apps.iter().enumerate() {
                    let start = std::time::Instant::now();
                    for _ in 0..BATCH {
                        next[i] = (next[i] + 1) % n;
                        one_from(app, client(next[i])).await;
                    }
                    let ns = start.elapsed().as_nanos() as f64 / f64::from(BATCH);
                    best[i] = best[i].min(ns);
                }
            }
        });
        let ns = |name: &str| best[apps.iter().position(|(n, _)| *n == name).unwrap()];
        let bare = ns("bare");
        println!(
            "\nMany clients ({size}), interleaved minimum over {ROUNDS} rounds of {BATCH} requests (ns per request):"
        );
        for (i, (name, _)) in apps.iter().enumerate() {
            println!(
                "  {name:<28} {:>8.0} ns   overhead over bare {:>8.0} ns",
                best[i],
                best[i] - bare
            );
        }
        for (who, mode) in [
            ("ours", "headers"),
            ("lean", "headers"),
            ("lean", "no-headers"),
        ] {
            let ours = ns(&format!("{who}/allowed/{mode}")) - bare;
            let governor = ns(&format!("governor/allowed/{mode}")) - bare;
            println!(
                "  {size} clients, {mode}: {who} allowed overhead / tower_governor's = {:.2}",
                ours / governor
            );
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    // Only under `cargo bench` (which passes `--bench`): `cargo test --all-targets` runs each
    // benchmark once as a test, and `--profile-time` runs measure one benchmark alone.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--profile-time") {
        ratios();
        client_ratios();
    }
    Criterion::default().configure_from_args().final_summary();
}
