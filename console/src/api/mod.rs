//! The management API, `/api/v1` beside the console's pages: what the
//! operator's commands do, for machines. JSON in and out; authenticated by
//! API tokens (`Authorization: Bearer ...`, made with `inbox console token
//! add`), with the console's roles (a viewer reads; an operator also acts) and
//! its audit (under `api:<token name>`); rate limited per token; no cookies,
//! so no cross-site request can act. Bulk operations (a requeue, an erasure
//! by selection) run as jobs: an estimate, progress, cancel. The OpenAPI 3.1
//! document at `/api/v1/openapi.json` is generated from this code (utoipa).

mod admin;
mod auth;
mod events;
mod jobs;

use std::sync::Arc;

use axum::{
    extract::{rejection::JsonRejection, DefaultBodyLimit, FromRequestParts, Path, State as Shared},
    http::{header, request::Parts, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use axum_extra::extract::{Query, QueryRejection};
use serde::Serialize;
use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi, ToSchema,
};

pub(crate) use auth::{token_sha256, unauthenticated, FAILURES_BURST, TOKEN_PREFIX};

use super::State;
use admin::*;
use events::*;
use jobs::*;
use webhook_inbox::ops::{self, Since, Status};
use webhook_inbox_schemes::text::escape;

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
    /// A token's rate is spent: retry in this many seconds.
    TooMany(u64),
    /// This client's failed authentications are: retry in this many seconds.
    TooManyFailures(u64),
    /// A payload search is refused for now: the caller's own is running (429), or as many as allowed (503).
    Searching(super::quota::SearchBusy),
    Unavailable(String),
}

impl From<sqlx::Error> for Refused {
    fn from(e: sqlx::Error) -> Self {
        match ops::sqlstate(&e).as_deref() {
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

impl From<ops::Error> for Refused {
    fn from(e: ops::Error) -> Self {
        match e {
            ops::Error::NotFound(what) => Refused::NotFound(what),
            ops::Error::Conflict(why) => Refused::Conflict(why),
            ops::Error::Database(e) => e.into(),
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let retry_after = match self {
            Refused::TooMany(s) | Refused::TooManyFailures(s) => Some(s),
            _ => None,
        };
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
            Refused::TooManyFailures(seconds) => (
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many failed authentications from this address: retry in {seconds} s (a valid token is served)"
                ),
            ),
            Refused::Searching(busy @ super::quota::SearchBusy::Caller) => {
                (StatusCode::TOO_MANY_REQUESTS, busy.words().into())
            }
            Refused::Searching(busy) => (StatusCode::SERVICE_UNAVAILABLE, busy.words().into()),
            Refused::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        };
        let mut r = (status, Json(ApiError { error })).into_response();
        match status {
            StatusCode::UNAUTHORIZED => {
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after.unwrap_or(1)));
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        r
    }
}

type Answer<T> = Result<T, Refused>;

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

/// The headers of every answer: never cached, never read as anything but what it says.
fn api_headers(r: &mut Response) {
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
}

/// Where the API's document is served, under the console's base: named in
/// the answers to a route or a method the API does not have.
fn document_path(state: &State) -> String {
    format!("{}/api/v1/openapi.json", state.base)
}

async fn no_such_route(Shared(state): Shared<Arc<State>>) -> Refused {
    Refused::NotFound(format!("there is no such API route (the document: {})", document_path(&state)))
}

/// The API's routes, under `/api/v1`.
pub(crate) fn router(state: Arc<State>) -> Router {
    let wrong_method = serde_json::json!({
        "error": format!("this route does not take this method (the document: {})", document_path(&state))
    })
    .to_string();
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
        .method_not_allowed_fallback(move || {
            let body = wrong_method.clone();
            async move {
                let mut r = Refused::BadRequest(String::new()).into_response();
                *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
                *r.body_mut() = axum::body::Body::from(body);
                r
            }
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(|mut r: Response| async move {
            api_headers(&mut r);
            r
        }))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

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
