//! `Guarded` over a real Redis, checked without the layer: frozen (SIGSTOP), the checks time out
//! at the guard's timeout and then, the circuit open, fail at once without asking it; thawed,
//! one probe after the cool-down closes the circuit; killed, its checks fail (connection
//! refused) and open it again; restarted, a probe closes it.
//!
//! The breaker's clock is a `ManualClock`, moved by the test, so the cool-down is exact; the
//! timeouts are real.

use std::time::{Duration, Instant};

use ratelimit_core::{ManualClock, Store};
use ratelimit_e2e::{per_minute, store_builder, wait_until};
use redis_harness::RedisServer;
use tower_ratelimit::{CircuitBreaker, CircuitState, GuardError, Guarded};

const TIMEOUT: Duration = Duration::from_millis(50);
const COOL_DOWN: Duration = Duration::from_secs(10);
/// What a check may take beyond the timeout on a loaded test machine.
const MARGIN: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_redis_fails_fast_while_down_and_recovers_by_itself() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new();
    let store = Guarded::builder(
        store_builder(&redis.url()).build().await.expect("store"),
        "guarded",
    )
    .timeout(TIMEOUT)
    .circuit_breaker(CircuitBreaker::new(3, COOL_DOWN).expect("breaker"))
    .clock(clock.clone())
    .build()
    .expect("guarded store");
    let limit = per_minute(1_000);
    let check = || store.check(b"user:1", &limit, 1);

    // Up: decisions.
    for _ in 0..3 {
        assert!(check().await.expect("a decision").is_allowed());
    }

    // Frozen: each check is cut at the timeout, and three in a row open the circuit.
    redis.pause();
    for i in 0..3 {
        let started = Instant::now();
        let e = check().await.expect_err("no answer from a frozen Redis");
        let took = started.elapsed();
        assert!(matches!(e, GuardError::TimedOut { .. }), "check {i}: {e:?}");
        assert!(
            took >= TIMEOUT && took < TIMEOUT + MARGIN,
            "check {i}: {took:?}"
        );
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    // Open: answered without asking the store, with the cool-down left.
    clock.advance(Duration::from_secs(4));
    let e = check().await.expect_err("the circuit is open");
    assert!(
        matches!(e, GuardError::CircuitOpen { retry_in } if retry_in == Duration::from_secs(6)),
        "{e:?}"
    );

    // Thawed, and cooled down: the probe closes the circuit.
    redis.resume();
    clock.advance(Duration::from_secs(6));
    // The frozen connection's replies to the checks given up come back first: the store throws
    // them away, and the probe gets its own answer. (A probe the thawing server answers after
    // the 50 ms timeout, on a loaded machine, opens the circuit for another cool-down: probed
    // again.)
    let closed = wait_until(Duration::from_secs(5), || async {
        match check().await {
            Ok(d) => {
                assert!(d.is_allowed(), "{d:?}");
                true
            }
            Err(GuardError::TimedOut { .. }) => {
                clock.advance(COOL_DOWN);
                false
            }
            Err(e) => panic!("a thawed server: {e:?}"),
        }
    })
    .await;
    assert!(
        closed.is_some(),
        "a probe closed the circuit after the thaw"
    );
    assert_eq!(store.circuit_state(), Some(CircuitState::Closed));

    // Killed: connection refused (or, for a check sent before the client saw its connection
    // close, the timeout); three failures open the circuit again.
    redis.kill();
    let opened = wait_until(Duration::from_secs(5), || async {
        match check().await {
            Err(GuardError::CircuitOpen { .. }) => true,
            Err(GuardError::Store(_) | GuardError::TimedOut { .. }) => false,
            other => panic!("a killed server: {other:?}"),
        }
    })
    .await;
    assert!(opened.is_some(), "the circuit opened over a dead Redis");

    // Restarted, and cooled down: a probe closes it again.
    redis.restart();
    clock.advance(COOL_DOWN);
    let closed = wait_until(Duration::from_secs(5), || async {
        if check().await.is_ok_and(|d| d.is_allowed()) {
            return true;
        }
        // A probe that failed (the store reconnecting) opens it for another cool-down.
        clock.advance(COOL_DOWN);
        false
    })
    .await;
    assert!(
        closed.is_some(),
        "a probe closed the circuit after the restart"
    );
    assert_eq!(store.circuit_state(), Some(CircuitState::Closed));
}
