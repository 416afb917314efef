//! Jobs: a requeue or an erasure by selection, run in the background with
//! an estimate, progress and cancel.

use std::sync::Arc;

use axum::{extract::State as Shared, http::StatusCode, Json};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::{auth::Caller, reason, since, Answer, ApiError, Body, Params, Refused};
use crate::{
    console::State,
    core::{
        selection::{EventQuery, Filter, PayloadMatch},
        status::Status,
        text::escape,
    },
    db::api as store,
    ops::{self, Audit, Erased},
};
/// A requeue: the events a filter selects (by when they ended), back to pending.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RequeueRequest {
    /// Events in these statuses (one at least).
    #[schema(min_items = 1)]
    statuses: Vec<RequeueStatus>,
    provider: Option<String>,
    /// Exactly this event type.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    event_type: Option<String>,
    /// Ended at or after: 30m, 2h, 7d (ago), or a timestamp.
    since: Option<String>,
    /// Ended before.
    until: Option<String>,
    /// Only events whose failure reason matches this pattern (SQL ILIKE).
    reason_like: Option<String>,
    /// Why, for the audit records.
    #[schema(min_length = 1, max_length = 500)]
    reason: String,
}

/// A status a requeue takes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RequeueStatus {
    Unhandled,
    Ignored,
    Failed,
    Done,
}

impl From<RequeueStatus> for Status {
    fn from(s: RequeueStatus) -> Status {
        match s {
            RequeueStatus::Unhandled => Status::Unhandled,
            RequeueStatus::Ignored => Status::Ignored,
            RequeueStatus::Failed => Status::Failed,
            RequeueStatus::Done => Status::Done,
        }
    }
}

/// An erasure by selection (one at least of its filters).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EraseRequest {
    provider: Option<String>,
    /// Exactly this event type.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    event_type: Option<String>,
    /// Received at or after: 30m, 2h, 7d (ago), or a timestamp.
    since: Option<String>,
    /// Received before.
    until: Option<String>,
    /// Events whose payload holds this text (an e-mail address), or this JSON.
    payload: Option<String>,
    /// Why (a deletion request's reference), for the audit records.
    #[schema(min_length = 1, max_length = 500)]
    reason: String,
}

/// A bulk operation running in the background.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobView {
    id: i64,
    /// requeue, or erase.
    kind: String,
    /// What it was asked.
    params: Value,
    /// running, succeeded, failed, cancelled, or interrupted (the process running it stopped).
    state: String,
    /// Events it expected to take when it started.
    estimate: i64,
    /// Events taken (a requeue) or examined (an erasure) so far.
    processed: i64,
    /// What it did, once it ended.
    result: Option<Value>,
    error: Option<String>,
    /// The token that started it.
    created_by: String,
    created_at: String,
    finished_at: Option<String>,
    cancel_requested_at: Option<String>,
}

impl From<store::Job> for JobView {
    fn from(j: store::Job) -> Self {
        JobView {
            id: j.id,
            kind: j.kind,
            params: j.params.0,
            state: j.state,
            estimate: j.estimate,
            processed: j.processed,
            result: j.result.map(|r| r.0),
            error: j.error,
            created_by: j.created_by,
            created_at: j.created_at,
            finished_at: j.finished_at,
            cancel_requested_at: j.cancel_requested_at,
        }
    }
}

#[utoipa::path(post, path = "/api/v1/requeue", tag = "jobs", request_body = RequeueRequest,
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Starts a requeue job: every event the filter selects back to pending, 500 a batch, each audited.
pub(super) async fn start_requeue(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<RequeueRequest>,
) -> Answer<(StatusCode, Json<JobView>)> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let statuses: Vec<Status> = body.statuses.iter().copied().map(Status::from).collect();
    if statuses.is_empty() {
        return Err(Refused::BadRequest("statuses: name one at least (unhandled, ignored, failed, done)".into()));
    }
    let filter = Filter {
        statuses,
        provider: body.provider.clone(),
        event_type: body.event_type.clone(),
        since: since(body.since.as_deref(), "since")?,
        until: since(body.until.as_deref(), "until")?,
        reason_like: body.reason_like.clone(),
    };
    let found = ops::count_matching(&state.db, &filter).await?;
    let params = json!({"statuses": body.statuses, "provider": body.provider, "type": body.event_type,
                        "since": body.since, "until": body.until, "reason_like": body.reason_like, "reason": why});
    let job =
        store::create_job(&state.db, "requeue", &params, found.matching - found.without_payload, &caller.name).await?;
    let (db, id, actor) = (state.db.clone(), job.id, caller.actor());
    tokio::spawn(async move {
        let by = Audit { actor: &actor, action: "requeue", reason: &why };
        let ran = run_requeue(&db, id, &filter, &by).await;
        finish(&db, id, ran).await;
    });
    Ok((StatusCode::ACCEPTED, Json(job.into())))
}

/// What a job's run came to: its state, events processed, and result; or its database error.
type Ran = Result<(&'static str, i64, Value), sqlx::Error>;

async fn run_requeue(db: &sqlx::PgPool, id: i64, filter: &Filter, by: &Audit<'_>) -> Ran {
    let started = crate::db::inbox::now_micros(db).await?;
    let mut requeued = 0i64;
    loop {
        let n = crate::db::inbox::requeue(db, filter, by, 500, started).await? as i64;
        requeued += n;
        let cancel = store::job_progress(db, id, requeued).await?;
        if n == 0 {
            return Ok(("succeeded", requeued, json!({"requeued": requeued})));
        }
        if cancel {
            return Ok(("cancelled", requeued, json!({"requeued": requeued})));
        }
    }
}

#[utoipa::path(post, path = "/api/v1/erase", tag = "jobs", request_body = EraseRequest,
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Starts an erasure job: every event the selection finds, newest first, each erased and audited (pending ones left).
pub(super) async fn start_erase(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<EraseRequest>,
) -> Answer<(StatusCode, Json<JobView>)> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let nothing = |s: &Option<String>| s.as_deref().map_or(true, |t| t.trim().is_empty());
    if [&body.provider, &body.event_type, &body.since, &body.until, &body.payload].into_iter().all(nothing) {
        return Err(Refused::BadRequest("name what to erase: provider, type, since, until or payload".into()));
    }
    let query = EventQuery {
        provider: body.provider.clone(),
        event_type: body.event_type.clone(),
        since: since(body.since.as_deref(), "since")?,
        until: since(body.until.as_deref(), "until")?,
        payload: body.payload.as_deref().map(PayloadMatch::parse),
        ..EventQuery::default()
    };
    let counted =
        ops::erase_matching(&state.db, &query, &Audit { actor: "", action: "", reason: "" }, true, |_| {}).await?;
    let params = json!({"provider": body.provider, "type": body.event_type, "since": body.since,
                        "until": body.until, "payload": body.payload.is_some(), "reason": why});
    let job = store::create_job(&state.db, "erase", &params, counted.matching as i64, &caller.name).await?;
    let (db, id, actor) = (state.db.clone(), job.id, caller.actor());
    tokio::spawn(async move {
        let by = Audit { actor: &actor, action: "erase", reason: &why };
        let ran = run_erase(&db, id, &query, &by).await;
        finish(&db, id, ran).await;
    });
    Ok((StatusCode::ACCEPTED, Json(job.into())))
}

async fn run_erase(db: &sqlx::PgPool, id: i64, query: &EventQuery, by: &Audit<'_>) -> Ran {
    let (mut examined, mut erased, mut already, mut pending) = (0i64, 0i64, 0i64, 0i64);
    let mut after = None;
    loop {
        let page = ops::list_events(db, query, after.as_ref(), 500).await?;
        for e in &page.events {
            examined += 1;
            match ops::erase(db, &e.provider, &e.event_id, by).await? {
                Erased::Erased { .. } => erased += 1,
                Erased::Already { .. } => already += 1,
                Erased::Pending => pending += 1,
                Erased::NotFound => examined -= 1,
            }
        }
        let cancel = store::job_progress(db, id, examined).await?;
        let result = json!({"erased": erased, "already": already, "pending": pending});
        match page.next {
            None => return Ok(("succeeded", examined, result)),
            Some(_) if cancel => return Ok(("cancelled", examined, result)),
            Some(next) => after = Some(next),
        }
    }
}

async fn finish(db: &sqlx::PgPool, id: i64, ran: Ran) {
    let ended = match ran {
        Ok((state, processed, result)) => store::finish_job(db, id, state, processed, &result, None).await,
        Err(e) => {
            tracing::error!(job = id, error = %escape(&e.to_string()), "an API job failed");
            let processed = store::job(db, id).await.ok().flatten().map_or(0, |j| j.processed);
            store::finish_job(
                db,
                id,
                "failed",
                processed,
                &Value::Null,
                Some("the database refused a batch or did not answer; the batches before it are done"),
            )
            .await
        }
    };
    if let Err(e) = ended {
        tracing::error!(job = id, error = %escape(&e.to_string()), "an API job's end could not be recorded");
    }
}

/// The latest jobs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobsPage {
    jobs: Vec<JobView>,
}

#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs",
    responses((status = 200, body = JobsPage), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// The latest 100 jobs, newest first.
pub(super) async fn list_jobs(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<JobsPage>> {
    let jobs = store::jobs(&state.read, 100).await?;
    Ok(Json(JobsPage { jobs: jobs.into_iter().map(JobView::from).collect() }))
}

fn job_id(text: &str) -> Answer<i64> {
    text.parse().map_err(|_| Refused::NotFound(format!("no job {:?}", escape(text))))
}

#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "The job's id", example = 1)),
    responses((status = 200, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 404, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// One job: its estimate, progress and state.
pub(super) async fn get_job(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
    Params(id): Params<String>,
) -> Answer<Json<JobView>> {
    let id = job_id(&id)?;
    let job = store::job(&state.db, id).await?.ok_or_else(|| Refused::NotFound(format!("no job {id}")))?;
    Ok(Json(job.into()))
}

#[utoipa::path(delete, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "The job's id", example = 1)),
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError),
               (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Cancels a running job: it stops after its current batch (what it did stays done).
pub(super) async fn cancel_job(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params(id): Params<String>,
) -> Answer<(StatusCode, Json<JobView>)> {
    caller.may_act()?;
    let id = job_id(&id)?;
    let (asked, job) = store::cancel_job(&state.db, id).await?;
    let job = job.ok_or_else(|| Refused::NotFound(format!("no job {id}")))?;
    if !asked {
        return Err(Refused::Conflict(format!("job {id} is {} already: there is nothing to cancel", job.state)));
    }
    Ok((StatusCode::ACCEPTED, Json(job.into())))
}
