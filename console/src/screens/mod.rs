//! The console's screens, one module each (sign-in, sessions, the events
//! listing, one event, requeue, the outbox, pauses, alerts), what their actions share
//! (action), and the router. Every page is a template (askama, which escapes
//! what it writes into HTML); what a stranger sent is also passed through
//! [`escape`](webhook_inbox::ops::escape) first, so that no control or bidirectional
//! character reorders what a person reads.

mod action;
mod alerts;
mod erase;
mod event;
mod events;
mod outbox;
mod pauses;
mod requeue;
mod sessions;
mod signin;

use std::sync::Arc;

use axum::{
    extract::DefaultBodyLimit,
    http::header,
    middleware::from_fn_with_state,
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
    Router,
};

use super::{
    page::{finish, PageError, MAX_FORM_BYTES},
    State,
};

pub(crate) fn router(state: Arc<State>) -> Router {
    let pages = Router::new()
        .route("/", get(signin::home))
        .route("/signin", get(signin::signin_page).post(signin::signin))
        .route("/signout", post(signin::signout))
        .route("/sessions", get(sessions::sessions))
        .route("/sessions/end", post(sessions::end_sessions))
        .route("/events", get(events::events))
        .route("/events/live", get(events::live))
        .route("/event", get(event::event))
        .route("/event/replay", get(event::confirm_replay).post(event::replay))
        .route("/event/erase", get(erase::confirm_erase).post(erase::erase))
        .route("/erase", get(erase::confirm_erase_selection).post(erase::erase_selection))
        .route("/requeue", get(requeue::confirm_requeue).post(requeue::requeue))
        .route("/outbox", get(outbox::outbox))
        .route("/outbox/retry", get(outbox::confirm_retry).post(outbox::retry))
        .route("/outbox/pause", get(outbox::confirm_pause).post(outbox::pause))
        .route("/pauses", get(pauses::pauses))
        .route("/alerts", get(alerts::alerts))
        .route("/alert", get(alerts::confirm).post(alerts::act))
        .route("/pause", get(pauses::confirm_pause).post(pauses::pause))
        .route("/health", get(super::health::health))
        .route("/static/console.css", get(|| asset("text/css; charset=utf-8", include_str!("../console.css"))))
        .route("/static/live.js", get(|| asset("text/javascript; charset=utf-8", include_str!("../live.js"))))
        .route("/static/favicon.svg", get(|| asset("image/svg+xml", include_str!("../favicon.svg"))))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(from_fn_with_state(state.clone(), finish))
        .with_state(state.clone())
        .merge(super::api::router(state.clone()));
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
