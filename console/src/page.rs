//! What every page of the console shares, and nothing of any one screen:
//! its errors and how they are shown, the security headers every response
//! gets, the header with who is signed in, links, and the escaping of a
//! stranger's text. A leaf: the screens, sign-in and health use it.

use std::{sync::Arc, time::Duration};

use askama::Template;
use axum::{
    body::Body,
    extract::{Request, State as Shared},
    http::{header, HeaderMap, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{Html, IntoResponse, Response},
};
use axum_extra::extract::Form;

use super::{ClientIp, State};
use crate::store::UserRole;
use webhook_inbox::ops::{self, escape};
use webhook_inbox_schemes::text::Escaped;

/// Whether this request reached the console over HTTPS: `INBOX_CONSOLE_HTTPS`
/// says so, or the load balancer trusted for the client's address
/// (`INBOX_CONSOLE_CLIENT_IP=x-forwarded-for`) does, in `X-Forwarded-Proto`.
pub(super) fn https(state: &State, headers: &HeaderMap) -> bool {
    state.settings.https
        || (state.settings.client_ip == ClientIp::ForwardedFor
            && headers
                .get_all("x-forwarded-proto")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .next_back()
                .and_then(|v| v.rsplit(',').next())
                .is_some_and(|p| p.trim().eq_ignore_ascii_case("https")))
}

// ---- errors, headers ----

/// Why a page could not be shown, as the person reading it is told.
#[derive(Debug)]
pub(crate) enum PageError {
    /// No such page or event (what was looked for).
    NotFound(String),
    /// The request is wrong, in these words (a stranger's text in it is escaped).
    BadRequest(String),
    /// Not allowed, in these words.
    Forbidden(&'static str),
    /// Too many failed sign-ins: try again after this long.
    TooMany(Duration),
    /// Sign-in is busy checking other passwords: try again in a moment.
    Busy,
    /// Busy in these words (a payload search of the user's running, say): try again in a moment.
    Unavailable(&'static str),
    /// The database refused or did not answer (its text goes to the log only).
    Database(sqlx::Error),
    /// A fault of the console's own (its cause goes to the log only).
    Internal,
}

impl From<sqlx::Error> for PageError {
    fn from(e: sqlx::Error) -> Self {
        PageError::Database(e)
    }
}

/// What [`finish`] renders as the error page: the status and the words.
#[derive(Clone)]
struct Failure(String);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let mut retry_after = None;
        let (status, message) = match self {
            PageError::NotFound(what) => (StatusCode::NOT_FOUND, what),
            PageError::BadRequest(why) => (StatusCode::BAD_REQUEST, why),
            PageError::Forbidden(why) => (StatusCode::FORBIDDEN, why.to_string()),
            PageError::TooMany(wait) => {
                let seconds = wait.as_secs().max(1);
                let message = if seconds > 60 {
                    format!("Too many failed sign-ins: try again in {} minutes.", seconds.div_ceil(60))
                } else {
                    format!("Too many failed sign-ins: try again in {seconds} seconds.")
                };
                retry_after = Some(seconds);
                (StatusCode::TOO_MANY_REQUESTS, message)
            }
            PageError::Busy => {
                retry_after = Some(1);
                (StatusCode::SERVICE_UNAVAILABLE, "Sign-in is busy checking other passwords: try again in a moment.".into())
            }
            PageError::Unavailable(why) => {
                retry_after = Some(1);
                let mut why = why.to_string();
                why[..1].make_ascii_uppercase();
                (StatusCode::SERVICE_UNAVAILABLE, format!("{why}."))
            }
            PageError::Database(e) if ops::sqlstate(&e).as_deref() == Some("57014") => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "The query took longer than its timeout ({} s for a payload search) and was stopped: narrow it (a shorter time range, a provider, a type).",
                    ops::SEARCH_TIMEOUT.as_secs()
                ),
            ),
            PageError::Database(e) => {
                tracing::error!(error = %Escaped(&e.to_string()), "the console's query failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The database refused the query or did not answer; nothing was changed. The console's log has the cause.".into(),
                )
            }
            PageError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "The console failed to show this page; nothing was changed. The console's log has the cause.".into(),
            ),
        };
        let mut r = status.into_response();
        if let Some(seconds) = retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        r.extensions_mut().insert(Failure(message));
        r
    }
}

/// Every response: an action from another site refused; an error rendered as
/// a page; the security headers (a strict Content-Security-Policy: scripts,
/// styles and connections from this console only, nothing inline, no eval;
/// no framing; nothing cached; HSTS when reached over HTTPS).
pub(super) async fn finish(Shared(state): Shared<Arc<State>>, req: Request, next: Next) -> Response {
    let https = https(&state, req.headers());
    let mut response = if req.method() != Method::GET && req.method() != Method::HEAD && cross_site(req.headers()) {
        PageError::Forbidden("A form from another site cannot act here: nothing was done.").into_response()
    } else {
        next.run(req).await
    };
    if let Some(Failure(message)) = response.extensions_mut().remove::<Failure>() {
        let page = ErrorPage { nav: Nav::anonymous(&state), status: response.status().as_u16(), message };
        *response.body_mut() = Body::from(page.render().unwrap_or_else(|_| "error".into()));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    }
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // same-origin, not no-referrer: a browser sends `Origin: null` with a form under no-referrer.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if https {
        // A year: a browser that has seen the console over HTTPS never asks for it over plain HTTP.
        h.insert(header::STRICT_TRANSPORT_SECURITY, HeaderValue::from_static("max-age=31536000"));
    }
    response
}

/// Whether a request that acts came from another site: its `Origin` names
/// another host than the one it was sent to (or is `null`), or the browser
/// says so (`Sec-Fetch-Site: cross-site`). A request with neither header
/// (not a browser's) is judged by its CSRF token alone.
fn cross_site(headers: &HeaderMap) -> bool {
    if headers.get("sec-fetch-site").is_some_and(|v| v == "cross-site") {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return false };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let origin = origin.to_str().unwrap_or("null");
    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or("");
    origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host)
}

pub(super) fn html(page: impl Template) -> Result<Response, PageError> {
    page.render().map(|s| Html(s).into_response()).map_err(|e| {
        tracing::error!(error = %e, "rendering a console page");
        PageError::Internal
    })
}

/// The largest form taken, in bytes: the console's forms are a few fields.
pub(crate) const MAX_FORM_BYTES: usize = 64 * 1024;

/// The fields of a form that was posted, or the page that says it did not
/// arrive whole (never the framework's own words).
pub(super) struct Posted<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> axum::extract::FromRequest<S> for Posted<T> {
    type Rejection = PageError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let form = Form::<T>::from_request(req, state).await;
        form.map(|Form(f)| Posted(f)).map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                PageError::BadRequest(format!("The form is over {} KiB: nothing was done.", MAX_FORM_BYTES / 1024))
            } else {
                PageError::BadRequest("The form did not arrive whole.".into())
            }
        })
    }
}

// ---- what every page shows around it ----

/// The header: where the console is, and who is signed in.
pub(super) struct Nav {
    pub(super) base: String,
    pub(super) user: Option<NavUser>,
}

pub(super) struct NavUser {
    pub(super) name: String,
    pub(super) role: UserRole,
    pub(super) csrf: String,
}

impl Nav {
    pub(super) fn anonymous(state: &State) -> Nav {
        Nav { base: state.base.clone(), user: None }
    }

    pub(super) fn operator(&self) -> bool {
        self.user.as_ref().is_some_and(|u| u.role == UserRole::Operator)
    }

    pub(super) fn csrf(&self) -> &str {
        self.user.as_ref().map_or("", |u| u.csrf.as_str())
    }

    /// A link within the console: `path` with these query pairs (empty values left out).
    pub(super) fn href(&self, path: &str, pairs: &[(&str, &str)]) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
            query.append_pair(k, v);
        }
        let query = query.finish();
        if query.is_empty() {
            format!("{}{path}", self.base)
        } else {
            format!("{}{path}?{query}", self.base)
        }
    }

    pub(super) fn event_href(&self, provider: &str, event_id: &str) -> String {
        self.href("/event", &[("provider", provider), ("id", event_id)])
    }
}

pub(super) use webhook_inbox_schemes::text::short_time;

/// A time as the pages show it: RFC 3339 in UTC, to the second.
pub(super) fn second(at: std::time::SystemTime) -> String {
    short_time(&webhook_inbox_schemes::text::rfc3339(at))
}

/// A stranger's one-line text, escaped and cut to `max` characters.
pub(super) fn clip(text: &str, max: usize) -> String {
    let text = escape(text);
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.into_owned(),
    }
}

/// The text trimmed, if any is left.
pub(super) fn optional(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    nav: Nav,
    status: u16,
    message: String,
}
