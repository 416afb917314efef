//! Handlers: the business effect of one event type, registered by provider
//! and type, run inside the transaction that marks the event done and writes
//! its outbox messages.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use crate::{
    core::{payload, provider::Provider},
    db,
};

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
}

impl<T> Event<T> {
    /// Writes an outbox message in the handler's transaction, unless one with
    /// the same key exists (true when written), recording that this event
    /// wrote it: its page (`inbox show`, [`crate::ops::event_messages`]) lists
    /// it with its delivery state.
    pub async fn enqueue(&self, conn: &mut PgConnection, message: &crate::Message<'_>) -> Result<bool, sqlx::Error> {
        let event = Some((self.provider.as_str(), self.event_id.as_str()));
        crate::db::outbox::enqueue_for(conn, message, event, self.trace_context.as_deref()).await
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
/// [`Handlers::on`]); implement this trait for a handler with a
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

/// What [`Handlers::on`] takes: a [`Handler`], or an async fn or closure
/// `(&mut PgConnection, &Event<T>) -> Result<Outcome, HandlerError>` for any
/// payload type `T: Deserialize`. `M` is inferred; callers never name it.
pub trait IntoHandler<M>: erased::Erase<M> {}

impl<M, H: erased::Erase<M>> IntoHandler<M> for H {}

/// The handlers by provider, then event type.
#[derive(Default, Clone)]
pub struct Handlers(HashMap<Provider, HashMap<String, Arc<dyn erased::Erased>>>);

/// Why a handler cannot be registered; found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// Two handlers for one provider and type: one would silently win.
    #[error("a handler for {provider} {event_type:?} is registered already")]
    Duplicate {
        /// The provider.
        provider: Provider,
        /// The event type.
        event_type: String,
    },
    /// Not a provider name (see [`Provider`]).
    #[error("{0:?} is not a provider name (1 to 64 lower-case letters, digits, '-' or '_')")]
    InvalidProvider(String),
    /// An empty event type matches no event.
    #[error("a handler for {0} has an empty event type")]
    EmptyEventType(Provider),
}

/// The registered `provider:event_type` pairs, sorted.
impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = self.keys();
        keys.sort();
        f.debug_tuple("Handlers").field(&keys).finish()
    }
}

impl Handlers {
    /// No handlers: every event is `unhandled`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `provider`'s events of `event_type`; an error
    /// if that pair has a handler already.
    ///
    /// ```
    /// use webhook_inbox::{Event, HandlerError, Handlers, Outcome, PgConnection};
    ///
    /// async fn log_it(_: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
    ///     println!("{} {}", event.event_type, event.event_id);
    ///     Ok(Outcome::NoEffect)
    /// }
    ///
    /// let handlers = Handlers::new().on("stripe", "customer.created", log_it)?;
    /// assert!(handlers.on("stripe", "customer.created", log_it).is_err());
    /// # Ok::<(), webhook_inbox::RegistrationError>(())
    /// ```
    pub fn on<M>(
        mut self,
        provider: impl AsRef<str>,
        event_type: &str,
        handler: impl IntoHandler<M>,
    ) -> Result<Self, RegistrationError> {
        let name = provider.as_ref();
        let provider = Provider::try_from(name)
            .map_err(|_| RegistrationError::InvalidProvider(name.chars().take(64).collect()))?;
        if event_type.is_empty() {
            return Err(RegistrationError::EmptyEventType(provider));
        }
        let types = self.0.entry(provider).or_default();
        if types.contains_key(event_type) {
            return Err(RegistrationError::Duplicate { provider, event_type: event_type.to_string() });
        }
        types.insert(event_type.to_string(), handler.erase());
        Ok(self)
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.0.values().all(HashMap::is_empty)
    }

    pub(crate) fn get(&self, provider: Provider, event_type: &str) -> Option<&dyn erased::Erased> {
        self.0.get(&provider)?.get(event_type).map(|h| h.as_ref())
    }

    /// `provider:event_type` for every handler: the events whose payload the worker fetches.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.0.iter().flat_map(|(p, types)| types.keys().map(move |t| format!("{}:{t}", p.as_str()))).collect()
    }
}

/// Handlers with their payload type erased: what the registry holds.
pub(crate) mod erased {
    use super::*;
    use crate::process::hints::{Fetched, HintHandler, Object};

    /// A taken event before its handler is known to want it: its payload still text.
    pub struct RawEvent {
        pub provider: Provider,
        pub event_id: String,
        pub event_type: String,
        /// `None` only for a row fetched without its payload (then `null`).
        pub payload: Option<String>,
        pub attempts: i32,
        pub received_at: SystemTime,
        pub headers: Headers,
        /// Its processing's span, when traces are on.
        pub trace_context: Option<String>,
    }

    impl RawEvent {
        /// `received_at` from microseconds since the Unix epoch.
        pub fn received_at_micros(micros: i64) -> SystemTime {
            UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
        }

        fn decode<T: DeserializeOwned>(self) -> Result<Event<T>, String> {
            let payload = payload::decode_as::<T>(self.payload.as_deref().unwrap_or("null")).map_err(|u| u.0)?;
            Ok(Event {
                provider: self.provider,
                event_id: self.event_id,
                event_type: self.event_type,
                payload,
                attempts: self.attempts,
                received_at: self.received_at,
                headers: self.headers,
                trace_context: self.trace_context,
            })
        }
    }

    pub type BoxFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, HandlerError>> + Send + 'a>>;

    /// A registered handler, whatever its payload type.
    pub trait Erased: Send + Sync {
        /// The event with its payload decoded for this handler, or why it does not decode.
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String>;
        fn exclusive(&self) -> bool;
    }

    /// An event ready for its handler.
    pub trait Prepared: Send + Sync {
        fn lock_key(&self) -> Option<String>;
        fn run<'a>(&'a self, conn: &'a mut PgConnection) -> BoxFuture<'a>;
        /// For a [`HintHandler`]'s event: the object to fetch before it runs.
        fn hint(&self) -> Option<Result<Object, HandlerError>> {
            None
        }
        /// A [`HintHandler`]'s event with its object fetched.
        fn run_fetched<'a>(&'a self, conn: &'a mut PgConnection, _fetched: &'a Fetched) -> BoxFuture<'a> {
            self.run(conn)
        }
    }

    /// Turns what [`Handlers::on`] takes into a registered handler.
    pub trait Erase<M> {
        fn erase(self) -> Arc<dyn Erased>;
    }

    /// `M` for a [`Handler`].
    pub struct ByTrait;
    /// `M` for a [`HintHandler`].
    pub struct ByHint;

    struct Hinted<H>(H);
    struct HintedEvent<'h, H: HintHandler>(&'h H, Event<H::Payload>);

    impl<H: HintHandler> Erase<ByHint> for H {
        fn erase(self) -> Arc<dyn Erased> {
            Arc::new(Hinted(self))
        }
    }

    impl<H: HintHandler> Erased for Hinted<H> {
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String> {
            Ok(Box::new(HintedEvent(&self.0, event.decode()?)))
        }
        fn exclusive(&self) -> bool {
            false
        }
    }

    impl<H: HintHandler> Prepared for HintedEvent<'_, H> {
        fn lock_key(&self) -> Option<String> {
            self.0.lock_key(&self.1)
        }
        /// Never without its object: the worker fetches it first, inline mode leaves the event pending.
        fn run<'a>(&'a self, _conn: &'a mut PgConnection) -> BoxFuture<'a> {
            Box::pin(async { Err(HandlerError::transient("its object is fetched first, by the worker")) })
        }
        fn hint(&self) -> Option<Result<Object, HandlerError>> {
            Some(self.0.object(&self.1))
        }
        fn run_fetched<'a>(&'a self, conn: &'a mut PgConnection, fetched: &'a Fetched) -> BoxFuture<'a> {
            Box::pin(self.0.apply(conn, &self.1, fetched))
        }
    }
    /// `M` for an async fn or closure with payload `T`.
    pub struct ByFn<T>(std::marker::PhantomData<fn() -> T>);

    struct Typed<H>(H);
    struct TypedEvent<'h, H: Handler>(&'h H, Event<H::Payload>);

    impl<H: Handler> Erase<ByTrait> for H {
        fn erase(self) -> Arc<dyn Erased> {
            Arc::new(Typed(self))
        }
    }

    impl<H: Handler> Erased for Typed<H> {
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String> {
            Ok(Box::new(TypedEvent(&self.0, event.decode()?)))
        }
        fn exclusive(&self) -> bool {
            self.0.exclusive()
        }
    }

    impl<H: Handler> Prepared for TypedEvent<'_, H> {
        fn lock_key(&self) -> Option<String> {
            self.0.lock_key(&self.1)
        }
        fn run<'a>(&'a self, conn: &'a mut PgConnection) -> BoxFuture<'a> {
            Box::pin(self.0.handle(conn, &self.1))
        }
    }

    /// An async fn or closure of one event: `for<'a> Fn(&'a mut PgConnection,
    /// &'a Event<T>) -> impl Future + 'a`, which a closure's own type cannot say.
    pub trait HandlerFn<'a, T: 'a>: Send + Sync + 'static {
        type Future: Future<Output = Result<Outcome, HandlerError>> + Send + 'a;
        fn call(&self, conn: &'a mut PgConnection, event: &'a Event<T>) -> Self::Future;
    }

    impl<'a, T: 'a, F, Fut> HandlerFn<'a, T> for F
    where
        F: Fn(&'a mut PgConnection, &'a Event<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, HandlerError>> + Send + 'a,
    {
        type Future = Fut;
        fn call(&self, conn: &'a mut PgConnection, event: &'a Event<T>) -> Fut {
            self(conn, event)
        }
    }

    struct FnHandler<F, T>(F, std::marker::PhantomData<fn() -> T>);
    struct FnEvent<'h, F, T>(&'h F, Event<T>);

    impl<F, T> Erase<ByFn<T>> for F
    where
        F: for<'a> HandlerFn<'a, T>,
        T: DeserializeOwned + Send + Sync + 'static,
    {
        fn erase(self) -> Arc<dyn Erased> {
            Arc::new(FnHandler(self, std::marker::PhantomData))
        }
    }

    impl<F, T> Erased for FnHandler<F, T>
    where
        F: for<'a> HandlerFn<'a, T>,
        T: DeserializeOwned + Send + Sync + 'static,
    {
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String> {
            Ok(Box::new(FnEvent(&self.0, event.decode::<T>()?)))
        }
        fn exclusive(&self) -> bool {
            false
        }
    }

    impl<F, T> Prepared for FnEvent<'_, F, T>
    where
        F: for<'a> HandlerFn<'a, T>,
        T: Send + Sync + 'static,
    {
        fn lock_key(&self) -> Option<String> {
            None
        }
        fn run<'a>(&'a self, conn: &'a mut PgConnection) -> BoxFuture<'a> {
            Box::pin(self.0.call(conn, &self.1))
        }
    }
}

/// The 64-bit advisory lock key of an event: the first 8 bytes of
/// SHA-256("provider:event_id"), big-endian, signed. Stable across processes
/// and versions, unlike `hashtext`, and 64 bits wide.
pub(crate) fn advisory_key(provider: Provider, event_id: &str) -> i64 {
    let digest = Sha256::digest(format!("{provider}:{event_id}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// `pg_try_advisory_xact_lock` on the event's key: transaction-scoped (safe behind
/// transaction-mode poolers), released at commit or rollback; false if held elsewhere.
pub(crate) async fn try_lock_event(
    conn: &mut PgConnection,
    provider: Provider,
    event_id: &str,
) -> Result<bool, sqlx::Error> {
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
