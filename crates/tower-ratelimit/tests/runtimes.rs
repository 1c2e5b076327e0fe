//! The layer's background tasks (a check run on to its answer after its request was dropped, a
//! `reset_on` reset made after its response was dropped) and the runtimes they run on: a
//! current-thread runtime whose `block_on` returned runs nothing, so they go to the runtime the
//! layer was built on while that is a multi-thread runtime still running; a task dropped unrun
//! (its runtime dropped, even by a panic's unwinding) counts for nothing.
//!
//! The store is a double whose checks answer when a gate says (the breaker's logic, not a
//! store's behaviour, is under test); the runtimes are real.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use common::{StoreDown, request, with_header};
use ratelimit_core::{
    Algorithm, Decision, DenialCache, Limit, ManualClock, MemoryStore, Quota, Reset, Store,
    SystemClock,
};
use tokio::sync::watch;
use tower::{Service, ServiceExt};
use tower_ratelimit::key::ApiKeyHeader;
use tower_ratelimit::{CircuitBreaker, CircuitState, GuardError, Guarded, Policy, RateLimitLayer};

fn limit() -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(1000).unwrap()).unwrap()
}

/// A store whose checks answer when the gate says: `None` hangs, `Some(true)` allows,
/// `Some(false)` fails. A check made while the gate is `None` answers when it is set.
#[derive(Clone)]
struct Gated {
    gate: Arc<watch::Sender<Option<bool>>>,
    calls: Arc<AtomicU64>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            gate: Arc::new(watch::channel(None).0),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    fn set(&self, answer: Option<bool>) {
        self.gate.send_replace(answer);
    }
}

impl Store for Gated {
    type Error = StoreDown;
    type Future = Pin<Box<dyn Future<Output = Result<Decision, StoreDown>> + Send>>;

    fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.gate.subscribe();
        Box::pin(async move {
            match *rx.wait_for(Option::is_some).await.unwrap() {
                Some(true) => Ok(MemoryStore::new().check_now(b"k", &limit(), 1)),
                _ => Err(StoreDown),
            }
        })
    }
}

/// Threshold 1, cool-down 10 s on `clock`, timeout 50 ms. Built where it is called: in a
/// multi-thread runtime, that runtime is the layer's for its background tasks.
fn guarded(store: &Gated, clock: &ManualClock) -> Guarded<Gated> {
    Guarded::builder(store.clone(), "runtimes")
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(10)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Opens the circuit with one failure, then cools it down (the next check probes); the gate is
/// left hanging.
async fn opened_and_cooled(store: &Gated, g: &Guarded<Gated>, clock: &ManualClock) {
    store.set(Some(false));
    assert!(matches!(
        g.check(b"k", &limit(), 1).await,
        Err(GuardError::Store(_))
    ));
    assert_eq!(g.circuit_state(), Some(CircuitState::Open));
    store.set(None);
    clock.advance(Duration::from_secs(10));
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn timerless() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap()
}

fn current_thread(timers: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    if timers {
        builder.enable_all();
    }
    builder.build().unwrap()
}

/// On a thread of its own, a current-thread runtime in whose `block_on` a check is sent (polled
/// once) and dropped before its answer (with `ran`, the task it goes on in, if on this runtime,
/// is then run until it waits); the runtime is returned, never driven again, to be dropped by the
/// caller. With `panic`, the thread panics instead of returning it (a caller's bug that says
/// nothing of the store), so that the runtime is dropped by the unwinding.
fn dropped_on_a_side_runtime(
    g: &Guarded<Gated>,
    panic: bool,
    ran: bool,
) -> Option<tokio::runtime::Runtime> {
    let g = g.clone();
    let joined = std::thread::spawn(move || {
        let side = current_thread(true);
        side.block_on(async {
            let mut check = g.check(b"k", &limit(), 1);
            assert!(poll_once(&mut check).is_pending());
            drop(check);
            if ran {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
            }
        });
        if panic {
            panic!("a caller's bug, nothing to do with the store");
        }
        side
    })
    .join();
    assert_eq!(joined.is_err(), panic);
    joined.ok()
}

/// Waits (up to 5 s) until `g`'s circuit is `state`.
async fn until_circuit(g: &Guarded<Gated>, state: CircuitState) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while g.circuit_state() != Some(state) {
        assert!(
            Instant::now() < deadline,
            "still {:?}, not {state:?}",
            g.circuit_state()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A probe whose request is dropped on a current-thread runtime that then goes idle is settled by
/// the store's answer: run on in the layer's (multi-thread) runtime, not left unpolled on the
/// idle one, where the circuit stayed half-open, refusing every check on every runtime, until
/// the probe was taken as lost a cool-down later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_dropped_on_a_runtime_gone_idle_is_settled_by_its_answer() {
    let clock = ManualClock::new();
    let store = Gated::new();
    let g = guarded(&store, &clock);
    opened_and_cooled(&store, &g, &clock).await;
    let side = dropped_on_a_side_runtime(&g, false, false);
    assert_eq!(store.calls.load(Ordering::SeqCst), 2, "the probe was sent");
    assert_eq!(g.circuit_state(), Some(CircuitState::HalfOpen));
    store.set(Some(true));
    until_circuit(&g, CircuitState::Closed).await;
    assert!(g.check(b"k", &limit(), 1).await.is_ok());
    std::thread::spawn(move || drop(side)).join().unwrap();
}

/// A check dropped on a current-thread runtime that then goes idle, over a hanging store: its
/// timeout counts (threshold 1: the circuit opens), as a dropped check's does on the layer's
/// runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_dropped_on_a_runtime_gone_idle_times_out() {
    let clock = ManualClock::new();
    let store = Gated::new();
    let g = guarded(&store, &clock);
    let side = dropped_on_a_side_runtime(&g, false, false);
    until_circuit(&g, CircuitState::Open).await;
    std::thread::spawn(move || drop(side)).join().unwrap();
}

/// A layer built outside any runtime has none of its own: a dropped check runs on in the runtime
/// current at the drop. That runtime dropped by the unwinding of a caller's panic, before it ran
/// the task or while the task waits for the store: the task counts for nothing (a probe is handed
/// on; an ordinary check leaves the circuit closed), where it was counted as a store failure
/// (the probe reopened the circuit for a cool-down, the check opened a healthy one).
#[test]
fn a_task_dropped_by_a_callers_panic_counts_for_nothing() {
    for (probe, ran) in [(true, false), (false, false), (true, true), (false, true)] {
        let clock = ManualClock::new();
        let store = Gated::new();
        let g = guarded(&store, &clock);
        let main = multi_thread();
        if probe {
            main.block_on(opened_and_cooled(&store, &g, &clock));
        }
        assert!(dropped_on_a_side_runtime(&g, true, ran).is_none());
        store.set(Some(true));
        let state = g.circuit_state();
        let next = main.block_on(g.check(b"k", &limit(), 1));
        assert!(next.is_ok(), "probe {probe}, ran {ran}: {next:?}");
        let expected = if probe {
            // Handed on: still open, cooled down; the next check probed and closed it.
            CircuitState::Open
        } else {
            CircuitState::Closed
        };
        assert_eq!(state, Some(expected), "probe {probe}, ran {ran}");
        assert_eq!(g.circuit_state(), Some(CircuitState::Closed));
    }
}

/// A probe sent, answered, and then dropped before its answer was read, on a runtime without
/// timers (a layer built outside any runtime, so that its task runs there): settled by the
/// answer, not by the panic of a timer it no longer needs (which reopened the circuit).
#[test]
fn a_probe_answered_before_its_drop_needs_no_timer() {
    let clock = ManualClock::new();
    let store = Gated::new();
    let g = guarded(&store, &clock);
    let main = multi_thread();
    main.block_on(opened_and_cooled(&store, &g, &clock));
    let mut probe = {
        let _in = main.enter();
        g.check(b"k", &limit(), 1)
    };
    main.block_on(async { assert!(poll_once(&mut probe).is_pending()) });
    store.set(Some(true));
    std::thread::spawn(move || {
        current_thread(false).block_on(async move {
            drop(probe);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
    })
    .join()
    .unwrap();
    assert_eq!(g.circuit_state(), Some(CircuitState::Closed));
}

/// A store that resets as a network store does: the reset is made at its first poll (the
/// command sent), and its reply comes when the gate says; checks answer at once.
#[derive(Clone)]
struct Replying {
    inner: Arc<MemoryStore>,
    reply: Arc<watch::Sender<bool>>,
    checks: Arc<AtomicU64>,
}

impl Store for Replying {
    type Error = StoreDown;
    type Future = std::future::Ready<Result<Decision, StoreDown>>;

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        self.checks.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(self.inner.check_now(key, limit, cost)))
    }
}

impl Reset for Replying {
    type ResetFuture = Pin<Box<dyn Future<Output = Result<(), StoreDown>> + Send>>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        let (inner, key, limit) = (self.inner.clone(), key.to_vec(), limit.clone());
        let mut reply = self.reply.subscribe();
        Box::pin(async move {
            inner.reset_now(&key, &limit);
            let _ = reply.wait_for(|r| *r).await;
            Ok(())
        })
    }
}

/// A login route of one request a minute per `x-user`, reset on success, over a `DenialCache` in
/// front of a store whose resets reply when `reply` says; its recorded metrics; the checks that
/// reached the store.
fn reset_app(
    reply: &Arc<watch::Sender<bool>>,
) -> (Router, metrics_util::debugging::Snapshotter, Arc<AtomicU64>) {
    let checks = Arc::new(AtomicU64::new(0));
    let store = DenialCache::new(
        Replying {
            inner: Arc::new(MemoryStore::new()),
            reply: reply.clone(),
            checks: checks.clone(),
        },
        SystemClock::new(),
    );
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_minute(1).unwrap()).unwrap();
    let policy = Policy::new("login", limit)
        .unwrap()
        .key(ApiKeyHeader::new("x-user").unwrap());
    let (layer, metrics) = common::recorded(|| {
        RateLimitLayer::builder(store, policy)
            .reset_on(|res| res.status().is_success())
            .build()
            .unwrap()
    });
    let app = Router::new()
        .route("/login", get(|| async { StatusCode::NO_CONTENT }))
        .route_layer(layer);
    (app, metrics, checks)
}

fn login() -> http::Request<axum::body::Body> {
    with_header(request("/login"), "x-user", "alice")
}

/// Alice's first login, on a current-thread runtime of its own thread: it succeeds (taking her
/// one unit, which the cache takes to deny her next), its reset is sent, and the response,
/// waiting for the reply, dropped. The runtime is returned, never driven again.
fn login_dropped_on_a_side_runtime(app: &Router) -> tokio::runtime::Runtime {
    let app = app.clone();
    std::thread::spawn(move || {
        let side = current_thread(true);
        side.block_on(async move {
            let mut app = app;
            let mut response = ServiceExt::<http::Request<axum::body::Body>>::ready(&mut app)
                .await
                .unwrap()
                .call(login());
            assert!(poll_once(&mut response).is_pending(), "waits for the reset");
        });
        side
    })
    .join()
    .unwrap()
}

/// Waits (up to 5 s) until the layer has counted one reset of `outcome`.
async fn until_reset(metrics: &metrics_util::debugging::Snapshotter, outcome: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while common::resets(metrics, "login")(outcome) == 0 {
        assert!(Instant::now() < deadline, "no reset counted {outcome}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A `reset_on` reset whose response is dropped on a current-thread runtime that then goes idle
/// is made to its end on the layer's runtime: the denial cache in front of the store forgets the
/// client when it ends, as the store did. Left on the idle runtime, it never ended, and the cache
/// denied the client the store had reset, without asking it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_dropped_on_a_runtime_gone_idle_is_made() {
    let reply = Arc::new(watch::channel(false).0);
    let (app, metrics, checks) = reset_app(&reply);
    let side = login_dropped_on_a_side_runtime(&app);
    reply.send_replace(true);
    until_reset(&metrics, "reset").await;
    let status = app.clone().oneshot(login()).await.unwrap().status();
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "alice, reset, still denied; the store asked {} times",
        checks.load(Ordering::SeqCst)
    );
    std::thread::spawn(move || drop(side)).join().unwrap();
}

/// The same reset over a store that never replies times out (and is counted so) within the
/// layer's timeout: its timer is made where it runs, not on the idle runtime, where it never
/// fired and the reset waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_dropped_on_a_runtime_gone_idle_times_out() {
    let reply = Arc::new(watch::channel(false).0);
    let (app, metrics, _) = reset_app(&reply);
    let side = login_dropped_on_a_side_runtime(&app);
    until_reset(&metrics, "timeout").await;
    std::thread::spawn(move || drop(side)).join().unwrap();
}

/// The same reset, its response's runtime dropped before the store replies: made and counted
/// (its timer, made on the dropped runtime, panicked as that runtime shut down, and the reset
/// was never counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_dropped_on_a_runtime_then_dropped_is_made() {
    let reply = Arc::new(watch::channel(false).0);
    let (app, metrics, _) = reset_app(&reply);
    let side = login_dropped_on_a_side_runtime(&app);
    std::thread::spawn(move || drop(side)).join().unwrap();
    reply.send_replace(true);
    until_reset(&metrics, "reset").await;
}

/// A layer built on a runtime that shuts down while a request is served on another, running
/// one: the request's `reset_on` reset, and a check dropped there, run on the running one (on
/// the layer's, they were dropped with it: the reset never counted, the response's fields not
/// the full quota; the check's timeout never counted).
#[test]
fn the_layers_runtime_shut_down_takes_no_task_of_a_running_one() {
    let reply = Arc::new(watch::channel(false).0);
    let first = multi_thread();
    let (app, metrics, _) = first.block_on(async { reset_app(&reply) });
    let clock = ManualClock::new();
    let store = Gated::new();
    let g = first.block_on(async { guarded(&store, &clock) });
    let serving = multi_thread();
    let response = serving.spawn(app.oneshot(login()));
    serving.block_on(async {
        let mut check = g.check(b"k", &limit(), 1);
        assert!(poll_once(&mut check).is_pending());
    });
    drop(first);
    reply.send_replace(true);
    let response = serving.block_on(response).unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    serving.block_on(until_reset(&metrics, "reset"));
    serving.block_on(until_circuit(&g, CircuitState::Open));
}

/// A layer built on a multi-thread runtime without timers, its requests served on one with
/// them: a check dropped before its answer runs on where timers are (on the layer's runtime,
/// making its timer panicked, which counted as a store failure and opened a healthy circuit).
#[test]
fn a_layer_built_on_a_runtime_without_timers_settles_on_the_serving_one() {
    let clock = ManualClock::new();
    let store = Gated::new();
    let timerless = timerless();
    let g = {
        let _in = timerless.enter();
        guarded(&store, &clock)
    };
    multi_thread().block_on(async {
        let mut check = g.check(b"k", &limit(), 1);
        assert!(poll_once(&mut check).is_pending());
        drop(check);
        tokio::time::sleep(Duration::from_millis(10)).await;
        store.set(Some(true));
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    assert_eq!(g.circuit_state(), Some(CircuitState::Closed));
}

/// A check in flight on a multi-thread runtime that shuts down, the layer's own runtime running:
/// the check, dropped by that shutdown, runs on in the layer's runtime (refused by the runtime
/// shutting down, it was dropped unrun, and its timeout over a hanging store never counted).
#[test]
fn a_check_dropped_by_its_runtime_s_shutdown_runs_on_in_the_layer_s() {
    let clock = ManualClock::new();
    let store = Gated::new();
    let main = multi_thread();
    let g = main.block_on(async { guarded(&store, &clock) });
    let serving = multi_thread();
    let check = g.clone();
    serving.spawn(async move {
        let _ = check.check(b"k", &limit(), 1).await;
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.calls.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the check was never sent");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(serving);
    main.block_on(until_circuit(&g, CircuitState::Open));
}

/// A request served, through its handle, on the layer's multi-thread runtime once that has shut
/// down: its reset, sent, is refused by every runtime at hand, not waited for, and counted as
/// timed out; the response is answered (the reset, awaited in place, panicked at its timer on the
/// runtime shutting down).
#[test]
fn a_reset_refused_by_every_runtime_is_counted_and_the_response_answered() {
    let reply = Arc::new(watch::channel(false).0);
    let rt = multi_thread();
    let (app, metrics, _) = rt.block_on(async { reset_app(&reply) });
    let handle = rt.handle().clone();
    drop(rt);
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handle.block_on(async { app.oneshot(login()).await.map(|r| r.status()) })
    }));
    assert_eq!(
        served.expect("the response panicked").unwrap(),
        StatusCode::NO_CONTENT
    );
    // Its calls were sent (its first poll), its answer not waited for: counted once, as timed
    // out.
    let resets = common::resets(&metrics, "login");
    assert_eq!(
        ["reset", "no_key", "timeout", "error", "skipped"].map(resets),
        [0, 0, 1, 0, 0]
    );
}
