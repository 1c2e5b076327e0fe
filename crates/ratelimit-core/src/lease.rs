//! `Leasing`: reserve a slice of a key's units from the store in one call, then admit from it
//! locally.
//!
//! See the documentation of the type for how it works and its guarantees.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use pin_project_lite::pin_project;

use crate::key_digest::{BuildIdHasher, KeyDigest};
use crate::reset::WrapperResetFuture;
use crate::time::duration_to_micros as micros;
use crate::{Algorithm, Clock, ConfigError, Decision, Forget, Limit, Outcome, Reset, Store};

/// The default largest lease (adaptive sizing): 64 units.
pub const DEFAULT_MAX_LEASE: u64 = 64;
/// The default longest lifetime of a lease: 10 seconds.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(10);
/// The default most keys with lease state held at once: 100,000.
pub const DEFAULT_MAX_LEASED_KEYS: usize = 100_000;

const SHARDS: usize = 16;

/// A [`Store`] wrapper that reserves units from the store in a batch (a lease) and admits from
/// them locally.
///
/// A hot key on a gateway costs one store call per request. With leasing, the gateway asks the
/// store for `L` units at once (an ordinary check of cost `L`, all-or-nothing at the store), then
/// admits the next requests for that key from those units without calling the store, until they
/// run out or the lease expires. The store's count never lags behind the gateways: every unit a
/// gateway admits was consumed at the store first.
///
/// ```
/// use ratelimit_core::{Algorithm, Leasing, Limit, ManualClock, MemoryStore, Quota, Store};
/// use std::future::Future;
/// use std::pin::pin;
/// use std::task::{Context, Poll, Waker};
///
/// # fn now<F: Future>(f: F) -> F::Output {
/// #     match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
/// #         Poll::Ready(v) => v,
/// #         Poll::Pending => unreachable!(),
/// #     }
/// # }
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
/// let leasing = Leasing::builder(store, clock.clone()).lease_size(10).build()?;
/// let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(95)?)?;
///
/// let admitted = (0..200)
///     .filter(|_| now(leasing.check(b"hot", &limit, 1)).unwrap().is_allowed())
///     .count();
/// // Exactly the limit: nine leases of 10, then, when 10 no longer fit, one of the 5 left.
/// assert_eq!(admitted, 95);
/// let stats = leasing.stats();
/// assert_eq!((stats.leases, stats.local), (10, 9 * 9 + 4));
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
///
/// # How a check runs
///
/// - The key has a live lease with enough units: they are taken, and the check is answered at
///   once, locally.
/// - Otherwise one check per key at a time (on this gateway) asks the store for a lease of the
///   current size `L` (at least the request's cost, at most what the limit can ever hold). Other
///   checks of the key wait for it as long as its units beyond the fetching check's cost cover
///   theirs; the rest go straight to the store, side by side, as without leasing (waiting in line
///   for lease after lease would allow one store call in flight per key). If the lease is
///   granted, the request takes its cost from it. If it is denied but the store says it has `r`
///   units left (more than the cost), a lease of exactly `r` is asked for at once (once). If that
///   fails too, or fewer units are left, the key's checks go straight to the store until that
///   lease would fit (the denial's retry-after; before it, the store would deny it again): the
///   request's own cost at once, so a nearly exhausted key still admits exactly what is left, and
///   the waiting checks side by side (a coalescing store below merges them). A denial of a
///   request's own cost does the same until that cost may pass.
/// - A cost of 0 (a peek), a cost larger than the largest lease, and limits of several fixed-window
///   quotas go straight to the store.
///
/// # Lease size and lifetime
///
/// [`lease_size`](LeasingBuilder::lease_size) fixes `L`. By default it adapts per key between 1
/// and [`max_lease`](LeasingBuilder::max_lease): it starts at 1 (the first check's own cost),
/// doubles each time a lease is spent at the limit's rate or faster (its units beyond the
/// fetching check's cost spent within the time the limit takes to refill them; for a lease of
/// only its fetching check's cost: when the key is back within that lease's lifetime and the
/// store had units left) while the key's recent leases dropped at most a quarter of what they
/// took, and also while a lease is on its way when its units are all counted on and more checks
/// of the key come within its lifetime (once per lease request); in each case only if a lease of
/// the doubled size would be spent within its own lifetime at the pace the key was seen at (which
/// the rate rule implies unless `max_ttl` cuts that lifetime short: a daily quota's units take
/// 8.64 s each to refill at 10,000 a day; a fixed window's end is not foreseen). It halves when a
/// lease expires more than a quarter unused, or any unit unused if its lifetime was cut short, by
/// `max_ttl` or a fixed window's end (what it drops is not refilled within it), or the store
/// cannot grant one, and starts again from 1 when the
/// check bringing a lease is dropped before its answer (the store may have granted it). While the
/// recent leases dropped more than a quarter, a check takes only its own cost. A
/// gateway thus leases only for a key it sees at about the limit's rate or faster: below that
/// rate a lease (which lives the time the limit takes to refill it) would expire part unused,
/// taking units from the store at about the limit's rate whatever the traffic, and a key served
/// by other gateways too would be denied below its limit. A bursty key (a burst spends a lease at
/// once, and the lease its last request fetches may expire before the next burst) does not have
/// lease after lease dropped either. A key that comes to a gateway now and then, or whose leases
/// would not outlive the round trip that brings them (`L / r` no longer than it), stays at 1 unit
/// there: no saving, and no unit taken from the store and dropped unused.
///
/// A lease of `L` units lives for the time the limit takes to refill `L` units at its fastest
/// quota's rate (`L × period / limit`), at most [`max_ttl`](LeasingBuilder::max_ttl); for a fixed
/// window it also ends with the window it was taken in. Units left when it ends are dropped.
///
/// # Error bounds
///
/// Every admission spends a unit the store granted at most one lease lifetime `ttl` earlier, and
/// `ttl ≤ L / r` where `r` is the fastest quota's rate. With `G` gateways sharing the store:
///
/// - **Never more than the store allows in total.** Over any span, the units admitted are at
///   most the units the store granted. For a quota that does not refill during the span (a daily
///   quota in a test) the total admitted never exceeds the quota.
/// - **Bursts, token bucket and GCRA:** in any interval of length `T`, admissions are at most
///   `burst + r × (T + ttl) ≤ burst + r × T + L`: the exact bound plus one lease, whatever `G`.
/// - **Fixed window:** exact; a lease never outlives its window (as timed by the gateway's clock:
///   exact while it runs at the store's rate).
/// - **Sliding log:** any window of one period holds at most `limit + G × (L − 1)`: units
///   leased just before the window starts and spent inside it. **Sliding window** (the
///   weighted counter): the store's own bound plus the same `G × (L − 1)`; the counter alone
///   may admit up to twice its limit in a period that straddles its windows
///   (see `docs/algorithms.md`).
/// - **Under-admission:** at any time at most `G × (L − 1)` granted units sit unspent in leases;
///   each lease that expires drops at most `L − 1`. The size rules hold the waste of a key's
///   recent leases near a quarter of what they take, so a gateway takes from the store about 4/3
///   of the units it admits, more by what one lease may drop past the mark: 1.4 times in
///   `bursts_below_the_limit_are_never_denied_and_waste_is_bounded` (bursts of 5 every 7 s
///   against 100 a minute), 1.07 for a hot key turned bursty
///   (`a_hot_key_turned_bursty_does_not_keep_dropping_large_leases`), 1.0 for steady traffic
///   below the limit's rate (no lease). A key below its limit was denied for leasing in none of
///   the tests' traffic: steady at 90 %, spread unevenly over two gateways, bursty with a second
///   gateway's traffic, and bursts of 8 arriving together every 7 s at one gateway with a request
///   every 3 s at another (89 a minute against 100, `overlapping_bursts_below_the_limit`, under
///   the token bucket, GCRA and the sliding log, no unit wasted; before 2026-12-06, when leases
///   grew past what a lifetime cut to `max_ttl` could spend, 1.7 % were denied under the sliding
///   log). On a quota that does not refill within a lease's lifetime, with a steady demand above
///   it at every gateway that leases, the total admitted reaches at least `quota − G × (L − 1)`
///   (`a_quota_slower_than_a_lease_lives_loses_no_units_to_expired_leases`: a daily quota of
///   10,000 and a check every 4, 5 or 7 s, each algorithm admitting what the store alone admits
///   less at most 63; before 2026-12-06 the fixed window admitted 7,501 of its 10,000 at one
///   check every 4 s), less up to `L − 1` for each lease that expires part unused when the
///   demand's pace falls (it then shrinks), and up to `L` for each live lease dropped with its
///   key when the lease table is full, or lost with its request (below). A check that costs
///   more than its gateway's lease holds goes to the store on its own and leaves the lease be. A
///   check that was fetching a lease and is dropped (a caller's timeout), or whose lease request
///   fails (a store timeout, after which the store may have granted it), may lose the whole
///   lease, `L` units; its units beyond the check's cost are counted as wasted and the key's
///   leases start again from one unit, so repeated drops or failures lose about one lease, not
///   one each. A fixed [`lease_size`](LeasingBuilder::lease_size) does
///   not adapt: leases larger than a gateway spends in their lifetime are dropped part unused at
///   every expiry, lease after lease (the `G × (L − 1)` bound is on what is held at once): leases
///   of 4 at 4 gateways sharing 150 requests a minute against 100 a minute admitted about half
///   of what the store alone admits under the fixed window and the sliding log
///   (`docs/round-trips.md`).
/// - **Clock:** lifetimes are counted on the wrapper's clock. The shipped `SystemClock` never
///   goes backwards; a clock set back by `X` makes live leases (and the time a key is sent
///   straight to the store) last `X` longer, which loosens the burst bound to
///   `r × (T + ttl + X)`.
///
/// These bounds assume the store keeps what it granted: if it loses a key's state (an eviction,
/// a failover), the key starts from fresh there while leases already granted still answer until
/// they expire. While the store is down, live leases keep answering, for at most `max_ttl`.
///
/// # Polling
///
/// A check that must fetch a lease decides so when it is made, and the key's other checks on this
/// gateway that its lease can spare units for wait for its answer. Poll a check once it is made
/// (as the tower layer does, within its timeout): a check made and left unpolled holds those
/// checks up. A check dropped while it brings a lease counts the lease as granted and wasted (see
/// the error bounds), even before its first poll: a store may decide when its `check` is called
/// (the in-memory store does), not only when its future is polled.
///
/// # What a local decision reports
///
/// An allowed decision answered from a lease reports the store's last answer for the key that this
/// gateway saw (to the lease, or to a check of the key that went straight to the store since: a
/// cost larger than the lease, a peek): its limit, quota index and reset, and as `remaining` the
/// units left in the lease + what that answer said remained. An answer replaces the one taken
/// when the store surely ran its check later: the check was made after that answer came
/// (`answers_taken_in_the_order_their_checks_were_sent`), or, with one quota, its reset shows it
/// (a quota's full time never moves earlier as the store runs checks:
/// `an_answer_whose_reset_shows_it_ran_later_replaces_one_in_flight_with_it`). Any other answer
/// (checks in flight together: two threads, checks polled out of their making order, answers
/// taken in either order) only lowers the `remaining` taken and moves its reset later, and, if
/// the two disagree, makes the reported reset's lag unknown, so that a
/// [`DenialCache`](crate::DenialCache) above implies no denial from it (the fewer may be an
/// earlier window's count)
/// (`answers_run_by_the_store_out_of_their_sending_order_report_no_more_than_it_has`,
/// `answers_taken_in_another_order_than_the_store_ran_them_report_no_more_than_it_has`,
/// `answers_with_equal_resets_taken_in_another_order_report_no_more_than_the_store_has`,
/// `with_several_quotas_a_stale_answer_does_not_replace_a_later_one`). Other gateways may have
/// consumed since, and the refill since is not counted. The reset is the
/// store's, never earlier: the store counted the lease's unspent units as spent, and they serve
/// only checks no larger than what is left of the lease while it lives, so the whole burst may
/// not pass before the store's reset. It is at most
/// the refill time of those units later than a store alone would say
/// (`a_leased_answer_never_resets_before_the_store_does`). A peek (cost 0) counts the live lease's
/// units as remaining if the store surely granted the lease before it ran the peek, as told
/// above (else the peek may say fewer than there are).
/// Denials always come from the store and are exact.
pub struct Leasing<S, C> {
    shared: Arc<Shared<S, C>>,
}

/// Settings for [`Leasing`].
#[must_use]
pub struct LeasingBuilder<S, C> {
    inner: S,
    clock: C,
    size: Size,
    max_ttl: Duration,
    max_keys: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Fixed(u64),
    Adaptive(u64),
}

impl Size {
    fn max(self) -> u64 {
        match self {
            Size::Fixed(n) | Size::Adaptive(n) => n,
        }
    }
}

/// Counters of a [`Leasing`] store, since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeasingStats {
    /// Checks answered from a lease, without a store call: store calls saved.
    pub local: u64,
    /// Calls made to the wrapped store (leases and checks sent straight through).
    pub store_calls: u64,
    /// Leases granted.
    pub leases: u64,
    /// Units granted in leases (including each first request's own cost).
    pub leased_units: u64,
    /// Lease requests the store denied (each followed by a check of the request's own cost, or,
    /// when the denial said more than that cost was left, by one request for exactly what was
    /// left).
    pub lease_denials: u64,
    /// Granted units dropped unspent (expired leases, leases replaced or evicted), and the units
    /// beyond their own cost of lease requests dropped before their answer or failed, which the
    /// store may have granted (counted for every failure: the store's error does not say whether
    /// the request reached it, so one that never did, a pool's wait timeout say, is counted too).
    pub wasted_units: u64,
    /// Checks that found another check of the same key bringing a lease with units to spare for
    /// them, and waited for it.
    pub waited: u64,
}

#[derive(Default)]
struct Counters {
    local: AtomicU64,
    store_calls: AtomicU64,
    leases: AtomicU64,
    leased_units: AtomicU64,
    lease_denials: AtomicU64,
    wasted_units: AtomicU64,
    waited: AtomicU64,
}

struct Shared<S, C> {
    inner: S,
    clock: C,
    size: Size,
    max_ttl_us: u64,
    shards: Box<[Mutex<Map>]>,
    per_shard_cap: usize,
    digest: KeyDigest,
    counters: Counters,
    /// The round trip of this gateway's last lease request answered (µs), any key's: a key new
    /// to the table (or back after an eviction) starts with it, so that its first lease is not
    /// one that would expire on its way.
    round_trip: AtomicU64,
}

/// An entry's `reset_lag` when its reset may be of a state a missed reset forgot (see
/// [`Forget::forget_unheard`]): too long for a decision to say, so that a `DenialCache` above
/// implies no denial from it.
const UNKNOWN_LAG: u64 = u64::MAX;

type EntryRef = Arc<Mutex<Entry>>;
type Map = HashMap<u128, EntryRef, BuildIdHasher>;

/// One key's lease state on this gateway.
#[derive(Debug, Default)]
struct Entry {
    /// Units left in the lease.
    tokens: u64,
    /// Lease requests of this key that failed: a check that waited through one goes straight to
    /// the store rather than ask for the next lease (its fellow waiters would otherwise take
    /// turns, each after the last one's failure).
    failed_fetches: u64,
    /// The round trip of the key's last lease request answered, granted or denied (µs, from its
    /// request to its answer), or, for a key new to the table, the gateway's last: a lease that
    /// would live no longer is not asked for.
    rtt: u64,
    /// End of the lease (exclusive), µs.
    expires: u64,
    /// Units the current lease was granted with.
    granted: u64,
    /// The cost of the check that fetched it (the units it took at once).
    fetched_for: u64,
    /// When it was asked for (its lifetime counts from then), µs.
    sent: u64,
    /// The store's last answer for the key that this gateway saw (to the lease, or to a check
    /// that went straight to the store since), which the lease's answers report: its limit,
    /// remaining units and reset time (µs; the latest `at + reset_after` of the answers taken),
    /// the earliest that reset can be (the latest `sent + reset_after`), and the last check
    /// number given (`report_seq`) when the latest answer taken came (`None` before the first);
    /// the last two start again once the key is reset (see `saw_answer`).
    limit: u64,
    remaining: u64,
    reset_at: u64,
    /// How much later than the store measured it `reset_at` may be: that answer's round trip
    /// (µs), which the lease's answers carry (see `Decision::with_reset_lag`) so that a denial
    /// cache above does not deny past the store's time.
    reset_lag: u64,
    quota_index: u32,
    reset_floor: u64,
    answered_upto: Option<u64>,
    /// The last check number given (`report_seq`) when resets may have gone unheard
    /// (`forget_unheard`): an answer to a check numbered up to it may be of a state a missed
    /// reset forgot, and leaves `reset_lag` unknown.
    unheard_seq: u64,
    /// The checks of the key sent to the store (lease requests, and checks straight to the store
    /// while the key has an entry), numbered in the order they were sent: the last number given.
    report_seq: u64,
    /// The number of the lease request on its way.
    fetch_report_seq: u64,
    /// The last check number given (`report_seq`) when the answer that brought the current lease
    /// came (a check numbered after it reached the store after the lease was granted), and the
    /// latest the reset in that answer can be (`at + reset_after`, µs).
    lease_came: u64,
    lease_reset_at: u64,
    /// The store's remaining units in its answer to the last lease (not refreshed by direct
    /// checks): whether the store had units left beyond the lease, for the lease size.
    lease_left: u64,
    /// Current lease size.
    size: u64,
    /// A lease is being asked for.
    fetching: bool,
    /// Units of the lease being asked for beyond its fetching check's cost that no waiting check
    /// has counted on yet: a check waits for it only if this covers its cost.
    spare: u64,
    /// Lease requests begun for this key: a waiting check counted on the `spare` of this one.
    fetch_seq: u64,
    /// When the lease being asked for was asked for, and the time the limit takes to refill it
    /// (its lifetime, but for `max_ttl` and a fixed window's end), µs.
    fetch_sent: u64,
    fetch_refill: u64,
    /// The cost of the check asking for the lease on its way, and the units beyond it.
    fetch_cost: u64,
    fetch_beyond: u64,
    /// The lease size grew for the lease being asked for (once per request).
    grew_in_flight: bool,
    waiters: Vec<Waker>,
    /// Checks go straight to the store until then (µs).
    starved_until: u64,
    /// Units this key's recent leases took from the store, and of those the units spent, each
    /// made 1/8 smaller at every lease that ends (so about the last eight leases count), in
    /// 1/1024 units (u128: a lease may be as large as 2^52 units).
    taken: u128,
    spent: u128,
    /// The current lease's units are counted in `taken` and `spent`.
    settled: bool,
    /// Resets of the key seen (each counted twice, when made and when done: see
    /// [`Leasing`]'s `Reset`), and their count when the lease request on its way was begun: a
    /// lease that comes back after a reset was counted against the state the reset forgot, and
    /// its units are not kept.
    resets: u64,
    fetch_resets: u64,
}

impl Entry {
    /// The answer of a check that took its units from the lease, at `now`, for `limit`. Its
    /// `remaining` is at most the limit, as a store's is: the lease's units and what the store
    /// last said remained can together pass it (the store refilled while the lease lived), and a
    /// client reading `r` above `q` in the headers would be misled.
    fn decision(&self, now: u64) -> Decision {
        Decision::new(
            Outcome::Allowed,
            self.limit,
            self.tokens.saturating_add(self.remaining).min(self.limit),
            Duration::from_micros(self.reset_at.saturating_sub(now)),
            self.quota_index as usize,
        )
    }

    /// Takes the store's answer `d` to the check of this key numbered `seq` (see `report_seq`),
    /// sent at `sent`, which came at `at`, as the one the lease's answers report. Its reset counts
    /// from when the answer came: the store measured it when it ran the check, somewhere between
    /// the send and the answer (a queue or a slow link may put it well after the send), so that
    /// the reset reported is never before the store's; and up to the round trip after it, which
    /// the lease's answers say.
    ///
    /// Which answer is the store's later one. A check numbered after every answer taken came
    /// (numbers are given before a check is sent) is one the store ran after them all. With one
    /// quota (`single`), resets tell it too: the store ran each check between its `sent` and its
    /// `at`, and the time the quota is full again (`reset_after` from then) never moves earlier
    /// as it runs checks (an admission moves it later, time passing leaves it; with several
    /// quotas, the binding one's may move earlier), so an answer whose reset is at most
    /// `at + reset_after` is of a check run before one whose reset is at least
    /// `sent + reset_after` if the first is below the second. A later answer replaces the
    /// state taken (the store may have refilled since). Of the others (checks in flight together
    /// with equal resets, or with several quotas: a check may reach the store after one made
    /// after it, and one task may take its answer before another takes an earlier one's), an
    /// answer only lowers the `remaining` taken and moves its reset later, never the other way,
    /// so that the lease's answers report neither the lease's units twice nor a reset before the
    /// store's. (In one window, or at one instant, the fewer left is the later state; across a
    /// window's end or a refill, resets order them unless an answer came about a window late, and
    /// then the reported remaining, unsure, carries an unknown lag.)
    ///
    /// An answer to a check sent before a reset of the key (`resets`, the key's resets when it
    /// was sent, is not the count now) describes the state the reset forgot: not taken at all.
    fn saw_answer(
        &mut self,
        seq: u64,
        resets: u64,
        sent: u64,
        at: u64,
        single: bool,
        d: &Decision,
    ) {
        if resets != self.resets {
            return;
        }
        let reset_at = at.saturating_add(micros(d.reset_after()));
        // Sent before resets went unheard: its reset may be the forgotten state's.
        let reset_lag = if seq <= self.unheard_seq {
            UNKNOWN_LAG
        } else {
            at.saturating_sub(sent)
        };
        let quota_index = u32::try_from(d.quota_index()).unwrap_or(u32::MAX);
        let floor = sent.saturating_add(micros(d.reset_after()));
        let earlier = single && reset_at < self.reset_floor;
        let later = !earlier
            && ((single && floor > self.reset_at)
                || self.answered_upto.is_none_or(|upto| seq > upto));
        self.answered_upto = Some(self.report_seq);
        if earlier {
            // Of a state the one taken came after: nothing to take from it.
            return;
        }
        self.reset_floor = self.reset_floor.max(floor);
        if later {
            self.limit = d.limit();
            self.remaining = d.remaining();
            self.reset_at = reset_at;
            self.reset_lag = reset_lag;
            self.quota_index = quota_index;
            return;
        }
        if d.remaining() != self.remaining {
            // Which of the two is the store's later state is not known: the fewer is reported,
            // but it may be an earlier window's count (or the larger may have been a refill), so
            // that a denial cache above implies no denial from it (as after resets unheard)
            // until an answer known to be later replaces it.
            self.reset_lag = UNKNOWN_LAG;
        }
        if d.remaining() < self.remaining {
            self.limit = d.limit();
            self.remaining = d.remaining();
            self.quota_index = quota_index;
        }
        self.reset_at = self.reset_at.max(reset_at);
        self.reset_lag = self.reset_lag.max(reset_lag);
    }

    /// The waiting checks' wakers, taken out to be woken once the key's lock is let go: a waker
    /// may drop its task's future on the spot (as an executor may when the task's last reference
    /// goes), and a waiting check of this key, dropped, takes the key's lock.
    #[must_use = "wake them, after the lock is let go"]
    fn take_waiters(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.waiters)
    }

    /// Drops what is left of the current lease; returns how many units that was.
    fn drop_lease(&mut self) -> u64 {
        std::mem::take(&mut self.tokens)
    }

    /// Counts a lease request of `want` units dropped before its answer (the store may have
    /// granted it) in the recent leases, as a lease of which only the check's `cost` was spent;
    /// the lease before it ends here, spent, as when an answer comes.
    fn settle_dropped(&mut self, want: u64, cost: u64) {
        let _ = self.settle(0);
        self.count_lease(want, cost);
    }

    /// Adds a lease that took `taken` units and of them spent `spent` to the recent leases' sums,
    /// after making them 1/8 smaller.
    fn count_lease(&mut self, taken: u64, spent: u64) {
        self.taken = self.taken - self.taken / 8 + u128::from(taken) * 1024;
        self.spent = self.spent - self.spent / 8 + u128::from(spent) * 1024;
    }

    /// Starts a lease request of `want` units for a check of `cost` at `now`, whose lease would
    /// live `refill` µs: its units beyond the cost are spare for waiting checks.
    fn begin_fetch(&mut self, want: u64, cost: u64, now: u64, refill: u64) {
        self.fetch_seq = self.fetch_seq.wrapping_add(1);
        self.fetch_resets = self.resets;
        self.fetch_report_seq = self.next_report_seq();
        self.spare = want - cost;
        self.fetch_cost = cost;
        self.fetch_beyond = want - cost;
        self.fetch_sent = now;
        self.fetch_refill = refill;
        self.grew_in_flight = false;
    }

    /// The key is being reset, or was: the lease's units go (the store forgets the state they
    /// were taken from), checks stop going straight to the store for a denial it forgets, and a
    /// lease request on its way keeps none of its units. Returns the units dropped (wasted).
    /// The lease is not counted in the recent leases: a reset says nothing of how thrifty the
    /// key's leases are.
    fn forget(&mut self) -> u64 {
        self.starved_until = 0;
        self.resets = self.resets.wrapping_add(1);
        // The answers taken describe the state the store forgets: the next one (of a check sent
        // after the reset) replaces them, whatever its reset.
        self.reset_floor = 0;
        self.answered_upto = None;
        self.settled = true;
        self.drop_lease()
    }

    /// Whether a reset of the key began or ended since the lease request on its way was begun.
    fn fetch_outlived_a_reset(&self) -> bool {
        self.fetch_resets != self.resets
    }

    /// The number of a check of the key sent to the store now (see `report_seq`).
    fn next_report_seq(&mut self) -> u64 {
        self.report_seq += 1;
        self.report_seq
    }

    /// Counts the current lease, ended with `left` units unspent, in the recent leases, once:
    /// `true` if this call counted it.
    fn settle(&mut self, left: u64) -> bool {
        if self.settled || self.granted == 0 {
            return false;
        }
        self.settled = true;
        self.count_lease(self.granted, self.granted.saturating_sub(left));
        true
    }

    /// Whether the recent leases dropped at most a quarter of what they took: only then may the
    /// lease grow. A rule on one lease alone is not enough: a burst spends a lease at once (at
    /// the limit's rate or faster), and the lease its last request fetches may expire before
    /// the next burst, dropped almost whole, lease after lease.
    fn thrifty(&self) -> bool {
        self.spent * 4 >= self.taken * 3
    }

    /// Whether the current lease's units beyond its fetching check's cost were all spent by
    /// `now` at the limit's rate or faster: within the share of the lease's lifetime they take to
    /// refill (`(granted − fetched_for) / r`, the lifetime being `granted / r` or less).
    fn at_rate(&self, now: u64) -> bool {
        let ttl = u128::from(self.expires.saturating_sub(self.sent));
        let rest = u128::from(self.granted.saturating_sub(self.fetched_for));
        let spent_in = u128::from(now.saturating_sub(self.sent));
        spent_in * u128::from(self.granted.max(1)) <= ttl * rest
    }

    /// Nothing lost if dropped but what it holds: no lease is being asked for, no check waits,
    /// the key is not being sent straight to the store, and either its last lease's lifetime has
    /// passed or it holds no unit and its lease size is the first one (`initial`): a key seen
    /// once, not a hot key between two leases, whose grown size would be lost.
    fn disposable(&self, now: u64, initial: u64) -> bool {
        !self.fetching
            && self.waiters.is_empty()
            && self.starved_until <= now
            && (self.expires <= now || (self.tokens == 0 && self.size <= initial))
    }
}

enum Action {
    Local(Decision),
    Fetch(u64),
    Direct,
    /// Another check is bringing a lease with units to spare for this one; with the key's
    /// failed lease requests so far, and the lease request counted on (`fetch_seq`).
    Wait(u64, u64),
}

impl<S, C> Shared<S, C> {
    /// Doubles the key's lease size (adaptive), if a lease of that size would be spent before it
    /// ends at the pace the key was seen at: `beyond` units beyond the cost of the check that
    /// fetched the lease seen (`first`, taken as the next lease's) in `elapsed` µs. A lease
    /// lives the time the limit takes to refill it, so at the limit's rate or faster this holds
    /// for any size; but a lifetime cut shorter (by `max_ttl`, as for a
    /// daily quota, whose unit takes 8.64 s to refill at 10,000 a day) holds fewer units than
    /// the key spends at the limit's rate, and the units a lease drops then are not refilled
    /// within the quota's period: lost, lease after lease, for a key above its quota.
    fn grow(&self, e: &mut Entry, limit: &Limit, first: u64, beyond: u64, elapsed: u64) {
        let Size::Adaptive(max) = self.size else {
            return;
        };
        let next = e.size.saturating_mul(2).min(max);
        let rest = u128::from(next.saturating_sub(first.max(1)));
        if rest * u128::from(elapsed) < u128::from(self.refill(limit, next)) * u128::from(beyond) {
            e.size = next;
        }
    }

    fn shrink(&self, e: &mut Entry) {
        if let Size::Adaptive(_) = self.size {
            e.size = (e.size / 2).max(1);
        }
    }

    /// `cost` units of `e`'s live lease (`e.tokens > 0 && e.expires > now`), spent without
    /// asking the store; `None` if the lease holds fewer.
    fn spend(&self, e: &mut Entry, limit: &Limit, now: u64, cost: u64) -> Option<Decision> {
        if e.tokens < cost {
            return None;
        }
        e.tokens -= cost;
        // A unit of the lease, without asking the store: marked so, with how late its reset may
        // be counted.
        let d = e.decision(now).cached().with_reset_lag(e.reset_lag);
        if e.tokens == 0 {
            let _ = e.settle(0);
            if e.at_rate(now) && e.thrifty() {
                // Spent at the limit's rate or faster, and the recent leases were not dropped
                // unused: a larger lease would have been spent too (if it lives long enough at
                // this pace), and saved calls.
                let beyond = e.granted.saturating_sub(e.fetched_for);
                self.grow(e, limit, e.fetched_for, beyond, now.saturating_sub(e.sent));
            }
        }
        self.counters.local.fetch_add(1, Ordering::Relaxed);
        Some(d)
    }

    /// What a check of `cost` at `now` does with this entry; `may_fetch` false: straight to the
    /// store where it would ask for a lease. `counted_on`: the lease request a waiting check has
    /// counted on units of (`fetch_seq`), if any.
    fn try_acquire(
        &self,
        e: &mut Entry,
        now: u64,
        limit: &Limit,
        cost: u64,
        may_fetch: bool,
        counted_on: Option<u64>,
    ) -> Action {
        // The most the limit can ever admit at once: a larger lease would be `Exceeds`.
        let cap = limit.max_cost();
        if now < e.starved_until || cost > cap {
            // Starved, or a cost no lease can cover (the store says it never passes): straight to
            // the store, and the lease, if any, stays for the checks it can serve.
            return Action::Direct;
        }
        if e.tokens > 0 && e.expires > now {
            if let Some(d) = self.spend(e, limit, now, cost) {
                return Action::Local(d);
            }
            // A live lease too small for this cost is kept for the smaller checks it can serve;
            // dropping it to lease again would throw its units away.
            return Action::Direct;
        }
        if e.fetching {
            if counted_on == Some(e.fetch_seq) {
                return Action::Wait(e.failed_fetches, e.fetch_seq);
            }
            // Wait only for units the lease on its way can spare; else to the store side by side
            // with it, as without leasing (checks waiting in line behind leases of one unit would
            // allow one store call in flight per key).
            if e.spare >= cost {
                e.spare -= cost;
                return Action::Wait(e.failed_fetches, e.fetch_seq);
            }
            // The lease on its way is all counted on, and more checks come within its lifetime:
            // a larger one would have been spent too (as a key back within a one-unit lease's
            // lifetime, below), so the next is larger, if the key's recent leases were thrifty
            // and the store had units left at its last answer (or has not answered yet).
            if !e.grew_in_flight
                && (e.lease_left > 0 || e.granted == 0)
                && now.saturating_sub(e.fetch_sent) <= e.fetch_refill
                && e.thrifty()
            {
                e.grew_in_flight = true;
                // The lease on its way, all counted on, and this check: that many units beyond
                // its fetching check's cost since it was asked for.
                let beyond = e.fetch_beyond.saturating_add(cost);
                let first = e.fetch_cost;
                self.grow(e, limit, first, beyond, now.saturating_sub(e.fetch_sent));
            }
            return Action::Direct;
        }
        if e.tokens > 0 {
            let left = e.drop_lease();
            let _ = e.settle(left);
            // Expired with more than a quarter unused: this gateway sees the key below the
            // limit's rate, and a lease (which lives the time the limit takes to refill it, or
            // less) takes units from the store at about that rate whatever the traffic, so the
            // lease is too large for the key here. Kept, the gateway would take about the
            // limit's rate from the store while serving less, and with any other gateway serving
            // the key, the key would be denied below its limit. A quarter or less is let be
            // (the jitter of a key at its rate, whose bursts do not line up with its leases); with
            // the gate on growth (`thrifty`) a gateway then takes about 4/3 of what it admits.
            // A lease cut shorter than the time the limit takes to refill it (by `max_ttl`, or a
            // fixed window's end) loses what it drops for longer than it lived: any unit unused
            // shrinks it.
            let cut_short =
                left > 0 && e.expires.saturating_sub(e.sent) < self.refill_uncut(limit, e.granted);
            if left.saturating_mul(4) > e.granted || cut_short {
                self.shrink(e);
            }
            self.counters
                .wasted_units
                .fetch_add(left, Ordering::Relaxed);
        } else if e.granted > 0
            && e.granted == e.fetched_for
            && e.lease_left > 0
            && now.saturating_sub(e.sent) <= e.expires.saturating_sub(e.sent)
            && {
                // Spent whole by its own check; counted (and grown) once, not at every check
                // that comes by before the next lease.
                e.settle(0) && e.thrifty()
            }
        {
            // A lease of only the cost of the check that fetched it (a key's first is one unit),
            // the store had units left beyond it, and the key is back within that lease's own
            // lifetime (`cost / r`): at the limit's rate or faster, a larger lease would have been
            // spent. (A key at its limit, with nothing left, would only have its larger lease
            // denied.)
            self.grow(e, limit, e.fetched_for, cost, now.saturating_sub(e.sent));
        }
        if !may_fetch {
            return Action::Direct;
        }
        e.fetching = true;
        // Adaptive: while the recent leases dropped more than a quarter of what they took, only
        // the check's own cost is taken, so that nothing more is dropped until they have made up
        // for it.
        let size = match self.size {
            Size::Adaptive(_) if !e.thrifty() => 1,
            _ => e.size,
        };
        let mut want = size.max(cost).min(cap);
        let mut refill = self.refill(limit, want);
        if refill <= e.rtt && want > cost {
            // A lease that would live no longer than the key's last lease request took (or less
            // than a microsecond) expires as it arrives: its units beyond the check's own would
            // all be dropped, and the checks waiting for them would wait a round trip for
            // nothing. The check takes its cost only.
            want = cost;
            refill = self.refill(limit, want);
        }
        e.begin_fetch(want, cost, now, refill);
        Action::Fetch(want)
    }

    /// The time the limit's fastest-refilling quota takes to refill `units`, at most `max_ttl`,
    /// in µs: the lifetime of a lease of `units` (a fixed window's ends it earlier).
    fn refill(&self, limit: &Limit, units: u64) -> u64 {
        self.refill_uncut(limit, units).min(self.max_ttl_us)
    }

    /// The time the limit's fastest-refilling quota takes to refill `units`, in µs, whatever
    /// `max_ttl`.
    fn refill_uncut(&self, limit: &Limit, units: u64) -> u64 {
        limit
            .quotas()
            .iter()
            .map(|q| {
                let t = u128::from(q.period_micros()) * u128::from(units) / u128::from(q.limit());
                u64::try_from(t).unwrap_or(u64::MAX)
            })
            .min()
            .unwrap_or(0)
    }

    /// The lifetime of a lease of `units` granted with decision `d`, in µs.
    fn ttl(&self, limit: &Limit, units: u64, d: &Decision) -> u64 {
        let mut ttl = self.refill(limit, units);
        if limit.algorithm() == Algorithm::FixedWindow {
            // The grant's reset is the end of its window (it holds a count > 0).
            ttl = ttl.min(micros(d.reset_after()));
        }
        ttl
    }

    /// Records a lease request's round trip, for the keys new to the table.
    fn saw_round_trip(&self, rtt: u64) {
        self.round_trip.store(rtt, Ordering::Relaxed);
    }

    fn id(&self, key: &[u8], fingerprint: u64) -> u128 {
        self.digest.digest_u128(key, fingerprint, 0)
    }

    /// The shard of the table that holds `id`'s entry.
    fn shard(&self, id: u128) -> &Mutex<Map> {
        &self.shards[((id >> 64) as usize) & (self.shards.len() - 1)]
    }

    /// The entry of `id`, if there is one.
    fn existing(&self, id: u128) -> Option<EntryRef> {
        self.shard(id).lock().get(&id).map(Arc::clone)
    }

    /// The key `id` is being reset, or was: its lease ends, if it has an entry (see
    /// [`Entry::forget`]).
    fn end_lease(&self, id: u128) {
        if let Some(entry) = self.existing(id) {
            let dropped = entry.lock().forget();
            self.counters
                .wasted_units
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// The entry of `id`, made if needed; `None` if the table is full of busy entries.
    fn entry(&self, id: u128, now: u64) -> Option<EntryRef> {
        let mut shard = self.shard(id).lock();
        if let Some(e) = shard.get(&id) {
            return Some(Arc::clone(e));
        }
        let cap = self.per_shard_cap.max(1);
        let initial = match self.size {
            Size::Fixed(n) => n,
            // One unit: a key's first check here takes no more than it needs, so keys that
            // come to this gateway once waste nothing.
            Size::Adaptive(_) => 1,
        };
        if shard.len() >= cap {
            // Entries no check holds and with nothing to keep first (see `disposable`: a key
            // that spent a grown lease to the end within its lifetime is not one of them, being
            // maybe a hot key between two leases), then any no check holds (their unspent units
            // are dropped).
            let wasted = &self.counters.wasted_units;
            shard.retain(|_, e| {
                if Arc::strong_count(e) > 1 {
                    return true;
                }
                let e = e.lock();
                if e.disposable(now, initial) {
                    // An expired lease's units are dropped with it.
                    wasted.fetch_add(e.tokens, Ordering::Relaxed);
                    return false;
                }
                true
            });
            // An eighth of the shard is left free, as in the memory store and the denial cache:
            // a sweep that found only a few entries to drop would otherwise be followed by
            // another after as many new keys, each going over the whole shard (with leases
            // ending about as fast as new keys come, every new key's did).
            let keep = cap - (cap / 8).max(1);
            if shard.len() > keep {
                // Then, among those no check holds, the ones with the smallest lease size, then
                // the fewest units left: a flood of new keys, each holding a lease of a unit or
                // two, must not cost a hot key its lease (up to `max_lease − 1` units it would
                // waste at the store, again and again), nor, between two of its leases, its
                // lease size (a store call for each of its next checks while it grows back).
                let mut free: Vec<(u64, u64, u128)> = shard
                    .iter()
                    .filter(|(_, e)| Arc::strong_count(e) == 1)
                    .map(|(id, e)| {
                        let e = e.lock();
                        (e.size, e.tokens, *id)
                    })
                    .collect();
                let n = (shard.len() - keep).min(free.len());
                if n > 0 {
                    free.select_nth_unstable(n - 1);
                    for &(_, _, id) in &free[..n] {
                        if let Some(e) = shard.remove(&id) {
                            wasted.fetch_add(e.lock().tokens, Ordering::Relaxed);
                        }
                    }
                }
            }
            if shard.len() >= cap {
                return None;
            }
        }
        let e = Arc::new(Mutex::new(Entry {
            size: initial,
            rtt: self.round_trip.load(Ordering::Relaxed),
            ..Entry::default()
        }));
        shard.insert(id, Arc::clone(&e));
        Some(e)
    }
}

impl<S: Store, C: Clock> Leasing<S, C> {
    /// Leasing over `inner`, timed by `clock`, with the default settings (adaptive leases up to
    /// [`DEFAULT_MAX_LEASE`] units).
    pub fn new(inner: S, clock: C) -> Self {
        Leasing::builder(inner, clock)
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }

    /// Settings, starting from the defaults.
    pub fn builder(inner: S, clock: C) -> LeasingBuilder<S, C> {
        LeasingBuilder {
            inner,
            clock,
            size: Size::Adaptive(DEFAULT_MAX_LEASE),
            max_ttl: DEFAULT_MAX_TTL,
            max_keys: DEFAULT_MAX_LEASED_KEYS,
        }
    }
}

impl<S, C> LeasingBuilder<S, C> {
    /// Every lease is `n` units (at least 1): no adaptation. Replaces a [`max_lease`](Self::max_lease)
    /// given before it (the last of the two wins). A lease that would live no longer
    /// than the store's round trip (the key's last lease request's, or the gateway's last for a
    /// key new to the table; or less than a microsecond) is not taken: the check asks the store
    /// for its own cost only.
    pub fn lease_size(mut self, n: u64) -> Self {
        self.size = Size::Fixed(n);
        self
    }

    /// Adaptive leases of at most `n` units (at least 1; the default, with
    /// [`DEFAULT_MAX_LEASE`]). Replaces a [`lease_size`](Self::lease_size) given before it (the
    /// last of the two wins).
    pub fn max_lease(mut self, n: u64) -> Self {
        self.size = Size::Adaptive(n);
        self
    }

    /// The longest a lease lives (default [`DEFAULT_MAX_TTL`]); a lease also never outlives the
    /// time the limit takes to refill it. Must be at least one microsecond.
    pub fn max_ttl(mut self, d: Duration) -> Self {
        self.max_ttl = d;
        self
    }

    /// The most keys with lease state held at once (default [`DEFAULT_MAX_LEASED_KEYS`]). When
    /// full, keys with nothing to keep are dropped first (their last lease expired, or none of its
    /// units left and their lease size not grown, unless being sent straight to the store), then
    /// the rest with the smallest lease size and fewest units left until an eighth of the shard
    /// is free (a hot key keeps its place and its lease size, even between two leases); a key that
    /// finds no room is checked at the store directly.
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// Builds the wrapper, or says which setting is wrong.
    pub fn build(self) -> Result<Leasing<S, C>, ConfigError> {
        if self.size.max() == 0 {
            return Err(ConfigError::InvalidSetting {
                // Named as the setting that was given.
                name: match self.size {
                    Size::Fixed(_) => "lease_size",
                    Size::Adaptive(_) => "max_lease",
                },
                reason: "must be at least 1",
            });
        }
        let max_ttl_us = micros(self.max_ttl);
        if max_ttl_us == 0 {
            return Err(ConfigError::InvalidSetting {
                name: "max_ttl",
                reason: "must be at least one microsecond",
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidSetting {
                name: "max_keys",
                reason: "must be at least 1",
            });
        }
        // A power of two of shards (the index is masked), each holding an equal share: never more
        // than `max_keys` in all.
        let shards = SHARDS.min(crate::memory_store::prev_power_of_two(self.max_keys));
        Ok(Leasing {
            shared: Arc::new(Shared {
                inner: self.inner,
                clock: self.clock,
                size: self.size,
                max_ttl_us,
                shards: (0..shards).map(|_| Mutex::new(Map::default())).collect(),
                per_shard_cap: self.max_keys / shards,
                digest: KeyDigest::random(),
                counters: Counters::default(),
                round_trip: AtomicU64::new(0),
            }),
        })
    }
}

impl<S: fmt::Debug, C> fmt::Debug for LeasingBuilder<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasingBuilder")
            .field("inner", &self.inner)
            .field("size", &self.size)
            .field("max_ttl", &self.max_ttl)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<S: fmt::Debug, C> fmt::Debug for Leasing<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leasing")
            .field("inner", &self.shared.inner)
            .field("size", &self.shared.size)
            .field("max_ttl_us", &self.shared.max_ttl_us)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A clone shares the leases, their sizes and the counters: one `Leasing` for several layers
/// (a gateway's leases of a key are then one pool, not one per layer).
impl<S, C> Clone for Leasing<S, C> {
    fn clone(&self) -> Self {
        Leasing {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, C> Leasing<S, C> {
    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.shared.inner
    }

    /// Counters since the wrapper was made.
    pub fn stats(&self) -> LeasingStats {
        let c = &self.shared.counters;
        LeasingStats {
            local: c.local.load(Ordering::Relaxed),
            store_calls: c.store_calls.load(Ordering::Relaxed),
            leases: c.leases.load(Ordering::Relaxed),
            leased_units: c.leased_units.load(Ordering::Relaxed),
            lease_denials: c.lease_denials.load(Ordering::Relaxed),
            wasted_units: c.wasted_units.load(Ordering::Relaxed),
            waited: c.waited.load(Ordering::Relaxed),
        }
    }

    /// Ends `key`'s lease under the limit whose [`fingerprint`](Limit::fingerprint) is
    /// `limit_fingerprint`, as this wrapper's own [`reset`](Reset::reset) of it does: for a reset
    /// made through another gateway, which this one learns of from the store (the Redis store's
    /// `watch_resets`). The lease's unspent units go (they were taken from the state the reset
    /// forgot), and a lease request on its way keeps none of its units when it comes back. Other
    /// keys and limits are untouched.
    pub fn forget(&self, key: &[u8], limit_fingerprint: u64) {
        let shared = &self.shared;
        shared.end_lease(shared.id(key, limit_fingerprint));
    }

    /// How many keys hold lease state now (at most [`max_keys`](LeasingBuilder::max_keys)).
    pub fn held_keys(&self) -> usize {
        self.shared.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Units held in leases now, over every key (locks each entry in turn): granted, not yet
    /// spent, and not yet dropped. A lease that has expired still counts here until the key's
    /// next check or an eviction drops it, when its units move to
    /// [`wasted_units`](LeasingStats::wasted_units); so `admitted + wasted + outstanding` accounts
    /// for every unit taken from the store, and the units a gateway can still spend are at most
    /// this.
    pub fn outstanding_units(&self) -> u64 {
        self.shared
            .shards
            .iter()
            .map(|s| s.lock().values().map(|e| e.lock().tokens).sum::<u64>())
            .sum()
    }
}

impl<S: Store, C: Clock + 'static> Store for Leasing<S, C> {
    type Error = S::Error;
    type Future = LeaseFuture<S, C>;

    fn failure_domains(&self) -> usize {
        self.shared.inner.failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.shared.inner.failure_domain(key)
    }

    /// The wrapped store's: each call this store sends is bounded by it. A check can wait for
    /// up to three calls in a row, so up to three times this: a lease request denied, the
    /// request for exactly the units the denial said were left, denied too, then its own cost
    /// (a check waiting on another's lease request waits through the same calls); more over a
    /// store that queues a check behind the call in flight, as the Redis crate's coalescing
    /// store does. The tower layer's own timeout bounds the whole wait.
    fn response_timeout(&self) -> Option<std::time::Duration> {
        self.shared.inner.response_timeout()
    }

    /// Units of a live lease that covers `cost`, spent as [`check`](Store::check) spends them;
    /// else the wrapped store's cached answer.
    fn check_cached(&self, key: &[u8], limit: &Limit, cost: u64) -> Option<Decision> {
        let sh = &self.shared;
        let leased = cost > 0
            && cost <= sh.size.max()
            && cost <= limit.max_cost()
            && !(limit.algorithm() == Algorithm::FixedWindow && limit.quotas().len() > 1);
        if leased && let Some(entry) = sh.existing(sh.id(key, limit.fingerprint())) {
            let now = sh.clock.now().as_micros();
            let mut e = entry.lock();
            if now >= e.starved_until
                && e.tokens > 0
                && e.expires > now
                && let Some(d) = sh.spend(&mut e, limit, now, cost)
            {
                return Some(d);
            }
        }
        sh.inner.check_cached(key, limit, cost)
    }

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> Self::Future {
        let sh = &self.shared;
        let direct = cost == 0
            || cost > sh.size.max()
            || (limit.algorithm() == Algorithm::FixedWindow && limit.quotas().len() > 1);
        let id = sh.id(key, limit.fingerprint());
        let now = sh.clock.now().as_micros();
        // A check straight to the store still tells a key with a lease what the store has left
        // (its answer is then the one the lease's answers report), and a peek counts the lease's
        // units as remaining.
        // Only a key with an entry: a check straight to the store makes none, so that a flood of
        // them in flight cannot crowd a hot key's lease out of the table (an answer to one made
        // before the key's first lease is then not taken).
        let entry = if direct {
            Err(sh.existing(id))
        } else {
            sh.entry(id, now).ok_or(None)
        };
        let entry = match entry {
            Ok(entry) => entry,
            Err(existing) => {
                sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                // Numbered before it is sent (see `Entry::report_seq`).
                let single = one_quota(limit);
                let seen =
                    existing.map(|entry| Seen::new(entry, now, cost == 0, single, sh.clone()));
                return LeaseFuture {
                    state: St::Direct {
                        fut: sh.inner.check(key, limit, cost),
                        seen,
                    },
                    ctx: None,
                };
            }
        };
        let action = sh.try_acquire(&mut entry.lock(), now, limit, cost, true, None);
        let ctx = |entry| {
            Some(Ctx {
                shared: Arc::clone(sh),
                key: key.into(),
                limit: limit.clone(),
                cost,
                entry,
            })
        };
        match action {
            Action::Local(d) => LeaseFuture {
                state: St::Ready { out: Some(d) },
                ctx: None,
            },
            Action::Direct => {
                sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                let single = one_quota(limit);
                let seen = Some(Seen::new(entry, now, false, single, sh.clone()));
                LeaseFuture {
                    state: St::Direct {
                        fut: sh.inner.check(key, limit, cost),
                        seen,
                    },
                    ctx: None,
                }
            }
            Action::Fetch(want) => {
                sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                let fetching = FetchStarting(&entry);
                let fut = sh.inner.check(key, limit, want);
                std::mem::forget(fetching);
                LeaseFuture {
                    state: St::Lease {
                        fut,
                        want,
                        sent: now,
                        second: false,
                    },
                    ctx: ctx(entry),
                }
            }
            Action::Wait(failures, counted_on) => {
                sh.counters.waited.fetch_add(1, Ordering::Relaxed);
                LeaseFuture {
                    state: St::Wait {
                        failures,
                        counted_on,
                    },
                    ctx: ctx(entry),
                }
            }
        }
    }
}

/// The wrapper's clock in µs, behind a type that names neither the store nor the clock.
trait NowMicros: Send + Sync {
    fn now_micros(&self) -> u64;
}

impl<S: Send + Sync, C: Clock> NowMicros for Shared<S, C> {
    fn now_micros(&self) -> u64 {
        self.clock.now().as_micros()
    }
}

/// A check straight to the store of a key that has an entry: its answer becomes the one the
/// lease's answers report; a peek's also counts the lease's units still live as remaining.
struct Seen {
    entry: EntryRef,
    /// Its number among the key's checks sent to the store (see `Entry::report_seq`).
    seq: u64,
    /// The key's resets seen when it was sent (`Entry::resets`).
    resets: u64,
    /// When the check was sent (µs).
    sent: u64,
    peek: bool,
    /// The limit has one quota (see `Entry::saw_answer`).
    single: bool,
    /// The wrapper's clock, read when the answer comes (see `Entry::saw_answer`).
    clock: Arc<dyn NowMicros>,
}

impl Seen {
    /// A check of `entry`'s key sent to the store now.
    fn new(
        entry: EntryRef,
        sent: u64,
        peek: bool,
        single: bool,
        clock: Arc<dyn NowMicros>,
    ) -> Self {
        let (seq, resets) = {
            let mut e = entry.lock();
            (e.next_report_seq(), e.resets)
        };
        Seen {
            entry,
            seq,
            resets,
            sent,
            peek,
            single,
            clock,
        }
    }

    fn answered(self, d: &mut Decision) {
        let at = self.clock.now_micros();
        let mut e = self.entry.lock();
        e.saw_answer(self.seq, self.resets, self.sent, at, self.single, d);
        // The live lease's units, if the store surely granted them before it ran the peek: their
        // answer came before the peek was numbered, or (one quota) the peek's reset is past the
        // lease's (see `Entry::saw_answer`). Else the store may have counted them as remaining in
        // the peek's answer, and they are not added (the peek may then say fewer than there are;
        // a peek implies no denial).
        let peek_floor = self.sent.saturating_add(micros(d.reset_after()));
        let lease_first = e.lease_came < self.seq || (self.single && peek_floor > e.lease_reset_at);
        if self.peek && e.tokens > 0 && self.sent < e.expires && lease_first {
            *d = Decision::new(
                d.outcome(),
                d.limit(),
                d.remaining().saturating_add(e.tokens).min(d.limit()),
                d.reset_after(),
                d.quota_index(),
            );
        }
    }
}

struct Ctx<S, C> {
    shared: Arc<Shared<S, C>>,
    key: Box<[u8]>,
    limit: Limit,
    cost: u64,
    entry: EntryRef,
}

impl<S, C> Ctx<S, C> {
    /// The limit has one quota (see `Entry::saw_answer`).
    fn single(&self) -> bool {
        one_quota(&self.limit)
    }
}

/// Whether `limit` has one quota, whose reset orders the store's answers (see
/// `Entry::saw_answer`).
fn one_quota(limit: &Limit) -> bool {
    limit.quotas().len() == 1
}

impl<S: Store, C: Clock + 'static> Ctx<S, C> {
    /// This check, sent straight to the store now, to be seen by the key's entry.
    fn seen(&self, now: u64) -> Seen {
        Seen::new(
            Arc::clone(&self.entry),
            now,
            false,
            self.single(),
            self.shared.clone(),
        )
    }
}

pin_project! {
    #[project = StProj]
    enum St<F> {
        // Answered locally.
        Ready { out: Option<Decision> },
        // Straight to the store, answer passed on (and, with `seen`, taken by the key's entry).
        Direct { #[pin] fut: F, seen: Option<Seen> },
        // Waiting for another check of this key to bring a lease; `failures`: the key's failed
        // lease requests when it began; `counted_on`: the lease request whose spare units it
        // counted on.
        Wait { failures: u64, counted_on: u64 },
        // Asking the store for a lease of `want`.
        // `second`: a smaller lease, asked for after a denial said how many units were left.
        Lease { #[pin] fut: F, want: u64, sent: u64, second: bool },
        Done,
    }
}

pin_project! {
    /// The future of a [`Leasing`] check: answered from a lease, or waiting for one, or a store
    /// call.
    pub struct LeaseFuture<S, C>
    where
        S: Store,
    {
        #[pin]
        state: St<S::Future>,
        ctx: Option<Ctx<S, C>>,
    }

    impl<S, C> PinnedDrop for LeaseFuture<S, C>
    where
        S: Store,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let Some(ctx) = this.ctx.as_ref() else {
                return;
            };
            match this.state.project() {
                // A check dropped while it was bringing a lease must let the waiting checks go
                // on, to the store: the lease may never come (a store slower than the callers'
                // timeout). The store may have granted it (a store may decide when its `check`
                // is called, before any poll, as the in-memory store does), so it counts as a
                // lease dropped unspent but for the check's own cost, and the key's leases start
                // again from one unit (they grow back as they are spent): repeated drops do not
                // take a whole lease from the store each time.
                StProj::Lease { want, .. } => finish(&ctx.entry, |e| {
                    e.failed_fetches += 1;
                    dropped_before_answer(&ctx.shared, e, *want, ctx.cost);
                }),
                // A waiting check dropped gives back the units it counted on.
                StProj::Wait { counted_on, .. } => {
                    let mut e = ctx.entry.lock();
                    if e.fetching && e.fetch_seq == *counted_on {
                        e.spare = e.spare.saturating_add(ctx.cost);
                    }
                }
                _ => {}
            }
        }
    }
}

/// A lease request of `want` units for a check of `cost`, dropped before its answer: counted as
/// granted and wasted but for the cost, and an adaptive key's leases start again from one unit.
fn dropped_before_answer<S, C>(sh: &Shared<S, C>, e: &mut Entry, want: u64, cost: u64) {
    let unspent = want.saturating_sub(cost);
    if unspent > 0 {
        e.settle_dropped(want, cost);
        if let Size::Adaptive(_) = sh.size {
            e.size = 1;
        }
        sh.counters
            .wasted_units
            .fetch_add(unspent, Ordering::Relaxed);
    }
}

impl<S: Store, C> fmt::Debug for LeaseFuture<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            St::Ready { .. } => "local",
            St::Direct { .. } => "store call",
            St::Wait { .. } => "waiting for a lease",
            St::Lease { .. } => "asking for a lease",
            St::Done => "done",
        };
        f.debug_struct("LeaseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S: Store, C: Clock + 'static> Future for LeaseFuture<S, C> {
    type Output = Result<Decision, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let ctx = this.ctx.as_ref();
            match this.state.project() {
                StProj::Ready { out } => {
                    let d = out.take().expect("LeaseFuture polled after completion");
                    return Poll::Ready(Ok(d));
                }
                StProj::Direct { fut, seen } => {
                    let mut out = std::task::ready!(fut.poll(cx));
                    if let (Ok(d), Some(seen)) = (&mut out, seen.take()) {
                        seen.answered(d);
                    }
                    return Poll::Ready(out);
                }
                StProj::Done => panic!("LeaseFuture polled after completion"),
                StProj::Wait {
                    failures,
                    counted_on,
                } => {
                    let ctx = ctx.expect("a waiting check has its context");
                    let sh = &ctx.shared;
                    let now = sh.clock.now().as_micros();
                    let mut e = ctx.entry.lock();
                    // A lease request failed while this check waited: it asks the store for
                    // itself (a live lease brought since still serves it).
                    let may_fetch = e.failed_fetches == *failures;
                    match sh.try_acquire(
                        &mut e,
                        now,
                        &ctx.limit,
                        ctx.cost,
                        may_fetch,
                        Some(*counted_on),
                    ) {
                        Action::Local(d) => {
                            drop(e);
                            self.as_mut().project().state.set(St::Done);
                            return Poll::Ready(Ok(d));
                        }
                        Action::Wait(_, seq) => {
                            // Counted on the lease request now on its way (a new one, if the one
                            // it waited for came without units for it).
                            *counted_on = seq;
                            if !e.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                                e.waiters.push(cx.waker().clone());
                            }
                            return Poll::Pending;
                        }
                        Action::Direct => {
                            drop(e);
                            sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                            let seen = Some(ctx.seen(now));
                            let fut = sh.inner.check(&ctx.key, &ctx.limit, ctx.cost);
                            self.as_mut().project().state.set(St::Direct { fut, seen });
                        }
                        Action::Fetch(want) => {
                            drop(e);
                            sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                            let fetching = FetchStarting(&ctx.entry);
                            let fut = sh.inner.check(&ctx.key, &ctx.limit, want);
                            std::mem::forget(fetching);
                            self.as_mut().project().state.set(St::Lease {
                                fut,
                                want,
                                sent: now,
                                second: false,
                            });
                        }
                    }
                }
                StProj::Lease {
                    fut,
                    want,
                    sent,
                    second,
                } => {
                    let out = std::task::ready!(fut.poll(cx));
                    let (want, sent, second) = (*want, *sent, *second);
                    let ctx = ctx.expect("a lease request has its context");
                    let sh = &ctx.shared;
                    let cost = ctx.cost;
                    let d = match out {
                        Ok(d) => d,
                        Err(err) => {
                            // The store may have granted it all the same (a Redis timeout: the
                            // script may have run): counted as a lease dropped before its answer.
                            finish(&ctx.entry, |e| {
                                e.failed_fetches += 1;
                                dropped_before_answer(sh, e, want, cost);
                            });
                            self.as_mut().project().state.set(St::Done);
                            return Poll::Ready(Err(err));
                        }
                    };
                    if d.is_allowed() {
                        let ttl = sh.ttl(&ctx.limit, want, &d);
                        let answered = sh.clock.now().as_micros();
                        let rtt = answered.saturating_sub(sent);
                        sh.saw_round_trip(rtt);
                        let (local, lag) = finish(&ctx.entry, |e| {
                            e.rtt = rtt;
                            if want > cost && sent.saturating_add(ttl) <= answered {
                                // Expired on its way: the checks that waited for its units go to
                                // the store side by side, as after a failed lease request,
                                // rather than wait in turn for the next lease.
                                e.failed_fetches += 1;
                            }
                            // The lease before it, if spent whole by its own check, ends here.
                            let _ = e.settle(0);
                            // Granted before a reset: only the check's own cost is kept, the rest
                            // wasted, and the lease not counted in the recent leases (as
                            // `forget` does).
                            let outlived = e.fetch_outlived_a_reset();
                            e.tokens = if outlived {
                                sh.counters
                                    .wasted_units
                                    .fetch_add(want - cost, Ordering::Relaxed);
                                0
                            } else {
                                want - cost
                            };
                            e.granted = want;
                            e.settled = outlived;
                            e.fetched_for = cost;
                            e.sent = sent;
                            e.expires = sent.saturating_add(ttl);
                            e.lease_left = d.remaining();
                            e.lease_came = e.report_seq;
                            e.lease_reset_at = answered.saturating_add(micros(d.reset_after()));
                            let single = ctx.single();
                            e.saw_answer(
                                e.fetch_report_seq,
                                e.fetch_resets,
                                sent,
                                answered,
                                single,
                                &d,
                            );
                            // Outlived a reset: no unit kept, and the key's last answer taken
                            // may be from before the reset: this check's is the store's own.
                            // Else the remaining reported is the key's, which an answer sent
                            // before resets went unheard may have lowered (its lag then unknown).
                            if outlived {
                                (d, 0)
                            } else if e.reset_lag == UNKNOWN_LAG {
                                (e.decision(sent), UNKNOWN_LAG)
                            } else {
                                (e.decision(sent), 0)
                            }
                        });
                        if want > cost {
                            sh.counters.leases.fetch_add(1, Ordering::Relaxed);
                            sh.counters.leased_units.fetch_add(want, Ordering::Relaxed);
                        }
                        // The store's own answer, with the lease's units counted as remaining.
                        let answer = Decision::new(
                            Outcome::Allowed,
                            d.limit(),
                            local.remaining(),
                            d.reset_after(),
                            d.quota_index(),
                        )
                        .with_reset_lag(lag);
                        self.as_mut().project().state.set(St::Done);
                        return Poll::Ready(Ok(answer));
                    }
                    if want == cost {
                        // The request's own answer: a denial of its cost.
                        finish(&ctx.entry, |e| {
                            if !e.fetch_outlived_a_reset() {
                                starve(e, sent, &d);
                            }
                        });
                        self.as_mut().project().state.set(St::Done);
                        return Poll::Ready(Ok(d));
                    }
                    sh.counters.lease_denials.fetch_add(1, Ordering::Relaxed);
                    let left = d.remaining();
                    let now = sh.clock.now().as_micros();
                    // The denial's round trip is a sample too (recorded in the key's entry under
                    // the lock each branch below takes): a second request for the units left
                    // that would expire on its way is not sent.
                    let rtt = now.saturating_sub(sent);
                    sh.saw_round_trip(rtt);
                    if !second && left > cost && left < want && sh.refill(&ctx.limit, left) > rtt {
                        // The store said how many units it has left: ask for exactly those, once
                        // (this check stays the key's one lease request in flight). A new
                        // request, with fewer units to spare: the checks waiting count on its
                        // units again (or go to the store).
                        let waiters = {
                            let mut e = ctx.entry.lock();
                            e.rtt = rtt;
                            if let Size::Adaptive(_) = sh.size {
                                e.size = left;
                            }
                            e.begin_fetch(left, cost, now, sh.refill(&ctx.limit, left));
                            e.take_waiters()
                        };
                        wake(waiters);
                        sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                        let fut = sh.inner.check(&ctx.key, &ctx.limit, left);
                        self.as_mut().project().state.set(St::Lease {
                            fut,
                            want: left,
                            sent: now,
                            second: true,
                        });
                        continue;
                    }
                    // The lease does not fit. Until it would (its retry-after), the key's checks
                    // go straight to the store: this one now, for its own cost (so a nearly
                    // exhausted key still admits exactly what is left), and the waiting ones at
                    // once, side by side (a coalescing store below merges them).
                    finish(&ctx.entry, |e| {
                        e.rtt = rtt;
                        sh.shrink(e);
                        if !e.fetch_outlived_a_reset() {
                            starve(e, sent, &d);
                        }
                    });
                    sh.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                    let seen = Some(ctx.seen(now));
                    let fut = sh.inner.check(&ctx.key, &ctx.limit, cost);
                    self.as_mut().project().state.set(St::Direct { fut, seen });
                }
            }
        }
    }
}

/// [`forget`](Leasing::forget); resets unheard leave the leases as they are (see
/// [`Forget::forget_unheard`]), but their answers no longer say how late their reset may be,
/// and a key starved of leases (its last lease request denied) may lease again at once.
impl<S, C> Forget for Leasing<S, C> {
    fn forget(&self, key: &[u8], limit_fingerprint: u64) {
        Leasing::forget(self, key, limit_fingerprint);
    }

    fn forget_unheard(&self) {
        // The store's answer each lease reports (its remaining and reset) may describe a state a
        // missed reset forgot: its lag unknown (see `Decision::with_reset_lag`), so that a
        // `DenialCache` above implies no denial from the lease's admissions, which would outlast
        // the store's. The answer to the key's next check sent to the store says it again.
        // Answers to checks sent before now, come later, keep it unknown (`unheard_seq`).
        for shard in &self.shared.shards {
            for entry in shard.lock().values() {
                let mut e = entry.lock();
                e.reset_lag = UNKNOWN_LAG;
                e.unheard_seq = e.report_seq;
                // A key starved of leases (its last lease request denied) leases again: the
                // denial may be of a forgotten state, and going straight to the store for the
                // rest of its wait would cost a store call a check (each answer exact either way).
                e.starved_until = 0;
            }
        }
    }
}

/// Resets the key in the wrapped store. The key's lease on this gateway ends when the reset is
/// made and again when it completes (or is dropped, as the store may have reset all the same):
/// its units go, and a lease request on its way meanwhile keeps none of its units when it comes
/// back. They were counted against the state the reset forgot, or, if the request reached the
/// store after the reset (queued in front of it), against the fresh quota: the key then gets up
/// to one lease fewer than a full quota after the reset, never more. Checks waiting for that
/// lease then ask for another.
impl<S: Reset, C: Clock + 'static> Reset for Leasing<S, C> {
    type ResetFuture = WrapperResetFuture<S::ResetFuture>;

    fn reset(&self, key: &[u8], limit: &Limit) -> Self::ResetFuture {
        let shared = Arc::clone(&self.shared);
        let id = shared.id(key, limit.fingerprint());
        // The key's entry now, and again at the end: a check made since the reset began may have
        // made one, its lease request counted against the state the reset forgets.
        shared.end_lease(id);
        let fut = shared.inner.reset(key, limit);
        WrapperResetFuture::new(fut, move || shared.end_lease(id))
    }
}

/// Ends this check's turn as the key's fetcher: applies `f`, then wakes the waiting checks.
/// Armed between taking a key's lease request (`fetching` set) and holding the store's future
/// for it, whose drop would hand the request on: if the store's `check` panics, the key's
/// waiting checks are let go instead of waiting for good. Forgotten once the future is held.
struct FetchStarting<'a>(&'a EntryRef);

impl Drop for FetchStarting<'_> {
    fn drop(&mut self) {
        finish(self.0, |_| ());
    }
}

/// Ends the key's lease request: `f` on the entry, then no request in flight, and the waiting
/// checks woken once the key's lock is let go.
fn finish<T>(entry: &EntryRef, f: impl FnOnce(&mut Entry) -> T) -> T {
    let (out, waiters) = {
        let mut e = entry.lock();
        let out = f(&mut e);
        e.fetching = false;
        (out, e.take_waiters())
    };
    wake(waiters);
    out
}

/// Wakes `waiters`, taken out of an entry whose lock is no longer held.
fn wake(waiters: Vec<Waker>) {
    for w in waiters {
        w.wake();
    }
}

/// After a denial (of a lease, or of a request's own cost): straight to the store until it may
/// pass.
fn starve(e: &mut Entry, sent: u64, d: &Decision) {
    if let Some(wait) = d.retry_after() {
        e.starved_until = e.starved_until.max(sent.saturating_add(micros(wait)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, MemoryStore};

    /// A full shard whose sweep finds only one entry with nothing to keep frees an eighth of
    /// itself all the same (the ones with the smallest leases): otherwise, with leases ending
    /// about as fast as new keys come, every new key went over the whole shard.
    #[test]
    fn a_sweep_that_frees_a_few_entries_frees_an_eighth() {
        const CAP: usize = 64;
        let clock = ManualClock::new();
        let gw = Leasing::builder(MemoryStore::new(), clock)
            .max_keys(SHARDS * CAP)
            .build()
            .unwrap();
        let shared = &gw.shared;
        assert_eq!(shared.per_shard_cap, CAP);
        // Ids of the first shard, each entry holding a live lease of one unit that ends at its
        // number (in µs).
        let id = |k: u64| u128::from(k) << 64 << SHARDS.trailing_zeros();
        let live = |k: u64| {
            let e = shared.entry(id(k), k).unwrap();
            let mut e = e.lock();
            e.tokens = 1;
            e.expires = k + CAP as u64;
        };
        for k in 0..CAP as u64 {
            live(k);
        }
        for k in CAP as u64..1_000 {
            // The oldest lease has just ended: one entry to drop, as many as the new key needs.
            let before = shared.shard(id(k)).lock().len();
            live(k);
            let after = shared.shard(id(k)).lock().len();
            if before >= CAP {
                assert!(
                    after <= CAP - CAP / 8 + 1,
                    "a sweep at key {k} left {after} of {CAP}"
                );
            }
            assert!(after <= CAP);
        }
    }
}
