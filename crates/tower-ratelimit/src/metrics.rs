//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `ratelimit_decisions_total` | counter | `policy`, `outcome` (see [`VerdictKind::as_str`]), and `tier` for a policy with tiers |
//! | `ratelimit_store_duration_seconds` | histogram | `policy` |
//! | `ratelimit_store_errors_total` | counter | `policy`, `kind` (`error`, `timeout`, `circuit_open`) |
//! | `ratelimit_checks_cancelled_total` | counter | `policy` |
//! | `ratelimit_circuit_state` | gauge | `policy` (0 closed, 1 open, 2 half-open) |
//! | `ratelimit_circuits_not_closed` | gauge | `policy` |
//! | `ratelimit_resets_total` | counter | `policy`, `outcome` (`reset`, `no_key`, `timeout`, `error`, `skipped`) |
//!
//! `ratelimit_resets_total` counts the resets of a [`Resetter`](crate::Resetter), and those the
//! layer makes after a response
//! ([`RateLimitLayerBuilder::reset_on`](crate::RateLimitLayerBuilder::reset_on)), by how they
//! ended; its series are registered when the layer's first resetter is made, or its builder's
//! `reset_on` is set (a layer with neither has none). `skipped` is a reset that did not ask the
//! store, so that the client's count there stands: its circuit was open and cooling down, or
//! half-open (for a `reset_on` reset: open at all; a `Resetter`'s reset asks a store whose
//! circuit has cooled down), or the layer let its request through without the store's answer;
//! the fallback's local share, if any, was reset.
//!
//! A layer keeps a circuit per failure domain of its store
//! ([`Store::failure_domains`](ratelimit_core::Store::failure_domains): one for a single Redis
//! server, 64 ranges of hash slots for a Redis Cluster). `ratelimit_circuit_state` is the worst of
//! them (open if any is open, else half-open if any is probing), and
//! `ratelimit_circuits_not_closed` how many are open or half-open: with a cluster, a master lost
//! shows as the share of the 64 that its slots cover.
//!
//! `ratelimit_checks_cancelled_total` counts the store checks whose request was dropped before the
//! store answered (its client went away, or a timeout of the caller's fired): they have no
//! decision and are not in `ratelimit_decisions_total`, but the store may have counted them (the
//! command was sent). With a circuit breaker, such a check runs on to the layer's timeout and its
//! answer still counts for the breaker (see [`crate::circuit_breaker`]); a failure or timeout of it
//! is then counted in `ratelimit_store_errors_total` too.
//!
//! `ratelimit_store_duration_seconds` times every store answer that has to wait, a failure (an
//! error, the layer's timeout) as well as a decision (the Redis store's, to the reply from the end
//! of the poll that sends the command, which leaves out the microseconds it took to hand the
//! command over; in the calls sampled as below, from that poll's start). A
//! check whose request was dropped before the answer is not timed (it is counted in
//! `ratelimit_checks_cancelled_total`). Answers that
//! come at once (the in-memory store, a denial cache hit) take about 100 ns, and timing each
//! added about 20 ns to a request (measured on 2026-11-29; docs/benchmarks.md), so about one in
//! 64 of them, drawn at random, is timed: the histogram's count is then not the number of checks;
//! `ratelimit_decisions_total` is.
//!
//! A policy with [tiers](crate::Policy::tier) labels its decisions with the request's `tier` as
//! well: the tier's name, or `""` for the policy's own limit, which a Prometheus server stores as
//! no label at all (so a query by policy and outcome reads the same series before and after tiers
//! are added). The tier is the one the resolver chose, also for a request rejected for want of a
//! key; `""` for an allow-listed request (let through before the resolver runs) and for one
//! counted under the shared missing-key key (always the policy's own limit). Tier names come from
//! the configuration, never from the request (a name the policy does not have counts as `""`),
//! so the series stay bounded. A policy without tiers has no `tier` label.
//!
//! The policy's name is the `policy` label: layers that share a name share these series (their
//! counters add up, and their circuits write one gauge), so give each layer of an app its own.
//!
//! The handles are registered when the layer is built, with the recorder installed then:
//! install your recorder (a Prometheus exporter, say) before building the layer. Recording then
//! costs no lookup and no allocation per request. Each series is described to that recorder too
//! (a Prometheus exporter's `# HELP` line; the histogram's unit, seconds).

use ::metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

use crate::response::VerdictKind;

/// Decisions by policy and outcome (and tier, for a policy with tiers).
pub const DECISIONS_TOTAL: &str = "ratelimit_decisions_total";
/// Store call latency in seconds, by policy.
pub const STORE_DURATION_SECONDS: &str = "ratelimit_store_duration_seconds";
/// Store failures by policy and kind.
pub const STORE_ERRORS_TOTAL: &str = "ratelimit_store_errors_total";
/// Store checks whose request was dropped before the store answered, by policy.
pub const CHECKS_CANCELLED_TOTAL: &str = "ratelimit_checks_cancelled_total";
/// Circuit-breaker state by policy: 0 closed, 1 open, 2 half-open (of the worst of its circuits).
pub const CIRCUIT_STATE: &str = "ratelimit_circuit_state";
/// How many of a layer's circuits (one per failure domain of its store) are open or half-open.
pub const CIRCUITS_NOT_CLOSED: &str = "ratelimit_circuits_not_closed";
/// Resets of a client's count, by a [`Resetter`](crate::Resetter) or the layer's own
/// ([`reset_on`](crate::RateLimitLayerBuilder::reset_on)), by policy and outcome.
pub const RESETS_TOTAL: &str = "ratelimit_resets_total";

/// Why a store call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    Error,
    Timeout,
    CircuitOpen,
}

impl FailureKind {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            FailureKind::Error => "error",
            FailureKind::Timeout => "timeout",
            FailureKind::CircuitOpen => "circuit_open",
        }
    }
}

/// How a reset ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetOutcome {
    Reset,
    NoKey,
    Timeout,
    Error,
    Skipped,
}

/// The reset counters of a policy, by [`ResetOutcome`].
pub(crate) type ResetCounters = [Counter; ResetOutcome::ALL.len()];

impl ResetOutcome {
    pub(crate) const ALL: [ResetOutcome; 5] = [
        ResetOutcome::Reset,
        ResetOutcome::NoKey,
        ResetOutcome::Timeout,
        ResetOutcome::Error,
        ResetOutcome::Skipped,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            ResetOutcome::Reset => "reset",
            ResetOutcome::NoKey => "no_key",
            ResetOutcome::Timeout => "timeout",
            ResetOutcome::Error => "error",
            ResetOutcome::Skipped => "skipped",
        }
    }
}

pub(crate) struct Metrics {
    /// By outcome, the policy's own limit's (`Rt::tiers[0]`), apart from the other tiers' so
    /// that a request of no tier pays no more for the tiers than a test for 0 (indexing one
    /// table cost it 4 instructions).
    decisions: [Counter; 9],
    /// The other tiers', as `Rt::tiers[1..]`.
    tier_decisions: Box<[[Counter; 9]]>,
    store_duration: Histogram,
    errors: [Counter; 3],
    pub(crate) cancelled: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Describes the layer's series to the recorder installed now (again at each layer built: a
/// recorder keeps the last description of a name).
fn describe() {
    describe_counter!(
        DECISIONS_TOTAL,
        "Rate-limit decisions, by policy, outcome and (for a policy with tiers) tier (one per request the layer answered or let through)"
    );
    describe_histogram!(
        STORE_DURATION_SECONDS,
        Unit::Seconds,
        "Rate-limit store check time, to the answer or the failure (every check that waited, timeouts and errors included; of a layer's checks answered at once, about 1 in 64; a Guarded store's, every one)"
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        "Rate-limit store checks that failed, by policy and kind (error, timeout, circuit_open)"
    );
    describe_counter!(
        CHECKS_CANCELLED_TOTAL,
        "Rate-limit store checks whose request was dropped before the store answered"
    );
    describe_gauge!(
        CIRCUIT_STATE,
        "Rate-limit store circuit breaker: 0 closed, 1 open, 2 half-open (the worst of the policy's circuits)"
    );
    describe_gauge!(
        CIRCUITS_NOT_CLOSED,
        "Rate-limit store circuits (one per failure domain of the store) open or half-open"
    );
}

impl Metrics {
    /// The series of `policy`, whose tiers (beside its own limit) are `tiers`.
    pub(crate) fn new<'a>(policy: &str, tiers: impl ExactSizeIterator<Item = &'a str>) -> Metrics {
        describe();
        let of_tier = |tier: &str| {
            VerdictKind::ALL.map(|k| {
                counter!(
                    DECISIONS_TOTAL,
                    "policy" => policy.to_owned(),
                    "outcome" => k.as_str(),
                    "tier" => tier.to_owned()
                )
            })
        };
        let (decisions, tier_decisions) = if tiers.len() == 0 {
            let untiered = VerdictKind::ALL.map(|k| {
                counter!(DECISIONS_TOTAL, "policy" => policy.to_owned(), "outcome" => k.as_str())
            });
            (untiered, Vec::new())
        } else {
            (of_tier(""), tiers.map(of_tier).collect())
        };
        let errors = [
            FailureKind::Error,
            FailureKind::Timeout,
            FailureKind::CircuitOpen,
        ]
        .map(|k| counter!(STORE_ERRORS_TOTAL, "policy" => policy.to_owned(), "kind" => k.as_str()));
        Metrics {
            decisions,
            tier_decisions: tier_decisions.into_boxed_slice(),
            store_duration: histogram!(STORE_DURATION_SECONDS, "policy" => policy.to_owned()),
            errors,
            cancelled: counter!(CHECKS_CANCELLED_TOTAL, "policy" => policy.to_owned()),
        }
    }

    /// Counts a decision of `kind` on a request of `tier` (an index of `Rt::tiers`).
    #[inline]
    pub(crate) fn decision(&self, kind: VerdictKind, tier: usize) {
        let counters = match tier.checked_sub(1) {
            None => &self.decisions,
            Some(i) => &self.tier_decisions[i],
        };
        counters[kind.index()].increment(1);
    }

    pub(crate) fn store_duration(&self, d: std::time::Duration) {
        self.store_duration.record(d.as_secs_f64());
    }

    pub(crate) fn failure(&self, kind: FailureKind) {
        self.errors[kind as usize].increment(1);
    }

    /// The counter of `kind` failures, for a breaker that records failures of its own.
    pub(crate) fn failure_counter(&self, kind: FailureKind) -> Counter {
        self.errors[kind as usize].clone()
    }

    /// The circuit-state gauge of `policy`: registered only by a layer that has a breaker, so
    /// that a layer without one (over the in-memory store) shows no series at all rather than a
    /// "closed" one.
    pub(crate) fn circuit_gauge(policy: &str) -> Gauge {
        gauge!(CIRCUIT_STATE, "policy" => policy.to_owned())
    }

    /// The reset counters of `policy`, by [`ResetOutcome`], described to the recorder installed
    /// now.
    pub(crate) fn reset_counters(policy: &str) -> ResetCounters {
        describe_counter!(
            RESETS_TOTAL,
            "Rate-limit resets of a client's count, by policy and outcome (reset, no_key, timeout, error, skipped)"
        );
        ResetOutcome::ALL
            .map(|o| counter!(RESETS_TOTAL, "policy" => policy.to_owned(), "outcome" => o.as_str()))
    }

    /// The gauge of `policy`'s circuits not closed (registered with the circuit-state gauge).
    pub(crate) fn circuits_not_closed_gauge(policy: &str) -> Gauge {
        gauge!(CIRCUITS_NOT_CLOSED, "policy" => policy.to_owned())
    }
}
