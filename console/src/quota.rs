//! What a caller of the console may use: requests per second ([`Buckets`],
//! the management API's per token, and its failed authentications per
//! client), and payload searches at once ([`Searches`]). Every table is
//! bounded: a stranger sending from a million addresses costs a bounded
//! amount of memory, never a legitimate caller's allowance.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Entries a [`Buckets`] table holds at most.
pub(crate) const CAPACITY: usize = 16_384;

/// How often a full table is swept for refilled buckets at most: past it, a
/// new key waits for the next sweep (refused), so that a flood of new keys
/// costs one sweep per interval, not one per request.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

struct Bucket {
    tokens: f64,
    at: Instant,
}

struct Table {
    buckets: HashMap<String, Bucket>,
    swept: Option<Instant>,
}

/// Token buckets by key: `per_second` requests a second, `burst` at once. A
/// bucket that has refilled is the same as none, so a full table forgets
/// those; if none has, a new key is refused until one has (at most
/// [`CAPACITY`] entries, whatever the keys).
pub(crate) struct Buckets {
    per_second: f64,
    burst: f64,
    capacity: usize,
    table: Mutex<Table>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets").field("per_second", &self.per_second).field("burst", &self.burst).finish()
    }
}

impl Buckets {
    pub(crate) fn new(per_second: f64, burst: f64) -> Buckets {
        Buckets::with_capacity(per_second, burst, CAPACITY)
    }

    fn with_capacity(per_second: f64, burst: f64, capacity: usize) -> Buckets {
        Buckets { per_second, burst, capacity, table: Mutex::new(Table { buckets: HashMap::new(), swept: None }) }
    }

    /// Takes one request from `key`'s bucket, or says how long until one is there.
    pub(crate) fn take(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now())
    }

    fn take_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if !t.buckets.contains_key(key) && t.buckets.len() >= self.capacity && !self.sweep(&mut t, now) {
            return Err(SWEEP_EVERY.max(Duration::from_secs(1)));
        }
        let (per_second, burst) = (self.per_second, self.burst);
        let b = t.buckets.entry(key.to_string()).or_insert(Bucket { tokens: burst, at: now });
        b.tokens = (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / per_second))
        }
    }

    /// Forgets the buckets that have refilled (no sooner than [`SWEEP_EVERY`]
    /// after the last sweep); whether there is room now.
    fn sweep(&self, t: &mut Table, now: Instant) -> bool {
        if t.swept.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
            return false;
        }
        t.swept = Some(now);
        let (per_second, burst) = (self.per_second, self.burst);
        t.buckets.retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < burst);
        t.buckets.len() < self.capacity
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().unwrap().buckets.len()
    }
}

/// Payload searches running at once (each may take up to its timeout on a
/// connection of the console's pool): at most `at_once` in all, and one per
/// caller, so that a viewer running searches in a loop never holds the
/// connections an operator's call needs.
pub(crate) struct Searches {
    all: Arc<tokio::sync::Semaphore>,
    callers: Arc<Mutex<HashSet<String>>>,
}

/// Why a search was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SearchBusy {
    /// This caller has one running.
    Caller,
    /// As many as the console allows are running.
    All,
}

/// A search's place, given back when dropped.
pub(crate) struct Searching {
    _all: tokio::sync::OwnedSemaphorePermit,
    callers: Arc<Mutex<HashSet<String>>>,
    caller: String,
}

impl Drop for Searching {
    fn drop(&mut self) {
        self.callers.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.caller);
    }
}

impl Searches {
    /// At most `at_once` searches at once (one at least).
    pub(crate) fn new(at_once: usize) -> Searches {
        Searches { all: Arc::new(tokio::sync::Semaphore::new(at_once.max(1))), callers: Default::default() }
    }

    /// A place for `caller`'s search, at once or none.
    pub(crate) fn start(&self, caller: &str) -> Result<Searching, SearchBusy> {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        if callers.contains(caller) {
            return Err(SearchBusy::Caller);
        }
        let all = self.all.clone().try_acquire_owned().map_err(|_| SearchBusy::All)?;
        callers.insert(caller.to_string());
        Ok(Searching { _all: all, callers: self.callers.clone(), caller: caller.to_string() })
    }
}

impl SearchBusy {
    /// Said to the caller.
    pub(crate) fn words(self) -> &'static str {
        match self {
            SearchBusy::Caller => "a payload search of yours is running: wait for it (one at a time)",
            SearchBusy::All => "the console runs as many payload searches as it allows: try again in a moment",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_burst_and_refills() {
        let (b, now) = (Buckets::new(5.0, 10.0), Instant::now());
        for _ in 0..10 {
            assert!(b.take_at("a", now).is_ok());
        }
        assert_eq!(b.take_at("a", now), Err(Duration::from_millis(200)));
        assert!(b.take_at("b", now).is_ok(), "each key has its own");
        assert!(b.take_at("a", now + Duration::from_millis(200)).is_ok(), "refilled by one");
    }

    #[test]
    fn a_flood_of_keys_stays_within_capacity_and_forgets_refilled_buckets() {
        let (b, now) = (Buckets::with_capacity(1.0, 20.0, 1000), Instant::now());
        for i in 0..100u32 {
            b.take_at(&format!("k{i}"), now).unwrap();
        }
        // 400,000 new keys within a second: the table never passes its capacity.
        let mut refused = 0;
        for i in 0..400_000u32 {
            let at = now + Duration::from_micros(i as u64 * 2);
            if b.take_at(&format!("flood{i}"), at).is_err() {
                refused += 1;
            }
            assert!(b.len() <= 1000);
        }
        assert!(refused > 390_000, "{refused}: a full table of buckets still draining takes no new key");
        assert!(b.take_at("k7", now + Duration::from_secs(1)).is_ok(), "a key it holds is served");
        // Once they have refilled, the next sweep forgets them all.
        let later = now + Duration::from_secs(60);
        assert!(b.take_at("late", later).is_ok());
        assert_eq!(b.len(), 1);
    }

    #[tokio::test]
    async fn searches_are_one_per_caller_and_bounded_in_all() {
        let s = Searches::new(2);
        let a = s.start("viewer").unwrap();
        assert_eq!(s.start("viewer").err(), Some(SearchBusy::Caller));
        let _b = s.start("operator").unwrap();
        assert_eq!(s.start("third").err(), Some(SearchBusy::All));
        drop(a);
        assert!(s.start("viewer").is_ok(), "a search ended gives its place back");
    }
}
