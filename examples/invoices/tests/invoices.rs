//! The team's handlers on a real PostgreSQL, through the inbox's real receive
//! handler and worker: applied once under a storm of duplicates, events that
//! came before the handler backfilled by one requeue, migrations in either order.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{
    config::Env,
    ops::{requeue_all, Filter, Requeue, Status},
    serde_json::{json, Value},
    App, Handlers, ReceiveConfig, Receiver, Stage, Worker, WorkerConfig,
};

const STRIPE_SECRET: &str = "whsec_invoices_test";
const SHOPIFY_SECRET: &str = "shpss_invoices_test";

fn receiver(options: &PgConnectOptions, app: &App) -> Receiver {
    let url = format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    );
    let pairs = [
        ("DATABASE_URL", url.as_str()),
        ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
        ("SHOPIFY_WEBHOOK_SECRET", SHOPIFY_SECRET),
    ];
    let config = ReceiveConfig::read(&Env::from_pairs(&pairs), 8).unwrap();
    Receiver::from_config(&config).unwrap().with_handlers(app.handlers().clone())
}

fn worker(pool: &PgPool, app: &App) -> Worker {
    let config = WorkerConfig { retry_base: Duration::from_millis(1), ..WorkerConfig::default() };
    Worker::new(pool.clone(), app.handlers().clone(), config)
}

fn hmac(key: &str, message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// A delivery signed as Stripe signs it: `t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`.
fn stripe(body: &str) -> http::Request<lambda_http::Body> {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let v1 = hex::encode(hmac(STRIPE_SECRET, format!("{t}.{body}").as_bytes()));
    http::Request::post("/webhooks/stripe")
        .header("Stripe-Signature", format!("t={t},v1={v1}"))
        .body(lambda_http::Body::from(body.to_string()))
        .unwrap()
}

/// A delivery signed as Shopify signs it: base64 HMAC-SHA256 of the body.
fn shopify(webhook_id: &str, topic: &str, body: &str) -> http::Request<lambda_http::Body> {
    use base64::{engine::general_purpose::STANDARD, Engine as _};
    http::Request::post("/webhooks/shopify")
        .header("X-Shopify-Hmac-Sha256", STANDARD.encode(hmac(SHOPIFY_SECRET, body.as_bytes())))
        .header("X-Shopify-Webhook-Id", webhook_id)
        .header("X-Shopify-Topic", topic)
        .body(lambda_http::Body::from(body.to_string()))
        .unwrap()
}

fn invoice_paid(event_id: &str, invoice: &str, paid: i64) -> String {
    json!({"id": event_id, "object": "event", "type": "invoice.paid",
           "data": {"object": {"id": invoice, "object": "invoice", "amount_paid": paid, "currency": "eur"}}})
    .to_string()
}

async fn answer(r: &Receiver, request: http::Request<lambda_http::Body>) -> (u16, Value) {
    let response = r.handle(request).await;
    let status = response.status().as_u16();
    (status, serde_json_body(response.body()))
}

fn serde_json_body(body: &lambda_http::Body) -> Value {
    webhook_inbox::serde_json::from_slice(body.as_ref()).unwrap_or(Value::Null)
}

async fn open_invoice(pool: &PgPool, id: &str, due: i64) {
    sqlx::query("INSERT INTO invoices (invoice_id, customer_email, amount_due) VALUES ($1, 'ada@example.com', $2)")
        .bind(id)
        .bind(due)
        .execute(pool)
        .await
        .unwrap();
}

/// Drains with each worker at once, until nothing is due.
async fn drain(workers: Vec<Worker>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut set = tokio::task::JoinSet::new();
    for w in workers {
        set.spawn(async move { w.run(deadline).await });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap().unwrap();
    }
}

/// Two twin Stripe events for one payment, each delivered 25 times at once,
/// and a Shopify order delivered 10 times: one invoice paid, one receipt, one order.
#[sqlx::test(migrations = false)]
async fn invoice_paid_is_applied_once_under_a_storm_of_duplicates(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_with(options.clone()).await.unwrap();
    let app = invoices::app().unwrap();
    app.migrate(&pool).await.unwrap();
    open_invoice(&pool, "in_1", 4200).await;
    let r = Arc::new(receiver(&options, &app));

    let barrier = Arc::new(tokio::sync::Barrier::new(60));
    let mut deliveries = Vec::new();
    for i in 0..60 {
        let (r, barrier) = (r.clone(), barrier.clone());
        deliveries.push(tokio::spawn(async move {
            let request = match i % 6 {
                0..=4 if i % 2 == 0 => stripe(&invoice_paid("evt_twin_a", "in_1", 4200)),
                0..=4 => stripe(&invoice_paid("evt_twin_b", "in_1", 4200)),
                _ => shopify(
                    "wh_1",
                    "orders/paid",
                    r#"{"id": 820982911946154508, "total_price": "49.99", "currency": "EUR"}"#,
                ),
            };
            barrier.wait().await;
            answer(&r, request).await
        }));
    }
    let mut accepted = 0;
    for d in deliveries {
        let (status, body) = d.await.unwrap();
        assert_eq!(status, 200, "{body}");
        accepted += usize::from(body["status"] == "accepted");
    }
    assert_eq!(accepted, 3, "each event claimed once: two twins and one order");

    drain(vec![worker(&pool, &app), worker(&pool, &app)]).await;
    let state: (String, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT status FROM invoices WHERE invoice_id = 'in_1'),
                (SELECT count(*) FROM transactional_outbox WHERE message_key = 'receipt:in_1'),
                (SELECT count(*) FROM shop_orders_paid),
                (SELECT count(*) FROM webhook_inbox WHERE status = 'done')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, ("paid".into(), 1, 1, 3));
    let receipt: Value = sqlx::query_scalar("SELECT payload FROM transactional_outbox").fetch_one(&pool).await.unwrap();
    assert_eq!(receipt["to"], "ada@example.com");
}

/// The team deploys its invoice handler after Stripe started sending: what came
/// before is `unhandled`, and one requeue by type runs the handler over it.
#[sqlx::test(migrations = false)]
async fn events_received_before_the_handler_existed_are_backfilled_by_one_requeue(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_with(options.clone()).await.unwrap();
    // Yesterday's deployment: the tables, and no handler yet.
    let before = App::new(Handlers::new()).with_migrations(&invoices::MIGRATIONS);
    before.migrate(&pool).await.unwrap();
    let r = receiver(&options, &before);
    for i in 0..30 {
        open_invoice(&pool, &format!("in_{i}"), 100).await;
        let (status, _) = answer(&r, stripe(&invoice_paid(&format!("evt_{i}"), &format!("in_{i}"), 100))).await;
        assert_eq!(status, 200);
    }
    drain(vec![worker(&pool, &before)]).await;
    let unhandled: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unhandled, 30, "nothing ran for them, and the inbox says so");

    // Today's: the handler, and one requeue of what it missed.
    let app = invoices::app().unwrap();
    app.migrate(&pool).await.unwrap();
    let filter = Filter {
        statuses: vec![Status::Unhandled],
        provider: Some("stripe".into()),
        event_type: Some("invoice.paid".into()),
        ..Filter::default()
    };
    let by = Requeue { actor: "ops@example.com", action: "requeue", reason: "invoice.paid handler deployed" };
    let requeued = requeue_all(&pool, &filter, &by, 500, |_| {}).await.unwrap();
    assert_eq!(requeued.requeued, 30);
    drain(vec![worker(&pool, &app)]).await;
    let state: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM invoices WHERE status = 'paid'),
                (SELECT count(*) FROM transactional_outbox WHERE message_key LIKE 'receipt:%')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, (30, 30));
}

#[sqlx::test(migrations = false)]
async fn an_unknown_invoice_is_retried_and_an_underpaid_one_fails_at_once(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_with(options.clone()).await.unwrap();
    let app = invoices::app().unwrap();
    app.migrate(&pool).await.unwrap();
    open_invoice(&pool, "in_short", 500).await;
    let r = receiver(&options, &app);
    answer(&r, stripe(&invoice_paid("evt_early", "in_later", 100))).await;
    answer(&r, stripe(&invoice_paid("evt_short", "in_short", 499))).await;
    worker(&pool, &app).run_once(Instant::now() + Duration::from_secs(10)).await.unwrap();
    let rows: Vec<(String, String, i32, String)> =
        sqlx::query_as("SELECT event_id, status, attempts, failure_reason FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            (
                "evt_early".into(),
                "pending".into(),
                1,
                "attempt 1: invoice in_later is not in the invoices table yet".into()
            ),
            ("evt_short".into(), "failed".into(), 1, "attempt 1: invoice in_short: 499 paid of 500".into()),
        ]
    );
    // The invoice arrives; the retry finds it.
    open_invoice(&pool, "in_later", 100).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    worker(&pool, &app).run_once(Instant::now() + Duration::from_secs(10)).await.unwrap();
    let paid: String =
        sqlx::query_scalar("SELECT status FROM invoices WHERE invoice_id = 'in_later'").fetch_one(&pool).await.unwrap();
    assert_eq!(paid, "paid");
}

/// The team's migrations (sqlx's `_sqlx_migrations`) and the inbox's (its own
/// history) on one database, whichever runs first.
#[sqlx::test(migrations = false)]
async fn the_team_s_migrations_run_before_or_after_the_inbox_s(pool_options: PgPoolOptions, options: PgConnectOptions) {
    let pool = pool_options.connect_with(options.clone()).await.unwrap();
    // The team's own `sqlx migrate run` (or `MIGRATIONS.run`) first, then the inbox's...
    let inbox_only = App::default();
    invoices::MIGRATIONS.run(&pool).await.unwrap();
    inbox_only.migrate(&pool).await.unwrap();
    // ...then the other way round, and both through the app: nothing pending, nothing refused.
    inbox_only.migrate(&pool).await.unwrap();
    invoices::MIGRATIONS.run(&pool).await.unwrap();
    invoices::app().unwrap().migrate(&pool).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE '\\_%' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for table in ["invoices", "shop_orders_paid", "webhook_inbox", "transactional_outbox"] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    for reference in ["orders", "payments", "accounts", "account_deposits"] {
        assert!(!tables.iter().any(|t| t == reference), "the reference domain's {reference} in a team's database");
    }
}
