//! The store's own counters, through the `metrics` facade (the layer's are tower-ratelimit's).
//! Each appears at its first event, but for [`RESET_NOTICES_TOTAL`], which appears at 0 once a
//! reset watch has first subscribed; each is described to the recorder when a store is built (a
//! Prometheus exporter's `# HELP` line).

use ::metrics::describe_counter;

/// Connections dropped (broken, answered `READONLY`, or silent) or replaced.
pub const CONNECTIONS_REPLACED_TOTAL: &str = "ratelimit_redis_connections_replaced_total";
/// Checks that [`Coalescing`](crate::Coalescing) answered in a batch with others instead of a
/// script call of their own.
pub const COALESCED_CHECKS_TOTAL: &str = "ratelimit_redis_coalesced_checks_total";
/// Checks that [`Coalescing`](crate::Coalescing) sent on their own, as without it: counted at
/// their first poll in a runtime, so one whose caller gave up before its command was written
/// (which redis-rs then drops) counts too.
pub const COALESCING_OVERFLOW_TOTAL: &str = "ratelimit_redis_coalescing_overflow_total";
/// Resets that [`watch_resets`](crate::RedisStore::watch_resets) watches heard (each notice, by
/// each watch).
pub const RESET_NOTICES_TOTAL: &str = "ratelimit_redis_reset_notices_total";
/// Subscriptions that reset watches made, first or again: more than one per watch means it was
/// not subscribed for a while, and may have missed resets then.
pub const RESET_WATCH_SUBSCRIPTIONS_TOTAL: &str = "ratelimit_redis_reset_watch_subscriptions_total";

/// Describes the counters to the recorder installed now.
pub(crate) fn describe() {
    describe_counter!(
        CONNECTIONS_REPLACED_TOTAL,
        "Rate-limit Redis store connections dropped (broken, READONLY or silent) or replaced"
    );
    describe_counter!(
        COALESCED_CHECKS_TOTAL,
        "Rate-limit checks answered in a batch with others instead of a script call of their own"
    );
    describe_counter!(
        RESET_NOTICES_TOTAL,
        "Rate-limit resets announced through Redis that a reset watch heard"
    );
    describe_counter!(
        RESET_WATCH_SUBSCRIPTIONS_TOTAL,
        "Subscriptions made by rate-limit reset watches, first or again after a lost connection"
    );
    describe_counter!(
        COALESCING_OVERFLOW_TOTAL,
        "Rate-limit checks that coalescing sent on their own (queue full, or outside a Tokio runtime)"
    );
}
