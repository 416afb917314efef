//! Requeue by filter: the confirmation, the batches and their progress.

use std::{ops::ControlFlow, sync::Arc};

use askama::Template;
use axum::{extract::State as Shared, response::Response};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::action::{audit_reason, operator_only, streamed, ProgressPage, BATCH};
use crate::{
    auth::Signed,
    page::{clip, html, optional, Nav, PageError, Posted},
    State,
};
use webhook_inbox::ops::{self, Audit, Filter, Since, Status};
use webhook_inbox_schemes::text::Escaped;

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RequeueParams {
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
                        "{:?} is not a status a requeue takes (done, failed, unhandled, ignored).",
                        clip(s, 40)
                    )))
                }
            }
        }
        if statuses.is_empty() {
            return Err(PageError::BadRequest(
                "Choose the statuses to requeue (done, failed, unhandled, ignored).".into(),
            ));
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

pub(super) async fn confirm_requeue(
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
                    "{} of them have no payload (never usable, or erased) and are left as they are.",
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

/// [`RequeueParams`], the audit's reason and the CSRF token (serde's
/// `flatten` cannot carry the repeated `status`).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RequeueForm {
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

/// Runs the requeue in batches, on a task of its own (it finishes even if the
/// page is closed), and streams its progress into the page as it goes: one
/// line per batch, no script needed.
pub(super) async fn requeue(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Posted(f): Posted<RequeueForm>,
) -> Result<Response, PageError> {
    signed.may_act(&f.csrf)?;
    let RequeueForm { status, provider, event_type, since, until, reason_like, reason, .. } = f;
    let filter = RequeueParams { status, provider, event_type, since, until, reason_like }.filter()?;
    let nav = signed.nav(&state);
    let page = ProgressPage { title: "Requeueing", what: describe(&filter), back: nav.href("/events", &[]), nav };
    let (lines, receiver) = tokio::sync::mpsc::unbounded_channel::<String>();
    let actor = signed.actor();
    let reason = audit_reason(&reason, "requeued from the console")?;
    tracing::info!(actor = %actor, filter = %Escaped(&describe(&filter)), "requeue started");
    tokio::spawn(async move {
        let by = Audit { actor: &actor, action: "requeue", reason: &reason };
        let mut batch = 0;
        let done = ops::requeue_all(&state.db, &filter, &by, BATCH, |r| {
            batch += 1;
            let _ = lines.send(format!(
                "<li>batch {batch}: {} of {} requeued</li>\n",
                r.requeued,
                r.matching - r.without_payload
            ));
            ControlFlow::Continue(())
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
    streamed(page, receiver)
}
