//! Events: the listing, one event, and the actions on one (replay, erase).

use std::sync::Arc;

use axum::{extract::State as Shared, Json};
use axum_extra::extract::{Query, QueryRejection};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{
    auth::Caller, query, reason, refuse_empty, since, statuses, Answer, ApiError, Body, Params, Refused, MAX_PAGE,
};
use crate::State;
use webhook_inbox::ops::{self, rfc3339, Audit, Cursor, Erased, EventQuery, IdMatch, PayloadMatch, Replayed, Status};
use webhook_inbox_schemes::text::escape;
const ALL: &[Status] = &[Status::Pending, Status::Done, Status::Failed, Status::Unhandled, Status::Ignored];

/// The events listing's filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsParams {
    /// Of this provider only.
    provider: Option<String>,
    /// Exactly this event type.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    event_type: Option<String>,
    /// In one of these statuses, comma-separated: pending, done, failed, unhandled, ignored.
    #[param(pattern = r"^(pending|done|failed|unhandled|ignored)(,(pending|done|failed|unhandled|ignored))*$")]
    status: Option<String>,
    /// Received at or after: 30m, 2h, 7d (ago), or a timestamp.
    since: Option<String>,
    /// Received before: 30m, 2h, 7d (ago), or a timestamp.
    until: Option<String>,
    /// Exactly this event id.
    id: Option<String>,
    /// The event ids that start with this text.
    id_prefix: Option<String>,
    /// Events whose payload holds this text, or this JSON (an object or array); bound it with `since`.
    payload: Option<String>,
    /// The page after this cursor (the `next` of the page before).
    after: Option<String>,
    /// Events a page, 1 to 500 (50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

/// A page of events, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventsPage {
    events: Vec<EventItem>,
    /// The cursor of the next page (`after`), if there is one.
    next: Option<String>,
}

/// An event, as listed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventItem {
    provider: String,
    event_id: String,
    event_type: String,
    status: String,
    attempts: i32,
    #[schema(format = DateTime)]
    received_at: String,
    failure_reason: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/events", tag = "events", params(EventsParams),
    responses((status = 200, body = EventsPage), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Events, newest first, by the console's filters, a page at a time.
pub(super) async fn list_events(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    params: Result<Query<EventsParams>, QueryRejection>,
) -> Answer<Json<EventsPage>> {
    refuse_empty(raw.as_deref(), &["status", "limit"])?;
    let p = query(params)?;
    let limit = p.limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Refused::BadRequest(format!("limit is 1 to {MAX_PAGE}")));
    }
    let event_id = match (p.id, p.id_prefix) {
        (Some(_), Some(_)) => return Err(Refused::BadRequest("give id or id_prefix, not both".into())),
        (id, prefix) => id.map(IdMatch::Exact).or(prefix.map(IdMatch::Prefix)),
    };
    let after = p
        .after
        .map(|a| Cursor::parse(&a).map_err(|_| Refused::BadRequest("after is not a cursor this listing gave".into())))
        .transpose()?;
    let query = EventQuery {
        provider: p.provider,
        event_type: p.event_type,
        statuses: statuses(p.status.as_deref(), ALL)?,
        since: since(p.since.as_deref(), "since")?,
        until: since(p.until.as_deref(), "until")?,
        event_id,
        payload: p.payload.map(|q| PayloadMatch::parse(&q)),
    };
    // A payload search may take its timeout on a connection: one per token at once, a few in all.
    let _searching = match &query.payload {
        Some(_) => Some(state.searches.start(&caller.actor()).map_err(Refused::Searching)?),
        None => None,
    };
    let page = ops::list_events(&state.read, &query, after.as_ref(), limit).await?;
    Ok(Json(EventsPage {
        events: page
            .events
            .into_iter()
            .map(|e| EventItem {
                provider: e.provider,
                event_id: e.event_id,
                event_type: e.event_type,
                status: e.status,
                attempts: e.attempts,
                received_at: e.received_at,
                failure_reason: e.failure_reason,
            })
            .collect(),
        next: page.next.map(|c| c.to_string()),
    }))
}

/// One event: what was stored, its history and its outbox messages.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventDetail {
    provider: String,
    event_id: String,
    event_type: String,
    /// pending, done, failed, unhandled or ignored.
    status: String,
    /// webhook, or reconcile.
    source: String,
    attempts: i32,
    #[schema(format = DateTime)]
    received_at: String,
    #[schema(format = DateTime)]
    processed_at: Option<String>,
    #[schema(format = DateTime)]
    next_attempt_at: Option<String>,
    failure_reason: Option<String>,
    /// The delivery's headers that were kept.
    headers: Value,
    /// The payload (none for a body never usable, or erased).
    payload: Option<Value>,
    /// The pause holding it, while one does.
    held_by: Option<i64>,
    /// When it was erased, and by whom.
    #[schema(format = DateTime)]
    erased_at: Option<String>,
    erased_by: Option<String>,
    /// When it was put back from prune's archive, if it was.
    #[schema(format = DateTime)]
    restored_at: Option<String>,
    /// What was done to it, oldest first.
    history: Vec<HistoryItem>,
    /// The messages its handlers wrote.
    outbox: Vec<MessageItem>,
}

/// An audit record.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryItem {
    #[schema(format = DateTime)]
    at: String,
    actor: String,
    action: String,
    pub(super) reason: String,
    from_status: String,
}

/// An outbox message.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageItem {
    id: i64,
    message_key: String,
    destination: String,
    attempts: i32,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    sent_at: Option<String>,
    #[schema(format = DateTime)]
    dead_at: Option<String>,
    last_error: Option<String>,
}

impl From<ops::OutboxMessage> for MessageItem {
    fn from(m: ops::OutboxMessage) -> Self {
        MessageItem {
            id: m.id,
            message_key: m.message_key,
            destination: m.destination,
            attempts: m.attempts,
            created_at: m.created_at,
            sent_at: m.sent_at,
            dead_at: m.dead_at,
            last_error: m.last_error,
        }
    }
}

fn not_found(provider: &str, event_id: &str) -> Refused {
    Refused::NotFound(format!("no event {:?} from provider {:?}", escape(event_id), escape(provider)))
}

#[utoipa::path(get, path = "/api/v1/events/{provider}/{event_id}", tag = "events",
    params(("provider" = String, Path, description = "The provider's name", example = "stripe"),
           ("event_id" = String, Path, description = "The event's id (a `/` in it as %2F)", example = "evt_1")),
    responses((status = 200, body = EventDetail), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 404, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// One event, with its history and its outbox messages.
pub(super) async fn show_event(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
    Params((provider, event_id)): Params<(String, String)>,
) -> Answer<Json<EventDetail>> {
    let Some(e) = ops::stored_event(&state.read, &provider, &event_id).await? else {
        return Err(not_found(&provider, &event_id));
    };
    let history = ops::history(&state.read, &provider, &event_id).await?;
    let outbox = ops::event_messages(&state.read, &provider, &event_id).await?;
    Ok(Json(EventDetail {
        provider: e.provider,
        event_id: e.event_id,
        event_type: e.event_type,
        status: e.status.to_string(),
        source: e.source,
        attempts: e.attempts,
        received_at: rfc3339(e.received_at),
        processed_at: e.processed_at.map(rfc3339),
        next_attempt_at: e.next_attempt_at.map(rfc3339),
        failure_reason: e.failure_reason,
        headers: e.headers.0,
        payload: e.payload.map(|p| p.0),
        held_by: e.held_by,
        erased_at: e.erased_at.map(rfc3339),
        erased_by: e.erased_by,
        restored_at: e.restored_at.map(rfc3339),
        history: history
            .into_iter()
            .map(|h| HistoryItem {
                at: h.at,
                actor: h.actor,
                action: h.action,
                reason: h.reason,
                from_status: h.from_status,
            })
            .collect(),
        outbox: outbox.into_iter().map(MessageItem::from).collect(),
    }))
}

/// Why, for the audit record.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Reason {
    /// 1 to 500 characters.
    #[schema(min_length = 1, max_length = 500)]
    pub(super) reason: String,
}

/// What an action on one event did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Acted {
    provider: String,
    event_id: String,
    /// replayed, or erased.
    outcome: String,
    /// The status it was in (a replay).
    from_status: Option<String>,
    /// Its outbox messages emptied (an erasure).
    outbox_messages: Option<i64>,
    /// Events of its batch whose raw bytes went with its batch's body (an
    /// erasure: the body held this event's data; they keep their payloads).
    batch_siblings: Option<i64>,
}

#[utoipa::path(post, path = "/api/v1/events/{provider}/{event_id}/replay", tag = "events",
    params(("provider" = String, Path, description = "The provider's name", example = "stripe"),
           ("event_id" = String, Path, description = "The event's id (a `/` in it as %2F)", example = "evt_1")),
    request_body = Reason,
    responses((status = 200, body = Acted), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Puts one event (done, failed, unhandled, ignored) back to pending, attempts reset; audited.
pub(super) async fn replay_event(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params((provider, event_id)): Params<(String, String)>,
    Body(body): Body<Reason>,
) -> Answer<Json<Acted>> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let actor = caller.actor();
    let by = Audit { actor: &actor, action: "replay", reason: &why };
    match ops::replay(&state.db, &provider, &event_id, &by).await? {
        Replayed::Requeued { from } => Ok(Json(Acted {
            provider,
            event_id,
            outcome: "replayed".into(),
            from_status: Some(from),
            outbox_messages: None,
            batch_siblings: None,
        })),
        Replayed::AlreadyPending => Err(Refused::Conflict("it is pending already: nothing was changed".into())),
        Replayed::WithoutPayload => Err(Refused::Conflict(
            "it was stored without a payload (its body was never usable): no handler could take it".into(),
        )),
        Replayed::Erased { at, by } => Err(Refused::Conflict(format!("it was erased on {at} by {}", escape(&by)))),
        Replayed::NotFound => Err(not_found(&provider, &event_id)),
    }
}

#[utoipa::path(post, path = "/api/v1/events/{provider}/{event_id}/erase", tag = "events",
    params(("provider" = String, Path, description = "The provider's name", example = "stripe"),
           ("event_id" = String, Path, description = "The event's id (a `/` in it as %2F)", example = "evt_1")),
    request_body = Reason,
    responses((status = 200, body = Acted), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Erases one event's personal data (its key stays: a redelivery is still a duplicate); audited.
pub(super) async fn erase_event(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Params((provider, event_id)): Params<(String, String)>,
    Body(body): Body<Reason>,
) -> Answer<Json<Acted>> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let actor = caller.actor();
    let by = Audit { actor: &actor, action: "erase", reason: &why };
    match ops::erase(&state.db, &provider, &event_id, &by).await? {
        Erased::Erased { messages, siblings } => Ok(Json(Acted {
            provider,
            event_id,
            outcome: "erased".into(),
            from_status: None,
            outbox_messages: Some(messages),
            batch_siblings: Some(siblings),
        })),
        Erased::Already { at, by } => {
            Err(Refused::Conflict(format!("it was erased already, on {at} by {}", escape(&by))))
        }
        Erased::Pending => {
            Err(Refused::Conflict("it is pending: erase it once it is processed, or pause its provider first".into()))
        }
        Erased::NotFound => Err(not_found(&provider, &event_id)),
    }
}
