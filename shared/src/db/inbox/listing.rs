//! The console's and `inbox events`' listing, a page at a time, and one stored event in full.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{types::Json, PgPool};

use webhook_inbox_schemes::text::rfc3339;

use crate::{
    core::{
        selection::{Cursor, EventQuery, IdMatch, PayloadMatch, Since},
        status::Status,
    },
    db,
};

/// How long a listing that searches payloads may run before PostgreSQL stops it.
pub const SEARCH_TIMEOUT: Duration = Duration::from_secs(3);

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
        "SELECT provider, event_id, event_type, status, attempts, to_json(received_at)#>>'{}' AS received_at,
                failure_reason
         FROM webhook_inbox AS w WHERE true",
    );
    push_filters(&mut sql, query);
    if let Some(after) = after {
        sql.push(" AND (received_at, provider, event_id) < (").push_bind(&after.received_at).push("::timestamptz, ");
        sql.push_bind(&after.provider).push(", ").push_bind(&after.event_id).push(")");
    }
    // `w.`: the column, not the output of the same name (text, which no index orders).
    sql.push(" ORDER BY w.received_at DESC, w.provider DESC, w.event_id DESC LIMIT ").push_bind(limit + 1);
    // Unnamed, so planned each time for its values: a prefix becomes a range
    // of the index, and no generic plan is ever kept for a filter that needs its value.
    let listing = db::built_query_as(&mut sql).persistent(false);
    let mut events: Vec<EventSummary> = if query.payload.is_some() {
        let mut tx = pool.begin().await?;
        db::query("SELECT set_config('statement_timeout', $1, true)")
            .bind(SEARCH_TIMEOUT.as_millis().to_string())
            .execute(&mut *tx)
            .await?;
        let events = listing.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        events
    } else {
        listing.fetch_all(db::Autocommit(pool)).await?
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

/// Appends `query`'s filters, each given one only (` AND ...`), to a
/// statement over `webhook_inbox AS w`.
pub(super) fn push_filters<'a>(sql: &mut sqlx::QueryBuilder<'a, sqlx::Postgres>, query: &'a EventQuery) {
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
}

/// One stored event in full, as `inbox show` prints it. Times are in UTC
/// (written as the API writes them by [`rfc3339`](crate::ops::rfc3339)).
/// Its `Debug` shows the raw bytes as text (escaped, the first 512 bytes), not as numbers.
#[derive(Clone)]
pub struct StoredEvent {
    /// The provider's name.
    pub provider: String,
    /// The event's id.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// Where it stands.
    pub status: Status,
    /// How it arrived: `webhook`, or `reconcile` (fetched from the provider's API, unsigned).
    pub source: String,
    /// Attempts made.
    pub attempts: i32,
    /// When receive claimed it (re-verification checks a signed timestamp against it).
    pub received_at: SystemTime,
    /// When a worker finished with it.
    pub processed_at: Option<SystemTime>,
    /// When a worker tries it next (an event in backoff).
    pub next_attempt_at: Option<SystemTime>,
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
    /// The pause holding it (`inbox pauses`), while one does.
    pub held_by: Option<i64>,
    /// When it was erased ([`crate::ops::erase`]; its payload, bytes and headers are gone), and by whom.
    pub erased_at: Option<SystemTime>,
    /// Who erased it.
    pub erased_by: Option<String>,
    /// When it was put back from prune's archive (`inbox restore`), if it was.
    pub restored_at: Option<SystemTime>,
    /// When its raw bytes went with its batch's body, erased with another
    /// event of the batch (it keeps its own payload).
    pub raw_erased_at: Option<SystemTime>,
}

impl std::fmt::Debug for StoredEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.raw_body[..self.raw_body.len().min(512)];
        let raw_body = format!("{} bytes: {:?}", self.raw_body.len(), String::from_utf8_lossy(shown));
        let time = |t: &Option<SystemTime>| t.map(rfc3339);
        f.debug_struct("StoredEvent")
            .field("provider", &self.provider)
            .field("event_id", &self.event_id)
            .field("event_type", &self.event_type)
            .field("status", &self.status)
            .field("source", &self.source)
            .field("attempts", &self.attempts)
            .field("received_at", &rfc3339(self.received_at))
            .field("processed_at", &time(&self.processed_at))
            .field("next_attempt_at", &time(&self.next_attempt_at))
            .field("failure_reason", &self.failure_reason)
            .field("headers", &self.headers)
            .field("payload", &self.payload)
            .field("raw_body", &format_args!("{raw_body}"))
            .field("secret_index", &self.secret_index)
            .field("secret_fingerprint", &self.secret_fingerprint)
            .field("held_by", &self.held_by)
            .field("erased_at", &time(&self.erased_at))
            .field("erased_by", &self.erased_by)
            .field("restored_at", &time(&self.restored_at))
            .field("raw_erased_at", &time(&self.raw_erased_at))
            .finish()
    }
}

/// A stored event as the query reads it: its status as text, its times in
/// Unix microseconds (sqlx is built without a date-time crate).
#[derive(sqlx::FromRow)]
struct StoredRow {
    provider: String,
    event_id: String,
    event_type: String,
    status: String,
    source: String,
    attempts: i32,
    received_at: i64,
    processed_at: Option<i64>,
    next_attempt_at: Option<i64>,
    failure_reason: Option<String>,
    headers: Json<serde_json::Value>,
    payload: Option<Json<serde_json::Value>>,
    raw_body: Vec<u8>,
    secret_index: Option<i16>,
    secret_fingerprint: Option<String>,
    held_by: Option<i64>,
    erased_at: Option<i64>,
    erased_by: Option<String>,
    restored_at: Option<i64>,
    raw_erased_at: Option<i64>,
}

/// Unix microseconds as a time.
fn at(micros: i64) -> SystemTime {
    let since = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + since
    } else {
        UNIX_EPOCH - since
    }
}

impl TryFrom<StoredRow> for StoredEvent {
    type Error = sqlx::Error;

    fn try_from(r: StoredRow) -> Result<StoredEvent, sqlx::Error> {
        let status = Status::parse(&r.status)
            .ok_or_else(|| sqlx::Error::Decode(format!("{:?} is not an event's status", r.status).into()))?;
        Ok(StoredEvent {
            provider: r.provider,
            event_id: r.event_id,
            event_type: r.event_type,
            status,
            source: r.source,
            attempts: r.attempts,
            received_at: at(r.received_at),
            processed_at: r.processed_at.map(at),
            next_attempt_at: r.next_attempt_at.map(at),
            failure_reason: r.failure_reason,
            headers: r.headers,
            payload: r.payload,
            raw_body: r.raw_body,
            secret_index: r.secret_index,
            secret_fingerprint: r.secret_fingerprint,
            held_by: r.held_by,
            erased_at: r.erased_at.map(at),
            erased_by: r.erased_by,
            restored_at: r.restored_at.map(at),
            raw_erased_at: r.raw_erased_at.map(at),
        })
    }
}

/// The event `event_id` of `provider`, in full, if it is stored.
pub async fn stored_event(pool: &PgPool, provider: &str, event_id: &str) -> Result<Option<StoredEvent>, sqlx::Error> {
    let row: Option<StoredRow> = db::query_as(
        "SELECT w.provider, w.event_id, w.event_type, w.status, w.source, w.attempts,
                (extract(epoch FROM w.received_at) * 1000000)::bigint AS received_at,
                (extract(epoch FROM w.processed_at) * 1000000)::bigint AS processed_at,
                (extract(epoch FROM w.next_attempt_at) * 1000000)::bigint AS next_attempt_at,
                w.failure_reason, w.headers, w.payload,
                coalesce(b.raw_body, w.raw_body, '') AS raw_body, w.secret_index, w.secret_fingerprint, w.held_by,
                (extract(epoch FROM w.erased_at) * 1000000)::bigint AS erased_at, w.erased_by,
                (extract(epoch FROM w.restored_at) * 1000000)::bigint AS restored_at,
                (extract(epoch FROM w.raw_erased_at) * 1000000)::bigint AS raw_erased_at
         FROM webhook_inbox AS w LEFT JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256
         WHERE w.provider = $1 AND w.event_id = $2",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_optional(db::Autocommit(pool))
    .await?;
    row.map(StoredEvent::try_from).transpose()
}

/// An event as an ignore rule reads it: the payload only where it is `LIKE`
/// one of `ruled` (a condition reads it).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RuledEvent {
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    pub payload: Option<String>,
}

/// Up to `limit` events of `providers` after `after` in key order (the primary
/// key's index, a short statement a page), received in the last `since` if set.
pub(crate) async fn ruled_events(
    pool: &PgPool,
    (providers, ruled): (&[String], &[String]),
    after: &(String, String),
    since: Option<Duration>,
    limit: i64,
) -> Result<Vec<RuledEvent>, sqlx::Error> {
    db::query_as(
        "SELECT provider, event_id, event_type,
                CASE WHEN provider || ':' || event_type LIKE ANY($2) THEN payload::text END AS payload
         FROM webhook_inbox
         WHERE provider = ANY($1) AND (provider, event_id) > ($3, $4)
           AND ($5::bigint IS NULL OR received_at > now() - $5 * interval '1 millisecond')
         ORDER BY provider, event_id
         LIMIT $6",
    )
    .bind(providers)
    .bind(ruled)
    .bind(&after.0)
    .bind(&after.1)
    .bind(since.map(|s| s.as_millis() as i64))
    .bind(limit)
    .fetch_all(db::Autocommit(pool))
    .await
}
