//! The connection pool, migrations, and the retry wrapper for serialization failures.

use std::{future::Future, str::FromStr, time::Duration};

use sqlx::{
    migrate::Migrator,
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

use crate::config::DbConfig;

/// The schema, embedded in every binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Builds the pool once per process (per Lambda instance); connects lazily, so a
/// cold start costs no round trip until the first delivery.
///
/// The timeouts are sent as startup parameters: every session has them without
/// an extra statement on the hot path, and a claim stuck behind a lock or a
/// function killed mid-transaction cannot hold a connection for long.
pub fn pool(cfg: &DbConfig) -> Result<PgPool, sqlx::Error> {
    let url = cfg.url.as_deref().ok_or_else(|| sqlx::Error::Configuration("DATABASE_URL is not set".into()))?;
    Ok(pool_from(PgConnectOptions::from_str(url)?, cfg))
}

/// [`pool`] for connect options already parsed (tests get theirs from `#[sqlx::test]`).
pub fn pool_from(options: PgConnectOptions, cfg: &DbConfig) -> PgPool {
    let ms = |d: Duration| d.as_millis().to_string();
    let options = options
        .application_name("webhook-inbox")
        .options([
            ("lock_timeout", ms(cfg.lock_timeout)),
            ("statement_timeout", ms(cfg.statement_timeout)),
            ("idle_in_transaction_session_timeout", ms(cfg.idle_in_transaction_timeout)),
        ]);
    PgPoolOptions::new()
        .max_connections(cfg.pool_size.max(1))
        .min_connections(0)
        .acquire_timeout(cfg.acquire_timeout)
        .connect_lazy_with(options)
}

/// SQLSTATE of an error that PostgreSQL raised, if any.
pub fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// 40001 (serialization failure) and 40P01 (deadlock): the whole transaction may simply run again.
pub fn is_retryable(err: &sqlx::Error) -> bool {
    matches!(sqlstate(err).as_deref(), Some("40001" | "40P01"))
}

/// Attempts of a transaction that keeps failing with 40001/40P01 before giving up.
pub const MAX_TRANSACTION_ATTEMPTS: u32 = 5;

/// Runs `attempt` (a whole transaction) again on 40001/40P01, with a short
/// jittered backoff; the retry takes a new snapshot and so sees what the
/// conflicting transaction committed.
pub async fn retry_serialization<T, F, Fut>(mut attempt: F) -> Result<T, sqlx::Error>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut n = 1;
    loop {
        match attempt(n).await {
            Err(e) if n < MAX_TRANSACTION_ATTEMPTS && is_retryable(&e) => {
                tracing::debug!(attempt = n, sqlstate = ?sqlstate(&e), "transaction conflict, retrying");
                let base = 5u64 << n;
                tokio::time::sleep(Duration::from_millis(base / 2 + jitter(base / 2))).await;
                n += 1;
            }
            other => return other,
        }
    }
}

/// A random number in `0..=max`, from the standard library's per-process random keys.
pub fn jitter(max: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(max);
    h.finish() % (max + 1)
}
