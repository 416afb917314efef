//! `inbox console`: the console ([`webhook_inbox_console`]) served on its own,
//! by the same listener as `serve`.

use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use sqlx::PgPool;
use webhook_inbox::{config::Env, ops, ReceiveConfig};
use webhook_inbox_console::{read_pool, unauthenticated_api, Settings};

use crate::{listener, runtime::say};

/// `inbox console`: serves the console at `http://host:port/` on
/// `DATABASE_URL` (reads on `INBOX_CONSOLE_READ_DATABASE_URL` when set), its
/// providers and secrets read as the functions read them, until Ctrl-C or
/// SIGTERM. It applies no migration: the inbox's (`inbox migrate`, or the
/// stack's `migrate`) must be there. A team's own binary is this one call:
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> anyhow::Result<()> {
///     webhook_inbox_service::console::run("127.0.0.1", 9100).await
/// }
/// ```
pub async fn run(host: &str, port: u16) -> anyhow::Result<()> {
    webhook_inbox::config::init_logging();
    crate::runtime::keep_large_allocations_mapped();
    let env = Env::resolved().await?;
    let config = ReceiveConfig::read(&env, 4)?;
    anyhow::ensure!(config.db.url.is_some(), "DATABASE_URL is not set: the console shows a database's inbox");
    let pool = config.db.pool()?;
    ensure_schema(&pool).await?;
    let read = read_pool(&env, &config.db)?.unwrap_or_else(|| pool.clone());
    let pages = webhook_inbox_console::router(pool, read, config.catalog, config.secrets, "", Settings::read(&env)?);
    let limits = listener::Limits::read(&env)?;
    let alive = || async { ([(axum::http::header::CONTENT_TYPE, "application/json")], r#"{"status":"alive"}"#) };
    let app = Router::new().route("/healthz", axum::routing::get(alive)).merge(pages);
    let listener =
        tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("binding {host}:{port}"))?;
    say(&format!("inbox console ready: http://{}/  (Ctrl-C stops)", listener.local_addr()?));
    // The same listener as `inbox serve`'s: header and body timeouts, a connection cap, a body budget
    // (INBOX_HEADER_TIMEOUT_MS, INBOX_BODY_TIMEOUT_MS, INBOX_MAX_CONNECTIONS, INBOX_CONSOLE_MAX_IN_FLIGHT).
    let site = listener::Site {
        receiver: None,
        router: Some(app),
        routed: |_| true,
        paged: |p| p != "/healthz",
        head_check: Some(unauthenticated_api),
        count: None,
        closed: None,
    };
    let shutdown = crate::runtime::shutdown_signal();
    listener::serve_site(listener, site, limits, shutdown, Duration::from_secs(10)).await;
    Ok(())
}

/// Refuses a database without the console's tables, saying how to get them.
async fn ensure_schema(pool: &PgPool) -> anyhow::Result<()> {
    match webhook_inbox::query("SELECT 1 FROM inbox_console_users LIMIT 0")
        .execute(webhook_inbox::Autocommit(pool))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if ops::sqlstate(&e).as_deref() == Some("42P01") => anyhow::bail!(
            "the console's tables are missing from this database: apply the inbox's migrations first (inbox migrate)"
        ),
        Err(e) => Err(e).context("connecting to DATABASE_URL"),
    }
}
