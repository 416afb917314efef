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
    json!({ "type": event_type, "timestamp": rfc3339(super::now()), "data": data }).to_string()
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

/// Unix seconds as `2026-12-07T21:03:04Z` (the civil calendar from days, as
/// in Howard Hinnant's `civil_from_days`).
fn rfc3339(unix: u64) -> String {
    let (days, rest) = (unix / 86_400, unix % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_677_384), "2026-12-07T21:03:04Z");
    }
}
