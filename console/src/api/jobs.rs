//! Jobs: a requeue or an erasure by selection, run in the background with
//! an estimate, progress and cancel ([`ops::start_job`]).

use std::sync::Arc;

use axum::{extract::State as Shared, http::StatusCode, Json};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::{auth::Caller, reason, since, Answer, ApiError, Body, Params, Refused};
use crate::State;
use webhook_inbox::ops::{self, EventQuery, Filter, PayloadMatch, Status};
use webhook_inbox_schemes::text::escape;

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
    /// Only count what it would erase (the job's result); nothing is erased.
    #[serde(default)]
    dry_run: bool,
    /// The most events it may erase (required unless `dry_run`): a selection
    /// holding more is refused whole, nothing erased; count it first with `dry_run`.
    #[schema(minimum = 1)]
    at_most: Option<u64>,
    /// Why (a deletion request's reference, never the person: no e-mail
    /// address, nor the text searched), for the audit records.
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
    /// Events it expects to take, once it has counted them (none before).
    estimate: Option<i64>,
    /// Events taken (a requeue) or erased (an erasure) so far.
    processed: i64,
    /// What it did, once it ended.
    result: Option<Value>,
    error: Option<String>,
    /// The token that started it.
    created_by: String,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    finished_at: Option<String>,
    #[schema(format = DateTime)]
    cancel_requested_at: Option<String>,
    /// The token that asked the cancel.
    cancelled_by: Option<String>,
}

impl From<ops::Job> for JobView {
    fn from(j: ops::Job) -> Self {
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
            cancelled_by: j.cancelled_by,
        }
    }
}

/// Starts a job as the caller: the 202 with its record.
async fn start(
    state: &State,
    caller: &Caller,
    work: ops::JobWork,
    params: Value,
    why: &str,
) -> Answer<(StatusCode, Json<JobView>)> {
    let job = ops::start_job(&state.db, work, params, &caller.name, why).await?;
    Ok((StatusCode::ACCEPTED, Json(job.into())))
}

#[utoipa::path(post, path = "/api/v1/requeue", tag = "jobs", request_body = RequeueRequest,
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 409, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Starts a requeue job: it counts what the filter selects (its estimate), then
/// puts it back to pending, 500 a batch, each audited.
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
    let params = json!({"statuses": body.statuses, "provider": body.provider, "type": body.event_type,
                        "since": body.since, "until": body.until, "reason_like": body.reason_like, "reason": why});
    start(&state, &caller, ops::JobWork::Requeue(filter), params, &why).await
}

#[utoipa::path(post, path = "/api/v1/erase", tag = "jobs", request_body = EraseRequest,
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 409, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Starts an erasure job: it counts what the selection finds (its estimate;
/// more than `at_most`, and it erases nothing), then erases each event,
/// audited (pending ones left). With `dry_run`, it only counts.
pub(super) async fn start_erase(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<EraseRequest>,
) -> Answer<(StatusCode, Json<JobView>)> {
    caller.may_act()?;
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
    if body.reason.trim().is_empty() {
        return Err(Refused::BadRequest("reason: say why (the request's reference), for the audit record".into()));
    }
    let why = ops::erase_reason(&body.reason, query.payload.as_ref()).map_err(Refused::BadRequest)?;
    let options = ops::EraseOptions { dry_run: body.dry_run, at_most: body.at_most };
    match options.at_most {
        Some(0) => return Err(Refused::BadRequest("at_most: 1 at least".into())),
        None if !options.dry_run => {
            return Err(Refused::BadRequest(
                "at_most: say the most events this erasure may take (count them first with dry_run: true)".into(),
            ))
        }
        _ => {}
    }
    // Not the payload's text: it is the personal data being erased.
    let params = json!({"provider": body.provider, "type": body.event_type, "since": body.since,
                        "until": body.until, "payload": body.payload.is_some(), "dry_run": body.dry_run,
                        "at_most": body.at_most, "reason": why});
    start(&state, &caller, ops::JobWork::Erase(query, options), params, &why).await
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
    let jobs = ops::jobs(&state.read, 100).await?;
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
    Ok(Json(ops::job(&state.db, id).await?.into()))
}

#[utoipa::path(delete, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "The job's id", example = 1)),
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError),
               (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Cancels an unfinished job: a running one stops within its current event or
/// batch (what it did stays done); an interrupted one (its process stopped)
/// is cancelled at once. Audited under the token.
pub(super) async fn cancel_job(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params(id): Params<String>,
) -> Answer<(StatusCode, Json<JobView>)> {
    caller.may_act()?;
    let id = job_id(&id)?;
    Ok((StatusCode::ACCEPTED, Json(ops::cancel_job(&state.db, id, ops::Canceller::Token(&caller.name)).await?.into())))
}
