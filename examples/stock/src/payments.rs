//! Stripe `payment_intent.succeeded`: one payment per PaymentIntent, one outbox
//! message per payment, however many events (twins included) report it.

use std::collections::HashSet;

use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::{required, text};
use webhook_inbox::{BatchHandler, Event, HandlerError, Message, Outcome};

/// The Stripe event type this handler takes.
pub const EVENT_TYPE: &str = "payment_intent.succeeded";

/// A succeeded PaymentIntent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The PaymentIntent's id: the business key, so a twin event changes nothing.
    pub payment_id: String,
    /// Minor units, from `amount_received`.
    pub amount: i64,
    /// ISO currency code, lower-case as Stripe sends it.
    pub currency: String,
    /// The customer's id, if any (an id, or an expanded object's).
    pub customer_id: Option<String>,
    /// The event that recorded it.
    pub stripe_event_id: String,
}

impl Payment {
    /// From a `payment_intent.succeeded` event's payload.
    pub fn from_stripe(event_id: &str, p: &Value) -> Result<Self, HandlerError> {
        let pi = &p["data"]["object"];
        let amount = pi["amount_received"]
            .as_i64()
            .ok_or_else(|| HandlerError::Permanent("data.object.amount_received is not an integer".into()))?;
        Ok(Payment {
            payment_id: required(&pi["id"], "data.object.id")?,
            amount,
            currency: required(&pi["currency"], "data.object.currency")?,
            // `customer` is an id, or an expanded object.
            customer_id: text(&pi["customer"]).or_else(|| text(&pi["customer"]["id"])),
            stripe_event_id: event_id.to_string(),
        })
    }
}

impl Payment {
    /// The message its consumers get, once per payment.
    pub fn message(&self) -> Message<'_> {
        Message::new(
            "payment",
            &self.payment_id,
            format!("payment_succeeded:{}", self.payment_id),
            json!({
                "event": "payment_succeeded",
                "payment_id": self.payment_id,
                "amount": self.amount,
                "currency": self.currency,
                "customer_id": self.customer_id,
                "stripe_event_id": self.stripe_event_id,
            }),
        )
    }
}

/// Inserts the payments whose PaymentIntent is not recorded yet, in one
/// statement, in their order (a PaymentIntent twice in `payments`: the first
/// is kept); the event ids of the payments inserted.
pub async fn insert_all(conn: &mut PgConnection, payments: &[Payment]) -> Result<HashSet<String>, sqlx::Error> {
    let column = |f: fn(&Payment) -> Option<&str>| payments.iter().map(f).collect::<Vec<_>>();
    webhook_inbox::query_scalar(
        "INSERT INTO payments (payment_id, amount, currency, customer_id, stripe_event_id)
         SELECT payment_id, amount, currency, customer_id, stripe_event_id
         FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY
              AS p (payment_id, amount, currency, customer_id, stripe_event_id, n)
         ORDER BY n
         ON CONFLICT (payment_id) DO NOTHING
         RETURNING stripe_event_id",
    )
    .bind(column(|p| Some(&p.payment_id)))
    .bind(payments.iter().map(|p| p.amount).collect::<Vec<_>>())
    .bind(column(|p| Some(&p.currency)))
    .bind(column(|p| p.customer_id.as_deref()))
    .bind(column(|p| Some(&p.stripe_event_id)))
    .fetch_all(conn)
    .await
    .map(|ids| ids.into_iter().collect())
}

/// The handler of Stripe `payment_intent.succeeded`: a batch's payments in two
/// statements (the payments, then their messages).
pub struct PaymentSucceededHandler;

impl BatchHandler for PaymentSucceededHandler {
    type Payload = Value;

    async fn handle_batch(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Outcome>, HandlerError> {
        let payments =
            events.iter().map(|e| Payment::from_stripe(&e.event_id, &e.payload)).collect::<Result<Vec<_>, _>>()?;
        let inserted = insert_all(conn, &payments).await?;
        // A twin event (or a replay) finds its PaymentIntent recorded: no message.
        let messages: Vec<_> = events
            .iter()
            .zip(&payments)
            .filter(|(e, _)| inserted.contains(&e.event_id))
            .map(|(e, p)| (e, p.message()))
            .collect();
        Event::enqueue_all(conn, &messages).await?;
        let outcome = |e: &Event| if inserted.contains(&e.event_id) { Outcome::Applied } else { Outcome::NoEffect };
        Ok(events.iter().map(outcome).collect())
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("payment:{}", event.payload["data"]["object"]["id"].as_str()?))
    }
}
