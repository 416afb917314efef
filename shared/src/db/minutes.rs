//! `inbox_receive_minutes`: deliveries per provider and minute (new,
//! duplicate, refused), added by receive from its in-memory tally; read by the
//! console's health page.

use sqlx::PgExecutor;
use sqlx::PgPool;

/// One provider's counts in one minute (the minute in Unix seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinuteCounts {
    /// Deliveries claimed (accepted).
    pub received: i64,
    /// Deliveries of events already claimed.
    pub duplicates: i64,
    /// Deliveries refused (a bad signature, a malformed body, ...).
    pub rejected: i64,
}

/// Adds the counts (provider, minute in Unix seconds, counts) to their rows,
/// in one statement, and drops the rows older than 7 days.
pub(crate) async fn add<'e>(ex: impl PgExecutor<'e>, rows: &[(&str, i64, MinuteCounts)]) -> Result<(), sqlx::Error> {
    let column = |f: fn(&MinuteCounts) -> i64| rows.iter().map(|(_, _, c)| f(c)).collect::<Vec<_>>();
    super::query(
        "WITH old AS (DELETE FROM inbox_receive_minutes WHERE minute < now() - interval '7 days')
         INSERT INTO inbox_receive_minutes AS m (provider, minute, received, duplicates, rejected)
         SELECT provider, to_timestamp(minute), received, duplicates, rejected
         FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[])
              AS t (provider, minute, received, duplicates, rejected)
         ORDER BY 1, 2
         ON CONFLICT (provider, minute) DO UPDATE
         SET received = m.received + excluded.received, duplicates = m.duplicates + excluded.duplicates,
             rejected = m.rejected + excluded.rejected",
    )
    .bind(rows.iter().map(|(p, _, _)| *p).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, m, _)| *m).collect::<Vec<_>>())
    .bind(column(|c| c.received))
    .bind(column(|c| c.duplicates))
    .bind(column(|c| c.rejected))
    .execute(ex)
    .await?;
    Ok(())
}

/// Every provider's counts per minute since `hours` ago, oldest first.
pub async fn since(pool: &PgPool, hours: i64) -> Result<Vec<(String, i64, MinuteCounts)>, sqlx::Error> {
    let rows: Vec<(String, i64, i64, i64, i64)> = super::query_as(
        "SELECT provider, extract(epoch FROM minute)::int8, received, duplicates, rejected
         FROM inbox_receive_minutes WHERE minute >= date_trunc('minute', now()) - $1 * interval '1 hour'
         ORDER BY minute",
    )
    .bind(hours)
    .fetch_all(super::Autocommit(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|(p, m, received, duplicates, rejected)| (p, m, MinuteCounts { received, duplicates, rejected }))
        .collect())
}

/// Events that ended failed per provider and minute since `hours` ago (from
/// the inbox's partial index of failed rows), oldest first.
pub async fn failed_since(pool: &PgPool, hours: i64) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
    super::query_as(
        "SELECT provider, extract(epoch FROM date_trunc('minute', coalesce(processed_at, received_at)))::int8 AS minute,
                count(*)
         FROM webhook_inbox
         WHERE status = 'failed'
           AND coalesce(processed_at, received_at) >= date_trunc('minute', now()) - $1 * interval '1 hour'
         GROUP BY 1, 2 ORDER BY 2",
    )
    .bind(hours)
    .fetch_all(super::Autocommit(pool))
    .await
}
