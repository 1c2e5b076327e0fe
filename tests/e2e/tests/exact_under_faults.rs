//! Admission stays exact through Redis faults: four gateways, each its own Redis store (its own
//! connections, through a proxy) under a fail-closed layer, share four clients' day quotas
//! (which do not refill during the run), with each way of cutting round trips in turn: the plain
//! store, `Coalescing`, a `DenialCache` over `Coalescing`, and `Leasing`.
//!
//! Two faults, each started when Redis has spent a share of the quotas (a quarter, then five
//! eighths), so that both hit while there are units left to spend:
//! - the replies held in the proxy (the scripts run, their answers never come) for 300 ms, and
//!   then every connection cut: checks whose outcome is unknown, spent at Redis but answered 503;
//! - the server frozen (SIGSTOP) for 300 ms, then thawed (SIGCONT).
//!
//! Then the load goes on until Redis reports every quota spent. For every client:
//! - it was never admitted more than its quota (a day's quota admits at most itself, whatever the
//!   faults), and every answer was a 200, a 429 or the fail-closed 503;
//! - Redis reached the end of its quota after the faults: the circuits closed by themselves and
//!   nothing stranded units;
//! - what Redis counted beyond the admissions, over all clients, is no more than the checks that
//!   timed out or failed (`ratelimit_store_errors_total{kind="timeout"|"error"}`: a check whose
//!   outcome is unknown, one unit each; not the requests refused by an open circuit, which never
//!   reach Redis) and, with leasing, the units its gateways dropped unspent
//!   ([`LeasingStats::wasted_units`], which counts a lease asked for by a failed check in full):
//!   no unit is lost in any other way. (Two layers of the same policy in a row, each spending a
//!   unit, fail it.)
//!
//! And `ratelimit_decisions_total` counts every answer once, under its outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use ratelimit_core::{
    Algorithm, DenialCache, Leasing, LeasingStats, Limit, Quota, Store, SystemClock,
};
use ratelimit_e2e::observe::Metrics;
use ratelimit_e2e::store_builder;
use ratelimit_redis::{Coalescing, RedisStore};
use redis_harness::RedisServer;
use redis_harness::proxy::Proxy;
use tower::ServiceExt;
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{CircuitBreaker, FailurePolicy, Policy, RateLimitLayer, Verdict};

const GATEWAYS: usize = 4;
const CLIENTS: usize = 4;
/// Each client's quota: a day's, so that none comes back during the run.
const QUOTA: u64 = 300;
/// Concurrent requests in flight, over all gateways.
const WORKERS: usize = 12;
const TIMEOUT: Duration = Duration::from_millis(50);
const FAULT_FOR: Duration = Duration::from_millis(300);
/// How long each phase may take on a loaded test machine before the test gives up.
const PHASE_WITHIN: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Wrapper {
    Plain,
    Coalescing,
    CacheOverCoalescing,
    Leasing,
}

fn limit(algorithm: Algorithm) -> Limit {
    Limit::single(algorithm, Quota::per_day(QUOTA).expect("quota")).expect("limit")
}

fn policy(limit: &Limit) -> Policy {
    Policy::new("exact", limit.clone())
        .expect("policy")
        .key(ApiKeyHeader::new("x-api-key").expect("header"))
        .failure(FailurePolicy::fail_closed(Duration::from_secs(1)))
}

/// A gateway: the layer over `store`, which cuts each check at 50 ms and opens its circuit after
/// 8 failures in a row for 200 ms.
fn gateway<S>(store: S, limit: &Limit) -> Router
where
    S: Store + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let layer = RateLimitLayer::builder(store, policy(limit))
        .timeout(TIMEOUT)
        .circuit_breaker(CircuitBreaker::new(8, Duration::from_millis(200)).expect("breaker"))
        .build()
        .expect("layer");
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Per client: answers by status.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    denied: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
}

fn request(client: usize) -> http::Request<Body> {
    http::Request::get("/")
        .header("x-api-key", format!("client-{client}"))
        .body(Body::empty())
        .expect("request")
}

/// What Redis holds for `client`: a cost-0 check (a peek) through a layer of the same policy on a
/// store connected to the server itself, not through the proxy; asked again until Redis answers
/// (just thawed, it may first time out).
async fn remaining(peek: &Router, client: usize) -> u64 {
    let started = Instant::now();
    loop {
        let res = peek.clone().oneshot(request(client)).await.expect("peek");
        if let Some(d) = res
            .extensions()
            .get::<Verdict>()
            .and_then(Verdict::decision)
        {
            return d.remaining();
        }
        assert!(
            started.elapsed() < PHASE_WITHIN,
            "no peek answered: {}",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The units Redis has spent, over every client.
async fn spent(peek: &Router) -> u64 {
    let mut spent = 0;
    for client in 0..CLIENTS {
        spent += QUOTA - remaining(peek, client).await;
    }
    spent
}

async fn run(wrapper: Wrapper, algorithm: Algorithm) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let limit = limit(algorithm);
    let metrics = Metrics::new();
    let mut gateways = Vec::new();
    let mut leasing = Vec::new();
    for _ in 0..GATEWAYS {
        let store = store_builder(&proxy.url()).build().await.expect("store");
        gateways.push(metrics.register(|| match wrapper {
            Wrapper::Plain => gateway(store, &limit),
            Wrapper::Coalescing => gateway(Coalescing::new(store), &limit),
            Wrapper::CacheOverCoalescing => gateway(
                DenialCache::new(Coalescing::new(store), SystemClock::new()),
                &limit,
            ),
            Wrapper::Leasing => {
                // Leases live at most 300 ms (a day's quota would give them the 10 s default):
                // units a gateway still holds when Redis is spent are then dropped, and counted,
                // before the end.
                let store = Leasing::builder(store, SystemClock::new())
                    .max_ttl(Duration::from_millis(300))
                    .build()
                    .expect("leasing");
                leasing.push(store.clone());
                gateway(store, &limit)
            }
        }));
    }
    // The peeks wait for Redis as long as it takes (a second at most a call), without a circuit
    // to open: the load beside them may keep the runtime busy.
    let peek_store = RedisStore::builder(server.url())
        .prefix("e2e")
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("store");
    let peek = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::builder(peek_store, policy(&limit).cost(|_| 0))
            .timeout(Duration::from_secs(2))
            .no_circuit_breaker()
            .build()
            .expect("layer"),
    );

    let tallies: Arc<Vec<Tally>> = Arc::new((0..CLIENTS).map(|_| Tally::default()).collect());
    let unavailable = || {
        tallies
            .iter()
            .map(|t| t.unavailable.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let gateways = gateways.clone();
            let tallies = Arc::clone(&tallies);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let client = (i / GATEWAYS) % CLIENTS;
                    let res = gateways[i % GATEWAYS]
                        .clone()
                        .oneshot(request(client))
                        .await
                        .expect("infallible");
                    let t = &tallies[client];
                    match res.status().as_u16() {
                        200 => t.ok.fetch_add(1, Ordering::Relaxed),
                        429 => t.denied.fetch_add(1, Ordering::Relaxed),
                        503 => t.unavailable.fetch_add(1, Ordering::Relaxed),
                        _ => t.other.fetch_add(1, Ordering::Relaxed),
                    };
                    if res.status() == 200 {
                        // An answer made at once (from a lease) never yields by itself.
                        tokio::task::yield_now().await;
                    } else {
                        // Denials and open circuits answer at once: leave the other tests some
                        // of the machine.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    i += 1;
                }
            })
        })
        .collect();

    // A fault starts when Redis has spent a share of the quotas (with leasing, units leased and
    // not yet admitted count too: a share of admissions might never be reached).
    let total = QUOTA * CLIENTS as u64;
    let reach = async |eighths: u64, what: &str| {
        let started = Instant::now();
        while spent(&peek).await < total * eighths / 8 {
            assert!(
                started.elapsed() < PHASE_WITHIN,
                "{wrapper:?}: Redis spent {} of {total}, not {eighths}/8, {what}",
                spent(&peek).await
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };

    // Replies lost: the scripts run, and their answers are held, then cut off with the
    // connections.
    reach(2, "before the replies are held").await;
    let before = unavailable();
    proxy.set_hold_replies(true);
    tokio::time::sleep(FAULT_FOR).await;
    proxy.drop_connections();
    proxy.set_hold_replies(false);
    let lost_replies = unavailable() - before;

    // Redis frozen, then thawed.
    reach(5, "after the replies were lost").await;
    let before = unavailable();
    server.pause();
    tokio::time::sleep(FAULT_FOR).await;
    server.resume();
    let frozen = unavailable() - before;

    // Until Redis has spent every quota.
    let started = Instant::now();
    while spent(&peek).await < total {
        assert!(
            started.elapsed() < PHASE_WITHIN,
            "{wrapper:?}: Redis has not spent every quota {:?} after the faults",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if matches!(wrapper, Wrapper::Leasing) {
        // The units still held in leases are spent by the load or, the leases expired, dropped.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let wasted: u64 = leasing
        .iter()
        .map(|l| {
            let LeasingStats { wasted_units, .. } = l.stats();
            wasted_units
        })
        .sum();
    // Every answer is counted once, under its outcome (answers from a lease or a cached denial
    // too), faults or not.
    let sum = |f: fn(&Tally) -> &AtomicU64| {
        tallies
            .iter()
            .map(|t| f(t).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    for (outcome, answered) in [
        ("allowed", sum(|t| &t.ok)),
        ("denied", sum(|t| &t.denied)),
        ("failed_closed", sum(|t| &t.unavailable)),
    ] {
        assert_eq!(
            metrics.decisions("exact", outcome),
            answered,
            "{wrapper:?}: ratelimit_decisions_total{{outcome=\"{outcome}\"}}"
        );
    }
    let mut beyond_admissions = 0;
    for (client, t) in tallies.iter().enumerate() {
        let (ok, denied, unavailable, other) = (
            t.ok.load(Ordering::Relaxed),
            t.denied.load(Ordering::Relaxed),
            t.unavailable.load(Ordering::Relaxed),
            t.other.load(Ordering::Relaxed),
        );
        let spent = QUOTA - remaining(&peek, client).await;
        eprintln!(
            "{wrapper:?} {algorithm} client {client}: {ok} admitted, {denied} denied, \
             {unavailable} unavailable; Redis spent {spent}"
        );
        assert_eq!(
            other, 0,
            "{wrapper:?} client {client}: only 200, 429 and 503"
        );
        assert!(
            ok <= QUOTA,
            "{wrapper:?} client {client}: {ok} admitted for a quota of {QUOTA}"
        );
        assert_eq!(spent, QUOTA, "{wrapper:?} client {client}");
        beyond_admissions += spent - ok;
    }
    // The checks that may have reached Redis without an answer: those cut at the timeout and
    // those that failed (a connection cut under them; or never sent, as a pool's wait timeout,
    // which this counts too). Not the requests refused while a circuit was open.
    let unknown = metrics.store_errors("exact", "timeout") + metrics.store_errors("exact", "error");
    let unavailable = unavailable();
    eprintln!(
        "{wrapper:?}: {lost_replies} answered 503 while replies were lost, {frozen} while \
         frozen, {unavailable} in all ({unknown} timed out or failed, the rest refused by an open \
         circuit); Redis counted {beyond_admissions} units beyond the admissions; leases \
         dropped {wasted} units"
    );
    assert!(
        lost_replies > 0,
        "{wrapper:?}: no request met the lost replies"
    );
    assert!(frozen > 0, "{wrapper:?}: no request met the frozen server");
    assert!(
        beyond_admissions <= unknown + wasted,
        "{wrapper:?}: Redis counted {beyond_admissions} units beyond the admissions, more than \
         the {unknown} checks without an answer and the {wasted} units dropped by leases"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_store_never_admits_past_the_quota() {
    run(Wrapper::Plain, Algorithm::SlidingLog).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_never_admits_past_the_quota() {
    run(Wrapper::Coalescing, Algorithm::Gcra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_cache_over_coalescing_never_admits_past_the_quota() {
    run(Wrapper::CacheOverCoalescing, Algorithm::TokenBucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_never_admits_past_the_quota() {
    run(Wrapper::Leasing, Algorithm::TokenBucket).await;
}
