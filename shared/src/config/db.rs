//! The database's settings.

use super::{invalid, Env};
use crate::{config::ConfigError, db::DbConfig};

impl DbConfig {
    /// `DATABASE_URL`, `INBOX_DB_POOL_SIZE` (default `default_pool`), the
    /// `INBOX_*_TIMEOUT_MS` variables (acquire 2000, lock 2000, statement 5000,
    /// idle in transaction 10000), and `INBOX_DB_POOLER` (`none`, or `proxy`
    /// behind PgBouncer or RDS Proxy: no startup parameters).
    pub fn read(env: &Env, default_pool: u32) -> Result<Self, ConfigError> {
        let url = env.var("DATABASE_URL");
        if let Some(url) = &url {
            // Checked here, so that a mistake names the variable (and never shows the password).
            match url::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "postgres" | "postgresql") => {}
                Ok(u) => {
                    return Err(invalid(
                        "DATABASE_URL",
                        format!("is a {}: URL, not PostgreSQL's (postgres://user@host:5432/database)", u.scheme()),
                    ))
                }
                Err(e) => {
                    return Err(invalid(
                        "DATABASE_URL",
                        format!("is not a URL ({e}); expected postgres://user@host:5432/database"),
                    ))
                }
            }
        }
        Ok(DbConfig {
            url,
            pool_size: env.parse("INBOX_DB_POOL_SIZE", default_pool)?,
            acquire_timeout: env.millis("INBOX_DB_ACQUIRE_TIMEOUT_MS", 2000)?,
            lock_timeout: env.millis("INBOX_LOCK_TIMEOUT_MS", 2000)?,
            statement_timeout: env.millis("INBOX_STATEMENT_TIMEOUT_MS", 5000)?,
            idle_in_transaction_timeout: env.millis("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000)?,
            behind_proxy: match env.var("INBOX_DB_POOLER").as_deref() {
                None | Some("none") => false,
                // Set once, here: every statement of this process is then unnamed (see `db::query`).
                Some("proxy") => {
                    crate::db::set_behind_pooler();
                    true
                }
                Some(other) => {
                    return Err(invalid("INBOX_DB_POOLER", format!("{other:?} is neither \"none\" nor \"proxy\"")))
                }
            },
        })
    }
}
