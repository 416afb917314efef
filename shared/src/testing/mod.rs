//! Test support for a team's own handlers (feature `testing`, for
//! `[dev-dependencies]`): an [`Event`] built for a handler's unit test,
//! deliveries signed as each provider signs them, the bodies they send
//! ([`bodies`]), and a [`TestInbox`] that
//! delivers through the real receive path and drains with the real worker on
//! a test database, then requires what became of an event
//! ([`TestInbox::require_status`]) and what its handler enqueued
//! ([`TestInbox::require_enqueued`]).
//!
//! A handler's unit test needs no database for what it decides before it
//! writes, and a real one for what it writes:
//!
//! ```no_run
//! use webhook_inbox::{serde_json::json, sqlx::PgPool, testing, Event, HandlerError, Outcome, PgConnection, Provider};
//!
//! async fn refund(_conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
//!     match event.payload["data"]["object"]["amount_refunded"].as_i64() {
//!         Some(0) | None => Ok(Outcome::NoEffect),
//!         Some(_) => Ok(Outcome::Applied), // (write the refund here)
//!     }
//! }
//!
//! # async fn a_test(pool: PgPool) {
//! let event = testing::event(Provider::STRIPE, "evt_1", "charge.refunded", json!({"data": {"object": {"amount_refunded": 0}}}));
//! let mut conn = pool.acquire().await.unwrap();
//! assert_eq!(refund(&mut conn, &event).await.unwrap(), Outcome::NoEffect);
//! # }
//! ```
//!
//! And the whole path, as a provider sends (in a `#[sqlx::test(migrations = false)]`):
//!
//! ```no_run
//! use webhook_inbox::{sqlx::PgPool, testing::{self, TestInbox}, App, Handlers};
//!
//! # async fn a_test(pool: PgPool) {
//! let app = App::new(Handlers::new()); // yours: its handlers and migrations
//! let inbox = TestInbox::new(&pool, &app, &[("STRIPE_WEBHOOK_SECRET", "whsec_test")]).await.unwrap();
//! let body = r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;
//! assert_eq!(inbox.deliver(testing::stripe("whsec_test", body)).await.status, 200);
//! assert_eq!(inbox.deliver(testing::stripe("whsec_test", body)).await.body["status"], "duplicate");
//! let drained = inbox.drain().await.unwrap();
//! assert_eq!(drained.unhandled, 1); // no handler takes invoice.paid in this app
//! # }
//! ```

pub mod bodies;
mod require;

pub use require::Enqueued;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::{Hmac, Mac};
use lambda_http::Body;
use sha2::Sha256;
use sqlx::PgPool;

use crate::{
    app::App,
    config::{ConfigError, Env},
    db::Connections,
    process::{
        handler::{Event, Headers},
        worker::{Processed, Worker, WorkerConfig},
    },
    receive::claim::{self, Envelope},
    runtime::stage::{Stage, Tally as _},
    Provider, ReceiveConfig, Receiver,
};

/// Claims `payload` as the pending event `event_id` of `event_type` from
/// `provider`, as receive claims a verified delivery of it (no signature is
/// checked and no header kept; the payload is stored as it is, unchecked): to
/// seed a test database with events that the real worker then takes, as
/// [`TestInbox::drain`] or a [`Worker`] of the test's own. False when the
/// inbox already holds that event (nothing is changed).
///
/// ```no_run
/// use webhook_inbox::{sqlx::PgPool, testing, Provider};
///
/// # async fn a_test(pool: PgPool) {
/// assert!(testing::store(&pool, Provider::STRIPE, "evt_1", "invoice.paid", r#"{"id":"evt_1"}"#).await.unwrap());
/// assert!(!testing::store(&pool, Provider::STRIPE, "evt_1", "invoice.paid", "{}").await.unwrap());
/// # }
/// ```
pub async fn store(
    pool: &PgPool,
    provider: Provider,
    event_id: &str,
    event_type: &str,
    payload: &str,
) -> Result<bool, sqlx::Error> {
    let headers = serde_json::json!({});
    let envelope = Envelope {
        provider,
        raw_body: payload.as_bytes(),
        headers: &headers,
        secret_index: Some(0),
        secret_fingerprint: None,
        replay_guard: false,
        trace_context: None,
    };
    let event = webhook_inbox_schemes::NewEvent::pending(event_id.into(), event_type, payload.into());
    Ok(claim::claim(pool, &envelope, &event).await? == claim::Claim::New)
}

/// An event as the worker hands it to a handler: no attempt before this
/// one, received now, no header kept. Its fields are public: set
/// `attempts` or `headers` for a test that needs them. The provider is named
/// as [`Handlers::on`](crate::Handlers::on) names it (`"stripe"`, or
/// `Provider::STRIPE`).
///
/// # Panics
///
/// If `provider` is not a provider name (a test's own mistake), naming it.
pub fn event<T>(provider: impl AsRef<str>, event_id: &str, event_type: &str, payload: T) -> Event<T> {
    let name = provider.as_ref();
    let provider = Provider::try_from(name).unwrap_or_else(|_| panic!("{name:?} is not a provider name"));
    Event {
        provider,
        event_id: event_id.to_string(),
        event_type: event_type.to_string(),
        payload,
        attempts: 0,
        received_at: SystemTime::now(),
        headers: Headers::default(),
        trace_context: None,
        written: None,
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    parts.iter().for_each(|p| mac.update(p));
    mac.finalize().into_bytes().to_vec()
}

fn post(provider: &str, headers: &[(&str, String)], body: &str) -> http::Request<Body> {
    let mut request = http::Request::post(format!("/webhooks/{provider}")).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.body(Body::from(body.to_string())).expect("a request of valid parts")
}

/// A delivery of `provider`, a provider declared as data (built in, or in
/// the providers file `catalog` was read with), signed now with `secret` (as
/// its `<NAME>_WEBHOOK_SECRET` holds it) as its contract says. `headers` are
/// the delivery's others: those its id or type come from, a `content-type`
/// for a form. A timestamp the contract reads from a header or from the
/// signature header is set to now; one the body carries is read from `body`
/// (put a current one there). A contract that signs its URL signs
/// `catalog`'s `<NAME>_WEBHOOK_URL`. Providers with a signer of their own here
/// ([`stripe`], [`shopify`], [`github`], [`standard`]), an ECDSA contract
/// (signed with the provider's private key), or a name `catalog` does not
/// know are refused, saying so.
pub fn declared(
    catalog: &crate::config::Catalog,
    provider: &str,
    secret: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<http::Request<Body>, String> {
    use webhook_inbox_schemes::{
        catalog::Kind,
        declared::{format_time, json_text, Source},
    };
    let entry = catalog.find(provider).ok_or_else(|| format!("{provider:?} is not a provider known here"))?;
    let Kind::Declared(rules) = &entry.kind else {
        return Err(format!("{provider} is not declared as data: sign it with its own function here"));
    };
    let key = rules.decode_secret(secret).map_err(|e| format!("the secret {e}"))?;
    let mut sent = http::HeaderMap::new();
    for (name, value) in headers {
        let value = http::HeaderValue::try_from(*value).map_err(|e| format!("header {name}: {e}"))?;
        sent.append(http::HeaderName::try_from(*name).map_err(|e| format!("header {name:?}: {e}"))?, value);
    }
    let timestamp = match &rules.timestamp {
        None => None,
        Some(t) => {
            let text = format_time(now() as i64, t.format);
            match &t.from {
                Source::Header(h) => {
                    let name = http::HeaderName::try_from(h.as_str()).map_err(|e| format!("header {h:?}: {e}"))?;
                    sent.insert(name, http::HeaderValue::try_from(text.as_str()).map_err(|e| e.to_string())?);
                    Some(text)
                }
                Source::Signature(_) => Some(text),
                Source::Json(p) => {
                    Some(json_text(body.as_bytes(), p).ok_or_else(|| format!("no timestamp at {p} in the body"))?)
                }
                other => return Err(format!("a timestamp from {other:?} cannot be signed here")),
            }
        }
    };
    let delivery = crate::schemes::Delivery { headers: &sent, body: body.as_bytes(), now: now() as i64 };
    let signature = rules
        .sign(key.expose(), &delivery, catalog.url(entry.provider), timestamp.as_deref())
        .map_err(|e| e.to_string())?;
    let header = http::HeaderName::try_from(rules.headers[0].as_str()).map_err(|e| e.to_string())?;
    sent.insert(header, http::HeaderValue::try_from(signature).map_err(|e| e.to_string())?);
    if !sent.contains_key(http::header::CONTENT_TYPE) {
        sent.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    }
    let mut request = http::Request::post(format!("/webhooks/{provider}"));
    *request.headers_mut().ok_or("a request of valid parts")? = sent;
    request.body(Body::from(body.to_string())).map_err(|e| e.to_string())
}

/// Stripe's `Stripe-Signature` for `body` at `t` (Unix seconds):
/// `t=<t>,v1=<hex HMAC-SHA256 of "t.body", keyed by the whole secret>`.
pub fn stripe_signature(secret: &str, t: u64, body: &[u8]) -> String {
    format!("t={t},v1={}", hex::encode(hmac_sha256(secret.as_bytes(), &[format!("{t}.").as_bytes(), body])))
}

/// `POST /webhooks/stripe` with `body`, signed now as Stripe signs.
pub fn stripe(secret: &str, body: &str) -> http::Request<Body> {
    post("stripe", &[("stripe-signature", stripe_signature(secret, now(), body.as_bytes()))], body)
}

/// `POST /webhooks/shopify` with `body` as Shopify sends it: `X-Shopify-Hmac-Sha256` (base64
/// HMAC-SHA256 of the body), `X-Shopify-Webhook-Id` and `X-Shopify-Topic`.
pub fn shopify(secret: &str, webhook_id: &str, topic: &str, body: &str) -> http::Request<Body> {
    let signature = B64.encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()]));
    let headers = [
        ("x-shopify-hmac-sha256", signature),
        ("x-shopify-webhook-id", webhook_id.to_string()),
        ("x-shopify-topic", topic.to_string()),
    ];
    post("shopify", &headers, body)
}

/// `POST /webhooks/github` with `body` as GitHub sends it: `X-Hub-Signature-256`
/// (`sha256=<hex HMAC-SHA256 of the body>`), `X-GitHub-Delivery` and `X-GitHub-Event`.
pub fn github(secret: &str, delivery: &str, event: &str, body: &str) -> http::Request<Body> {
    let signature = format!("sha256={}", hex::encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()])));
    let headers = [
        ("x-hub-signature-256", signature),
        ("x-github-delivery", delivery.to_string()),
        ("x-github-event", event.to_string()),
    ];
    post("github", &headers, body)
}

/// `POST /webhooks/standard` with `body` as Standard Webhooks (and Svix) send
/// it, signed now: `webhook-id`, `webhook-timestamp` and `webhook-signature`
/// (`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, keyed by the secret's
/// base64 after `whsec_`). A secret that is not such base64 panics: it is
/// the test's own.
pub fn standard(secret: &str, message_id: &str, body: &str) -> http::Request<Body> {
    let key = B64.decode(secret.strip_prefix("whsec_").unwrap_or(secret)).expect("a whsec_ secret is base64");
    let t = now().to_string();
    let signed = hmac_sha256(&key, &[message_id.as_bytes(), b".", t.as_bytes(), b".", body.as_bytes()]);
    let headers = [
        ("webhook-id", message_id.to_string()),
        ("webhook-timestamp", t),
        ("webhook-signature", format!("v1,{}", B64.encode(signed))),
    ];
    post("standard", &headers, body)
}

/// `POST /webhooks/marqeta` with `body` as Marqeta sends it: Basic
/// credentials (`MARQETA_WEBHOOK_USERNAME`, `MARQETA_WEBHOOK_PASSWORD`), and
/// `X-Marqeta-Signature` (hex HMAC-SHA256 of the body) when a signing secret
/// is given, as `MARQETA_WEBHOOK_SECRET` asks.
pub fn marqeta(username: &str, password: &str, signing_secret: Option<&str>, body: &str) -> http::Request<Body> {
    let mut headers = vec![("authorization", format!("Basic {}", B64.encode(format!("{username}:{password}"))))];
    if let Some(secret) = signing_secret {
        let signature = hex::encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()]));
        headers.push((webhook_inbox_schemes::marqeta::SIGNATURE, signature));
    }
    post("marqeta", &headers, body)
}

/// What receive answered a delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body (`{"status":"accepted"}`, `{"status":"duplicate"}`, `{"error":...}`), or null.
    pub body: serde_json::Value,
}

/// Why a [`TestInbox`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TestInboxError {
    /// A setting given is wrong (the variable named).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The inbox's or the application's migrations failed.
    #[error(transparent)]
    Migrate(#[from] crate::MigrateError),
    /// The database refused a statement or did not answer.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    /// [`TestInbox::drain`] gave up with events still pending.
    #[error(
        "{pending} event(s) still pending after {}s of draining: a handler that keeps asking for a retry, \
         or a pause holding them (ops::stored_event says which, and why)",
        .after.as_secs()
    )]
    StillPending {
        /// The events left pending.
        pending: i64,
        /// How long it drained.
        after: Duration,
    },
}

/// The inbox on a test database, as it runs in production: deliveries through
/// the real receive path (signature checks, the claim, its answer), the real
/// worker over them with the application's handlers.
pub struct TestInbox {
    pool: PgPool,
    receiver: Receiver,
    worker: Worker,
    #[cfg(feature = "relay")]
    relay: Option<crate::relay::Relay>,
}

impl TestInbox {
    /// `app` on `pool`'s database, migrated here (the inbox's migrations,
    /// then the application's), receiving with the settings `env` gives as the
    /// environment would (`("STRIPE_WEBHOOK_SECRET", "whsec_...")`, ...),
    /// and relaying to the destinations it configures (`RELAY_DESTINATIONS`,
    /// `RELAY_HTTP_URL`, ...) with the app's own sinks.
    /// The worker retries a transient failure after 1 ms, not 1 s.
    pub async fn new(pool: &PgPool, app: &App, env: &[(&str, &str)]) -> Result<TestInbox, TestInboxError> {
        app.migrate(pool).await?;
        let config = ReceiveConfig::read(&Env::from_pairs(env), 4)?;
        let connections = Connections::from_options((*pool.connect_options()).clone(), &config.db);
        let receiver = Receiver::new(connections, &config).with_app(app);
        let worker_config =
            WorkerConfig { retry_base: Duration::from_millis(1), ..WorkerConfig::read(&Env::from_pairs(env))? };
        let worker = Worker::new(pool.clone(), app.handlers().clone(), worker_config).with_apis(app.apis().clone());
        #[cfg(feature = "relay")]
        let relay = {
            let env = Env::from_pairs(env);
            let destinations = crate::config::Destinations::read(&env)?;
            let config = crate::relay::RelayConfig::read(&env)?;
            match destinations.is_empty() {
                true => None,
                false => Some(crate::relay::Relay::new(pool.clone(), destinations.build(app).await?, config)),
            }
        };
        Ok(TestInbox {
            pool: pool.clone(),
            receiver,
            worker,
            #[cfg(feature = "relay")]
            relay,
        })
    }

    /// Delivers `request` (a path `/webhooks/{provider}`) as API Gateway would
    /// hand it to receive: its answer.
    pub async fn deliver(&self, request: http::Request<Body>) -> Answer {
        let response = self.receiver.handle(request).await;
        let status = response.status().as_u16();
        let body = serde_json::from_slice(response.body().as_ref()).unwrap_or(serde_json::Value::Null);
        Answer { status, body }
    }

    /// One pass of the worker: one batch of the events due, as a scheduled
    /// `process` run takes it (a retry waits for its backoff).
    pub async fn pass(&self) -> Result<Processed, sqlx::Error> {
        self.worker.run_once(Instant::now() + Duration::from_secs(30)).await
    }

    /// Runs the worker until no event is pending (retries included, each
    /// after its backoff): what it did. After 30 s with events still pending
    /// it gives up, saying how many ([`TestInboxError::StillPending`]).
    pub async fn drain(&self) -> Result<Processed, TestInboxError> {
        let after = Duration::from_secs(30);
        let deadline = Instant::now() + after;
        let mut total = Processed::default();
        loop {
            let done = match self.worker.run(deadline).await {
                Ok(counts) => counts,
                Err(stopped) => return Err(stopped.source.into()),
            };
            total.add(&done);
            let pending: i64 = crate::db::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
                .fetch_one(crate::db::Autocommit(&self.pool))
                .await?;
            if pending == 0 {
                return Ok(total);
            }
            if Instant::now() >= deadline {
                return Err(TestInboxError::StillPending { pending, after });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// One pass of the relay over the destinations the environment given to
    /// [`TestInbox::new`] configures: each destination's due messages
    /// delivered, as the `relay` function does, through the app's own sinks
    /// too. An error when no destination is configured.
    #[cfg(feature = "relay")]
    pub async fn relay(&self) -> Result<crate::Relayed, sqlx::Error> {
        let relay = self.relay.as_ref().ok_or_else(|| {
            sqlx::Error::Configuration(
                "no destination: give TestInbox::new RELAY_DESTINATIONS or RELAY_HTTP_URL".into(),
            )
        })?;
        relay.run_once(Instant::now() + Duration::from_secs(30)).await
    }

    /// The test database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A sink for a relay test ([`crate::sinks::Sink`]): it keeps every message
/// the relay hands it, in order (each attempt of a retried one again), and
/// takes each, unless told to answer the next ones otherwise. Register a
/// clone on the app under the name a destination's `sink =` gives:
///
/// ```no_run
/// use webhook_inbox::{sinks::SinkReply, sqlx::PgPool, testing::{RecordingSink, TestInbox}, App, Handlers};
///
/// # async fn a_test(pool: PgPool) {
/// let billing = RecordingSink::new();
/// let app = App::new(Handlers::new()).with_sink("billing", billing.clone()); // yours: handlers that enqueue
/// let destinations = "[destination.billing]\nsink = \"billing\"";
/// let inbox = TestInbox::new(&pool, &app, &[("RELAY_DESTINATIONS", destinations)]).await.unwrap();
/// billing.answer_next(SinkReply::retry("down for a moment"));
/// // ... deliver, drain, then:
/// inbox.relay().await.unwrap();
/// let sent = billing.delivered();
/// # }
/// ```
#[cfg(feature = "relay")]
#[derive(Clone, Default)]
pub struct RecordingSink {
    state: std::sync::Arc<std::sync::Mutex<Recorded>>,
}

#[cfg(feature = "relay")]
#[derive(Default)]
struct Recorded {
    handed: Vec<(crate::sinks::Outgoing, crate::sinks::SinkReply)>,
    next: std::collections::VecDeque<crate::sinks::SinkReply>,
}

#[cfg(feature = "relay")]
impl RecordingSink {
    /// A sink that has seen nothing and takes every message.
    pub fn new() -> RecordingSink {
        RecordingSink::default()
    }

    /// The next message handed to it gets `reply` (after those given before);
    /// once they are used up, it takes every message again.
    pub fn answer_next(&self, reply: crate::sinks::SinkReply) {
        self.recorded().next.push_back(reply);
    }

    /// Every message handed to it so far, in order, with the reply it got.
    pub fn handed(&self) -> Vec<(crate::sinks::Outgoing, crate::sinks::SinkReply)> {
        self.recorded().handed.clone()
    }

    /// The messages it took ([`crate::sinks::SinkReply::Delivered`]), in order.
    pub fn delivered(&self) -> Vec<crate::sinks::Outgoing> {
        let recorded = self.recorded();
        let taken = recorded.handed.iter().filter(|(_, r)| *r == crate::sinks::SinkReply::Delivered);
        taken.map(|(m, _)| m.clone()).collect()
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A test that panicked while holding it left whole entries: still worth reading.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(feature = "relay")]
impl crate::sinks::Sink for RecordingSink {
    fn target(&self) -> String {
        "recording (webhook_inbox::testing::RecordingSink)".into()
    }

    fn deliver<'a>(&'a self, messages: &'a [crate::sinks::Outgoing]) -> crate::sinks::RepliesFuture<'a> {
        let mut recorded = self.recorded();
        let replies: Vec<crate::sinks::SinkReply> = messages
            .iter()
            .map(|m| {
                let reply = recorded.next.pop_front().unwrap_or(crate::sinks::SinkReply::Delivered);
                recorded.handed.push((m.clone(), reply.clone()));
                reply
            })
            .collect();
        Box::pin(std::future::ready(replies))
    }
}
