//! The sign-in limit. Every attempt is counted before its password is
//! checked (so concurrent guesses cannot slip past it), in three tables,
//! each bounded on its own:
//!
//! - per (name, client): 5 failures lock that client out of that name for 15
//!   minutes after the last, so a stranger can lock out only themselves;
//! - per client: 20 failures, whatever the names, lock the client out;
//! - per name, from every client: past 10 failures, one attempt per 20 s, so
//!   a guesser spread over many addresses still tries only a few passwords a
//!   minute. A browser that signed in as the name before (its device cookie)
//!   is spared this back-off: an operator is never locked out by strangers.
//!
//! A client is its address, an IPv6 address by its /64 (what one host is
//! given). A table that is full forgets what is over first, then the oldest
//! entries that lock nothing; it never forgets a lock to make room, and if
//! only locks are left the attempt is refused (the hashing limit keeps that
//! out of reach: filling a table takes more failures than can be checked in
//! a window). In memory, per process.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::client_key;

/// How long a lock lasts after the failure that set it, and how long a failure is remembered.
pub(crate) const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Failures of one client for one name that lock it out of that name.
pub(crate) const PER_PAIR: u32 = 5;
/// Failures of one client, for any names, that lock it out.
pub(crate) const PER_CLIENT: u32 = 20;
/// Failures for one name, from every client, before its back-off.
pub(crate) const PER_NAME: u32 = 10;
/// Past [`PER_NAME`]: one attempt at the name per this long (3 a minute).
pub(crate) const NAME_INTERVAL: Duration = Duration::from_secs(20);
/// Entries each table holds at most.
pub(crate) const CAPACITY: usize = 32_768;

/// Why an attempt is refused before its password is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Locked out or backed off: try again after this long.
    Wait(Duration),
    /// Every entry of a table holds a lock: no room to count the attempt.
    Full,
}

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

struct Table<K> {
    entries: HashMap<K, Failures>,
    /// The count from which an entry holds something back.
    locks_at: u32,
}

impl<K: Eq + Hash + Clone> Table<K> {
    fn new(locks_at: u32) -> Self {
        Table { entries: HashMap::new(), locks_at }
    }

    /// The failures still remembered for `key`.
    fn get(&self, key: &K, now: Instant) -> Option<Failures> {
        self.entries.get(key).copied().filter(|f| now.duration_since(f.last) < WINDOW)
    }

    /// Whether `key` has a place to be counted in: its own, or one made by
    /// forgetting what is over, then the oldest entries that lock nothing.
    fn has_room(&mut self, key: &K, now: Instant) -> bool {
        if self.entries.len() < CAPACITY || self.entries.contains_key(key) {
            return true;
        }
        self.entries.retain(|_, f| now.duration_since(f.last) < WINDOW);
        if self.entries.len() < CAPACITY {
            return true;
        }
        // A tenth at once, so that a full table is scanned once per many attempts.
        let mut free: Vec<(Instant, K)> =
            self.entries.iter().filter(|(_, f)| f.count < self.locks_at).map(|(k, f)| (f.last, k.clone())).collect();
        free.sort_unstable_by_key(|(last, _)| *last);
        for (_, k) in free.into_iter().take(CAPACITY / 10) {
            self.entries.remove(&k);
        }
        self.entries.len() < CAPACITY
    }

    fn count(&mut self, key: K, now: Instant) {
        let f = self.entries.entry(key).or_insert(Failures { count: 0, last: now });
        if now.duration_since(f.last) >= WINDOW {
            f.count = 0;
        }
        f.count += 1;
        f.last = now;
    }
}

struct Tables {
    pairs: Table<(String, String)>,
    clients: Table<String>,
    names: Table<String>,
}

/// Failed sign-ins, counted before each password is checked (see the module's documentation).
pub(crate) struct Limiter {
    tables: Mutex<Tables>,
    /// Signs device cookies: random per process (a restart forgets devices, as it forgets failures).
    device_key: [u8; 32],
}

impl Default for Limiter {
    fn default() -> Self {
        let mut device_key = [0u8; 32];
        getrandom::getrandom(&mut device_key).expect("the operating system's random numbers");
        Limiter {
            tables: Mutex::new(Tables {
                pairs: Table::new(PER_PAIR),
                clients: Table::new(PER_CLIENT),
                names: Table::new(PER_NAME),
            }),
            device_key,
        }
    }
}

impl Limiter {
    /// Counts an attempt as `name` from `client` as failed, unless it must
    /// wait; [`Limiter::succeeded`] takes it back. `known_device`: the
    /// browser signed in as `name` before ([`Limiter::knows`]).
    pub(crate) fn attempt(&self, name: &str, client: &str, known_device: bool) -> Result<(), Refused> {
        self.attempt_at(name, client, known_device, Instant::now())
    }

    fn attempt_at(&self, name: &str, client: &str, known_device: bool, now: Instant) -> Result<(), Refused> {
        let client = client_key(client);
        let pair = (name.to_string(), client.clone());
        let mut t = self.tables.lock().expect("the limiter's lock");
        let mut wait = Duration::ZERO;
        for f in [
            t.pairs.get(&pair, now).filter(|f| f.count >= PER_PAIR),
            t.clients.get(&client, now).filter(|f| f.count >= PER_CLIENT),
        ]
        .into_iter()
        .flatten()
        {
            wait = wait.max(WINDOW - now.duration_since(f.last));
        }
        if !known_device {
            if let Some(f) = t.names.get(&name.to_string(), now).filter(|f| f.count >= PER_NAME) {
                wait = wait.max(NAME_INTERVAL.saturating_sub(now.duration_since(f.last)));
            }
        }
        if !wait.is_zero() {
            return Err(Refused::Wait(wait));
        }
        let name = name.to_string();
        if !(t.pairs.has_room(&pair, now) && t.clients.has_room(&client, now) && t.names.has_room(&name, now)) {
            return Err(Refused::Full);
        }
        t.pairs.count(pair, now);
        t.clients.count(client, now);
        t.names.count(name, now);
        Ok(())
    }

    /// Takes back the attempt of a sign-in that succeeded: the name's
    /// failures, from this client and from everywhere, are forgotten; the
    /// client's others stay.
    pub(crate) fn succeeded(&self, name: &str, client: &str) {
        let client = client_key(client);
        let mut t = self.tables.lock().expect("the limiter's lock");
        t.pairs.entries.remove(&(name.to_string(), client.clone()));
        t.names.entries.remove(name);
        if let Some(f) = t.clients.entries.get_mut(&client) {
            f.count = f.count.saturating_sub(1);
        }
    }

    /// The device cookie's value for a browser that signed in as `name`.
    pub(crate) fn device(&self, name: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.device_key).expect("any key length");
        mac.update(b"console device:");
        mac.update(name.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `cookie` is the device cookie of a browser that signed in as `name`.
    pub(crate) fn knows(&self, name: &str, cookie: &str) -> bool {
        bool::from(self.device(name).as_bytes().ct_eq(cookie.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(r: Result<(), Refused>) -> Duration {
        match r {
            Err(Refused::Wait(w)) => w,
            other => panic!("not a wait: {other:?}"),
        }
    }

    #[test]
    fn five_failures_lock_that_client_out_of_that_name_only() {
        let (l, now) = (Limiter::default(), Instant::now());
        for _ in 0..PER_PAIR {
            l.attempt_at("olga", "6.6.6.6", false, now).unwrap();
        }
        assert_eq!(wait(l.attempt_at("olga", "6.6.6.6", false, now)), WINDOW);
        assert_eq!(l.attempt_at("olga", "10.0.0.8", false, now), Ok(()), "the operator, elsewhere, still signs in");
        assert_eq!(l.attempt_at("vic", "6.6.6.6", false, now), Ok(()), "another name from the stranger is its own");
        let later = now + WINDOW;
        assert_eq!(l.attempt_at("olga", "6.6.6.6", false, later), Ok(()), "the lock ends after its window");
    }

    #[test]
    fn a_client_guessing_many_names_is_locked_out() {
        let (l, now) = (Limiter::default(), Instant::now());
        for i in 0..PER_CLIENT {
            l.attempt_at(&format!("user{i}"), "9.9.9.9", false, now).unwrap();
        }
        assert_eq!(wait(l.attempt_at("carol", "9.9.9.9", false, now)), WINDOW);
    }

    #[test]
    fn a_name_guessed_from_everywhere_backs_off_to_three_tries_a_minute_except_from_a_known_device() {
        let (l, now) = (Limiter::default(), Instant::now());
        for i in 0..PER_NAME {
            l.attempt_at("olga", &format!("203.0.113.{i}"), false, now).unwrap();
        }
        assert_eq!(wait(l.attempt_at("olga", "198.51.100.1", false, now)), NAME_INTERVAL);
        let mut tried = 0;
        for second in 0..60u64 {
            let at = now + Duration::from_secs(second + 1);
            if l.attempt_at("olga", &format!("198.51.100.{second}"), false, at).is_ok() {
                tried += 1;
            }
        }
        assert_eq!(tried, 3, "a distributed guesser tries 3 passwords a minute");
        let device = l.device("olga");
        assert!(l.knows("olga", &device) && !l.knows("vic", &device) && !l.knows("olga", "forged"));
        assert_eq!(
            l.attempt_at("olga", "10.0.0.8", true, now + Duration::from_secs(61)),
            Ok(()),
            "the operator's own browser is spared"
        );
        l.succeeded("olga", "10.0.0.8");
        assert_eq!(
            l.attempt_at("olga", "198.51.100.99", false, now + Duration::from_secs(61)),
            Ok(()),
            "a success forgets the name's failures"
        );
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_a_mapped_ipv4_is_the_ipv4() {
        assert_eq!(client_key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(client_key("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64");
        assert_eq!(client_key("::ffff:192.0.2.1"), "192.0.2.1");
        assert_eq!(client_key("192.0.2.1"), "192.0.2.1");
        let (l, now) = (Limiter::default(), Instant::now());
        for i in 0..PER_PAIR {
            l.attempt_at("olga", &format!("2001:db8:1:2::{i:x}"), false, now).unwrap();
        }
        assert!(l.attempt_at("olga", "2001:db8:1:2:dead:beef::1", false, now).is_err(), "one /64 is one client");
    }

    #[test]
    fn a_full_table_never_forgets_a_lock_to_make_room() {
        let (l, now) = (Limiter::default(), Instant::now());
        for _ in 0..PER_PAIR {
            l.attempt_at("olga", "6.6.6.6", false, now).unwrap();
        }
        // Many more clients than the tables hold, one failure each for other names.
        for i in 0..(3 * CAPACITY as u32) {
            let client = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
            l.attempt_at(&format!("n{i}"), &client, false, now + Duration::from_millis(1)).unwrap();
        }
        assert!(l.attempt_at("olga", "6.6.6.6", false, now + Duration::from_secs(1)).is_err(), "the lock holds");
        let t = l.tables.lock().unwrap();
        assert!(t.pairs.entries.len() <= CAPACITY && t.clients.entries.len() <= CAPACITY);
    }

    #[test]
    fn when_every_entry_locks_the_attempt_is_refused_not_a_lock_forgotten() {
        let (l, now) = (Limiter::default(), Instant::now());
        {
            let mut t = l.tables.lock().unwrap();
            for i in 0..CAPACITY {
                t.clients.entries.insert(format!("c{i}"), Failures { count: PER_CLIENT, last: now });
            }
        }
        assert_eq!(l.attempt_at("olga", "192.0.2.1", false, now), Err(Refused::Full));
        assert!(l.attempt_at("olga", "c7", false, now).is_err(), "c7 is still locked");
    }

    #[test]
    fn concurrent_attempts_are_counted_before_any_is_checked() {
        let l = std::sync::Arc::new(Limiter::default());
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(30));
        let allowed: usize = (0..30)
            .map(|_| {
                let (l, barrier) = (l.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    l.attempt("olga", "6.6.6.6", false).is_ok()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap() as usize)
            .sum();
        assert_eq!(allowed, PER_PAIR as usize);
    }
}
