//! Events as hints. Stripe does not order its events and says not to order
//! them by `created`: its advice, which the article repeats, is to treat an
//! event as a hint and retrieve the object's current state from the API.
//! Doing that inside the worker's transaction would hold the event's row lock
//! (and whatever the batch locked) across a slow external call, so a
//! [`HintHandler`] only names the object; the worker fetches it after the
//! batch has committed, with no transaction open, then applies the fetched
//! state in a transaction of the event's own.
//!
//! While its object is fetched the event stays `pending`, held back by a
//! lease (its next attempt a minute away), so no other worker fetches it too;
//! a worker that dies meanwhile leaves it to be taken again when the lease
//! ends. A fetch that fails for a reason of the moment (a timeout, a 5xx, a
//! 429 past its retries) is an attempt: the event stays pending with its
//! reason and backs off as any transient failure; a 404 fails it, with the
//! reason.
//!
//! A fetched state must never overwrite a newer one. Where an object carries
//! its own counter, the API client says so ([`Fetched::version`]); Stripe's
//! objects carry none, so the version is the fetch's own timing: when the
//! request was sent ([`Fetched::asked_at`]). An answer to a question asked
//! later is applied over one asked earlier, never the other way round, even
//! when the earlier answer arrives last.

use std::{collections::HashMap, fmt, future::Future, pin::Pin, sync::Arc, time::SystemTime};

use serde::de::DeserializeOwned;
use sqlx::PgConnection;

use super::handler::{Event, HandlerError, Outcome};
use webhook_inbox_schemes::Provider;

/// An object of a provider's API: its kind (the API's collection, as in
/// `subscriptions`) and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The collection (`subscriptions`, `customers`, `invoices`, ...).
    pub kind: String,
    /// The object's id.
    pub id: String,
}

impl Object {
    /// `kind`'s object `id`.
    pub fn new(kind: impl Into<String>, id: impl Into<String>) -> Self {
        Object { kind: kind.into(), id: id.into() }
    }
}

/// An object's state as the API answered.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The object, as JSON.
    pub object: serde_json::Value,
    /// When the request was sent.
    pub asked_at: SystemTime,
    /// What to guard on, larger is newer: the object's own counter where the
    /// API has one, else `asked_at` in microseconds since the Unix epoch.
    pub version: i64,
}

impl Fetched {
    /// A state with no counter of its own: its version is when it was asked for.
    pub fn new(object: serde_json::Value, asked_at: SystemTime) -> Self {
        let micros = asked_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        Fetched { object, asked_at, version: micros }
    }
}

/// Why an object could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The API has no such object (HTTP 404): the event fails, with this reason.
    #[error("{0}")]
    NotFound(String),
    /// Worth trying again (a timeout, a 5xx, a 429, a key the operator may fix):
    /// the event stays pending and backs off.
    #[error("{0}")]
    Transient(String),
    /// Trying again will not help (the API refused the request itself).
    #[error("{0}")]
    Permanent(String),
}

/// A provider's API, as the worker fetches objects from it ([`StripeApi`] for
/// Stripe; a team adds its own with [`crate::App::with_api`]).
pub trait ObjectApi: Send + Sync {
    /// The object's current state; no transaction is open while it runs.
    fn fetch<'a>(
        &'a self,
        object: &'a Object,
    ) -> Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send + 'a>>;
}

/// The APIs the worker fetches from, by provider.
#[derive(Clone, Default)]
pub struct Apis(HashMap<Provider, Arc<dyn ObjectApi>>);

impl fmt::Debug for Apis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.0.keys().map(|p| p.as_str()).collect();
        names.sort_unstable();
        f.debug_tuple("Apis").field(&names).finish()
    }
}

impl Apis {
    /// `api` for `provider`'s objects, in place of any before.
    pub fn with(mut self, provider: Provider, api: Arc<dyn ObjectApi>) -> Self {
        self.0.insert(provider, api);
        self
    }

    /// `other`'s, over these.
    pub(crate) fn merged(mut self, other: &Apis) -> Self {
        self.0.extend(other.0.iter().map(|(p, a)| (*p, a.clone())));
        self
    }

    pub(crate) fn get(&self, provider: Provider) -> Option<&Arc<dyn ObjectApi>> {
        self.0.get(&provider)
    }
}

/// A handler for events that are hints: it names the object the event is
/// about ([`object`](HintHandler::object)), the worker fetches that object
/// from the provider's API outside any transaction, and the handler applies
/// the fetched state ([`apply`](HintHandler::apply)) in the event's own
/// transaction, whatever the event's payload said. Registered with
/// [`crate::Handlers::on`] like any handler; in inline mode its events are
/// left to the worker.
pub trait HintHandler: Send + Sync + 'static {
    /// The payload's type.
    type Payload: DeserializeOwned + Send + Sync + 'static;

    /// The object this event is a hint for; an error fails the event as a handler's would.
    fn object(&self, event: &Event<Self::Payload>) -> Result<Object, HandlerError>;

    /// Applies `fetched`; guard on [`Fetched::version`] so that an older
    /// state never overwrites a newer one.
    fn apply(
        &self,
        conn: &mut PgConnection,
        event: &Event<Self::Payload>,
        fetched: &Fetched,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;

    /// As [`crate::Handler::lock_key`].
    fn lock_key(&self, _event: &Event<Self::Payload>) -> Option<String> {
        None
    }
}

#[cfg(feature = "http-client")]
pub use stripe::StripeApi;

#[cfg(feature = "http-client")]
mod stripe {
    use std::{future::Future, pin::Pin, time::Duration};

    use super::{FetchError, Fetched, Object, ObjectApi};
    use crate::core::http::{retry_after, AnswerError};
    use webhook_inbox_schemes::secret::Secret;

    /// Stripe's API: `GET /v1/<kind>/<id>` with `STRIPE_API_KEY`, at
    /// `STRIPE_API_BASE` (default `https://api.stripe.com`). Each request has
    /// a timeout (10 s); a timeout, a connection error, a 5xx or a 429 is
    /// tried again, up to 3 tries (a 429 after its `Retry-After`, at most 5 s),
    /// then reported as transient.
    pub struct StripeApi {
        client: reqwest::Client,
        base: String,
        key: Secret,
    }

    /// Tries of one fetch.
    const TRIES: u32 = 3;

    impl StripeApi {
        /// Stripe at `base` with `key`.
        pub fn new(base: impl Into<String>, key: Secret) -> Result<Self, reqwest::Error> {
            Self::with_timeout(base, key, Duration::from_secs(10))
        }

        /// With `timeout` for each request.
        pub fn with_timeout(base: impl Into<String>, key: Secret, timeout: Duration) -> Result<Self, reqwest::Error> {
            let client = crate::core::http::http_client(timeout)?;
            Ok(StripeApi { client, base: base.into().trim_end_matches('/').to_string(), key })
        }

        async fn fetch_once(&self, object: &Object) -> Result<Fetched, (FetchError, Option<Duration>)> {
            let what = format!(
                "GET /v1/{}/{}",
                webhook_inbox_schemes::text::escape(&object.kind),
                webhook_inbox_schemes::text::escape(&object.id)
            );
            // Stripe's ids and collections are letters, digits and `_`: anything else goes nowhere.
            let plain = |s: &str| {
                !s.is_empty() && s.len() <= 255 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
            };
            if !plain(&object.kind) || !plain(&object.id) || object.id.starts_with('.') {
                return Err((FetchError::Permanent(format!("{what}: not a Stripe object id")), None));
            }
            let url = format!("{}/v1/{}/{}", self.base, object.kind, object.id);
            let asked_at = std::time::SystemTime::now();
            let response = self
                .client
                .get(url)
                .bearer_auth(String::from_utf8_lossy(self.key.expose()))
                .send()
                .await
                .map_err(|e| {
                    let why =
                        if e.is_timeout() { "timed out".to_string() } else { format!("failed: {}", e.without_url()) };
                    (FetchError::Transient(format!("{what} {why}")), None)
                })?;
            let status = response.status().as_u16();
            let wait = retry_after(response.headers());
            let text =
                crate::core::http::text(response, crate::core::http::MAX_ANSWER_BYTES).await.map_err(|e| match e {
                    // The same object will be as large next time.
                    AnswerError::TooLarge(_) => (FetchError::Permanent(format!("{what}: {e}")), None),
                    AnswerError::Failed(_) => (FetchError::Transient(format!("{what}: {e}")), None),
                })?;
            let message = || {
                serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| {
                        v["error"]["message"].as_str().map(|m| webhook_inbox_schemes::text::escape(m).into_owned())
                    })
                    .unwrap_or_default()
            };
            match status {
                200 => match serde_json::from_str(&text) {
                    Ok(object) => Ok(Fetched::new(object, asked_at)),
                    Err(e) => Err((FetchError::Transient(format!("{what}: the answer is not JSON: {e}")), None)),
                },
                404 => Err((FetchError::NotFound(format!("{what}: HTTP 404 {}", message())), None)),
                429 => Err((FetchError::Transient(format!("{what}: HTTP 429 (rate limited)")), wait)),
                401 | 403 => {
                    Err((FetchError::Transient(format!("{what}: HTTP {status}: STRIPE_API_KEY was refused")), None))
                }
                500..=599 => Err((FetchError::Transient(format!("{what}: HTTP {status}")), None)),
                _ => Err((FetchError::Permanent(format!("{what}: HTTP {status} {}", message())), None)),
            }
        }
    }

    impl ObjectApi for StripeApi {
        fn fetch<'a>(
            &'a self,
            object: &'a Object,
        ) -> Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send + 'a>> {
            Box::pin(async move {
                let mut tried = 0;
                loop {
                    tried += 1;
                    match self.fetch_once(object).await {
                        Ok(fetched) => return Ok(fetched),
                        Err((FetchError::Transient(reason), wait)) if tried < TRIES => {
                            let backoff = Duration::from_millis(250 << tried);
                            tracing::info!(reason = %webhook_inbox_schemes::text::Escaped(&reason), "fetching again");
                            tokio::time::sleep(wait.unwrap_or(backoff).min(Duration::from_secs(5))).await;
                        }
                        Err((e, _)) => return Err(e),
                    }
                }
            })
        }
    }
}
