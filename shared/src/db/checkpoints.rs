//! `reconcile_checkpoints`: where each reconciliation stopped.

use sqlx::PgPool;

/// The checkpoint of `source`, as Unix seconds.
pub(crate) async fn load(pool: &PgPool, source: &str) -> Result<Option<f64>, sqlx::Error> {
    super::query_scalar("SELECT extract(epoch FROM checkpoint)::float8 FROM reconcile_checkpoints WHERE source = $1")
        .bind(source)
        .fetch_optional(super::Autocommit(pool))
        .await
}

/// Moves the checkpoint forward (never back) to `epoch` seconds.
pub(crate) async fn save(pool: &PgPool, source: &str, epoch: f64) -> Result<(), sqlx::Error> {
    super::query(
        "INSERT INTO reconcile_checkpoints (source, checkpoint) VALUES ($1, to_timestamp($2))
         ON CONFLICT (source) DO UPDATE
         SET checkpoint = GREATEST(reconcile_checkpoints.checkpoint, EXCLUDED.checkpoint), updated_at = now()",
    )
    .bind(source)
    .bind(epoch)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}
