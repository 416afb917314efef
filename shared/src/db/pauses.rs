//! `inbox_pauses`: processing paused by an operator, by provider or by
//! provider and event type (`inbox pause`). Receive keeps claiming; the
//! worker leaves a paused scope's events pending, spending no attempt, and
//! marks each `held_by` its pause the first time it meets it (then it has left
//! the worker's queue index). A resume releases them oldest first, in chunks,
//! behind a frontier, then deletes the pause.
//!
//! Exactness comes from one advisory lock, the gate: every processor (a worker
//! batch, the SQS path, inline receive's handlers) holds it shared for its
//! transaction and reads the pauses in a later statement; a pause, and the
//! last step of a resume, take it exclusive. So no event of a scope is
//! processed once its pause has committed (the pause waits for the batches in
//! flight, at most one each), and no event is held by a pause that is gone.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use super::inbox::Audit;
use webhook_inbox_schemes::Provider;

/// The gate's key, in the two-int form (`inbx`, 1): it cannot meet the
/// events' locks (one bigint) or the migrations'.
const GATE: (i32, i32) = (0x696e_6278, 1);

/// How long a pause, or a resume's last step, waits for the batches in flight
/// before it gives up ("busy, try again"): a batch is seconds at most.
const GATE_WAIT: &str = "30s";

/// Held events a resume releases per transaction.
pub const RELEASE_CHUNK: i64 = 5_000;

/// What a pause covers: one provider's events, or only those of one type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Scope {
    /// The provider's name.
    pub provider: String,
    /// Exactly this event type; every type when `None`.
    pub event_type: Option<String>,
}

impl Scope {
    /// A scope, checked: a known provider (built in or declared), a type of 1 to 128 characters.
    pub fn new(provider: &str, event_type: Option<&str>) -> Result<Scope, String> {
        Provider::try_from(provider).map_err(|e| e.to_string())?;
        if let Some(t) = event_type {
            if t.is_empty() || t.len() > 128 {
                return Err(format!("an event type is 1 to 128 bytes (this one is {} bytes)", t.len()));
            }
        }
        Ok(Scope { provider: provider.to_string(), event_type: event_type.map(str::to_string) })
    }
}

impl std::fmt::Display for Scope {
    /// `shopify`, or `shopify orders/paid` (the type as stored: escape it for a terminal or a page).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.event_type {
            Some(t) => write!(f, "{} {t}", self.provider),
            None => f.write_str(&self.provider),
        }
    }
}

/// A pause as `inbox pauses`, the console and the gauges show it. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pause {
    /// Its number, as `held_by` and the audit records name it.
    pub id: i64,
    /// The provider paused.
    pub provider: String,
    /// The type paused; every type of the provider when `None`.
    pub event_type: Option<String>,
    /// Since when.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub paused_at: String,
    /// Who paused it.
    pub paused_by: String,
    /// Why.
    pub reason: String,
    /// How long it has been paused, in milliseconds.
    pub age_ms: f64,
    /// After how long it is overdue (`overdue_pauses`, the `PauseOverdue` alarm), in milliseconds.
    pub alarm_after_ms: f64,
    /// Since when a resume is releasing its events (none: paused).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub resuming_at: Option<String>,
    /// Events it holds now.
    pub held: i64,
    /// Events a resume under way has released so far.
    pub released: i64,
}

impl Pause {
    /// Its scope.
    pub fn scope(&self) -> Scope {
        Scope { provider: self.provider.clone(), event_type: self.event_type.clone() }
    }

    /// `paused`, or `resuming` while a resume releases its events.
    pub fn state(&self) -> &'static str {
        if self.resuming_at.is_some() {
            "resuming"
        } else {
            "paused"
        }
    }

    /// Whether it has been paused longer than its alarm allows.
    pub fn overdue(&self) -> bool {
        self.age_ms > self.alarm_after_ms
    }
}

/// Takes the gate shared for `conn`'s transaction (every processor, before the
/// statement that reads the pauses: that statement's snapshot then sees every
/// pause committed before). Returns a pause whose resume is under way, if
/// any, and the release epoch (bumped by every release).
pub(crate) async fn enter(conn: &mut PgConnection) -> Result<(Option<i64>, i64), sqlx::Error> {
    super::query_as(
        "SELECT (SELECT id FROM inbox_pauses WHERE resuming_at IS NOT NULL ORDER BY id LIMIT 1),
                (SELECT epoch FROM inbox_pause_epoch)
         FROM (SELECT pg_advisory_xact_lock_shared($1, $2)) AS gate",
    )
    .bind(GATE.0)
    .bind(GATE.1)
    .fetch_one(conn)
    .await
}

/// Inline receive, after its claim: takes the gate shared for `conn`'s
/// transaction, then which of `provider`'s types are paused (`None`: all),
/// resuming or not (the worker takes those in order).
pub(crate) async fn paused_types(conn: &mut PgConnection, provider: &str) -> Result<Vec<Option<String>>, sqlx::Error> {
    enter(&mut *conn).await?;
    super::query_scalar("SELECT event_type FROM inbox_pauses WHERE provider = $1").bind(provider).fetch_all(conn).await
}

/// Takes the gate exclusive for `conn`'s transaction: waits for the processors in flight.
async fn close(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    super::query("SELECT set_config('lock_timeout', $3, true), pg_advisory_xact_lock($1, $2)")
        .bind(GATE.0)
        .bind(GATE.1)
        .bind(GATE_WAIT)
        .execute(conn)
        .await?;
    Ok(())
}

/// Pauses `scope` under `by` (one audit record), for an alarm after
/// `alarm_after`: from its commit, no event of the scope is processed; they
/// are received (200) and wait, pending, spending no attempt. A scope whose
/// resume is under way is paused again (what was released and not yet taken
/// is held again). False when it was paused already. Waits for the batches in
/// flight (at most 30 s, then an error: try again).
pub async fn pause(pool: &PgPool, scope: &Scope, alarm_after: Duration, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    close(&mut tx).await?;
    let paused: i64 = super::query_scalar(
        "WITH paused AS (
             INSERT INTO inbox_pauses AS p (provider, event_type, paused_by, reason, alarm_after)
             VALUES ($1, $2, $3, $5, $6 * interval '1 millisecond')
             ON CONFLICT ON CONSTRAINT one_pause_per_scope DO UPDATE
                 SET paused_at = now(), paused_by = $3, reason = $5, alarm_after = excluded.alarm_after,
                     resuming_at = NULL, released_to_at = NULL, released_to_id = NULL, released = 0
                 WHERE p.resuming_at IS NOT NULL
             RETURNING id),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_type, pause_id, from_status, attempts)
             SELECT $3, $4, $5, $1, $2, id, 'running', 0 FROM paused)
         SELECT count(*) FROM paused",
    )
    .bind(&scope.provider)
    .bind(&scope.event_type)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .bind(alarm_after.as_millis() as i64)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(paused == 1)
}

/// Starts resuming `scope` under `by` (one audit record): its held events
/// are released oldest first by [`release`], called by `inbox resume` and by
/// every worker's pass until the pause is gone. Returns the pause's number,
/// also when a resume was under way already; `None` when it is not paused.
pub async fn resume(pool: &PgPool, scope: &Scope, by: &Audit<'_>) -> Result<Option<i64>, sqlx::Error> {
    super::query_scalar(
        "WITH p AS (
             SELECT id, resuming_at FROM inbox_pauses
             WHERE provider = $1 AND event_type IS NOT DISTINCT FROM $2),
         started AS (
             UPDATE inbox_pauses SET resuming_at = now()
             WHERE id = (SELECT id FROM p) AND resuming_at IS NULL
             RETURNING id),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_type, pause_id, from_status, attempts)
             SELECT $3, $4, $5, $1, $2, id, 'paused', 0 FROM started)
         SELECT id FROM p",
    )
    .bind(&scope.provider)
    .bind(&scope.event_type)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_optional(super::Autocommit(pool))
    .await
}

/// What one [`release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Released {
    /// A chunk of held events released, more to come.
    Some(u64),
    /// The last of them released and the pause deleted: the scope is processed again.
    Resumed(u64),
    /// Another process is releasing this pause's events now.
    Busy,
    /// No such pause is resuming (resumed already, or paused again).
    NotResuming,
}

/// One step of resuming pause `id`: up to `chunk` of its held events
/// released, the oldest first, the frontier moved past them in the same
/// transaction (the scope's newer events stay held: the scope is taken in
/// receive order); when fewer were left, the rest released and the pause
/// deleted, with an audit record (`resumed`, by `inbox`).
pub async fn release(pool: &PgPool, id: i64, chunk: i64) -> Result<Released, sqlx::Error> {
    let (locked, n): (i64, i64) = super::query_as(
        "WITH p AS (
             SELECT id, released_to_at, released_to_id FROM inbox_pauses
             WHERE id = $1 AND resuming_at IS NOT NULL FOR UPDATE SKIP LOCKED),
         r AS (
             SELECT w.provider, w.event_id, w.received_at FROM webhook_inbox w, p
             WHERE w.status = 'pending' AND w.held_by = p.id
               AND (p.released_to_at IS NULL OR (w.received_at, w.event_id) > (p.released_to_at, p.released_to_id))
             ORDER BY w.received_at, w.event_id LIMIT $2
             FOR UPDATE OF w),
         u AS (
             UPDATE webhook_inbox w SET held_by = NULL FROM r
             WHERE w.provider = r.provider AND w.event_id = r.event_id),
         l AS (SELECT received_at, event_id FROM r ORDER BY received_at DESC, event_id DESC LIMIT 1),
         f AS (
             UPDATE inbox_pauses SET released_to_at = l.received_at, released_to_id = l.event_id,
                                     released = released + (SELECT count(*) FROM r)
             FROM l WHERE id = $1),
         e AS (UPDATE inbox_pause_epoch SET epoch = epoch + 1 WHERE EXISTS (SELECT 1 FROM l))
         SELECT (SELECT count(*) FROM p), (SELECT count(*) FROM r)",
    )
    .bind(id)
    .bind(chunk)
    .fetch_one(super::Autocommit(pool))
    .await?;
    if locked == 0 {
        let resuming: Option<bool> =
            super::query_scalar("SELECT resuming_at IS NOT NULL FROM inbox_pauses WHERE id = $1")
                .bind(id)
                .fetch_optional(super::Autocommit(pool))
                .await?;
        return Ok(if resuming == Some(true) { Released::Busy } else { Released::NotResuming });
    }
    if n >= chunk {
        return Ok(Released::Some(n as u64));
    }
    // The last step, under the gate: the tail, and any event a batch held
    // behind the frontier meanwhile, then the pause goes.
    let mut tx = pool.begin().await?;
    close(&mut tx).await?;
    let (gone, tail): (i64, i64) = super::query_as(
        "WITH p AS (DELETE FROM inbox_pauses WHERE id = $1 AND resuming_at IS NOT NULL RETURNING *),
         u AS (
             UPDATE webhook_inbox SET held_by = NULL
             WHERE status = 'pending' AND held_by = $1 AND EXISTS (SELECT 1 FROM p)
             RETURNING 1),
         e AS (UPDATE inbox_pause_epoch SET epoch = epoch + 1 WHERE EXISTS (SELECT 1 FROM p)),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_type, pause_id, from_status, attempts)
             SELECT 'inbox', 'resumed', format('%s held events released', p.released + (SELECT count(*) FROM u)),
                    p.provider, p.event_type, p.id, 'resuming', 0
             FROM p)
         SELECT (SELECT count(*) FROM p), (SELECT count(*) FROM u)",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(if gone == 1 { Released::Resumed((n + tail) as u64) } else { Released::NotResuming })
}

/// Every pause, by provider (a provider's own first, then its types'), with what each holds.
pub async fn list(pool: &PgPool) -> Result<Vec<Pause>, sqlx::Error> {
    super::query_as(
        "SELECT p.id, p.provider, p.event_type, to_json(p.paused_at)#>>'{}' AS paused_at, p.paused_by, p.reason,
                (extract(epoch FROM now() - p.paused_at) * 1000)::float8 AS age_ms,
                (extract(epoch FROM p.alarm_after) * 1000)::float8 AS alarm_after_ms,
                to_json(p.resuming_at)#>>'{}' AS resuming_at, p.released,
                (SELECT count(*) FROM webhook_inbox w WHERE w.status = 'pending' AND w.held_by = p.id) AS held
         FROM inbox_pauses p
         ORDER BY p.provider, p.event_type NULLS FIRST",
    )
    .fetch_all(super::Autocommit(pool))
    .await
}

/// A scope's pauses and resumes, oldest first (a provider's: its types' too).
pub async fn history(pool: &PgPool, provider: &str) -> Result<Vec<super::audit::AuditRecord>, sqlx::Error> {
    super::query_as(
        "SELECT to_json(at)#>>'{}' AS at, actor, action, reason, message_id, from_status, attempts, failure_reason
         FROM inbox_audit WHERE provider = $1 AND pause_id IS NOT NULL ORDER BY id",
    )
    .bind(provider)
    .fetch_all(super::Autocommit(pool))
    .await
}
