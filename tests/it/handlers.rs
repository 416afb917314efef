//! A team's handlers, written as the crate's users write them (from its root
//! only): async fns, closures and trait impls, typed payloads, the event's
//! context, its own errors, and registration mistakes found at start-up.

use std::{ops::ControlFlow, time::UNIX_EPOCH};

use inbox_tests::{fast_worker_config, later, store, MIGRATOR};
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::{
    query, Event, Handler, HandlerError, Handlers, Outcome, PgConnection, Provider, RegistrationError, Worker,
};

#[derive(Debug, Deserialize)]
struct InvoicePaid {
    data: InvoiceData,
}

#[derive(Debug, Deserialize)]
struct InvoiceData {
    object: Invoice,
}

#[derive(Debug, Deserialize)]
struct Invoice {
    id: String,
    amount_paid: i64,
}

fn invoice_paid(event_id: &str, invoice: &str, amount: i64) -> String {
    json!({"id": event_id, "type": "invoice.paid", "data": {"object": {"id": invoice, "amount_paid": amount}}})
        .to_string()
}

async fn with_invoices(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE test_invoices (invoice_id TEXT PRIMARY KEY, amount BIGINT NOT NULL, event_id TEXT NOT NULL,
                                     attempts INT NOT NULL, received_epoch BIGINT NOT NULL, shop TEXT)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// A team's handler: an async fn of a typed event.
async fn record_invoice(conn: &mut PgConnection, event: &Event<InvoicePaid>) -> Result<Outcome, HandlerError> {
    let invoice = &event.payload.data.object;
    let received = event.received_at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let inserted = query(
        "INSERT INTO test_invoices (invoice_id, amount, event_id, attempts, received_epoch, shop)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (invoice_id) DO NOTHING",
    )
    .bind(&invoice.id)
    .bind(invoice.amount_paid)
    .bind(&event.event_id)
    .bind(event.attempts)
    .bind(received)
    .bind(event.headers.get("X-Test-Shop"))
    .execute(conn)
    .await?;
    Ok(if inserted.rows_affected() == 1 { Outcome::Applied } else { Outcome::NoEffect })
}

async fn status(pool: &PgPool, event_id: &str) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, failure_reason FROM webhook_inbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_typed_handler_gets_its_payload_decoded_and_the_event_s_context(pool: PgPool) {
    with_invoices(&pool).await;
    store(&pool, Provider::STRIPE, "evt_1", "invoice.paid", &invoice_paid("evt_1", "in_1", 4200)).await;
    sqlx::query(
        "UPDATE webhook_inbox SET headers = '{\"x-test-shop\": \"acme\"}', received_at = '2026-11-30 10:00:00+00'
         WHERE event_id = 'evt_1'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let handlers = Handlers::new().on("stripe", "invoice.paid", record_invoice).unwrap();
    let counts = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!(counts.applied, 1);
    let row: (String, i64, String, i32, i64, Option<String>) =
        sqlx::query_as("SELECT * FROM test_invoices").fetch_one(&pool).await.unwrap();
    assert_eq!(row, ("in_1".into(), 4200, "evt_1".into(), 0, 1_796_032_800, Some("acme".into())));
    assert_eq!(status(&pool, "evt_1").await.0, "done");
}

/// One payload that does not fit the handler's type fails alone, at once, with
/// serde's message; the events beside it are applied.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_payload_that_does_not_decode_as_the_handler_s_type_fails_at_once_with_serde_s_reason(pool: PgPool) {
    with_invoices(&pool).await;
    store(&pool, Provider::STRIPE, "evt_a", "invoice.paid", &invoice_paid("evt_a", "in_a", 1)).await;
    let wrong = json!({"id": "evt_bad", "data": {"object": {"id": "in_bad", "amount_paid": "lots"}}}).to_string();
    store(&pool, Provider::STRIPE, "evt_bad", "invoice.paid", &wrong).await;
    store(&pool, Provider::STRIPE, "evt_z", "invoice.paid", &invoice_paid("evt_z", "in_z", 2)).await;
    let handlers = Handlers::new().on(Provider::STRIPE, "invoice.paid", record_invoice).unwrap();
    let counts = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.applied, counts.failed, counts.retried), (2, 1, 0));
    let (state, attempts, reason) = status(&pool, "evt_bad").await;
    assert_eq!((state.as_str(), attempts), ("failed", 1), "permanent: never retried");
    let reason = reason.unwrap();
    assert!(reason.contains("invalid type: string \"lots\", expected i64"), "serde's message: {reason}");
    assert_eq!(status(&pool, "evt_a").await.0, "done");
    assert_eq!(status(&pool, "evt_z").await.0, "done");
}

/// A team's own error, told retryable or not in one place.
#[derive(Debug, thiserror::Error)]
enum LedgerError {
    #[error("ledger {0} is closed for the night")]
    Closed(String),
    #[error("no ledger {0}")]
    Unknown(String),
}

impl From<LedgerError> for HandlerError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::Closed(_) => HandlerError::transient(e),
            LedgerError::Unknown(_) => HandlerError::permanent(e),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Entry {
    ledger: String,
}

fn post(ledger: &str) -> Result<(), LedgerError> {
    match ledger {
        "open" => Ok(()),
        "night" => Err(LedgerError::Closed(ledger.into())),
        other => Err(LedgerError::Unknown(other.into())),
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_closure_is_a_handler_and_the_team_s_errors_say_whether_to_retry(pool: PgPool) {
    for (id, ledger) in [("e_open", "open"), ("e_night", "night"), ("e_gone", "gone")] {
        store(&pool, Provider::STANDARD, id, "ledger.entry", &json!({"ledger": ledger}).to_string()).await;
    }
    let handlers = Handlers::new()
        .on("standard", "ledger.entry", async |_: &mut PgConnection, event: &Event<Entry>| {
            post(&event.payload.ledger)?;
            Ok(Outcome::Applied)
        })
        .unwrap();
    let counts = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.applied, counts.retried, counts.failed), (1, 1, 1));
    assert_eq!(status(&pool, "e_open").await.0, "done");
    assert_eq!(
        status(&pool, "e_night").await,
        ("pending".into(), 1, Some("attempt 1: ledger night is closed for the night".into()))
    );
    assert_eq!(status(&pool, "e_gone").await, ("failed".into(), 1, Some("attempt 1: no ledger gone".into())));
}

/// A handler with a lock key implements the trait; its payload is typed too.
struct ByLedger;

impl Handler for ByLedger {
    type Payload = Entry;

    async fn handle(&self, conn: &mut PgConnection, event: &Event<Entry>) -> Result<Outcome, HandlerError> {
        query("INSERT INTO applied (ledger) VALUES ($1)").bind(&event.payload.ledger).execute(conn).await?;
        Ok(Outcome::NoEffect)
    }

    fn lock_key(&self, event: &Event<Entry>) -> Option<String> {
        Some(event.payload.ledger.clone())
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_handler_type_s_lock_keys_order_its_batch(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE applied (seq SERIAL, ledger TEXT)").execute(&pool).await.unwrap();
    for (id, ledger) in [("e1", "c"), ("e2", "a"), ("e3", "b")] {
        store(&pool, Provider::STANDARD, id, "ledger.entry", &json!({"ledger": ledger}).to_string()).await;
    }
    let handlers = Handlers::new().on("standard", "ledger.entry", ByLedger).unwrap();
    let counts = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!(counts.no_effect, 3);
    let order: Vec<String> =
        sqlx::query_scalar("SELECT ledger FROM applied ORDER BY seq").fetch_all(&pool).await.unwrap();
    assert_eq!(order, ["a", "b", "c"], "in the order of their lock keys, not of receipt");
}

async fn noop(_: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
    Ok(Outcome::NoEffect)
}

#[test]
fn a_second_handler_for_one_provider_and_type_is_refused_at_start_up() {
    let handlers = Handlers::new().on("stripe", "invoice.paid", noop).unwrap();
    let again = handlers.clone().on(Provider::STRIPE, "invoice.paid", record_invoice).unwrap_err();
    assert!(matches!(&again, RegistrationError::Duplicate { provider, event_type }
        if *provider == Provider::STRIPE && event_type == "invoice.paid"));
    assert_eq!(again.to_string(), "a handler for stripe \"invoice.paid\" is registered already");
    // Another type, or another provider, is another handler.
    let handlers = handlers.on("stripe", "invoice.voided", noop).unwrap().on("shopify", "invoice.paid", noop).unwrap();
    assert!(!handlers.is_empty());
    assert!(matches!(Handlers::new().on("Stripe", "x", noop), Err(RegistrationError::InvalidProvider(_))));
    assert!(matches!(Handlers::new().on("stripe", "", noop), Err(RegistrationError::EmptyEventType(_))));
}

/// `ops::requeue_all` from code: pending events are queued already, and a
/// filter that names them neither takes them nor loops over them.
#[sqlx::test(migrator = "MIGRATOR")]
async fn requeue_all_never_takes_pending_events(pool: PgPool) {
    use webhook_inbox::ops::{requeue_all, Audit, Filter, Status};
    for i in 0..30 {
        store(&pool, Provider::STANDARD, &format!("p{i}"), "x", "{}").await;
    }
    sqlx::query("UPDATE webhook_inbox SET attempts = 2, next_attempt_at = now() + interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    let filter = Filter { statuses: vec![Status::Pending, Status::Unhandled], ..Filter::default() };
    let by = Audit { actor: "test", action: "requeue", reason: "pending named by mistake" };
    let done = requeue_all(&pool, &filter, &by, 10, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!((done.matching, done.requeued, done.held), (0, 0, 0));
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_inbox WHERE attempts = 2 AND next_attempt_at > now() + interval '50 minutes'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(untouched, 30, "their backoff and attempts stay");
}

/// `ops::requeue_all`'s hook stops it between two batches: what it requeued
/// stays requeued, the rest stays where it was, and the result says it stopped.
#[sqlx::test(migrator = "MIGRATOR")]
async fn requeue_all_stops_where_its_progress_hook_says(pool: PgPool) {
    use webhook_inbox::ops::{requeue_all, Audit, Filter, Status};
    for i in 0..30 {
        store(&pool, Provider::STANDARD, &format!("u{i}"), "x", "{}").await;
    }
    sqlx::query("UPDATE webhook_inbox SET status = 'unhandled', processed_at = now() - interval '1 minute'")
        .execute(&pool)
        .await
        .unwrap();
    let filter = Filter { statuses: vec![Status::Unhandled], ..Filter::default() };
    let by = Audit { actor: "test", action: "requeue", reason: "stopped after two batches" };
    let mut batches = 0;
    let done = requeue_all(&pool, &filter, &by, 10, |_| {
        batches += 1;
        if batches == 2 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .await
    .unwrap();
    assert_eq!((done.matching, done.requeued, done.stopped), (30, 20, true));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 10);
    let whole = requeue_all(&pool, &filter, &by, 10, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!((whole.requeued, whole.stopped), (10, false));
}
