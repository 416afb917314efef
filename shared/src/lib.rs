//! Verified, deduplicated webhook ingestion into PostgreSQL, and the
//! foundation a team builds its own webhook effects on.
//!
//! Providers deliver at least once. Receive verifies each delivery's signature
//! over the raw bytes and claims its events with `INSERT ... ON CONFLICT DO
//! NOTHING` (answering 200 only after the commit); the worker takes pending
//! events with `FOR UPDATE SKIP LOCKED` and runs *your* handlers in the
//! transaction that marks the event done and writes its outbox messages; the
//! relay delivers those. An event no handler takes ends `unhandled`, and a
//! handler deployed later is run over it with one requeue; an event a team
//! never wants ends `ignored` by a declared rule ([`config::IgnoreRules`]).
//!
//! # Getting started
//!
//! A handler is an async fn (or closure) of the transaction it runs in and the
//! event, its payload decoded into your own type. An [`App`] holds the
//! handlers (and, with [`App::with_migrations`], your tables' migrations); each
//! Lambda function, and a local `dev` stack, is one call with it:
//!
//! ```no_run
//! use serde::Deserialize;
//! use webhook_inbox::{query, App, Event, HandlerError, Handlers, Message, Outcome, PgConnection};
//!
//! /// What `invoice.paid` carries that this handler reads.
//! #[derive(Deserialize)]
//! struct InvoicePaid {
//!     data: Data,
//! }
//! #[derive(Deserialize)]
//! struct Data {
//!     object: Invoice,
//! }
//! #[derive(Deserialize)]
//! struct Invoice {
//!     id: String,
//! }
//!
//! async fn invoice_paid(conn: &mut PgConnection, event: &Event<InvoicePaid>) -> Result<Outcome, HandlerError> {
//!     let id = &event.payload.data.object.id;
//!     let paid = query("UPDATE invoices SET status = 'paid' WHERE invoice_id = $1 AND status <> 'paid'")
//!         .bind(id)
//!         .execute(&mut *conn)
//!         .await?;
//!     if paid.rows_affected() == 0 {
//!         return Ok(Outcome::NoEffect); // a twin event, or a replay
//!     }
//!     let receipt = Message::new("invoice", id, format!("receipt:{id}"), serde_json::json!({ "invoice": id }))
//!         .to("email"); // a destination of RELAY_DESTINATIONS_FILE
//!     event.enqueue(conn, &receipt).await?; // committed with the update, or not at all
//!     Ok(Outcome::Applied)
//! }
//!
//! fn app() -> Result<App, webhook_inbox::RegistrationError> {
//!     Ok(App::new(Handlers::new().on("stripe", "invoice.paid", invoice_paid)?))
//! }
//!
//! // The `process` Lambda function; `receive` and `migrate` are the same call.
//! #[tokio::main]
//! async fn main() -> Result<(), webhook_inbox::lambda::Error> {
//!     webhook_inbox::lambda::process(app()?).await
//! }
//! ```
//!
//! `examples/invoices` in the repository is such an application, whole: its
//! migrations, handlers, binaries and tests. The stock binaries run one too,
//! the repository's `examples/stock`.
//!
//! # Words
//!
//! One name, one meaning, here and in the repository's docs:
//!
//! - **delivery**: one HTTP request from a provider; it carries one event, or
//!   a batch of them.
//! - **receive**: the stage that verifies a delivery over its raw bytes and
//!   **claims** its events ([`Receiver`]): the `INSERT ... ON CONFLICT DO
//!   NOTHING` that makes an event the inbox's once, whatever the redeliveries.
//! - **event**: a row of `webhook_inbox`, keyed by provider and id; `pending`,
//!   `done`, `failed`, `unhandled` (no handler takes its type), or `ignored`
//!   (an ignore rule matched it).
//! - **process**: the stage that runs your **handlers** ([`Handler`], one
//!   event at a time, or [`BatchHandler`], a batch's events in a few
//!   set-based statements) over pending events ([`Worker`]), in the
//!   transaction that finishes the events; a **pass** is one batch,
//!   [`Processed`] what it did.
//! - **outbox**: `transactional_outbox`, the [`Message`]s handlers enqueue in
//!   that transaction; **relay**: the stage that sends them ([`Relay`]).
//! - **prune**: the stage that deletes what is past its **retention**, the
//!   durations of [`PruneConfig`].
//! - **reconcile**: the stage that claims from a provider's API what was never
//!   delivered ([`reconciliation`]).
//! - **replay**: one event back to pending; **requeue**: every event a filter
//!   selects back to pending; each, like an outbox retry, with an [`ops::Audit`].
//! - **stock application**: the handlers and tables the repository's own
//!   binaries run (`examples/stock`); yours takes its place.
//!
//! # What is public
//!
//! The items at this root, and the modules [`lambda`] (one entry point per
//! function), [`ops`] (what the operator's commands do, from code), [`config`] (settings from the environment), [`schemes`]
//! (a provider's signing contract of your own: the crate
//! `webhook-inbox-schemes`, which verifies deliveries with no async runtime and
//! no database, has every provider's), [`reconciliation`] (provider
//! APIs to reconcile from), [`hints`] (events as hints), [`alerts`],
//! [`archive`] (prune's archive in S3, and restore), [`host`] (what a
//! long-running host of the stages uses) and [`testing`] (a team's test
//! support), each item at one path. Everything else is private.
//!
//! The same stages as a long-running service (`serve`) and the local stack
//! (`dev`) are the crate `webhook-inbox-service`, the operator's console and
//! its management API the crate `webhook-inbox-console`, both built on this
//! one's public API: no Lambda function links their HTTP server, web
//! framework or metrics exporter.
//!
//! # Features
//!
//! `service` is the database, receive, process, prune and the Lambda plumbing
//! (Secrets Manager, SQS); `relay`, `reconcile` and `migrate` add their stage
//! and what only it links (the outbound HTTP client, EventBridge), `archive`
//! prune's archive (the S3 client, gzip); `nats` and `amqp` the relay's
//! broker sinks, `otlp` OpenTelemetry traces, `openapi` the OpenAPI schemas
//! of the types an API answers with, `testing` the test kit; `full` is all of
//! them. The default is every Lambda stage (`relay`, `reconcile`, `migrate`,
//! `archive`, and `service` with them): no broker client and no trace
//! exporter. Without `service`
//! only [`schemes`] and [`Provider`] remain.

// Without `service` only the schemes' re-exports remain.
#![cfg_attr(not(feature = "service"), allow(dead_code, unused_imports))]

#[cfg(feature = "service")]
pub mod alerts;
#[cfg(feature = "service")]
mod app;
#[cfg(feature = "archive")]
pub mod archive;
#[cfg(feature = "service")]
pub mod config;
mod core;
#[cfg(feature = "service")]
mod db;
#[cfg(feature = "service")]
pub mod lambda;
#[cfg(feature = "migrate")]
mod migrate;
#[cfg(feature = "service")]
mod process;
#[cfg(feature = "service")]
mod prune;
#[cfg(feature = "service")]
mod receive;
#[cfg(feature = "reconcile")]
mod reconcile;
#[cfg(feature = "relay")]
mod relay;
#[cfg(feature = "service")]
mod runtime;

#[cfg(feature = "service")]
pub mod ops;
#[cfg(feature = "testing")]
pub mod testing;

/// A provider's signing contract in code, for a provider that is neither
/// built in nor declarable as data: implement [`Scheme`](schemes::Scheme) and
/// add it with [`App::with_scheme`]. It verifies the raw bytes first
/// ([`Scheme::verify`](schemes::Scheme::verify), saying why it refuses as a
/// [`Rejected`](schemes::Rejected) of a [`RejectionKind`](schemes::RejectionKind)),
/// then turns them into events ([`NewEvent::from_json`](schemes::NewEvent::from_json)).
/// [`Schemes`](schemes::Schemes) holds a deployment's, built in and your own.
///
/// These are the crate `webhook-inbox-schemes`' items: that crate (no async
/// runtime, no database) has every built-in provider's scheme too, to verify a
/// delivery outside the inbox.
///
/// ```
/// use std::borrow::Cow;
///
/// use hmac::{Hmac, Mac};
/// use sha2::Sha256;
/// use webhook_inbox::schemes::{Delivery, Events, NewEvent, Rejected, RejectionKind, Scheme, Verified};
/// use webhook_inbox::{App, Handlers, Provider};
///
/// /// `X-Acme-Signature: <hex HMAC-SHA256(secret, body)>`; the id and type in the signed body.
/// struct Acme {
///     secret: Vec<u8>,
/// }
///
/// impl Scheme for Acme {
///     fn provider(&self) -> Provider {
///         Provider::try_from("acme").expect("a valid name")
///     }
///
///     fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
///         let sent = d.headers.get("x-acme-signature").ok_or_else(|| Rejected::missing("missing X-Acme-Signature"))?;
///         let sent = hex::decode(sent.as_bytes()).map_err(|_| Rejected::malformed("X-Acme-Signature is not hex"))?;
///         let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
///         mac.update(d.body);
///         mac.verify_slice(&sent) // in constant time
///             .map(|()| Verified { secret_index: 0 })
///             .map_err(|_| Rejected::no_match("X-Acme-Signature does not match"))
///     }
///
///     fn events(&self, d: &Delivery<'_>) -> Events {
///         let json: Option<serde_json::Value> = serde_json::from_slice(d.body).ok();
///         let field = |name: &str| json.as_ref().and_then(|j| j[name].as_str()).map(str::to_string);
///         let kind = field("type").unwrap_or_else(|| "unknown".into());
///         // Pending when usable, else kept as `failed` with the reason.
///         Events::Single(NewEvent::from_json(d.body, field("id"), &kind))
///     }
///
///     fn kept_headers(&self) -> Cow<'_, [&str]> {
///         Cow::Borrowed(&["x-acme-signature"])
///     }
/// }
///
/// let secret = std::env::var("ACME_WEBHOOK_SECRET").unwrap_or_else(|_| "acme-secret".into());
/// let acme = Acme { secret: secret.into_bytes() };
/// let headers = http::HeaderMap::new();
/// let unsigned = Delivery { headers: &headers, body: b"{}", now: 0 };
/// assert_eq!(acme.verify(&unsigned).unwrap_err().kind(), RejectionKind::Missing);
///
/// // `POST /webhooks/acme`, in every stage built from this app.
/// let app = App::new(Handlers::new()).with_scheme(acme);
/// # drop(app);
/// ```
pub mod schemes {
    pub use webhook_inbox_schemes::{
        Challenged, Delivery, Events, InitialStatus, NewEvent, Rejected, RejectionKind, Scheme, Schemes, Verified,
    };
}

/// Reconciliation's sources: the provider APIs reconcile reads for what
/// was never delivered. Stripe's events, Shopify's orders and GitHub's hook
/// deliveries are built in (configured by the environment); a team adds its
/// own by implementing [`Source`](reconciliation::Source) and adding it with
/// [`App::with_source`]. It claims what it finds with
/// [`claim`](reconciliation::claim), through the webhook claim, and may keep
/// its checkpoint with [`walk`](reconciliation::walk).
#[cfg(feature = "reconcile")]
pub mod reconciliation {
    pub use crate::reconcile::{
        answer_text, claim, walk, Found, GithubDeliveries, Hook, ReconcileConfig, ReconcileError, Reconciled,
        Reconciler, ShopifyOrders, Source, SourceRun, StripeEvents, NOTHING_TO_RECONCILE,
    };
}

/// Events as hints: a [`HintHandler`](hints::HintHandler) names the object
/// an event is about; the worker fetches its current state from the
/// provider's API outside any transaction and the handler applies it (see
/// the module's reasoning in the repository's `docs/process.md`, "Events as hints").
#[cfg(feature = "service")]
pub mod hints {
    #[cfg(feature = "http-client")]
    pub use crate::process::hints::StripeApi;
    pub use crate::process::hints::{Apis, FetchError, Fetched, HintHandler, Object, ObjectApi};
}

/// Where the relay sends a destination's messages: a [`Sink`](sinks::Sink).
/// HTTP (signed as Standard Webhooks with a [`Signer`](sinks::Signer)), SQS,
/// EventBridge, NATS JetStream (feature `nats`) and AMQP 0-9-1 such as
/// RabbitMQ (feature `amqp`) are built in; a team adds its own with
/// [`App::with_sink`] and names it in a destination (`sink = "kafka"`). See
/// the repository's `docs/destinations.md`.
#[cfg(feature = "relay")]
pub mod sinks {
    pub use crate::core::http::http_client;
    pub use crate::db::outbox::Outgoing;
    #[cfg(feature = "amqp")]
    pub use crate::relay::amqp::AmqpSink;
    #[cfg(feature = "nats")]
    pub use crate::relay::nats::NatsSink;
    pub use crate::relay::{
        aws::{EventBridgeSink, SnsSink, SqsSink},
        signing::Signer,
        HttpSink, RepliesFuture, Sink, SinkReply,
    };
}

/// What a long-running host of the stages uses beyond them: a stage's
/// figures ([`Metrics`](host::Metrics), what a Lambda function writes as
/// CloudWatch EMF lines) and its loop with an observer of each pass
/// ([`run_observed`](host::run_observed)), receive's answer to what it
/// refused before a receiver ([`respond`](host::respond)), the relay as one
/// lane per destination, the queue's gauges, and (feature `otlp`) the trace
/// exporter. The crate `webhook-inbox-service` (`serve`, `dev`) is built on
/// it; a team's own long-running host may be too.
#[cfg(feature = "service")]
pub mod host {
    pub use crate::process::gauges;
    pub use crate::receive::receiver::{respond, ReceiveError};
    #[cfg(feature = "relay")]
    pub use crate::relay::{lane::Lane, RelayGauges};
    pub use crate::runtime::metrics::{Kind, Metrics, Unit, NAMESPACE};
    pub use crate::runtime::stage::{run_observed, Reported};
    #[cfg(feature = "otlp")]
    pub use crate::runtime::trace::{install as install_traces, shutdown as shutdown_traces};
}

#[cfg(feature = "service")]
pub use app::App;
#[cfg(feature = "service")]
pub use core::aws::ArchiveConfig;
#[cfg(feature = "service")]
pub use db::{
    outbox::{enqueue, Message},
    query, query_as, query_scalar,
    schema::MigrateError,
    Autocommit,
};
#[cfg(feature = "service")]
pub use process::{
    handler::{BatchHandler, Event, Handler, HandlerError, Headers, Outcome},
    handlers::{Handlers, IntoHandler, RegistrationError},
    worker::{Processed, Worker, WorkerConfig},
};
#[cfg(feature = "service")]
pub use prune::{PruneConfig, Pruned, Pruner};
#[cfg(feature = "service")]
pub use receive::receiver::ReceiveConfig;
#[cfg(feature = "service")]
pub use receive::{claim::group::GroupConfig, receiver::Receiver};
#[cfg(feature = "relay")]
pub use relay::{Destination, DestinationLimits, DestinationRelayed, Relay, RelayConfig, Relayed};
#[cfg(feature = "service")]
pub use runtime::stage::{Pass, Stage, Stopped, Tally};
/// The JSON crate of [`Event`]'s default payload, `serde_json::Value`.
pub use serde_json;
/// The database crate: a handler's connection is [`PgConnection`].
#[cfg(feature = "service")]
pub use sqlx::{self, PgConnection};
pub use webhook_inbox_schemes::Provider;
