//! The schema: the inbox's migrations, with a history of their own, and an
//! application's (a team's sqlx migrations), in sqlx's.
//!
//! The inbox records what it applied in `webhook_inbox_migrations` (and the
//! reference domain in `webhook_inbox_reference_migrations`), never in
//! `_sqlx_migrations`: a team's own sqlx migrator owns that table and refuses a
//! version it does not know ("previously applied but is missing"), so the two
//! could not share it in either order. Release 0.1.0 did record the inbox's
//! migrations there; the first run of a later release moves those rows over
//! (see [`migrate`]), without running anything again.
//!
//! Both run the way a transaction pooler allows (`super::pooler`): each set in
//! one transaction (all or nothing), serialised by a transaction-scoped
//! advisory lock on the key `sqlx migrate run` takes, so that the inbox's
//! migrations, a team's and the sqlx CLI never interleave.

use std::{collections::HashMap, time::Instant};

use sqlx::{migrate::Migrator, Connection, Executor, PgConnection, PgPool};

use super::{query, query_as, query_scalar};

/// The inbox's own migrations (the repository's top-level `migrations/`, the
/// crate `webhook-inbox-migrations`), embedded in every binary.
pub(crate) use webhook_inbox_migrations::INBOX as MIGRATIONS;

/// Where the inbox records its applied migrations.
pub(crate) const HISTORY_TABLE: &str = "webhook_inbox_migrations";

/// Contents an inbox migration had in an earlier release, still accepted when
/// its history is moved out of `_sqlx_migrations`: (version, SHA-384).
/// 20261129000002 made the stock application's tables in release 0.1.0; they
/// are the stock application's own migration now.
const EARLIER_CHECKSUMS: [(i64, &str); 1] = [(
    20261129000002,
    "a191811eb9a52b60555955eaf6af3ec1f69bf5dadc922d87c417aa1f91ad3701d7f3eccbc149ffb866fa9db7cce15d6f",
)];

/// Why the schema could not be brought up to date. Nothing is applied then:
/// each set of migrations is one transaction.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database refused a statement, or could not be reached.
    #[error("{0}")]
    Database(#[from] sqlx::Error),
    /// An inbox migration was applied with other contents than this release's.
    #[error(
        "migration {0} of webhook-inbox was applied with other contents than this release's (its checksum differs)"
    )]
    Modified(i64),
    /// The database holds a migration of this crate that this release does not know.
    #[error("migration {0} of webhook-inbox is applied but unknown to this release: the database was migrated by a newer webhook-inbox")]
    Unknown(i64),
    /// `_sqlx_migrations` says an inbox migration failed half-way.
    #[error("inbox migration {0} is marked failed (success = false) in _sqlx_migrations: repair it by hand first")]
    Dirty(i64),
    /// The application's own migrations (sqlx's migrator) failed.
    #[error("the application's migrations: {0}")]
    App(#[from] sqlx::migrate::MigrateError),
    /// The history table given for an application's migrations
    /// ([`App::with_migrations_in`](crate::App::with_migrations_in)) is not
    /// one it may have.
    #[error("{0:?} cannot be a migration history table: {1}")]
    HistoryTable(&'static str, &'static str),
}

/// Why `table` cannot hold an application's migration history, if it cannot:
/// a plain lowercase identifier (it is written into the statements), and
/// neither the inbox's history nor sqlx's.
pub(crate) fn history_table_refused(table: &str) -> Option<&'static str> {
    let plain = (1..=63).contains(&table.len())
        && table.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && table.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !plain {
        Some("it is not a plain lowercase identifier (a-z, 0-9, _; at most 63 characters)")
    } else if table == HISTORY_TABLE {
        Some("it is the inbox's own")
    } else if table == "_sqlx_migrations" {
        Some("it is sqlx's (use App::with_migrations for that)")
    } else {
        None
    }
}

/// Applies the inbox's pending migrations, all in one transaction, and
/// returns the latest version.
///
/// On a database migrated by release 0.1.0 (the inbox's history in
/// `_sqlx_migrations`), the first run moves the inbox's rows from there to
/// [`HISTORY_TABLE`], in the same transaction, checked against this
/// release's contents. Whatever else `_sqlx_migrations` holds (a team's
/// history) is left as it is.
pub(crate) async fn migrate(pool: &PgPool) -> Result<i64, MigrateError> {
    migrate_own(pool, &MIGRATIONS, HISTORY_TABLE).await?;
    Ok(latest())
}

/// Applies a set of migrations (the inbox's, or an application's that keeps
/// its history apart), in one transaction, recorded in `table`, never in
/// `_sqlx_migrations`: so no set of ours is in a team's way.
pub(crate) async fn migrate_own(pool: &PgPool, set: &Migrator, table: &'static str) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?.detach();
    let mut tx = Connection::begin(&mut conn).await?;
    lock(&mut tx).await?;
    query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version        BIGINT      PRIMARY KEY,
             description    TEXT        NOT NULL,
             checksum       BYTEA       NOT NULL,
             installed_on   TIMESTAMPTZ NOT NULL DEFAULT now(),
             execution_time BIGINT      NOT NULL
         )"
    ))
    .execute(&mut *tx)
    .await?;
    if table == HISTORY_TABLE {
        adopt_sqlx_history(&mut tx).await?;
    }

    let applied: HashMap<i64, Vec<u8>> = query_as::<(i64, Vec<u8>)>(&format!("SELECT version, checksum FROM {table}"))
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
    if let Some(unknown) = applied.keys().find(|v| !set.iter().any(|m| m.version == **v)) {
        return Err(MigrateError::Unknown(*unknown));
    }
    for m in set.iter() {
        match applied.get(&m.version) {
            Some(checksum) if *checksum == *m.checksum => continue,
            Some(_) => return Err(MigrateError::Modified(m.version)),
            None => {}
        }
        let started = Instant::now();
        // Several statements in one simple-protocol exchange, as sqlx runs a migration.
        Executor::execute(&mut *tx, m.sql.as_ref()).await?;
        query(&format!("INSERT INTO {table} (version, description, checksum, execution_time) VALUES ($1, $2, $3, $4)"))
            .bind(m.version)
            .bind(m.description.as_ref())
            .bind(m.checksum.as_ref())
            .bind(started.elapsed().as_nanos() as i64)
            .execute(&mut *tx)
            .await?;
        tracing::info!(version = m.version, description = %m.description, history = table, "migration applied");
    }
    tx.commit().await?;
    conn.close().await?;
    Ok(())
}

/// The migrations of `set` that `table` does not record as applied (sqlx's
/// `_sqlx_migrations` counts only those that succeeded), as `version description`.
pub(crate) async fn pending(pool: &PgPool, set: &Migrator, table: &'static str) -> Result<Vec<String>, sqlx::Error> {
    let exists: bool =
        query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(super::Autocommit(pool)).await?;
    let applied: Vec<i64> = if !exists {
        vec![]
    } else if table == "_sqlx_migrations" {
        query_scalar("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(super::Autocommit(pool)).await?
    } else {
        query_scalar(&format!("SELECT version FROM {table}")).fetch_all(super::Autocommit(pool)).await?
    };
    Ok(set
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect())
}

/// The latest version of the inbox's migrations in this release.
pub(crate) fn latest() -> i64 {
    MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Applies an application's pending sqlx migrations (a team's), in sqlx's
/// own `_sqlx_migrations`, in one transaction under the same lock as [`migrate`].
///
/// A migration that cannot run in a transaction (`-- no-transaction`,
/// `CREATE INDEX CONCURRENTLY`) fails here and says so.
pub(crate) async fn migrate_app(pool: &PgPool, app: &Migrator) -> Result<(), MigrateError> {
    let migrator = Migrator {
        migrations: app.migrations.clone(),
        ignore_missing: app.ignore_missing,
        locking: false,
        no_tx: app.no_tx,
    };
    let mut conn = pool.acquire().await?.detach();
    let mut tx = Connection::begin(&mut conn).await?;
    lock(&mut tx).await?;
    migrator.run_direct(&mut *tx).await?;
    // The migrator names its statements; behind a pooler the server session outlives this connection.
    Executor::execute(&mut *tx, "DEALLOCATE ALL").await?;
    tx.commit().await?;
    conn.close().await?;
    Ok(())
}

/// Waits for sqlx's migration lock, until the transaction ends.
async fn lock(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    let database: String = query_scalar("SELECT current_database()").fetch_one(&mut *tx).await?;
    query("SELECT pg_advisory_xact_lock($1)").bind(lock_id(&database)).execute(&mut *tx).await?;
    Ok(())
}

/// Moves the inbox's rows of a release 0.1.0 history out of `_sqlx_migrations`.
async fn adopt_sqlx_history(tx: &mut PgConnection) -> Result<(), MigrateError> {
    let exists: bool = query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&mut *tx).await?;
    if !exists {
        return Ok(());
    }
    let ours: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    let rows: Vec<(i64, Vec<u8>, bool, i64)> = query_as(
        "SELECT version, checksum, success, execution_time FROM _sqlx_migrations WHERE version = ANY($1)
         ORDER BY version",
    )
    .bind(&ours)
    .fetch_all(&mut *tx)
    .await?;
    for (version, checksum, success, execution_time) in &rows {
        if !success {
            return Err(MigrateError::Dirty(*version));
        }
        let m = MIGRATIONS.iter().find(|m| m.version == *version).expect("selected among ours");
        let earlier = EARLIER_CHECKSUMS.iter().any(|(v, sum)| v == version && hex::encode(checksum) == *sum);
        if *checksum != *m.checksum && !earlier {
            return Err(MigrateError::Modified(*version));
        }
        // This release's checksum: the history says what this release would have applied. When it
        // was applied, and how long it took, are the row's own.
        query(
            "INSERT INTO webhook_inbox_migrations (version, description, checksum, installed_on, execution_time)
             SELECT $1, $2, $3, installed_on, $4 FROM _sqlx_migrations WHERE version = $1
             ON CONFLICT (version) DO NOTHING",
        )
        .bind(version)
        .bind(m.description.as_ref())
        .bind(m.checksum.as_ref())
        .bind(execution_time)
        .execute(&mut *tx)
        .await?;
    }
    if !rows.is_empty() {
        query("DELETE FROM _sqlx_migrations WHERE version = ANY($1)").bind(&ours).execute(&mut *tx).await?;
        tracing::info!(moved = rows.len(), "the inbox's migration history moved from _sqlx_migrations");
    }
    Ok(())
}

/// sqlx's migration lock key for a database.
fn lock_id(database: &str) -> i64 {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32ad9e * i64::from(CRC.checksum(database.as_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lock_id_is_sqlx_s() {
        // zlib.crc32(b"postgres") is 0x156a8775 (Python's zlib, the same CRC-32), times sqlx's constant.
        assert_eq!(super::lock_id("postgres"), 0x3d32ad9e * 0x156a_8775_i64);
    }

    #[test]
    fn every_earlier_checksum_names_a_migration_of_this_release_with_other_contents() {
        for (version, sum) in super::EARLIER_CHECKSUMS {
            let m = super::MIGRATIONS.iter().find(|m| m.version == version).expect("a migration of this release");
            assert_ne!(hex::encode(&*m.checksum), sum, "{version}");
        }
    }
}
