//! Property tests over random request sequences. Failing cases proptest finds are saved in
//! `properties.proptest-regressions` (committed) and replayed first on every run.
#![forbid(unsafe_code)]

use proptest::prelude::*;
use ratelimit_core::algorithm::{gcra, sliding_log, token_bucket};
use ratelimit_core::{Algorithm, Limit, Quota, State, Timestamp};

/// A random quota: limit 1..=50 per period 1 ms..=10 s, burst 1..=60.
fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=50, 1_000u64..=10_000_000, 1u64..=60).prop_map(|(limit, period_us, burst)| {
        Quota::per_period(limit, std::time::Duration::from_micros(period_us))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    })
}

/// `q` as `algorithm` takes it: the window algorithms have no burst (`Limit::new` refuses one
/// that is not the limit), so theirs is left at the limit.
fn fit(algorithm: Algorithm, q: Quota) -> Quota {
    if algorithm.uses_burst() {
        q
    } else {
        q.with_burst(q.limit()).unwrap()
    }
}

/// `Limit::single` of `q` fitted to `algorithm`.
fn limit_of(algorithm: Algorithm, q: Quota) -> Result<Limit, ratelimit_core::ConfigError> {
    Limit::single(algorithm, fit(algorithm, q))
}

/// `Limit::new` of `quotas` fitted to `algorithm`.
fn limit_of_all(
    algorithm: Algorithm,
    quotas: impl IntoIterator<Item = Quota>,
) -> Result<Limit, ratelimit_core::ConfigError> {
    Limit::new(algorithm, quotas.into_iter().map(|q| fit(algorithm, q)))
}

/// The limit of `q1` alone, or of `q1` and `q2` if `two`, fitted to `algorithm`.
fn one_or_two(algorithm: Algorithm, q1: Quota, q2: Quota, two: bool) -> Limit {
    let quotas = if two { vec![q1, q2] } else { vec![q1] };
    limit_of_all(algorithm, quotas).unwrap()
}

/// Random steps: (time since previous request in µs, cost). Many zero gaps make bursts.
fn steps(max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0u64..2_000, 0u64..5_000_000],
            0u64..=max_cost,
        ),
        1..120,
    )
}

/// Runs a sequence through `algorithm` and returns (time, cost) of each admitted request.
fn run(limit: &Limit, steps: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut states = limit.fresh_states(Timestamp::ZERO);
    let mut now = 0u64;
    let mut admitted = Vec::new();
    for &(gap, cost) in steps {
        now += gap;
        if limit
            .check(&mut states, Timestamp::from_micros(now), cost)
            .is_allowed()
            && cost > 0
        {
            admitted.push((now, cost));
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Token bucket and GCRA: over every interval [a, b], admitted cost ≤ burst + limit × (b − a) / period.
    #[test]
    fn bucket_algorithms_respect_the_rate_bound(q in quota(), s in steps(8)) {
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let limit = limit_of(algorithm, q).unwrap();
            let admitted = run(&limit, &s);
            for i in 0..admitted.len() {
                let mut sum = 0u128;
                for j in i..admitted.len() {
                    sum += u128::from(admitted[j].1);
                    let span = u128::from(admitted[j].0 - admitted[i].0);
                    let bound = u128::from(q.burst()) * u128::from(q.period_micros())
                        + u128::from(q.limit()) * span;
                    prop_assert!(
                        sum * u128::from(q.period_micros()) <= bound,
                        "{algorithm}: {sum} admitted in {span} us exceeds the bound"
                    );
                }
            }
        }
    }

    /// Sliding log: never more than the limit in any window of one period.
    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_window(q in quota(), s in steps(8)) {
        let limit = limit_of(Algorithm::SlidingLog, q).unwrap();
        let admitted = run(&limit, &s);
        for (j, &(t, _)) in admitted.iter().enumerate() {
            let in_window: u64 = admitted[..=j]
                .iter()
                .filter(|&&(u, _)| u + q.period_micros() > t)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(in_window <= q.limit());
        }
    }

    /// Fixed window: never more than the limit in one aligned window (but up to twice in a period).
    #[test]
    fn fixed_window_never_exceeds_the_limit_per_window(q in quota(), s in steps(8)) {
        let limit = limit_of(Algorithm::FixedWindow, q).unwrap();
        let admitted = run(&limit, &s);
        let p = q.period_micros();
        let mut per_window = std::collections::HashMap::new();
        for (t, c) in admitted {
            *per_window.entry(t / p).or_insert(0u64) += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= q.limit()));
    }

    /// Sliding-window counter: never more than the limit in one aligned window, and never more
    /// than twice the limit in any period.
    #[test]
    fn sliding_window_bounds(q in quota(), s in steps(8)) {
        let limit = limit_of(Algorithm::SlidingWindow, q).unwrap();
        let admitted = run(&limit, &s);
        let p = q.period_micros();
        for (j, &(t, _)) in admitted.iter().enumerate() {
            let same_window: u64 = admitted[..=j].iter().filter(|&&(u, _)| u / p == t / p).map(|&(_, c)| c).sum();
            prop_assert!(same_window <= q.limit());
            let in_period: u64 = admitted[..=j].iter().filter(|&&(u, _)| u + p > t).map(|&(_, c)| c).sum();
            prop_assert!(in_period <= 2 * q.limit());
        }
    }

    /// Token bucket and GCRA with the same quota make the same decision at every step, down to
    /// remaining, reset and retry-after.
    #[test]
    fn token_bucket_and_gcra_agree(q in quota(), s in steps(70)) {
        let mut tb = None;
        let mut g = None;
        let mut now = 0u64;
        for (gap, cost) in s {
            now += gap;
            let t = Timestamp::from_micros(now);
            let (d1, s1) = token_bucket::check(&q, tb.as_ref(), t, cost);
            let (d2, s2) = gcra::check(&q, g.as_ref(), t, cost);
            prop_assert_eq!(d1, d2);
            if d1.is_allowed() {
                tb = Some(s1);
                g = Some(s2);
            }
        }
    }

    /// A denied multi-quota check changes no state; an allowed one consumes from every quota.
    #[test]
    fn multi_quota_never_half_consumes(q1 in quota(), q2 in quota(), s in steps(8), alg in 0usize..5) {
        let algorithm = Algorithm::ALL[alg];
        let limit = limit_of_all(algorithm, [q1, q2]).unwrap();
        let mut states = limit.fresh_states(Timestamp::ZERO);
        let mut now = 0;
        for (gap, cost) in s {
            now += gap;
            let before = states.clone();
            let t = Timestamp::from_micros(now);
            let d = limit.check(&mut states, t, cost);
            if d.is_denied() {
                prop_assert_eq!(&before, &states);
            } else {
                // Each quota's state is what that quota alone would have made of it: every one
                // consumed the cost, none was left as it was.
                for (i, q) in [q1, q2].into_iter().enumerate() {
                    let mut alone = vec![before[i].clone()];
                    let a = limit_of(algorithm, q).unwrap().check(&mut alone, t, cost);
                    prop_assert!(a.is_allowed());
                    prop_assert_eq!(&alone[0], &states[i]);
                }
            }
        }
    }

    /// Time going backwards never grants: a check at an earlier time than the state's is never
    /// better than the same check at the state's time.
    #[test]
    fn earlier_time_never_grants_more(q in quota(), s in steps(8), back in 1u64..10_000_000, alg in 0usize..5) {
        let algorithm = Algorithm::ALL[alg];
        let limit = limit_of(algorithm, q).unwrap();
        let mut states = limit.fresh_states(Timestamp::ZERO);
        let mut now = 20_000_000u64;
        for (gap, cost) in s {
            now += gap;
            let _ = limit.check(&mut states, Timestamp::from_micros(now), cost);
        }
        for cost in 0..=q.burst().max(q.limit()) {
            let mut a: Vec<State> = states.clone();
            let mut b: Vec<State> = states.clone();
            let at_now = limit.check(&mut a, Timestamp::from_micros(now), cost);
            let earlier = limit.check(&mut b, Timestamp::from_micros(now - back), cost);
            prop_assert!(!earlier.is_allowed() || at_now.is_allowed());
            if cost == 0 {
                // A peek: what is left is never more at the earlier time.
                prop_assert!(earlier.remaining() <= at_now.remaining());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A denial's `retry_after` is exact, for every algorithm, with one quota or two: the same
    /// cost passes then, and is still denied one microsecond before. (A wait too short sends a
    /// client back to be denied again; too long keeps it out longer than the limit says; the
    /// denial cache answers from it.) The steps' bursts deny often: some 8,500 denials in the
    /// 512 cases when this was written.
    #[test]
    fn retry_after_is_the_first_instant_the_cost_passes(
        q1 in quota(),
        q2 in quota(),
        two in any::<bool>(),
        s in steps(8),
        alg in 0usize..5,
    ) {
        let algorithm = Algorithm::ALL[alg];
        let limit = one_or_two(algorithm, q1, q2, two);
        let mut states = limit.fresh_states(Timestamp::ZERO);
        let mut now = 0;
        for (gap, cost) in s {
            now += gap;
            let before = states.clone();
            let d = limit.check(&mut states, Timestamp::from_micros(now), cost);
            let Some(wait) = d.retry_after() else { continue };
            let wait = u64::try_from(wait.as_micros()).unwrap();
            prop_assert!(wait >= 1, "a denial waits at least 1 µs");
            let then = limit.check(&mut before.clone(), Timestamp::from_micros(now + wait), cost);
            prop_assert!(then.is_allowed(), "cost {} at {} + {} µs: {:?}", cost, now, wait, then);
            let just_before =
                limit.check(&mut before.clone(), Timestamp::from_micros(now + wait - 1), cost);
            prop_assert!(
                just_before.is_denied(),
                "cost {} passes at {} + {} − 1 µs already: {:?}", cost, now, wait, just_before
            );
        }

    }

    /// An admission's `more_after` (the sliding window and the sliding log) is exact: more is
    /// available then (a peek finds more left than the admission did: of a limit of two quotas,
    /// the one with fewer left), and not one microsecond before; `None` exactly when nothing more
    /// can come (full). A cost that can never pass says it as a peek at the same instant would;
    /// any other denial says nothing (its wait is its retry-after). The other algorithms say
    /// nothing (the layer derives it from `remaining` and the reset).
    #[test]
    fn more_after_is_the_first_instant_more_is_available(
        q1 in quota(),
        q2 in quota(),
        two in any::<bool>(),
        s in steps(8),
        sliding_log in any::<bool>(),
    ) {
        let algorithm = if sliding_log { Algorithm::SlidingLog } else { Algorithm::SlidingWindow };
        let limit = one_or_two(algorithm, q1, q2, two);
        let mut states = limit.fresh_states(Timestamp::ZERO);
        let mut now = 0;
        for (gap, cost) in s {
            now += gap;
            let d = limit.check(&mut states, Timestamp::from_micros(now), cost);
            if !d.can_ever_pass() {
                // Nothing taken, and the quota told as it stands: of one quota, as a peek at the
                // same instant tells it.
                if !two {
                    let peek = limit.check(&mut states.clone(), Timestamp::from_micros(now), 0);
                    prop_assert_eq!(d.more_after(), peek.more_after());
                }
                continue;
            }
            if !d.is_allowed() {
                prop_assert_eq!(d.more_after(), None);
                continue;
            }
            let Some(more) = d.more_after() else {
                // Full: a quota with as few left as the binding one has all of its limit.
                let full = limit.quotas().iter().any(|q| q.limit() == d.remaining());
                prop_assert!(full, "{:?}", d);
                continue;
            };
            let more = u64::try_from(more.as_micros()).unwrap();
            prop_assert!(more >= 1);
            let peek = |at: u64| limit.check(&mut states.clone(), Timestamp::from_micros(at), 0);
            let then = peek(now + more);
            prop_assert!(
                then.remaining() > d.remaining(),
                "{} left at {} + {} µs, as at {}: {:?}", then.remaining(), now, more, now, d
            );
            let just_before = peek(now + more - 1);
            prop_assert_eq!(
                just_before.remaining(), d.remaining(),
                "more at {} + {} − 1 µs already: {:?}", now, more, d
            );
        }
    }
}

/// A log checked over many periods keeps at most `limit` entries, because the entries that slid
/// out are dropped (an admission drops them): a check every 0.7 ms for 7 s of 50 a second.
#[test]
fn sliding_log_memory_is_bounded_by_the_limit() {
    let q = Quota::per_second(50).unwrap();
    let mut state: Option<ratelimit_core::algorithm::SlidingLogState> = None;
    let mut admitted = 0;
    for i in 0..10_000u64 {
        let now = i * 700;
        let (d, s) = sliding_log::check(&q, state.as_ref(), Timestamp::from_micros(now), 1);
        if d.is_allowed() {
            admitted += 1;
            // Only what is still in the window: nothing that slid out is kept.
            assert!(s.entries.iter().all(|&(t, _)| t + q.period_micros() > now));
            state = Some(s);
        }
        assert!(state.as_ref().map_or(0, |s| s.entries.len()) <= 50);
    }
    // Seven periods: about 50 each, so entries did slide out and were dropped.
    assert!((340..=350).contains(&admitted), "{admitted}");
}

proptest! {
    // The second test skips the quota pairs an algorithm refuses (about one in five): without a
    // higher bound on skipped cases, a run with more cases (PROPTEST_CASES=5000) stopped at
    // proptest's default of 1,024 skips.
    #![proptest_config(ProptestConfig { cases: 256, max_global_rejects: u32::MAX, ..ProptestConfig::default() })]

    /// The memory store (which keeps states in compact two-word forms) makes exactly the decisions
    /// of the pure algorithms, for every algorithm, single and multi-quota, over several keys.
    #[test]
    fn memory_store_matches_the_pure_algorithms(
        q1 in quota(),
        q2 in quota(),
        s in steps(70),
        alg in 0usize..5,
        multi in any::<bool>(),
        keys in prop::collection::vec(0u8..3, 1..120),
    ) {
        let algorithm = Algorithm::ALL[alg];
        let limit = if multi {
            limit_of_all(algorithm, [q1, q2]).unwrap()
        } else {
            limit_of(algorithm, q1).unwrap()
        };
        let store = ratelimit_core::MemoryStore::builder().max_keys(1_000).build().unwrap();
        let mut states: Vec<Vec<State>> = (0..3).map(|_| limit.fresh_states(Timestamp::ZERO)).collect();
        let mut now = 0u64;
        for (i, (gap, cost)) in s.into_iter().enumerate() {
            now += gap;
            let k = keys[i % keys.len()] as usize;
            let t = Timestamp::from_micros(now);
            let expected = limit.check(&mut states[k], t, cost);
            let got = store.check_at(&[k as u8], &limit, cost, t);
            prop_assert_eq!(got, expected, "step {} key {}", i, k);
        }
    }

    /// The same over the whole range of the one-word forms and across their edges: refill rates
    /// whose remainders do not fit a word, window counts that outgrow theirs, periods from one
    /// microsecond to years, times from the epoch, today, the algorithms' last instant and far past
    /// it, two limits of any algorithms in one store, over up to 200 keys in one shard, so that
    /// the store sweeps as it grows and when asked (a sweep drops only fresh states, which changes
    /// no decision).
    #[test]
    fn memory_store_matches_the_pure_algorithms_across_encodings(
        q1 in wide_quota(),
        q2 in wide_quota(),
        alg1 in 0usize..5,
        alg2 in 0usize..5,
        s in steps(70),
        origin in prop_oneof![
            Just(0u64),
            Just(1_764_000_000_000_000),
            Just((1u64 << 52) - 10_000_000),
            Just(1u64 << 60),
        ],
        keys in prop::collection::vec(0u8..200, 1..120),
        sweeps in prop::collection::vec(any::<bool>(), 1..120),
    ) {
        // Even keys under one limit, odd keys under the other: both forms, and the side
        // storage, in one table.
        // Some algorithms refuse some of these quotas (a sliding window whose weighted counts
        // would not fit, for one): such pairs are skipped.
        let (Ok(l1), Ok(l2)) = (
            limit_of(Algorithm::ALL[alg1], q1),
            limit_of(Algorithm::ALL[alg2], q2),
        ) else {
            return Err(TestCaseError::reject("a limit refuses its quota"));
        };
        let limits = [l1, l2];
        let store = ratelimit_core::MemoryStore::builder()
            .max_keys(100_000)
            .shards(1)
            .build()
            .unwrap();
        let mut states: Vec<Vec<State>> = (0..200)
            .map(|k| limits[k % 2].fresh_states(Timestamp::ZERO))
            .collect();
        let mut now = origin;
        for (i, (gap, cost)) in s.into_iter().enumerate() {
            now += gap;
            let k = keys[i % keys.len()] as usize;
            let limit = &limits[k % 2];
            let t = Timestamp::from_micros(now);
            if sweeps[i % sweeps.len()] && i % 7 == 0 {
                store.sweep(t);
            }
            let expected = limit.check(&mut states[k], t, cost);
            let got = store.check_at(&[k as u8], limit, cost, t);
            prop_assert_eq!(got, expected, "step {} key {} at {}", i, k, now);
        }
    }
}

/// How the clock moves before a check of [`unit_steps`].
#[derive(Debug, Clone)]
enum Move {
    /// Forward by this many µs.
    Forward(u64),
    /// Forward by the last denial's retry-after plus this many µs (-2..=2): onto the instants
    /// around the end of a denial.
    ToRetry(i64),
    /// Back by this many µs (a clock set back, or a core whose clock is behind another's).
    Back(u64),
}

/// Steps whose cost is mostly 1 (the cost the store's denial memo answers).
fn unit_steps() -> impl Strategy<Value = Vec<(Move, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![
                2 => Just(Move::Forward(0)),
                2 => (0u64..2_000).prop_map(Move::Forward),
                1 => (0u64..5_000_000).prop_map(Move::Forward),
                2 => (-2i64..=2).prop_map(Move::ToRetry),
                1 => (0u64..3_000_000).prop_map(Move::Back),
            ],
            prop_oneof![4 => Just(1u64), 1 => 0u64..=70],
        ),
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Checks by the store's own clock (`check_now`, whose denials of cost 1 are answered from
    /// the shard's denial memo while they stand) make exactly the pure algorithms' decisions at
    /// the shard's latest time (the later of the clock and every time it counted at before), for
    /// every algorithm, single and multi-quota, over keys that share one shard, with sweeps
    /// between checks, at the instants around the end of each denial, with the clock set back
    /// now and then, and from the epoch, today, and around the algorithms' last instant.
    #[test]
    fn memory_store_by_its_clock_matches_the_pure_algorithms(
        q1 in quota(),
        q2 in quota(),
        s in unit_steps(),
        alg in 0usize..5,
        multi in any::<bool>(),
        keys in prop::collection::vec(0u8..3, 1..120),
        sweeps in prop::collection::vec(any::<bool>(), 1..120),
        origin in prop_oneof![
            3 => Just(0u64),
            1 => Just(1_764_000_000_000_000),
            1 => Just((1u64 << 52) - 3_000_000),
        ],
    ) {
        let algorithm = Algorithm::ALL[alg];
        let limit = if multi {
            limit_of_all(algorithm, [q1, q2]).unwrap()
        } else {
            limit_of(algorithm, q1).unwrap()
        };
        let clock = ratelimit_core::ManualClock::starting_at(Timestamp::from_micros(origin));
        let store = ratelimit_core::MemoryStore::builder()
            .max_keys(1_000)
            .shards(1)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let mut states: Vec<Vec<State>> = (0..3).map(|_| limit.fresh_states(Timestamp::ZERO)).collect();
        // The shard's latest time starts at zero, wherever the clock starts.
        let (mut now, mut latest) = (origin, 0);
        let mut last_retry = 0u64;
        for (i, (step, cost)) in s.into_iter().enumerate() {
            now = match step {
                Move::Forward(us) => now + us,
                Move::ToRetry(d) => now + last_retry.saturating_add_signed(d),
                Move::Back(us) => now.saturating_sub(us),
            };
            clock.set(Timestamp::from_micros(now));
            if sweeps[i % sweeps.len()] && i % 5 == 0 {
                store.sweep_now();
            }
            latest = latest.max(now);
            let k = keys[i % keys.len()] as usize;
            let expected = limit.check(&mut states[k], Timestamp::from_micros(latest), cost);
            let got = store.check_now(&[k as u8], &limit, cost);
            prop_assert_eq!(got, expected, "step {} key {} at {} (latest {})", i, k, now, latest);
            if let Some(r) = got.retry_after() {
                last_retry = r.as_micros() as u64;
            }
        }
    }
}

/// A quota over a wider range than [`quota`]: limit 1..=3000 per period from 1 µs (often 1 to 3
/// µs) to 2^51 µs, burst 1..=3000 (combinations too large to count exactly are skipped).
fn wide_quota() -> impl Strategy<Value = Quota> {
    let period = prop_oneof![
        1u64..=3,
        1u64..=100,
        1u64..=20_000_000,
        60_000_000u64..=86_400_000_000,
        (1u64 << 40)..=(1u64 << 51),
    ];
    (1u64..=3000, period, 1u64..=3000).prop_filter_map(
        "too large to count exactly",
        |(limit, period_us, burst)| {
            Quota::per_period(limit, std::time::Duration::from_micros(period_us))
                .and_then(|q| q.with_burst(burst))
                .ok()
        },
    )
}

/// A quota anywhere in what `Quota` accepts: limit 1 to 2^52, period 1 µs to 2^52 µs (often a
/// prime number of them, whose only divisors are 1 and itself), burst 1 to 2^52.
fn any_quota() -> impl Strategy<Value = Quota> {
    let big = prop_oneof![1u64..=100, 1u64..=1 << 20, 1u64..=1 << 52];
    let period = prop_oneof![
        1u64..=10_000_000,
        1u64..=1 << 52,
        Just(1_000_000u64),
        Just(3_600_000_000u64),
        Just(86_400_000_000u64),
        Just(95_000_011u64),
        Just(4_503_599_627_370_449u64), // the largest prime below 2^52
    ];
    (big.clone(), period, big).prop_filter_map("a quota", |(limit, period_us, burst)| {
        Quota::per_period(limit, std::time::Duration::from_micros(period_us))
            .ok()?
            .with_burst(burst)
            .ok()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// `Limit::divided` makes a share of every limit `Limit::new` accepts, for any number of
    /// gateways: a fallback's share never refuses to build (`Error::FallbackShare` is not
    /// expected), whatever the period's divisors.
    #[test]
    fn every_limit_can_be_divided(
        q1 in any_quota(),
        q2 in any_quota(),
        two in any::<bool>(),
        alg in 0usize..5,
        n in prop_oneof![1u64..=64, any::<u64>()],
    ) {
        let algorithm = Algorithm::ALL[alg];
        let quotas = if two { vec![q1, q2] } else { vec![q1] };
        let Ok(limit) = limit_of_all(algorithm, quotas) else { return Ok(()) };
        let share = limit.divided(n);
        prop_assert!(share.is_ok(), "{:?} / {}: {:?}", limit, n, share);
        for (s, q) in share.unwrap().quotas().iter().zip(limit.quotas()) {
            prop_assert!(s.limit() <= q.limit() && s.burst() <= q.burst());
            prop_assert_eq!(s.period_micros(), q.period_micros());
        }
    }
}
