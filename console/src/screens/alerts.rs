//! The Alerts screen: the alerts open and acknowledged (and the latest
//! resolved), what each is about and since when; an operator acknowledges
//! or resolves one here, audited, as `inbox alerts ack|resolve` do.

use std::sync::Arc;

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
    page::{clip, html, short_time, Nav, PageError, Posted},
    State,
};
use webhook_inbox::alerts::{self, Alert};
use webhook_inbox::ops::Audit;

#[derive(Template)]
#[template(path = "console/alerts.html")]
struct AlertsPage {
    nav: Nav,
    live: Vec<AlertView>,
    resolved: Vec<AlertView>,
    notice: Option<String>,
}

/// An alert as the page shows it (askama escapes every field; a stranger's text is escaped first).
struct AlertView {
    id: i64,
    state: String,
    rule: String,
    scope: String,
    summary: String,
    since: String,
    last: String,
    seen: i32,
    by: String,
    /// An operator's links: acknowledge (an open alert), resolve (a live one).
    ack: Option<String>,
    resolve: Option<String>,
}

fn view(a: &Alert, nav: &Nav) -> AlertView {
    let live = a.state != "resolved";
    let id = a.id.to_string();
    let by = match (&a.acknowledged_by, &a.resolved_by) {
        (_, Some(r)) => format!("resolved by {}", clip(r, 100)),
        (Some(k), None) => format!("acknowledged by {}", clip(k, 100)),
        _ => String::new(),
    };
    AlertView {
        id: a.id,
        state: a.state.clone(),
        rule: clip(&a.rule, 128),
        scope: clip(&a.scope, 256),
        summary: clip(&a.summary, 500),
        since: short_time(&a.first_seen),
        last: a.resolved_at.as_deref().map_or_else(|| short_time(&a.last_seen), short_time),
        seen: a.seen,
        by,
        ack: (nav.operator() && a.state == "open").then(|| nav.href("/alert", &[("id", &id), ("act", "ack")])),
        resolve: (nav.operator() && live).then(|| nav.href("/alert", &[("id", &id), ("act", "resolve")])),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AlertsParams {
    done: String,
}

pub(super) async fn alerts(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<AlertsParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let all = alerts::list(&state.read, true, 100).await?;
    let (live, resolved): (Vec<&Alert>, Vec<&Alert>) = all.iter().partition(|a| a.state != "resolved");
    let notice = match p.done.as_str() {
        "ack" => Some("Acknowledged: no more reminders; it resolves by itself when its condition clears.".into()),
        "resolve" => Some("Resolved: its notification goes out with the relay's next pass.".into()),
        _ => None,
    };
    let page = AlertsPage {
        live: live.iter().map(|a| view(a, &nav)).collect(),
        resolved: resolved.iter().take(20).map(|a| view(a, &nav)).collect(),
        nav,
        notice,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AlertParams {
    id: String,
    /// `ack` or `resolve`.
    act: String,
}

/// What the link or form asks: the alert's number and the action, or a 400.
fn asked(id: &str, act: &str) -> Result<(i64, bool), PageError> {
    let id = id.parse().map_err(|_| PageError::BadRequest("An alert's number is a number.".into()))?;
    match act {
        "ack" => Ok((id, true)),
        "resolve" => Ok((id, false)),
        _ => Err(PageError::BadRequest("An alert is acknowledged (ack) or resolved (resolve).".into())),
    }
}

pub(super) async fn confirm(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<AlertParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let (id, ack) = asked(&p.id, &p.act)?;
    let alert = alerts::get(&state.read, id).await?.ok_or_else(|| PageError::NotFound(format!("No alert #{id}.")))?;
    let nav = signed.nav(&state);
    let about = format!("Alert #{id}, {}: {}", clip(&alert.rule, 128), clip(&alert.summary, 500));
    let mut what = vec![about];
    what.push(if ack {
        "Acknowledged, it sends no more reminders; it still resolves by itself when its condition clears.".into()
    } else {
        "Resolved now, its resolved notification goes out; if its condition still holds, the next evaluation opens a new alert.".into()
    });
    let action = if ack { "acknowledge_alert" } else { "resolve_alert" };
    what.push(format!("The audit records it as {action} by {}, with the reason below.", signed.actor()));
    let refused = match (ack, alert.state.as_str()) {
        (true, "open") | (false, "open" | "acknowledged") => None,
        (_, state) => Some(format!("Alert #{id} is {state}: nothing to do.")),
    };
    let page = ConfirmPage {
        title: format!("{} alert #{id}?", if ack { "Acknowledge" } else { "Resolve" }),
        what,
        action: "/alert".into(),
        fields: vec![("id", id.to_string()), ("act", p.act.clone())],
        reason: Some(if ack { "acknowledged from the console" } else { "resolved from the console" }),
        button: if ack { "Acknowledge" } else { "Resolve" }.into(),
        back: nav.href("/alerts", &[]),
        nav,
        refused,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AlertForm {
    id: String,
    act: String,
    reason: String,
    csrf: String,
}

pub(super) async fn act(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<AlertForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let (id, ack) = asked(&f.id, &f.act)?;
    let actor = signed.actor();
    let (action, default) = match ack {
        true => ("acknowledge_alert", "acknowledged from the console"),
        false => ("resolve_alert", "resolved from the console"),
    };
    let reason = audit_reason(&f.reason, default)?;
    let by = Audit { actor: &actor, action, reason: &reason };
    let done =
        if ack { alerts::acknowledge(&state.db, id, &by).await? } else { alerts::resolve(&state.db, id, &by).await? };
    if !done {
        let what = if ack { "acknowledged: it is not open" } else { "resolved: it is resolved already" };
        return Err(PageError::BadRequest(format!("Nothing was done: alert #{id} cannot be {what}.")));
    }
    let nav = signed.nav(&state);
    Ok(Redirect::to(&nav.href("/alerts", &[("done", &f.act)])).into_response())
}
