//! A payments team's webhook effects on webhook-inbox: Stripe `invoice.paid`
//! marks one of its invoices paid and emails a receipt through the outbox;
//! Shopify `orders/paid` records the order as paid. Its tables are its own
//! (`migrations/`), and so are its binaries (`src/bin`): each is one call into
//! the library with [`app`].

use serde::Deserialize;
use webhook_inbox::{
    query_scalar, serde_json::json, sqlx::migrate::Migrator, App, Event, HandlerError, Handlers, Message, Outcome,
    PgConnection, RegistrationError,
};

pub mod mailer;

/// The team's migrations, applied after the inbox's by `migrate` and `dev`.
pub static MIGRATIONS: Migrator = sqlx::migrate!("./migrations");

/// The application every binary runs: its handlers, its migrations, and its
/// own sink (`mailer`, which the `email` destination of `destinations.toml` names).
pub fn app() -> Result<App, RegistrationError> {
    let handlers =
        Handlers::new().on("stripe", "invoice.paid", invoice_paid)?.on("shopify", "orders/paid", order_paid)?;
    Ok(App::new(handlers).with_migrations(&MIGRATIONS).with_sink("mailer", mailer::Mailer::from_env()))
}

/// What `invoice.paid` carries that this team reads (serde ignores the rest).
#[derive(Debug, Deserialize)]
pub struct InvoicePaid {
    pub data: StripeData<Invoice>,
}

/// Stripe's `data` envelope.
#[derive(Debug, Deserialize)]
pub struct StripeData<T> {
    pub object: T,
}

/// A Stripe invoice, as far as this team cares.
#[derive(Debug, Deserialize)]
pub struct Invoice {
    /// Stripe's id, `in_...`: the team stores its invoices under it.
    pub id: String,
    pub amount_paid: i64,
    pub currency: String,
}

/// The team's own errors, retryable or not, said once.
#[derive(Debug)]
pub enum InvoiceError {
    /// Stripe can tell us before our own system has written the invoice: retried later.
    NotYetKnown(String),
    /// Paid in full is the only state this team accepts.
    Underpaid { invoice: String, due: i64, paid: i64 },
}

impl std::fmt::Display for InvoiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvoiceError::NotYetKnown(id) => write!(f, "invoice {id} is not in the invoices table yet"),
            InvoiceError::Underpaid { invoice, due, paid } => write!(f, "invoice {invoice}: {paid} paid of {due}"),
        }
    }
}

impl From<InvoiceError> for HandlerError {
    fn from(e: InvoiceError) -> Self {
        match e {
            InvoiceError::NotYetKnown(_) => HandlerError::transient(e),
            InvoiceError::Underpaid { .. } => HandlerError::permanent(e),
        }
    }
}

/// Marks the invoice paid and enqueues its receipt, in the event's
/// transaction: both happen once, however often Stripe delivers the event
/// (the inbox), and however many events report the payment (the guard on
/// `status`).
pub async fn invoice_paid(conn: &mut PgConnection, event: &Event<InvoicePaid>) -> Result<Outcome, HandlerError> {
    let invoice = &event.payload.data.object;
    let due: Option<(i64, String, String)> = webhook_inbox::query_as(
        "SELECT amount_due, status, customer_email FROM invoices WHERE invoice_id = $1 FOR UPDATE",
    )
    .bind(&invoice.id)
    .fetch_optional(&mut *conn)
    .await?;
    let (due, status, email) = due.ok_or_else(|| InvoiceError::NotYetKnown(invoice.id.clone()))?;
    if status == "paid" {
        return Ok(Outcome::NoEffect);
    }
    if invoice.amount_paid < due {
        return Err(InvoiceError::Underpaid { invoice: invoice.id.clone(), due, paid: invoice.amount_paid }.into());
    }
    query_scalar::<String>(
        "UPDATE invoices SET status = 'paid', paid_at = now(), paid_by_event = $2 WHERE invoice_id = $1
         RETURNING invoice_id",
    )
    .bind(&invoice.id)
    .bind(&event.event_id)
    .fetch_one(&mut *conn)
    .await?;
    // To the `email` destination; the key is stable: the mailer deduplicates
    // on it (the relay sends it as the Idempotency-Key).
    let receipt = Message::new(
        "invoice",
        &invoice.id,
        format!("receipt:{}", invoice.id),
        json!({
            "event": "send_email",
            "template": "receipt",
            "to": email,
            "invoice_id": invoice.id,
            "amount": invoice.amount_paid,
            "currency": invoice.currency,
        }),
    )
    .to("email");
    event.enqueue(conn, &receipt).await?;
    Ok(Outcome::Applied)
}

/// What `orders/paid` carries that this team reads.
#[derive(Debug, Deserialize)]
pub struct OrderPaid {
    pub id: u64,
    pub total_price: String,
    pub currency: String,
}

/// Records the order as paid, once per order.
pub async fn order_paid(conn: &mut PgConnection, event: &Event<OrderPaid>) -> Result<Outcome, HandlerError> {
    let order = &event.payload;
    let inserted: Option<i64> = query_scalar(
        "INSERT INTO shop_orders_paid (order_id, total_price, currency) VALUES ($1, $2::numeric, $3)
         ON CONFLICT (order_id) DO NOTHING RETURNING order_id",
    )
    .bind(i64::try_from(order.id).map_err(HandlerError::permanent)?)
    .bind(&order.total_price)
    .bind(&order.currency)
    .fetch_optional(conn)
    .await?;
    Ok(if inserted.is_some() { Outcome::Applied } else { Outcome::NoEffect })
}
