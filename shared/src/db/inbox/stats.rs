//! Counts: the gauges of the alarms and `inbox stats`, the statuses, the secrets in use.

use std::time::Duration;

use sqlx::{PgExecutor, PgPool};

use crate::{core::status::Status, db};

/// What the scheduled `process` run reports, and `inbox stats` shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct InboxGauges {
    /// Events pending: waiting for the worker, or held by a pause.
    pub pending: i64,
    /// Of them, held by a pause (`inbox pause`).
    pub held: i64,
    /// Age of the oldest pending event the worker may take, 0 when there is
    /// none: events held by a pause are not counted (a pause that lasts too
    /// long is `overdue_pauses`).
    pub oldest_pending_ms: f64,
    /// Pauses older than their alarm allows (`inbox pause --alarm-after`).
    pub overdue_pauses: i64,
    /// Events that failed in the last hour (stored as failed, or given up on).
    pub failed_last_hour: i64,
}

/// [`InboxGauges`], each from a partial index.
pub(crate) async fn gauges<'e>(ex: impl PgExecutor<'e>) -> Result<InboxGauges, sqlx::Error> {
    db::query_as(
        "WITH held AS (SELECT count(*) AS n FROM webhook_inbox WHERE status = 'pending' AND held_by IS NOT NULL)
         SELECT (SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND held_by IS NULL) + (SELECT n FROM held)
                    AS pending,
                (SELECT n FROM held) AS held,
                coalesce((SELECT extract(epoch FROM now() - min(received_at)) * 1000
                          FROM webhook_inbox WHERE status = 'pending' AND held_by IS NULL), 0)::float8
                    AS oldest_pending_ms,
                (SELECT count(*) FROM inbox_pauses WHERE paused_at < now() - alarm_after) AS overdue_pauses,
                (SELECT count(*) FROM webhook_inbox
                 WHERE status = 'failed' AND coalesce(processed_at, received_at) > now() - interval '1 hour')
                    AS failed_last_hour",
    )
    .fetch_one(ex)
    .await
}

/// Rows by provider and status.
pub async fn counts_by_provider(pool: &PgPool) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    db::query_as("SELECT provider, status, count(*) FROM webhook_inbox GROUP BY 1, 2 ORDER BY 1, 2")
        .fetch_all(db::Autocommit(pool))
        .await
}

/// How many events are in a status, as [`status_counts`] can tell it cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "count", rename_all = "snake_case")]
pub enum Count {
    /// Exactly this many.
    Exact(i64),
    /// At least this many: counting stopped there.
    AtLeast(i64),
    /// About this many: the planner's estimate of the table's rows, less the
    /// other statuses (as fresh as the table's last `ANALYZE`).
    About(i64),
}

/// The events in each status, without reading the inbox: each is counted up
/// to `cap` (past it, [`Count::AtLeast`]): `pending` (held or not), `failed`, `unhandled`
/// and `ignored` in their partial indexes, `done` by the first rows found; past
/// the cap, `done`, the bulk of a full inbox, is the planner's estimate of the
/// rows less the others ([`Count::About`]). Milliseconds on an inbox of
/// millions, where `count(*)` takes seconds.
pub async fn status_counts(pool: &PgPool, cap: i64) -> Result<Vec<(Status, Count)>, sqlx::Error> {
    let (pending, failed, unhandled, ignored, done, rows): (i64, i64, i64, i64, i64, f64) = db::query_as(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'pending' AND held_by IS NULL
                                       LIMIT $1) AS p)
                + (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'pending' AND held_by IS NOT NULL
                                         LIMIT $1) AS h),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'failed' LIMIT $1) AS f),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'unhandled' LIMIT $1) AS u),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'ignored' LIMIT $1) AS i),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'done' LIMIT $1) AS d),
                -- A partitioned inbox's rows are its partitions' (autovacuum never
                -- analyzes the parent itself, so its own figure goes stale).
                (SELECT CASE WHEN t.relkind = 'p'
                             THEN (SELECT coalesce(sum(greatest(p.reltuples, 0)), 0) FROM pg_inherits AS i
                                   JOIN pg_class AS p ON p.oid = i.inhrelid WHERE i.inhparent = t.oid)
                             ELSE greatest(t.reltuples, 0) END::float8
                 FROM pg_class AS t WHERE t.oid = 'webhook_inbox'::regclass)",
    )
    .bind(cap + 1)
    .fetch_one(db::Autocommit(pool))
    .await?;
    let counted = |n: i64| if n > cap { Count::AtLeast(cap) } else { Count::Exact(n) };
    let done = if done > cap {
        // More than the cap: at least that, whatever a stale estimate says.
        let others = pending.min(cap) + failed.min(cap) + unhandled.min(cap) + ignored.min(cap);
        Count::About((rows as i64 - others).max(cap + 1))
    } else {
        Count::Exact(done)
    };
    Ok(vec![
        (Status::Pending, counted(pending)),
        (Status::Failed, counted(failed)),
        (Status::Unhandled, counted(unhandled)),
        (Status::Ignored, counted(ignored)),
        (Status::Done, done),
    ])
}

/// Which configured secret verified the deliveries received since `since`
/// (by fingerprint, per provider): a rotated-out secret with no recent use can go.
pub async fn secret_usage(pool: &PgPool, since: Duration) -> Result<Vec<SecretUse>, sqlx::Error> {
    db::query_as(
        "SELECT provider, secret_fingerprint,
                CASE WHEN secret_fingerprint IS NULL THEN secret_index END AS secret_index,
                count(*) AS deliveries, to_json(max(received_at))#>>'{}' AS last_received_at
         FROM webhook_inbox
         WHERE received_at > now() - $1 * interval '1 millisecond' AND source = 'webhook'
         GROUP BY 1, 2, 3 ORDER BY 1, 5 DESC",
    )
    .bind(since.as_millis() as i64)
    .fetch_all(db::Autocommit(pool))
    .await
}

/// One secret's recent use. Timestamps are PostgreSQL's own text (the crate has no date-time type).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct SecretUse {
    /// The provider's name.
    pub provider: String,
    /// The secret's fingerprint ([`webhook_inbox_schemes::secret::Secret::fingerprint`]).
    pub secret_fingerprint: Option<String>,
    /// For rows stored before fingerprints were: the secret's position in the
    /// list configured then (which a rotation may since have reordered).
    pub secret_index: Option<i16>,
    /// Deliveries it verified in the period.
    pub deliveries: i64,
    /// When the last of them arrived.
    pub last_received_at: String,
}
