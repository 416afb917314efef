//! Prune's archive: the rows a retention batch is about to delete, read with
//! every column and locked until they are deleted; and restore's insert.

use serde_json::value::RawValue;
use sqlx::{types::Json, PgExecutor};

use super::prune::{bind_due, due, Providers};
use crate::{core::status::Status, db};

/// An inbox row as prune's archive keeps it: one line of JSON, every column
/// (times in UTC, RFC 3339; the raw bytes base64; a batch body's digest hex).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct ArchivedEvent {
    /// The line's format: 1.
    #[serde(default = "format_one")]
    pub v: i32,
    /// The provider's name.
    pub provider: String,
    /// The event's id.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// `done`, `unhandled`, `ignored` or `failed` (retention takes no other).
    pub status: String,
    /// `webhook` or `reconcile`.
    pub source: String,
    /// When receive claimed it.
    pub received_at: String,
    /// When a worker finished with it.
    pub processed_at: Option<String>,
    /// When a worker was to try it next.
    pub next_attempt_at: Option<String>,
    /// Attempts made.
    pub attempts: i32,
    /// Why it failed (or the ignore rule that matched it).
    pub failure_reason: Option<String>,
    /// The payload exactly as stored (`jsonb`'s numbers are not rounded through `f64`).
    pub payload: Option<Json<Box<RawValue>>>,
    /// The delivery's headers that were kept.
    pub headers: Json<Box<RawValue>>,
    /// The signed bytes, base64: the row's own; or, for a batch item, its
    /// batch's body, on the first line of an archive object that points at it.
    pub raw_body: Option<String>,
    /// A batch item's body (`webhook_bodies`), by its SHA-256, hex.
    pub body_sha256: Option<String>,
    /// The position of the secret that verified it.
    pub secret_index: Option<i16>,
    /// That secret's fingerprint.
    pub secret_fingerprint: Option<String>,
    /// The W3C trace context it was received under.
    pub trace_context: Option<String>,
    /// When it was erased (its payload and bytes are gone), and by whom.
    pub erased_at: Option<String>,
    /// Who erased it.
    pub erased_by: Option<String>,
    /// When it was restored from an archive before.
    pub restored_at: Option<String>,
    /// When its raw bytes went with another event of its batch, erased (lines
    /// written before there was such a thing have none).
    #[serde(default)]
    pub raw_erased_at: Option<String>,
}

fn format_one() -> i32 {
    1
}

/// A timestamp column as RFC 3339 in UTC, whatever the session's time zone.
macro_rules! utc {
    ($col:literal) => {
        concat!("to_char(", $col, " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS ", $col)
    };
}

/// Locks and reads up to `limit` rows past retention (the rows
/// [`delete_received_before`] would delete), every column, for the archive;
/// delete them with [`delete_keys`] in the same transaction once stored.
pub(crate) async fn archive_received_before<'e>(
    ex: impl PgExecutor<'e>,
    providers: Providers<'_>,
    statuses: &[Status],
    days: u32,
    limit: i64,
) -> Result<Vec<ArchivedEvent>, sqlx::Error> {
    let query = db::query_as(concat!(
        "SELECT 1 AS v, provider, event_id, event_type, status, source, ",
        utc!("received_at"),
        ", ",
        utc!("processed_at"),
        ", ",
        utc!("next_attempt_at"),
        ", attempts, failure_reason, payload, headers,
         translate(encode(raw_body, 'base64'), E'\\n', '') AS raw_body, encode(body_sha256, 'hex') AS body_sha256,
         secret_index, secret_fingerprint, trace_context, ",
        utc!("erased_at"),
        ", erased_by, ",
        utc!("restored_at"),
        ", ",
        utc!("raw_erased_at"),
        " FROM webhook_inbox WHERE ",
        due!()
    ));
    bind_due!(query, providers, statuses, days, limit).fetch_all(ex).await
}

/// Batch bodies by their digests (hex), as (digest, base64 bytes).
pub(crate) async fn bodies_base64<'e>(
    ex: impl PgExecutor<'e>,
    sha256: &[String],
) -> Result<Vec<(String, String)>, sqlx::Error> {
    db::query_as(
        "SELECT encode(sha256, 'hex'), translate(encode(raw_body, 'base64'), E'\\n', '')
         FROM webhook_bodies WHERE sha256 = ANY(SELECT decode(h, 'hex') FROM unnest($1::text[]) AS h)",
    )
    .bind(sha256)
    .fetch_all(ex)
    .await
}

/// Deletes these rows (locked by [`archive_received_before`]).
pub(crate) async fn delete_keys<'e>(ex: impl PgExecutor<'e>, keys: &[(&str, &str)]) -> Result<u64, sqlx::Error> {
    let (providers, ids): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
    let done = db::query(
        "DELETE FROM webhook_inbox AS w USING unnest($1::text[], $2::text[]) AS k(provider, event_id)
         WHERE w.provider = k.provider AND w.event_id = k.event_id",
    )
    .bind(providers)
    .bind(ids)
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}

/// Inserts archived rows as they were (a batch body with them, once), marked
/// restored now, each with an audit record (`restore` by `actor`, for
/// `reason`); a key already stored is left as it is. Returns the keys inserted.
pub(crate) async fn restore<'e>(
    ex: impl PgExecutor<'e>,
    events: &[ArchivedEvent],
    actor: &str,
    reason: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    db::query_as(
        "WITH r AS (
             SELECT * FROM jsonb_to_recordset($1::jsonb) AS r(
                 provider text, event_id text, event_type text, status text, source text,
                 received_at timestamptz, processed_at timestamptz, next_attempt_at timestamptz,
                 attempts integer, failure_reason text, payload jsonb, headers jsonb,
                 raw_body text, body_sha256 text, secret_index smallint, secret_fingerprint text,
                 trace_context text, erased_at timestamptz, erased_by text, raw_erased_at timestamptz)),
         bodies AS (
             INSERT INTO webhook_bodies (sha256, raw_body)
             SELECT decode(body_sha256, 'hex'), decode(raw_body, 'base64') FROM r
             WHERE body_sha256 IS NOT NULL AND raw_body IS NOT NULL
             ON CONFLICT (sha256) DO NOTHING),
         inserted AS (
             INSERT INTO webhook_inbox (provider, event_id, event_type, status, source, received_at, processed_at,
                                        next_attempt_at, attempts, failure_reason, payload, headers, raw_body,
                                        body_sha256, secret_index, secret_fingerprint, trace_context, erased_at,
                                        erased_by, raw_erased_at, restored_at)
             SELECT provider, event_id, event_type, status, source, received_at, processed_at,
                    next_attempt_at, attempts, failure_reason, payload, headers,
                    CASE WHEN body_sha256 IS NULL THEN decode(raw_body, 'base64') END,
                    decode(body_sha256, 'hex'), secret_index, secret_fingerprint, trace_context, erased_at,
                    erased_by, raw_erased_at, now()
             FROM r
             ON CONFLICT (provider, event_id) DO NOTHING
             RETURNING provider, event_id, status, attempts)
         INSERT INTO inbox_audit (actor, action, reason, provider, event_id, from_status, attempts)
         SELECT $2, 'restore', $3, provider, event_id, status, attempts FROM inserted
         RETURNING provider, event_id",
    )
    .bind(Json(events))
    .bind(actor)
    .bind(reason)
    .fetch_all(ex)
    .await
}
