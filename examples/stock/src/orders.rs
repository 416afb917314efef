//! Shopify order snapshots: the newest `updated_at` wins, whatever the arrival order.

use serde_json::Value;
use sqlx::PgConnection;

use crate::{decimal, required, text};
use webhook_inbox::{Event, Handler, HandlerError, Outcome};

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

/// Which branch of the upsert ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The order was new.
    Inserted,
    /// A newer snapshot replaced the stored one.
    Updated,
    /// Older than (or as old as) the stored version: nothing written.
    Stale,
}

/// The version-guarded upsert. The strict `<` makes a tie stale, so an identical
/// replay writes no new row version. (An `IS DISTINCT FROM` on the content
/// columns alone would be wrong: a newer snapshot with the same content would
/// leave `source_updated_at` behind, and a late, older one could then win. With
/// `source_updated_at` in the tuple it is always true under `<`, so it is left out.)
/// `xmax = 0` tells an insert from an update on PostgreSQL 15-17 (18 has
/// `RETURNING old/new`); it is an implementation detail, covered by a test.
pub async fn upsert(conn: &mut PgConnection, o: &OrderSnapshot) -> Result<Applied, sqlx::Error> {
    let sql = match WasInserted::on(conn) {
        WasInserted::Xmax => UPSERT_XMAX,
        WasInserted::ReturningOld => UPSERT_RETURNING_OLD,
    };
    let inserted: Option<bool> = webhook_inbox::query_scalar(sql)
        .bind(&o.order_id)
        .bind(&o.customer_id)
        .bind(&o.status)
        .bind(&o.total_amount)
        .bind(&o.source_updated_at)
        .fetch_optional(conn)
        .await?;
    Ok(match inserted {
        Some(true) => Applied::Inserted,
        Some(false) => Applied::Updated,
        None => Applied::Stale,
    })
}

/// How the upsert tells an insert from an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WasInserted {
    /// `RETURNING (xmax = 0)`: a fresh row version has no deleting
    /// transaction. Works on every version, but leans on an implementation detail.
    Xmax,
    /// PostgreSQL 18: `RETURNING (old.order_id IS NULL)`, no old row, an insert.
    ReturningOld,
}

impl WasInserted {
    /// The server's way: `RETURNING old` from PostgreSQL 18 on.
    pub fn on(conn: &PgConnection) -> Self {
        match conn.server_version_num() {
            Some(v) if v >= 180_000 => WasInserted::ReturningOld,
            _ => WasInserted::Xmax,
        }
    }
}

macro_rules! upsert_returning {
    ($returning:literal) => {
        concat!(
            "INSERT INTO orders AS o (order_id, customer_id, status, total_amount, source_updated_at)
             VALUES ($1, $2, $3, $4::numeric, $5::timestamptz)
             ON CONFLICT (order_id) DO UPDATE
             SET customer_id = EXCLUDED.customer_id,
                 status = EXCLUDED.status,
                 total_amount = EXCLUDED.total_amount,
                 source_updated_at = EXCLUDED.source_updated_at
             WHERE o.source_updated_at < EXCLUDED.source_updated_at
             RETURNING ",
            $returning
        )
    };
}

const UPSERT_XMAX: &str = upsert_returning!("(xmax = 0)");
const UPSERT_RETURNING_OLD: &str = upsert_returning!("(old.order_id IS NULL)");

/// The handler of Shopify's whole-order topics ([`TOPICS`]).
pub struct OrderSnapshotHandler;

impl Handler for OrderSnapshotHandler {
    type Payload = Value;

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let order = OrderSnapshot::from_shopify(&event.payload)?;
        let applied = upsert(conn, &order).await?;
        tracing::debug!(order_id = %order.order_id, ?applied, "order snapshot");
        Ok(if applied == Applied::Stale { Outcome::NoEffect } else { Outcome::Applied })
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("order:{}", event.payload["id"]))
    }
}
