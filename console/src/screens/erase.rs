//! Erasing one event from its page (operators), as `inbox erase --provider P --id ID` does;
//! and what a selection finds (one customer's events by what their payloads hold), as `inbox erase --payload ...` does.

use std::{ops::ControlFlow, sync::Arc};

use axum::{
    extract::State as Shared,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::action::{operator_only, streamed, ConfirmPage, ProgressPage};
use crate::{
    auth::Signed,
    page::{clip, html, optional, second, short_time, Nav, PageError, Posted},
    State,
};
use webhook_inbox::ops::{self, Audit, EraseOptions, Erased, EventQuery, PayloadMatch, Since, Status};
use webhook_inbox_schemes::text::{escape, Escaped};

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
    let refused = match (event.erased_at, event.status) {
        (Some(at), _) => Some(format!("{name} was erased already, on {}.", second(at))),
        (None, Status::Pending) => Some(format!(
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
    let reason = erase_reason(&f.reason, None)?;
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

/// An erasure's reason, the console's default when none is given, refused
/// when it holds what is erased ([`ops::erase_reason`]).
fn erase_reason(text: &str, searched: Option<&ops::PayloadMatch>) -> Result<String, PageError> {
    let text = if text.trim().is_empty() { "erased from the console" } else { text };
    ops::erase_reason(text, searched).map_err(|why| PageError::BadRequest(format!("Nothing was done: {why}.")))
}

/// What an erasure by selection takes: the events listing's filters but the status and id.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct SelectionParams {
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    since: String,
    until: String,
    /// Text, or JSON, the payload holds (an e-mail address).
    q: String,
}

impl SelectionParams {
    /// The selection, none when nothing narrows it, or what is wrong with it.
    fn query(&self) -> Result<Option<EventQuery>, PageError> {
        if self.fields().is_empty() {
            return Ok(None);
        }
        let time = |t: &str| {
            optional(t).map(|t| Since::parse(&t)).transpose().map_err(|e| PageError::BadRequest(clip(&e, 200)))
        };
        Ok(Some(EventQuery {
            provider: optional(&self.provider).map(|p| p.to_ascii_lowercase()),
            event_type: optional(&self.event_type),
            since: time(&self.since)?,
            until: time(&self.until)?,
            payload: optional(&self.q).map(|q| PayloadMatch::parse(&q)),
            ..EventQuery::default()
        }))
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("provider", self.provider.clone()),
            ("type", self.event_type.clone()),
            ("since", self.since.clone()),
            ("until", self.until.clone()),
            ("q", self.q.clone()),
        ];
        fields.retain(|(_, v)| !v.trim().is_empty());
        fields
    }

    fn describe(&self) -> String {
        let mut d = String::from("events");
        for (word, value) in [
            ("from", &self.provider),
            ("of type", &self.event_type),
            ("received at or after", &self.since),
            ("received before", &self.until),
            ("whose payload holds", &self.q),
        ] {
            if !value.trim().is_empty() {
                d.push_str(&format!(" {word} {}", clip(value, 120)));
            }
        }
        d
    }
}

#[derive(askama::Template)]
#[template(path = "console/erase_selection.html")]
struct SelectionPage {
    nav: Nav,
    p: SelectionParams,
    what: Vec<String>,
    erasable: u64,
    fields: Vec<(&'static str, String)>,
}

/// The selection's form, and once it narrows anything, what erasing it would do (counted first).
pub(super) async fn confirm_erase_selection(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<SelectionParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let (mut what, mut erasable) = (vec![], 0);
    if let Some(query) = p.query()? {
        let timeout = query.payload.as_ref().map(|_| ops::SEARCH_TIMEOUT);
        let counted = ops::count_erasure(&state.read, &query, timeout).await?;
        erasable = counted.erased;
        what.push(format!("{} match: {}.", counted.matching, p.describe()));
        if counted.pending > 0 {
            what.push(format!(
                "{} of them are pending and are left as they are (a worker may be taking them): erase again once they are processed.",
                counted.pending
            ));
        }
        what.push("Each one's payload, raw bytes, kept headers and failure reason are erased, and the payloads of its outbox messages; its key stays, so a redelivery is still a duplicate. This cannot be undone.".into());
        what.push(format!("They are erased one at a time, each with an audit record (erase by {}).", signed.actor()));
    }
    let fields = p.fields();
    html(SelectionPage { nav, p, what, erasable, fields })
}

/// [`SelectionParams`], the audit's reason and the CSRF token.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct SelectionForm {
    #[serde(flatten)]
    selection: SelectionParams,
    reason: String,
    csrf: String,
}

/// Erases the selection on a task of its own (it finishes even if the page is
/// closed), its progress streamed into the page a page of events at a time.
pub(super) async fn erase_selection(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<SelectionForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let SelectionForm { selection: p, reason, .. } = f;
    let Some(query) = p.query()? else {
        return Err(PageError::BadRequest(
            "Name what to erase (a provider, a type, a time range, what payloads hold): nothing was done.".into(),
        ));
    };
    let reason = erase_reason(&reason, query.payload.as_ref())?;
    let nav = signed.nav(&state);
    let page = ProgressPage { title: "Erasing", what: p.describe(), back: nav.href("/events", &[]), nav };
    let (lines, receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
    let actor = signed.actor();
    // Not the selection: what it searches payloads for is the personal data being erased.
    tracing::info!(actor = %actor, "erasure started");
    tokio::spawn(async move {
        let by = Audit { actor: &actor, action: "erase", reason: &reason };
        let done = ops::erase_matching(&state.db, &query, &by, EraseOptions::default(), |e| {
            if e.erased % 500 == 0 && e.erased > 0 {
                let _ = lines.send(format!("<li>{} erased</li>\n", e.erased));
            }
            ControlFlow::Continue(())
        })
        .await;
        let last = match done {
            Ok(e) => format!(
                "<li class=\"done\">Done: {} erased, {} erased already, {} pending left as they are.</li>\n",
                e.erased, e.already, e.pending
            ),
            Err(e) => {
                tracing::error!(error = %Escaped(&e.to_string()), "erasure failed");
                "<li class=\"failed\">Stopped: the database refused or did not answer (the console's log has the cause). What was erased before stays erased; run it again for the rest.</li>\n".into()
            }
        };
        let _ = lines.send(last);
    });
    streamed(page, receiver)
}
