//! webhook-inbox as a long-running process: [`serve`] (the stages, group
//! commit at receive, health checks and Prometheus metrics, for a container
//! rather than Lambda) and [`dev`] (the whole stack locally, on a throwaway
//! PostgreSQL), each serving the operator's console (the crate
//! `webhook-inbox-console`) at `/console`; [`console::run`] serves the console
//! on its own.
//!
//! The stages themselves, and everything a Lambda function links, are the
//! `webhook-inbox` crate's; this crate adds the HTTP server and the metrics
//! exporter, which no function links.
//!
//! ```no_run
//! # fn app() -> webhook_inbox::App { webhook_inbox::App::default() }
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     webhook_inbox_service::serve::run(app(), webhook_inbox_service::serve::Settings::default()).await
//! }
//! ```

#![deny(missing_docs)]

pub mod console;
pub mod dev;
mod listener;
mod runtime;
pub mod serve;
