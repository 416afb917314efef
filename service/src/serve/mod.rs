//! The long-running service: `inbox serve`, for a container (ECS, Kubernetes,
//! Fly, a VM) rather than Lambda, with the same binaries' stages, read from
//! the same configuration and secrets as the functions read them.
//!
//! [`run`] serves the [`Role`]s it is given (by default every role but the
//! console), so that one image runs as one deployment or as several:
//! `POST /webhooks/{provider}` with group commit at receive (deliveries that
//! arrive together claimed in one statement and one commit, see
//! [`GroupConfig`]), the worker, the relay, prune and reconcile on their
//! schedules, and the console. Beside them, on the admin port, `/healthz`
//! (alive), `/readyz` (the database reachable and every migration applied)
//! and Prometheus `/metrics` (the repository's `docs/serve.md` lists every
//! metric); the main port answers `/healthz` and `/readyz` too, for a load
//! balancer's checks. With `OTEL_EXPORTER_OTLP_ENDPOINT`, each delivery is one
//! OpenTelemetry trace from its receive through its processing to the relay of
//! the messages its handler wrote.
//!
//! On SIGTERM (or Ctrl-C) it drains: `/readyz` answers 503, no new
//! connection is taken, every delivery in flight is answered once its claim
//! has committed, each stage finishes the batch it is in (its row locks and
//! leases go with the commit), all within `INBOX_DRAIN_TIMEOUT_MS`; past it,
//! what is still in flight is answered 503 (and sent again by its provider)
//! and the stages' transactions roll back.
//!
//! A team's own service is one call:
//!
//! ```no_run
//! # fn app() -> webhook_inbox::App { webhook_inbox::App::default() }
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     webhook_inbox_service::serve::run(app(), webhook_inbox_service::serve::Settings::default()).await
//! }
//! ```

mod config;
mod health;
mod metrics;
mod roles;
mod stack;
mod stages;

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::TcpListener;

pub use roles::{Role, Roles};
pub(crate) use stack::Stack;

use crate::listener;
use crate::runtime::say;
pub use webhook_inbox::GroupConfig;
use webhook_inbox::{
    config::{ConfigError, Env},
    App, ReceiveConfig,
};

pub use crate::listener::Limits;
pub use config::ServeConfig;

/// What [`run`] is told beyond the environment: each `None` is read from it.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `INBOX_ROLES`; by default every role but the console.
    pub roles: Option<Roles>,
    /// `INBOX_HOST`, default `0.0.0.0` (a container's every interface).
    pub host: Option<String>,
    /// `PORT`, default 8080: the webhooks, the console, `/healthz` and `/readyz`.
    pub port: Option<u16>,
    /// `INBOX_ADMIN_HOST`, default the main host: where the admin port
    /// listens (`127.0.0.1`, or a private interface, to keep it off the one
    /// that faces the internet).
    pub admin_host: Option<String>,
    /// `INBOX_ADMIN_PORT`, default 9090: `/healthz`, `/readyz` (saying why
    /// not ready) and `/metrics`, for what should not face the internet.
    pub admin_port: Option<u16>,
    /// Apply the migrations (the inbox's, then the application's) before
    /// serving, as `inbox migrate` does; by default they must be there
    /// already, and `/readyz` says so until they are.
    pub migrate: bool,
}

/// Serves `receiver` (`POST /webhooks/{provider}`) on `listener` until
/// `shutdown` completes, then drains, as [`run`] receives: its listener (the
/// header and body timeouts, the connection cap, each connection on its own
/// task: `limits`, [`Limits::default`] or [`Limits::read`]), every delivery
/// counted in the process's Prometheus metrics. For a binary that runs
/// receive beside stages of its own.
pub async fn webhooks(
    listener: TcpListener,
    receiver: std::sync::Arc<webhook_inbox::Receiver>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    metrics::install().map_err(std::io::Error::other)?;
    let site = listener::Site { count: Some(metrics::delivered), ..listener::Site::webhooks(receiver) };
    listener::serve_site(listener, site, limits, shutdown, Duration::from_secs(10)).await;
    Ok(())
}

/// Serves `app` as `settings` and the environment say, until SIGTERM or
/// Ctrl-C, then drains (see the module's documentation). No embedded
/// PostgreSQL and no development secret: `DATABASE_URL` and the providers'
/// secrets (Secrets Manager's `*_ARN` included) are read as the functions
/// read them.
pub async fn run(app: App, settings: Settings) -> Result<()> {
    webhook_inbox::config::init_logging();
    crate::runtime::keep_large_allocations_mapped();
    let env = Env::resolved().await?;
    let roles = match settings.roles.clone() {
        Some(roles) => roles,
        None => match env.var("INBOX_ROLES") {
            Some(text) => {
                Roles::parse(&text).map_err(|reason| ConfigError::Invalid { var: "INBOX_ROLES".into(), reason })?
            }
            None => Roles::default(),
        },
    };
    let config = ReceiveConfig::read(&env, 16)?;
    anyhow::ensure!(config.db.url.is_some(), "DATABASE_URL is not set: inbox serve runs on a database of yours");
    if roles.has(Role::Receive) && config.secrets.none_configured() {
        anyhow::bail!("no webhook secret is set (STRIPE_WEBHOOK_SECRET, ...): receive would refuse every delivery; serve without the receive role, or set one");
    }
    let host = settings.host.clone().or_else(|| env.var("INBOX_HOST")).unwrap_or_else(|| "0.0.0.0".into());
    let port = match settings.port {
        Some(p) => p,
        None => env.parse("PORT", 8080)?,
    };
    let admin_port = match settings.admin_port {
        Some(p) => p,
        None => env.parse("INBOX_ADMIN_PORT", 9090)?,
    };
    let admin_host =
        settings.admin_host.clone().or_else(|| env.var("INBOX_ADMIN_HOST")).unwrap_or_else(|| host.clone());
    let serve = ServeConfig::read(&env)?;
    let traces = config::otlp_traces(&env)?;
    if let Some((endpoint, service)) = &traces {
        webhook_inbox::host::install_traces(endpoint, service).context("starting the OTLP trace exporter")?;
    }
    let pool = config.db.pool()?;
    if settings.migrate {
        app.migrate(&pool).await.context("applying migrations")?;
    }
    let main = TcpListener::bind((host.as_str(), port)).await.with_context(|| format!("binding {host}:{port}"))?;
    // One port for both when they are the same (0, a free port each, is two).
    let admin = if admin_port == port && admin_host == host && port != 0 {
        None
    } else {
        Some(
            TcpListener::bind((admin_host.as_str(), admin_port))
                .await
                .with_context(|| format!("binding {admin_host}:{admin_port}"))?,
        )
    };
    let stack = Stack { app: &app, env: &env, config: &config, pool, roles, serve, counted: true };
    let served = stack
        .run(main, admin, crate::runtime::shutdown_signal(), |addr, admin| {
            let admin = admin.map_or(String::new(), |a| format!("; /healthz, /readyz and /metrics on http://{a}"));
            let traces = traces.as_ref().map_or(String::new(), |_| "; traces over OTLP".into());
            say(&format!("inbox serve ready on http://{addr}{admin}{traces}"));
        })
        .await;
    // The spans still buffered go out before the process ends.
    tokio::task::spawn_blocking(webhook_inbox::host::shutdown_traces).await?;
    served
}
