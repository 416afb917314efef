//! `inbox_api_tokens` and `inbox_api_jobs`: who may call the management API
//! (tokens kept as their SHA-256 only), and the bulk operations it runs.

use sqlx::PgPool;

use super::console::UserRole;

/// An API token, as listed (never the token, nor its hash).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct ApiToken {
    /// Its name: who calls, in the audit.
    pub name: String,
    /// `viewer` or `operator`.
    pub role: String,
    /// When it was made, and by whom.
    pub created_at: String,
    /// Who made it.
    pub created_by: String,
    /// When it was last used (to the minute).
    pub last_used_at: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
}

/// Makes a token `name` with `role` and this hash, audited as `token_add` by
/// `by`; false when the name is taken (revoked tokens keep theirs).
pub(crate) async fn add_token(
    pool: &PgPool,
    name: &str,
    role: UserRole,
    sha256: &[u8],
    by: &str,
) -> Result<bool, sqlx::Error> {
    let added: Option<i32> = super::query_scalar(
        "WITH added AS (
             INSERT INTO inbox_api_tokens (name, role, token_sha256, created_by) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING RETURNING name),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, api_token)
             SELECT $4, 'token_add', 'role ' || $2, name FROM added)
         SELECT 1 FROM added",
    )
    .bind(name)
    .bind(role.as_str())
    .bind(sha256)
    .bind(by)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(added.is_some())
}

/// Revokes a token, audited as `token_revoke` by `by`; false when there is
/// no such token, or it was revoked already.
pub(crate) async fn revoke_token(pool: &PgPool, name: &str, by: &str) -> Result<bool, sqlx::Error> {
    let revoked: Option<i32> = super::query_scalar(
        "WITH revoked AS (
             UPDATE inbox_api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL RETURNING name),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, api_token) SELECT $2, 'token_revoke', 'revoked', name FROM revoked)
         SELECT 1 FROM revoked",
    )
    .bind(name)
    .bind(by)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(revoked.is_some())
}

/// Every token, revoked ones too, by name.
pub(crate) async fn list_tokens(pool: &PgPool) -> Result<Vec<ApiToken>, sqlx::Error> {
    super::query_as(
        "SELECT name, role, created_at::text, created_by, last_used_at::text, revoked_at::text
         FROM inbox_api_tokens ORDER BY name",
    )
    .fetch_all(super::Autocommit(pool))
    .await
}

/// The live token of this hash: its name and role; its last use recorded (at
/// most once a minute, so that reads do not each write).
pub(crate) async fn token(pool: &PgPool, sha256: &[u8]) -> Result<Option<(String, UserRole)>, sqlx::Error> {
    let found: Option<(String, String, bool)> = super::query_as(
        "SELECT name, role, last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
         FROM inbox_api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(sha256)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    let Some((name, role, stale)) = found else { return Ok(None) };
    if stale {
        super::query("UPDATE inbox_api_tokens SET last_used_at = now() WHERE name = $1")
            .bind(&name)
            .execute(super::Autocommit(pool))
            .await?;
    }
    Ok(UserRole::parse(&role).map(|role| (name, role)))
}

/// A job: a bulk operation the API runs in the background.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct Job {
    /// Its id.
    pub id: i64,
    /// `requeue` or `erase`.
    pub kind: String,
    /// What it was asked.
    pub params: sqlx::types::Json<serde_json::Value>,
    /// `running`, `succeeded`, `failed`, `cancelled`, or `interrupted` (its process stopped).
    pub state: String,
    /// Events it expected to take when it started.
    pub estimate: i64,
    /// Events it has taken (or examined) so far.
    pub processed: i64,
    /// What it did, once it ended.
    pub result: Option<sqlx::types::Json<serde_json::Value>>,
    /// Why it failed.
    pub error: Option<String>,
    /// The token that started it.
    pub created_by: String,
    /// When it started.
    pub created_at: String,
    /// When it ended.
    pub finished_at: Option<String>,
    /// When a cancel was asked.
    pub cancel_requested_at: Option<String>,
}

const JOB_COLUMNS: &str = "id, kind, params,
    CASE WHEN state = 'running' AND updated_at < now() - interval '30 seconds' THEN 'interrupted' ELSE state END AS state,
    estimate, processed, result, error, created_by, created_at::text, finished_at::text, cancel_requested_at::text";

/// Records a job started by `by`.
pub(crate) async fn create_job(
    pool: &PgPool,
    kind: &str,
    params: &serde_json::Value,
    estimate: i64,
    by: &str,
) -> Result<Job, sqlx::Error> {
    super::query_as(&format!(
        "INSERT INTO inbox_api_jobs (kind, params, estimate, created_by) VALUES ($1, $2, $3, $4) RETURNING {JOB_COLUMNS}"
    ))
    .bind(kind)
    .bind(sqlx::types::Json(params))
    .bind(estimate)
    .bind(by)
    .fetch_one(super::Autocommit(pool))
    .await
}

/// A job.
pub(crate) async fn job(pool: &PgPool, id: i64) -> Result<Option<Job>, sqlx::Error> {
    super::query_as(&format!("SELECT {JOB_COLUMNS} FROM inbox_api_jobs WHERE id = $1"))
        .bind(id)
        .fetch_optional(super::Autocommit(pool))
        .await
}

/// The latest jobs, newest first.
pub(crate) async fn jobs(pool: &PgPool, limit: i64) -> Result<Vec<Job>, sqlx::Error> {
    super::query_as(&format!("SELECT {JOB_COLUMNS} FROM inbox_api_jobs ORDER BY id DESC LIMIT $1"))
        .bind(limit)
        .fetch_all(super::Autocommit(pool))
        .await
}

/// Records a running job's progress; whether a cancel was asked.
pub(crate) async fn job_progress(pool: &PgPool, id: i64, processed: i64) -> Result<bool, sqlx::Error> {
    let cancel: Option<bool> = super::query_scalar(
        "UPDATE inbox_api_jobs SET processed = $2, updated_at = now()
         WHERE id = $1 AND state = 'running' RETURNING cancel_requested_at IS NOT NULL",
    )
    .bind(id)
    .bind(processed)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(cancel.unwrap_or(true))
}

/// Ends a job: `succeeded`, `failed` or `cancelled`, with what it did and why it failed.
pub(crate) async fn finish_job(
    pool: &PgPool,
    id: i64,
    state: &str,
    processed: i64,
    result: &serde_json::Value,
    error: Option<&str>,
) -> Result<(), sqlx::Error> {
    super::query(
        "UPDATE inbox_api_jobs SET state = $2, processed = $3, result = $4, error = $5, finished_at = now(), updated_at = now()
         WHERE id = $1",
    )
    .bind(id)
    .bind(state)
    .bind(processed)
    .bind(sqlx::types::Json(result))
    .bind(error)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

/// Asks a running job to stop (it does between two batches): whether it was
/// running (an interrupted one is not), and the job, if there is one.
pub(crate) async fn cancel_job(pool: &PgPool, id: i64) -> Result<(bool, Option<Job>), sqlx::Error> {
    let asked = super::query(
        "UPDATE inbox_api_jobs SET cancel_requested_at = coalesce(cancel_requested_at, now())
         WHERE id = $1 AND state = 'running' AND updated_at >= now() - interval '30 seconds'",
    )
    .bind(id)
    .execute(super::Autocommit(pool))
    .await?;
    Ok((asked.rows_affected() == 1, job(pool, id).await?))
}
