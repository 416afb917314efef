//! Erasure: an event's personal data gone (its payload, its raw bytes, its
//! batch's shared body, its kept headers, its failure reason and the copies of
//! it in its audit records, its outbox messages' payloads and the answers kept
//! of their deliveries, wherever those were copied), while its key, provider,
//! type, times and status stay, so a redelivery is still a duplicate and its
//! history still reads.

use sqlx::PgPool;

use super::Audit;
use crate::db;

/// What [`erase`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Erased {
    /// Erased now; its outbox messages (this many) emptied, those not sent yet dead.
    Erased {
        /// Its outbox messages.
        messages: i64,
        /// Events of the same batch whose raw bytes went with it: the batch's
        /// body held this event's data too (they keep their own payloads).
        siblings: i64,
    },
    /// Erased before.
    Already {
        /// When (PostgreSQL's own text).
        at: String,
        /// By whom.
        by: String,
    },
    /// Pending: a worker may be taking it. Pause its provider, or wait until it is processed.
    Pending,
    /// No such event.
    NotFound,
}

/// The erasure of one event, in one statement (`$1` provider, `$2` event id,
/// `$3` actor, `$4` action, `$5` reason). Every copy of its data goes: its
/// payload, raw bytes, kept headers and failure reason (and the audit's copies
/// of it); its batch's body, whatever other events point at it (they keep
/// their payloads, not the bytes); its outbox messages' payloads and the
/// answers kept of their deliveries (`last_error`), and where those answers
/// were copied (a destination's last error, an alert's summary and its
/// notifications not yet sent).
const ERASE: &str = "WITH picked AS (
     SELECT provider, event_id, status, attempts, body_sha256, erased_at, erased_by
     FROM webhook_inbox WHERE provider = $1 AND event_id = $2 FOR UPDATE),
 erased AS (
     UPDATE webhook_inbox AS w
     SET payload = NULL, raw_body = NULL, body_sha256 = NULL, headers = '{}', trace_context = NULL,
         failure_reason = CASE WHEN w.status = 'failed' THEN 'erased' END,
         erased_at = now(), erased_by = $3
     FROM picked
     WHERE w.provider = picked.provider AND w.event_id = picked.event_id
       AND picked.status <> 'pending' AND picked.erased_at IS NULL
     RETURNING w.provider, w.event_id),
 bodies AS (
     DELETE FROM webhook_bodies AS b USING picked
     WHERE b.sha256 = picked.body_sha256 AND EXISTS (SELECT 1 FROM erased)),
 siblings AS (
     UPDATE webhook_inbox AS s SET body_sha256 = NULL, raw_erased_at = now()
     FROM picked
     WHERE s.body_sha256 = picked.body_sha256 AND EXISTS (SELECT 1 FROM erased)
       AND (s.provider, s.event_id) <> (picked.provider, picked.event_id)
     RETURNING 1),
 -- What the destinations answered to its messages, as it was (this statement sees the rows as they were).
 answers AS (
     SELECT o.last_error AS text FROM transactional_outbox AS o, erased AS e
     WHERE o.event_provider = e.provider AND o.event_id = e.event_id AND o.last_error IS NOT NULL),
 messages AS (
     UPDATE transactional_outbox AS o
     SET payload = '{}',
         dead_at = CASE WHEN o.processed_at IS NULL THEN coalesce(o.dead_at, now()) END,
         last_error = CASE WHEN o.processed_at IS NULL AND o.dead_at IS NULL THEN 'erased before it was sent'
                           WHEN o.last_error IS NOT NULL THEN 'erased (the answer kept held its data)' END
     FROM erased AS e WHERE o.event_provider = e.provider AND o.event_id = e.event_id
     RETURNING o.id),
 destinations AS (
     UPDATE relay_destinations AS d SET last_error = 'erased (the answer kept held an erased event''s data)'
     WHERE d.last_error IN (SELECT text FROM answers)),
 -- An open circuit's alert quotes the first 200 characters of the answer, its notifications that sentence.
 quoted AS (SELECT DISTINCT left(text, 200) AS text FROM answers WHERE length(left(text, 200)) >= 8),
 alerts AS (
     UPDATE inbox_alerts AS a SET summary = replace(a.summary, q.text, '[erased]')
     FROM quoted AS q WHERE strpos(a.summary, q.text) > 0
     RETURNING a.id),
 notices AS (
     UPDATE transactional_outbox AS o SET payload = '{}',
         dead_at = CASE WHEN o.processed_at IS NULL THEN coalesce(o.dead_at, now()) END,
         last_error = CASE WHEN o.processed_at IS NULL THEN 'erased before it was sent: it quoted an erased event''s data'
                           ELSE o.last_error END
     WHERE o.aggregate_type = 'alert'
       AND (o.aggregate_id IN (SELECT id::text FROM alerts)
            OR EXISTS (SELECT 1 FROM quoted AS q
                       WHERE strpos(o.payload::text, substr(to_jsonb(q.text)::text, 2, length(to_jsonb(q.text)::text) - 2)) > 0))),
 history AS (
     UPDATE inbox_audit AS a SET failure_reason = NULL
     FROM erased AS e WHERE a.provider = e.provider AND a.event_id = e.event_id),
 audited AS (
     INSERT INTO inbox_audit (actor, action, reason, provider, event_id, from_status, attempts)
     SELECT $3, $4, $5, provider, event_id, status, attempts FROM picked WHERE EXISTS (SELECT 1 FROM erased))
 SELECT status, erased_at::text, erased_by, EXISTS (SELECT 1 FROM erased), (SELECT count(*) FROM messages),
        (SELECT count(*) FROM siblings)
 FROM picked";

/// Erases one event, with an audit record (see [`ERASE`] for what goes).
/// A batch's body is locked first: two erasures of its events take turns.
pub async fn erase(pool: &PgPool, provider: &str, event_id: &str, by: &Audit<'_>) -> Result<Erased, sqlx::Error> {
    type Row = (String, Option<String>, Option<String>, bool, i64, i64);
    let mut tx = pool.begin().await?;
    db::query("SELECT 1 FROM webhook_bodies WHERE sha256 = (SELECT body_sha256 FROM webhook_inbox WHERE provider = $1 AND event_id = $2) FOR UPDATE")
        .bind(provider)
        .bind(event_id)
        .execute(&mut *tx)
        .await?;
    let row: Option<Row> = db::query_as(ERASE)
        .bind(provider)
        .bind(event_id)
        .bind(by.actor)
        .bind(by.action)
        .bind(by.reason)
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(match row {
        None => Erased::NotFound,
        Some((_, Some(at), by, _, _, _)) => Erased::Already { at, by: by.unwrap_or_default() },
        Some((status, None, _, false, _, _)) if status == "pending" => Erased::Pending,
        Some((_, None, _, _, messages, siblings)) => Erased::Erased { messages, siblings },
    })
}

/// What [`erase_matching`] did, or (a dry run) would do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Erasure {
    /// Events the selection holds.
    pub matching: u64,
    /// Erased now (a dry run: that it would erase).
    pub erased: u64,
    /// Erased before.
    pub already: u64,
    /// Pending, left as they are: erase them once processed (or pause their provider first).
    pub pending: u64,
}

/// Erases every event `query` selects, a page of 500 at a time (each event
/// its own short statement, audited), newest first; `dry_run` only counts.
/// `progress` is told the events examined so far after each page.
pub async fn erase_matching(
    pool: &PgPool,
    query: &crate::core::selection::EventQuery,
    by: &Audit<'_>,
    dry_run: bool,
    mut progress: impl FnMut(u64),
) -> Result<Erasure, sqlx::Error> {
    let mut done = Erasure::default();
    let mut after = None;
    loop {
        let page = super::list_events(pool, query, after.as_ref(), 500).await?;
        for e in &page.events {
            done.matching += 1;
            if dry_run {
                match e.status.as_str() {
                    "pending" => done.pending += 1,
                    _ => done.erased += 1,
                }
                continue;
            }
            match erase(pool, &e.provider, &e.event_id, by).await? {
                Erased::Erased { .. } => done.erased += 1,
                Erased::Already { .. } => done.already += 1,
                Erased::Pending => done.pending += 1,
                Erased::NotFound => done.matching -= 1, // pruned meanwhile
            }
        }
        progress(done.matching);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(done),
        }
    }
}
