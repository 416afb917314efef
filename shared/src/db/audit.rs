//! `inbox_audit`: who put which event back to pending, gave which outbox
//! message a fresh start, or paused or resumed which destination, when and why. Written by the statements that do it
//! (`inbox::replay`, `inbox::requeue`, `outbox::retry_message`,
//! `outbox::retry_dead`), in the same statement; read here.

use sqlx::PgPool;

/// One requeue of an event (or retry of one of its outbox messages): who did
/// it, when and why, and what it was before.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct AuditRecord {
    /// When (PostgreSQL's own text).
    pub at: String,
    /// Who ([`crate::ops::Audit::actor`]).
    pub actor: String,
    /// What: `replay`, `requeue`, `retry_outbox`, `pause_destination`,
    /// `resume_destination`, or a word of your own.
    pub action: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// The outbox message retried, for a retry (its event's record otherwise).
    pub message_id: Option<i64>,
    /// The event's status before (a message's: `dead` or `waiting`; a destination's: `running` or `paused`).
    pub from_status: String,
    /// Its attempts before (reset to 0 by the requeue).
    pub attempts: i32,
    /// Its failure reason (a message's last error) before.
    pub failure_reason: Option<String>,
}

/// An event's history, oldest first: its requeues and the retries of the outbox messages it wrote.
pub async fn history(pool: &PgPool, provider: &str, event_id: &str) -> Result<Vec<AuditRecord>, sqlx::Error> {
    super::query_as(
        "SELECT to_json(at)#>>'{}' AS at, actor, action, reason, message_id, from_status, attempts, failure_reason
         FROM inbox_audit WHERE provider = $1 AND event_id = $2 ORDER BY id",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_all(super::Autocommit(pool))
    .await
}

/// A destination's pauses and resumes, oldest first.
pub(crate) async fn destination_history(pool: &PgPool, destination: &str) -> Result<Vec<AuditRecord>, sqlx::Error> {
    super::query_as(
        "SELECT to_json(at)#>>'{}' AS at, actor, action, reason, message_id, from_status, attempts, failure_reason
         FROM inbox_audit WHERE destination = $1 ORDER BY id",
    )
    .bind(destination)
    .fetch_all(super::Autocommit(pool))
    .await
}
