//! `inbox_audit`: who put which event back to pending, when and why. Written by
//! the statements that requeue (`inbox::replay`, `inbox::requeue`), in
//! the same statement; read here.

use sqlx::PgPool;

/// One requeue of an event: who put it back to pending, when and why, and what it was before.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct AuditRecord {
    /// When (PostgreSQL's own text).
    pub at: String,
    /// Who ([`crate::ops::Requeue::actor`]).
    pub actor: String,
    /// What: `replay` or `requeue`.
    pub action: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// The event's status before.
    pub from_status: String,
    /// Its attempts before (reset to 0 by the requeue).
    pub attempts: i32,
    /// Its failure reason before.
    pub failure_reason: Option<String>,
}

/// An event's history, oldest first.
pub async fn history(pool: &PgPool, provider: &str, event_id: &str) -> Result<Vec<AuditRecord>, sqlx::Error> {
    super::query_as(
        "SELECT at::text, actor, action, reason, from_status, attempts, failure_reason
         FROM inbox_audit WHERE provider = $1 AND event_id = $2 ORDER BY id",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_all(super::Autocommit(pool))
    .await
}
