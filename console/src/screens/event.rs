//! One event: its payload, raw bytes, history and outbox messages, and its replay.

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
    page::{clip, html, second, short_time, Nav, PageError, Posted},
    State,
};
use webhook_inbox::ops::{self, escape, escape_json, Audit, Replayed, Status};
use webhook_inbox_schemes::text::Escaped;

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct EventParams {
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
    status: &'static str,
    /// Held by a pause: the Pauses page's link.
    held: Option<String>,
    /// Erased: when, and by whom.
    erased: Option<String>,
    /// When its raw bytes went with a batch sibling's erasure.
    raw_erased: Option<String>,
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
    /// An operator's link to erase it (processed, not erased yet).
    erase: Option<String>,
    list: String,
}

struct HistoryView {
    at: String,
    action: String,
    actor: String,
    reason: String,
    before: String,
}

pub(super) struct MessageView {
    pub(super) id: i64,
    pub(super) key: String,
    pub(super) about: String,
    pub(super) state: &'static str,
    pub(super) detail: String,
    /// The retry's confirmation, for an operator and a dead message.
    pub(super) retry: Option<String>,
}

/// The raw bytes shown at most (the rest is counted, not shown).
const RAW_SHOWN: usize = 256 * 1024;

/// A message as a row; `retry` gives a dead one's retry link (for an operator).
pub(super) fn message_view(m: &ops::OutboxMessage, retry: impl Fn(i64) -> Option<String>) -> MessageView {
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

pub(super) async fn event(
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
    let replay = (nav.operator() && event.status != Status::Pending && event.payload.is_some())
        .then(|| nav.href("/event/replay", &[("provider", &event.provider), ("id", &event.event_id)]));
    let notice = match p.done.as_str() {
        "replayed" => Some("Replayed: the event is pending again, its attempts reset. The worker takes it at its next pass; reload to see it."),
        "retried" => Some("The outbox message is due again, its attempts reset. The relay sends it at its next pass."),
        "erased" => Some("Erased: its payload, raw bytes and headers are gone; its key stays, so a redelivery is still a duplicate."),
        _ => None,
    };
    let e = EventView {
        list: nav.href("/events", &[("provider", &event.provider)]),
        provider: escape(&event.provider).into_owned(),
        event_id: escape(&event.event_id).into_owned(),
        event_type: escape(&event.event_type).into_owned(),
        status: event.status.as_str(),
        held: event.held_by.map(|_| nav.href("/pauses", &[])),
        erased: event
            .erased_at
            .map(|at| format!("{} by {}", second(at), clip(event.erased_by.as_deref().unwrap_or("?"), 100))),
        raw_erased: event.raw_erased_at.map(second),
        source: event.source.clone(),
        attempts: event.attempts,
        received_at: second(event.received_at),
        processed_at: event.processed_at.map_or_else(|| "-".into(), second),
        next_attempt_at: event.next_attempt_at.map_or_else(|| "-".into(), second),
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
        erase: (nav.operator() && event.status != Status::Pending && event.erased_at.is_none())
            .then(|| nav.href("/event/erase", &[("provider", &event.provider), ("id", &event.event_id)])),
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

/// The event an action names, or the page that says it is not stored.
pub(super) async fn stored(state: &State, provider: &str, id: &str) -> Result<ops::StoredEvent, PageError> {
    ops::stored_event(&state.read, provider, id).await?.ok_or_else(|| {
        PageError::NotFound(format!("No event {} from {} is stored.", clip(id, 200), clip(provider, 64)))
    })
}

pub(super) async fn confirm_replay(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<EventParams>,
) -> Result<Response, PageError> {
    operator_only(&signed)?;
    let nav = signed.nav(&state);
    let event = stored(&state, &p.provider, &p.id).await?;
    let name = format!("{} {}", escape(&event.provider), clip(&event.event_id, 200));
    let refused = if event.status == Status::Pending {
        Some(format!("{name} is pending already: the worker takes it at its next pass. Nothing to replay."))
    } else if event.payload.is_none() {
        Some(format!("{name} was stored without a payload (its body was never usable): no handler could take it."))
    } else {
        None
    };
    let mut what = vec![format!(
        "{name} ({}, {}) is {} after {} attempts{}.",
        clip(&event.event_type, 80),
        second(event.received_at),
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
pub(super) struct ReplayForm {
    provider: String,
    id: String,
    reason: String,
    csrf: String,
}

pub(super) async fn replay(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<ReplayForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let actor = signed.actor();
    let reason = audit_reason(&f.reason, "replayed from the console")?;
    let by = Audit { actor: &actor, action: "replay", reason: &reason };
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
        Replayed::Erased { at, by } => Err(PageError::BadRequest(format!(
            "The event was erased on {} by {}: nothing is left to process; nothing was done.",
            short_time(&at),
            clip(&by, 100)
        ))),
    }
}
