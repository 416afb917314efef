//! Verified, deduplicated webhook ingestion into PostgreSQL.
//!
//! Every Lambda function and the `inbox` binary share this crate: the
//! providers' signing schemes and the receive handler (`providers`, `inbox`,
//! `receive`), the worker and its handlers (`worker`, `handlers`, `domain`,
//! `outbox`, `process`), the relay and its sinks (`relay`, `aws`), retention,
//! reconciliation, and the local tooling (`dev_server`, `embedded_pg`).

pub mod aws;
pub mod config;
pub mod db;
pub mod dev_server;
pub mod domain;
pub mod embedded_pg;
pub mod handlers;
pub mod inbox;
mod inline;
pub mod outbox;
pub mod payload;
pub mod process;
pub mod providers;
pub mod receive;
pub mod reconcile;
pub mod relay;
pub mod retention;
pub mod telemetry;
pub mod worker;

pub use config::{Config, Secret};
pub use providers::Provider;
pub use receive::Receiver;
