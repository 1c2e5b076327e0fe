//! `Turns`: how many commands a cluster connection lets into redis-rs's cluster client before the
//! client has taken them in.
//!
//! Without a bound the client could stall for good, a fault of tokio 1.54 and redis-rs 1.8
//! together. A `MOVED` answer (or a broken link) makes the client refresh its slot map: the
//! refresh takes the write lock of the client's connection table, and until it ends the client
//! polls none of the commands it holds. Taking in a burst of new commands at once spends the client
//! task's cooperative budget (in the failing runs, 32 of 64 commands queued together got through
//! before it ran out), and a command whose read lock was granted as the budget ran out returns
//! pending *holding* it (tokio 1.54 takes the permits before its budget check). The refresh then
//! waits for that lock, and that command waits for the refresh: every command on the connection
//! times out until the silence probe replaces it. Seen with 256 checks sent at once as their slot
//! moved (all but about 20 timed out, in every run:
//! `a_burst_of_redirected_checks_does_not_stall_the_cluster_client`), and with 64 on two loaded
//! cores (1 run in 10).
//!
//! What has to be bounded is how many commands wait to be taken in, not how many wait for their
//! answers: a silent master's checks wait up to their response timeout, and must not keep the
//! other masters' checks out. The client takes its queue in whole and in order, so a command is
//! known to be taken in once it is answered or once a command sent after it is answered; its turn
//! is let go then. A command that finds every turn held for [`SCOUT_AFTER`] takes one of the
//! [`SCOUTS`] spare turns instead: if every turn is held by a silent master's commands, a scout
//! to another master gets answered and lets them all go. While the client refreshes its slot map
//! no command is answered, so at most [`TURNS`] + [`SCOUTS`] commands whose callers still wait
//! are taken in when it ends. A caller that gives up meanwhile lets its turn go unanswered, and
//! its command stays in the client's queue; the client drops such a command unsent (its caller
//! gone) before it asks for the table's lock, so it does not count towards the stall.
//!
//! The cost: a connection has at most 16 commands in flight that are less than 5 ms old, and 24
//! with the scouts, so about 16 a round trip (16,000 checks a second at a 1 ms round trip) before
//! commands wait 5 ms for a scout's turn. `pool_size` adds connections, each with its own
//! client, budget and turns.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use redis::{ErrorKind, RedisResult};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};

/// The turns of one cluster connection (16 commands, plus 8 scouts, waiting to be taken in).
/// About 3 units of the client task's budget of 128 go to each command it takes in, so 24 spend
/// at most about 72.
pub(crate) const TURNS: usize = 16;
/// Spare turns, for commands that found every turn held for [`SCOUT_AFTER`].
pub(crate) const SCOUTS: usize = 8;
/// How long a command waits for one of the [`TURNS`] before it may take a scout's turn.
pub(crate) const SCOUT_AFTER: Duration = Duration::from_millis(5);

/// See the module documentation.
pub(crate) struct Turns {
    turns: Semaphore,
    scouts: Semaphore,
    /// The sequence number of the last command sent.
    sent: AtomicU64,
    /// The highest sequence number of a command answered.
    answered: AtomicU64,
    /// Wakes the commands that hold a turn without an answer when `answered` grows.
    moved_on: Notify,
    /// How many commands wait on `moved_on` (no notification when none does).
    waiting: AtomicUsize,
}

impl Turns {
    pub(crate) fn new() -> Self {
        Turns {
            turns: Semaphore::new(TURNS),
            scouts: Semaphore::new(SCOUTS),
            sent: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            moved_on: Notify::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Sends a command through the client (`answer`'s first poll sends it) once it has a turn, and
    /// waits for its answer. The turn is let go once the command is known to be taken in: at its
    /// answer, or, if that has not come within [`SCOUT_AFTER`], at the answer to a command sent
    /// after it. (The quick answers, nearly all, wake no one; only the commands still unanswered
    /// after [`SCOUT_AFTER`] wait for a later command's answer.)
    pub(crate) async fn send<T, F: Future<Output = RedisResult<T>>>(&self, answer: F) -> F::Output {
        let turn = self.turn().await;
        self.hold(turn, answer).await
    }

    /// [`send`](Self::send) with a turn already taken (see [`turn`](Self::turn)).
    pub(crate) async fn hold<T, F: Future<Output = RedisResult<T>>>(
        &self,
        turn: Option<SemaphorePermit<'_>>,
        answer: F,
    ) -> F::Output {
        let mut turn = turn;
        let mut answer = pin!(answer);
        let mut seq = 0;
        let mut slow = pin!(tokio::time::sleep(SCOUT_AFTER));
        let mut moved_on = pin!(self.moved_on.notified());
        let mut waiting: Option<Waiting<'_>> = None;
        let out = poll_fn(|cx| {
            let polled = answer.as_mut().poll(cx);
            if seq == 0 {
                // Numbered once sent: a higher number was put in the client's queue later (up to
                // the order of two commands sent at the same instant).
                seq = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
            }
            if let Poll::Ready(out) = polled {
                return Poll::Ready(out);
            }
            if turn.is_some() && waiting.is_none() && slow.as_mut().poll(cx).is_ready() {
                waiting = Some(Waiting::new(&self.waiting));
            }
            while turn.is_some() && waiting.is_some() {
                // Registered before `answered` is read: an answer after the read wakes it.
                let woken = moved_on.as_mut().poll(cx).is_ready();
                if self.answered.load(Ordering::SeqCst) > seq {
                    turn = None;
                    waiting = None;
                } else if woken {
                    moved_on.set(self.moved_on.notified());
                } else {
                    break;
                }
            }
            Poll::Pending
        })
        .await;
        drop(waiting);
        // Only a server's answer proves the command was taken in: the client's own timeout, or a
        // command it never sent (no connection to the node), may come back before the commands
        // queued ahead of it are taken in (during a slot-map refresh).
        if from_server(&out) {
            self.answered.fetch_max(seq, Ordering::SeqCst);
            if self.waiting.load(Ordering::SeqCst) > 0 {
                self.moved_on.notify_waiters();
            }
        }
        out
    }

    /// One of the turns, or one of the scouts' after waiting [`SCOUT_AFTER`] for it.
    pub(crate) async fn turn(&self) -> Option<SemaphorePermit<'_>> {
        if let Ok(turn) = self.turns.try_acquire() {
            return Some(turn);
        }
        let mut turn = pin!(self.turns.acquire());
        let mut scout = pin!(self.scouts.acquire());
        let mut after = pin!(tokio::time::sleep(SCOUT_AFTER));
        let mut scouting = false;
        poll_fn(|cx| {
            // `None` only if a semaphore were closed, which they never are.
            if let Poll::Ready(turn) = turn.as_mut().poll(cx) {
                return Poll::Ready(turn.ok());
            }
            if !scouting && after.as_mut().poll(cx).is_ready() {
                scouting = true;
            }
            if scouting && let Poll::Ready(scout) = scout.as_mut().poll(cx) {
                return Poll::Ready(scout.ok());
            }
            Poll::Pending
        })
        .await
    }
}

/// Whether `out` is a server's answer (a reply, or an error reply).
fn from_server<T>(out: &RedisResult<T>) -> bool {
    match out {
        Ok(_) => true,
        Err(e) => matches!(
            e.kind(),
            ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
        ),
    }
}

/// A command counted in [`Turns::waiting`] while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
