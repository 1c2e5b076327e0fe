//! `Guarded`: the layer's timeout and circuit breaker around a store checked without the layer.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use ratelimit_core::{Algorithm, DenialCache, Limit, ManualClock, Quota, Store};
use tower_ratelimit::{CircuitBreaker, CircuitState, Error, GuardError, Guarded};

fn per_minute(n: u64) -> Limit {
    Limit::single(Algorithm::TokenBucket, Quota::per_minute(n).unwrap()).unwrap()
}

/// Whether `store` admits a request of `user:1` under 100 a minute (a failure panics).
async fn allowed<St: Store>(store: &Guarded<St>) -> bool
where
    St::Error: std::fmt::Debug,
{
    store
        .check(b"user:1", &per_minute(100), 1)
        .await
        .unwrap()
        .is_allowed()
}

/// `store` guarded with a breaker of 3 failures and a 10 s cool-down on `clock`, with the
/// recorder of its metrics.
fn guarded<St: Store>(
    store: St,
    clock: &ManualClock,
) -> (Guarded<St>, metrics_util::debugging::Snapshotter) {
    recorded(|| {
        Guarded::builder(store, "chat")
            .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap()
    })
}

/// `store` guarded as a job dispatcher's: a 50 ms timeout, and a breaker of 3 failures and a
/// 10 s cool-down on `clock`.
fn jobs<St: Store>(store: St, clock: &ManualClock) -> Guarded<St> {
    Guarded::builder(store, "jobs")
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Three checks of `store` (as [`jobs`] guards it), each cut at the timeout: its circuit opens.
async fn three_timeouts<St: Store>(store: &Guarded<St>)
where
    St::Error: std::fmt::Debug,
{
    for _ in 0..3 {
        assert!(matches!(
            store.check(b"job", &per_minute(100), 1).await,
            Err(GuardError::TimedOut { .. })
        ));
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
}

/// A memory store behind a switch, guarded as [`guarded`] says, on a clock of its own.
fn switched() -> (
    ManualClock,
    Arc<SwitchStore>,
    Guarded<Arc<SwitchStore>>,
    metrics_util::debugging::Snapshotter,
) {
    let clock = ManualClock::new();
    let (_, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let (store, snapshotter) = guarded(switch.clone(), &clock);
    (clock, switch, store, snapshotter)
}

#[tokio::test]
async fn a_healthy_stores_decisions_pass_through_and_are_counted() {
    let (_, switch, store, snapshotter) = switched();
    let limit = per_minute(2);
    let mut allowed = 0;
    for _ in 0..5 {
        let d = store.check(b"user:1", &limit, 1).await.unwrap();
        allowed += usize::from(d.is_allowed());
    }
    assert_eq!(allowed, 2);
    assert_eq!(switch.calls(), 5);
    assert_eq!(store.circuit_state(), Some(CircuitState::Closed));
    let m = Recorded::take(&snapshotter);
    assert_eq!(m.outcome("chat", "allowed"), 2);
    assert_eq!(m.outcome("chat", "denied"), 3);
    assert_eq!(
        m.histogram_len("ratelimit_store_duration_seconds", &[("policy", "chat")]),
        5
    );
}

#[tokio::test]
async fn failures_open_the_circuit_which_a_probe_closes_after_the_cool_down() {
    let (clock, switch, store, snapshotter) = switched();
    let limit = per_minute(100);
    switch.set_down(true);
    for _ in 0..3 {
        let e = store.check(b"user:1", &limit, 1).await.unwrap_err();
        assert!(matches!(e, GuardError::Store(StoreDown)), "{e:?}");
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    // Open: not asked, and told when it will be.
    clock.advance(Duration::from_secs(4));
    for _ in 0..5 {
        let e = store.check(b"user:1", &limit, 1).await.unwrap_err();
        let GuardError::CircuitOpen { retry_in } = e else {
            panic!("{e:?}");
        };
        assert_eq!(retry_in, Duration::from_secs(6));
    }
    assert_eq!(switch.calls(), 3);
    // Cooled down: one probe; it fails, and the circuit opens again.
    clock.advance(Duration::from_secs(6));
    assert!(matches!(
        store.check(b"user:1", &limit, 1).await,
        Err(GuardError::Store(_))
    ));
    assert_eq!(switch.calls(), 4);
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    // Back up: the next probe closes it.
    switch.set_down(false);
    clock.advance(Duration::from_secs(10));
    assert!(allowed(&store).await);
    assert_eq!(store.circuit_state(), Some(CircuitState::Closed));
    assert!(allowed(&store).await);
    assert_eq!(switch.calls(), 6);
    let m = Recorded::take(&snapshotter);
    let errors = |kind| {
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "chat"), ("kind", kind)],
        )
    };
    assert_eq!((errors("error"), errors("circuit_open")), (4, 5));
    assert_eq!(
        m.gauge("ratelimit_circuit_state", &[("policy", "chat")]),
        Some(0.0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_is_cut_at_the_timeout_and_opens_the_circuit() {
    let clock = ManualClock::new();
    let hanging = Arc::new(HangingStore::default());
    let (store, snapshotter) = recorded(|| {
        Guarded::builder(hanging.clone(), "jobs")
            .timeout(Duration::from_millis(20))
            .circuit_breaker(CircuitBreaker::new(2, Duration::from_secs(10)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap()
    });
    let limit = per_minute(100);
    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        let e = store.check(b"job", &limit, 1).await.unwrap_err();
        assert!(
            matches!(e, GuardError::TimedOut { timeout } if timeout == Duration::from_millis(20)),
            "{e:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(20));
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    // Open: answered at once, without asking the hanging store.
    let started = tokio::time::Instant::now();
    assert!(matches!(
        store.check(b"job", &limit, 1).await,
        Err(GuardError::CircuitOpen { .. })
    ));
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(hanging.calls.load(Ordering::SeqCst), 2);
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "jobs"), ("kind", "timeout")]
        ),
        2
    );
}

/// Checks whose callers give up before the timeout still count: over a hanging store they open
/// the circuit, as under the layer.
#[tokio::test(start_paused = true)]
async fn checks_dropped_before_the_timeout_still_open_the_circuit() {
    let clock = ManualClock::new();
    let store = jobs(Arc::new(HangingStore::default()), &clock);
    let limit = per_minute(100);
    for _ in 0..3 {
        let given_up =
            tokio::time::timeout(Duration::from_millis(5), store.check(b"job", &limit, 1)).await;
        assert!(given_up.is_err());
    }
    // The dropped checks run on to the timeout in tasks of their own.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    assert!(matches!(
        store.check(b"job", &limit, 1).await,
        Err(GuardError::CircuitOpen { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn without_a_breaker_every_check_asks_the_store_within_the_timeout() {
    let hanging = Arc::new(HangingStore::default());
    let store = Guarded::builder(hanging.clone(), "jobs")
        .no_circuit_breaker()
        .build()
        .unwrap();
    let limit = per_minute(100);
    for _ in 0..5 {
        assert!(matches!(
            store.check(b"job", &limit, 1).await,
            Err(GuardError::TimedOut { .. })
        ));
    }
    assert_eq!(hanging.calls.load(Ordering::SeqCst), 5);
    assert_eq!(store.circuit_state(), None);
}

/// A check is sent at its first poll, and its timeout counts from there: checks made together and
/// awaited in turn (a dispatcher's batch) each have the whole timeout for the store's answer,
/// with and without a breaker. Before, the timeout counted from the check's making: over a store
/// answering each in 20 ms under a 50 ms timeout, the third of six timed out after 10 ms and the
/// rest at once, and the timeouts opened the circuit over a healthy store.
#[tokio::test(start_paused = true)]
async fn checks_made_together_and_awaited_in_turn_each_have_the_whole_timeout() {
    let limit = per_minute(100);
    for breaker in [true, false] {
        let clock = ManualClock::new();
        let (_, memory) = store();
        let switch = Arc::new(SwitchStore::new(memory));
        // Each answered 20 ms after its first poll.
        switch.delay_ms.store(20, Ordering::SeqCst);
        let store = if breaker {
            jobs(switch.clone(), &clock)
        } else {
            Guarded::builder(switch.clone(), "jobs")
                .timeout(Duration::from_millis(50))
                .no_circuit_breaker()
                .build()
                .unwrap()
        };
        let keys: Vec<String> = (0..6).map(|i| format!("job:{i}")).collect();
        let checks: Vec<_> = keys
            .iter()
            .map(|k| store.check(k.as_bytes(), &limit, 1))
            .collect();
        let mut outcomes = Vec::new();
        for check in checks {
            let start = tokio::time::Instant::now();
            let answer = check.await;
            let answer = match answer {
                Ok(d) => format!("allowed: {}", d.is_allowed()),
                Err(e) => e.to_string(),
            };
            outcomes.push((start.elapsed().as_millis(), answer));
        }
        let expected: Vec<_> = (0..6).map(|_| (20, "allowed: true".to_owned())).collect();
        assert_eq!(outcomes, expected, "breaker {breaker}");
        assert_eq!(
            store.circuit_state(),
            breaker.then_some(CircuitState::Closed)
        );
    }
}

/// A check made before its circuit closed and sent (first polled) after it counts as a check of
/// the closed circuit: its failure counts, as a failure of a check made after the close. The
/// breaker ignores only failures of checks sent before the last close (a late answer from the
/// outage the close ended); before, a `Guarded` check read what it had seen when it was made.
#[tokio::test]
async fn a_check_made_before_a_close_and_sent_after_it_counts() {
    /// The switch's check made at the first poll, as a network store sends its command then.
    struct AtFirstPoll(Arc<SwitchStore>);
    impl Store for AtFirstPoll {
        type Error = StoreDown;
        type Future = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<ratelimit_core::Decision, StoreDown>>
                    + Send,
            >,
        >;
        fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
            let (switch, key, limit) = (self.0.clone(), key.to_vec(), limit.clone());
            Box::pin(async move { switch.check(&key, &limit, cost).await })
        }
    }
    for made_after_the_close in [false, true] {
        let clock = ManualClock::new();
        let (_, memory) = store();
        let switch = Arc::new(SwitchStore::new(memory));
        let store = Guarded::builder(AtFirstPoll(switch.clone()), "jobs")
            .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(5)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
        let limit = per_minute(100);
        let early = store.check(b"job", &limit, 1);
        // An outage: the circuit opens; a probe after the cool-down closes it.
        switch.set_down(true);
        assert!(store.check(b"job", &limit, 1).await.is_err());
        assert_eq!(store.circuit_state(), Some(CircuitState::Open));
        clock.advance(Duration::from_secs(5));
        switch.set_down(false);
        assert!(store.check(b"job", &limit, 1).await.is_ok());
        assert_eq!(store.circuit_state(), Some(CircuitState::Closed));
        // Down again: the check sent now fails, and opens the circuit.
        switch.set_down(true);
        let check = if made_after_the_close {
            store.check(b"job", &limit, 1)
        } else {
            early
        };
        assert!(check.await.is_err());
        assert_eq!(
            store.circuit_state(),
            Some(CircuitState::Open),
            "made after the close: {made_after_the_close}"
        );
    }
}

/// A check made outside any runtime (its timer is made at the first poll) is answered once
/// polled inside one.
#[test]
fn a_check_made_outside_a_runtime_is_answered_inside_one() {
    let clock = ManualClock::new();
    let (_, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let limit = per_minute(100);
    for breaker in [true, false] {
        let builder = Guarded::builder(switch.clone(), "jobs").clock(clock.clone());
        let store = if breaker {
            builder.build()
        } else {
            builder.no_circuit_breaker().build()
        }
        .unwrap();
        let check = store.check(b"job", &limit, 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(rt.block_on(check).unwrap().is_allowed());
    }
}

/// While the circuit is open, a denial cache inside the wrapper still answers what it holds: a
/// client known to be over its limit is denied, not told that the store is away.
#[tokio::test]
async fn an_open_circuit_still_answers_from_a_cache_inside() {
    let clock = ManualClock::new();
    let (store_clock, memory) = store();
    let switch = Arc::new(SwitchStore::new(memory));
    let cached = DenialCache::new(switch.clone(), store_clock.clone());
    let (store, snapshotter) = guarded(cached, &clock);
    let limit = per_minute(1);
    assert!(
        store
            .check(b"abuser", &limit, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(store.check(b"abuser", &limit, 1).await.unwrap().is_denied());
    switch.set_down(true);
    for _ in 0..3 {
        assert!(store.check(b"user:2", &limit, 1).await.is_err());
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    // A check made then and dropped unpolled is counted for nothing, as one the store would
    // have answered (a snapshot takes the counts so far).
    let _ = Recorded::take(&snapshotter);
    drop(store.check(b"abuser", &limit, 1));
    assert_eq!(Recorded::take(&snapshotter).outcome("chat", "denied"), 0);
    let d = store.check(b"abuser", &limit, 1).await.unwrap();
    assert!(d.is_denied() && d.is_cached());
    assert_eq!(Recorded::take(&snapshotter).outcome("chat", "denied"), 1);
    assert!(matches!(
        store.check(b"user:2", &limit, 1).await,
        Err(GuardError::CircuitOpen { .. })
    ));
}

#[test]
fn settings_out_of_range_are_typed_errors() {
    let (_, memory) = store();
    for timeout in [Duration::ZERO, Duration::from_secs(3_601)] {
        let e = Guarded::builder(memory.clone(), "ok")
            .timeout(timeout)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidSetting {
                    name: "timeout",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    for name in ["", "a\nb", &"x".repeat(65)] {
        let e = Guarded::builder(memory.clone(), name).build().unwrap_err();
        assert!(matches!(e, Error::InvalidPolicyName { .. }), "{e:?}");
    }
}

/// A store whose check sends nothing until it is first polled, as a network store's does (the
/// Redis store's command goes out at the first poll), and then never answers.
#[derive(Debug, Default)]
struct LazyStore {
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Store for LazyStore {
    type Error = StoreDown;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ratelimit_core::Decision, StoreDown>> + Send>,
    >;

    fn check(&self, _key: &[u8], _limit: &Limit, _cost: u64) -> Self::Future {
        let sent = self.sent.clone();
        Box::pin(async move {
            sent.fetch_add(1, Ordering::SeqCst);
            std::future::pending().await
        })
    }
}

/// A check dropped before its first poll (a `select!` that took another branch) was never sent:
/// with a breaker as without, the store is not asked for it, and a check so dropped after the
/// cool-down takes no probe (the breaker admits a check when it is sent): the next check probes.
#[tokio::test(start_paused = true)]
async fn a_check_dropped_before_its_first_poll_asks_the_store_nothing() {
    let limit = per_minute(100);
    for with_breaker in [false, true] {
        let lazy = Arc::new(LazyStore::default());
        let clock = ManualClock::new();
        let builder = Guarded::builder(lazy.clone(), "jobs")
            .timeout(Duration::from_millis(50))
            .clock(clock.clone());
        let builder = if with_breaker {
            builder.circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
        } else {
            builder.no_circuit_breaker()
        };
        let store = builder.build().unwrap();
        drop(store.check(b"job", &limit, 1));
        // Long enough for a check run on by a drop to be sent and cut at its timeout.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            lazy.sent.load(Ordering::SeqCst),
            0,
            "breaker: {with_breaker}"
        );
        if !with_breaker {
            continue;
        }
        // Three checks sent and cut open the circuit; after the cool-down, a check is dropped
        // unpolled: not sent, and the next check probes.
        three_timeouts(&store).await;
        clock.advance(Duration::from_secs(10));
        drop(store.check(b"job", &limit, 1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lazy.sent.load(Ordering::SeqCst), 3);
        assert!(matches!(
            store.check(b"job", &limit, 1).await,
            Err(GuardError::TimedOut { .. })
        ));
        assert_eq!(lazy.sent.load(Ordering::SeqCst), 4, "the next check probed");
    }
}

/// A check dropped while it waits for the store is counted in `ratelimit_checks_cancelled_total`,
/// as under the layer; one answered, or dropped before it was sent, is not.
#[tokio::test(start_paused = true)]
async fn a_check_dropped_while_waiting_is_counted_as_cancelled() {
    for with_breaker in [false, true] {
        let lazy = Arc::new(LazyStore::default());
        let (store, snapshotter) = recorded(|| {
            let builder = Guarded::builder(lazy.clone(), "jobs").timeout(Duration::from_millis(50));
            let builder = if with_breaker {
                builder
            } else {
                builder.no_circuit_breaker()
            };
            builder.build().unwrap()
        });
        let limit = per_minute(100);
        for _ in 0..2 {
            let given_up =
                tokio::time::timeout(Duration::from_millis(5), store.check(b"job", &limit, 1))
                    .await;
            assert!(given_up.is_err());
        }
        drop(store.check(b"job", &limit, 1));
        assert!(matches!(
            store.check(b"job", &limit, 1).await,
            Err(GuardError::TimedOut { .. })
        ));
        let m = Recorded::take(&snapshotter);
        assert_eq!(
            m.counter("ratelimit_checks_cancelled_total", &[("policy", "jobs")]),
            2,
            "breaker: {with_breaker}"
        );
    }
}

/// A check dropped unpolled as its caller panics never reached the store: no failure of the
/// store's (the circuit is not opened again for a cool-down), and, made after the cool-down, it
/// took no probe: the next check probes.
#[tokio::test(start_paused = true)]
async fn a_probe_dropped_unpolled_by_a_callers_panic_is_handed_on() {
    let lazy = Arc::new(LazyStore::default());
    let clock = ManualClock::new();
    let store = jobs(lazy.clone(), &clock);
    let limit = per_minute(100);
    three_timeouts(&store).await;
    clock.advance(Duration::from_secs(10));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _probe = store.check(b"job", &limit, 1);
        panic!("a bug of the caller's, before the probe is polled");
    }));
    assert!(caught.is_err());
    assert_eq!(lazy.sent.load(Ordering::SeqCst), 3);
    assert!(matches!(
        store.check(b"job", &limit, 1).await,
        Err(GuardError::TimedOut { .. })
    ));
    assert_eq!(lazy.sent.load(Ordering::SeqCst), 4, "the next check probed");
}

/// The first poll of `check`, which sends it: whether it is still waiting after it.
async fn poll_once<F: std::future::Future + Unpin>(check: &mut F) -> bool {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::pin::Pin::new(&mut *check).poll(cx).is_pending())
    })
    .await
}

/// Checks made while the circuit was closed and sent (first polled) after it opened are checks
/// of an open circuit: they fail at once without asking the store, so that a batch of checks
/// made together over a hanging store costs `failure_threshold` timeouts, not one per check.
#[tokio::test(start_paused = true)]
async fn checks_made_before_the_circuit_opened_and_sent_after_do_not_ask_the_store() {
    let lazy = Arc::new(LazyStore::default());
    let clock = ManualClock::new();
    let store = jobs(lazy.clone(), &clock);
    let limit = per_minute(100);
    let checks: Vec<_> = (0..6).map(|_| store.check(b"job", &limit, 1)).collect();
    let mut outcomes = Vec::new();
    for check in checks {
        let start = tokio::time::Instant::now();
        let kind = match check.await {
            Ok(_) => "answered",
            Err(GuardError::TimedOut { .. }) => "timed out",
            Err(GuardError::CircuitOpen { retry_in }) => {
                assert_eq!(retry_in, Duration::from_secs(10));
                "circuit open"
            }
            Err(GuardError::Store(_)) => "failed",
            Err(_) => "other",
        };
        outcomes.push((start.elapsed().as_millis(), kind));
    }
    assert_eq!(
        outcomes,
        [
            (50, "timed out"),
            (50, "timed out"),
            (50, "timed out"),
            (0, "circuit open"),
            (0, "circuit open"),
            (0, "circuit open"),
        ]
    );
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    assert_eq!(
        lazy.sent.load(Ordering::SeqCst),
        3,
        "checks sent to the store"
    );
}

/// A probe made a while before it is sent (first polled) is not taken as lost while it still
/// waits within its timeout, counted from its sending: no second probe goes out beside it.
#[tokio::test(start_paused = true)]
async fn a_probe_sent_late_is_not_doubled_while_it_waits() {
    let lazy = Arc::new(LazyStore::default());
    let clock = ManualClock::new();
    // A probe is taken as lost after max(cool-down, 2 × timeout) = 2 s without an answer.
    let store = Guarded::builder(lazy.clone(), "jobs")
        .timeout(Duration::from_secs(1))
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(2)).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let limit = per_minute(100);
    let advance = |d: Duration| {
        clock.advance(d);
        tokio::time::advance(d)
    };
    assert!(matches!(
        store.check(b"job", &limit, 1).await,
        Err(GuardError::TimedOut { .. })
    ));
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    advance(Duration::from_secs(2)).await;
    let mut probe = store.check(b"job", &limit, 1);
    advance(Duration::from_millis(1_500)).await;
    assert!(poll_once(&mut probe).await);
    assert_eq!(lazy.sent.load(Ordering::SeqCst), 2, "the probe is sent");
    // 0.6 s into the probe's 1 s timeout, 2.1 s after it was made.
    advance(Duration::from_millis(600)).await;
    let other = store.check(b"job", &limit, 1).await;
    assert_eq!(
        lazy.sent.load(Ordering::SeqCst),
        2,
        "a second probe was sent"
    );
    assert!(
        matches!(other, Err(GuardError::CircuitOpen { retry_in }) if retry_in.is_zero()),
        "{other:?}"
    );
    assert!(matches!(probe.await, Err(GuardError::TimedOut { .. })));
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
}

/// Failures count in a row only within a cool-down of each other, to the microsecond: two
/// failures a cool-down and 1 µs apart do not open a circuit of two failures; two exactly a
/// cool-down apart do.
#[tokio::test]
async fn failures_count_in_a_row_within_a_cool_down_to_the_microsecond() {
    for cool_down in [Duration::from_millis(1), Duration::from_secs(5)] {
        for (apart, opens) in [
            (cool_down + Duration::from_micros(1), false),
            (cool_down + Duration::from_micros(999), false),
            (cool_down, true),
        ] {
            let clock = ManualClock::new();
            let (_, memory) = store();
            let switch = Arc::new(SwitchStore::new(memory));
            switch.set_down(true);
            let store = Guarded::builder(switch.clone(), "jobs")
                .circuit_breaker(CircuitBreaker::new(2, cool_down).unwrap())
                .clock(clock.clone())
                .build()
                .unwrap();
            let limit = per_minute(100);
            // Not on a whole millisecond, so that truncating to one would move it.
            clock.advance(Duration::from_micros(700));
            assert!(store.check(b"job", &limit, 1).await.is_err());
            clock.advance(apart);
            assert!(store.check(b"job", &limit, 1).await.is_err());
            let expected = if opens {
                CircuitState::Open
            } else {
                CircuitState::Closed
            };
            assert_eq!(
                store.circuit_state(),
                Some(expected),
                "two failures {apart:?} apart, cool-down {cool_down:?}"
            );
        }
    }
}

/// Failures count in a row whatever the clock reads: their times are kept modulo 2⁴⁴ µs (about
/// 203 days), and a circuit with no failure counted (its word 0) in the upper half of that
/// cycle (2026-10-01, say) still opens after the threshold; so does one whose last failure came
/// 120 days before the streak, with no success since.
#[tokio::test]
async fn failures_open_the_circuit_at_any_time_of_the_clock() {
    for (start_micros, idle_before) in [
        (1_790_812_800_000_000, None),
        (1_000_000, Some(Duration::from_secs(120 * 86_400))),
        ((1 << 44) - 3_000, None),
    ] {
        let clock = ManualClock::starting_at(ratelimit_core::Timestamp::from_micros(start_micros));
        let (_, memory) = store();
        let switch = Arc::new(SwitchStore::new(memory));
        switch.set_down(true);
        let store = Guarded::builder(switch.clone(), "jobs")
            .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
        let limit = per_minute(100);
        if let Some(idle) = idle_before {
            assert!(store.check(b"job", &limit, 1).await.is_err());
            clock.advance(idle);
        }
        for _ in 0..3 {
            assert!(store.check(b"job", &limit, 1).await.is_err());
            clock.advance(Duration::from_millis(5));
        }
        assert_eq!(
            store.circuit_state(),
            Some(CircuitState::Open),
            "clock from {start_micros} µs, idle {idle_before:?}"
        );
    }
}

/// A check made while its circuit is open is not sent (a store such as the in-memory one counts
/// a check as it is made), and is answered `CircuitOpen` as the circuit stands when it is first
/// polled: dropped unpolled it counts for nothing, and polled after the cool-down it says that
/// the next check asks the store (`retry_in` zero), not the cool-down it was made in.
#[tokio::test]
async fn a_check_made_while_open_is_told_as_the_circuit_stands_when_polled() {
    let (clock, switch, store, snapshotter) = switched();
    let limit = per_minute(100);
    switch.set_down(true);
    for _ in 0..3 {
        assert!(store.check(b"user:1", &limit, 1).await.is_err());
    }
    assert_eq!(store.circuit_state(), Some(CircuitState::Open));
    let calls = switch.calls();
    drop(store.check(b"user:1", &limit, 1));
    let made_while_open = store.check(b"user:1", &limit, 1);
    clock.advance(Duration::from_secs(10));
    switch.set_down(false);
    match made_while_open.await {
        Err(GuardError::CircuitOpen { retry_in }) => assert_eq!(retry_in, Duration::ZERO),
        other => panic!("{other:?}"),
    }
    assert_eq!(switch.calls(), calls, "not sent");
    // The next check made is the probe, and closes the circuit.
    assert!(allowed(&store).await);
    assert_eq!(store.circuit_state(), Some(CircuitState::Closed));
    let m = Recorded::take(&snapshotter);
    assert_eq!(
        m.counter(
            "ratelimit_store_errors_total",
            &[("policy", "chat"), ("kind", "circuit_open")]
        ),
        1,
        "the check dropped unpolled is not counted"
    );
}
