//! The bodies the built-in providers send, for a test's deliveries: the
//! envelope each provider documents, with the event's id and type where
//! receive reads them, around the object the test gives. Sign one with the
//! provider's function in [`crate::testing`]:
//!
//! ```
//! use webhook_inbox::{serde_json::json, testing::{self, bodies}};
//!
//! let body = bodies::stripe_event("evt_1", "invoice.paid", json!({"id": "in_1", "object": "invoice", "amount_paid": 4200}));
//! let request = testing::stripe("whsec_test", &body);
//! # drop(request);
//! ```
//!
//! Shopify and GitHub send the resource itself as the body (the id and the
//! type travel in headers: [`crate::testing::shopify`],
//! [`crate::testing::github`]), so `json!(...).to_string()` is their body.

use serde_json::{json, Value};
use webhook_inbox_schemes::declared::{format_time, TimeFormat};

/// A Stripe `Event` as Stripe posts it: `id` and `type` (what receive reads),
/// `data.object` the object, and the envelope's other fields (`object:
/// "event"`, `api_version`, `created` now, `livemode: false`,
/// `pending_webhooks`, `request`).
pub fn stripe_event(id: &str, event_type: &str, object: Value) -> String {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": super::now(),
        "data": { "object": object },
        "livemode": false,
        "pending_webhooks": 1,
        "request": { "id": null, "idempotency_key": null },
        "type": event_type,
    })
    .to_string()
}

/// A Standard Webhooks payload: `type` (what receive reads as the event's
/// type; its id is the `webhook-id` header [`crate::testing::standard`]
/// sends), `timestamp` now in RFC 3339, and `data`.
pub fn standard_event(event_type: &str, data: Value) -> String {
    let timestamp = format_time(super::now() as i64, TimeFormat::Rfc3339);
    json!({ "type": event_type, "timestamp": timestamp, "data": data }).to_string()
}

/// A Marqeta batch: up to 10 notifications under their kind
/// (`"transactions"`, `"cardtransitions"`, `"chargebacktransitions"`, ...),
/// each an object with its `token` and, for most kinds, its `type`:
/// `{"transactions": [{"token": "t1", "type": "authorization", ...}]}`.
/// Receive stores one event per notification: `transactions:t1`, of type
/// `transactions:authorization`.
pub fn marqeta_batch(kind: &str, notifications: &[Value]) -> String {
    let mut batch = serde_json::Map::new();
    batch.insert(kind.to_string(), Value::Array(notifications.to_vec()));
    Value::Object(batch).to_string()
}
