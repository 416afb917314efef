//! Shopify's orders as a source: each order updated since the checkpoint, claimed as an
//! `orders/updated` event keyed by the order and its `updated_at`.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::PgPool;

use super::{
    answer_text, claim, get, next_link, same_origin, walk, Found, ReconcileConfig, ReconcileError, Source, SourceRun,
};
use crate::core::http::http_client;
use webhook_inbox_schemes::ConfigError;
use webhook_inbox_schemes::{body_digest_id, payload, secret::Secret, NewEvent, Provider};

/// Shopify's Admin API: `SHOPIFY_SHOP_DOMAIN`, `SHOPIFY_ACCESS_TOKEN`,
/// `SHOPIFY_API_BASE` (default `https://<shop domain>`), `SHOPIFY_API_VERSION` (2024-10).
pub struct ShopifyOrders {
    client: reqwest::Client,
    base: String,
    version: String,
    token: Secret,
}

#[derive(Deserialize)]
struct OrderPage {
    /// Raw, so that one order no handler could use fails alone, not its page.
    orders: Vec<Box<RawValue>>,
}

/// An order that cannot be applied is kept in the inbox as `failed`, with its
/// reason and its bytes, keyed by their digest (`source = 'reconcile'`): the
/// page goes on, and the same order fetched again is a duplicate.
/// An order from the Admin API as an inbox event: `orders/updated`, the topic
/// whose webhook carries the same object, keyed by the order and the version
/// it is at (`reconcile:order:<id>:<updated_at>`), so the same snapshot is
/// claimed once however many runs see it. One that cannot be used is kept as
/// a `failed` row of its own, keyed by its digest.
fn order_event(order: &str) -> NewEvent {
    let unusable = |reason: String| {
        let payload = Some(order.to_string()).filter(|t| payload::storable(t));
        NewEvent::unusable(format!("reconcile:{}", body_digest_id(order.as_bytes())), ORDER_EVENT_TYPE, payload, reason)
    };
    let value = match payload::decode(order) {
        Ok(value) => value,
        Err(unusable_json) => return unusable(unusable_json.0),
    };
    let id = match &value["id"] {
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    match (id, value["updated_at"].as_str()) {
        (Some(id), Some(at)) if !payload::has_nul_escape(order) => {
            let event = NewEvent::pending(format!("reconcile:order:{id}:{at}"), ORDER_TOPIC, order.to_string());
            if event.event_id.chars().count() > webhook_inbox_schemes::MAX_EVENT_ID_CHARS {
                return unusable("malformed order: its id and updated_at are longer than an event id may be".into());
            }
            event
        }
        (Some(_), Some(_)) => unusable("malformed order: it holds \\u0000, which jsonb cannot store".into()),
        _ => unusable("malformed order: no id or no updated_at".into()),
    }
}

/// The `event_type` of an order reconcile found: Shopify's topic for the same object.
pub(crate) const ORDER_TOPIC: &str = "orders/updated";

/// The `event_type` of an order reconcile could not use.
pub(crate) const ORDER_EVENT_TYPE: &str = "reconcile:order";

impl ShopifyOrders {
    /// The orders of the shop at `base` (`https://<shop>.myshopify.com`), through
    /// the Admin API `version` (`2024-10`), with the access `token`.
    pub fn new(base: impl Into<String>, version: impl Into<String>, token: Secret) -> Result<Self, ConfigError> {
        let client = http_client(Duration::from_secs(30)).map_err(|e| ConfigError::Invalid {
            var: "SHOPIFY_ACCESS_TOKEN".into(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(ShopifyOrders {
            client,
            base: base.into().trim_end_matches('/').to_string(),
            version: version.into(),
            token,
        })
    }

    /// A `Link` is followed only on the configured shop's origin: the access token
    /// goes with the request. Anything else stops the run (checkpoint unchanged).
    fn same_shop(&self, link: String) -> Result<String, ReconcileError> {
        if same_origin(&self.base, &link) {
            return Ok(link);
        }
        let host = reqwest::Url::parse(&link).ok().and_then(|u| u.host_str().map(str::to_string)).unwrap_or_default();
        Err(ReconcileError::Body {
            api: "Shopify",
            reason: format!(
                "the next page's link leads to another host ({host:?}); not followed, the token stays home"
            ),
        })
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
        let (min, max): (String, String) = crate::db::query_as(
            "SELECT to_char(to_timestamp($1) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                    to_char(to_timestamp($2) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
        )
        .bind(start as f64)
        .bind(end as f64)
        .fetch_one(crate::db::Autocommit(pool))
        .await?;
        let mut url = format!("{}/admin/api/{}/orders.json", self.base, self.version);
        let mut query = vec![
            ("status", "any".to_string()),
            ("limit", "250".to_string()),
            ("updated_at_min", min),
            ("updated_at_max", max),
        ];
        loop {
            if Instant::now() >= deadline {
                return Ok((found, false));
            }
            let mut token =
                reqwest::header::HeaderValue::from_bytes(self.token.expose()).map_err(|_| ReconcileError::Body {
                    api: "Shopify",
                    reason: "SHOPIFY_ACCESS_TOKEN is not a valid header value".into(),
                })?;
            token.set_sensitive(true);
            let req = self.client.get(&url).header("X-Shopify-Access-Token", token).query(&query);
            let response = get("Shopify", req).await?;
            let next = response.headers().get(reqwest::header::LINK).and_then(|v| v.to_str().ok()).and_then(next_link);
            let text = answer_text("Shopify", response).await?;
            let page: OrderPage = serde_json::from_str(&text)
                .map_err(|e| ReconcileError::Body { api: "Shopify", reason: e.to_string() })?;
            let mut conn = pool.acquire().await?;
            let kept = serde_json::json!({});
            for raw in &page.orders {
                let order = raw.get();
                claim(&mut conn, Provider::SHOPIFY, order.as_bytes(), &kept, &order_event(order), &mut found).await?;
            }
            drop(conn);
            match next {
                // This page is applied; a link elsewhere stops the run before the token goes there.
                Some(link) => {
                    url = self.same_shop(link)?;
                    query.clear(); // page_info carries the query
                }
                None => return Ok((found, true)),
            }
        }
    }
}

/// Orders updated since the checkpoint, window by window and page by page
/// (`Link: rel="next"`), each claimed as an `orders/updated` event: a
/// snapshot claimed before is a duplicate. No page is
/// asked for past `deadline`.
impl Source for ShopifyOrders {
    fn name(&self) -> String {
        "shopify orders".into()
    }

    fn reconcile<'a>(&'a self, pool: &'a PgPool, config: &'a ReconcileConfig, deadline: Instant) -> SourceRun<'a> {
        Box::pin(walk(pool, "shopify:orders", config, move |start, end| self.window(pool, start, end, deadline)))
    }
}
