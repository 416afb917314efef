//! The Sessions screen: who is signed in, and ending sessions.

use std::sync::Arc;

use askama::Template;
use axum::{
    extract::State as Shared,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::Query;
use serde::Deserialize;

use crate::store::{self as console_store, Ending};
use crate::{
    auth::Signed,
    page::{clip, html, short_time, Nav, PageError, Posted},
    State,
};

#[derive(Template)]
#[template(path = "console/sessions.html")]
struct SessionsPage {
    nav: Nav,
    notice: Option<String>,
    sessions: Vec<SessionRow>,
    history: Vec<console_store::AccountRecord>,
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
pub(super) struct SessionsParams {
    ended: String,
}

/// The signed-in user's sessions, each with a button that ends it, and what
/// the audit recorded about the user lately.
pub(super) async fn sessions(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<SessionsParams>,
) -> Result<Response, PageError> {
    let current = hex::encode(&signed.token_sha256);
    let sessions = console_store::sessions_of(&state.db, &signed.user, state.settings.idle_timeout)
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
    let history = console_store::account_history(&state.db, &signed.user, 20)
        .await?
        .into_iter()
        .map(|r| console_store::AccountRecord {
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
pub(super) struct EndForm {
    csrf: String,
    /// The session to end (the SHA-256 of its token, in hex); empty: every other one.
    id: String,
}

/// Ends one of the user's own sessions, or every other one (viewers too: it is their own).
pub(super) async fn end_sessions(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<EndForm>,
) -> Result<Response, PageError> {
    signed.check_csrf(&f.csrf)?;
    let ended = if f.id.is_empty() {
        console_store::end_sessions(&state.db, &signed.user, "session_end", Ending::AllBut(&signed.token_sha256))
            .await?
    } else {
        let Ok(id) = hex::decode(&f.id) else {
            return Err(PageError::BadRequest("That is not a session of this list.".into()));
        };
        console_store::end_sessions(&state.db, &signed.user, "session_end", Ending::One(&id)).await?
    };
    Ok(Redirect::to(&format!("{}/sessions?ended={ended}", state.base)).into_response())
}
