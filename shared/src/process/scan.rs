//! Where the worker's next take starts. A finished event leaves an entry in
//! the queue's index until vacuum removes it, and vacuum may not while a
//! snapshot older than the event's finish is held open (a long report, an
//! idle transaction, a lagging replication slot): a take that starts at the
//! queue's head walks over every one of them. So the worker remembers the
//! last event it took and starts after it, and takes from the head (a full
//! pass) whenever what may be behind that position could be waiting:
//!
//! - when the last batch left an event pending behind it (a retry, a hint
//!   handler's event waiting for its object, an event the deadline left);
//! - when the last take from the position came back short (the worker caught
//!   up: an event whose transaction committed after a later one's, a retry
//!   whose backoff ended, an event requeued, or one another worker held in a
//!   batch that rolled back may be behind it);
//! - at least every [`FULL_PASS_EVERY`] while takes come back full;
//! - when it has no position yet.
//!
//! Nothing is skipped: every event behind the position is found by the next
//! full pass, at most one poll later while the worker keeps up, and at most
//! [`FULL_PASS_EVERY`] later while it works through a backlog.

use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::db::inbox::Position;

/// A full pass at least this often while takes come back full.
pub(crate) const FULL_PASS_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct Scan(Mutex<State>);

#[derive(Default)]
struct State {
    after: Option<Position>,
    full_next: bool,
    full_at: Option<Instant>,
}

impl Scan {
    /// Where the next take starts: after this position, or from the head (`None`).
    pub(crate) fn start(&self) -> Option<Position> {
        let s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let due = s.full_at.map_or(true, |at| at.elapsed() >= FULL_PASS_EVERY);
        if s.full_next || due {
            return None;
        }
        s.after.clone()
    }

    /// A batch taken from `from` committed: `last` the last event it took (in
    /// the queue's order), `full` whether it took as many as it asked for,
    /// `behind` whether it left any of them pending.
    pub(crate) fn taken(&self, from: Option<&Position>, last: Option<Position>, full: bool, behind: bool) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if from.is_none() {
            s.full_at = Some(Instant::now());
        }
        if behind {
            s.full_next = true;
            return;
        }
        if let Some(last) = last {
            // A full pass may take an older event (a retry now due): the position stays ahead.
            if s.after.as_ref().map_or(true, |a| a.received_at_us <= last.received_at_us) {
                s.after = Some(last);
            }
        }
        s.full_next = from.is_some() && !full;
    }
}
