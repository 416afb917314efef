//! `transactional_outbox`: side effects recorded in the transaction that caused them.

use sqlx::{types::Json, PgConnection};

/// One message to publish. `message_key` is derived from what happened (not from
/// the row id), so a message written twice, or re-sent after a crash, carries the
/// same key and consumers can deduplicate on it.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub message_key: String,
    pub payload: serde_json::Value,
}

/// Writes a message unless one with the same key exists; true when written.
pub async fn enqueue(conn: &mut PgConnection, m: &Message<'_>) -> Result<bool, sqlx::Error> {
    let row: Option<(i64,)> = sqlx::query_as(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (message_key) DO NOTHING
         RETURNING id",
    )
    .bind(m.aggregate_type)
    .bind(m.aggregate_id)
    .bind(Json(&m.payload))
    .bind(&m.message_key)
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}
