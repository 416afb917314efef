//! Verified, deduplicated webhook ingestion into PostgreSQL.
//!
//! Every Lambda function and the `inbox` binary share this crate. Its modules
//! follow the pipeline, dependencies pointing one way, from leaf types to
//! the functions:
//!
//! - [`core`]: leaf types (providers, secrets, what a usable payload is),
//!   backoff with `Retry-After`, the outbound HTTP client;
//! - [`db`]: pools and SQLSTATE classes, and one module per table holding
//!   every statement on it;
//! - [`ingest`]: each provider's signing scheme, the receive handler, the
//!   claim, inline mode;
//! - [`process`]: the handler registry, the worker, the `process` triggers;
//! - [`reference`]: the reference handlers (orders, payments, deposits);
//! - [`relay`]: the relay and its HTTP and AWS sinks;
//! - [`retention`], [`reconcile`]: the other scheduled stages; [`migrate`]:
//!   the schema at deploy time (a CloudFormation custom resource);
//! - [`config`]: the one reader of the environment, each stage's settings read
//!   through an injectable lookup;
//! - [`runtime`]: the Lambda deadline, the stage loops, tracing; [`dev`]:
//!   `inbox dev`'s server and throwaway PostgreSQL.
//!
//! Features keep each function's binary to what it uses. `service` is the
//! database, receive, process, prune and the Lambda plumbing (Secrets Manager,
//! SQS); `relay`, `reconcile` and `migrate` add their stage and what only it
//! links (the outbound HTTP client, EventBridge); `dev` adds `inbox dev`'s
//! server and throwaway PostgreSQL; `full`, the default, is all of them.
//! Without `service` only `core`'s leaf types and `ingest::providers` remain:
//! what the fuzz targets exercise, built in a minute.
//!
//! # Glossary
//! - **delivery**: one HTTP request from a provider (`ingest::providers::Delivery`);
//!   it carries one event, or several (a Marqeta batch).
//! - **event**: what a provider tells us, one row of `webhook_inbox`, keyed by
//!   `(provider, event_id)`.
//! - **claim**: the `INSERT ... ON CONFLICT DO NOTHING` that makes a delivery's
//!   events rows exactly once; a claimed event is `new` or a `duplicate`.
//! - **handler**: the business effect of one event type, run by the worker (or
//!   inline) in the transaction that marks the event `done`.
//! - **message**: a row of `transactional_outbox`, written by a handler, keyed by
//!   its stable `message_key`.
//! - **sink**: where the relay sends messages (HTTP, SQS, EventBridge); its
//!   **reply** (`relay::SinkReply`) says delivered, retry, or rejected.
//! - **stage**: process, relay, prune (`runtime::stage::Stage`): each a config,
//!   a `run_once` returning its counts, and the shared loops bounded by a
//!   deadline (`run`) or a shutdown (`run_until`). Reconcile is one pass
//!   (`Reconciler::run_once`, each source on its own, one `Reconciled` report).

#[cfg(feature = "service")]
pub mod app;
#[cfg(feature = "service")]
pub mod config;
pub mod core;
#[cfg(feature = "service")]
pub mod db;
#[cfg(feature = "dev")]
pub mod dev;
pub mod ingest;
#[cfg(feature = "service")]
pub mod lambda;
#[cfg(feature = "migrate")]
pub mod migrate;
#[cfg(feature = "service")]
pub mod process;
#[cfg(feature = "reconcile")]
pub mod reconcile;
#[cfg(feature = "service")]
pub mod reference;
#[cfg(feature = "relay")]
pub mod relay;
#[cfg(feature = "service")]
pub mod retention;
#[cfg(feature = "service")]
pub mod runtime;

pub use crate::core::{provider::Provider, secret::Secret};
#[cfg(feature = "service")]
pub use app::App;
#[cfg(feature = "service")]
pub use config::ReceiveConfig;
#[cfg(feature = "service")]
pub use db::{
    outbox::{enqueue, Message},
    query, query_as, query_scalar,
};
#[cfg(feature = "service")]
pub use ingest::receive::Receiver;
#[cfg(feature = "service")]
pub use process::handlers::{Event, Handler, HandlerError, Handlers, Headers, IntoHandler, Outcome, RegistrationError};
/// The JSON crate of [`Event`]'s default payload, `serde_json::Value`.
pub use serde_json;
/// The database crate: a handler's connection is [`PgConnection`].
#[cfg(feature = "service")]
pub use sqlx::{self, PgConnection};
