//! Script replies and the decisions they carry.
//!
//! Most scripts answer with six integers (see `lua/prelude.lua`). The single-quota token bucket
//! and GCRA answer with one: the *level reply*, the bucket level (GCRA: the debt) in level units
//! after an admission, or `-1 - level` when the cost was not admitted. Every field of the
//! decision follows from that number, the cost and the quota, and is derived here with the same
//! integer arithmetic as `ratelimit_core::algorithm`; the conformance suite checks the two agree
//! decision by decision. It saves the script building a table, about 0.6 µs of server time per
//! check (`usec_per_call`), a tenth of the whole.

use std::time::Duration;

use ratelimit_core::{Algorithm, Decision, Limit, Outcome, Quota, QuotaSet};
use redis::Value;

use crate::error::RedisStoreError;

/// What a limit's script answers with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    /// One integer per cost (single-quota token bucket or GCRA).
    Level { algorithm: Algorithm, quota: Quota },
    /// Six integers per cost, for a limit of this many quotas.
    Full { quotas: usize },
}

impl Shape {
    pub(crate) fn of(limit: &Limit) -> Shape {
        match (limit.algorithm(), limit.quotas()) {
            (algorithm @ (Algorithm::TokenBucket | Algorithm::Gcra), [quota]) => Shape::Level {
                algorithm,
                quota: *quota,
            },
            (_, quotas) => Shape::Full {
                quotas: quotas.len(),
            },
        }
    }

    fn width(self) -> usize {
        match self {
            Shape::Level { .. } => 1,
            Shape::Full { .. } => 6,
        }
    }
}

fn unexpected(value: &Value) -> RedisStoreError {
    RedisStoreError::UnexpectedReply(format!("{value:?}"))
}

/// The decision of a one-cost reply.
pub(crate) fn decision(
    value: &Value,
    shape: Shape,
    cost: u64,
) -> Result<Decision, RedisStoreError> {
    match (shape, value) {
        (Shape::Level { .. }, Value::Int(_)) => {
            from_items(value, std::slice::from_ref(value), shape, cost)
        }
        (Shape::Full { .. }, Value::Array(items)) => from_items(value, items, shape, cost),
        _ => Err(unexpected(value)),
    }
}

/// The decisions of a multi-cost reply, one per cost.
pub(crate) fn decisions(
    value: &Value,
    shape: Shape,
    costs: &[u64],
) -> Result<Vec<Decision>, RedisStoreError> {
    let Value::Array(items) = value else {
        return Err(unexpected(value));
    };
    let width = shape.width();
    if items.len() != width * costs.len() {
        return Err(unexpected(value));
    }
    items
        .chunks_exact(width)
        .zip(costs)
        .map(|(chunk, &cost)| from_items(value, chunk, shape, cost))
        .collect()
}

/// One cost's part of a reply (`value`, named in errors): one integer for a `Level` shape, six
/// for `Full`.
fn from_items(
    value: &Value,
    items: &[Value],
    shape: Shape,
    cost: u64,
) -> Result<Decision, RedisStoreError> {
    match (shape, items) {
        (Shape::Level { algorithm, quota }, [Value::Int(v)]) => {
            from_level(*v, algorithm, &quota, cost).ok_or_else(|| unexpected(value))
        }
        (Shape::Full { quotas }, items) if items.len() == 6 => {
            let mut ints = [0i64; 6];
            for (slot, item) in ints.iter_mut().zip(items) {
                match item {
                    Value::Int(v) => *slot = *v,
                    _ => return Err(unexpected(value)),
                }
            }
            from_six(&ints, quotas)
        }
        _ => Err(unexpected(value)),
    }
}

/// A six-integer reply: outcome, retry-after µs (when allowed or never passing, the time until
/// more is available,
/// or 0), limit, remaining, reset-after µs, and the quota
/// index (below `quotas`, the limit's number of quotas) plus 256 times the bits of the violated
/// quotas (none but quotas of the limit, none when allowed; zero from the single-quota paths,
/// whose denial names the one quota), or the reply is refused.
pub(crate) fn from_six(reply: &[i64], quotas: usize) -> Result<Decision, RedisStoreError> {
    let bad = || RedisStoreError::UnexpectedReply(format!("{reply:?}"));
    let &[code, retry, limit, remaining, reset, index] = reply else {
        return Err(bad());
    };
    let nonneg = |v: i64| u64::try_from(v).map_err(|_| bad());
    let retry = Duration::from_micros(nonneg(retry)?);
    let outcome = match code {
        0 => Outcome::Allowed,
        1 => Outcome::Denied { retry_after: retry },
        2 => Outcome::Exceeds,
        _ => return Err(bad()),
    };
    let index = nonneg(index)?;
    let (violated, index) = (index >> 8, (index & 0xff) as usize);
    // Bits of quotas of this limit only (at most 8, so the set's byte holds them).
    let violated = u8::try_from(violated)
        .ok()
        .filter(|&v| index < quotas && u32::from(v) >> quotas.min(8) == 0)
        .ok_or_else(bad)?;
    if violated != 0 && (outcome == Outcome::Allowed || violated & (1 << index) == 0) {
        return Err(bad());
    }
    Ok(Decision::new(
        outcome,
        nonneg(limit)?,
        nonneg(remaining)?,
        Duration::from_micros(nonneg(reset)?),
        index,
    )
    // Allowed or never passing: the time until more is available, which the sliding algorithms'
    // scripts give in the retry slot (0, saying nothing, from the others).
    .with_more_after(retry)
    .with_violated_quotas(QuotaSet::from_bits(violated)))
}

/// A level reply: `None` if it cannot come from the script for this quota and cost.
fn from_level(v: i64, algorithm: Algorithm, q: &Quota, cost: u64) -> Option<Decision> {
    // The script saw the cost clamped as the client sent it.
    let cost = crate::store::wire_cost(cost);
    let (admitted, level) = if v >= 0 {
        (true, v.unsigned_abs())
    } else {
        (false, (-1 - v).unsigned_abs())
    };
    let (burst, scale, rate, cap) = (
        q.burst(),
        q.scale(),
        q.refill_per_micro(),
        q.capacity_units(),
    );
    if level > cap || (admitted && cost > burst) {
        return None;
    }
    let micros = |units: u64| Duration::from_micros(units.div_ceil(rate));
    let (remaining, reset) = match algorithm {
        Algorithm::TokenBucket => (level / scale, micros(cap - level)),
        Algorithm::Gcra => ((cap - level) / scale, micros(level)),
        _ => return None,
    };
    let outcome = if cost > burst {
        // Not admitted (refused above).
        Outcome::Exceeds
    } else {
        // cost <= burst, so cost * scale <= cap <= 2^52.
        let need = cost * scale;
        let tb = algorithm == Algorithm::TokenBucket;
        if admitted {
            // An admission took `need` from the bucket (at most cap - need left) or added it to
            // the debt (at least need).
            if (tb && level > cap - need) || (!tb && level < need) {
                return None;
            }
            Outcome::Allowed
        } else {
            let short = if tb {
                // The bucket holds less than the cost.
                need.checked_sub(level).filter(|&s| s > 0)?
            } else {
                // The debt after the cost would pass the capacity.
                (level + need).checked_sub(cap).filter(|&s| s > 0)?
            };
            Outcome::Denied {
                retry_after: micros(short),
            }
        }
    };
    Some(Decision::new(outcome, burst, remaining, reset, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ratelimit_core::Timestamp;
    use ratelimit_core::algorithm::{GcraState, TokenBucketState, gcra, token_bucket};

    proptest! {
        /// For random quotas and request sequences, the level the script returns (the state the
        /// pure algorithm leaves: the bucket level, or the GCRA debt at that instant) decodes to
        /// exactly the pure algorithm's decision. State is kept only after an admission, as the
        /// script writes it.
        #[test]
        fn level_replies_decode_to_the_algorithms_decisions(
            limit in 1u64..5_000,
            period_ms in 1u64..7_200_000,
            extra_burst in 0u64..50,
            use_gcra in any::<bool>(),
            steps in proptest::collection::vec(
                (0u64..3_000_000, prop_oneof![8 => 0u64..60, 1 => Just(u64::MAX)]),
                1..60,
            ),
        ) {
            let quota = Quota::per_period(limit, Duration::from_millis(period_ms))
                .and_then(|q| q.with_burst(limit + extra_burst));
            let algorithm = if use_gcra { Algorithm::Gcra } else { Algorithm::TokenBucket };
            // A quota the bucket cannot count exactly is refused by `Limit::new`.
            let built = quota.and_then(|q| Limit::single(algorithm, q).map(|l| (q, l)));
            prop_assume!(built.is_ok());
            let (q, built) = built.unwrap();
            let shape = Shape::of(&built);
            let mut tb: Option<TokenBucketState> = None;
            let mut gc: Option<GcraState> = None;
            let mut now = 1_000_000_000u64;
            for (dt, cost) in steps {
                now += dt;
                let t = Timestamp::from_micros(now);
                let (expected, level) = if use_gcra {
                    let (d, s) = gcra::check(&q, gc.as_ref(), t, cost);
                    let debt = s.tat.saturating_sub(now) * q.refill_per_micro() + s.frac;
                    if d.is_allowed() && cost > 0 { gc = Some(s); }
                    (d, debt.min(q.capacity_units()))
                } else {
                    let (d, s) = token_bucket::check(&q, tb.as_ref(), t, cost);
                    if d.is_allowed() && cost > 0 { tb = Some(s); }
                    (d, s.level)
                };
                let level = i64::try_from(level).unwrap();
                let v = if expected.is_allowed() { level } else { -1 - level };
                prop_assert_eq!(decision(&Value::Int(v), shape, cost).unwrap(), expected);
            }
        }
    }

    #[test]
    fn six_integer_replies_become_decisions() {
        let d = from_six(&[1, 600_000, 100, 0, 60_000_000, 1], 2).unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(600)));
        assert_eq!((d.limit(), d.remaining(), d.quota_index()), (100, 0, 1));
        assert!(from_six(&[3, 0, 0, 0, 0, 0], 1).is_err());
        assert!(from_six(&[0, 0, -1, 0, 0, 0], 1).is_err());
        assert!(from_six(&[0], 1).is_err());
        // A quota the limit does not have: refused, not passed on to index the caller's quotas.
        assert!(from_six(&[1, 600_000, 100, 0, 60_000_000, 2], 2).is_err());
        assert!(from_six(&[0, 0, 100, 99, 600_000, -1], 2).is_err());
    }

    /// The last integer carries the violated quotas above the index: quota 1 binds, quotas 0
    /// and 1 denied. Sets that cannot come from the script are refused.
    #[test]
    fn six_integer_replies_carry_the_violated_quotas() {
        let d = from_six(&[1, 600_000, 100, 0, 60_000_000, 1 + 256 * 0b11], 3).unwrap();
        assert_eq!(
            (d.quota_index(), d.violated_quotas()),
            (1, QuotaSet::from_bits(0b11))
        );
        // Zero: the binding quota alone (the single-quota paths).
        let d = from_six(&[1, 600_000, 100, 0, 60_000_000, 2], 3).unwrap();
        assert_eq!(d.violated_quotas(), QuotaSet::from_bits(0b100));
        let d = from_six(&[1, 600_000, 100, 0, 60_000_000, 2 + 256 * 0b100], 3).unwrap();
        assert_eq!(d.violated_quotas(), QuotaSet::from_bits(0b100));
        // A quota the limit does not have, a set without the binding quota, an allowed reply
        // with a set, a set beyond a byte.
        assert!(from_six(&[1, 600_000, 100, 0, 60_000_000, 1 + 256 * 0b1010], 3).is_err());
        assert!(from_six(&[1, 600_000, 100, 0, 60_000_000, 1 + 256], 3).is_err());
        assert!(from_six(&[0, 0, 100, 5, 60_000_000, 1 + 256 * 0b10], 3).is_err());
        assert!(
            from_six(
                &[1, 600_000, 100, 0, 60_000_000, 1 + 256 * 0b1_0000_0010],
                8
            )
            .is_err()
        );
        let d = from_six(&[2, 0, 100, 0, 0, 7 + 256 * 0b1000_0001], 8).unwrap();
        assert_eq!(d.violated_quotas(), QuotaSet::from_bits(0b1000_0001));
    }

    #[test]
    fn impossible_level_replies_are_errors() {
        let q = Quota::per_second(10).unwrap();
        let limit = Limit::single(Algorithm::TokenBucket, q).unwrap();
        let shape = Shape::of(&limit);
        let cap = i64::try_from(q.capacity_units()).unwrap();
        assert!(decision(&Value::Int(cap), shape, 0).is_ok());
        // A full bucket after an admission of 1: it took a token.
        assert!(decision(&Value::Int(cap), shape, 1).is_err());
        assert!(decision(&Value::Int(cap - 100_000), shape, 1).is_ok());
        assert!(decision(&Value::Int(cap - 99_999), shape, 1).is_err());
        // GCRA: a debt after an admission of 1 holds at least its 100,000 units.
        let gcra = Shape::of(&Limit::single(Algorithm::Gcra, q).unwrap());
        assert!(decision(&Value::Int(0), gcra, 0).is_ok());
        assert!(decision(&Value::Int(99_999), gcra, 1).is_err());
        assert!(decision(&Value::Int(100_000), gcra, 1).is_ok());
        // Above the capacity, either way.
        assert!(decision(&Value::Int(cap + 1), shape, 1).is_err());
        assert!(decision(&Value::Int(-2 - cap), shape, 1).is_err());
        // Admitted a cost above the burst; denied a cost the bucket holds.
        assert!(decision(&Value::Int(0), shape, 11).is_err());
        assert!(decision(&Value::Int(-1 - cap), shape, 1).is_err());
        assert!(decision(&Value::Int(i64::MIN), shape, 1).is_err());
        assert!(decision(&Value::Array(vec![Value::Int(0)]), shape, 1).is_err());
        assert!(decisions(&Value::Array(vec![Value::Int(0)]), shape, &[1, 1]).is_err());
    }

    /// Worked examples; the conformance suite (tests/conformance.rs) checks the level replies
    /// against ratelimit-core's algorithms on a real server, decision by decision.
    #[test]
    fn level_replies_worked_examples() {
        // 10 per second: scale 100,000 units per token, 1 unit per µs, capacity 1,000,000.
        let q = Quota::per_second(10).unwrap();
        let tb = Shape::of(&Limit::single(Algorithm::TokenBucket, q).unwrap());
        let gcra = Shape::of(&Limit::single(Algorithm::Gcra, q).unwrap());
        let ms = Duration::from_millis;

        // Token bucket, one token spent from a full bucket: 9 left, full again in 100 ms.
        let d = decision(&Value::Int(900_000), tb, 1).unwrap();
        assert_eq!(
            (d.is_allowed(), d.remaining(), d.reset_after()),
            (true, 9, ms(100))
        );
        // Half a token in the bucket: denied, the other half comes in 50 ms.
        let d = decision(&Value::Int(-1 - 50_000), tb, 1).unwrap();
        assert_eq!(d.retry_after(), Some(ms(50)));
        assert_eq!((d.remaining(), d.reset_after()), (0, ms(950)));
        // A cost above the burst can never pass.
        let d = decision(&Value::Int(-1 - 1_000_000), tb, 11).unwrap();
        assert_eq!(d.outcome(), Outcome::Exceeds);
        assert_eq!((d.limit(), d.remaining(), d.reset_after()), (10, 10, ms(0)));

        // GCRA, a debt of one token after the admission: 9 left, paid off in 100 ms.
        let d = decision(&Value::Int(100_000), gcra, 1).unwrap();
        assert_eq!(
            (d.is_allowed(), d.remaining(), d.reset_after()),
            (true, 9, ms(100))
        );
        // A debt of 9.5 tokens: a whole token more passes the capacity by half a token.
        let d = decision(&Value::Int(-1 - 950_000), gcra, 1).unwrap();
        assert_eq!(d.retry_after(), Some(ms(50)));
        assert_eq!((d.remaining(), d.reset_after()), (0, ms(950)));
    }
}
