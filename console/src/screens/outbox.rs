//! The Outbox screen: the relay's destinations (pausing and resuming them),
//! and retrying a dead message.

use std::sync::Arc;

use askama::Template;
use axum::{
    extract::State as Shared,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::{
    action::{audit_reason, operator_only, ConfirmPage, BATCH},
    event::{message_view, MessageView},
};
use crate::{
    auth::Signed,
    page::{html, Nav, PageError, Posted},
    State,
};
use webhook_inbox::ops::{self, Audit};

#[derive(Template)]
#[template(path = "console/outbox.html")]
struct OutboxPage {
    nav: Nav,
    destinations: Vec<DestinationView>,
    messages: Vec<MessageView>,
    dead: i64,
    backlog: i64,
    notice: Option<String>,
}

/// A destination as the page shows it (askama escapes every field).
struct DestinationView {
    name: String,
    state: &'static str,
    target: String,
    backlog: i64,
    dead: i64,
    why: String,
    /// An operator's link to pause or resume it, with its label.
    action: Option<(String, &'static str)>,
}

fn destination_view(d: &ops::DestinationState, nav: &Nav) -> DestinationView {
    let paused = d.paused_at.is_some();
    let action = nav.operator().then(|| {
        let href = nav.href("/outbox/pause", &[("name", &d.name), ("pause", if paused { "no" } else { "yes" })]);
        (href, if paused { "Resume…" } else { "Pause…" })
    });
    DestinationView {
        name: d.name.clone(),
        state: d.state(),
        target: d.target.clone().unwrap_or_default(),
        backlog: d.backlog,
        dead: d.dead,
        why: d.why(),
        action,
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct OutboxParams {
    retried: String,
    paused: String,
    resumed: String,
}

pub(super) async fn outbox(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<OutboxParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let gauges = ops::outbox_gauges(&state.read).await?;
    let messages = ops::list_unsent(&state.read, true, 100)
        .await?
        .iter()
        .map(|m| message_view(m, |id| nav.operator().then(|| nav.href("/outbox/retry", &[("id", &id.to_string())]))))
        .collect();
    let destinations = ops::destinations(&state.read).await?.iter().map(|d| destination_view(d, &nav)).collect();
    let notice = match (p.retried.parse::<u64>(), p.paused.as_str(), p.resumed.as_str()) {
        (Ok(n), _, _) => Some(format!("{n} dead message(s) due again, attempts reset.")),
        (_, name, _) if !name.is_empty() => {
            Some(format!("{name} paused: every relay stops sending to it within a second."))
        }
        (_, _, name) if !name.is_empty() => Some(format!("{name} resumed: its messages go, in order.")),
        _ => None,
    };
    html(OutboxPage { nav, destinations, messages, dead: gauges.dead, backlog: gauges.backlog, notice })
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RetryParams {
    /// One message, or (empty) every dead one.
    id: String,
    /// The event whose page to go back to.
    provider: String,
    event: String,
}

pub(super) async fn confirm_retry(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<RetryParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let gauges = ops::outbox_gauges(&state.read).await?;
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
pub(super) struct RetryForm {
    id: String,
    provider: String,
    event: String,
    reason: String,
    csrf: String,
}

pub(super) async fn retry(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<RetryForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let actor = signed.actor();
    let reason = audit_reason(&f.reason, "retried from the console")?;
    let by = Audit { actor: &actor, action: "retry_outbox", reason: &reason };
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

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PauseParams {
    name: String,
    /// `yes` to pause, `no` to resume.
    pause: String,
}

/// A destination's name as the destinations file allows it, or a 400.
fn destination_name(name: &str) -> Result<&str, PageError> {
    ops::is_destination_name(name)
        .then_some(name)
        .ok_or_else(|| PageError::BadRequest("Not a destination's name.".into()))
}

pub(super) async fn confirm_pause(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<PauseParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let name = destination_name(&p.name)?;
    let pause = p.pause != "no";
    let nav = signed.nav(&state);
    let what = if pause {
        vec![
            format!("Every relay stops sending to {name} within a second: what is in flight ends, what is leased goes back untouched."),
            "Its messages wait, none dropped, none spending an attempt, until it is resumed; then they go in order.".into(),
        ]
    } else {
        vec![format!("The relays send {name}'s waiting messages again, in order.")]
    };
    let action = if pause { "pause_destination" } else { "resume_destination" };
    let mut what = what;
    what.push(format!("The audit records it as {action} by {}, with the reason below.", signed.actor()));
    let back = nav.href("/outbox", &[]);
    let page = ConfirmPage {
        nav,
        title: format!("{} {name}?", if pause { "Pause" } else { "Resume" }),
        what,
        action: "/outbox/pause".into(),
        fields: vec![("name", name.to_string()), ("pause", if pause { "yes" } else { "no" }.to_string())],
        reason: Some(if pause { "paused from the console" } else { "resumed from the console" }),
        button: if pause { "Pause" } else { "Resume" }.into(),
        back,
        refused: None,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PauseForm {
    name: String,
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
    let name = destination_name(&f.name)?;
    let pause = f.pause != "no";
    let actor = signed.actor();
    let (action, default) = match pause {
        true => ("pause_destination", "paused from the console"),
        false => ("resume_destination", "resumed from the console"),
    };
    let reason = audit_reason(&f.reason, default)?;
    let by = Audit { actor: &actor, action, reason: &reason };
    if pause {
        ops::pause_destination(&state.db, name, &by).await?;
    } else {
        ops::resume_destination(&state.db, name, &by).await?;
    }
    let nav = signed.nav(&state);
    Ok(Redirect::to(&nav.href("/outbox", &[(if pause { "paused" } else { "resumed" }, name)])).into_response())
}
