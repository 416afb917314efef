//! The stock application: the handlers and tables the repository's stock
//! binaries run (the Lambda functions in `functions/`, `inbox dev`, `inbox
//! serve`, the demo, the bench and the fault suite), built on the library's
//! public API alone, as a team's application is.
//!
//! - `orders`: Shopify order snapshots, version-guarded upserts.
//! - `payments`: Stripe `payment_intent.succeeded`, keyed by the PaymentIntent.
//! - `deposits`: Marqeta `gpa.credit` completions, deltas applied once per token.
//! - `subscriptions`: Stripe `customer.subscription.*` as hints, the
//!   subscription fetched from the API (`STRIPE_API_KEY`) and kept as it is there.
//!
//! The first three are batch handlers ([`webhook_inbox::BatchHandler`]): a
//! batch's events of each in a few set-based statements. The simple form, a
//! handler of one event, is in `examples/invoices`.
//!
//! Its tables come from its own migrations ([`MIGRATIONS`]), applied only where
//! this application runs; a team's database never gets them.

pub mod deposits;
pub mod orders;
pub mod payments;
pub mod subscriptions;

use sqlx::migrate::Migrator;

use webhook_inbox::{App, HandlerError, Handlers, Provider};

/// The stock application's tables (`examples/stock/migrations`), applied
/// after the inbox's, their history in [`HISTORY_TABLE`]: never in
/// `_sqlx_migrations`, where a team's migrator would refuse them.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./migrations");

/// Where the stock application records its applied migrations (its name from
/// the releases that called this application the stock application).
pub const HISTORY_TABLE: &str = "webhook_inbox_reference_migrations";

/// The stock binaries' application: the stock handlers and their tables.
pub fn app() -> App {
    App::new(handlers()).with_migrations_in(&MIGRATIONS, HISTORY_TABLE)
}

/// The stock handlers: Shopify orders, Stripe payments and subscriptions,
/// Marqeta deposits.
pub fn handlers() -> Handlers {
    let registered = Handlers::new()
        .on_each(Provider::SHOPIFY, &orders::TOPICS, orders::OrderSnapshotHandler)
        .and_then(|h| h.on(Provider::STRIPE, payments::EVENT_TYPE, payments::PaymentSucceededHandler))
        .and_then(|h| h.on(Provider::MARQETA, deposits::EVENT_TYPE, deposits::DepositHandler))
        .and_then(|h| {
            subscriptions::EVENT_TYPES
                .iter()
                .try_fold(h, |h, t| h.on(Provider::STRIPE, t, subscriptions::SubscriptionHandler))
        });
    // Each pair once, with a valid name: a test calls this.
    registered.expect("the stock handlers are registered once each")
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
    fn the_stock_handlers_register() {
        assert!(!super::handlers().is_empty());
    }
}
