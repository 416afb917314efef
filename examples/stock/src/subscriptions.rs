//! Stripe `customer.subscription.*`: the events are hints. Stripe does not
//! order them (an `updated` may come before the `created`, two `updated`s the
//! wrong way round), so the handler keeps the subscription the API has now,
//! fetched by the worker from `GET /v1/subscriptions/{id}` with no
//! transaction open, whatever the event's payload said; one fetch answered
//! later than a newer one changes nothing.

use serde_json::Value;
use sqlx::PgConnection;

use crate::{required, text};
use webhook_inbox::{
    hints::{Fetched, HintHandler, Object},
    Event, HandlerError, Outcome,
};

/// The Stripe event types this handler takes.
pub const EVENT_TYPES: &[&str] = &[
    "customer.subscription.created",
    "customer.subscription.updated",
    "customer.subscription.deleted",
    "customer.subscription.paused",
    "customer.subscription.resumed",
    "customer.subscription.trial_will_end",
    "customer.subscription.pending_update_applied",
    "customer.subscription.pending_update_expired",
];

/// Keeps `subscriptions` as the API has them.
pub struct SubscriptionHandler;

impl HintHandler for SubscriptionHandler {
    type Payload = Value;

    fn object(&self, event: &Event) -> Result<Object, HandlerError> {
        Ok(Object::new("subscriptions", required(&event.payload["data"]["object"]["id"], "data.object.id")?))
    }

    async fn apply(&self, conn: &mut PgConnection, event: &Event, fetched: &Fetched) -> Result<Outcome, HandlerError> {
        let asked = self.object(event)?.id;
        let s = &fetched.object;
        let id = required(&s["id"], "id (of the fetched subscription)")?;
        if id != asked {
            return Err(HandlerError::permanent(format!("asked for {asked:?}, the API answered {id:?}")));
        }
        let status = required(&s["status"], "status (of the fetched subscription)")?;
        let customer = text(&s["customer"]).or_else(|| text(&s["customer"]["id"]));
        // On the subscription before API version 2025-03-31, on its items since.
        let period_end =
            s["current_period_end"].as_i64().or_else(|| s["items"]["data"][0]["current_period_end"].as_i64());
        let applied = webhook_inbox::query(
            "INSERT INTO subscriptions (subscription_id, customer_id, status, current_period_end, object, fetched_at, version)
             VALUES ($1, $2, $3, to_timestamp($4), $5, to_timestamp($6), $7)
             ON CONFLICT (subscription_id) DO UPDATE
             SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                 current_period_end = EXCLUDED.current_period_end, object = EXCLUDED.object,
                 fetched_at = EXCLUDED.fetched_at, version = EXCLUDED.version
             WHERE subscriptions.version < EXCLUDED.version",
        )
        .bind(&id)
        .bind(customer)
        .bind(&status)
        .bind(period_end.map(|t| t as f64))
        .bind(sqlx::types::Json(s))
        .bind(fetched.asked_at.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()))
        .bind(fetched.version)
        .execute(conn)
        .await?
        .rows_affected();
        Ok(if applied == 1 { Outcome::Applied } else { Outcome::NoEffect })
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        text(&event.payload["data"]["object"]["id"]).map(|id| format!("stripe-subscription:{id}"))
    }
}
