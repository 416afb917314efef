//! The console's pages and actions. Every page is a template (askama, which
//! escapes what it writes into HTML); what a stranger sent is also passed
//! through [`escape`] first, so that no control or bidirectional character
//! reorders what a person reads.

use std::sync::Arc;

use askama::Template;
use axum::{
    body::Body,
    extract::{DefaultBodyLimit, State as Shared},
    http::{header, HeaderMap, StatusCode},
    middleware::from_fn_with_state,
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
    Router,
};
use axum_extra::extract::{cookie::CookieJar, Query};
use serde::Deserialize;

use super::{
    auth::{self, Peer, Signed},
    limiter::Refused,
    page::{clip, finish, html, optional, short_time, Nav, PageError, Posted, MAX_FORM_BYTES},
    State,
};
use crate::{
    core::text::Escaped,
    db::{
        self,
        console::{Ending, Role},
    },
    ops::{
        self, escape, escape_json, Count, Cursor, EventQuery, Filter, IdMatch, PayloadMatch, Replayed, Requeue, Since,
        Status,
    },
};

pub(crate) fn router(state: Arc<State>) -> Router {
    let pages = Router::new()
        .route("/", get(home))
        .route("/signin", get(signin_page).post(signin))
        .route("/signout", post(signout))
        .route("/sessions", get(sessions))
        .route("/sessions/end", post(end_sessions))
        .route("/events", get(events))
        .route("/event", get(event))
        .route("/event/replay", get(confirm_replay).post(replay))
        .route("/requeue", get(confirm_requeue).post(requeue))
        .route("/outbox", get(outbox))
        .route("/outbox/retry", get(confirm_retry).post(retry))
        .route("/health", get(super::health::health))
        .route("/static/console.css", get(|| asset("text/css; charset=utf-8", include_str!("console.css"))))
        .route("/static/favicon.svg", get(|| asset("image/svg+xml", include_str!("favicon.svg"))))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(from_fn_with_state(state.clone(), finish))
        .with_state(state.clone());
    if state.base.is_empty() {
        pages
    } else {
        // `/console/` as well as `/console` (a nested router's own "/" is only the latter).
        let events = format!("{}/events", state.base);
        Router::new()
            .nest(&state.base, pages)
            .route(&format!("{}/", state.base), get(move || async move { Redirect::to(&events) }))
    }
}

async fn not_found() -> PageError {
    PageError::NotFound("There is no such page here.".into())
}

/// A file of the console's own, built into the binary.
async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "max-age=3600")], body).into_response()
}

/// An action's audit reason as the form gave it (`default` when empty), or the page that says it is too long.
fn audit_reason(text: &str, default: &str) -> Result<String, PageError> {
    let text = optional(text).unwrap_or_else(|| default.to_string());
    ops::audit_reason(&text).map_err(|why| PageError::BadRequest(format!("Nothing was done: {why}.")))
}

// ---- sign-in ----

#[derive(Template)]
#[template(path = "console/signin.html")]
struct SignInPage {
    nav: Nav,
    next: String,
    name: String,
    error: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NextParam {
    next: String,
}

async fn home(Shared(state): Shared<Arc<State>>, _: Signed) -> Redirect {
    Redirect::to(&format!("{}/events", state.base))
}

async fn signin_page(Shared(state): Shared<Arc<State>>, Query(p): Query<NextParam>) -> Result<Response, PageError> {
    let next = auth::inside(&state.base, &p.next).unwrap_or_default();
    html(SignInPage { nav: Nav::anonymous(&state), next, name: String::new(), error: None })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SignInForm {
    name: String,
    password: String,
    next: String,
}

async fn signin(
    Shared(state): Shared<Arc<State>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    jar: CookieJar,
    Posted(f): Posted<SignInForm>,
) -> Result<Response, PageError> {
    let name = f.name.trim();
    // What no user can have is refused before the limiter, the database or the log sees it.
    if super::check_name(name).is_err() {
        return Err(PageError::BadRequest(
            "A user name is 1 to 64 letters, digits, '.', '_', '@' or '-': no user has this one.".into(),
        ));
    }
    if f.password.len() > auth::MAX_PASSWORD_BYTES {
        return Err(PageError::BadRequest(format!(
            "A password is at most {} bytes: no user has this one.",
            auth::MAX_PASSWORD_BYTES
        )));
    }
    // A password check at a time per slot; past them, at once: try again.
    let Ok(_hashing) = state.hashing.try_acquire() else { return Err(PageError::Busy) };
    let device = jar.get(&auth::cookie_name(&state, &headers, auth::DEVICE)).map(|c| c.value().to_string());
    let known_device = device.is_some_and(|d| state.limiter.knows(name, &d));
    // Counted as failed before the password is checked; taken back if it is right.
    state.limiter.attempt(name, &peer, known_device).map_err(|refused| match refused {
        Refused::Wait(wait) => PageError::TooMany(wait),
        Refused::Full => PageError::Busy,
    })?;
    let actor = format!("console:{name}");
    let Some(_role) = auth::check_password(&state, name, &f.password).await? else {
        tracing::warn!(user = %name, peer = %peer, "console sign-in refused");
        db::console::audit(&state.db, &actor, "sign_in_failed", name, &format!("from {peer}")).await?;
        let page = SignInPage {
            nav: Nav::anonymous(&state),
            next: auth::inside(&state.base, &f.next).unwrap_or_default(),
            name: name.to_string(),
            error: Some("That name and password do not match a user.".into()),
        };
        return Ok((StatusCode::UNAUTHORIZED, html(page)?).into_response());
    };
    state.limiter.succeeded(name, &peer);
    tracing::info!(user = %name, peer = %peer, "console sign-in");
    auth::replace(&state, &headers, &jar).await?;
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let cookie = auth::sign_in(&state, &headers, name, &db::console::Client { address: &peer, agent }).await?;
    let device = auth::device_cookie(&state, &headers, name);
    // Only back into the console, rebuilt from its path and query: never to another site.
    let to = auth::inside(&state.base, &f.next).unwrap_or_else(|| format!("{}/events", state.base));
    Ok((jar.add(cookie).add(device), Redirect::to(&to)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CsrfForm {
    csrf: String,
}

async fn signout(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    headers: HeaderMap,
    jar: CookieJar,
    Posted(f): Posted<CsrfForm>,
) -> Result<Response, PageError> {
    signed.check_csrf(&f.csrf)?;
    let gone = auth::sign_out(&state, &headers, &signed).await?;
    Ok((jar.add(gone), Redirect::to(&format!("{}/signin", state.base))).into_response())
}

// ---- sessions ----

#[derive(Template)]
#[template(path = "console/sessions.html")]
struct SessionsPage {
    nav: Nav,
    notice: Option<String>,
    sessions: Vec<SessionRow>,
    history: Vec<db::console::AccountRecord>,
    idle_minutes: u64,
}

struct SessionRow {
    id: String,
    current: bool,
    created_at: String,
    last_seen_at: String,
    client: String,
    agent: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionsParams {
    ended: String,
}

/// The signed-in user's sessions, each with a button that ends it, and what
/// the audit recorded about the user lately.
async fn sessions(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<SessionsParams>,
) -> Result<Response, PageError> {
    let current = hex::encode(&signed.token_sha256);
    let sessions = db::console::sessions_of(&state.db, &signed.user, state.settings.idle_timeout)
        .await?
        .into_iter()
        .map(|s| SessionRow {
            current: s.id == current,
            id: s.id,
            created_at: short_time(&s.created_at),
            last_seen_at: short_time(&s.last_seen_at),
            client: clip(s.client.as_deref().unwrap_or("-"), 64),
            agent: clip(s.user_agent.as_deref().unwrap_or("-"), 120),
        })
        .collect();
    let history = db::console::account_history(&state.db, &signed.user, 20)
        .await?
        .into_iter()
        .map(|r| db::console::AccountRecord {
            at: short_time(&r.at),
            actor: clip(&r.actor, 80),
            action: r.action,
            reason: clip(&r.reason, 200),
        })
        .collect();
    let notice = p.ended.parse::<u64>().ok().map(|n| format!("{n} session(s) ended."));
    let idle_minutes = state.settings.idle_timeout.as_secs().div_ceil(60);
    html(SessionsPage { nav: signed.nav(&state), notice, sessions, history, idle_minutes })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct EndForm {
    csrf: String,
    /// The session to end (the SHA-256 of its token, in hex); empty: every other one.
    id: String,
}

/// Ends one of the user's own sessions, or every other one (viewers too: it is their own).
async fn end_sessions(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<EndForm>,
) -> Result<Response, PageError> {
    signed.check_csrf(&f.csrf)?;
    let ended = if f.id.is_empty() {
        db::console::end_sessions(&state.db, &signed.user, "session_end", Ending::AllBut(&signed.token_sha256)).await?
    } else {
        let Ok(id) = hex::decode(&f.id) else {
            return Err(PageError::BadRequest("That is not a session of this list.".into()));
        };
        db::console::end_sessions(&state.db, &signed.user, "session_end", Ending::One(&id)).await?
    };
    Ok(Redirect::to(&format!("{}/sessions?ended={ended}", state.base)).into_response())
}

// ---- the listing ----

#[derive(Deserialize, Default)]
#[serde(default)]
struct ListParams {
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    status: Vec<String>,
    since: String,
    until: String,
    id: String,
    /// `exact` (the default) or `prefix`.
    id_match: String,
    /// Text, or JSON, the payload holds.
    q: String,
    after: String,
}

impl ListParams {
    /// The query these parameters ask for, or what is wrong with them.
    fn query(&self) -> (EventQuery, Option<Cursor>, Vec<String>) {
        let mut errors = Vec::new();
        let mut statuses = Vec::new();
        for s in &self.status {
            match Status::parse(s) {
                Some(s) => statuses.push(s),
                None => errors.push(format!("{:?} is not a status (pending, done, failed, unhandled)", clip(s, 40))),
            }
        }
        let mut time = |text: &str, what: &str| {
            optional(text)
                .and_then(|t| Since::parse(&t).map_err(|e| errors.push(format!("{what}: {}", clip(&e, 120)))).ok())
        };
        let (since, until) = (time(&self.since, "received since"), time(&self.until, "received before"));
        let event_id =
            optional(&self.id)
                .map(|id| if self.id_match == "prefix" { IdMatch::Prefix(id) } else { IdMatch::Exact(id) });
        let after = optional(&self.after).and_then(|a| {
            Cursor::parse(&a).map_err(|_| errors.push("the page cursor is not one this listing gave".into())).ok()
        });
        let query = EventQuery {
            provider: optional(&self.provider).map(|p| p.to_ascii_lowercase()),
            event_type: optional(&self.event_type),
            statuses,
            since,
            until,
            event_id,
            payload: optional(&self.q).map(|q| PayloadMatch::parse(&q)),
        };
        (query, after, errors)
    }

    /// The filters as query pairs (without the cursor).
    fn pairs(&self) -> Vec<(&str, &str)> {
        let mut pairs = vec![("provider", self.provider.as_str()), ("type", self.event_type.as_str())];
        pairs.extend(self.status.iter().map(|s| ("status", s.as_str())));
        pairs.extend([("since", self.since.as_str()), ("until", self.until.as_str()), ("id", self.id.as_str())]);
        pairs.push(("q", self.q.as_str()));
        if !self.id.is_empty() && self.id_match == "prefix" {
            pairs.push(("id_match", "prefix"));
        }
        pairs
    }

    fn has(&self, status: &str) -> bool {
        self.status.iter().any(|s| s == status)
    }
}

/// Events a page.
const PAGE: i64 = 50;

#[derive(Template)]
#[template(path = "console/events.html")]
struct EventsPage {
    nav: Nav,
    f: ListParams,
    counts: Vec<CountView>,
    providers: Vec<String>,
    rows: Vec<Row>,
    errors: Vec<String>,
    next: Option<String>,
    first: Option<String>,
    requeue: Option<String>,
}

struct CountView {
    status: &'static str,
    count: String,
    href: String,
}

struct Row {
    received_at: String,
    provider: String,
    event_type: String,
    event_id: String,
    status: String,
    attempts: i32,
    reason: String,
    href: String,
}

async fn events(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    params: Result<Query<ListParams>, axum_extra::extract::QueryRejection>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let Query(mut f) =
        params.map_err(|_| PageError::BadRequest("The listing's parameters could not be read.".into()))?;
    // A payload search reads every payload in its time range: one day unless told otherwise.
    if !f.q.trim().is_empty() && f.since.trim().is_empty() {
        f.since = "24h".into();
    }
    let (query, after, errors) = f.query();
    let counts = ops::status_counts(&state.read, 10_000)
        .await?
        .into_iter()
        .map(|(status, count)| CountView {
            status: status.as_str(),
            count: match count {
                Count::Exact(n) => n.to_string(),
                Count::AtLeast(n) => format!("{n}+"),
                Count::About(n) => format!("~{n}"),
            },
            href: nav.href("/events", &[("status", status.as_str())]),
        })
        .collect();
    let providers = state.catalog.entries().map(|e| e.provider.as_str().to_string()).collect();
    let (mut rows, mut next) = (Vec::new(), None);
    if errors.is_empty() {
        let page = ops::list_events(&state.read, &query, after.as_ref(), PAGE).await?;
        rows = page
            .events
            .iter()
            .map(|e| Row {
                received_at: short_time(&e.received_at),
                provider: escape(&e.provider).into_owned(),
                event_type: clip(&e.event_type, 80),
                event_id: clip(&e.event_id, 80),
                status: e.status.clone(),
                attempts: e.attempts,
                reason: e.failure_reason.as_deref().map(|r| clip(r, 140)).unwrap_or_default(),
                href: nav.event_href(&e.provider, &e.event_id),
            })
            .collect();
        next = page.next.map(|c| {
            let c = c.to_string();
            let mut pairs = f.pairs();
            pairs.push(("after", &c));
            nav.href("/events", &pairs)
        });
    }
    let first = after.is_some().then(|| nav.href("/events", &f.pairs()));
    // What a requeue could take: events that ended (not pending), of the statuses chosen.
    let requeue =
        (nav.operator() && !query.statuses.is_empty() && !query.statuses.contains(&Status::Pending)).then(|| {
            let mut pairs = vec![("provider", f.provider.as_str()), ("type", f.event_type.as_str())];
            pairs.extend(f.status.iter().map(|s| ("status", s.as_str())));
            nav.href("/requeue", &pairs)
        });
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let page = EventsPage { nav, f, counts, providers, rows, errors, next, first, requeue };
    Ok((status, html(page)?).into_response())
}

// ---- one event ----

#[derive(Deserialize, Default)]
#[serde(default)]
struct EventParams {
    provider: String,
    id: String,
    /// Which notice to show after an action (one of a fixed few; never echoed).
    done: String,
}

#[derive(Template)]
#[template(path = "console/event.html")]
struct EventPage {
    nav: Nav,
    e: EventView,
    notice: Option<&'static str>,
}

struct EventView {
    provider: String,
    event_id: String,
    event_type: String,
    status: String,
    source: String,
    attempts: i32,
    received_at: String,
    processed_at: String,
    next_attempt_at: String,
    failure_reason: Option<String>,
    verification: String,
    /// `ok`, `bad` or none: how the verification is shown.
    verified: &'static str,
    headers: Vec<(String, String)>,
    payload: Option<String>,
    raw: String,
    raw_bytes: usize,
    raw_shown: &'static str,
    history: Vec<HistoryView>,
    messages: Vec<MessageView>,
    replay: Option<String>,
    list: String,
}

struct HistoryView {
    at: String,
    action: String,
    actor: String,
    reason: String,
    before: String,
}

struct MessageView {
    id: i64,
    key: String,
    about: String,
    state: &'static str,
    detail: String,
    /// The retry's confirmation, for an operator and a dead message.
    retry: Option<String>,
}

/// The raw bytes shown at most (the rest is counted, not shown).
const RAW_SHOWN: usize = 256 * 1024;

/// A message as a row; `retry` gives a dead one's retry link (for an operator).
fn message_view(m: &ops::OutboxMessage, retry: impl Fn(i64) -> Option<String>) -> MessageView {
    let (state, detail) = match (&m.sent_at, &m.dead_at) {
        (Some(at), _) => ("sent", format!("sent {}", short_time(at))),
        (None, Some(at)) => {
            ("dead", format!("dead since {}: {}", short_time(at), clip(m.last_error.as_deref().unwrap_or("-"), 300)))
        }
        (None, None) => (
            "waiting",
            format!(
                "waiting, {} attempts{}",
                m.attempts,
                m.last_error.as_deref().map(|e| format!("; last error: {}", clip(e, 300))).unwrap_or_default()
            ),
        ),
    };
    MessageView {
        id: m.id,
        key: clip(&m.message_key, 120),
        about: format!("{} {}", clip(&m.aggregate_type, 60), clip(&m.aggregate_id, 120)),
        retry: if state == "dead" { retry(m.id) } else { None },
        state,
        detail,
    }
}

async fn event(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<EventParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let Some(event) = ops::stored_event(&state.read, &p.provider, &p.id).await? else {
        return Err(PageError::NotFound(format!(
            "No event {} from provider {} is stored (pruned, or never received).",
            clip(&p.id, 200),
            clip(&p.provider, 64)
        )));
    };
    let history = ops::history(&state.read, &p.provider, &p.id).await?;
    let messages = ops::event_messages(&state.read, &p.provider, &p.id).await?;
    let verification = ops::verification(&event, &state.catalog, &state.secrets);
    let headers = match &event.headers.0 {
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => escape(s).into_owned(),
                    other => escape_json(&other.to_string()).into_owned(),
                };
                (escape(k).into_owned(), v)
            })
            .collect(),
        other => vec![("(headers)".into(), escape_json(&other.to_string()).into_owned())],
    };
    let shown = &event.raw_body[..event.raw_body.len().min(RAW_SHOWN)];
    let (raw, raw_shown) = match std::str::from_utf8(shown) {
        Ok(text) => (escape_json(text).into_owned(), "as text (controls escaped)"),
        Err(_) => (hex_dump(shown), "in hexadecimal (not UTF-8)"),
    };
    let replay = (nav.operator() && event.status != Status::Pending.as_str() && event.payload.is_some())
        .then(|| nav.href("/event/replay", &[("provider", &event.provider), ("id", &event.event_id)]));
    let notice = match p.done.as_str() {
        "replayed" => Some("Replayed: the event is pending again, its attempts reset. The worker takes it at its next pass; reload to see it."),
        "retried" => Some("The outbox message is due again, its attempts reset. The relay sends it at its next pass."),
        _ => None,
    };
    let e = EventView {
        list: nav.href("/events", &[("provider", &event.provider)]),
        provider: escape(&event.provider).into_owned(),
        event_id: escape(&event.event_id).into_owned(),
        event_type: escape(&event.event_type).into_owned(),
        status: event.status.clone(),
        source: event.source.clone(),
        attempts: event.attempts,
        received_at: short_time(&event.received_at),
        processed_at: event.processed_at.as_deref().map(short_time).unwrap_or_else(|| "-".into()),
        next_attempt_at: event.next_attempt_at.as_deref().map(short_time).unwrap_or_else(|| "-".into()),
        failure_reason: event.failure_reason.as_deref().map(|r| escape_json(r).into_owned()),
        verified: match (verification.verified(), verification.refuted()) {
            (true, _) => "ok",
            (_, true) => "bad",
            _ => "",
        },
        verification: escape(&verification.to_string()).into_owned(),
        headers,
        payload: event
            .payload
            .as_ref()
            .map(|p| escape_json(&serde_json::to_string_pretty(&p.0).unwrap_or_default()).into_owned()),
        raw,
        raw_bytes: event.raw_body.len(),
        raw_shown,
        history: history
            .iter()
            .map(|h| HistoryView {
                at: short_time(&h.at),
                action: match h.message_id {
                    Some(id) => format!("{} (message #{id})", h.action),
                    None => h.action.clone(),
                },
                actor: escape(&h.actor).into_owned(),
                reason: escape(&h.reason).into_owned(),
                before: format!(
                    "{}, {} attempts{}",
                    h.from_status,
                    h.attempts,
                    h.failure_reason.as_deref().map(|r| format!(": {}", clip(r, 200))).unwrap_or_default()
                ),
            })
            .collect(),
        messages: messages
            .iter()
            .map(|m| {
                message_view(m, |id| {
                    nav.operator().then(|| {
                        let id = id.to_string();
                        nav.href(
                            "/outbox/retry",
                            &[("id", &id), ("provider", &event.provider), ("event", &event.event_id)],
                        )
                    })
                })
            })
            .collect(),
        replay,
    };
    html(EventPage { nav, e, notice })
}

fn hex_dump(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(i, row)| {
            let hex: Vec<String> = row.iter().map(|b| format!("{b:02x}")).collect();
            let text: String =
                row.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
            format!("{:08x}  {:<48}  {text}", i * 16, hex.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- actions ----

#[derive(Template)]
#[template(path = "console/confirm.html")]
struct ConfirmPage {
    nav: Nav,
    title: String,
    /// What will happen, in sentences.
    what: Vec<String>,
    /// The form's action, and its hidden fields (besides the CSRF token).
    action: String,
    fields: Vec<(&'static str, String)>,
    /// The audit's reason, prefilled; none for an action without one.
    reason: Option<&'static str>,
    button: String,
    back: String,
    /// Why it cannot be done, instead of a form.
    refused: Option<String>,
}

fn operator_only(signed: &Signed) -> Result<(), PageError> {
    if signed.role != Role::Operator {
        return Err(PageError::Forbidden("Viewers cannot act: nothing was done. An operator can."));
    }
    Ok(())
}

async fn confirm_replay(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<EventParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let Some(event) = ops::stored_event(&state.read, &p.provider, &p.id).await? else {
        return Err(PageError::NotFound(format!(
            "No event {} from {} is stored.",
            clip(&p.id, 200),
            clip(&p.provider, 64)
        )));
    };
    let name = format!("{} {}", escape(&event.provider), clip(&event.event_id, 200));
    let refused = if event.status == Status::Pending.as_str() {
        Some(format!("{name} is pending already: the worker takes it at its next pass. Nothing to replay."))
    } else if event.payload.is_none() {
        Some(format!("{name} was stored without a payload (its body was never usable): no handler could take it."))
    } else {
        None
    };
    let mut what = vec![format!(
        "{name} ({}, {}) is {} after {} attempts{}.",
        clip(&event.event_type, 80),
        short_time(&event.received_at),
        event.status,
        event.attempts,
        event.failure_reason.as_deref().map(|r| format!(", because: {}", clip(r, 300))).unwrap_or_default()
    )];
    what.push("Replaying puts it back to pending with its attempts reset: the worker runs its handler again at its next pass, in a transaction of its own.".into());
    what.push(format!("The audit records it as a replay by {}, with the reason below.", signed.actor()));
    let page = ConfirmPage {
        back: nav.event_href(&event.provider, &event.event_id),
        nav,
        title: "Replay this event?".into(),
        what,
        action: "/event/replay".into(),
        fields: vec![("provider", event.provider.clone()), ("id", event.event_id.clone())],
        reason: Some("replayed from the console"),
        button: "Replay".into(),
        refused,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ReplayForm {
    provider: String,
    id: String,
    reason: String,
    csrf: String,
}

async fn replay(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<ReplayForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let actor = signed.actor();
    let reason = audit_reason(&f.reason, "replayed from the console")?;
    let by = Requeue { actor: &actor, action: "replay", reason: &reason };
    let back = signed.nav(&state);
    match ops::replay(&state.db, &f.provider, &f.id, &by).await? {
        Replayed::Requeued { .. } => {
            tracing::info!(actor = %actor, provider = %Escaped(&f.provider), event_id = %Escaped(&f.id), "replayed");
            let to = back.href("/event", &[("provider", &f.provider), ("id", &f.id), ("done", "replayed")]);
            Ok(Redirect::to(&to).into_response())
        }
        Replayed::NotFound => Err(PageError::NotFound("No such event is stored.".into())),
        Replayed::AlreadyPending => {
            Err(PageError::BadRequest("The event is pending already: nothing was done.".into()))
        }
        Replayed::WithoutPayload => {
            Err(PageError::BadRequest("The event has no payload (its body was never usable): nothing was done.".into()))
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RequeueParams {
    status: Vec<String>,
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    since: String,
    until: String,
    reason_like: String,
}

impl RequeueParams {
    /// The filter, or what is wrong with the parameters.
    fn filter(&self) -> Result<Filter, PageError> {
        let mut statuses = Vec::new();
        for s in &self.status {
            match Status::parse(s).filter(|s| *s != Status::Pending) {
                Some(s) => statuses.push(s),
                None => {
                    return Err(PageError::BadRequest(format!(
                        "{:?} is not a status a requeue takes (done, failed, unhandled).",
                        clip(s, 40)
                    )))
                }
            }
        }
        if statuses.is_empty() {
            return Err(PageError::BadRequest("Choose the statuses to requeue (done, failed, unhandled).".into()));
        }
        let time = |t: &str| {
            optional(t).map(|t| Since::parse(&t)).transpose().map_err(|e| PageError::BadRequest(clip(&e, 200)))
        };
        Ok(Filter {
            statuses,
            provider: optional(&self.provider).map(|p| p.to_ascii_lowercase()),
            event_type: optional(&self.event_type),
            since: time(&self.since)?,
            until: time(&self.until)?,
            reason_like: optional(&self.reason_like),
        })
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields: Vec<(&'static str, String)> = self.status.iter().map(|s| ("status", s.clone())).collect();
        fields.extend([
            ("provider", self.provider.clone()),
            ("type", self.event_type.clone()),
            ("since", self.since.clone()),
            ("until", self.until.clone()),
            ("reason_like", self.reason_like.clone()),
        ]);
        fields.retain(|(_, v)| !v.is_empty());
        fields
    }
}

#[derive(Template)]
#[template(path = "console/requeue.html")]
struct RequeuePage {
    nav: Nav,
    p: RequeueParams,
    what: Vec<String>,
    matching: i64,
    fields: Vec<(&'static str, String)>,
    back: String,
}

fn describe(filter: &Filter) -> String {
    let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    let mut d = format!("events {}", statuses.join(" or "));
    if let Some(p) = &filter.provider {
        d.push_str(&format!(" from {}", clip(p, 64)));
    }
    if let Some(t) = &filter.event_type {
        d.push_str(&format!(" of type {}", clip(t, 80)));
    }
    let when = |s: &Since| match s {
        Since::Ago(d) => format!("{} s ago", d.as_secs()),
        Since::At(t) => clip(t, 40),
    };
    if let Some(s) = &filter.since {
        d.push_str(&format!(", ended at or after {}", when(s)));
    }
    if let Some(u) = &filter.until {
        d.push_str(&format!(", ended before {}", when(u)));
    }
    if let Some(r) = &filter.reason_like {
        d.push_str(&format!(", whose failure reason is like {:?}", clip(r, 120)));
    }
    d
}

async fn confirm_requeue(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<RequeueParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let back = nav.href("/events", &p.status.iter().map(|s| ("status", s.as_str())).collect::<Vec<_>>());
    let filter = match p.status.is_empty() {
        true => None,
        false => Some(p.filter()?),
    };
    let (what, matching) = match &filter {
        Some(filter) => {
            let found = ops::count_matching(&state.read, filter).await?;
            let mut what = vec![format!("{} match: {}.", found.matching, describe(filter))];
            if found.without_payload > 0 {
                what.push(format!(
                    "{} of them were stored without a payload (never usable) and are left as they are.",
                    found.without_payload
                ));
            }
            what.push(format!(
                "Requeueing puts the others back to pending with their attempts reset, {BATCH} at a time, each batch its own short transaction, with an audit record each (requeue by {}).",
                signed.actor()
            ));
            (what, found.matching - found.without_payload)
        }
        None => (vec![], 0),
    };
    let fields = p.fields();
    html(RequeuePage { nav, p, what, matching, fields, back })
}

/// Requeue and retry work in batches of this many rows.
const BATCH: i64 = 500;

/// [`RequeueParams`], the audit's reason and the CSRF token (serde's
/// `flatten` cannot carry the repeated `status`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct RequeueForm {
    status: Vec<String>,
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    since: String,
    until: String,
    reason_like: String,
    reason: String,
    csrf: String,
}

#[derive(Template)]
#[template(path = "console/progress.html")]
struct ProgressPage {
    nav: Nav,
    what: String,
    back: String,
}

/// Runs the requeue in batches, on a task of its own (it finishes even if the
/// page is closed), and streams its progress into the page as it goes: one
/// line per batch, no script needed.
async fn requeue(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<RequeueForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let RequeueForm { status, provider, event_type, since, until, reason_like, reason, .. } = f;
    let filter = RequeueParams { status, provider, event_type, since, until, reason_like }.filter()?;
    let nav = signed.nav(&state);
    let page = ProgressPage { what: describe(&filter), back: nav.href("/events", &[]), nav }
        .render()
        .map_err(|_| PageError::Internal)?;
    let (head, tail) =
        page.split_once("<!--progress-->").map(|(h, t)| (h.to_string(), t.to_string())).unwrap_or_default();
    let (lines, receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
    let actor = signed.actor();
    let reason = audit_reason(&reason, "requeued from the console")?;
    tracing::info!(actor = %actor, filter = %Escaped(&describe(&filter)), "requeue started");
    tokio::spawn(async move {
        let by = Requeue { actor: &actor, action: "requeue", reason: &reason };
        let mut batch = 0;
        let done = ops::requeue_all(&state.db, &filter, &by, BATCH, |r| {
            batch += 1;
            let _ = lines.send(format!(
                "<li>batch {batch}: {} of {} requeued</li>\n",
                r.requeued,
                r.matching - r.without_payload
            ));
        })
        .await;
        let last = match done {
            Ok(r) => {
                let held = if r.held > 0 {
                    format!(
                        " {} were held by another transaction (a worker, prune) and left: requeue again for them.",
                        r.held
                    )
                } else {
                    String::new()
                };
                format!("<li class=\"done\">Done: {} requeued.{held}</li>\n", r.requeued)
            }
            Err(e) => {
                tracing::error!(error = %Escaped(&e.to_string()), "requeue failed");
                "<li class=\"failed\">Stopped: the database refused or did not answer (the console's log has the cause). What was requeued before stays requeued; run it again for the rest.</li>\n".into()
            }
        };
        let _ = lines.send(last);
    });
    // The page's head, a line per batch as each commits, then the page's end.
    let stream =
        futures_util::stream::unfold((Some(head), receiver, Some(tail)), |(head, mut receiver, tail)| async move {
            if let Some(head) = head {
                return Some((head, (None, receiver, tail)));
            }
            match receiver.recv().await {
                Some(line) => Some((line, (None, receiver, tail))),
                None => tail.map(|t| (t, (None, receiver, None))),
            }
        });
    let body = Body::from_stream(futures_util::StreamExt::map(stream, Ok::<_, std::convert::Infallible>));
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}

#[derive(Template)]
#[template(path = "console/outbox.html")]
struct OutboxPage {
    nav: Nav,
    messages: Vec<MessageView>,
    dead: i64,
    backlog: i64,
    notice: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct OutboxParams {
    retried: String,
}

async fn outbox(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<OutboxParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let gauges = crate::db::outbox::gauges(crate::db::Autocommit(&state.read)).await?;
    let messages = ops::list_unsent(&state.read, true, 100)
        .await?
        .iter()
        .map(|m| message_view(m, |id| nav.operator().then(|| nav.href("/outbox/retry", &[("id", &id.to_string())]))))
        .collect();
    let notice = p.retried.parse::<u64>().ok().map(|n| format!("{n} dead message(s) due again, attempts reset."));
    html(OutboxPage { nav, messages, dead: gauges.dead, backlog: gauges.backlog, notice })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RetryParams {
    /// One message, or (empty) every dead one.
    id: String,
    /// The event whose page to go back to.
    provider: String,
    event: String,
}

async fn confirm_retry(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<RetryParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let gauges = crate::db::outbox::gauges(crate::db::Autocommit(&state.read)).await?;
    let (what, fields) = match p.id.parse::<i64>() {
        Ok(id) => (
            vec![format!("Outbox message #{id} gets a fresh start: due now, its attempts reset; the relay sends it at its next pass, under the same message key.")],
            vec![("id", id.to_string()), ("provider", p.provider.clone()), ("event", p.event.clone())],
        ),
        Err(_) => (
            vec![format!("{} dead outbox message(s) get a fresh start: due now, their attempts reset, {BATCH} at a time; the relay sends them at its next pass, each under its own message key.", gauges.dead)],
            vec![],
        ),
    };
    let mut what = what;
    what.push(format!("The audit records each as retry_outbox by {}, with the reason below.", signed.actor()));
    let back = if p.event.is_empty() { nav.href("/outbox", &[]) } else { nav.event_href(&p.provider, &p.event) };
    let refused =
        (p.id.is_empty() && gauges.dead == 0).then(|| "No outbox message is dead: nothing to retry.".to_string());
    let page = ConfirmPage {
        nav,
        title: "Retry dead outbox messages?".into(),
        what,
        action: "/outbox/retry".into(),
        fields: fields.into_iter().filter(|(_, v)| !v.is_empty()).collect(),
        reason: Some("retried from the console"),
        button: "Retry".into(),
        back,
        refused,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RetryForm {
    id: String,
    provider: String,
    event: String,
    reason: String,
    csrf: String,
}

async fn retry(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<RetryForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let actor = signed.actor();
    let reason = audit_reason(&f.reason, "retried from the console")?;
    let by = Requeue { actor: &actor, action: "retry_outbox", reason: &reason };
    let nav = signed.nav(&state);
    if f.id.is_empty() {
        let mut total = 0;
        loop {
            let n = ops::retry_dead(&state.db, BATCH, &by).await?;
            total += n;
            if n < BATCH as u64 {
                break;
            }
        }
        return Ok(Redirect::to(&nav.href("/outbox", &[("retried", &total.to_string())])).into_response());
    }
    let id: i64 = f.id.parse().map_err(|_| PageError::BadRequest("A message id is a number.".into()))?;
    if !ops::retry_message(&state.db, id, &by).await? {
        return Err(PageError::NotFound(format!("No unsent outbox message #{id} (sent meanwhile, or pruned).")));
    }
    let to = if f.event.is_empty() {
        nav.href("/outbox", &[("retried", "1")])
    } else {
        nav.href("/event", &[("provider", &f.provider), ("id", &f.event), ("done", "retried")])
    };
    Ok(Redirect::to(&to).into_response())
}
