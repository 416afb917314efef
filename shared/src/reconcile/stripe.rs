//! Stripe's events API as a source: the events created since the checkpoint, claimed under their own ids.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::PgPool;

use super::{answer_text, claim, get, walk, Found, ReconcileConfig, ReconcileError, Source, SourceRun};
use crate::core::http::http_client;
use webhook_inbox_schemes::ConfigError;
use webhook_inbox_schemes::{secret::Secret, stripe::Stripe, Delivery, Events, Provider, Scheme};

/// Stripe's events API: `STRIPE_API_BASE` (default `https://api.stripe.com`), `STRIPE_API_KEY`.
pub struct StripeEvents {
    client: reqwest::Client,
    base: String,
    key: Secret,
}

#[derive(Deserialize)]
struct EventPage<'a> {
    #[serde(borrow)]
    data: Vec<&'a RawValue>,
    has_more: bool,
}

#[derive(Deserialize)]
struct EventHead {
    id: Option<String>,
}

impl StripeEvents {
    /// The events of the account whose secret API `key` this is, at `base`
    /// (`https://api.stripe.com`).
    pub fn new(base: impl Into<String>, key: Secret) -> Result<Self, ConfigError> {
        let client = http_client(Duration::from_secs(30)).map_err(|e| ConfigError::Invalid {
            var: "STRIPE_API_KEY".into(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(StripeEvents { client, base: base.into().trim_end_matches('/').to_string(), key })
    }

    /// One window, all its pages; false if the deadline came first.
    async fn window(
        &self,
        pool: &PgPool,
        start: i64,
        end: i64,
        deadline: Instant,
    ) -> Result<(Found, bool), ReconcileError> {
        let mut found = Found::default();
        let parser = Stripe::new(vec![]);
        let headers = http::HeaderMap::new();
        let kept = serde_json::json!({});
        let mut starting_after: Option<String> = None;
        loop {
            if Instant::now() >= deadline {
                return Ok((found, false));
            }
            let mut query = vec![
                ("limit", "100".to_string()),
                ("created[gte]", start.to_string()),
                ("created[lt]", end.to_string()),
                ("delivery_success", "false".to_string()),
            ];
            if let Some(after) = &starting_after {
                query.push(("starting_after", after.clone()));
            }
            let req = self
                .client
                .get(format!("{}/v1/events", self.base))
                .bearer_auth(String::from_utf8_lossy(self.key.expose()))
                .query(&query);
            let text = answer_text("Stripe", get("Stripe", req).await?).await?;
            let page: EventPage<'_> = serde_json::from_str(&text)
                .map_err(|e| ReconcileError::Body { api: "Stripe", reason: e.to_string() })?;

            // Each event in its own statement, as a webhook would be: one that PostgreSQL
            // refuses is kept as `failed` (the receive fallback) and the page goes on.
            let mut conn = pool.acquire().await?;
            for raw in &page.data {
                let head: EventHead = serde_json::from_str(raw.get()).unwrap_or(EventHead { id: None });
                if let Some(id) = &head.id {
                    starting_after = Some(id.clone());
                }
                let body = raw.get().as_bytes();
                let Events::Single(event) = parser.events(&Delivery { headers: &headers, body, now: 0 }) else {
                    continue;
                };
                claim(&mut conn, Provider::STRIPE, body, &kept, &event, &mut found).await?;
            }
            drop(conn);
            if !page.has_more || page.data.is_empty() {
                return Ok((found, true));
            }
        }
    }
}

/// Lists undelivered events created since the checkpoint, window by window
/// (newest first within one, paginated with `starting_after`), and claims
/// each through the webhook claim; no page is asked for past `deadline`.
impl Source for StripeEvents {
    fn name(&self) -> String {
        "stripe events".into()
    }

    fn reconcile<'a>(&'a self, pool: &'a PgPool, config: &'a ReconcileConfig, deadline: Instant) -> SourceRun<'a> {
        Box::pin(walk(pool, "stripe:events", config, move |start, end| self.window(pool, start, end, deadline)))
    }
}
