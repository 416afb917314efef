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
pub(crate) struct DeliveryMinutes {
    counts: Mutex<HashMap<(&'static str, i64), MinuteCounts>>,
    taken: Mutex<Instant>,
}

impl Default for DeliveryMinutes {
    fn default() -> Self {
        DeliveryMinutes { counts: Mutex::default(), taken: Mutex::new(Instant::now()) }
    }
}

impl DeliveryMinutes {
    /// Counts one delivery's outcome in the current minute.
    pub(crate) fn record(&self, provider: &'static str, counts: MinuteCounts) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        self.record_at(provider, now, counts);
    }

    /// Counts one delivery's outcome in the minute of `unix` (seconds).
    fn record_at(&self, provider: &'static str, unix: i64, counts: MinuteCounts) {
        self.merge([(provider, unix - unix.rem_euclid(60), counts)]);
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
    pub(crate) fn due(&self, every: Duration) -> bool {
        self.taken.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= every
    }

    /// The counts to write, leaving none.
    pub(crate) fn take(&self) -> Rows {
        *self.taken.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let all = std::mem::take(&mut *self.counts.lock().unwrap_or_else(|e| e.into_inner()));
        all.into_iter().map(|((p, minute), c)| (p, minute, c)).collect()
    }

    /// Counts taken that could not be written, kept for the next time.
    pub(crate) fn restore(&self, rows: Rows) {
        self.merge(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(received: i64, duplicates: i64, rejected: i64) -> MinuteCounts {
        MinuteCounts { received, duplicates, rejected }
    }

    #[test]
    fn counts_add_up_per_provider_and_minute_and_come_back_when_not_written() {
        let t = DeliveryMinutes::default();
        assert!(!t.due(Duration::from_secs(60)), "nothing is due at start");
        t.record_at("stripe", 1_800_000_001, counts(1, 0, 0));
        t.record_at("stripe", 1_800_000_059, counts(0, 1, 0));
        t.record_at("github", 1_800_000_030, counts(0, 0, 1));
        let mut rows = t.take();
        rows.sort_by_key(|(p, _, _)| *p);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].0, rows[0].2), ("github", counts(0, 0, 1)));
        assert_eq!((rows[1].0, rows[1].2), ("stripe", counts(1, 1, 0)));
        assert_eq!(rows[1].1, 1_800_000_000, "the minute's start");
        assert!(t.take().is_empty(), "taken once");
        // A write that failed: the counts are kept, and add to what came since.
        t.restore(rows);
        t.record_at("stripe", 1_800_000_010, counts(2, 0, 0));
        t.record_at("stripe", 1_800_000_060, counts(5, 0, 0));
        let mut again = t.take();
        again.sort_by_key(|(p, minute, _)| (*p, *minute));
        assert_eq!(
            again,
            [
                ("github", 1_800_000_000, counts(0, 0, 1)),
                ("stripe", 1_800_000_000, counts(3, 1, 0)),
                ("stripe", 1_800_000_060, counts(5, 0, 0))
            ]
        );
    }
}
