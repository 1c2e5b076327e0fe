//! The layer's `call` needs no Tokio runtime, over the Redis store too: only the response
//! future's polls do. `call` polls the store's check once in place; the Redis store's check,
//! polled there outside a runtime, yields instead of starting its timer (which panicked), and
//! goes on at the response future's first poll, inside the runtime that awaits it.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use ratelimit_core::{DenialCache, Store, SystemClock};
use ratelimit_e2e::{fault_layer, store_builder};
use ratelimit_redis::{Coalescing, RedisStoreError};
use redis_harness::RedisServer;
use tower::{Layer, Service};
use tower_ratelimit::{FailurePolicy, Verdict, VerdictKind};

/// Makes `n` requests' calls on a thread with no runtime, then awaits their responses here, and
/// returns the requests left (`r`) in the `RateLimit` field of each.
async fn called_outside<St>(store: &St, name: &str, n: usize) -> Vec<u64>
where
    St: Store + Clone,
    St::Future: Unpin,
{
    let layer = fault_layer(
        store,
        name,
        100,
        FailurePolicy::fail_closed(Duration::from_secs(1)),
        Duration::from_secs(1),
    );
    let mut svc = layer.layer(tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let futures = std::thread::spawn(move || {
        assert!(tokio::runtime::Handle::try_current().is_err());
        (0..n)
            .map(|_| {
                let ready = svc.poll_ready(&mut Context::from_waker(Waker::noop()));
                assert!(matches!(ready, Poll::Ready(Ok(()))));
                svc.call(ratelimit_e2e::request_from(([10, 0, 0, 1], 1).into()))
            })
            .collect::<Vec<_>>()
    })
    .join()
    .expect("the calls are made outside a runtime without a panic");
    let mut left = Vec::new();
    for fut in futures {
        let res = fut.await.unwrap();
        assert_eq!(res.status(), 200);
        let verdict = res.extensions().get::<Verdict>().unwrap();
        assert_eq!(verdict.kind(), VerdictKind::Allowed);
        let field = res.headers()["ratelimit"].to_str().unwrap();
        let r = field
            .split(';')
            .find_map(|p| p.strip_prefix("r="))
            .unwrap_or_else(|| panic!("no r in {field}"));
        left.push(r.parse().unwrap());
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_called_outside_a_runtime_are_decided_by_redis() {
    let redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.unwrap();
    // Each answer comes from Redis, in the order the checks were polled: the limit of 100
    // counted down, with nothing failed open or closed.
    assert_eq!(called_outside(&store, "plain", 3).await, [99, 98, 97]);
    // The same through the wrappers, whose first poll can answer at once (a cached denial) or
    // go to Redis.
    let cached = Arc::new(DenialCache::new(store.clone(), SystemClock::new()));
    assert_eq!(called_outside(&cached, "cached", 2).await, [99, 98]);
    let coalescing = Coalescing::new(store.clone());
    assert_eq!(called_outside(&coalescing, "coalesced", 2).await, [99, 98]);
}

/// A check polled only outside a runtime (an executor other than Tokio's) is a typed error, not a
/// panic: it yields once, then says why it cannot go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_polled_only_outside_a_runtime_is_a_typed_error() {
    let redis = RedisServer::start();
    let store = store_builder(&redis.url()).build().await.unwrap();
    let limit = ratelimit_core::Limit::single(
        ratelimit_core::Algorithm::TokenBucket,
        ratelimit_core::Quota::per_minute(10).unwrap(),
    )
    .unwrap();
    let polls = std::thread::spawn(move || {
        let mut check = store.check(b"k", &limit, 1);
        let mut cx = Context::from_waker(Waker::noop());
        let first = check.as_mut().poll(&mut cx);
        let second = check.as_mut().poll(&mut cx);
        (first.is_pending(), second)
    })
    .join()
    .expect("no panic outside a runtime");
    assert!(polls.0, "the first poll yields");
    assert!(
        matches!(polls.1, Poll::Ready(Err(RedisStoreError::NoRuntime))),
        "{:?}",
        polls.1
    );
}
