//! Where a queue's next take starts: the worker's over the inbox, each relay
//! lane's over its destination's messages. A finished row leaves an entry in
//! the queue's index until vacuum removes it, and vacuum may not while a
//! snapshot older than the row's finish is held open (a long report, an idle
//! transaction, a lagging replication slot): a take that starts at the
//! queue's head walks over every one of them. So a taker remembers the last
//! row it took and starts after it, and takes from the head (a full pass)
//! whenever what may be behind that position could be waiting:
//!
//! - when a batch left a row pending behind it (an event retried, waiting for
//!   a hint's object or left by the deadline; a message retried or given
//!   back, or one whose result lets the next message of its ordering key go);
//! - when the last take from the position came back short (the taker caught
//!   up: a row whose transaction committed after a later one's, a retry whose
//!   backoff ended, a row requeued, or one another taker held in a batch that
//!   rolled back or a lease that ran out may be behind it);
//! - at least every [`FULL_PASS_EVERY`] while takes come back full;
//! - when it has no position yet.
//!
//! Nothing is skipped: every row behind the position is found by the next
//! full pass, at most one poll later while the taker keeps up, and at most
//! [`FULL_PASS_EVERY`] later while it works through a backlog.

use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// A full pass at least this often while takes come back full.
pub(crate) const FULL_PASS_EVERY: Duration = Duration::from_secs(5);

/// A taker's position in its queue's order (`P`: the order's key).
pub(crate) struct Scan<P>(Mutex<State<P>>);

struct State<P> {
    after: Option<P>,
    full_next: bool,
    full_at: Option<Instant>,
}

impl<P> Default for Scan<P> {
    fn default() -> Self {
        Scan(Mutex::new(State { after: None, full_next: false, full_at: None }))
    }
}

impl<P: Clone + Ord> Scan<P> {
    /// Where the next take starts: after this position, or from the head (`None`).
    pub(crate) fn start(&self) -> Option<P> {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let due = s.full_at.map_or(true, |at| at.elapsed() >= FULL_PASS_EVERY);
        if s.full_next || due || s.after.is_none() {
            s.full_next = false;
            s.full_at = Some(Instant::now());
            return None;
        }
        s.after.clone()
    }

    /// A batch taken from `from` committed: `last` the last row it took (in
    /// the queue's order), `full` whether it took as many as it asked for,
    /// `behind` whether it left any of them pending.
    pub(crate) fn taken(&self, from: Option<&P>, last: Option<P>, full: bool, behind: bool) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = last {
            // A full pass may take an older row (a retry now due): the position stays ahead.
            if s.after.as_ref().map_or(true, |a| *a <= last) {
                s.after = Some(last);
            }
        }
        s.full_next |= behind || (from.is_some() && !full);
    }

    /// Rows were put back behind the position, and must be taken before
    /// anything after it (events a pause's resume released, in receive
    /// order): the next take is from the head, and the position goes back
    /// to where that take ends.
    pub(crate) fn rewind(&self) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        s.after = None;
    }

    /// A row taken earlier is pending again behind the position (its result
    /// was recorded after the take): the next take is a full pass.
    #[cfg(feature = "relay")]
    pub(crate) fn behind(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).full_next = true;
    }
}
