//! Shopify order snapshots: the newest `updated_at` wins, whatever the arrival order.

use serde_json::Value;
use sqlx::PgConnection;

use crate::{decimal, required, text};
use webhook_inbox::{BatchHandler, Event, HandlerError, Outcome};

/// The topics whose payload is a whole order.
pub const TOPICS: [&str; 6] = [
    "orders/create",
    "orders/updated",
    "orders/paid",
    "orders/cancelled",
    "orders/fulfilled",
    "orders/partially_fulfilled",
];

#[derive(Debug, Clone, PartialEq, Eq)]
/// A Shopify order as one snapshot carries it.
pub struct OrderSnapshot {
    /// Shopify's order id.
    pub order_id: String,
    /// The customer's id, if the order has one.
    pub customer_id: Option<String>,
    /// `financial_status`.
    pub status: String,
    /// Decimal text, e.g. `"49.99"`.
    pub total_amount: String,
    /// RFC 3339 text: the source's version of the order.
    pub source_updated_at: String,
}

impl OrderSnapshot {
    /// `id`, `customer.id`, `financial_status`, `total_price`, `updated_at`.
    pub fn from_shopify(p: &Value) -> Result<Self, HandlerError> {
        Ok(OrderSnapshot {
            order_id: required(&p["id"], "id")?,
            customer_id: text(&p["customer"]["id"]),
            status: text(&p["financial_status"]).unwrap_or_else(|| "unknown".into()),
            total_amount: decimal(&p["total_price"], "total_price")?,
            source_updated_at: required(&p["updated_at"], "updated_at")?,
        })
    }
}

/// The version-guarded upsert of many snapshots in one statement; for each,
/// in order, whether it was written. Of one order's snapshots the newest
/// `updated_at` is the one tried (the first of equals); the others are
/// superseded and not written. The strict `<` makes a tie with the stored
/// version stale, so an identical replay writes no new row version. (An `IS
/// DISTINCT FROM` on the content columns alone would be wrong: a newer
/// snapshot with the same content would leave `source_updated_at` behind, and
/// a late, older one could then win. With `source_updated_at` in the tuple it
/// is always true under `<`, so it is left out.) The orders are written in the
/// order of their ids (`COLLATE "C"`, the worker's order of the lock keys), so
/// concurrent batches wait for each other instead of deadlocking.
pub async fn upsert_all(conn: &mut PgConnection, orders: &[OrderSnapshot]) -> Result<Vec<bool>, sqlx::Error> {
    let column = |f: fn(&OrderSnapshot) -> Option<&str>| orders.iter().map(f).collect::<Vec<_>>();
    let written: Vec<i64> = webhook_inbox::query_scalar(
        "WITH input AS (
             SELECT order_id, customer_id, status, total_amount::numeric AS total_amount,
                    source_updated_at::timestamptz AS source_updated_at, n
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY
                  AS o (order_id, customer_id, status, total_amount, source_updated_at, n)
         ), newest AS (
             SELECT DISTINCT ON (order_id) * FROM input ORDER BY order_id, source_updated_at DESC, n
         ), written AS (
             INSERT INTO orders AS o (order_id, customer_id, status, total_amount, source_updated_at)
             SELECT order_id, customer_id, status, total_amount, source_updated_at
             FROM newest ORDER BY order_id COLLATE \"C\"
             ON CONFLICT (order_id) DO UPDATE
             SET customer_id = EXCLUDED.customer_id,
                 status = EXCLUDED.status,
                 total_amount = EXCLUDED.total_amount,
                 source_updated_at = EXCLUDED.source_updated_at
             WHERE o.source_updated_at < EXCLUDED.source_updated_at
             RETURNING o.order_id
         )
         SELECT newest.n FROM newest JOIN written USING (order_id)",
    )
    .bind(column(|o| Some(&o.order_id)))
    .bind(column(|o| o.customer_id.as_deref()))
    .bind(column(|o| Some(&o.status)))
    .bind(column(|o| Some(&o.total_amount)))
    .bind(column(|o| Some(&o.source_updated_at)))
    .fetch_all(conn)
    .await?;
    let mut applied = vec![false; orders.len()];
    for n in written {
        applied[n as usize - 1] = true;
    }
    Ok(applied)
}

/// The handler of Shopify's whole-order topics ([`TOPICS`]): a batch's
/// snapshots in one statement.
pub struct OrderSnapshotHandler;

impl BatchHandler for OrderSnapshotHandler {
    type Payload = Value;

    async fn handle_batch(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Outcome>, HandlerError> {
        let orders = events.iter().map(|e| OrderSnapshot::from_shopify(&e.payload)).collect::<Result<Vec<_>, _>>()?;
        let applied = upsert_all(conn, &orders).await?;
        tracing::debug!(orders = orders.len(), applied = applied.iter().filter(|a| **a).count(), "order snapshots");
        Ok(applied.into_iter().map(|a| if a { Outcome::Applied } else { Outcome::NoEffect }).collect())
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("order:{}", event.payload["id"]))
    }
}
