//! Erasing one event from its page (operators), as `inbox erase --provider P --id ID` does.

use std::sync::Arc;

use axum::{
    extract::State as Shared,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::action::{audit_reason, operator_only, ConfirmPage};
use crate::console::{
    auth::Signed,
    page::{clip, html, short_time, PageError, Posted},
    State,
};
use crate::core::text::escape;
use crate::ops::{self, Audit, Erased};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct EraseParams {
    provider: String,
    id: String,
}

pub(super) async fn confirm_erase(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<EraseParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let event = super::event::stored(&state, &p.provider, &p.id).await?;
    let name = format!("{} {}", escape(&event.provider), clip(&event.event_id, 200));
    let refused = match (&event.erased_at, event.status.as_str()) {
        (Some(at), _) => Some(format!("{name} was erased already, on {}.", short_time(at))),
        (None, "pending") => Some(format!(
            "{name} is pending: a worker may be taking it. Erase it once it is processed, or pause its provider first."
        )),
        _ => None,
    };
    let what = vec![
        format!("{name}'s payload, raw bytes, kept headers and failure reason are erased, and the payloads of the outbox messages its handler wrote (those not sent yet are not sent)."),
        "Its key, provider, type, times and status stay: a redelivery is still a duplicate. It cannot be replayed afterwards. This cannot be undone.".into(),
        format!("The audit records it as erase by {}, with the reason below.", signed.actor()),
    ];
    let page = ConfirmPage {
        back: nav.event_href(&event.provider, &event.event_id),
        nav,
        title: "Erase this event?".into(),
        what,
        action: "/event/erase".into(),
        fields: vec![("provider", event.provider.clone()), ("id", event.event_id.clone())],
        reason: Some("erased from the console"),
        button: "Erase".into(),
        refused,
    };
    html(page)
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct EraseForm {
    provider: String,
    id: String,
    reason: String,
    csrf: String,
}

pub(super) async fn erase(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<EraseForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let actor = signed.actor();
    let reason = audit_reason(&f.reason, "erased from the console")?;
    let by = Audit { actor: &actor, action: "erase", reason: &reason };
    let name = format!("{} {}", clip(&f.provider, 64), clip(&f.id, 200));
    match ops::erase(&state.db, &f.provider, &f.id, &by).await? {
        Erased::Erased { .. } => {
            let nav = signed.nav(&state);
            Ok(Redirect::to(&nav.href("/event", &[("provider", &f.provider), ("id", &f.id), ("done", "erased")]))
                .into_response())
        }
        Erased::Already { at, .. } => {
            Err(PageError::BadRequest(format!("{name} was erased already, on {}: nothing was done.", short_time(&at))))
        }
        Erased::Pending => Err(PageError::BadRequest(format!(
            "{name} is pending: nothing was done. Erase it once it is processed, or pause its provider first."
        ))),
        Erased::NotFound => Err(PageError::NotFound("No such event is stored.".into())),
    }
}
