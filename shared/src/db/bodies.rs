//! `webhook_bodies`: the signed bytes of a delivery with several events, kept
//! once (the rows are written by the claim in [`super::inbox`]).

use sqlx::PgExecutor;

/// Deletes up to `limit` batch bodies that no inbox row points at and that no
/// delivery has brought for a day. A claim bumps `last_seen_at` under the row's
/// lock before its rows point at it, so a body is never deleted under a claim:
/// locked, it is skipped; bumped, it fails the age test when re-checked.
pub(crate) async fn delete_orphans<'e>(ex: impl PgExecutor<'e>, limit: i64) -> Result<u64, sqlx::Error> {
    let done = super::query(
        "DELETE FROM webhook_bodies
         WHERE sha256 IN (SELECT b.sha256 FROM webhook_bodies AS b
                          WHERE b.last_seen_at < now() - interval '1 day'
                            AND NOT EXISTS (SELECT 1 FROM webhook_inbox AS w WHERE w.body_sha256 = b.sha256)
                          LIMIT $1
                          FOR UPDATE SKIP LOCKED)",
    )
    .bind(limit)
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}

/// Deletes up to `limit` replay guards (`webhook_replay_guard`) whose inbox
/// row retention has deleted, a day old at least: a digest is remembered as
/// long as the key it was claimed under.
pub(crate) async fn delete_orphan_guards<'e>(ex: impl PgExecutor<'e>, limit: i64) -> Result<u64, sqlx::Error> {
    let done = super::query(
        "DELETE FROM webhook_replay_guard
         WHERE (provider, sha256) IN (
             SELECT g.provider, g.sha256 FROM webhook_replay_guard AS g
             WHERE g.seen_at < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM webhook_inbox AS w WHERE w.provider = g.provider AND w.event_id = g.event_id)
             LIMIT $1
             FOR UPDATE SKIP LOCKED)",
    )
    .bind(limit)
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}
