//! The reference domain: the stock binaries' handlers and their tables.
//!
//! - `orders`: Shopify order snapshots, version-guarded upserts.
//! - `payments`: Stripe `payment_intent.succeeded`, keyed by the PaymentIntent.
//! - `deposits`: Marqeta `gpa.credit` completions, deltas applied once per token.
//! - `subscriptions`: Stripe `customer.subscription.*` as hints, the
//!   subscription fetched from the API (`STRIPE_API_KEY`) and kept as it is there.
//!
//! Its tables come from its own migrations ([`MIGRATIONS`]), applied only where
//! the domain is used: the stock binaries, `inbox dev`, the demo, the bench and
//! the fault suite. A team's database never gets them.

pub mod deposits;
pub mod orders;
pub mod payments;
pub mod subscriptions;

use sqlx::migrate::Migrator;

use crate::{
    app::App,
    core::provider::Provider,
    process::{handler::HandlerError, handlers::Handlers},
};

/// The reference domain's tables (`shared/reference-migrations`), applied
/// after the inbox's, their history in [`HISTORY_TABLE`]: never in
/// `_sqlx_migrations`, where a team's migrator would refuse them.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./reference-migrations");

/// Where the reference domain records its applied migrations.
pub const HISTORY_TABLE: &str = "webhook_inbox_reference_migrations";

/// The stock binaries' application: the reference handlers and their tables.
pub fn app() -> App {
    let mut app = App::new(Handlers::reference());
    app.own_tables = Some((&MIGRATIONS, HISTORY_TABLE));
    app
}

impl Handlers {
    /// The reference domain: Shopify orders, Stripe payments and
    /// subscriptions, Marqeta deposits.
    /// (Registered here, so the handler registry knows nothing of the domain.)
    pub fn reference() -> Self {
        let registered = orders::TOPICS
            .iter()
            .try_fold(Handlers::new(), |h, topic| h.on(Provider::SHOPIFY, topic, orders::OrderSnapshotHandler))
            .and_then(|h| h.on(Provider::STRIPE, payments::EVENT_TYPE, payments::PaymentSucceededHandler))
            .and_then(|h| h.on(Provider::MARQETA, deposits::EVENT_TYPE, deposits::DepositHandler))
            .and_then(|h| {
                subscriptions::EVENT_TYPES
                    .iter()
                    .try_fold(h, |h, t| h.on(Provider::STRIPE, t, subscriptions::SubscriptionHandler))
            });
        // Each pair once, with a valid name: a test calls this.
        registered.expect("the reference handlers are registered once each")
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_reference_handlers_register() {
        assert!(!super::Handlers::reference().is_empty());
    }
}
