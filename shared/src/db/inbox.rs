//! `webhook_inbox`: every statement on the table, and its status values. The
//! claim is one `INSERT ... ON CONFLICT DO NOTHING RETURNING`: the primary key
//! is the gate, so no check-then-act exists. Status literals stay in the SQL
//! (the queue's partial index is `WHERE status = 'pending'`), all in this file.

use std::time::Duration;

use sqlx::{types::Json, PgConnection, PgExecutor, PgPool};

use crate::core::{event::NewEvent, provider::Provider};

/// A row's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Waiting for the worker (due at `next_attempt_at`, if set).
    Pending,
    /// A handler applied it (with an effect or without).
    Done,
    /// Final, with its `failure_reason`.
    Failed,
    /// No handler takes its type: nothing ran. Kept like `done`, until a
    /// handler for it is deployed and the event requeued.
    Unhandled,
}

impl Status {
    /// The name in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Unhandled => "unhandled",
        }
    }

    /// The status of this name, if it is one.
    pub fn parse(name: &str) -> Option<Status> {
        [Status::Pending, Status::Done, Status::Failed, Status::Unhandled].into_iter().find(|s| s.as_str() == name)
    }
}

/// What the delivery carried besides its events: shared by every row it makes.
#[derive(Clone, Copy, Debug)]
pub struct Envelope<'a> {
    pub provider: Provider,
    pub raw_body: &'a [u8],
    pub headers: &'a serde_json::Value,
    /// Which configured secret verified the delivery; `None` for an event that
    /// reconcile fetched from the provider's API (stored with `source = 'reconcile'`).
    pub secret_index: Option<i16>,
    /// That secret's [`crate::core::secret::Secret::fingerprint`], where known.
    pub secret_fingerprint: Option<&'a str>,
    /// Whether the signed bytes are deduplicated too (`webhook_replay_guard`):
    /// for a scheme whose id is not signed ([`crate::schemes::Scheme::guards_replays`]).
    pub replay_guard: bool,
    /// The `traceparent` of the delivery's receive span, when traces are on (`trace_context`).
    pub trace_context: Option<&'a str>,
}

/// Where a row's raw bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// In the row (`raw_body`): a delivery of one event.
    InRow,
    /// Once per delivery in `webhook_bodies`, the row pointing at it (`body_sha256`).
    Shared,
}

const INSERT: &str = "\
INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index, source, secret_fingerprint,
     trace_context)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, CASE WHEN $9 IS NULL THEN 'reconcile' ELSE 'webhook' END, $10, $11)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING event_id";

/// [`INSERT`], and the digest of the event's type and signed bytes claimed in
/// `webhook_replay_guard` in the same statement: a digest already there
/// (under any id) inserts nothing. The type is in it because a provider may
/// send one body under several topics (Shopify's `orders/paid` and
/// `orders/updated`), each an event of its own. Its second column is the id
/// the digest was first claimed under, when it was (the guard's own insert is
/// not visible to the statement).
const INSERT_GUARDED: &str = "\
WITH guard AS (
    INSERT INTO webhook_replay_guard (provider, sha256, event_id)
    VALUES ($1, sha256(convert_to($3, 'UTF8') || '\\x00'::bytea || $7::bytea), $2)
    ON CONFLICT (provider, sha256) DO NOTHING
    RETURNING 1),
inserted AS (
    INSERT INTO webhook_inbox
        (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index, source, secret_fingerprint,
     trace_context)
    SELECT $1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, CASE WHEN $9::smallint IS NULL THEN 'reconcile' ELSE 'webhook' END, $10, $11
    WHERE EXISTS (SELECT 1 FROM guard)
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING event_id)
SELECT (SELECT event_id FROM inserted),
       (SELECT event_id FROM webhook_replay_guard
        WHERE provider = $1 AND sha256 = sha256(convert_to($3, 'UTF8') || '\\x00'::bytea || $7::bytea))";

/// What one insert came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    New,
    /// Its key was there already.
    Duplicate,
    /// Its signed bytes were claimed already, under another id: a captured delivery sent again.
    Replay,
}

/// The body of a delivery with several events, stored once; the upsert also
/// locks that row until commit, so retention cannot delete a body that a new
/// row is about to point at. `$7` is the raw body.
macro_rules! with_shared_body {
    ($insert:literal) => {
        concat!(
            "WITH body AS (
    INSERT INTO webhook_bodies (sha256, raw_body) VALUES (sha256($7::bytea), $7)
    ON CONFLICT (sha256) DO UPDATE SET last_seen_at = now()
    RETURNING sha256)
",
            $insert
        )
    };
}

/// [`INSERT`] for one item of a delivery with several events.
const INSERT_ITEM: &str = with_shared_body!(
    "INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, body_sha256, headers, secret_index, source, secret_fingerprint,
     trace_context)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, (SELECT sha256 FROM body), $8, $9,
        CASE WHEN $9 IS NULL THEN 'reconcile' ELSE 'webhook' END, $10, $11)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING event_id"
);

/// Every item of a batch in one `unnest` statement, keys sorted.
const INSERT_BATCH: &str = with_shared_body!(
    "INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, body_sha256, headers, secret_index, source, secret_fingerprint,
     trace_context)
SELECT $1, e.event_id, e.event_type, e.payload::jsonb, e.status, e.failure_reason, (SELECT sha256 FROM body), $8, $9,
       CASE WHEN $9::smallint IS NULL THEN 'reconcile' ELSE 'webhook' END, $10, $11
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
     AS e (event_id, event_type, payload, status, failure_reason)
ORDER BY e.event_id COLLATE \"C\"
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING event_id"
);

/// Inserts one event unless its key exists (or, guarded, its signed bytes were claimed).
pub(crate) async fn insert<'e>(
    ex: impl PgExecutor<'e>,
    env: &Envelope<'_>,
    e: &NewEvent,
    body: Body,
) -> Result<Inserted, sqlx::Error> {
    if env.replay_guard && body == Body::InRow {
        let (inserted, first): (Option<String>, Option<String>) = super::query_as(INSERT_GUARDED)
            .bind(env.provider.as_str())
            .bind(&e.event_id)
            .bind(&e.event_type)
            .bind(e.payload.as_deref())
            .bind(e.status.as_str())
            .bind(e.failure_reason.as_deref())
            .bind(env.raw_body)
            .bind(Json(env.headers))
            .bind(env.secret_index)
            .bind(env.secret_fingerprint)
            .bind(env.trace_context)
            .fetch_one(ex)
            .await?;
        return Ok(match (inserted, first) {
            (Some(_), _) => Inserted::New,
            (None, Some(first)) if first != e.event_id => Inserted::Replay,
            (None, _) => Inserted::Duplicate,
        });
    }
    let sql = match body {
        Body::InRow => INSERT,
        Body::Shared => INSERT_ITEM,
    };
    let row: Option<(String,)> = super::query_as(sql)
        .bind(env.provider.as_str())
        .bind(&e.event_id)
        .bind(&e.event_type)
        .bind(e.payload.as_deref())
        .bind(e.status.as_str())
        .bind(e.failure_reason.as_deref())
        .bind(env.raw_body)
        .bind(Json(env.headers))
        .bind(env.secret_index)
        .bind(env.secret_fingerprint)
        .bind(env.trace_context)
        .fetch_optional(ex)
        .await?;
    Ok(if row.is_some() { Inserted::New } else { Inserted::Duplicate })
}

/// Inserts events with distinct keys, sorted, in one statement; the ids inserted.
pub(crate) async fn insert_batch<'e>(
    ex: impl PgExecutor<'e>,
    env: &Envelope<'_>,
    unique: &[&NewEvent],
) -> Result<Vec<String>, sqlx::Error> {
    let col = |f: fn(&NewEvent) -> Option<&str>| unique.iter().map(|e| f(e)).collect::<Vec<_>>();
    let rows: Vec<(String,)> = super::query_as(INSERT_BATCH)
        .bind(env.provider.as_str())
        .bind(col(|e| Some(&e.event_id)))
        .bind(col(|e| Some(&e.event_type)))
        .bind(col(|e| e.payload.as_deref()))
        .bind(col(|e| Some(e.status.as_str())))
        .bind(col(|e| e.failure_reason.as_deref()))
        .bind(env.raw_body)
        .bind(Json(env.headers))
        .bind(env.secret_index)
        .bind(env.secret_fingerprint)
        .bind(env.trace_context)
        .fetch_all(ex)
        .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

#[cfg(feature = "serve")]
/// A delivery of one event, to claim with its group.
pub struct GroupRow {
    pub provider: Provider,
    pub event: NewEvent,
    pub raw_body: Vec<u8>,
    pub headers: serde_json::Value,
    pub secret_index: Option<i16>,
    pub secret_fingerprint: Option<String>,
    /// The delivery's receive span (`trace_context`), when traces are on.
    pub trace_context: Option<String>,
}

#[cfg(feature = "serve")]
impl GroupRow {
    pub(crate) fn envelope(&self) -> Envelope<'_> {
        Envelope {
            provider: self.provider,
            raw_body: &self.raw_body,
            headers: &self.headers,
            secret_index: self.secret_index,
            secret_fingerprint: self.secret_fingerprint.as_deref(),
            replay_guard: false,
            trace_context: self.trace_context.as_deref(),
        }
    }
}

/// Deliveries of one event each (several providers perhaps), in one
/// statement: receive's group commit. Sorted by key, so that concurrent groups
/// take their locks in one order; a key twice in the group inserts once.
#[cfg(feature = "serve")]
const INSERT_GROUP: &str = "\
INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index, source, secret_fingerprint,
     trace_context)
SELECT g.provider, g.event_id, g.event_type, g.payload::jsonb, g.status, g.failure_reason, g.raw_body, g.headers,
       g.secret_index, CASE WHEN g.secret_index IS NULL THEN 'reconcile' ELSE 'webhook' END, g.secret_fingerprint,
       g.trace_context
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::jsonb[],
            $9::int2[], $10::text[], $11::text[])
     AS g (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index, secret_fingerprint,
           trace_context)
ORDER BY g.provider COLLATE \"C\", g.event_id COLLATE \"C\"
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING provider, event_id";

/// Inserts a group's events unless their keys exist; the keys inserted.
#[cfg(feature = "serve")]
pub(crate) async fn insert_group<'e, 'r>(
    ex: impl PgExecutor<'e>,
    group: impl Iterator<Item = &'r GroupRow> + Clone,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let col = |f: fn(&'r GroupRow) -> Option<&'r str>| group.clone().map(f).collect::<Vec<_>>();
    super::query_as(INSERT_GROUP)
        .bind(col(|r| Some(r.provider.as_str())))
        .bind(col(|r| Some(&r.event.event_id)))
        .bind(col(|r| Some(&r.event.event_type)))
        .bind(col(|r| r.event.payload.as_deref()))
        .bind(col(|r| Some(r.event.status.as_str())))
        .bind(col(|r| r.event.failure_reason.as_deref()))
        .bind(group.clone().map(|r| r.raw_body.as_slice()).collect::<Vec<_>>())
        .bind(group.clone().map(|r| Json(&r.headers)).collect::<Vec<_>>())
        .bind(group.clone().map(|r| r.secret_index).collect::<Vec<_>>())
        .bind(col(|r| r.secret_fingerprint.as_deref()))
        .bind(col(|r| r.trace_context.as_deref()))
        .fetch_all(ex)
        .await
}

// ---- the worker ----

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
}

/// Up to `limit` due pending rows, in receive order, skipping those another
/// worker holds; the payload and headers only where `handled`
/// (`provider:event_type`) names a handler: an event no handler takes is
/// unhandled without them.
pub(crate) async fn take_pending(
    conn: &mut PgConnection,
    limit: i64,
    handled: &[String],
) -> Result<Vec<Taken>, sqlx::Error> {
    super::query_as(
        "SELECT provider, event_id, event_type,
             CASE WHEN provider || ':' || event_type = ANY($2) THEN payload::text END AS payload,
             CASE WHEN provider || ':' || event_type = ANY($2) THEN headers END AS headers, attempts,
             (extract(epoch FROM received_at) * 1000000)::bigint AS received_at_us, trace_context
         FROM webhook_inbox
         WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= now())
         ORDER BY received_at, event_id
         LIMIT $1
         FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .bind(handled)
    .fetch_all(conn)
    .await
}

/// The SQS path: the named event, if it is due and nobody holds it.
pub(crate) async fn take_one(
    conn: &mut PgConnection,
    provider: &str,
    event_id: &str,
) -> Result<Vec<Taken>, sqlx::Error> {
    super::query_as(
        "SELECT provider, event_id, event_type, payload::text AS payload, headers, attempts,
             (extract(epoch FROM received_at) * 1000000)::bigint AS received_at_us, trace_context
         FROM webhook_inbox
         WHERE provider = $1 AND event_id = $2 AND status = 'pending'
           AND (next_attempt_at IS NULL OR next_attempt_at <= now())
         FOR UPDATE SKIP LOCKED",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_all(conn)
    .await
}

/// Careful mode: counts the next due event's attempt and holds it back by
/// `base` doubled per attempt (it may crash again), committed before it runs.
/// `attempts` comes back as the attempts made before this one.
pub(crate) async fn count_next(pool: &PgPool, base: Duration) -> Result<Option<Taken>, sqlx::Error> {
    super::query_as(
        "WITH next AS (
             SELECT provider, event_id FROM webhook_inbox
             WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= now())
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
    )
    .bind(base.as_millis() as i64)
    .fetch_optional(super::Autocommit(pool))
    .await
}

/// Careful mode: the counted event, whatever its backoff says.
pub(crate) async fn take_counted(
    conn: &mut PgConnection,
    provider: &str,
    event_id: &str,
) -> Result<Vec<Taken>, sqlx::Error> {
    super::query_as(
        "SELECT provider, event_id, event_type, payload::text AS payload, headers, attempts - 1 AS attempts,
             (extract(epoch FROM received_at) * 1000000)::bigint AS received_at_us, trace_context
         FROM webhook_inbox
         WHERE provider = $1 AND event_id = $2 AND status = 'pending'
         FOR UPDATE SKIP LOCKED",
    )
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
    super::query(
        "UPDATE webhook_inbox AS w
         SET status = u.status,
             attempts = w.attempts + u.attempts,
             processed_at = CASE WHEN u.status IN ('done', 'failed', 'unhandled') THEN statement_timestamp() END,
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
    super::query(
        "UPDATE webhook_inbox SET status = 'failed', failure_reason = $3, next_attempt_at = NULL, attempts = attempts - 1,
             processed_at = now()
         WHERE provider = $1 AND event_id = $2 AND status = 'pending'",
    )
    .bind(provider)
    .bind(event_id)
    .bind(reason)
    .execute(super::Autocommit(pool))
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
    super::query(
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
    super::query(
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
    super::query(
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

// ---- retention ----

/// Which providers' rows a retention DELETE takes.
#[derive(Debug, Clone, Copy)]
pub enum Providers<'a> {
    Any,
    Only(&'a [&'a str]),
    Except(&'a [&'a str]),
}

/// Deletes up to `limit` rows of one of `statuses` (of `providers`) received
/// before `days` ago, skipping rows another transaction holds.
pub async fn delete_received_before<'e>(
    ex: impl PgExecutor<'e>,
    providers: Providers<'_>,
    statuses: &[Status],
    days: u32,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let (only, except): (Option<&[&str]>, &[&str]) = match providers {
        Providers::Any => (None, &[]),
        Providers::Only(p) => (Some(p), &[]),
        Providers::Except(p) => (None, p),
    };
    let done = super::query(
        "DELETE FROM webhook_inbox AS w
         USING (SELECT provider, event_id FROM webhook_inbox
                WHERE received_at < now() - make_interval(days => $3)
                  AND status = ANY($2)
                  AND ($1::text[] IS NULL OR provider = ANY($1))
                  AND NOT provider = ANY($5::text[])
                LIMIT $4
                FOR UPDATE SKIP LOCKED) AS old
         WHERE w.provider = old.provider AND w.event_id = old.event_id",
    )
    .bind(only)
    .bind(statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    .bind(days as i32)
    .bind(limit)
    .bind(except)
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}

// ---- gauges (alarms, `inbox stats`) ----

/// What the scheduled `process` run reports, and `inbox stats` shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct InboxGauges {
    pub pending: i64,
    /// Age of the oldest pending event, 0 when none is pending.
    pub oldest_pending_ms: f64,
    /// Events that failed in the last hour (stored as failed, or given up on).
    pub failed_last_hour: i64,
}

/// [`InboxGauges`], each from a partial index.
pub async fn gauges<'e>(ex: impl PgExecutor<'e>) -> Result<InboxGauges, sqlx::Error> {
    super::query_as(
        "SELECT (SELECT count(*) FROM webhook_inbox WHERE status = 'pending') AS pending,
                coalesce((SELECT extract(epoch FROM now() - min(received_at)) * 1000
                          FROM webhook_inbox WHERE status = 'pending'), 0)::float8 AS oldest_pending_ms,
                (SELECT count(*) FROM webhook_inbox
                 WHERE status = 'failed' AND coalesce(processed_at, received_at) > now() - interval '1 hour')
                    AS failed_last_hour",
    )
    .fetch_one(ex)
    .await
}

// ---- operators (`inbox stats`, `failed`, `show`, `replay`, `requeue`) ----

/// Rows by provider and status.
pub async fn counts_by_status(pool: &PgPool) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    super::query_as("SELECT provider, status, count(*) FROM webhook_inbox GROUP BY 1, 2 ORDER BY 1, 2")
        .fetch_all(super::Autocommit(pool))
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
/// to `cap` (past it, [`Count::AtLeast`]): `pending`, `failed` and
/// `unhandled` in their partial indexes, `done` by the first rows found; past
/// the cap, `done`, the bulk of a full inbox, is the planner's estimate of the
/// rows less the others ([`Count::About`]). Milliseconds on an inbox of
/// millions, where `count(*)` takes seconds.
pub async fn status_counts(pool: &PgPool, cap: i64) -> Result<Vec<(Status, Count)>, sqlx::Error> {
    let (pending, failed, unhandled, done, rows): (i64, i64, i64, i64, f64) = super::query_as(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'pending' LIMIT $1) AS p),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'failed' LIMIT $1) AS f),
                (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox WHERE status = 'unhandled' LIMIT $1) AS u),
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
    .fetch_one(super::Autocommit(pool))
    .await?;
    let counted = |n: i64| if n > cap { Count::AtLeast(cap) } else { Count::Exact(n) };
    let done = if done > cap {
        // More than the cap: at least that, whatever a stale estimate says.
        Count::About((rows as i64 - pending.min(cap) - failed.min(cap) - unhandled.min(cap)).max(cap + 1))
    } else {
        Count::Exact(done)
    };
    Ok(vec![
        (Status::Pending, counted(pending)),
        (Status::Failed, counted(failed)),
        (Status::Unhandled, counted(unhandled)),
        (Status::Done, done),
    ])
}

/// Which configured secret verified the deliveries received since `since`
/// (by fingerprint, per provider): a rotated-out secret with no recent use can go.
pub async fn secret_usage(pool: &PgPool, since: Duration) -> Result<Vec<SecretUse>, sqlx::Error> {
    super::query_as(
        "SELECT provider, secret_fingerprint,
                CASE WHEN secret_fingerprint IS NULL THEN secret_index END AS secret_index,
                count(*) AS deliveries, max(received_at)::text AS last_received_at
         FROM webhook_inbox
         WHERE received_at > now() - $1 * interval '1 millisecond' AND source = 'webhook'
         GROUP BY 1, 2, 3 ORDER BY 1, 5 DESC",
    )
    .bind(since.as_millis() as i64)
    .fetch_all(super::Autocommit(pool))
    .await
}

/// One secret's recent use. Timestamps are PostgreSQL's own text (the crate has no date-time type).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct SecretUse {
    /// The provider's name.
    pub provider: String,
    /// The secret's fingerprint ([`crate::core::secret::Secret::fingerprint`]).
    pub secret_fingerprint: Option<String>,
    /// For rows stored before fingerprints were: the secret's position in the
    /// list configured then (which a rotation may since have reordered).
    pub secret_index: Option<i16>,
    /// Deliveries it verified in the period.
    pub deliveries: i64,
    /// When the last of them arrived.
    pub last_received_at: String,
}

/// Which events an operator means: the filters of `inbox failed` and `inbox
/// requeue`. Every field narrows the selection; `statuses` is required (an
/// empty list selects nothing).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Events in one of these statuses.
    pub statuses: Vec<Status>,
    /// Of this provider only (its name, as in `/webhooks/{provider}`).
    pub provider: Option<String>,
    /// Exactly this event type.
    pub event_type: Option<String>,
    /// Ended (processed, or stored as failed by receive) at or after this point.
    pub since: Option<Since>,
    /// Ended before this point.
    pub until: Option<Since>,
    /// `failure_reason ILIKE` this pattern (`%` and `_` as in SQL).
    pub reason_like: Option<String>,
}

/// A point in time: so long ago, or a timestamp PostgreSQL parses (a bad one
/// is PostgreSQL's error, when the query runs).
#[derive(Debug, Clone)]
pub enum Since {
    /// This long before now, by the database's clock.
    Ago(Duration),
    /// A timestamp, e.g. `2026-11-30 08:00Z`.
    At(String),
}

impl Since {
    /// A duration ago (`30s`, `15m`, `2h`, `7d`) or a timestamp (anything of
    /// 10 characters or more that starts with a digit: PostgreSQL reads it
    /// when the query runs), as the operator's commands and the console take it.
    pub fn parse(text: &str) -> Result<Since, String> {
        let text = text.trim();
        let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
        let seconds = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ if text.starts_with(|c: char| c.is_ascii_digit()) && text.len() >= 10 => {
                return Ok(Since::At(text.to_string()))
            }
            _ => return Err(format!("{text:?} is neither a duration (30s, 15m, 2h, 7d) nor a timestamp")),
        };
        let n: u64 = number.parse().map_err(|_| format!("{text:?}: the number is missing or too large"))?;
        n.checked_mul(seconds)
            .map(|s| Since::Ago(Duration::from_secs(s)))
            .ok_or_else(|| format!("{text:?} is too far back"))
    }

    fn ago_ms(&self) -> Option<i64> {
        match self {
            Since::Ago(d) => Some(d.as_millis() as i64),
            Since::At(_) => None,
        }
    }

    fn at(&self) -> Option<&str> {
        match self {
            Since::At(t) => Some(t),
            Since::Ago(_) => None,
        }
    }
}

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
        "SELECT provider, event_id, event_type, attempts, received_at::text,
                coalesce(processed_at, received_at)::text AS failed_at, failure_reason
         FROM webhook_inbox WHERE {FILTER_WHERE}
         ORDER BY coalesce(processed_at, received_at) DESC LIMIT $9"
    );
    bind_filter!(super::query_as(&sql), filter).bind(limit).fetch_all(super::Autocommit(pool)).await
}

/// What a requeue would take: the events matching a filter, and among them
/// those stored without a payload (a body that was never usable), which it skips.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Matching {
    /// Events the filter selects (pending ones aside).
    pub matching: i64,
    /// Of those, stored without a payload (a body never usable): a requeue skips them.
    pub without_payload: i64,
}

/// How many events match `filter` (pending ones aside: a requeue never takes
/// them), and how many of them have no payload.
pub async fn count_matching(pool: &PgPool, filter: &Filter) -> Result<Matching, sqlx::Error> {
    let sql = format!(
        "SELECT count(*) AS matching, count(*) FILTER (WHERE payload IS NULL) AS without_payload
         FROM webhook_inbox WHERE {FILTER_WHERE} AND status <> 'pending'"
    );
    bind_filter!(super::query_as(&sql), filter).fetch_one(super::Autocommit(pool)).await
}

/// Who puts events back, and why: kept in `inbox_audit` with each event's state before.
#[derive(Debug, Clone)]
pub struct Requeue<'a> {
    /// Who (`INBOX_OPERATOR` for the CLI, else the login name).
    pub actor: &'a str,
    /// What: `requeue`, `replay`, or your own word.
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
    by: &Requeue<'_>,
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
    let n: i64 = bind_filter!(super::query_scalar(&sql), filter)
        .bind(limit)
        .bind(by.actor)
        .bind(by.action)
        .bind(by.reason)
        .bind(ended_before)
        .fetch_one(super::Autocommit(pool))
        .await?;
    Ok(n as u64)
}

/// The database's clock, in microseconds since the Unix epoch.
async fn now_micros(pool: &PgPool) -> Result<i64, sqlx::Error> {
    super::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
        .fetch_one(super::Autocommit(pool))
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
}

/// Puts every event `filter` selects back to pending, `batch` at a time (each
/// `requeue` its own short statement, skipping rows another transaction
/// holds), until a batch finds nothing, fenced at its start so that an event
/// finished again meanwhile is not taken twice; `progress` hears the totals
/// after each batch. Pending events are never taken. This is how a handler deployed later is run over the events of its
/// type that arrived before it (`Filter { statuses: vec![Status::Unhandled], .. }`).
pub async fn requeue_all(
    pool: &PgPool,
    filter: &Filter,
    by: &Requeue<'_>,
    batch: i64,
    mut progress: impl FnMut(&Requeued),
) -> Result<Requeued, sqlx::Error> {
    let started = now_micros(pool).await?;
    let found = count_matching(pool, filter).await?;
    let mut done = Requeued { matching: found.matching, without_payload: found.without_payload, requeued: 0, held: 0 };
    loop {
        let n = requeue(pool, filter, by, batch.max(1), started).await?;
        done.requeued += n;
        progress(&done);
        if n == 0 {
            done.held = (found.matching - found.without_payload - done.requeued as i64).max(0);
            return Ok(done);
        }
    }
}

/// Which events a listing shows (the console's filters). Every field narrows
/// it; the default is every event.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Of this provider only.
    pub provider: Option<String>,
    /// Of this type only.
    pub event_type: Option<String>,
    /// In one of these statuses (none: any).
    pub statuses: Vec<Status>,
    /// Received at or after this.
    pub since: Option<Since>,
    /// Received before this.
    pub until: Option<Since>,
    /// This id, or the ids that start with this text.
    pub event_id: Option<IdMatch>,
    /// Whose payload holds this text or JSON. Nothing indexes payloads (an
    /// index would cost every claim): bound the search with `since`; it stops
    /// after [`SEARCH_TIMEOUT`] with PostgreSQL's statement timeout (57014).
    pub payload: Option<PayloadMatch>,
}

/// What a payload search looks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadMatch {
    /// This text, anywhere in the payload's JSON as PostgreSQL writes `jsonb`
    /// (`{"key": "value"}`, a space after each colon and comma), case and all.
    Text(String),
    /// This JSON, contained in the payload (`@>`: an object's members and an
    /// array's elements, at the same places).
    Json(serde_json::Value),
}

impl PayloadMatch {
    /// A JSON object or array as [`PayloadMatch::Json`], anything else as [`PayloadMatch::Text`].
    pub fn parse(text: &str) -> PayloadMatch {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() || v.is_array() => PayloadMatch::Json(v),
            _ => PayloadMatch::Text(text.to_string()),
        }
    }
}

/// How long a listing that searches payloads may run before PostgreSQL stops it.
pub const SEARCH_TIMEOUT: Duration = Duration::from_secs(3);

/// An event id to look for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMatch {
    /// Exactly this id.
    Exact(String),
    /// Every id that starts with this text (taken as text: `%` and `_` are themselves).
    Prefix(String),
}

/// One event in a listing. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct EventSummary {
    /// The provider's name.
    pub provider: String,
    /// The event's id.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// Its status.
    pub status: String,
    /// Attempts made.
    pub attempts: i32,
    /// When receive claimed it.
    pub received_at: String,
    /// Why it failed (or last failed).
    pub failure_reason: Option<String>,
}

/// A page of a listing, newest first, and where the next one starts.
#[derive(Debug, Clone)]
pub struct EventPage {
    /// The events, newest first (by `received_at`, then provider and id).
    pub events: Vec<EventSummary>,
    /// Where the next page starts, if there is one.
    pub next: Option<Cursor>,
}

/// Where a page starts: after this event, in the listing's order. Written as
/// an opaque, URL-safe text (its `Display`), read back with [`Cursor::parse`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    received_at: String,
    provider: String,
    event_id: String,
}

/// A text that is not a cursor a listing gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a page cursor of this listing")]
pub struct BadCursor;

impl Cursor {
    /// The cursor a page's `next` was written as.
    pub fn parse(text: &str) -> Result<Cursor, BadCursor> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).map_err(|_| BadCursor)?;
        serde_json::from_slice(&bytes).map_err(|_| BadCursor)
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::Engine as _;
        let json = serde_json::to_vec(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
    }
}

/// The events `query` selects, newest first, `limit` of them (1 to 500)
/// after `after` (a page's [`EventPage::next`]; none: from the newest).
/// Keyset pagination: a page costs the same however deep it is, and events
/// received meanwhile never shift one. A cursor that names no timestamp
/// PostgreSQL reads is its error, when the query runs.
pub async fn list_events(
    pool: &PgPool,
    query: &EventQuery,
    after: Option<&Cursor>,
    limit: i64,
) -> Result<EventPage, sqlx::Error> {
    let limit = limit.clamp(1, 500);
    // Only the filters given, so that each combination is its own statement,
    // planned for what it filters on (one statement of `$n IS NULL OR ...`
    // gets one generic plan, a scan, after its fifth run).
    let mut sql = sqlx::QueryBuilder::new(
        "SELECT provider, event_id, event_type, status, attempts, received_at::text, failure_reason
         FROM webhook_inbox AS w WHERE true",
    );
    if let Some(provider) = &query.provider {
        sql.push(" AND provider = ").push_bind(provider);
    }
    if let Some(event_type) = &query.event_type {
        sql.push(" AND event_type = ").push_bind(event_type);
    }
    if !query.statuses.is_empty() {
        sql.push(" AND status = ANY(").push_bind(query.statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        sql.push(")");
    }
    for (bound, op) in [(&query.since, ">="), (&query.until, "<")] {
        match bound {
            Some(Since::Ago(d)) => {
                sql.push(format_args!(" AND received_at {op} now() - "));
                sql.push_bind(d.as_millis() as i64).push(" * interval '1 millisecond'");
            }
            Some(Since::At(t)) => {
                sql.push(format_args!(" AND received_at {op} ")).push_bind(t).push("::timestamptz");
            }
            None => {}
        }
    }
    match &query.event_id {
        Some(IdMatch::Exact(id)) => {
            sql.push(" AND event_id = ").push_bind(id);
            if query.provider.is_none() {
                // The key is (provider, event_id): one probe per provider stored,
                // the providers found by walking the key (a loose index scan).
                sql.push(
                    " AND provider IN (WITH RECURSIVE p(name) AS (
                         SELECT min(provider) FROM webhook_inbox
                         UNION ALL
                         SELECT (SELECT min(provider) FROM webhook_inbox WHERE provider > p.name)
                         FROM p WHERE p.name IS NOT NULL)
                     SELECT name FROM p WHERE name IS NOT NULL)",
                );
            }
        }
        Some(IdMatch::Prefix(prefix)) => {
            // Under the C collation, as `webhook_inbox_event_id_idx` orders ids: a range of it.
            sql.push(" AND starts_with(event_id COLLATE \"C\", ").push_bind(prefix).push(")");
        }
        None => {}
    }
    match &query.payload {
        Some(PayloadMatch::Text(text)) => {
            sql.push(" AND strpos(payload::text, ").push_bind(text).push(") > 0");
        }
        Some(PayloadMatch::Json(json)) => {
            sql.push(" AND payload @> ").push_bind(Json(json)).push("::jsonb");
        }
        None => {}
    }
    if let Some(after) = after {
        sql.push(" AND (received_at, provider, event_id) < (").push_bind(&after.received_at).push("::timestamptz, ");
        sql.push_bind(&after.provider).push(", ").push_bind(&after.event_id).push(")");
    }
    // `w.`: the column, not the output of the same name (text, which no index orders).
    sql.push(" ORDER BY w.received_at DESC, w.provider DESC, w.event_id DESC LIMIT ").push_bind(limit + 1);
    // Unnamed, so planned each time for its values: a prefix becomes a range
    // of the index, and no generic plan is ever kept for a filter that needs its value.
    let listing = super::built_query_as(&mut sql).persistent(false);
    let mut events: Vec<EventSummary> = if query.payload.is_some() {
        let mut tx = pool.begin().await?;
        super::query("SELECT set_config('statement_timeout', $1, true)")
            .bind(SEARCH_TIMEOUT.as_millis().to_string())
            .execute(&mut *tx)
            .await?;
        let events = listing.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        events
    } else {
        listing.fetch_all(super::Autocommit(pool)).await?
    };
    let more = events.len() as i64 > limit;
    events.truncate(limit as usize);
    let next = events.last().filter(|_| more).map(|e| Cursor {
        received_at: e.received_at.clone(),
        provider: e.provider.clone(),
        event_id: e.event_id.clone(),
    });
    Ok(EventPage { events, next })
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
    /// No such event.
    NotFound,
}

/// Puts one event (done, failed or unhandled) back to `pending`, attempts
/// reset, with an audit record, in one statement.
pub async fn replay(pool: &PgPool, provider: &str, event_id: &str, by: &Requeue<'_>) -> Result<Replayed, sqlx::Error> {
    let row: Option<(String, bool, bool)> = super::query_as(
        "WITH picked AS (
             SELECT provider, event_id, status, attempts, failure_reason,
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
         SELECT status, status = 'pending', replayable FROM picked",
    )
    .bind(provider)
    .bind(event_id)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(match row {
        None => Replayed::NotFound,
        Some((_, true, _)) => Replayed::AlreadyPending,
        Some((_, false, false)) => Replayed::WithoutPayload,
        Some((from, false, true)) => Replayed::Requeued { from },
    })
}

/// One stored event in full, as `inbox show` prints it. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredEvent {
    /// The provider's name.
    pub provider: String,
    /// The event's id.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// `pending`, `done`, `unhandled` or `failed`.
    pub status: String,
    /// How it arrived: `webhook`, or `reconcile` (fetched from the provider's API, unsigned).
    pub source: String,
    /// Attempts made.
    pub attempts: i32,
    /// When receive claimed it.
    pub received_at: String,
    /// When a worker finished with it.
    pub processed_at: Option<String>,
    /// When a worker tries it next (an event in backoff).
    pub next_attempt_at: Option<String>,
    /// Why it failed (or last failed).
    pub failure_reason: Option<String>,
    /// The delivery's headers that were kept (a repeated header as an array of its values).
    pub headers: Json<serde_json::Value>,
    /// The payload as `jsonb` (none for a body that was never usable).
    pub payload: Option<Json<serde_json::Value>>,
    /// The signed bytes: the row's own, or its batch's (`webhook_bodies`).
    pub raw_body: Vec<u8>,
    /// The position of the secret that verified it, in the list configured then.
    pub secret_index: Option<i16>,
    /// The fingerprint of the secret that verified it (rows stored before fingerprints have none).
    pub secret_fingerprint: Option<String>,
    /// When it was received, in Unix seconds (re-verification checks the timestamp against it).
    pub received_epoch: i64,
}

/// The event `event_id` of `provider`, in full, if it is stored.
pub async fn stored_event(pool: &PgPool, provider: &str, event_id: &str) -> Result<Option<StoredEvent>, sqlx::Error> {
    super::query_as(
        "SELECT w.provider, w.event_id, w.event_type, w.status, w.source, w.attempts, w.received_at::text,
                w.processed_at::text, w.next_attempt_at::text, w.failure_reason, w.headers, w.payload,
                coalesce(b.raw_body, w.raw_body) AS raw_body, w.secret_index, w.secret_fingerprint,
                extract(epoch FROM w.received_at)::bigint AS received_epoch
         FROM webhook_inbox AS w LEFT JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256
         WHERE w.provider = $1 AND w.event_id = $2",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_optional(super::Autocommit(pool))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_or_a_timestamp() {
        assert!(matches!(Since::parse("90m"), Ok(Since::Ago(d)) if d == Duration::from_secs(5400)));
        assert!(matches!(Since::parse("7d"), Ok(Since::Ago(d)) if d == Duration::from_secs(7 * 86_400)));
        assert!(matches!(Since::parse("2026-11-30 08:00Z"), Ok(Since::At(_))));
        for bad in ["", "h", "5 weeks", "99999999999999999999h", "yesterday"] {
            assert!(Since::parse(bad).is_err(), "{bad:?}");
        }
    }
}
