//! The management API, `/api/v1` beside the console's pages: what the
//! operator's commands do, for machines. JSON in and out; authenticated by
//! API tokens (`Authorization: Bearer ...`, made with `inbox console token
//! add`), with the console's roles (a viewer reads; an operator also acts) and
//! its audit (under `api:<token name>`); rate limited per token; no cookies,
//! so no cross-site request can act. Bulk operations (a requeue, an erasure
//! by selection) run as jobs: an estimate, progress, cancel. The OpenAPI 3.1
//! document at `/api/v1/openapi.json` is generated from this code (utoipa).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{rejection::JsonRejection, DefaultBodyLimit, FromRequestParts, Path, State as Shared},
    http::{header, request::Parts, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use axum_extra::extract::{Query, QueryRejection};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    IntoParams, Modify, OpenApi, ToSchema,
};

use super::State;
use crate::{
    core::{
        selection::{Cursor, EventQuery, Filter, IdMatch, PayloadMatch, Since},
        status::Status,
        text::escape,
    },
    db::{self, api as store, console::UserRole},
    ops::{self, Audit, Erased, Replayed},
};

/// The longest request body taken.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// Events a page at most.
const MAX_PAGE: i64 = 500;

/// An error, as every error of the API is answered: its status, and these words.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ApiError {
    /// What went wrong, and what to do.
    error: String,
}

/// Why a request was refused.
pub(crate) enum Refused {
    BadRequest(String),
    Unauthorized(&'static str),
    Forbidden,
    NotFound(String),
    Conflict(String),
    TooMany(u64),
    Unavailable(String),
}

impl From<sqlx::Error> for Refused {
    fn from(e: sqlx::Error) -> Self {
        match db::sqlstate(&e).as_deref() {
            // A value PostgreSQL cannot read (a timestamp, a NUL byte): the caller's.
            Some(code) if code.starts_with("22") => {
                let detail = match &e {
                    sqlx::Error::Database(d) => d.message().to_string(),
                    _ => String::new(),
                };
                Refused::BadRequest(format!("PostgreSQL cannot read a value given: {}", escape(&detail)))
            }
            Some("57014") => Refused::Unavailable(format!(
                "the query took longer than its timeout ({} s for a payload search) and was stopped: narrow it",
                ops::SEARCH_TIMEOUT.as_secs()
            )),
            _ => {
                tracing::error!(error = %escape(&e.to_string()), "the API's query failed");
                Refused::Unavailable("the database refused the query or did not answer; nothing was changed".into())
            }
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (status, error) = match self {
            Refused::BadRequest(why) => (StatusCode::BAD_REQUEST, why),
            Refused::Unauthorized(why) => (StatusCode::UNAUTHORIZED, why.to_string()),
            Refused::Forbidden => {
                (StatusCode::FORBIDDEN, "this token's role is viewer: it reads, it cannot act".into())
            }
            Refused::NotFound(what) => (StatusCode::NOT_FOUND, what),
            Refused::Conflict(why) => (StatusCode::CONFLICT, why),
            Refused::TooMany(seconds) => {
                (StatusCode::TOO_MANY_REQUESTS, format!("too many requests for this token: retry in {seconds} s"))
            }
            Refused::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        };
        let mut r = (status, Json(ApiError { error })).into_response();
        match status {
            StatusCode::UNAUTHORIZED => {
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        r
    }
}

type Answer<T> = Result<T, Refused>;

/// Requests per second each token may make (`INBOX_API_RATE_PER_SECOND`), and
/// twice that in a burst.
#[derive(Debug)]
pub(crate) struct RateLimit {
    per_second: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimit {
    pub(crate) fn new(per_second: u32) -> RateLimit {
        RateLimit { per_second: per_second as f64, buckets: Mutex::default() }
    }

    /// Whether `name`'s bucket has a request left (taking none).
    fn has(&self, name: &str) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.get(name).map_or(true, |(tokens, at)| *tokens + at.elapsed().as_secs_f64() * self.per_second >= 1.0)
    }

    /// Takes one request from `name`'s bucket, or says how long to wait.
    fn take(&self, name: &str) -> Result<(), u64> {
        let now = Instant::now();
        let burst = self.per_second * 2.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, at) = buckets.entry(name.to_string()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.per_second).ceil().max(1.0) as u64)
        }
    }
}

/// The caller: a live token's name and role.
pub(crate) struct Caller {
    name: String,
    role: UserRole,
}

impl Caller {
    fn actor(&self) -> String {
        format!("api:{}", self.name)
    }

    fn may_act(&self) -> Answer<()> {
        match self.role {
            UserRole::Operator => Ok(()),
            UserRole::Viewer => Err(Refused::Forbidden),
        }
    }
}

/// The prefix every token starts with (a secret scanner can find one).
pub(crate) const TOKEN_PREFIX: &str = "inbox_";

/// A token's SHA-256: what is stored of it.
pub(crate) fn token_sha256(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

impl FromRequestParts<Arc<State>> for Caller {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        // A client whose tokens keep failing is refused before its next one is looked up.
        let super::auth::Peer(client) = match super::auth::Peer::from_request_parts(parts, state).await {
            Ok(peer) => peer,
            Err(never) => match never {},
        };
        let failures = format!("failed from {client}");
        if !state.api_rate.has(&failures) {
            return Err(Refused::TooMany(1));
        }
        match Caller::authenticate(parts, state).await {
            Err(Refused::Unauthorized(why)) => {
                let _ = state.api_rate.take(&failures);
                Err(Refused::Unauthorized(why))
            }
            other => other,
        }
    }
}

impl Caller {
    async fn authenticate(parts: &Parts, state: &Arc<State>) -> Answer<Caller> {
        let header = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")).map(str::trim) else {
            return Err(Refused::Unauthorized("send an API token: Authorization: Bearer <token>"));
        };
        if !token.starts_with(TOKEN_PREFIX) || token.len() > 200 {
            return Err(Refused::Unauthorized("this is not an API token of this inbox"));
        }
        let Some((name, role)) = store::token(&state.db, &token_sha256(token)).await? else {
            return Err(Refused::Unauthorized("this API token is unknown or revoked"));
        };
        state.api_rate.take(&name).map_err(Refused::TooMany)?;
        Ok(Caller { name, role })
    }
}

/// A JSON body, its rejection answered in the API's words.
pub(crate) struct Body<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = Refused;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(t)) => Ok(Body(t)),
            Err(e) => Err(Refused::BadRequest(body_error(e))),
        }
    }
}

fn body_error(e: JsonRejection) -> String {
    escape(&e.body_text()).into_owned()
}

/// Path parameters, their rejection answered in the API's words.
pub(crate) struct Params<T>(T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(t)) => Ok(Params(t)),
            Err(e) => Err(Refused::BadRequest(escape(&e.body_text()).into_owned())),
        }
    }
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Answer<T> {
    q.map(|Query(t)| t).map_err(|e| Refused::BadRequest(escape(&e.body_text()).into_owned()))
}

fn reason(text: &str) -> Answer<String> {
    if text.trim().is_empty() {
        return Err(Refused::BadRequest("reason: say why, for the audit record".into()));
    }
    ops::audit_reason(text).map_err(Refused::BadRequest)
}

fn since(text: Option<&str>, what: &str) -> Answer<Option<Since>> {
    text.filter(|t| !t.trim().is_empty())
        .map(|t| Since::parse(t).map_err(|e| Refused::BadRequest(format!("{what}: {}", escape(&e)))))
        .transpose()
}

fn statuses(text: Option<&str>, allowed: &[Status]) -> Answer<Vec<Status>> {
    let mut found = Vec::new();
    for name in text.unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Status::parse(name).filter(|s| allowed.contains(s)) {
            Some(s) => found.push(s),
            None => {
                let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
                return Err(Refused::BadRequest(format!("{:?} is not one of {}", escape(name), names.join(", "))));
            }
        }
    }
    Ok(found)
}

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
    received_at: String,
    failure_reason: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/events", tag = "events", params(EventsParams),
    responses((status = 200, body = EventsPage), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Events, newest first, by the console's filters, a page at a time.
async fn list_events(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
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
    received_at: String,
    processed_at: Option<String>,
    next_attempt_at: Option<String>,
    failure_reason: Option<String>,
    /// The delivery's headers that were kept.
    headers: Value,
    /// The payload (none for a body never usable, or erased).
    payload: Option<Value>,
    /// The pause holding it, while one does.
    held_by: Option<i64>,
    /// When it was erased, and by whom.
    erased_at: Option<String>,
    erased_by: Option<String>,
    /// When it was put back from prune's archive, if it was.
    restored_at: Option<String>,
    /// What was done to it, oldest first.
    history: Vec<HistoryItem>,
    /// The messages its handlers wrote.
    outbox: Vec<MessageItem>,
}

/// An audit record.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryItem {
    at: String,
    actor: String,
    action: String,
    reason: String,
    from_status: String,
}

/// An outbox message.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageItem {
    id: i64,
    message_key: String,
    destination: String,
    attempts: i32,
    created_at: String,
    sent_at: Option<String>,
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
async fn show_event(
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
        status: e.status,
        source: e.source,
        attempts: e.attempts,
        received_at: e.received_at,
        processed_at: e.processed_at,
        next_attempt_at: e.next_attempt_at,
        failure_reason: e.failure_reason,
        headers: e.headers.0,
        payload: e.payload.map(|p| p.0),
        held_by: e.held_by,
        erased_at: e.erased_at,
        erased_by: e.erased_by,
        restored_at: e.restored_at,
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
    reason: String,
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
}

#[utoipa::path(post, path = "/api/v1/events/{provider}/{event_id}/replay", tag = "events",
    params(("provider" = String, Path, description = "The provider's name", example = "stripe"),
           ("event_id" = String, Path, description = "The event's id (a `/` in it as %2F)", example = "evt_1")),
    request_body = Reason,
    responses((status = 200, body = Acted), (status = 400, body = ApiError), (status = 401, body = ApiError),
               (status = 403, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError),
               (status = 429, body = ApiError), (status = 503, body = ApiError)))]
/// Puts one event (done, failed, unhandled, ignored) back to pending, attempts reset; audited.
async fn replay_event(
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
async fn erase_event(
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
        Erased::Erased { messages } => Ok(Json(Acted {
            provider,
            event_id,
            outcome: "erased".into(),
            from_status: None,
            outbox_messages: Some(messages),
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
async fn start_requeue(
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
async fn start_erase(
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
async fn list_jobs(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<JobsPage>> {
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
async fn get_job(Shared(state): Shared<Arc<State>>, _: Caller, Params(id): Params<String>) -> Answer<Json<JobView>> {
    let id = job_id(&id)?;
    let job = store::job(&state.db, id).await?.ok_or_else(|| Refused::NotFound(format!("no job {id}")))?;
    Ok(Json(job.into()))
}

#[utoipa::path(delete, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path, description = "The job's id", example = 1)),
    responses((status = 202, body = JobView), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError),
               (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 429, body = ApiError),
               (status = 503, body = ApiError)))]
/// Cancels a running job: it stops after its current batch (what it did stays done).
async fn cancel_job(
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
async fn list_outbox(
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
async fn retry_message(
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
async fn list_destinations(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<DestinationsPage>> {
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
async fn list_pauses(Shared(state): Shared<Arc<State>>, _: Caller) -> Answer<Json<PausesPage>> {
    Ok(Json(PausesPage { pauses: ops::pauses(&state.read).await? }))
}

/// Alerts.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AlertsPage {
    alerts: Vec<crate::alerts::Alert>,
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
async fn list_alerts(
    Shared(state): Shared<Arc<State>>,
    _: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    params: Result<Query<AlertsParams>, QueryRejection>,
) -> Answer<Json<AlertsPage>> {
    refuse_empty(raw.as_deref(), &["resolved"])?;
    let p = query(params)?;
    Ok(Json(AlertsPage { alerts: crate::alerts::list(&state.read, p.resolved.unwrap_or(false), 100).await? }))
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
async fn pause(
    Shared(state): Shared<Arc<State>>,
    caller: Caller,
    Body(body): Body<PauseRequest>,
) -> Answer<Json<Paused>> {
    caller.may_act()?;
    let why = reason(&body.reason)?;
    let scope = scope(&body.provider, body.event_type.as_deref())?;
    let alarm_after = match body.alarm_after.as_deref() {
        None => Duration::from_secs(4 * 3600),
        Some(t) => crate::alerts::parse_duration(t).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
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
async fn resume(
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
async fn act_on_alert(
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
            (crate::alerts::acknowledge(&state.db, alert, &by).await?, "acknowledged")
        }
        "resolve" => {
            let by = Audit { actor: &actor, action: "resolve_alert", reason: &why };
            (crate::alerts::resolve(&state.db, alert, &by).await?, "resolved")
        }
        _ => {
            return Err(Refused::NotFound(format!(
                "{:?} is not an alert's action: acknowledge or resolve",
                escape(&action)
            )))
        }
    };
    if !done {
        return match crate::alerts::get(&state.db, alert).await? {
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
async fn act_on_destination(
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

/// The form decoder reads `name=` as no value at all: an empty one of these is refused.
fn refuse_empty(raw: Option<&str>, names: &[&str]) -> Answer<()> {
    let pairs = form_urlencoded::parse(raw.unwrap_or_default().as_bytes());
    match pairs.into_iter().find(|(k, v)| names.contains(&&**k) && v.trim().is_empty()) {
        Some((name, _)) => Err(Refused::BadRequest(format!("{name} is empty: give one, or leave it out"))),
        None => Ok(()),
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API token: inbox console token add NAME --role viewer|operator"))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "webhook-inbox management API", version = "1",
         description = "The operator's commands for machines: events, replay, requeue and erase (as jobs), jobs, the outbox and its destinations, pauses, alerts. docs/api.md."),
    paths(list_events, show_event, replay_event, erase_event, start_requeue, start_erase, list_jobs, get_job, cancel_job,
          list_outbox, retry_message, list_destinations, act_on_destination, list_pauses, pause, resume, list_alerts,
          act_on_alert),
    modifiers(&BearerAuth),
    security(("token" = [])),
)]
struct ApiDoc;

/// The OpenAPI document, its server the console's base.
fn document(base: &str) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    let url = if base.is_empty() { "/".to_string() } else { base.to_string() };
    doc.servers = Some(vec![utoipa::openapi::Server::new(url)]);
    doc
}

async fn openapi(Shared(state): Shared<Arc<State>>) -> Response {
    let doc = document(&state.base);
    ([(header::CACHE_CONTROL, "no-store")], Json(doc)).into_response()
}

async fn no_such_route() -> Refused {
    Refused::NotFound("there is no such API route (the document: /api/v1/openapi.json)".into())
}

/// The API's routes, under `/api/v1`.
pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/events", get(list_events))
        .route("/api/v1/events/{provider}/{event_id}", get(show_event))
        .route("/api/v1/events/{provider}/{event_id}/replay", post(replay_event))
        .route("/api/v1/events/{provider}/{event_id}/erase", post(erase_event))
        .route("/api/v1/requeue", post(start_requeue))
        .route("/api/v1/erase", post(start_erase))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/{id}", get(get_job).delete(cancel_job))
        .route("/api/v1/outbox", get(list_outbox))
        .route("/api/v1/outbox/{id}/retry", post(retry_message))
        .route("/api/v1/destinations", get(list_destinations))
        .route("/api/v1/destinations/{name}/{action}", post(act_on_destination))
        .route("/api/v1/pauses", get(list_pauses).post(pause))
        .route("/api/v1/pauses/resume", post(resume))
        .route("/api/v1/alerts", get(list_alerts))
        .route("/api/v1/alerts/{id}/{action}", post(act_on_alert))
        .route("/api/v1", axum::routing::any(no_such_route))
        .route("/api/v1/", axum::routing::any(no_such_route))
        .route("/api/v1/{*rest}", axum::routing::any(no_such_route))
        .method_not_allowed_fallback(|| async {
            let mut r = Refused::BadRequest(String::new()).into_response();
            *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            *r.body_mut() = axum::body::Body::from(
                r#"{"error":"this route does not take this method (the document: /api/v1/openapi.json)"}"#,
            );
            r
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(|mut r: Response| async move {
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_burst_and_refills() {
        let limit = RateLimit::new(5);
        for _ in 0..10 {
            assert!(limit.take("a").is_ok());
        }
        assert_eq!(limit.take("a"), Err(1));
        assert!(limit.take("b").is_ok(), "each token has its own");
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_route() {
        let doc = serde_json::to_value(document("/console")).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["servers"][0]["url"], "/console");
        for path in ["/api/v1/events", "/api/v1/events/{provider}/{event_id}/replay", "/api/v1/jobs/{id}"] {
            assert!(doc["paths"].get(path).is_some(), "{path}");
        }
        assert_eq!(doc["components"]["securitySchemes"]["token"]["scheme"], "bearer");
    }
}
