//! What a team's handler names: the [`Event`] it is given (and its kept
//! [`Headers`]), the [`Outcome`] it returns or the [`HandlerError`] it fails
//! with, and the [`Handler`] trait. The registry that runs handlers is
//! [`super::handlers`].

use std::{fmt, future::Future, time::SystemTime};

use serde::de::DeserializeOwned;
use sqlx::PgConnection;

use crate::db;
use webhook_inbox_schemes::Provider;

/// An event as a handler sees it: what the provider sent, and where it stands.
///
/// `T` is the payload's type: `serde_json::Value` by default, or any type that
/// implements `Deserialize` (a handler that asks for one gets the payload
/// decoded; one that does not decode fails the event, permanently, with
/// serde's message as its reason).
#[derive(Debug, Clone)]
pub struct Event<T = serde_json::Value> {
    /// Who sent it.
    pub provider: Provider,
    /// The provider's id for it (the inbox's key with the provider).
    pub event_id: String,
    /// The provider's type for it (`invoice.paid`, `orders/paid`, ...).
    pub event_type: String,
    /// The payload, decoded.
    pub payload: T,
    /// Attempts before this one.
    pub attempts: i32,
    /// When receive (or reconcile) stored it.
    pub received_at: SystemTime,
    /// The delivery's headers that the provider's scheme keeps (lower-cased names).
    pub headers: Headers,
    /// The `traceparent` of its processing's span, for the messages it writes (traces on).
    pub(crate) trace_context: Option<String>,
    /// The worker's count of outbox messages written, for the relay's nudge.
    pub(crate) written: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

impl<T> Event<T> {
    /// Writes an outbox message in the handler's transaction, unless one with
    /// the same key exists (true when written), recording that this event
    /// wrote it: its page (`inbox show`, [`crate::ops::event_messages`]) lists
    /// it with its delivery state.
    pub async fn enqueue(&self, conn: &mut PgConnection, message: &crate::Message<'_>) -> Result<bool, sqlx::Error> {
        let event = Some((self.provider.as_str(), self.event_id.as_str()));
        let written = crate::db::outbox::enqueue_for(conn, message, event, self.trace_context.as_deref()).await?;
        if let (true, Some(count)) = (written, &self.written) {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(written)
    }

    /// Writes many outbox messages in one statement (a batch handler's),
    /// each recorded as the event's it is paired with, as
    /// [`enqueue`](Event::enqueue) records one; their ids follow their
    /// order here, which is the order an ordering key delivers them in. For
    /// each, whether it was written: false when a message with its key exists,
    /// or comes earlier in `messages`.
    pub async fn enqueue_all(
        conn: &mut PgConnection,
        messages: &[(&Event<T>, crate::Message<'_>)],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let rows: Vec<_> = messages
            .iter()
            .map(|(e, m)| (m, (e.provider.as_str(), e.event_id.as_str()), e.trace_context.as_deref()))
            .collect();
        let written = crate::db::outbox::enqueue_all_for(conn, &rows).await?;
        for ((event, _), _) in messages.iter().zip(&written).filter(|(_, w)| **w) {
            if let Some(count) = &event.written {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(written)
    }
}

/// The headers kept with an event, by lower-cased name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// The value of a header (any case), repeated values joined with `, `.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Every kept header, name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// From the stored JSON object: a string, or a repeated header's array of
    /// strings (joined with `, `); anything else is left out.
    pub(crate) fn from_json(value: &serde_json::Value) -> Self {
        let fields = value.as_object().into_iter().flatten();
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(items) => {
                Some(items.iter().filter_map(serde_json::Value::as_str).collect::<Vec<_>>().join(", "))
            }
            _ => None,
        };
        Headers(fields.filter_map(|(n, v)| Some((n.clone(), text(v)?))).collect())
    }
}

/// Headers by name and value (names lower-cased), as a test builds an
/// [`Event`] to call a handler with.
impl<N: Into<String>, V: Into<String>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(pairs: I) -> Self {
        Headers(pairs.into_iter().map(|(n, v)| (n.into().to_ascii_lowercase(), v.into())).collect())
    }
}

/// What a handler did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// State changed (or was found already changed by a twin): the event is done.
    Applied,
    /// Nothing to do for this event (a state the domain ignores, a stale snapshot).
    NoEffect,
}

/// Why a handler did not finish. Retryable or permanent is decided here, once:
/// `?` turns a `sqlx::Error` into [`HandlerError::Database`] (transient when
/// the database failed for a reason of the moment), a `serde_json::Error` into
/// [`HandlerError::Permanent`]; a team's own error type gets a
/// `From<TheirError> for HandlerError` that says which of its cases are worth
/// retrying, and `?` works on it too.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth retrying later (a missing account that may be created, a busy dependency).
    #[error("{0}")]
    Transient(String),
    /// Will never succeed (a malformed payload): the event is failed at once.
    #[error("{0}")]
    Permanent(String),
    /// The database refused or failed a statement.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl HandlerError {
    /// A failure worth retrying, with its reason.
    pub fn transient(reason: impl fmt::Display) -> Self {
        HandlerError::Transient(reason.to_string())
    }

    /// A failure that retrying cannot fix, with its reason.
    pub fn permanent(reason: impl fmt::Display) -> Self {
        HandlerError::Permanent(reason.to_string())
    }

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

impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        HandlerError::Permanent(e.to_string())
    }
}

/// A business effect for one kind of event. It runs inside a savepoint of the
/// worker's batch transaction (or of receive's claim, in inline mode): its
/// writes, its outbox messages and the event's status commit together or not
/// at all.
///
/// An async fn or closure taking `(&mut PgConnection, &Event<T>)` and
/// returning `Result<Outcome, HandlerError>` is a handler too (see
/// [`Handlers::on`](crate::Handlers::on)); implement this trait for a handler with a
/// [`lock_key`](Handler::lock_key) or that is [`exclusive`](Handler::exclusive).
pub trait Handler: Send + Sync + 'static {
    /// The payload's type: `serde_json::Value`, or the handler's own `Deserialize` type.
    type Payload: DeserializeOwned + Send + Sync + 'static;

    /// Applies the event; `?` works on sqlx's errors and on any error with a
    /// `From` into [`HandlerError`].
    fn handle(
        &self,
        conn: &mut PgConnection,
        event: &Event<Self::Payload>,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;

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
    fn lock_key(&self, _event: &Event<Self::Payload>) -> Option<String> {
        None
    }
}

/// A business effect for one kind of event, applied to many events at once:
/// the worker hands it all of its batch's events for this handler (of every
/// type it is registered for), so that a few set-based statements
/// (`unnest`, a multi-row `INSERT ... ON CONFLICT`, a data-modifying CTE)
/// replace a few statements per event. Register it with
/// [`Handlers::on`](crate::Handlers::on) or, for several types at once (one
/// batch for all of them), [`Handlers::on_each`](crate::Handlers::on_each).
///
/// What makes a handler safe still holds, because the same statements run
/// with one event when they must:
/// - It runs inside the worker's batch transaction (in a savepoint of its
///   own once a handler in the batch has failed). If `handle_batch` fails,
///   its writes roll back and the worker runs it again once per event, each
///   in its own savepoint (`events` then holds that one event): the event
///   whose data is bad fails or retries alone, with its own reason, and the
///   others' effects commit. Inline mode, and a single event, call it with
///   one event too.
/// - The version guard and the business key still decide: with two events
///   for one row in the batch, the statement must keep the effect a run one
///   at a time would leave (the newest snapshot, one payment per business key).
///   `INSERT ... ON CONFLICT DO UPDATE` refuses to touch one row twice in a
///   statement, so pick each key's winner first (`DISTINCT ON`).
/// - `events` come in the order of their [`lock_key`](BatchHandler::lock_key)s
///   (receive order among equals): a statement that locks shared rows should
///   take them in that order (`ORDER BY` the key, `COLLATE "C"`, before
///   `FOR UPDATE`), so that concurrent batches never deadlock. The worker
///   runs the call where its first key falls among the batch's other
///   handlers' events, so its later keys are locked before theirs: give the
///   rows a batch handler locks keys that no other handler locks (a
///   deadlock between two handlers is retried, spending no attempt, but
///   costs a second).
/// - Its outbox messages are written with [`Event::enqueue_all`], in one statement.
///
/// It returns one [`Outcome`] per event, in the order of `events`; any other
/// count is the handler's bug: the call fails, its events run one at a time
/// (with a warning in the log, as after any failed call), and an event whose
/// call miscounts alone too fails with that reason.
pub trait BatchHandler: Send + Sync + 'static {
    /// The payload's type: `serde_json::Value`, or the handler's own `Deserialize` type.
    type Payload: DeserializeOwned + Send + Sync + 'static;

    /// Applies `events`, returning one outcome each, in their order.
    fn handle_batch(
        &self,
        conn: &mut PgConnection,
        events: &[Event<Self::Payload>],
    ) -> impl Future<Output = Result<Vec<Outcome>, HandlerError>> + Send;

    /// The row this event's effect locks and others share, if any (see
    /// [`Handler::lock_key`]): `events` come sorted by it.
    fn lock_key(&self, _event: &Event<Self::Payload>) -> Option<String> {
        None
    }
}
