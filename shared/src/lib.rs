//! Verified, deduplicated webhook ingestion into PostgreSQL.
//!
//! Every Lambda function and the `inbox` binary share this crate: the
//! providers' signing schemes and the receive handler (`providers`, `inbox`,
//! `receive`), the worker and its handlers (`worker`, `handlers`, `domain`,
//! `process`), the relay and its sinks (`relay`, `aws`), retention,
//! reconciliation, the local tooling (`dev_server`, `embedded_pg`), and the
//! database (`db`: one module per table, each holding every statement on it).
//!
//! Without the default `service` feature only the leaf modules remain (`config`,
//! `payload`, `providers`): what the fuzz targets exercise, built in a minute.

#[cfg(feature = "service")]
pub mod aws;
pub mod config;
#[cfg(feature = "service")]
pub mod db;
#[cfg(feature = "service")]
pub mod dev_server;
#[cfg(feature = "service")]
pub mod domain;
#[cfg(feature = "service")]
pub mod embedded_pg;
#[cfg(feature = "service")]
pub mod handlers;
#[cfg(feature = "service")]
pub mod inbox;
#[cfg(feature = "service")]
mod inline;
pub mod payload;
#[cfg(feature = "service")]
pub mod process;
pub mod providers;
#[cfg(feature = "service")]
pub mod receive;
#[cfg(feature = "service")]
pub mod reconcile;
#[cfg(feature = "service")]
pub mod relay;
#[cfg(feature = "service")]
pub mod retention;
#[cfg(feature = "service")]
pub mod telemetry;
#[cfg(feature = "service")]
pub mod worker;

pub use config::{Config, Secret};
pub use providers::Provider;
#[cfg(feature = "service")]
pub use receive::Receiver;
