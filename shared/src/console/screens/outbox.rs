//! The Outbox screen, and retrying a dead message.

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
use crate::console::{
    auth::Signed,
    page::{html, Nav, PageError, Posted},
    State,
};
use crate::ops::{self, Audit};

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
pub(super) struct OutboxParams {
    retried: String,
}

pub(super) async fn outbox(
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
