//! Stripe `payment_intent.succeeded`: one payment per PaymentIntent, one outbox
//! message per payment, however many events (twins included) report it.

use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::{required, text};
use webhook_inbox::{Event, Handler, HandlerError, Message, Outcome};

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

/// Inserts the payment unless its PaymentIntent is already recorded; true when new.
pub async fn insert(conn: &mut PgConnection, p: &Payment) -> Result<bool, sqlx::Error> {
    let row: Option<(String,)> = webhook_inbox::query_as(
        "INSERT INTO payments (payment_id, amount, currency, customer_id, stripe_event_id)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (payment_id) DO NOTHING
         RETURNING payment_id",
    )
    .bind(&p.payment_id)
    .bind(p.amount)
    .bind(&p.currency)
    .bind(&p.customer_id)
    .bind(&p.stripe_event_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// The handler of Stripe `payment_intent.succeeded`.
pub struct PaymentSucceededHandler;

impl Handler for PaymentSucceededHandler {
    type Payload = Value;

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let payment = Payment::from_stripe(&event.event_id, &event.payload)?;
        if !insert(conn, &payment).await? {
            // A twin event (or a replay) finds the PaymentIntent recorded.
            return Ok(Outcome::NoEffect);
        }
        let message = Message::new(
            "payment",
            &payment.payment_id,
            format!("payment_succeeded:{}", payment.payment_id),
            json!({
                "event": "payment_succeeded",
                "payment_id": payment.payment_id,
                "amount": payment.amount,
                "currency": payment.currency,
                "customer_id": payment.customer_id,
                "stripe_event_id": payment.stripe_event_id,
            }),
        );
        event.enqueue(conn, &message).await?;
        Ok(Outcome::Applied)
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("payment:{}", event.payload["data"]["object"]["id"].as_str()?))
    }
}
