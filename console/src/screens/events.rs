//! The Events screen: the listing, its filters and its counts.

use std::{
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use askama::Template;
use axum::{
    extract::State as Shared,
    http::StatusCode,
    response::{
        sse::{Event as Sent, KeepAlive, Sse},
        IntoResponse, Response,
    },
};
use axum_extra::extract::Query;
use serde::{Deserialize, Serialize};

use crate::{
    auth::Signed,
    page::{clip, html, optional, short_time, Nav, PageError},
    State,
};
use webhook_inbox::ops::{self, escape, Count, Cursor, EventQuery, EventSummary, IdMatch, PayloadMatch, Since, Status};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ListParams {
    provider: String,
    #[serde(rename = "type")]
    event_type: String,
    status: Vec<String>,
    since: String,
    until: String,
    id: String,
    /// `exact` (the default) or `prefix`.
    id_match: String,
    /// Text, or JSON, the payload holds.
    q: String,
    after: String,
}

impl ListParams {
    /// The query these parameters ask for, or what is wrong with them.
    fn query(&self) -> (EventQuery, Option<Cursor>, Vec<String>) {
        let mut errors = Vec::new();
        let mut statuses = Vec::new();
        for s in &self.status {
            match Status::parse(s) {
                Some(s) => statuses.push(s),
                None => errors
                    .push(format!("{:?} is not a status (pending, done, failed, unhandled, ignored)", clip(s, 40))),
            }
        }
        let mut time = |text: &str, what: &str| {
            optional(text)
                .and_then(|t| Since::parse(&t).map_err(|e| errors.push(format!("{what}: {}", clip(&e, 120)))).ok())
        };
        let (since, until) = (time(&self.since, "received since"), time(&self.until, "received before"));
        let event_id =
            optional(&self.id)
                .map(|id| if self.id_match == "prefix" { IdMatch::Prefix(id) } else { IdMatch::Exact(id) });
        let after = optional(&self.after).and_then(|a| {
            Cursor::parse(&a).map_err(|_| errors.push("the page cursor is not one this listing gave".into())).ok()
        });
        let query = EventQuery {
            provider: optional(&self.provider).map(|p| p.to_ascii_lowercase()),
            event_type: optional(&self.event_type),
            statuses,
            since,
            until,
            event_id,
            payload: optional(&self.q).map(|q| PayloadMatch::parse(&q)),
        };
        (query, after, errors)
    }

    /// The filters as query pairs (without the cursor).
    fn pairs(&self) -> Vec<(&str, &str)> {
        let mut pairs = vec![("provider", self.provider.as_str()), ("type", self.event_type.as_str())];
        pairs.extend(self.status.iter().map(|s| ("status", s.as_str())));
        pairs.extend([("since", self.since.as_str()), ("until", self.until.as_str()), ("id", self.id.as_str())]);
        pairs.push(("q", self.q.as_str()));
        if !self.id.is_empty() && self.id_match == "prefix" {
            pairs.push(("id_match", "prefix"));
        }
        pairs
    }

    fn has(&self, status: &str) -> bool {
        self.status.iter().any(|s| s == status)
    }
}

/// Events a page.
const PAGE: i64 = 50;

#[derive(Template)]
#[template(path = "console/events.html")]
struct EventsPage {
    nav: Nav,
    f: ListParams,
    counts: Vec<CountView>,
    providers: Vec<String>,
    rows: Vec<Row>,
    errors: Vec<String>,
    next: Option<String>,
    first: Option<String>,
    requeue: Option<String>,
    erase: Option<String>,
    /// The newest page of a filter without a payload search, kept current: its stream's URL.
    live: Option<String>,
}

struct CountView {
    status: &'static str,
    count: String,
    href: String,
}

/// A row of the listing: in the page, and in its live stream as JSON (each
/// text escaped and clipped as in the page; the script sets it as text).
#[derive(Serialize)]
struct Row {
    received_at: String,
    provider: String,
    event_type: String,
    event_id: String,
    status: String,
    attempts: i32,
    reason: String,
    href: String,
}

fn rows(nav: &Nav, events: &[EventSummary]) -> Vec<Row> {
    events
        .iter()
        .map(|e| Row {
            received_at: short_time(&e.received_at),
            provider: escape(&e.provider).into_owned(),
            event_type: clip(&e.event_type, 80),
            event_id: clip(&e.event_id, 80),
            status: e.status.clone(),
            attempts: e.attempts,
            reason: e.failure_reason.as_deref().map(|r| clip(r, 140)).unwrap_or_default(),
            href: nav.event_href(&e.provider, &e.event_id),
        })
        .collect()
}

pub(super) async fn events(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    params: Result<Query<ListParams>, axum_extra::extract::QueryRejection>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let Query(mut f) =
        params.map_err(|_| PageError::BadRequest("The listing's parameters could not be read.".into()))?;
    // A payload search reads every payload in its time range: one day unless told otherwise.
    if !f.q.trim().is_empty() && f.since.trim().is_empty() {
        f.since = "24h".into();
    }
    let (query, after, errors) = f.query();
    let counts = ops::status_counts(&state.read, 10_000)
        .await?
        .into_iter()
        .map(|(status, count)| CountView {
            status: status.as_str(),
            count: match count {
                Count::Exact(n) => n.to_string(),
                Count::AtLeast(n) => format!("{n}+"),
                Count::About(n) => format!("~{n}"),
            },
            href: nav.href("/events", &[("status", status.as_str())]),
        })
        .collect();
    let providers = state.catalog.entries().map(|e| e.provider.as_str().to_string()).collect();
    let (mut rows, mut next) = (Vec::new(), None);
    if errors.is_empty() {
        let _searching = match &query.payload {
            Some(_) => Some(
                state
                    .searches
                    .start(&format!("user:{}", signed.user))
                    .map_err(|b| PageError::Unavailable(b.words()))?,
            ),
            None => None,
        };
        let page = ops::list_events(&state.read, &query, after.as_ref(), PAGE).await?;
        rows = self::rows(&nav, &page.events);
        next = page.next.map(|c| {
            let c = c.to_string();
            let mut pairs = f.pairs();
            pairs.push(("after", &c));
            nav.href("/events", &pairs)
        });
    }
    let first = after.is_some().then(|| nav.href("/events", &f.pairs()));
    // What a requeue could take: events that ended (not pending), of the statuses chosen.
    let requeue =
        (nav.operator() && !query.statuses.is_empty() && !query.statuses.contains(&Status::Pending)).then(|| {
            let mut pairs = vec![("provider", f.provider.as_str()), ("type", f.event_type.as_str())];
            pairs.extend(f.status.iter().map(|s| ("status", s.as_str())));
            nav.href("/requeue", &pairs)
        });
    // What an erasure could take: the filter without its statuses and id (an operator's deletion request).
    let pairs: Vec<(&str, &str)> = [
        ("provider", f.provider.as_str()),
        ("type", f.event_type.as_str()),
        ("since", f.since.as_str()),
        ("until", f.until.as_str()),
        ("q", f.q.as_str()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.trim().is_empty())
    .collect();
    // Only where the filter is all it would take: not narrowed by status or id, which it has not.
    let whole = query.statuses.is_empty() && query.event_id.is_none();
    let erase = (nav.operator() && whole && !pairs.is_empty()).then(|| nav.href("/erase", &pairs));
    let live =
        (errors.is_empty() && after.is_none() && query.payload.is_none()).then(|| nav.href("/events/live", &f.pairs()));
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let page = EventsPage { nav, f, counts, providers, rows, errors, next, first, requeue, erase, live };
    Ok((status, html(page)?).into_response())
}

/// How often a live listing reads its page again.
const LIVE_EVERY: Duration = Duration::from_secs(2);
/// How long one live stream lasts: then the browser connects again
/// (`EventSource`), and its session is checked again.
const LIVE_FOR: Duration = Duration::from_secs(60);

/// The newest page of a filter, as a stream of server-sent events: a `page`
/// event (the rows, as JSON) at once and whenever the page changes (a new
/// event, a status that moved), read every [`LIVE_EVERY`]. What the Events
/// page's script (`live.js`) shows; without a script the page is as it was
/// sent. A payload search is not streamed (it would read every payload of
/// its range each time).
pub(super) async fn live(
    Shared(state): Shared<Arc<State>>,
    _: Signed,
    params: Result<Query<ListParams>, axum_extra::extract::QueryRejection>,
) -> Result<Response, PageError> {
    let Query(f) = params.map_err(|_| PageError::BadRequest("The listing's parameters could not be read.".into()))?;
    let (query, after, errors) = f.query();
    if let Some(e) = errors.first() {
        return Err(PageError::BadRequest(e.clone()));
    }
    if query.payload.is_some() || after.is_some() {
        return Err(PageError::BadRequest("Only the newest page without a payload search is live.".into()));
    }
    let permit = state.live.clone().try_acquire_owned().map_err(|_| {
        PageError::Unavailable("As many live listings as the console serves are open: reload the page later.")
    })?;
    let until = Instant::now() + LIVE_FOR;
    // The permit goes with the stream: held while it is open.
    let pages = futures_util::stream::unfold((String::new(), permit), move |(mut last, permit)| {
        let (state, query) = (state.clone(), query.clone());
        async move {
            loop {
                if !last.is_empty() {
                    tokio::time::sleep(LIVE_EVERY).await;
                }
                if Instant::now() >= until {
                    return None;
                }
                let page = match ops::list_events(&state.read, &query, None, PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(error = %e, "a live listing could not read its page: its stream ends, and the browser connects again");
                        return None;
                    }
                };
                let data = serde_json::to_string(&rows(&Nav::anonymous(&state), &page.events)).unwrap_or_default();
                if data != last {
                    let sent = Sent::default().event("page").retry(LIVE_EVERY).data(&data);
                    return Some((Ok::<_, Infallible>(sent), (data, permit)));
                }
                last = data;
            }
        }
    });
    Ok(Sse::new(pages).keep_alive(KeepAlive::default()).into_response())
}
