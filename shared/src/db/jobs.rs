//! `inbox_api_jobs`: the operator's jobs (a requeue or an erasure by
//! selection run in the background), their progress, cancel and end.

use sqlx::PgPool;

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
    /// Events it expects to take, once it has counted them (none before).
    pub estimate: Option<i64>,
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
    /// Who asked it.
    pub cancelled_by: Option<String>,
}

const JOB_COLUMNS: &str = "id, kind, params,
    CASE WHEN state = 'running' AND updated_at < now() - interval '30 seconds' THEN 'interrupted' ELSE state END AS state,
    estimate, processed, result, error, created_by, to_json(created_at)#>>'{}' AS created_at,
    to_json(finished_at)#>>'{}' AS finished_at, to_json(cancel_requested_at)#>>'{}' AS cancel_requested_at,
    cancelled_by";

/// A running job's heartbeat comes this often, whatever its batches take; one
/// whose heartbeat stops for 30 s is seen as interrupted (its process stopped).
pub(crate) const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a job was not started.
#[derive(Debug)]
pub(crate) enum NotStarted {
    /// This many jobs run already, the most at once.
    Busy(i64),
    Database(sqlx::Error),
}

impl From<sqlx::Error> for NotStarted {
    fn from(e: sqlx::Error) -> Self {
        NotStarted::Database(e)
    }
}

/// Records a job started by the token `by` (its estimate unknown until it
/// counts), audited under its number, unless `at_most` jobs run already
/// (interrupted ones aside): the count and the insert are one under a lock,
/// so concurrent starts cannot pass the cap together.
pub(crate) async fn create_job(
    pool: &PgPool,
    kind: &str,
    params: &serde_json::Value,
    by: &str,
    reason: &str,
    at_most: i64,
) -> Result<Job, NotStarted> {
    let mut tx = pool.begin().await?;
    super::query("SELECT pg_advisory_xact_lock(hashtext('inbox_api_jobs'))").execute(&mut *tx).await?;
    let running: i64 = super::query_scalar(
        "SELECT count(*) FROM inbox_api_jobs WHERE state = 'running' AND updated_at >= now() - interval '30 seconds'",
    )
    .fetch_one(&mut *tx)
    .await?;
    if running >= at_most {
        return Err(NotStarted::Busy(running));
    }
    let job: Job = super::query_as(&format!(
        "INSERT INTO inbox_api_jobs (kind, params, created_by) VALUES ($1, $2, $3) RETURNING {JOB_COLUMNS}"
    ))
    .bind(kind)
    .bind(sqlx::types::Json(params))
    .bind(by)
    .fetch_one(&mut *tx)
    .await?;
    super::query("INSERT INTO inbox_audit (actor, action, reason, job_id, api_token) VALUES ($1, $2, $3, $4, $5)")
        .bind(format!("api:{by}"))
        .bind(format!("start_{kind}"))
        .bind(reason)
        .bind(job.id)
        .bind(by)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(job)
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

/// Records a running job's progress (its heartbeat, [`HEARTBEAT`]) and, once
/// it has counted them, the events it expects to take; whether a cancel was asked.
pub(crate) async fn job_progress(
    pool: &PgPool,
    id: i64,
    processed: i64,
    estimate: Option<i64>,
) -> Result<bool, sqlx::Error> {
    let cancel: Option<bool> = super::query_scalar(
        "UPDATE inbox_api_jobs SET processed = $2, estimate = coalesce($3, estimate), updated_at = now()
         WHERE id = $1 AND state = 'running' RETURNING cancel_requested_at IS NOT NULL",
    )
    .bind(id)
    .bind(processed)
    .bind(estimate)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(cancel.unwrap_or(true))
}

/// Ends a job: `succeeded`, `failed` or `cancelled`, with what it did, why it
/// failed, and its estimate if its heartbeat had not recorded it.
pub(crate) async fn finish_job(
    pool: &PgPool,
    id: i64,
    state: &str,
    processed: i64,
    estimate: Option<i64>,
    result: &serde_json::Value,
    error: Option<&str>,
) -> Result<(), sqlx::Error> {
    super::query(
        "UPDATE inbox_api_jobs SET state = $2, processed = $3, estimate = coalesce($4, estimate), result = $5,
                error = $6, finished_at = now(), updated_at = now()
         WHERE id = $1 AND state = 'running'",
    )
    .bind(id)
    .bind(state)
    .bind(processed)
    .bind(estimate)
    .bind(sqlx::types::Json(result))
    .bind(error)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

/// Asks an unfinished job to stop, audited as `cancel_job` under the token
/// `by`: a running one stops within its current event or batch; one whose
/// process stopped (interrupted) is cancelled at once. Whether it was
/// unfinished, and the job, if there is one.
/// `who` asks (an API token's name, or an operator); `token` is the token's
/// name when it is an API token, kept in the audit record's `api_token`.
pub(crate) async fn cancel_job(
    pool: &PgPool,
    id: i64,
    who: &str,
    token: Option<&str>,
) -> Result<(bool, Option<Job>), sqlx::Error> {
    let asked: Option<i64> = super::query_scalar(
        "WITH asked AS (
             UPDATE inbox_api_jobs
             SET cancel_requested_at = coalesce(cancel_requested_at, now()), cancelled_by = coalesce(cancelled_by, $2),
                 state = CASE WHEN updated_at < now() - interval '30 seconds' THEN 'cancelled' ELSE state END,
                 finished_at = CASE WHEN updated_at < now() - interval '30 seconds' THEN now() END
             WHERE id = $1 AND state = 'running'
             RETURNING id),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, job_id, api_token)
             SELECT CASE WHEN $3::text IS NULL THEN $2 ELSE 'api:' || $3 END, 'cancel_job', 'cancelled', id, $3
             FROM asked)
         SELECT id FROM asked",
    )
    .bind(id)
    .bind(who)
    .bind(token)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok((asked.is_some(), job(pool, id).await?))
}
