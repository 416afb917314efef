//! The outbox and its destinations, pauses, and alerts.

use std::{sync::Arc, time::Duration};

use axum::{extract::State as Shared, http::StatusCode, Json};
use axum_extra::extract::{Query, QueryRejection};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    auth::Caller, events::Reason, query, reason, refuse_empty, Answer, ApiError, Body, Params, Refused, MAX_PAGE,
};
use crate::State;
use webhook_inbox::ops::{self, Audit};
use webhook_inbox_schemes::text::escape;

/// The outbox listing's filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct OutboxParams {
    /// Dead messages instead of waiting ones.
    dead: Option<bool>,
    /// Messages at most, 1 to 500 (50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

/// Outbox messages not sent, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutboxPage {
    messages: Vec<ops::OutboxMessage>,
}

#[utoipa::path(get, path = "/api/v1/outbox", tag = "outbox", params(OutboxParams),
    responses((status = 200, body = OutboxPage), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Messages waiting to be relayed (or, with `dead=true`, dead), oldest first.
pub(super) async fn list_outbox(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    params: Result<Query<OutboxParams>, QueryRejection>,
) -> Answer<Json<OutboxPage>> {
    refuse_empty(raw.as_deref(), &["dead", "limit"])?;
    let p = query(params)?;
    let limit = p.limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Refused::BadRequest(format!("limit is 1 to {MAX_PAGE}")));
    }
    let messages = ops::list_unsent(&state.read, p.dead.unwrap_or(false), limit).await?;
    Ok(Json(OutboxPage { messages }))
}

/// What a retry did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Retried {
    id: i64,
    /// Due now, attempts reset.
    retried: bool,
}

#[utoipa::path(post, path = "/api/v1/outbox/{id}/retry", tag = "outbox",
    params(("id" = i64, Path, description = "The message's id", example = 1)), request_body = Reason,
    responses((status = 200, body = Retried), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Sends one unsent message (dead, or waiting) again now, attempts reset; audited.
pub(super) async fn retry_message(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params(id): Params<String>,
    Body(body): Body<Reason>,
) -> Answer<Json<Retried>> {
    caller.may_act()?;
    let missing = || Refused::NotFound(format!("no unsent outbox message {:?}", escape(&id)));
    let message: i64 = id.parse().map_err(|_| missing())?;
    let why = reason(&body.reason)?;
    let actor = caller.actor();
    let by = Audit { actor: &actor, action: "retry_outbox", reason: &why };
    match ops::retry_message(&state.db, message, &by).await? {
        true => Ok(Json(Retried { id: message, retried: true })),
        false => Err(missing()),
    }
}

/// The relay's destinations.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DestinationsPage {
    destinations: Vec<ops::DestinationState>,
}

#[utoipa::path(get, path = "/api/v1/destinations", tag = "outbox",
    responses((status = 200, body = DestinationsPage), (status = 401, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// The relay's destinations: paused or not, their circuit, backlog and dead messages.
pub(super) async fn list_destinations(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<DestinationsPage>> {
    Ok(Json(DestinationsPage { destinations: ops::destinations(&state.read).await? }))
}

/// The pauses in place.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PausesPage {
    pauses: Vec<ops::Pause>,
}

#[utoipa::path(get, path = "/api/v1/pauses", tag = "pauses",
    responses((status = 200, body = PausesPage), (status = 401, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// What is paused, since when, by whom, why, and how many events each pause holds.
pub(super) async fn list_pauses(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<PausesPage>> {
    Ok(Json(PausesPage { pauses: ops::pauses(&state.read).await? }))
}

/// Alerts.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AlertsPage {
    alerts: Vec<webhook_inbox::alerts::Alert>,
}

/// The alerts listing's filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AlertsParams {
    /// The latest resolved alerts too.
    resolved: Option<bool>,
}

#[utoipa::path(get, path = "/api/v1/alerts", tag = "alerts", params(AlertsParams),
    responses((status = 200, body = AlertsPage), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Alerts open or acknowledged (with `resolved=true`, the latest resolved too), newest first.
pub(super) async fn list_alerts(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    params: Result<Query<AlertsParams>, QueryRejection>,
) -> Answer<Json<AlertsPage>> {
    refuse_empty(raw.as_deref(), &["resolved"])?;
    let p = query(params)?;
    Ok(Json(AlertsPage { alerts: webhook_inbox::alerts::list(&state.read, p.resolved.unwrap_or(false), 100).await? }))
}

/// A pause to make: a provider's events, or one type of them, wait.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseRequest {
    /// The provider whose events wait.
    provider: String,
    /// Only its events of exactly this type; every type when absent.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    event_type: Option<String>,
    /// Why, for the audit record and whoever finds it paused.
    #[schema(min_length = 1, max_length = 500)]
    reason: String,
    /// The PauseOverdue alarm (and `overdue` here) after this long: 30m, 4h, 2d (4h).
    alarm_after: Option<String>,
}

/// A pause's scope, to resume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeRequest {
    provider: String,
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    event_type: Option<String>,
    /// Why, for the audit record.
    #[schema(min_length = 1, max_length = 500)]
    reason: String,
}

/// What a pause or a resume did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Paused {
    provider: String,
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    event_type: Option<String>,
    /// paused, paused_already, or resuming (the workers release its held events, oldest first).
    outcome: String,
    /// The pause's number (`held_by`).
    pause_id: Option<i64>,
    /// Events it holds.
    held: i64,
}

fn scope(provider: &str, event_type: Option<&str>) -> Answer<ops::PauseScope> {
    ops::PauseScope::new(provider, event_type).map_err(|e| Refused::BadRequest(escape(&e).into_owned()))
}

#[utoipa::path(post, path = "/api/v1/pauses", tag = "pauses", request_body = PauseRequest,
    responses((status = 200, body = Paused), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Pauses a provider's events (or one type of them): still received, they wait, spending no attempt; audited.
pub(super) async fn pause(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<PauseRequest>,
) -> Answer<Json<Paused>> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let scope = scope(&body.provider, body.event_type.as_deref())?;
    let alarm_after = match body.alarm_after.as_deref() {
        None => Duration::from_secs(4 * 3600),
        Some(t) => webhook_inbox::alerts::parse_duration(t).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
            Refused::BadRequest(format!("alarm_after: {:?} is not a duration (30m, 4h, 2d)", escape(t)))
        })?,
    };
    let actor = caller.actor();
    let by = Audit { actor: &actor, action: "pause", reason: &why };
    let paused = ops::pause_events(&state.db, &scope, alarm_after, &by).await?;
    let now = ops::pauses(&state.db).await?.into_iter().find(|p| p.scope() == scope);
    Ok(Json(Paused {
        outcome: if paused { "paused" } else { "paused_already" }.into(),
        pause_id: now.as_ref().map(|p| p.id),
        held: now.map_or(0, |p| p.held),
        provider: scope.provider,
        event_type: scope.event_type,
    }))
}

#[utoipa::path(post, path = "/api/v1/pauses/resume", tag = "pauses", request_body = ResumeRequest,
    responses((status = 202, body = Paused), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Resumes a pause: the workers release its held events in receive order, then new ones as they come; audited.
pub(super) async fn resume(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<ResumeRequest>,
) -> Answer<(StatusCode, Json<Paused>)> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let scope = scope(&body.provider, body.event_type.as_deref())?;
    let actor = caller.actor();
    let by = Audit { actor: &actor, action: "resume", reason: &why };
    let Some(id) = ops::resume_events(&state.db, &scope, &by).await? else {
        return Err(Refused::NotFound(format!("{} is not paused", escape(&scope.to_string()))));
    };
    let held = ops::pauses(&state.db).await?.into_iter().find(|p| p.id == id).map_or(0, |p| p.held);
    let answer = Paused {
        outcome: "resuming".into(),
        pause_id: Some(id),
        held,
        provider: scope.provider,
        event_type: scope.event_type,
    };
    Ok((StatusCode::ACCEPTED, Json(answer)))
}

/// What an alert's acknowledgement or resolution did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AlertActed {
    id: i64,
    /// acknowledged, or resolved.
    state: String,
}

#[utoipa::path(post, path = "/api/v1/alerts/{id}/{action}", tag = "alerts",
    params(("id" = i64, Path, description = "The alert's number", example = 1),
           ("action" = String, Path, description = "acknowledge (no more reminders) or resolve (now)", example = "acknowledge")),
    request_body = Reason,
    responses((status = 200, body = AlertActed), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Acknowledges an open alert (no more reminders; it resolves when its condition clears), or resolves one now; audited.
pub(super) async fn act_on_alert(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params((id, action)): Params<(String, String)>,
    Body(body): Body<Reason>,
) -> Answer<Json<AlertActed>> {
    caller.may_act()?;
    let missing = || Refused::NotFound(format!("no alert {:?}", escape(&id)));
    let alert: i64 = id.parse().map_err(|_| missing())?;
    let why = reason(&body.reason)?;
    let actor = caller.actor();
    let (done, word) = match action.as_str() {
        "acknowledge" => {
            let by = Audit { actor: &actor, action: "acknowledge_alert", reason: &why };
            (webhook_inbox::alerts::acknowledge(&state.db, alert, &by).await?, "acknowledged")
        }
        "resolve" => {
            let by = Audit { actor: &actor, action: "resolve_alert", reason: &why };
            (webhook_inbox::alerts::resolve(&state.db, alert, &by).await?, "resolved")
        }
        _ => {
            return Err(Refused::NotFound(format!(
                "{:?} is not an alert's action: acknowledge or resolve",
                escape(&action)
            )))
        }
    };
    if !done {
        return match webhook_inbox::alerts::get(&state.db, alert).await? {
            None => Err(missing()),
            Some(a) => Err(Refused::Conflict(format!("alert {alert} is {}: it cannot be {word}", a.state))),
        };
    }
    Ok(Json(AlertActed { id: alert, state: word.into() }))
}

/// What a destination's pause or resume did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DestinationActed {
    name: String,
    /// Paused now.
    paused: bool,
    /// False when it was so already.
    changed: bool,
}

#[utoipa::path(post, path = "/api/v1/destinations/{name}/{action}", tag = "outbox",
    params(("name" = String, Path, description = "The destination's name", example = "default"),
           ("action" = String, Path, description = "pause or resume", example = "pause")),
    request_body = Reason,
    responses((status = 200, body = DestinationActed), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Pauses a destination (every relay stops sending to it; its messages wait, none dropped), or resumes it; audited.
pub(super) async fn act_on_destination(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params((name, action)): Params<(String, String)>,
    Body(body): Body<Reason>,
) -> Answer<Json<DestinationActed>> {
    caller.may_act()?;
    if !ops::is_destination_name(&name) {
        return Err(Refused::NotFound(format!("{:?} is not a destination's name", escape(&name))));
    }
    let why = reason(&body.reason)?;
    let actor = caller.actor();
    let pause = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => {
            return Err(Refused::NotFound(format!(
                "{:?} is not a destination's action: pause or resume",
                escape(&action)
            )))
        }
    };
    let by =
        Audit { actor: &actor, action: if pause { "pause_destination" } else { "resume_destination" }, reason: &why };
    let changed = match pause {
        true => ops::pause_destination(&state.db, &name, &by).await?,
        false => ops::resume_destination(&state.db, &name, &by).await?,
    };
    Ok(Json(DestinationActed { name, paused: pause, changed }))
}
