//! The registry of handlers: the business effect of one event type,
//! registered by provider and type, run inside the transaction that marks the
//! event done and writes its outbox messages. What a handler itself names is
//! in [`super::handler`].

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::de::DeserializeOwned;
use sqlx::PgConnection;

use super::handler::{BatchHandler, Event, Handler, HandlerError, Headers, Outcome};
use webhook_inbox_schemes::{payload, Provider};

/// What [`Handlers::on`] takes: a [`Handler`], a [`BatchHandler`], a
/// [`HintHandler`](crate::hints::HintHandler), or an async fn or closure
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
    /// An empty event type (or none at all) matches no event.
    #[error("a handler for {0} has an empty event type, or none")]
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
        self,
        provider: impl AsRef<str>,
        event_type: &str,
        handler: impl IntoHandler<M>,
    ) -> Result<Self, RegistrationError> {
        self.on_each(provider, &[event_type], handler)
    }

    /// Registers one `handler` for `provider`'s events of each of
    /// `event_types`; an error if a pair has a handler already. A
    /// [`BatchHandler`](crate::BatchHandler) registered so is given a batch's
    /// events of all those types at once (registered once per type, it would
    /// get a call per type).
    ///
    /// ```
    /// use webhook_inbox::{Event, HandlerError, Handlers, Outcome, PgConnection};
    ///
    /// async fn log_it(_: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
    ///     println!("{} {}", event.event_type, event.event_id);
    ///     Ok(Outcome::NoEffect)
    /// }
    ///
    /// let handlers = Handlers::new().on_each("shopify", &["orders/create", "orders/paid"], log_it)?;
    /// assert!(handlers.on("shopify", "orders/paid", log_it).is_err());
    /// # Ok::<(), webhook_inbox::RegistrationError>(())
    /// ```
    pub fn on_each<M>(
        mut self,
        provider: impl AsRef<str>,
        event_types: &[&str],
        handler: impl IntoHandler<M>,
    ) -> Result<Self, RegistrationError> {
        let name = provider.as_ref();
        let provider = Provider::try_from(name)
            .map_err(|_| RegistrationError::InvalidProvider(name.chars().take(64).collect()))?;
        let handler = handler.erase();
        if event_types.is_empty() {
            return Err(RegistrationError::EmptyEventType(provider));
        }
        let types = self.0.entry(provider).or_default();
        for (i, event_type) in event_types.iter().enumerate() {
            if event_type.is_empty() {
                return Err(RegistrationError::EmptyEventType(provider));
            }
            if types.contains_key(*event_type) || event_types[..i].contains(event_type) {
                return Err(RegistrationError::Duplicate { provider, event_type: event_type.to_string() });
            }
        }
        for event_type in event_types {
            types.insert(event_type.to_string(), handler.clone());
        }
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
        /// The worker's count of outbox messages written.
        pub written: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
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
                written: self.written,
            })
        }
    }

    pub(crate) type BoxFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, HandlerError>> + Send + 'a>>;

    /// A registered handler, whatever its payload type.
    pub trait Erased: Send + Sync {
        /// The event with its payload decoded for this handler, or why it does not decode.
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String>;
        fn exclusive(&self) -> bool;
        /// A [`BatchHandler`]'s empty batch, to gather a worker batch's events in.
        fn batch<'h>(&'h self) -> Option<Box<dyn PreparedBatch + 'h>> {
            None
        }
    }

    pub(crate) type BatchFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Outcome>, HandlerError>> + Send + 'a>>;

    /// A [`BatchHandler`]'s events, decoded.
    pub trait PreparedBatch: Send + Sync {
        /// Decodes `event` and adds it, or says why it does not decode.
        fn push(&mut self, event: RawEvent) -> Result<(), String>;
        /// Sorts the events by their lock keys (stably: receive order among
        /// equals); for each new position, the position it was pushed at.
        fn sort(&mut self) -> Vec<usize>;
        /// The first event's lock key (after [`PreparedBatch::sort`]).
        fn first_key(&self) -> Option<String>;
        /// Runs the handler over all the events (`None`) or the `i`-th alone,
        /// checking it returned an outcome per event.
        fn run<'a>(&'a self, conn: &'a mut PgConnection, one: Option<usize>) -> BatchFuture<'a>;
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

    /// `M` for a [`BatchHandler`].
    pub struct ByBatch;

    struct Batched<H>(H);
    /// One event for a [`BatchHandler`] (inline mode).
    struct BatchedEvent<'h, H: BatchHandler>(&'h H, Event<H::Payload>);
    /// A worker batch's events for a [`BatchHandler`], and their lock keys.
    struct BatchedEvents<'h, H: BatchHandler> {
        handler: &'h H,
        keys: Vec<Option<String>>,
        events: Vec<Event<H::Payload>>,
    }

    impl<H: BatchHandler> Erase<ByBatch> for H {
        fn erase(self) -> Arc<dyn Erased> {
            Arc::new(Batched(self))
        }
    }

    impl<H: BatchHandler> Erased for Batched<H> {
        fn prepare<'h>(&'h self, event: RawEvent) -> Result<Box<dyn Prepared + 'h>, String> {
            Ok(Box::new(BatchedEvent(&self.0, event.decode()?)))
        }
        fn exclusive(&self) -> bool {
            false
        }
        fn batch<'h>(&'h self) -> Option<Box<dyn PreparedBatch + 'h>> {
            Some(Box::new(BatchedEvents { handler: &self.0, keys: Vec::new(), events: Vec::new() }))
        }
    }

    /// `handler` over `events`: an outcome per event, or the handler's bug said as a permanent failure.
    async fn run_batch<H: BatchHandler>(
        handler: &H,
        conn: &mut PgConnection,
        events: &[Event<H::Payload>],
    ) -> Result<Vec<Outcome>, HandlerError> {
        let outcomes = handler.handle_batch(conn, events).await?;
        if outcomes.len() != events.len() {
            return Err(HandlerError::permanent(format!(
                "the batch handler returned {} outcomes for a batch of {}",
                outcomes.len(),
                events.len()
            )));
        }
        Ok(outcomes)
    }

    impl<H: BatchHandler> Prepared for BatchedEvent<'_, H> {
        fn lock_key(&self) -> Option<String> {
            self.0.lock_key(&self.1)
        }
        fn run<'a>(&'a self, conn: &'a mut PgConnection) -> BoxFuture<'a> {
            Box::pin(async move { Ok(run_batch(self.0, conn, std::slice::from_ref(&self.1)).await?[0]) })
        }
    }

    impl<H: BatchHandler> PreparedBatch for BatchedEvents<'_, H> {
        fn push(&mut self, event: RawEvent) -> Result<(), String> {
            let event = event.decode()?;
            self.keys.push(self.handler.lock_key(&event));
            self.events.push(event);
            Ok(())
        }
        fn sort(&mut self) -> Vec<usize> {
            let mut order: Vec<usize> = (0..self.events.len()).collect();
            order.sort_by(|a, b| self.keys[*a].cmp(&self.keys[*b]));
            let mut events: Vec<_> = std::mem::take(&mut self.events).into_iter().map(Some).collect();
            self.events = order.iter().map(|i| events[*i].take().expect("each position once")).collect();
            self.keys = order.iter().map(|i| self.keys[*i].take()).collect();
            order
        }
        fn first_key(&self) -> Option<String> {
            self.keys.first().cloned().flatten()
        }
        fn run<'a>(&'a self, conn: &'a mut PgConnection, one: Option<usize>) -> BatchFuture<'a> {
            let events = match one {
                None => &self.events[..],
                Some(i) => std::slice::from_ref(&self.events[i]),
            };
            Box::pin(run_batch(self.handler, conn, events))
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
