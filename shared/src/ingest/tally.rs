//! Receive's tally of deliveries per provider and minute, kept in memory and
//! added to `inbox_receive_minutes` now and then (never a write per delivery),
//! for the console's health page.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::db::minutes::MinuteCounts;

/// Counts of a provider (by name) in a minute (Unix seconds).
pub(crate) type Rows = Vec<(&'static str, i64, MinuteCounts)>;

/// The counts not yet written, and when they last were taken.
pub(crate) struct Tally {
    counts: Mutex<HashMap<(&'static str, i64), MinuteCounts>>,
    taken: Mutex<Instant>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally { counts: Mutex::default(), taken: Mutex::new(Instant::now()) }
    }
}

impl Tally {
    /// Counts one delivery's outcome in the current minute.
    pub fn record(&self, provider: &'static str, counts: MinuteCounts) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        self.merge([(provider, now - now % 60, counts)]);
    }

    fn merge(&self, rows: impl IntoIterator<Item = (&'static str, i64, MinuteCounts)>) {
        let mut all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for (provider, minute, counts) in rows {
            let c = all.entry((provider, minute)).or_default();
            c.received += counts.received;
            c.duplicates += counts.duplicates;
            c.rejected += counts.rejected;
        }
    }

    /// Whether `every` has passed since the counts were last taken.
    pub fn due(&self, every: Duration) -> bool {
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= every
    }

    /// The counts to write, leaving none.
    pub fn take(&self) -> Rows {
        *self.taken.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let all = std::mem::take(&mut *self.counts.lock().unwrap_or_else(|e| e.into_inner()));
        all.into_iter().map(|((p, minute), c)| (p, minute, c)).collect()
    }

    /// Counts taken that could not be written, kept for the next time.
    pub fn restore(&self, rows: Rows) {
        self.merge(rows);
    }
}
