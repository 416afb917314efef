//! The queue: what the worker takes and how each event ends, and the inline
//! handlers' marks inside receive's claim transaction.

use std::time::Duration;

use sqlx::{types::Json, PgConnection, PgPool};

use crate::{core::status::Status, db};
use webhook_inbox_schemes::Provider;

/// An event's place in the queue's order, `(received_at, event_id)`: where
/// the worker's next take starts ([`crate::runtime::scan`]). Compared in
/// Rust only to keep the position at the furthest row taken.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    /// `received_at`, in microseconds since the Unix epoch.
    pub received_at_us: i64,
    pub event_id: String,
}

/// A pending row as the worker takes it.
#[derive(sqlx::FromRow)]
pub(crate) struct Taken {
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    /// `jsonb` as text, decoded per row (only when a handler needs it): an
    /// undecodable payload fails its own row, never the batch's query. A batch
    /// fetches it only for the events a handler takes.
    pub payload: Option<String>,
    /// The kept headers, fetched with the payload.
    pub headers: Option<Json<serde_json::Value>>,
    /// Attempts before this one.
    pub attempts: i32,
    /// `received_at`, in microseconds since the Unix epoch.
    pub received_at_us: i64,
    /// The delivery's receive span (`trace_context`), when traces were on.
    pub trace_context: Option<String>,
    /// The pause that holds it (marked by the take, which returns it only to
    /// be counted): not processed.
    #[sqlx(default)]
    pub held_by: Option<i64>,
    /// The pauses' release epoch the take saw ([`crate::db::pauses`]).
    #[sqlx(default)]
    pub epoch: i64,
}

/// The pause (if any) that holds the pending row `w`: one whose scope covers
/// it and whose resume has not released it yet.
macro_rules! pause_of {
    () => {
        "LEFT JOIN LATERAL (
             SELECT p.id FROM inbox_pauses p
             WHERE p.provider = w.provider AND (p.event_type IS NULL OR p.event_type = w.event_type)
               AND (p.released_to_at IS NULL OR (w.received_at, w.event_id) > (p.released_to_at, p.released_to_id))
             ORDER BY p.id LIMIT 1) AS p ON true"
    };
}

/// Marks the candidates (`cand`) a pause covers `held_by` it, and returns
/// every candidate, in receive order.
macro_rules! hold_and_return {
    () => {
        "held AS (
             UPDATE webhook_inbox w SET held_by = c.held_by FROM cand c
             WHERE c.held_by IS NOT NULL AND w.provider = c.provider AND w.event_id = c.event_id)
         SELECT provider, event_id, event_type, payload, headers, attempts,
                (extract(epoch FROM received_at) * 1000000)::bigint AS received_at_us, trace_context, held_by,
                (SELECT epoch FROM inbox_pause_epoch) AS epoch
         FROM cand ORDER BY received_at, event_id"
    };
}

/// Up to `limit` due pending rows no pause holds, in receive order, after
/// `after` (from the queue's head when `None`: see [`crate::runtime::scan`]),
/// skipping those another worker holds; the payload and headers only where
/// `handled` (`provider:event_type`) names a handler (an event no handler
/// takes is unhandled without them), the payload also where it is `LIKE` one
/// of `ruled` (an ignore rule reads it). Rows a pause covers are marked
/// `held_by` it and returned with it, to be counted, not processed. The
/// caller holds the pauses' gate ([`crate::db::pauses::enter`]).
pub(crate) async fn take_pending(
    conn: &mut PgConnection,
    limit: i64,
    (handled, ruled): (&[String], &[String]),
    after: Option<&Position>,
) -> Result<Vec<Taken>, sqlx::Error> {
    macro_rules! take {
        ($bound:literal) => {
            concat!(
                "WITH cand AS (
                     SELECT w.provider, w.event_id, w.event_type, w.attempts, w.trace_context, w.received_at,
                         p.id AS held_by,
                         CASE WHEN p.id IS NULL AND (w.provider || ':' || w.event_type = ANY($2)
                                                     OR w.provider || ':' || w.event_type LIKE ANY($3))
                              THEN w.payload::text END AS payload,
                         CASE WHEN p.id IS NULL AND w.provider || ':' || w.event_type = ANY($2)
                              THEN w.headers END AS headers
                     FROM webhook_inbox w ",
                pause_of!(),
                " WHERE w.status = 'pending' AND w.held_by IS NULL
                       AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= now())",
                $bound,
                " ORDER BY w.received_at, w.event_id LIMIT $1 FOR UPDATE OF w SKIP LOCKED), ",
                hold_and_return!()
            )
        };
    }
    // Two statements, not one with an optional bound: a plan cached for one
    // would not start the index scan at the position for the other.
    match after {
        None => db::query_as(take!("")).bind(limit).bind(handled).bind(ruled).fetch_all(conn).await,
        Some(p) => {
            db::query_as(take!(
                " AND (w.received_at, w.event_id) > (to_timestamp(0) + $4 * interval '1 microsecond', $5)"
            ))
            .bind(limit)
            .bind(handled)
            .bind(ruled)
            .bind(p.received_at_us)
            .bind(&p.event_id)
            .fetch_all(conn)
            .await
        }
    }
}

/// The SQS path: the named event, if it is due and nobody holds it; marked
/// and returned `held_by` a pause that covers it. The caller holds the gate.
pub(crate) async fn take_one(
    conn: &mut PgConnection,
    provider: &str,
    event_id: &str,
) -> Result<Vec<Taken>, sqlx::Error> {
    db::query_as(concat!(
        "WITH cand AS (
             SELECT w.provider, w.event_id, w.event_type, w.attempts, w.trace_context, w.received_at,
                 p.id AS held_by, w.payload::text AS payload, w.headers
             FROM webhook_inbox w ",
        pause_of!(),
        " WHERE w.provider = $1 AND w.event_id = $2 AND w.status = 'pending' AND w.held_by IS NULL
               AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= now())
             FOR UPDATE OF w SKIP LOCKED), ",
        hold_and_return!()
    ))
    .bind(provider)
    .bind(event_id)
    .fetch_all(conn)
    .await
}

/// Whether a pause covers the pending row `webhook_inbox` (careful mode's
/// takes: a paused event waits for the next batch to mark it held).
macro_rules! not_paused {
    () => {
        " AND held_by IS NULL AND NOT EXISTS (
             SELECT 1 FROM inbox_pauses p
             WHERE p.provider = webhook_inbox.provider
               AND (p.event_type IS NULL OR p.event_type = webhook_inbox.event_type))"
    };
}

/// Careful mode: counts the next due event's attempt and holds it back by
/// `base` doubled per attempt (it may crash again), committed before it runs.
/// `attempts` comes back as the attempts made before this one.
pub(crate) async fn count_next(pool: &PgPool, base: Duration) -> Result<Option<Taken>, sqlx::Error> {
    db::query_as(concat!(
        "WITH next AS (
             SELECT provider, event_id FROM webhook_inbox
             WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= now())",
        not_paused!(),
        "
             ORDER BY received_at, event_id
             LIMIT 1
             FOR UPDATE SKIP LOCKED)
         UPDATE webhook_inbox AS w
         SET attempts = w.attempts + 1,
             next_attempt_at = now() + least($1 * power(2, w.attempts), 3600000) * interval '1 millisecond'
         FROM next
         WHERE w.provider = next.provider AND w.event_id = next.event_id
         RETURNING w.provider, w.event_id, w.event_type, w.payload::text AS payload, w.headers, w.attempts - 1 AS attempts,
             (extract(epoch FROM w.received_at) * 1000000)::bigint AS received_at_us, w.trace_context",
    ))
    .bind(base.as_millis() as i64)
    .fetch_optional(db::Autocommit(pool))
    .await
}

/// Careful mode and a hint's fetched object: the counted event, whatever its
/// backoff says, unless a pause covers it now. The caller holds the gate.
pub(crate) async fn take_counted(
    conn: &mut PgConnection,
    provider: &str,
    event_id: &str,
) -> Result<Vec<Taken>, sqlx::Error> {
    db::query_as(concat!(
        "SELECT provider, event_id, event_type, payload::text AS payload, headers, attempts - 1 AS attempts,
             (extract(epoch FROM received_at) * 1000000)::bigint AS received_at_us, trace_context
         FROM webhook_inbox
         WHERE provider = $1 AND event_id = $2 AND status = 'pending'",
        not_paused!(),
        " FOR UPDATE SKIP LOCKED",
    ))
    .bind(provider)
    .bind(event_id)
    .fetch_all(conn)
    .await
}

/// How one taken event ends this pass.
pub(crate) struct Finished {
    pub provider: String,
    pub event_id: String,
    pub status: Status,
    /// For `Pending`: how long until the next attempt.
    pub delay: Option<Duration>,
    pub reason: Option<String>,
    /// What this pass adds to the event's attempts: 1 for an attempt, 0
    /// for none, -1 to undo the attempt careful mode counted before an
    /// event that no handler takes (nothing ran).
    pub attempts: i32,
}

/// Every outcome of a batch in one statement.
pub(crate) async fn finish(conn: &mut PgConnection, rows: &[Finished]) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&Finished) -> Option<&str>| rows.iter().map(f).collect::<Vec<_>>();
    let delays: Vec<Option<i64>> = rows.iter().map(|r| r.delay.map(|d| d.as_millis() as i64)).collect();
    let attempts: Vec<i32> = rows.iter().map(|r| r.attempts).collect();
    db::query(
        "UPDATE webhook_inbox AS w
         SET status = u.status,
             attempts = w.attempts + u.attempts,
             processed_at = CASE WHEN u.status IN ('done', 'failed', 'unhandled', 'ignored') THEN statement_timestamp() END,
             next_attempt_at = now() + u.delay_ms * interval '1 millisecond',
             failure_reason = u.reason
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::int4[])
              AS u (provider, event_id, status, delay_ms, reason, attempts)
         WHERE w.provider = u.provider AND w.event_id = u.event_id",
    )
    .bind(col(|r| Some(&r.provider)))
    .bind(col(|r| Some(&r.event_id)))
    .bind(col(|r| Some(r.status.as_str())))
    .bind(&delays)
    .bind(col(|r| r.reason.as_deref()))
    .bind(&attempts)
    .execute(conn)
    .await?;
    Ok(())
}

/// Careful mode: an event that cut the connection on every attempt is failed;
/// the attempt counted to take it this time is undone (it was not made).
pub(crate) async fn give_up(pool: &PgPool, provider: &str, event_id: &str, reason: &str) -> Result<(), sqlx::Error> {
    db::query(
        "UPDATE webhook_inbox SET status = 'failed', failure_reason = $3, next_attempt_at = NULL, attempts = attempts - 1,
             processed_at = now()
         WHERE provider = $1 AND event_id = $2 AND status = 'pending'",
    )
    .bind(provider)
    .bind(event_id)
    .bind(reason)
    .execute(db::Autocommit(pool))
    .await?;
    Ok(())
}

// ---- inline mode (inside receive's claim transaction) ----

/// The inline handler applied the event: done, its one attempt counted.
pub(crate) async fn mark_done_inline(
    conn: &mut PgConnection,
    provider: Provider,
    event_id: &str,
) -> Result<(), sqlx::Error> {
    db::query(
        "UPDATE webhook_inbox SET status = 'done', processed_at = now(), attempts = attempts + 1
         WHERE provider = $1 AND event_id = $2",
    )
    .bind(provider.as_str())
    .bind(event_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The inline handler failed: left pending for the worker, the attempt counted, the reason kept.
pub(crate) async fn note_inline_failure(
    conn: &mut PgConnection,
    provider: Provider,
    event_id: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    db::query(
        "UPDATE webhook_inbox SET attempts = attempts + 1, failure_reason = $3 WHERE provider = $1 AND event_id = $2",
    )
    .bind(provider.as_str())
    .bind(event_id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// The payload cannot be decoded: failed at once, with the reason.
pub(crate) async fn mark_unusable(
    conn: &mut PgConnection,
    provider: Provider,
    event_id: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    db::query(
        "UPDATE webhook_inbox SET status = 'failed', failure_reason = $3, processed_at = now()
         WHERE provider = $1 AND event_id = $2",
    )
    .bind(provider.as_str())
    .bind(event_id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}
