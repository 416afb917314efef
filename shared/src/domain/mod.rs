//! The reference domain: working handlers, and the template to copy.
//!
//! - `orders`: Shopify order snapshots, version-guarded upserts.
//! - `payments`: Stripe `payment_intent.succeeded`, keyed by the PaymentIntent.
//! - `deposits`: Marqeta `gpa.credit` completions, deltas applied once per token.

pub mod deposits;
pub mod orders;
pub mod payments;

use crate::{
    core::provider::Provider,
    process::handlers::{HandlerError, Handlers},
};

impl Handlers {
    /// The reference domain: Shopify orders, Stripe payments, Marqeta deposits.
    /// (Registered here, so the handler registry knows nothing of the domain.)
    pub fn reference() -> Self {
        let mut h = Handlers::new();
        for topic in orders::TOPICS {
            h = h.on(Provider::SHOPIFY, topic, orders::OrderSnapshotHandler);
        }
        h.on(Provider::STRIPE, payments::EVENT_TYPE, payments::PaymentSucceededHandler).on(
            Provider::MARQETA,
            deposits::EVENT_TYPE,
            deposits::DepositHandler,
        )
    }
}

/// A string field, or a number written as text (ids and amounts come as either).
pub(crate) fn text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn required(v: &serde_json::Value, path: &str) -> Result<String, HandlerError> {
    text(v).ok_or_else(|| HandlerError::Permanent(format!("payload has no usable {path}")))
}

/// A plain decimal (`-12.50`), checked before PostgreSQL sees it.
pub(crate) fn decimal(v: &serde_json::Value, path: &str) -> Result<String, HandlerError> {
    let s = required(v, path)?;
    let digits = s.strip_prefix('-').unwrap_or(&s);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
    let ok = !int.is_empty() && !frac.is_empty() && (int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit());
    if ok {
        Ok(s)
    } else {
        Err(HandlerError::Permanent(format!("{path} is not a decimal amount: {s:?}")))
    }
}
