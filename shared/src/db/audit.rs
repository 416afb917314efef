//! `inbox_audit`: who put which event back to pending, when and why. Written by
//! the statements that requeue (`inbox::replay`, `inbox::requeue`), in
//! the same statement; read here.

use sqlx::PgPool;

#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct AuditRecord {
    pub at: String,
    pub actor: String,
    pub action: String,
    pub reason: String,
    pub from_status: String,
    pub attempts: i32,
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
