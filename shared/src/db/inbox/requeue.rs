//! The operator's selections: failed events listed, counted, requeued in
//! batches, one event replayed; each change audited in the same statement.

use std::ops::ControlFlow;

use sqlx::PgPool;

use crate::{
    core::selection::{Filter, Since},
    db,
};

/// A failed event, as `inbox failed` lists it. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct FailedEvent {
    /// The provider's name.
    pub provider: String,
    /// The event's id (the provider's, or the one receive derived).
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// Attempts made.
    pub attempts: i32,
    /// When receive claimed it.
    pub received_at: String,
    /// When it failed (its last attempt, or its receipt for a body never usable).
    pub failed_at: String,
    /// Why.
    pub failure_reason: Option<String>,
}

/// [`Filter`] as SQL, on `$1` to `$8` (bound by `bind_filter!`). When an
/// event ended: `processed_at`, or `received_at` for a row receive stored as failed.
const FILTER_WHERE: &str = "status = ANY($1)
    AND ($2::text IS NULL OR provider = $2)
    AND ($3::text IS NULL OR event_type = $3)
    AND ($4::bigint IS NULL OR coalesce(processed_at, received_at) >= now() - $4 * interval '1 millisecond')
    AND ($5::timestamptz IS NULL OR coalesce(processed_at, received_at) >= $5::timestamptz)
    AND ($6::bigint IS NULL OR coalesce(processed_at, received_at) < now() - $6 * interval '1 millisecond')
    AND ($7::timestamptz IS NULL OR coalesce(processed_at, received_at) < $7::timestamptz)
    AND ($8::text IS NULL OR failure_reason ILIKE $8)";

macro_rules! bind_filter {
    ($query:expr, $filter:expr) => {{
        let f: &Filter = $filter;
        let (since, until) = (f.since.as_ref(), f.until.as_ref());
        $query
            .bind(f.statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>())
            .bind(f.provider.as_deref())
            .bind(f.event_type.as_deref())
            .bind(since.and_then(Since::ago_ms))
            .bind(since.and_then(Since::at))
            .bind(until.and_then(Since::ago_ms))
            .bind(until.and_then(Since::at))
            .bind(f.reason_like.as_deref())
    }};
}

/// Events matching `filter` (its statuses: failed), the most recent first.
pub async fn list_failed(pool: &PgPool, filter: &Filter, limit: i64) -> Result<Vec<FailedEvent>, sqlx::Error> {
    let sql = format!(
        "SELECT provider, event_id, event_type, attempts, to_json(received_at)#>>'{{}}' AS received_at,
                to_json(coalesce(processed_at, received_at))#>>'{{}}' AS failed_at, failure_reason
         FROM webhook_inbox WHERE {FILTER_WHERE}
         ORDER BY coalesce(processed_at, received_at) DESC LIMIT $9"
    );
    bind_filter!(db::query_as(&sql), filter).bind(limit).fetch_all(db::Autocommit(pool)).await
}

/// What a requeue would take: the events matching a filter, and among them
/// those stored without a payload (a body that was never usable), which it skips.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Matching {
    /// Events the filter selects (pending ones aside).
    pub matching: i64,
    /// Of those, without a payload (a body never usable, or erased): a requeue skips them.
    pub without_payload: i64,
}

/// How many events match `filter` (pending ones aside: a requeue never takes
/// them), and how many of them have no payload.
pub async fn count_matching(pool: &PgPool, filter: &Filter) -> Result<Matching, sqlx::Error> {
    let sql = format!(
        "SELECT count(*) AS matching, count(*) FILTER (WHERE payload IS NULL) AS without_payload
         FROM webhook_inbox WHERE {FILTER_WHERE} AND status <> 'pending'"
    );
    bind_filter!(db::query_as(&sql), filter).fetch_one(db::Autocommit(pool)).await
}

/// Who acts on events or outbox messages (a requeue, a replay, a retry), what,
/// and why: kept in `inbox_audit` with each row's state before.
#[derive(Debug, Clone)]
pub struct Audit<'a> {
    /// Who (`INBOX_OPERATOR` for the CLI, else the login name).
    pub actor: &'a str,
    /// What: `requeue`, `replay`, `retry_outbox`, or your own word.
    pub action: &'a str,
    /// Why, in the operator's words.
    pub reason: &'a str,
}

/// Puts up to `limit` events matching `filter` back to `pending` (attempts
/// reset, due now), skipping rows another transaction holds and rows without
/// a payload (a handler could never take them), with one audit record each,
/// in one statement: a short transaction of its own. Returns how many; call it
/// again until it returns less than `limit`.
///
/// `ended_before` (the start of the whole requeue, in microseconds since the
/// Unix epoch) fences the rows taken: an event requeued and processed again
/// while the requeue goes on ends after it (the worker stamps `processed_at`
/// with its statement's time), and is not taken a second time. Pending events
/// are never taken: they are queued already.
async fn requeue(
    pool: &PgPool,
    filter: &Filter,
    by: &Audit<'_>,
    limit: i64,
    ended_before: i64,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "WITH picked AS (
             SELECT provider, event_id, status, attempts, failure_reason FROM webhook_inbox
             WHERE {FILTER_WHERE} AND status <> 'pending' AND payload IS NOT NULL
               AND coalesce(processed_at, received_at) < to_timestamp($13::float8 / 1000000)
             ORDER BY received_at, event_id LIMIT $9 FOR UPDATE SKIP LOCKED),
         requeued AS (
             UPDATE webhook_inbox AS w
             SET status = 'pending', attempts = 0, next_attempt_at = NULL, processed_at = NULL, failure_reason = NULL
             FROM picked WHERE w.provider = picked.provider AND w.event_id = picked.event_id
             RETURNING w.provider),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_id, from_status, attempts, failure_reason)
             SELECT $10, $11, $12, provider, event_id, status, attempts, failure_reason FROM picked)
         SELECT count(*) FROM requeued"
    );
    let n: i64 = bind_filter!(db::query_scalar(&sql), filter)
        .bind(limit)
        .bind(by.actor)
        .bind(by.action)
        .bind(by.reason)
        .bind(ended_before)
        .fetch_one(db::Autocommit(pool))
        .await?;
    Ok(n as u64)
}

/// The database's clock, in microseconds since the Unix epoch.
async fn now_micros(pool: &PgPool) -> Result<i64, sqlx::Error> {
    db::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
        .fetch_one(db::Autocommit(pool))
        .await
}

/// What a whole requeue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Requeued {
    /// Events matching the filter when it started.
    pub matching: i64,
    /// Of those, stored without a payload: skipped.
    pub without_payload: i64,
    /// Put back to pending.
    pub requeued: u64,
    /// Matching, with a payload, and left where they were: another
    /// transaction held them (a worker, prune) when their batch came. Run
    /// the requeue again for them.
    pub held: i64,
    /// Its `progress` stopped it before a batch found nothing (in JSON only when it did).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// Puts every event `filter` selects back to pending, `batch` at a time (each
/// `requeue` its own short statement, skipping rows another transaction
/// holds), until a batch finds nothing, fenced at its start so that an event
/// finished again meanwhile is not taken twice. `progress` hears the totals
/// after each batch, and stops the requeue there with `ControlFlow::Break`
/// (what was requeued stays requeued; [`Requeued::stopped`] says so). Pending
/// events are never taken. This is how a handler deployed later is run over
/// the events of its type that arrived before it
/// (`Filter { statuses: vec![Status::Unhandled], .. }`).
pub async fn requeue_all(
    pool: &PgPool,
    filter: &Filter,
    by: &Audit<'_>,
    batch: i64,
    mut progress: impl FnMut(&Requeued) -> ControlFlow<()>,
) -> Result<Requeued, sqlx::Error> {
    let started = now_micros(pool).await?;
    let found = count_matching(pool, filter).await?;
    let mut done = Requeued { matching: found.matching, without_payload: found.without_payload, ..Requeued::default() };
    loop {
        let n = requeue(pool, filter, by, batch.max(1), started).await?;
        done.requeued += n;
        if n == 0 {
            done.held = (found.matching - found.without_payload - done.requeued as i64).max(0);
            let _ = progress(&done); // the last word: there is nothing left to stop
            return Ok(done);
        }
        if progress(&done).is_break() {
            done.stopped = true;
            return Ok(done);
        }
    }
}

/// What replaying one event found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// Back to pending.
    Requeued {
        /// The status it was in.
        from: String,
    },
    /// It was pending already: nothing changed.
    AlreadyPending,
    /// Stored without a payload (its body was never usable): no handler could take it.
    WithoutPayload,
    /// Erased ([`crate::ops::erase`]): nothing is left to process.
    Erased {
        /// When (PostgreSQL's own text).
        at: String,
        /// By whom.
        by: String,
    },
    /// No such event.
    NotFound,
}

/// Puts one event (done, failed or unhandled) back to `pending`, attempts
/// reset, with an audit record, in one statement.
pub async fn replay(pool: &PgPool, provider: &str, event_id: &str, by: &Audit<'_>) -> Result<Replayed, sqlx::Error> {
    // Its status, whether pending, whether replayable, when and by whom it was erased.
    type Row = (String, bool, bool, Option<String>, Option<String>);
    let row: Option<Row> = db::query_as(
        "WITH picked AS (
             SELECT provider, event_id, status, attempts, failure_reason, erased_at, erased_by,
                    status <> 'pending' AND payload IS NOT NULL AS replayable
             FROM webhook_inbox
             WHERE provider = $1 AND event_id = $2 FOR UPDATE),
         requeued AS (
             UPDATE webhook_inbox AS w
             SET status = 'pending', attempts = 0, next_attempt_at = NULL, processed_at = NULL, failure_reason = NULL
             FROM picked WHERE w.provider = picked.provider AND w.event_id = picked.event_id AND picked.replayable
             RETURNING w.provider),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_id, from_status, attempts, failure_reason)
             SELECT $3, $4, $5, provider, event_id, status, attempts, failure_reason FROM picked WHERE replayable)
         SELECT status, status = 'pending', replayable, to_json(erased_at)#>>'{}' AS erased_at, erased_by FROM picked",
    )
    .bind(provider)
    .bind(event_id)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_optional(db::Autocommit(pool))
    .await?;
    Ok(match row {
        None => Replayed::NotFound,
        Some((_, _, _, Some(at), by)) => Replayed::Erased { at, by: by.unwrap_or_default() },
        Some((_, true, _, _, _)) => Replayed::AlreadyPending,
        Some((_, false, false, _, _)) => Replayed::WithoutPayload,
        Some((from, false, true, _, _)) => Replayed::Requeued { from },
    })
}
