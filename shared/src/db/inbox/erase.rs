//! Erasure: an event's personal data gone (its payload, its raw bytes, its
//! batch's shared body, its kept headers, its failure reason and the copies of
//! it in its audit records, its outbox messages' payloads and the answers kept
//! of their deliveries, wherever those were copied), while its key, provider,
//! type, times and status stay, so a redelivery is still a duplicate and its
//! history still reads.

use std::ops::ControlFlow;

use sqlx::PgPool;

use super::Audit;
use crate::{core::selection::EventQuery, db};

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
 -- An open circuit's alert quotes the first 200 characters of the answer, its notifications that sentence;
 -- only an answer that says something after its kind (`HTTP 400: `) is looked for, not the kind alone.
 quoted AS (SELECT DISTINCT left(text, 200) AS text FROM answers
            WHERE length(left(text, 200)) - position(': ' IN left(text, 200)) >= 16),
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
 SELECT status, to_json(erased_at)#>>'{}' AS erased_at, erased_by, EXISTS (SELECT 1 FROM erased),
 (SELECT count(*) FROM messages),
        (SELECT count(*) FROM siblings)
 FROM picked";

/// Erases one event, with an audit record: every copy of its data goes (its
/// payload, raw bytes, kept headers, failure reason and their audit copies;
/// its batch's body; its outbox messages' payloads and the answers kept of
/// their deliveries, wherever those were copied).
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
    /// Stopped before the end, by its progress hook (a cancel) or its bound
    /// ([`EraseOptions::at_most`], reached by events that came meanwhile):
    /// what it erased stays erased.
    pub stopped: bool,
}

/// How an erasure by selection runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EraseOptions {
    /// Only count: what it would erase; nothing is changed.
    pub dry_run: bool,
    /// The most events it may erase: a selection that holds more is refused
    /// whole (nothing erased), and it never erases more (events that match
    /// meanwhile wait for the next run).
    pub at_most: Option<u64>,
}

/// Why an erasure by selection did not run.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The selection holds more events to erase than [`EraseOptions::at_most`].
    #[error("the selection holds {erasable} events to erase, more than at most {at_most}: nothing was erased (narrow it, or raise the bound)")]
    TooMany {
        /// Events it would erase.
        erasable: u64,
        /// The bound given.
        at_most: u64,
    },
    /// The database refused or did not answer.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// What erasing `query`'s selection would do, counted in one statement (an
/// erased event matches no payload search: it holds none). With `timeout`,
/// PostgreSQL stops a count that takes longer (57014).
pub async fn count_erasure(
    pool: &PgPool,
    query: &EventQuery,
    timeout: Option<std::time::Duration>,
) -> Result<Erasure, sqlx::Error> {
    let mut sql = sqlx::QueryBuilder::new(
        "SELECT count(*), count(*) FILTER (WHERE erased_at IS NULL AND status <> 'pending'),
                count(*) FILTER (WHERE erased_at IS NOT NULL), count(*) FILTER (WHERE erased_at IS NULL AND status = 'pending')
         FROM webhook_inbox AS w WHERE true",
    );
    super::listing::push_filters(&mut sql, query);
    let mut tx = pool.begin().await?;
    if let Some(t) = timeout {
        db::query("SELECT set_config('statement_timeout', $1, true)")
            .bind(t.as_millis().to_string())
            .execute(&mut *tx)
            .await?;
    }
    let (matching, erasable, already, pending): (i64, i64, i64, i64) =
        db::built_query_as(&mut sql).persistent(false).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(Erasure {
        matching: matching as u64,
        erased: erasable as u64,
        already: already as u64,
        pending: pending as u64,
        stopped: false,
    })
}

/// Up to `limit` events of `query`'s selection that an erasure takes (not
/// erased, not pending), after `after` in key order: each page continues
/// along the primary key where the last stopped, so a selection of millions
/// of events received in the same second costs one walk, not one per page.
async fn erasable_page(
    pool: &PgPool,
    query: &EventQuery,
    after: &(String, String),
    limit: i64,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let mut sql = sqlx::QueryBuilder::new(
        "SELECT provider, event_id FROM webhook_inbox AS w WHERE erased_at IS NULL AND status <> 'pending'",
    );
    super::listing::push_filters(&mut sql, query);
    sql.push(" AND (provider, event_id) > (").push_bind(&after.0).push(", ").push_bind(&after.1).push(")");
    sql.push(" ORDER BY provider, event_id LIMIT ").push_bind(limit);
    db::built_query_as(&mut sql).persistent(false).fetch_all(db::Autocommit(pool)).await
}

/// Erases every event `query` selects, each in its own short statement with
/// its audit record, in key order, after counting them ([`count_erasure`]);
/// a dry run only counts. `progress` is told what is done after each event,
/// and stops the run by answering [`ControlFlow::Break`].
pub async fn erase_matching(
    pool: &PgPool,
    query: &EventQuery,
    by: &Audit<'_>,
    options: EraseOptions,
    progress: impl FnMut(&Erasure) -> ControlFlow<()>,
) -> Result<Erasure, EraseError> {
    let counted = count_erasure(pool, query, None).await?;
    erase_counted(pool, query, counted, by, options, progress).await
}

/// [`erase_matching`] with the selection already counted by
/// [`count_erasure`] (`counted`), for a caller that showed or recorded the
/// count first: the selection is not counted a second time.
pub async fn erase_counted(
    pool: &PgPool,
    query: &EventQuery,
    counted: Erasure,
    by: &Audit<'_>,
    options: EraseOptions,
    mut progress: impl FnMut(&Erasure) -> ControlFlow<()>,
) -> Result<Erasure, EraseError> {
    let mut done = counted;
    if let Some(at_most) = options.at_most.filter(|n| done.erased > *n) {
        return Err(EraseError::TooMany { erasable: done.erased, at_most });
    }
    if options.dry_run {
        return Ok(done);
    }
    let at_most = options.at_most.unwrap_or(u64::MAX);
    done.erased = 0;
    let mut after = (String::new(), String::new());
    loop {
        let page = erasable_page(pool, query, &after, 500).await?;
        for (provider, event_id) in &page {
            if done.erased >= at_most {
                done.stopped = true;
                return Ok(done);
            }
            match erase(pool, provider, event_id, by).await? {
                Erased::Erased { .. } => done.erased += 1,
                // Erased, or taken back to pending, since the count: as they are now.
                Erased::Already { .. } => done.already += 1,
                Erased::Pending => done.pending += 1,
                Erased::NotFound => {} // pruned meanwhile
            }
            if progress(&done).is_break() {
                done.stopped = true;
                return Ok(done);
            }
        }
        match page.last() {
            Some(last) if page.len() == 500 => after = last.clone(),
            _ => return Ok(done),
        }
    }
}
