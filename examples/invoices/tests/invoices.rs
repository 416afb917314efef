//! The team's handlers on a real PostgreSQL, with the library's test support
//! (`webhook_inbox::testing`): the handler by itself on an event built for the
//! test, then through the real receive path and worker: applied once under a
//! storm of duplicates, events that came before the handler backfilled by one
//! requeue, migrations in either order.

use std::{ops::ControlFlow, sync::Arc};

use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{
    ops::{requeue_all, Audit, Filter, Status},
    serde_json::{json, Value},
    testing::{self, TestInbox},
    App, HandlerError, Handlers, Outcome, Provider,
};

const STRIPE_SECRET: &str = "whsec_invoices_test";
const SHOPIFY_SECRET: &str = "shpss_invoices_test";
const SECRETS: [(&str, &str); 2] =
    [("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET), ("SHOPIFY_WEBHOOK_SECRET", SHOPIFY_SECRET)];

fn invoice_paid(event_id: &str, invoice: &str, paid: i64) -> String {
    json!({"id": event_id, "object": "event", "type": "invoice.paid",
           "data": {"object": {"id": invoice, "object": "invoice", "amount_paid": paid, "currency": "eur"}}})
    .to_string()
}

async fn open_invoice(pool: &PgPool, id: &str, due: i64) {
    sqlx::query("INSERT INTO invoices (invoice_id, customer_email, amount_due) VALUES ($1, 'ada@example.com', $2)")
        .bind(id)
        .bind(due)
        .execute(pool)
        .await
        .unwrap();
}

/// The handler by itself, on an event built for the test: what it decides, and what it writes.
#[sqlx::test(migrations = false)]
async fn the_handler_pays_a_whole_payment_and_refuses_a_short_one(pool: PgPool) {
    invoices::app().unwrap().migrate(&pool).await.unwrap();
    open_invoice(&pool, "in_1", 500).await;
    let payload = |paid| invoices::InvoicePaid {
        data: invoices::StripeData {
            object: invoices::Invoice { id: "in_1".into(), amount_paid: paid, currency: "eur".into() },
        },
    };
    let mut conn = pool.acquire().await.unwrap();
    let short = testing::event(Provider::STRIPE, "evt_short", "invoice.paid", payload(499));
    let refused = invoices::invoice_paid(&mut conn, &short).await.unwrap_err();
    assert!(matches!(refused, HandlerError::Permanent(_)), "{refused}");
    let whole = testing::event(Provider::STRIPE, "evt_whole", "invoice.paid", payload(500));
    assert_eq!(invoices::invoice_paid(&mut conn, &whole).await.unwrap(), Outcome::Applied);
    let again = testing::event(Provider::STRIPE, "evt_twin", "invoice.paid", payload(500));
    assert_eq!(invoices::invoice_paid(&mut conn, &again).await.unwrap(), Outcome::NoEffect, "a twin finds it paid");
    let receipts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transactional_outbox").fetch_one(&mut *conn).await.unwrap();
    assert_eq!(receipts, 1);
}

/// Two twin Stripe events for one payment, each delivered 25 times at once,
/// and a Shopify order delivered 10 times: one invoice paid, one receipt, one order.
#[sqlx::test(migrations = false)]
async fn invoice_paid_is_applied_once_under_a_storm_of_duplicates(pool: PgPool) {
    let inbox = Arc::new(TestInbox::new(&pool, &invoices::app().unwrap(), &SECRETS).await.unwrap());
    open_invoice(&pool, "in_1", 4200).await;

    let barrier = Arc::new(tokio::sync::Barrier::new(60));
    let mut deliveries = Vec::new();
    for i in 0..60 {
        let (inbox, barrier) = (inbox.clone(), barrier.clone());
        deliveries.push(tokio::spawn(async move {
            let request = match i % 6 {
                0..=4 if i % 2 == 0 => testing::stripe(STRIPE_SECRET, &invoice_paid("evt_twin_a", "in_1", 4200)),
                0..=4 => testing::stripe(STRIPE_SECRET, &invoice_paid("evt_twin_b", "in_1", 4200)),
                _ => testing::shopify(
                    SHOPIFY_SECRET,
                    "wh_1",
                    "orders/paid",
                    r#"{"id": 820982911946154508, "total_price": "49.99", "currency": "EUR"}"#,
                ),
            };
            barrier.wait().await;
            inbox.deliver(request).await
        }));
    }
    let mut accepted = 0;
    for d in deliveries {
        let answer = d.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
        accepted += usize::from(answer.body["status"] == "accepted");
    }
    assert_eq!(accepted, 3, "each event claimed once: two twins and one order");

    inbox.drain().await.unwrap();
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
async fn events_received_before_the_handler_existed_are_backfilled_by_one_requeue(pool: PgPool) {
    // Yesterday's deployment: the tables, and no handler yet.
    let before = App::new(Handlers::new()).with_migrations(&invoices::MIGRATIONS);
    let inbox = TestInbox::new(&pool, &before, &SECRETS).await.unwrap();
    for i in 0..30 {
        open_invoice(&pool, &format!("in_{i}"), 100).await;
        let delivery = testing::stripe(STRIPE_SECRET, &invoice_paid(&format!("evt_{i}"), &format!("in_{i}"), 100));
        assert_eq!(inbox.deliver(delivery).await.status, 200);
    }
    assert_eq!(inbox.drain().await.unwrap().unhandled, 30);
    let unhandled: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unhandled, 30, "nothing ran for them, and the inbox says so");

    // Today's: the handler, and one requeue of what it missed.
    let inbox = TestInbox::new(&pool, &invoices::app().unwrap(), &SECRETS).await.unwrap();
    let filter = Filter {
        statuses: vec![Status::Unhandled],
        provider: Some("stripe".into()),
        event_type: Some("invoice.paid".into()),
        ..Filter::default()
    };
    let by = Audit { actor: "ops@example.com", action: "requeue", reason: "invoice.paid handler deployed" };
    let requeued = requeue_all(&pool, &filter, &by, 500, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!(requeued.requeued, 30);
    inbox.drain().await.unwrap();
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
async fn an_unknown_invoice_is_retried_and_an_underpaid_one_fails_at_once(pool: PgPool) {
    let inbox = TestInbox::new(&pool, &invoices::app().unwrap(), &SECRETS).await.unwrap();
    open_invoice(&pool, "in_short", 500).await;
    inbox.deliver(testing::stripe(STRIPE_SECRET, &invoice_paid("evt_early", "in_later", 100))).await;
    inbox.deliver(testing::stripe(STRIPE_SECRET, &invoice_paid("evt_short", "in_short", 499))).await;
    inbox.pass().await.unwrap();
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
    // The invoice arrives; the retry finds it, and the receipt goes to the mailer.
    open_invoice(&pool, "in_later", 100).await;
    inbox.drain().await.unwrap();
    assert_eq!(inbox.require_status("stripe", "evt_early", Status::Done).await.attempts, 2);
    let receipt = inbox.require_enqueued("stripe", "evt_early", "email").await;
    assert_eq!((receipt[0].message_key.as_str(), &receipt[0].payload["amount"]), ("receipt:in_later", &json!(100)));
    inbox.require_status("stripe", "evt_short", Status::Failed).await;
    inbox.require_nothing_enqueued("stripe", "evt_short").await;
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
        assert!(!tables.iter().any(|t| t == reference), "the stock application's {reference} in a team's database");
    }
}

/// The receipt a handler writes goes to the mail API through the team's own
/// sink, as `destinations.toml` routes it, in the API's own format.
#[sqlx::test(migrations = false)]
async fn a_receipt_reaches_the_mail_api_through_the_teams_own_sink(pool: PgPool) {
    use wiremock::{
        matchers::{header, method, path},
        Mock, MockServer, ResponseTemplate,
    };
    let api = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/email/withTemplate"))
        .and(header("x-postmark-server-token", "server-token"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&api)
        .await;
    let app = invoices::app().unwrap().with_sink("mailer", invoices::mailer::Mailer::new(api.uri(), "server-token"));
    let mut env = SECRETS.to_vec();
    env.push(("RELAY_DESTINATIONS", include_str!("../destinations.toml")));
    let inbox = TestInbox::new(&pool, &app, &env).await.unwrap();
    open_invoice(&pool, "in_mail", 500).await;
    assert_eq!(
        inbox.deliver(testing::stripe(STRIPE_SECRET, &invoice_paid("evt_mail", "in_mail", 500))).await.status,
        200
    );
    inbox.drain().await.unwrap();
    let relayed = inbox.relay().await.unwrap();
    assert_eq!((relayed.sent, relayed.dead), (1, 0), "{relayed:?}");
    let requests = api.received_requests().await.unwrap();
    let email: Value = webhook_inbox::serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!((email["To"].as_str(), email["TemplateAlias"].as_str()), (Some("ada@example.com"), Some("receipt")));
    assert_eq!(email["Metadata"]["message_key"], "receipt:in_mail");
}
