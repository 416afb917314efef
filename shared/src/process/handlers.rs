//! Business handlers, keyed by provider and event type, run inside the
//! transaction that also claims the event and writes the outbox.

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc};

use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use crate::{core::provider::Provider, db};

/// A claimed inbox row, as a handler sees it.
#[derive(Debug, Clone)]
pub struct Event {
    pub provider: Provider,
    pub event_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    /// Attempts before this one.
    pub attempts: i32,
}

/// What a handler did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// State changed (or was found already changed by a twin): the event is done.
    Applied,
    /// Nothing to do for this event (a type or state the domain ignores).
    NoEffect,
}

/// Why a handler did not finish. Retryable vs permanent is decided here, once.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth retrying later (a missing account that may be created, a busy dependency).
    #[error("{0}")]
    Transient(String),
    /// Will never succeed (a malformed payload): the event is failed at once.
    #[error("{0}")]
    Permanent(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl HandlerError {
    /// The handler says so, or the database failed for a reason of the moment.
    pub fn is_transient(&self) -> bool {
        match self {
            HandlerError::Transient(_) => true,
            HandlerError::Permanent(_) => false,
            HandlerError::Database(e) => db::is_transient(e),
        }
    }

    /// Lost to another transaction: retried without counting an attempt.
    pub fn is_contention(&self) -> bool {
        matches!(self, HandlerError::Database(e) if db::is_contention(e))
    }
}

pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, HandlerError>> + Send + 'a>>;

/// A business effect for one kind of event. It runs inside a savepoint of the
/// worker's batch transaction (or of receive's claim, in inline mode): its writes,
/// its outbox rows and the event's status commit together or not at all.
pub trait Handler: Send + Sync {
    fn handle<'a>(&'a self, conn: &'a mut PgConnection, event: &'a Event) -> HandlerFuture<'a>;

    /// For heavy work in inline mode: when true, receive tries the event's advisory
    /// lock before claiming, and a concurrent duplicate delivery is told to retry
    /// (503) instead of queueing behind it. (Workers need no such lock: they
    /// already hold the row's lock, taken with `SKIP LOCKED`.)
    fn exclusive(&self) -> bool {
        false
    }

    /// The row this event's effect locks and others share (an account, an
    /// order), if any. A worker applies its batch's events in the order of
    /// their keys (receive order among equal keys), so that concurrent batches
    /// take those locks in one order: they wait for each other, and never
    /// deadlock (which PostgreSQL only notices after `deadlock_timeout`, a
    /// second by default, and resolves by failing one of them).
    fn lock_key(&self, _event: &Event) -> Option<String> {
        None
    }
}

/// The handlers by provider, then event type.
#[derive(Default, Clone)]
pub struct Handlers(HashMap<Provider, HashMap<String, Arc<dyn Handler>>>);

impl Handlers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn on(mut self, provider: Provider, event_type: &str, handler: impl Handler + 'static) -> Self {
        self.0.entry(provider).or_default().insert(event_type.to_string(), Arc::new(handler));
        self
    }

    pub fn get(&self, provider: Provider, event_type: &str) -> Option<&dyn Handler> {
        self.0.get(&provider)?.get(event_type).map(|h| h.as_ref())
    }

    /// `provider:event_type` for every handler: the events whose payload the worker fetches.
    pub fn keys(&self) -> Vec<String> {
        self.0.iter().flat_map(|(p, types)| types.keys().map(move |t| format!("{}:{t}", p.as_str()))).collect()
    }
}

/// The 64-bit advisory lock key of an event: the first 8 bytes of
/// SHA-256("provider:event_id"), big-endian, signed. Stable across processes
/// and versions, unlike `hashtext`, and 64 bits wide.
pub fn advisory_key(provider: Provider, event_id: &str) -> i64 {
    let digest = Sha256::digest(format!("{provider}:{event_id}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// `pg_try_advisory_xact_lock` on the event's key: transaction-scoped (safe behind
/// transaction-mode poolers), released at commit or rollback; false if held elsewhere.
pub async fn try_lock_event(conn: &mut PgConnection, provider: Provider, event_id: &str) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(advisory_key(provider, event_id))
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_keys_are_the_first_8_bytes_of_sha256_big_endian() {
        // docs/webhook-inbox-article.txt, section 5.2, in Python: int.from_bytes(sha256(b"stripe:evt_1").digest()[:8], "big", signed=True)
        assert_eq!(advisory_key(Provider::STRIPE, "evt_1"), 607058759724208493);
        assert_ne!(advisory_key(Provider::STRIPE, "evt_1"), advisory_key(Provider::SHOPIFY, "evt_1"));
    }
}
