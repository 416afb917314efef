//! The receive handler behind `POST /webhooks/{provider}`: size check, signature
//! check over the raw bytes, one claim, and a 200 only once the row is committed.
//!
//! The same [`Receiver::handle`] serves API Gateway REST (payload 1.0), HTTP API
//! (2.0), Function URLs and ALB through `lambda_http`, and `inbox dev` over HTTP.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use webhook_inbox_schemes::text::Escaped;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use lambda_http::{Body, RequestExt};
use serde_json::json;

use crate::{
    db::{minutes::MinuteCounts, Connections, DbConfig},
    receive::{
        claim::{self, inline::InlineHandlers, BatchClaim, Claim, Claimed, Envelope},
        notify::ProcessQueue,
        tally::DeliveryMinutes,
    },
    runtime::{metrics::Metrics, trace},
};
use webhook_inbox_schemes::{
    catalog::Catalog, secret::Secrets, Challenged, Delivery, Events, InitialStatus, NewEvent, Provider, Rejected,
    RejectionKind, Schemes,
};

/// Everything the receive handler needs.
#[derive(Clone, Debug)]
pub struct ReceiveConfig {
    /// The database.
    pub db: DbConfig,
    /// Every provider known here (built in, or declared by `INBOX_PROVIDERS_FILE`).
    pub catalog: Catalog,
    /// Each provider's secrets (a route exists only for a provider with one).
    pub secrets: Secrets,
    /// `INBOX_MAX_BODY_BYTES`, default 1 MiB: larger bodies get 413 before any hashing.
    pub max_body_bytes: usize,
    /// `INBOX_INLINE_PROVIDERS` (e.g. `stripe,shopify`): receive applies their
    /// handlers inside the claim's transaction.
    pub inline_providers: Vec<Provider>,
    /// `INBOX_PROCESS_QUEUE_URL`: the `process` function's SQS queue, told of new events.
    pub process_queue_url: Option<String>,
    /// `INBOX_RULES_FILE`, read only with inline providers: an event an ignore
    /// rule matches is left to the worker, which marks it `ignored`.
    pub rules: crate::core::rules::IgnoreRules,
}

/// `INBOX_MAX_BODY_BYTES`'s default.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// What a verified delivery came to.
#[derive(Debug)]
pub enum Received {
    /// Its events, claimed (new, duplicates, or a batch's counts).
    Claimed(Claimed),
    /// A handshake (the provider checking the endpoint) or an unsigned ping, answered and not stored.
    Challenge(Challenged),
}

/// Why a delivery was not accepted; each maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// Not `/webhooks/{provider}` (404).
    #[error("no such route: POST /webhooks/{{provider}}")]
    NoRoute,
    /// No provider of that name (404).
    #[error("unknown provider {0:?}")]
    UnknownProvider(String),
    /// A known provider without a secret here (404).
    #[error("provider {0} has no secret configured, so it has no endpoint")]
    NotConfigured(Provider),
    /// Not a POST (405).
    #[error("method not allowed: use POST")]
    MethodNotAllowed,
    /// Over `INBOX_MAX_BODY_BYTES` (413).
    #[error("body is larger than the {0} byte limit")]
    TooLarge(usize),
    /// The signature (or credentials, or timestamp) does not hold (401).
    #[error("{0}")]
    Unauthorized(Rejected),
    /// The claim could not commit (503): nothing was stored.
    #[error("the inbox is unavailable; nothing was stored, retry later")]
    Unavailable(#[source] sqlx::Error),
    /// Inline mode, an exclusive handler busy with this very event (503).
    #[error("another delivery of this event is being processed; nothing was stored, retry later")]
    Busy,
}

impl ReceiveError {
    /// The HTTP status it is answered with.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ReceiveError::NoRoute | ReceiveError::UnknownProvider(_) | ReceiveError::NotConfigured(_) => {
                StatusCode::NOT_FOUND
            }
            ReceiveError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ReceiveError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ReceiveError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ReceiveError::Unavailable(_) | ReceiveError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The receive handler: one per process (per Lambda instance), its
/// connections made on first use.
pub struct Receiver {
    connections: std::sync::Arc<Connections>,
    /// Group commit (`inbox serve`, `inbox dev`): single events claimed together.
    group: Option<claim::group::Grouper>,
    schemes: Schemes,
    max_body_bytes: usize,
    /// Handlers for the inline providers (the process stage's: `with_handlers`);
    /// the others are left to the worker.
    handlers: Option<Box<dyn InlineHandlers>>,
    inline: Vec<Provider>,
    /// Events these ignore are left to the worker, even an inline provider's.
    rules: crate::core::rules::IgnoreRules,
    /// `INBOX_PROCESS_QUEUE_URL`: told of new events once they are committed.
    process_queue: Option<ProcessQueue>,
    /// Each provider's secrets' fingerprints, in the order configured (a verified index picks one).
    fingerprints: std::collections::HashMap<Provider, Vec<String>>,
    /// Deliveries per provider and minute, until written to `inbox_receive_minutes`.
    tally: DeliveryMinutes,
}

impl Receiver {
    /// A receiver with no handlers: its inline providers' events are left to
    /// the worker (see [`Receiver::with_handlers`]).
    pub(crate) fn new(connections: Connections, config: &ReceiveConfig) -> Self {
        Receiver {
            connections: std::sync::Arc::new(connections),
            group: None,
            schemes: Schemes::new(&config.catalog, &config.secrets),
            max_body_bytes: config.max_body_bytes,
            handlers: None,
            inline: config.inline_providers.clone(),
            rules: config.rules.clone(),
            process_queue: None,
            fingerprints: config
                .catalog
                .entries()
                .map(|e| (e.provider, config.secrets.fingerprints(e.provider)))
                .collect(),
            tally: DeliveryMinutes::default(),
        }
    }

    /// A receiver on `config`'s database (`DATABASE_URL`), with no handlers;
    /// its connections are made on first use.
    pub fn from_config(config: &ReceiveConfig) -> Result<Self, sqlx::Error> {
        Ok(Self::new(Connections::new(&config.db)?, config))
    }

    /// A receiver on the database `options` name (a `#[sqlx::test]`'s, say)
    /// rather than `config`'s URL, with `config`'s pool size and timeouts
    /// otherwise; no handlers, connections made on first use.
    pub fn connect_with(options: sqlx::postgres::PgConnectOptions, config: &ReceiveConfig) -> Self {
        Self::new(Connections::from_options(options, &config.db), config)
    }

    /// Claims deliveries of one event that arrive together in one statement
    /// and one commit (see [`GroupConfig`](claim::group::GroupConfig)), on
    /// committers spawned on the current Tokio runtime. A long-running server's
    /// choice: a Lambda instance has one delivery at a time.
    pub fn with_group_commit(mut self, config: claim::group::GroupConfig) -> Self {
        self.group = config.is_on().then(|| claim::group::Grouper::start(self.connections.clone(), config));
        self
    }

    /// Tells `process` of each new pending event, after the commit (`PROCESS_QUEUE_URL`).
    pub(crate) fn with_process_queue(mut self, queue: ProcessQueue) -> Self {
        self.process_queue = Some(queue);
        self
    }

    /// What inline mode runs: the process stage's handlers (its
    /// `Receiver::with_handlers`, next to them).
    pub(crate) fn with_inline(mut self, handlers: impl InlineHandlers + 'static) -> Self {
        self.handlers = Some(Box::new(handlers));
        self
    }

    /// The ignore rules receive was configured with: inline mode leaves what they take to the worker.
    pub(crate) fn ignore_rules(&self) -> &crate::core::rules::IgnoreRules {
        &self.rules
    }

    /// Schemes of a team's own, found before the built-in ones (see `Receiver::with_app`).
    pub(crate) fn with_schemes(mut self, schemes: &[std::sync::Arc<dyn webhook_inbox_schemes::Scheme>]) -> Self {
        self.schemes.add(schemes);
        self
    }

    /// `INBOX_MAX_BODY_BYTES`: a server refuses a larger body before reading it.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// `POST /webhooks/{provider}`: size check, signature, claim; never fails, never panics.
    pub async fn handle(&self, req: Request<Body>) -> Response<Body> {
        // No metrics here (`inbox dev`, the bench): nothing built per delivery that nobody reads.
        let provider = provider_of(&req);
        let result = self.receive(req.method(), provider.as_deref(), req.headers(), req.body().as_ref(), &mut 0).await;
        self.tally(self.known(provider.as_deref()), &result);
        respond(result)
    }

    /// [`Receiver::handle`], and what the delivery counts for in the `receive`
    /// function's metrics (one line per invocation, written by the caller).
    pub async fn handle_counted(&self, req: Request<Body>) -> (Response<Body>, Metrics) {
        let provider = provider_of(&req);
        let mut stored_failed = 0;
        let result = self
            .receive(req.method(), provider.as_deref(), req.headers(), req.body().as_ref(), &mut stored_failed)
            .await;
        // The dimension is one of ours, never a caller's string.
        let known = self.known(provider.as_deref());
        let mut metrics = Metrics::new("receive").for_provider(known.map_or("unknown", |p| p.as_str()));
        count(&mut metrics, &result, stored_failed);
        self.tally(known, &result);
        (respond(result), metrics)
    }

    /// The provider a route names, if it is one known here.
    fn known(&self, provider: Option<&str>) -> Option<Provider> {
        provider.and_then(|p| {
            self.schemes.find(p).map(|s| s.provider()).or_else(|| self.schemes.catalog().find(p).map(|e| e.provider))
        })
    }

    /// Counts a known provider's delivery in the tally: its new events, its
    /// duplicates, or its refusal (signature, credentials, timestamp, size).
    fn tally(&self, provider: Option<Provider>, result: &Result<Received, ReceiveError>) {
        let Some(provider) = provider else { return };
        let counts = match result {
            Ok(Received::Claimed(Claimed::Batch(b))) => {
                MinuteCounts { received: b.accepted as i64, duplicates: b.duplicates as i64, rejected: 0 }
            }
            Ok(Received::Claimed(Claimed::Single(Claim::New))) => MinuteCounts { received: 1, ..Default::default() },
            Ok(Received::Claimed(Claimed::Single(Claim::Duplicate | Claim::Replay))) => {
                MinuteCounts { duplicates: 1, ..Default::default() }
            }
            Err(ReceiveError::Unauthorized(_) | ReceiveError::TooLarge(_)) => {
                MinuteCounts { rejected: 1, ..Default::default() }
            }
            _ => return,
        };
        self.tally.record(provider.as_str(), counts);
    }

    /// Adds the tally to `inbox_receive_minutes` (one statement on one of the
    /// receiver's own connections), if `every` has passed since it last did.
    /// Counts that could not be written are kept for the next time.
    pub async fn write_tally(&self, every: Duration) -> Result<(), sqlx::Error> {
        if !self.tally.due(every) {
            return Ok(());
        }
        let rows = self.tally.take();
        if rows.is_empty() {
            return Ok(());
        }
        let written = async {
            let mut conn = self.connections.acquire().await?;
            crate::db::minutes::add(&mut *conn, &rows).await?;
            conn.reuse();
            Ok(())
        }
        .await;
        if written.is_err() {
            self.tally.restore(rows);
        }
        written
    }

    /// Its span is at debug level: at the default `info` nothing is formatted per delivery.
    #[tracing::instrument(level = "debug", skip_all, fields(provider = provider, event_id))]
    async fn receive(
        &self,
        method: &Method,
        provider: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
        stored_failed: &mut usize,
    ) -> Result<Received, ReceiveError> {
        let name = provider.ok_or(ReceiveError::NoRoute)?;
        let Some(scheme) = self.schemes.find(name) else {
            return Err(match self.schemes.catalog().find(name) {
                Some(entry) => ReceiveError::NotConfigured(entry.provider),
                None => ReceiveError::UnknownProvider(name.chars().take(64).collect()),
            });
        };
        let provider = scheme.provider();
        // The root of the delivery's trace (traces on: `inbox serve` with an OTLP endpoint).
        let mut span = trace::start("receive", trace::Kind::Server, None);
        if let Some(span) = &mut span {
            span.set("webhook.provider", provider.as_str());
        }
        let result = self.receive_as(provider, scheme, method, headers, body, stored_failed, span.as_ref()).await;
        if let Some(span) = &mut span {
            match &result {
                Ok(Received::Claimed(Claimed::Single(c))) => span.set("webhook.claim", format!("{c:?}").to_lowercase()),
                Ok(Received::Claimed(Claimed::Batch(b))) => {
                    span.set("webhook.claim", format!("{} accepted, {} duplicates", b.accepted, b.duplicates))
                }
                Ok(_) => {}
                Err(e) => span.fail(e.to_string()),
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn receive_as(
        &self,
        provider: Provider,
        scheme: &dyn webhook_inbox_schemes::Scheme,
        method: &Method,
        headers: &HeaderMap,
        body: &[u8],
        stored_failed: &mut usize,
        span: Option<&trace::Span>,
    ) -> Result<Received, ReceiveError> {
        if method != Method::POST {
            return Err(ReceiveError::MethodNotAllowed);
        }
        if body.len() > self.max_body_bytes {
            return Err(ReceiveError::TooLarge(self.max_body_bytes));
        }
        let delivery = Delivery { headers, body, now: unix_now() };
        if let Some(answer) = scheme.ping(&delivery) {
            tracing::info!(%provider, "unsigned ping answered");
            return Ok(Received::Challenge(answer));
        }
        let verified = scheme.verify(&delivery).map_err(|reason| {
            tracing::warn!(%provider, reason = %Escaped(&reason), "delivery refused");
            ReceiveError::Unauthorized(reason)
        })?;
        if let Some(answer) = scheme.challenge(&delivery, verified) {
            tracing::info!(%provider, "handshake answered");
            return Ok(Received::Challenge(answer));
        }

        let events = scheme.events(&delivery);
        if let Events::Single(e) = &events {
            tracing::Span::current().record("event_id", e.event_id.as_str());
        }
        let trace_context = span.map(trace::Span::traceparent);
        let headers = kept_headers(headers, &scheme.kept_headers());
        let envelope = Envelope {
            provider,
            raw_body: body,
            headers: &headers,
            secret_index: Some(i16::try_from(verified.secret_index).unwrap_or(i16::MAX)),
            secret_fingerprint: self
                .fingerprints
                .get(&provider)
                .and_then(|f| f.get(verified.secret_index))
                .map(String::as_str),
            replay_guard: scheme.guards_replays(),
            trace_context: trace_context.as_deref(),
        };
        let inline = self.handlers.as_deref().filter(|_| self.inline.contains(&provider));
        let claimed = match (&events, inline) {
            (Events::Single(e), None) if !envelope.replay_guard && self.group.is_some() => {
                let row = claim::group::Row {
                    provider,
                    event: e.clone(),
                    raw_body: body.to_vec(),
                    headers: headers.clone(),
                    secret_index: envelope.secret_index,
                    secret_fingerprint: envelope.secret_fingerprint.map(str::to_string),
                    trace_context: trace_context.clone(),
                };
                self.group.as_ref().expect("checked above").claim(row).await.map(Claimed::Single)
            }
            _ => claim::claim_delivery(&self.connections, &envelope, &events, inline).await,
        }
        .map_err(|e| {
            tracing::error!(%provider, error = %e, "claim failed; answering 503");
            ReceiveError::Unavailable(e)
        })?;
        tracing::debug!(?claimed, "claimed");
        *stored_failed = new_failed(&claimed, &events);
        if let Some(queue) = &self.process_queue {
            // In inline mode too: a type with no inline handler is still the worker's.
            queue.notify(provider, &new_pending(&claimed, &events)).await;
        }
        match claimed {
            Claimed::Busy => Err(ReceiveError::Busy),
            claimed => Ok(Received::Claimed(claimed)),
        }
    }
}

/// The events worth telling `process` about: new and pending. (In a batch with
/// duplicates some ids may already be known; a message for one is simply acknowledged.)
fn new_pending<'a>(claimed: &Claimed, events: &'a Events) -> Vec<&'a str> {
    let pending = |e: &&'a NewEvent| e.status == InitialStatus::Pending;
    match (claimed, events) {
        (Claimed::Single(Claim::New), Events::Single(e)) => {
            Some(e).filter(pending).map(|e| e.event_id.as_str()).into_iter().collect()
        }
        (Claimed::Batch(b), Events::Batch(items)) if b.accepted > 0 => {
            items.iter().filter(pending).map(|e| e.event_id.as_str()).collect()
        }
        _ => vec![],
    }
}

/// How many of the new rows were stored as `failed` (validly signed, unusable).
fn new_failed(claimed: &Claimed, events: &Events) -> usize {
    let failed = |e: &&NewEvent| e.status == InitialStatus::Failed;
    match (claimed, events) {
        (Claimed::Single(Claim::New), Events::Single(e)) => usize::from(e.status == InitialStatus::Failed),
        // A batch's new rows are not told apart: its failed items, at most the rows it added.
        (Claimed::Batch(b), Events::Batch(items)) => items.iter().filter(failed).count().min(b.accepted),
        _ => 0,
    }
}

/// One delivery's counts: `received` (new events), `duplicate`, `stored_failed`
/// (of the new ones), `rejected_signature`, `rejected_timestamp`,
/// `rejected_size`, `rejected_unknown_provider`, `unavailable`, `challenged`.
fn count(metrics: &mut Metrics, result: &Result<Received, ReceiveError>, stored_failed: usize) {
    metrics.count("stored_failed", stored_failed as u64);
    let name = match result {
        Ok(Received::Claimed(Claimed::Batch(b))) => {
            metrics.count("received", b.accepted as u64).count("duplicate", b.duplicates as u64);
            return;
        }
        Ok(Received::Claimed(Claimed::Single(Claim::New))) => "received",
        Ok(Received::Claimed(Claimed::Single(Claim::Duplicate))) => "duplicate",
        Ok(Received::Claimed(Claimed::Single(Claim::Replay))) => {
            metrics.count("duplicate", 1);
            "suspected_replay"
        }
        Ok(Received::Challenge(_)) => "challenged",
        Ok(Received::Claimed(Claimed::Busy)) | Err(ReceiveError::Busy | ReceiveError::Unavailable(_)) => "unavailable",
        Err(ReceiveError::Unauthorized(r)) if r.kind() == RejectionKind::Stale => "rejected_timestamp",
        Err(ReceiveError::Unauthorized(_)) => "rejected_signature",
        Err(ReceiveError::TooLarge(_)) => "rejected_size",
        Err(ReceiveError::NoRoute | ReceiveError::UnknownProvider(_) | ReceiveError::NotConfigured(_)) => {
            "rejected_unknown_provider"
        }
        Err(ReceiveError::MethodNotAllowed) => "rejected_method",
    };
    metrics.count(name, 1);
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// `{provider}` from the route's path parameters, or from a path ending in
/// `/webhooks/{provider}` (which also covers a stage prefix such as `/prod`).
fn provider_of(req: &Request<Body>) -> Option<String> {
    if let Some(p) = req.path_parameters_ref().and_then(|m| m.first("provider")) {
        return Some(p.to_string());
    }
    let mut segments = req.uri().path().trim_end_matches('/').rsplit('/');
    let provider = segments.next()?;
    (segments.next() == Some("webhooks") && !provider.is_empty()).then(|| provider.to_string())
}

/// The headers a scheme keeps, lower-cased, repeated values joined with ", ".
/// The kept headers as a JSON object: a header's value as a string, or a
/// repeated header's values as an array, in order (so that `inbox show`
/// re-verifies each value on its own, as receive read them).
fn kept_headers(headers: &HeaderMap, names: &[&str]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for name in names {
        let mut values: Vec<serde_json::Value> =
            headers.get_all(*name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned().into()).collect();
        match values.len() {
            0 => {}
            1 => {
                map.insert((*name).to_string(), values.remove(0));
            }
            _ => {
                map.insert((*name).to_string(), values.into());
            }
        }
    }
    serde_json::Value::Object(map)
}

/// The HTTP answer to what a delivery came to.
pub fn respond(result: Result<Received, ReceiveError>) -> Response<Body> {
    let claimed = match result {
        Ok(Received::Challenge(answer)) => {
            let mut response = Response::new(Body::from(answer.body));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
            return response;
        }
        Ok(Received::Claimed(claimed)) => Ok(claimed),
        Err(e) => Err(e),
    };
    let (status, body) = match &claimed {
        Ok(Claimed::Single(Claim::New)) => (StatusCode::OK, json!({"status": "accepted"})),
        // A replay is answered as any duplicate: the sender learns nothing.
        Ok(Claimed::Single(Claim::Duplicate | Claim::Replay)) => (StatusCode::OK, json!({"status": "duplicate"})),
        Ok(Claimed::Batch(BatchClaim { accepted, duplicates })) => {
            (StatusCode::OK, json!({"accepted": accepted, "duplicates": duplicates}))
        }
        Ok(Claimed::Busy) => (StatusCode::SERVICE_UNAVAILABLE, json!({"error": ReceiveError::Busy.to_string()})),
        Err(e) => (e.status_code(), json!({"error": e.to_string()})),
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    match claimed {
        Err(ReceiveError::MethodNotAllowed) => {
            h.insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        Err(ReceiveError::Unavailable(_) | ReceiveError::Busy) => {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        _ => {}
    }
    response
}
