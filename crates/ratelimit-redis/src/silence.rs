//! `Silence`: how long a slot's current connection has left a command unanswered.

use std::sync::atomic::{AtomicU64, Ordering};

/// When the oldest command sent on a slot's current connection that may still be unanswered was
/// sent, for that connection only.
///
/// Times are microseconds since the store's epoch plus 1 (0 stands for none). The mark is set by
/// the first command sent with none outstanding, and cleared by the answer to a command sent at
/// or after it on a standalone connection (which answers in order), or by an answered probe.
///
/// Each mark belongs to one connection, named by its generation. A check holds a clone of the
/// connection it took, and a connection may be replaced while checks are still out on it: their
/// late answers say nothing of the new connection, so they neither clear its mark nor start its
/// silence. Without the generation, a command sent on the old connection just after the new one's
/// first command would, answered, clear the mark of that first command, still unanswered, and
/// hide a silent new connection for another response timeout.
pub(crate) struct Silence {
    /// The mark: 0, or the send time of the oldest command that may be unanswered.
    since: AtomicU64,
    /// The generation of the connection the mark is about.
    generation: AtomicU64,
}

impl Silence {
    /// No connection yet: generation `u64::MAX` is never given to one.
    pub(crate) fn new() -> Self {
        Self {
            since: AtomicU64::new(0),
            generation: AtomicU64::new(u64::MAX),
        }
    }

    /// Connection `generation` is installed, with nothing outstanding on it. Called under the
    /// slot's connection lock, before any check can take the connection.
    pub(crate) fn reset(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        self.since.store(0, Ordering::Release);
    }

    /// A command is sent at `now` on connection `generation`. Returns when the oldest command
    /// still unanswered on it was sent, if one was (and the connection is the current one): the
    /// caller probes a connection silent for too long. The first command with none outstanding
    /// writes the mark and returns `None`. (Only that one writes: a line every check would
    /// otherwise write.)
    ///
    /// A command of an older connection, sent as its replacement is installed, may mark the new
    /// one; the probe that can follow is answered and clears it.
    pub(crate) fn sent(&self, generation: u64, now: u64) -> Option<u64> {
        if self.generation.load(Ordering::Acquire) != generation {
            return None;
        }
        let since = self.since.load(Ordering::Acquire);
        if since == 0 {
            let _ = self
                .since
                .compare_exchange(0, now, Ordering::Release, Ordering::Relaxed);
            None
        } else {
            Some(since)
        }
    }

    /// Connection `generation` has answered every command it was sent up to `sent`: the mark is
    /// cleared if it is not later than `sent` and is this connection's. (A look first: most
    /// answers find no mark to clear, and need not write.)
    pub(crate) fn answered(&self, generation: u64, sent: u64) {
        let mark = self.since.load(Ordering::Acquire);
        // A mark written on a newer connection was written after that connection's `reset`,
        // which this load then sees: its generation is not `generation`.
        if mark != 0 && mark <= sent && self.generation.load(Ordering::Acquire) == generation {
            let _ = self
                .since
                .compare_exchange(mark, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A command sent at `sent` on connection `generation` was left unanswered (its check gave
    /// up): if the connection has no mark, this command's send time becomes it. The mark is then
    /// late (an older command may be outstanding too), never early: a command sent while an
    /// earlier one was marked is not marked when that one's answer clears the mark, and without
    /// this, such a command left unanswered by a server gone silent would leave nothing to
    /// watch (see `Inner::watch`).
    pub(crate) fn unanswered(&self, generation: u64, sent: u64) {
        if self.generation.load(Ordering::Acquire) == generation {
            let _ = self
                .since
                .compare_exchange(0, sent, Ordering::Release, Ordering::Relaxed);
        }
    }

    /// The mark on connection `generation`, if it has one (and is the current connection).
    pub(crate) fn mark(&self, generation: u64) -> Option<u64> {
        let since = self.since.load(Ordering::Acquire);
        (since != 0 && self.generation.load(Ordering::Acquire) == generation).then_some(since)
    }

    /// The current connection's generation and its mark, if it has one.
    pub(crate) fn current_mark(&self) -> Option<(u64, u64)> {
        let generation = self.generation.load(Ordering::Acquire);
        self.mark(generation).map(|since| (generation, since))
    }

    /// Connection `generation` is kept although it has been silent: its silence is counted again
    /// from `now`, so that it is probed again a response timeout later.
    pub(crate) fn restart(&self, generation: u64, now: u64) {
        if self.generation.load(Ordering::Acquire) == generation {
            self.since.store(now, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_unanswered_command_marks_and_its_answer_clears() {
        let s = Silence::new();
        s.reset(0);
        assert_eq!(s.sent(0, 10), None);
        assert_eq!(s.sent(0, 20), Some(10));
        // An answer to a command sent before the mark says nothing of the marked one.
        s.answered(0, 5);
        assert_eq!(s.sent(0, 30), Some(10));
        s.answered(0, 20);
        assert_eq!(s.sent(0, 40), None);
        assert_eq!(s.sent(0, 50), Some(40));
    }

    #[test]
    fn an_old_connections_late_answer_leaves_the_new_ones_mark() {
        let s = Silence::new();
        s.reset(0);
        assert_eq!(s.sent(0, 10), None);
        // Replaced while a check still holds connection 0.
        s.reset(1);
        assert_eq!(s.sent(1, 100), None);
        // The old connection's command, sent after the new one's first, answers late.
        s.answered(0, 150);
        assert_eq!(
            s.sent(1, 200),
            Some(100),
            "the new connection's silence was forgotten"
        );
        // Nor does it mark a new connection with nothing outstanding.
        s.answered(1, 200);
        assert_eq!(s.sent(0, 300), None);
        assert_eq!(s.sent(1, 400), None);
        assert_eq!(s.sent(1, 500), Some(400));
    }

    #[test]
    fn a_command_left_unanswered_after_the_mark_was_cleared_marks_again() {
        let s = Silence::new();
        s.reset(0);
        // Two commands at once: the first marks, the second finds the mark.
        assert_eq!(s.sent(0, 10), None);
        assert_eq!(s.sent(0, 11), Some(10));
        // The first is answered, then the server stops: the second is outstanding, unmarked.
        s.answered(0, 10);
        assert_eq!(s.mark(0), None);
        // Its check gives up: its send time is the mark, and the watch has something to watch.
        s.unanswered(0, 11);
        assert_eq!(s.mark(0), Some(11));
        // An older mark is kept (it is the better bound), and another connection's is not set.
        s.unanswered(0, 50);
        assert_eq!(s.mark(0), Some(11));
        s.reset(1);
        s.unanswered(0, 60);
        assert_eq!(s.mark(1), None);
    }

    #[test]
    fn a_restart_counts_the_kept_connections_silence_from_now() {
        let s = Silence::new();
        s.reset(3);
        assert_eq!(s.sent(3, 10), None);
        s.restart(3, 90);
        assert_eq!(s.sent(3, 100), Some(90));
        // A restart for a connection already replaced changes nothing.
        s.reset(4);
        s.restart(3, 200);
        assert_eq!(s.sent(4, 300), None);
    }

    #[test]
    fn before_any_connection_nothing_is_marked() {
        let s = Silence::new();
        assert_eq!(s.sent(0, 10), None);
        s.reset(0);
        assert_eq!(s.sent(0, 20), None);
        assert_eq!(s.sent(0, 30), Some(20));
    }
}
