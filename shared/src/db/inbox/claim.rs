//! The claim: one event, a delivery's events, or a group of deliveries, each
//! inserted unless its key exists.

use sqlx::{types::Json, PgExecutor};

use crate::db;
use webhook_inbox_schemes::{NewEvent, Provider};

/// What the delivery carried besides its events: shared by every row it makes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Envelope<'a> {
    pub provider: Provider,
    pub raw_body: &'a [u8],
    pub headers: &'a serde_json::Value,
    /// Which configured secret verified the delivery; `None` for an event that
    /// reconcile fetched from the provider's API (stored with `source = 'reconcile'`).
    pub secret_index: Option<i16>,
    /// That secret's [`webhook_inbox_schemes::secret::Secret::fingerprint`], where known.
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

/// What claiming one event came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Its row was inserted: the inbox's now.
    New,
    /// Its key was there already.
    Duplicate,
    /// Its signed bytes were claimed already, under another id: a captured delivery sent again.
    Replay,
}

/// The body of a delivery with several events, stored once, and only when
/// one of its events is new: a redelivery whose events are all stored (or
/// erased) stores no body (an erased event's data would come back with it).
/// The upsert locks that row until commit, so retention cannot delete a body
/// that a new row points at. `$7` is the raw body; the rows point at its SHA-256.
macro_rules! with_shared_body {
    ($insert:literal) => {
        concat!(
            "WITH inserted AS (",
            $insert,
            "),
body AS (
    INSERT INTO webhook_bodies (sha256, raw_body) SELECT sha256($7::bytea), $7 WHERE EXISTS (SELECT 1 FROM inserted)
    ON CONFLICT (sha256) DO UPDATE SET last_seen_at = now())
SELECT event_id FROM inserted"
        )
    };
}

/// [`INSERT`] for one item of a delivery with several events.
const INSERT_ITEM: &str = with_shared_body!(
    "INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, body_sha256, headers, secret_index, source, secret_fingerprint,
     trace_context)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, sha256($7::bytea), $8, $9,
        CASE WHEN $9 IS NULL THEN 'reconcile' ELSE 'webhook' END, $10, $11)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING event_id"
);

/// Every item of a batch in one `unnest` statement, keys sorted.
const INSERT_BATCH: &str = with_shared_body!(
    "INSERT INTO webhook_inbox
    (provider, event_id, event_type, payload, status, failure_reason, body_sha256, headers, secret_index, source, secret_fingerprint,
     trace_context)
SELECT $1, e.event_id, e.event_type, e.payload::jsonb, e.status, e.failure_reason, sha256($7::bytea), $8, $9,
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
) -> Result<Claim, sqlx::Error> {
    if env.replay_guard && body == Body::InRow {
        let (inserted, first): (Option<String>, Option<String>) = db::query_as(INSERT_GUARDED)
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
            (Some(_), _) => Claim::New,
            (None, Some(first)) if first != e.event_id => Claim::Replay,
            (None, _) => Claim::Duplicate,
        });
    }
    let sql = match body {
        Body::InRow => INSERT,
        Body::Shared => INSERT_ITEM,
    };
    let row: Option<(String,)> = db::query_as(sql)
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
    Ok(if row.is_some() { Claim::New } else { Claim::Duplicate })
}

/// Inserts events with distinct keys, sorted, in one statement; the ids inserted.
pub(crate) async fn insert_batch<'e>(
    ex: impl PgExecutor<'e>,
    env: &Envelope<'_>,
    unique: &[&NewEvent],
) -> Result<Vec<String>, sqlx::Error> {
    let col = |f: fn(&NewEvent) -> Option<&str>| unique.iter().map(|e| f(e)).collect::<Vec<_>>();
    let rows: Vec<(String,)> = db::query_as(INSERT_BATCH)
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

/// A delivery of one event, to claim with its group.
pub(crate) struct GroupRow {
    pub provider: Provider,
    pub event: NewEvent,
    pub raw_body: Vec<u8>,
    pub headers: serde_json::Value,
    pub secret_index: Option<i16>,
    pub secret_fingerprint: Option<String>,
    /// The delivery's receive span (`trace_context`), when traces are on.
    pub trace_context: Option<String>,
}

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
pub(crate) async fn insert_group<'e, 'r>(
    ex: impl PgExecutor<'e>,
    group: impl Iterator<Item = &'r GroupRow> + Clone,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let col = |f: fn(&'r GroupRow) -> Option<&'r str>| group.clone().map(f).collect::<Vec<_>>();
    db::query_as(INSERT_GROUP)
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

/// The 64-bit advisory lock key of an event: the first 8 bytes of
/// SHA-256("provider:event_id"), big-endian, signed. Stable across processes
/// and versions, unlike `hashtext`, and 64 bits wide.
fn advisory_key(provider: Provider, event_id: &str) -> i64 {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("{provider}:{event_id}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// `pg_try_advisory_xact_lock` on the event's key: transaction-scoped (safe behind
/// transaction-mode poolers), released at commit or rollback; false if held elsewhere.
pub(crate) async fn try_lock_event(
    conn: &mut sqlx::PgConnection,
    provider: Provider,
    event_id: &str,
) -> Result<bool, sqlx::Error> {
    db::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(advisory_key(provider, event_id))
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_keys_are_the_first_8_bytes_of_sha256_big_endian() {
        // docs/webhook-inbox-article.txt, section 5.2, in Python: int.from_bytes(sha256(b"stripe:evt_1").digest()[:8], "big", signed=True)
        assert_eq!(advisory_key(Provider::STRIPE, "evt_1"), 607058759724208493);
        assert_ne!(advisory_key(Provider::STRIPE, "evt_1"), advisory_key(Provider::SHOPIFY, "evt_1"));
    }
}
