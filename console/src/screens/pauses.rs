//! The Pauses screen: what processing is paused (by provider, or by provider
//! and type), what each pause holds and since when; an operator pauses and
//! resumes from here, audited, as `inbox pause` and `inbox resume` do.

use std::{sync::Arc, time::Duration};

use askama::Template;
use axum::{
    extract::State as Shared,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::action::{audit_reason, operator_only, ConfirmPage};
use crate::{
    auth::Signed,
    page::{clip, html, optional, short_time, Nav, PageError, Posted},
    State,
};
use webhook_inbox::ops::{self, Audit, PauseScope};

/// A pause from the console raises its alarm (PauseOverdue) after this long, as `inbox pause` does by default.
const ALARM_AFTER: Duration = Duration::from_secs(4 * 3600);

#[derive(Template)]
#[template(path = "console/pauses.html")]
struct PausesPage {
    nav: Nav,
    pauses: Vec<PauseView>,
    held: i64,
    notice: Option<String>,
}

/// A pause as the page shows it (askama escapes every field; a stranger's type is escaped first).
struct PauseView {
    provider: String,
    event_type: String,
    state: &'static str,
    overdue: bool,
    held: i64,
    since: String,
    by: String,
    why: String,
    /// An operator's link to resume it.
    resume: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PausesParams {
    paused: String,
    resumed: String,
}

pub(super) async fn pauses(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<PausesParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let pauses: Vec<PauseView> = ops::pauses(&state.read)
        .await?
        .iter()
        .map(|p| PauseView {
            provider: p.provider.clone(),
            event_type: p.event_type.as_deref().map_or("every type".into(), |t| clip(t, 128)),
            state: p.state(),
            overdue: p.overdue(),
            held: p.held,
            since: short_time(&p.paused_at),
            by: clip(&p.paused_by, 100),
            why: clip(&p.reason, 500),
            resume: (nav.operator() && p.resuming_at.is_none()).then(|| {
                let t = p.event_type.as_deref().unwrap_or("");
                nav.href("/pause", &[("provider", &p.provider), ("type", t), ("pause", "no")])
            }),
        })
        .collect();
    let held = pauses.iter().map(|p| p.held).sum();
    let notice = match (optional(&p.paused), optional(&p.resumed)) {
        (Some(s), _) => Some(format!(
            "{} paused: its events are still received and wait, pending, spending no attempt.",
            clip(&s, 200)
        )),
        (_, Some(s)) => Some(format!(
            "{} resuming: the workers release its held events, oldest first, then it is processed as before.",
            clip(&s, 200)
        )),
        _ => None,
    };
    html(PausesPage { nav, pauses, held, notice })
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PauseParams {
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    /// `no` to resume; to pause otherwise.
    pause: String,
}

/// The scope a form or a link names, or a 400 that says what is wrong.
fn scope_of(provider: &str, event_type: &str) -> Result<PauseScope, PageError> {
    PauseScope::new(provider.trim(), optional(event_type).as_deref())
        .map_err(|why| PageError::BadRequest(format!("Nothing was done: {}.", clip(&why, 200))))
}

pub(super) async fn confirm_pause(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<PauseParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let scope = scope_of(&p.provider, &p.event_type)?;
    let pause = p.pause != "no";
    let nav = signed.nav(&state);
    let shown = clip(&scope.to_string(), 200);
    let current = ops::pauses(&state.read).await?.into_iter().find(|q| q.scope() == scope);
    let mut what = if pause {
        vec![
            format!("From the moment it is saved, no event of {shown} is processed: the batches in flight end first."),
            "Its events are still received (200) and wait, pending, spending no attempt; on resume they are processed in the order they arrived.".into(),
            "Its alarm (PauseOverdue) goes off if it is still paused in 4 hours.".into(),
        ]
    } else {
        let held = current.as_ref().map_or(0, |q| q.held);
        vec![format!(
            "The {held} events of {shown} held now are released, oldest first, and processed in the order they arrived; then new ones as they come."
        )]
    };
    let action = if pause { "pause" } else { "resume" };
    what.push(format!("The audit records it as {action} by {}, with the reason below.", signed.actor()));
    let refused = match (pause, &current) {
        (true, Some(q)) if q.resuming_at.is_none() => Some(format!(
            "{shown} is paused already, by {} since {}.",
            clip(&q.paused_by, 100),
            short_time(&q.paused_at)
        )),
        (false, None) => Some(format!("{shown} is not paused.")),
        (false, Some(q)) if q.resuming_at.is_some() => Some(format!("{shown} is resuming already.")),
        _ => None,
    };
    let page = ConfirmPage {
        title: format!("{} {shown}?", if pause { "Pause" } else { "Resume" }),
        what,
        action: "/pause".into(),
        fields: vec![
            ("provider", scope.provider.clone()),
            ("type", scope.event_type.clone().unwrap_or_default()),
            ("pause", if pause { "yes" } else { "no" }.to_string()),
        ],
        reason: Some(if pause { "paused from the console" } else { "resumed from the console" }),
        button: if pause { "Pause" } else { "Resume" }.into(),
        back: nav.href("/pauses", &[]),
        nav,
        refused,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PauseForm {
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    pause: String,
    reason: String,
    csrf: String,
}

pub(super) async fn pause(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<PauseForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let scope = scope_of(&f.provider, &f.event_type)?;
    let pause = f.pause != "no";
    let actor = signed.actor();
    let (action, default) = match pause {
        true => ("pause", "paused from the console"),
        false => ("resume", "resumed from the console"),
    };
    let reason = audit_reason(&f.reason, default)?;
    let by = Audit { actor: &actor, action, reason: &reason };
    let changed = if pause {
        ops::pause_events(&state.db, &scope, ALARM_AFTER, &by).await?
    } else {
        ops::resume_events(&state.db, &scope, &by).await?.is_some()
    };
    if !changed {
        let why = if pause { "is paused already" } else { "is not paused" };
        return Err(PageError::BadRequest(format!("Nothing was done: {} {why}.", clip(&scope.to_string(), 200))));
    }
    let nav = signed.nav(&state);
    let to = nav.href("/pauses", &[(if pause { "paused" } else { "resumed" }, &scope.to_string())]);
    Ok(Redirect::to(&to).into_response())
}
