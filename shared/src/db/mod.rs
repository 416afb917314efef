//! The database: pools and connections, the schema's migrations, SQLSTATE classes, and one
//! module per table holding every statement on it.

pub(crate) mod audit;
pub(crate) mod bodies;
#[cfg(feature = "reconcile")]
pub(crate) mod checkpoints;
pub(crate) mod destinations;
pub(crate) mod inbox;
pub(crate) mod jobs;
pub(crate) mod minutes;
pub(crate) mod outbox;
pub(crate) mod pauses;
mod pooler;
pub(crate) mod schema;

pub(crate) use pooler::{built_query_as, set_behind_pooler};
pub use pooler::{query, query_as, query_scalar, Autocommit};

use std::{
    ops::{Deref, DerefMut},
    str::FromStr,
    sync::Mutex,
    time::Duration,
};

use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, PgConnection, PgPool,
};
use tokio::sync::{Semaphore, SemaphorePermit};

/// [`DbConfig::pool`] for connect options already parsed (tests get theirs from `#[sqlx::test]`).
pub(crate) fn pool_from(options: PgConnectOptions, cfg: &DbConfig) -> PgPool {
    PgPoolOptions::new()
        .max_connections(cfg.pool_size.max(1))
        .min_connections(0)
        .acquire_timeout(cfg.acquire_timeout)
        .connect_lazy_with(with_timeouts(options, cfg))
}

fn parse_url(cfg: &DbConfig) -> Result<PgConnectOptions, sqlx::Error> {
    let url = cfg.url.as_deref().ok_or_else(|| sqlx::Error::Configuration("DATABASE_URL is not set".into()))?;
    PgConnectOptions::from_str(url)
}

/// The timeouts travel as startup parameters: every session has them without
/// an extra statement on the hot path, and a claim stuck behind a lock or a
/// function killed mid-transaction cannot hold a connection for long.
fn with_timeouts(options: PgConnectOptions, cfg: &DbConfig) -> PgConnectOptions {
    let ms = |d: Duration| d.as_millis().to_string();
    let options = options.application_name("webhook-inbox");
    if cfg.behind_proxy {
        // Set where the configuration is read (`DbConfig::read`); again here for
        // a configuration built in code, which would otherwise name its statements.
        pooler::set_behind_pooler();
        // sqlx sends extra_float_digits at startup unless told not to; PgBouncer refuses it.
        return options.extra_float_digits(None);
    }
    options.options([
        ("lock_timeout", ms(cfg.lock_timeout)),
        ("statement_timeout", ms(cfg.statement_timeout)),
        ("idle_in_transaction_session_timeout", ms(cfg.idle_in_transaction_timeout)),
    ])
}

/// The receive path's connections: built once per process (per Lambda
/// instance), small, connected lazily on first use.
///
/// Not sqlx's `Pool`, because that pings every connection it takes back: a
/// second round trip to the database per delivery. Here a delivery costs one.
/// A connection is reused only after its statement completed; one whose
/// statement failed with a lost connection, or whose future was dropped
/// half-way, is closed instead.
pub(crate) struct Connections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Semaphore,
    acquire_timeout: Duration,
}

impl Connections {
    pub(crate) fn new(cfg: &DbConfig) -> Result<Self, sqlx::Error> {
        Ok(Self::from_options(parse_url(cfg)?, cfg))
    }

    pub(crate) fn from_options(options: PgConnectOptions, cfg: &DbConfig) -> Self {
        Connections {
            options: with_timeouts(options, cfg),
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(cfg.pool_size.max(1) as usize),
            acquire_timeout: cfg.acquire_timeout,
        }
    }

    /// An idle connection, or a new one; waits at most the acquire timeout in all.
    pub(crate) async fn acquire(&self) -> Result<Lease<'_>, sqlx::Error> {
        let work = async {
            let permit = self.permits.acquire().await.map_err(|_| sqlx::Error::PoolClosed)?;
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let conn = match idle {
                Some(conn) => conn,
                None => PgConnection::connect_with(&self.options).await?,
            };
            Ok(Lease { owner: self, conn: Some(conn), reusable: false, _permit: permit })
        };
        tokio::time::timeout(self.acquire_timeout, work).await.map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    /// Closes every idle connection: after one was found dead, the others probably are too.
    pub(crate) fn discard_idle(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A connection on loan from [`Connections`]; goes back only if [`Lease::reuse`] was called.
pub(crate) struct Lease<'a> {
    owner: &'a Connections,
    conn: Option<PgConnection>,
    reusable: bool,
    _permit: SemaphorePermit<'a>,
}

impl Lease<'_> {
    /// The statement completed and the connection is in a known state: keep it.
    pub(crate) fn reuse(mut self) {
        self.reusable = true;
    }
}

impl Deref for Lease<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("present until drop")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.reusable, self.conn.take()) {
            self.owner.idle.lock().unwrap_or_else(|e| e.into_inner()).push(conn);
        }
    }
}

/// SQLSTATE of an error that PostgreSQL raised, if any.
pub fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// 40001 (serialization failure) and 40P01 (deadlock): the whole transaction may simply run again.
pub(crate) fn is_retryable(err: &sqlx::Error) -> bool {
    matches!(sqlstate(err).as_deref(), Some("40001" | "40P01"))
}

/// Errors of the moment, not of the input: serialization failure and deadlock
/// (40001, 40P01), a lock or statement timeout (55P03, 57014), an exhausted
/// server (class 53), or a lost connection. Anything else repeats on every try.
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    if is_connection_lost(err) || matches!(err, sqlx::Error::PoolTimedOut) {
        return true;
    }
    match sqlstate(err).as_deref() {
        Some("40001" | "40P01" | "55P03" | "57014") => true,
        Some(s) => s.starts_with("53") || s.starts_with("08"),
        None => false,
    }
}

/// Transient because of another transaction (serialization, deadlock, lock
/// timeout): retried soon, without spending one of the event's attempts.
pub(crate) fn is_contention(err: &sqlx::Error) -> bool {
    matches!(sqlstate(err).as_deref(), Some("40001" | "40P01" | "55P03"))
}

/// PostgreSQL refused the statement for what it carries (a value `jsonb` rejects,
/// class 22; nesting past its stack depth, 54001; a number a column cannot hold,
/// ...), not because it is unavailable: an outage is transient, and a statement
/// without the value would fail the same way.
pub(crate) fn is_refused_value(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(_)) && !is_transient(err)
}

/// The connection died under the statement (server restart, failover, idle
/// cut): the statement may run again on a fresh connection.
pub(crate) fn is_connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(_) => {
            matches!(sqlstate(err).as_deref(), Some("57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}

/// Runs a statement that is safe to run twice (its guard makes a second run
/// a no-op, or it reads) again when the connection is lost under it, up to
/// three more times, 25 ms apart and doubling: a cut after a COMMIT loses its
/// answer, not its work, and one lost answer must not cost the caller its pass.
#[cfg(feature = "relay")]
pub(crate) async fn on_lost_connection_again<T, F, Fut>(mut statement: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut wait = Duration::from_millis(25);
    for _ in 0..3 {
        match statement().await {
            Err(e) if is_connection_lost(&e) => {
                tracing::debug!(error = %e, "connection lost under a statement, running it again");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            done => return done,
        }
    }
    statement().await
}

/// Attempts of a transaction that keeps failing with 40001/40P01 before giving up.
pub(crate) const MAX_TRANSACTION_ATTEMPTS: u32 = 5;

/// How long to wait before attempt `attempt + 1` of a transaction that failed
/// with `err`: `Some` on 40001/40P01 while attempts remain (a short jittered
/// backoff), `None` when the error is final.
pub(crate) fn retry_after(err: &sqlx::Error, attempt: u32) -> Option<Duration> {
    if attempt >= MAX_TRANSACTION_ATTEMPTS || !is_retryable(err) {
        return None;
    }
    tracing::debug!(attempt, sqlstate = ?sqlstate(err), "transaction conflict, retrying");
    let base = 5u64 << attempt;
    Some(Duration::from_millis(base / 2 + crate::core::backoff::jitter(base / 2)))
}

/// Database settings: a small pool, connected lazily, with timeouts on every
/// session. Its `Debug` shows the URL without its credentials.
#[derive(Clone)]
pub struct DbConfig {
    /// `DATABASE_URL` (its credentials from `DATABASE_SECRET_ARN` on Lambda).
    pub url: Option<String>,
    /// `INBOX_DB_POOL_SIZE`: connections at most.
    pub pool_size: u32,
    /// `INBOX_DB_ACQUIRE_TIMEOUT_MS`: the longest wait for a connection.
    pub acquire_timeout: Duration,
    /// `INBOX_LOCK_TIMEOUT_MS`: every session's `lock_timeout`.
    pub lock_timeout: Duration,
    /// `INBOX_STATEMENT_TIMEOUT_MS`: every session's `statement_timeout`.
    pub statement_timeout: Duration,
    /// `INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS`: every session's `idle_in_transaction_session_timeout`.
    pub idle_in_transaction_timeout: Duration,
    /// Behind a proxy that refuses startup parameters (PgBouncer) or pins the
    /// session on them (RDS Proxy): none is sent, and the timeouts come from the
    /// database role (`ALTER ROLE ... SET`) instead.
    pub behind_proxy: bool,
}

impl std::fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("pool_size", &self.pool_size)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("lock_timeout", &self.lock_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("idle_in_transaction_timeout", &self.idle_in_transaction_timeout)
            .field("behind_proxy", &self.behind_proxy)
            .finish()
    }
}

/// Where a database URL points, without any credential (user:password@ or ?password=).
pub fn redact_url(url: &str) -> String {
    match url.parse::<sqlx::postgres::PgConnectOptions>() {
        Ok(o) => format!("postgres://{}:{}/{}", o.get_host(), o.get_port(), o.get_database().unwrap_or("")),
        Err(_) => "(an unparsable URL)".into(),
    }
}

impl DbConfig {
    /// A pool on these settings for everything but the claim (migrations,
    /// workers, operators' queries), connected lazily: the first query connects.
    pub fn pool(&self) -> Result<PgPool, sqlx::Error> {
        Ok(pool_from(parse_url(self)?, self))
    }

    /// [`DbConfig::pool`] on the database `options` name (a `#[sqlx::test]`'s,
    /// say) rather than `url`, with these settings otherwise.
    pub fn pool_with(&self, options: PgConnectOptions) -> PgPool {
        pool_from(options, self)
    }

    /// `url` with the defaults: 4 connections, timeouts of 2 s (acquire,
    /// lock), 5 s (statement) and 10 s (idle in transaction), no pooler.
    pub fn with_url(url: impl Into<String>) -> Self {
        DbConfig {
            url: Some(url.into()),
            pool_size: 4,
            acquire_timeout: Duration::from_secs(2),
            lock_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(10),
            behind_proxy: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print() {
        assert_eq!(redact_url("postgres://u:s3cret@h:5433/db"), "postgres://h:5433/db");
        assert_eq!(redact_url("postgres://h/db?password=s3cret"), "postgres://h:5432/db");
        assert!(!redact_url("not a url s3cret").contains("s3cret"));
        let config = DbConfig::with_url("postgres://inbox:s3cret@db.internal:5432/inbox?password=s3cret2");
        let debug = format!("{config:?} {config:#?}");
        assert!(!debug.contains("s3cret") && debug.contains("db.internal:5432/inbox"), "{debug}");
    }
}
