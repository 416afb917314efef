//! The worker and the stock application against a real PostgreSQL: effects
//! apply once under duplicates, concurrency, crashes, retries and disorder.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use stock::{
    deposits,
    orders::{self, OrderSnapshot},
    payments::PaymentSucceededHandler,
};
use tokio::sync::Barrier;
use webhook_inbox::{
    db, process,
    process::worker::{Processed, Worker, WorkerConfig},
    process::{
        handler::{BatchHandler, Event, Handler, HandlerError, Outcome},
        handlers::Handlers,
    },
    receive::providers::Provider,
    runtime::stage::{Stage, Tally},
};

fn worker(pool: &PgPool, handlers: Handlers) -> Worker {
    Worker::new(pool.clone(), handlers, fast_worker_config())
}

/// Puts an event in the inbox as receive would.
async fn stored(pool: &PgPool, provider: Provider, event_id: &str, event_type: &str, payload: Value) {
    store(pool, provider, event_id, event_type, &payload.to_string()).await;
}

/// Drains until nothing is due, waiting out short backoffs; gives up after 10 s.
async fn drain_all(w: &Worker, pool: &PgPool) -> Processed {
    let mut total = Processed::default();
    for _ in 0..1000 {
        let c = w.run(Instant::now() + Duration::from_secs(5)).await.expect("the drain never errors");
        total.add(&c);
        let pending: i64 = scalar(pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending'").await;
        if pending == 0 {
            return total;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("events still pending after 10 s");
}

fn order(id: u64, status: &str, total: &str, updated_at: &str) -> Value {
    json!({"id": id, "customer": {"id": 7001}, "financial_status": status, "total_price": total, "updated_at": updated_at})
}

fn payment_event(event_id: &str, pi: &str, amount: i64) -> Value {
    json!({"id": event_id, "type": "payment_intent.succeeded",
           "data": {"object": {"id": pi, "amount_received": amount, "currency": "usd", "customer": "cus_1"}}})
}

// ---------- orders: version guards ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn out_of_order_snapshots_leave_the_newest(pool: PgPool) {
    let w = worker(&pool, stock::handlers());
    // `paid` happened at 12:00:05 but arrives first; `pending` (12:00:00) arrives late.
    stored(&pool, Provider::SHOPIFY, "d-new", "orders/updated", order(1001, "paid", "120.00", "2026-09-20T12:00:05Z"))
        .await;
    assert_eq!(w.run_once(later()).await.unwrap().applied, 1);
    stored(
        &pool,
        Provider::SHOPIFY,
        "d-old",
        "orders/updated",
        order(1001, "pending", "99.00", "2026-09-20T12:00:00Z"),
    )
    .await;
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.applied, c.no_effect), (0, 1), "the stale snapshot changes nothing");
    let (status, total): (String, String) =
        sqlx::query_as("SELECT status, total_amount::text FROM orders WHERE order_id = '1001'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), total.as_str()), ("paid", "120.00"));
    let done: i64 = scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'done'").await;
    assert_eq!(done, 2, "a stale event is done, not failed");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_upsert_keeps_the_newest_snapshot_and_a_replay_writes_no_row_version(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let snapshot = |id, status, at| OrderSnapshot::from_shopify(&order(id, status, "10.00", at)).unwrap();
    let v1 = snapshot(5, "pending", "2026-09-20T12:00:00Z");
    let v2 = snapshot(5, "paid", "2026-09-20T12:00:01Z");
    assert_eq!(orders::upsert_all(&mut conn, std::slice::from_ref(&v1)).await.unwrap(), [true]);
    assert_eq!(orders::upsert_all(&mut conn, std::slice::from_ref(&v2)).await.unwrap(), [true]);
    let xmin = || async { scalar::<String>(&pool, "SELECT xmin::text FROM orders WHERE order_id = '5'").await };
    let before = xmin().await;
    assert_eq!(orders::upsert_all(&mut conn, &[v2]).await.unwrap(), [false], "an identical replay (a tie) is stale");
    assert_eq!(orders::upsert_all(&mut conn, &[v1]).await.unwrap(), [false]);
    assert_eq!(xmin().await, before, "no new row version was written");
    // One statement with three snapshots of an order: the newest is written, the first of equals.
    let newest = snapshot(6, "paid", "2026-09-20T12:00:02Z");
    let older = snapshot(6, "pending", "2026-09-20T12:00:01Z");
    let tie = snapshot(6, "refunded", "2026-09-20T12:00:02Z");
    let other = snapshot(7, "paid", "2026-09-20T12:00:00Z");
    let written = orders::upsert_all(&mut conn, &[older, newest, tie, other]).await.unwrap();
    assert_eq!(written, [false, true, false, true]);
    let status: String = scalar(&pool, "SELECT status FROM orders WHERE order_id = '6'").await;
    assert_eq!(status, "paid");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_malformed_order_fails_at_once_with_its_reason(pool: PgPool) {
    let w = worker(&pool, stock::handlers());
    stored(&pool, Provider::SHOPIFY, "bad-total", "orders/create", order(9, "paid", "12,00", "2026-09-20T12:00:00Z"))
        .await;
    stored(&pool, Provider::SHOPIFY, "bad-time", "orders/create", order(10, "paid", "12.00", "half past noon")).await;
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.failed, c.retried), (2, 0), "permanent errors are not retried");
    let reasons: Vec<String> = sqlx::query_scalar("SELECT failure_reason FROM webhook_inbox ORDER BY event_id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(reasons[0].contains("invalid input syntax for type timestamp"), "{reasons:?}");
    assert!(reasons[1].contains("total_price is not a decimal"), "{reasons:?}");
}

// ---------- payments: the business key ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn stripe_twin_events_make_one_payment_and_one_outbox_message(pool: PgPool) {
    let w = worker(&pool, stock::handlers());
    stored(&pool, Provider::STRIPE, "evt_a", "payment_intent.succeeded", payment_event("evt_a", "pi_1", 2000)).await;
    stored(&pool, Provider::STRIPE, "evt_b", "payment_intent.succeeded", payment_event("evt_b", "pi_1", 2000)).await;
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied, c.no_effect), (2, 1, 1), "the twin finds the payment recorded");
    let (payments, messages): (i64, i64) = (
        scalar(&pool, "SELECT count(*) FROM payments").await,
        scalar(&pool, "SELECT count(*) FROM transactional_outbox").await,
    );
    assert_eq!((payments, messages), (1, 1));
    let (key, payload): (String, Value) =
        sqlx::query_as("SELECT message_key, payload FROM transactional_outbox").fetch_one(&pool).await.unwrap();
    assert_eq!(key, "payment_succeeded:pi_1");
    assert_eq!((payload["payment_id"].as_str(), payload["amount"].as_i64()), (Some("pi_1"), Some(2000)));
}

/// 30 copies of each of 10 payment events arrive at once while 4 workers drain.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn thirty_concurrent_duplicates_with_four_workers_apply_each_effect_once(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPoolOptions::new().max_connections(12).connect_with(opts.clone()).await.unwrap();
    let mut cfg = config(secrets(false));
    cfg.db.pool_size = 30;
    let r = Arc::new(webhook_inbox::Receiver::new(db::Connections::from_options(opts, &cfg.db), &cfg));
    // Level-triggered: a worker whose stop future was never polled yet still sees it
    // (Notify::notify_waiters would miss a Notified made after it, and the join hang).
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (w, mut stopped) = (Arc::new(worker(&pool, stock::handlers())), stopped.clone());
            tokio::spawn(async move {
                w.run_until(Duration::from_millis(10), async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
            })
        })
        .collect();
    let barrier = Arc::new(Barrier::new(300));
    let deliveries: Vec<_> = (0..300)
        .map(|i| {
            let n = i % 10;
            let body = payment_event(&format!("evt_{n}"), &format!("pi_{n}"), 100 + n as i64).to_string().into_bytes();
            let (r, barrier) = (r.clone(), barrier.clone());
            tokio::spawn(async move {
                let sig = stripe_header(STRIPE[0], &body);
                barrier.wait().await;
                post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.0
            })
        })
        .collect();
    for d in deliveries {
        assert_eq!(d.await.unwrap(), StatusCode::OK);
    }
    assert!(
        eventually(|| async {
            scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status NOT IN ('done', 'unhandled')").await
                == 0
        })
        .await
    );
    let _ = stop.send(true);
    for w in workers {
        w.await.unwrap();
    }
    let counts: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_inbox), (SELECT count(*) FROM payments),
                (SELECT count(*) FROM transactional_outbox), (SELECT coalesce(sum(amount), 0)::bigint FROM payments)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counts, (10, 10, 10, (100..110).sum::<i64>()));
    let not_once: i64 = scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE attempts <> 1").await;
    assert_eq!(not_once, 0, "each event was applied by exactly one worker, once");
}

// ---------- failures ----------

/// Always fails, transiently: a poison event.
struct Poison;

impl Handler for Poison {
    type Payload = Value;
    async fn handle(&self, _: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        Err(HandlerError::transient("the downstream is on fire"))
    }
}

/// Fails quoting a payload value, as a handler's "no account for {user_token}" does.
struct QuotesToken;

impl Handler for QuotesToken {
    type Payload = Value;
    async fn handle(&self, _: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let token = event.payload["user_token"].as_str().unwrap_or_default();
        Err(HandlerError::permanent(format!("no account for {token}")))
    }
}

/// A log line's bytes, as a test's subscriber writes them.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A stranger's value that reaches a handler's error is logged escaped, in the
/// plain format and in JSON (Lambda's): no terminal escape, forged line, C1
/// control or bidi override reaches the log raw.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_hostile_value_in_a_handler_error_is_logged_escaped(pool: PgPool) {
    let hostile = "\u{1b}[2J\u{1b}]0;pwned\u{7}\r\n2026-12-01T00:00:00Z  INFO forged\u{9b}31m\u{202e}gnp.exe";
    let unsafe_char =
        |c: char| c != '\n' && (c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'));
    let w = worker(&pool, Handlers::new().on(Provider::MARQETA, "transaction.authorization", QuotesToken).unwrap());
    for json in [false, true] {
        let id = format!("mq_hostile_{json}");
        stored(&pool, Provider::MARQETA, &id, "transaction.authorization", json!({"user_token": hostile})).await;
        let captured = Captured::default();
        let writer = captured.clone();
        let builder = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone());
        let _guard = if json {
            tracing::subscriber::set_default(builder.json().finish())
        } else {
            tracing::subscriber::set_default(builder.finish())
        };
        assert_eq!(w.run_once(later()).await.unwrap().failed, 1);
        let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains("no account for"), "the failure is logged: {logged}");
        assert!(!logged.chars().any(unsafe_char), "json {json}: raw controls in the log: {logged:?}");
        assert_eq!(logged.lines().count(), 1, "json {json}: one line, none forged: {logged}");
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_poison_event_fails_after_its_attempts_while_a_thousand_others_are_done(pool: PgPool) {
    let w = worker(&pool, Handlers::new().on(Provider::STANDARD, "poison", Poison).unwrap());
    stored(&pool, Provider::STANDARD, "msg_poison", "poison", json!({"type": "poison"})).await;
    for i in 0..1000 {
        stored(&pool, Provider::STANDARD, &format!("msg_{i:04}"), "invoice.paid", json!({"type": "invoice.paid"}))
            .await;
    }
    let first = w.run_once(later()).await.unwrap();
    assert_eq!(
        (first.taken, first.retried, first.unhandled),
        (100, 1, 99),
        "the poison event is first in line and blocks nothing"
    );
    let total = drain_all(&w, &pool).await;
    assert_eq!(total.unhandled + first.unhandled, 1000, "types no handler takes are unhandled, and counted");
    let (status, attempts, reason): (String, i32, String) =
        sqlx::query_as("SELECT status, attempts, failure_reason FROM webhook_inbox WHERE event_id = 'msg_poison'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), attempts), ("failed", 3));
    assert_eq!(reason, "attempt 3: the downstream is on fire");
    let unhandled =
        "SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled' AND processed_at IS NOT NULL AND attempts = 0";
    assert_eq!(scalar::<i64>(&pool, unhandled).await, 1000, "nothing ran for them: no attempt spent");
}

/// A handler failing in the middle of a batch fails only its event: the
/// effects before and after it land once, each counted once, and the failed
/// event spends one attempt.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_handler_failing_mid_batch_fails_only_itself_and_every_effect_lands_once(pool: PgPool) {
    let w = worker(&pool, stock::handlers().on(Provider::STRIPE, "poison", Poison).unwrap());
    for i in 0..60 {
        let id = format!("evt_fast_{i:02}");
        stored(
            &pool,
            Provider::STRIPE,
            &id,
            "payment_intent.succeeded",
            payment_event(&id, &format!("pi_fast_{i}"), 100 + i),
        )
        .await;
        if i == 30 {
            stored(&pool, Provider::STRIPE, "evt_fast_poison", "poison", json!({"id": "evt_fast_poison"})).await;
        }
    }
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied, c.retried), (61, 60, 1), "each counted once");
    let (payments, messages, done): (i64, i64, i64) = (
        scalar(&pool, "SELECT count(*) FROM payments").await,
        scalar(&pool, "SELECT count(*) FROM transactional_outbox").await,
        scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'done'").await,
    );
    assert_eq!((payments, messages, done), (60, 60, 60));
    let attempts: i32 = scalar(&pool, "SELECT attempts FROM webhook_inbox WHERE event_id = 'evt_fast_poison'").await;
    assert_eq!(attempts, 1);
}

/// A batch with no failure runs its handlers in its own transaction, with no
/// savepoint (two round trips fewer per call): every effect and the status
/// update share the batch's one transaction id. A batch with a failure is
/// rolled back and run again with a savepoint per handler call (the stock
/// payment handler takes its events at once: their effects then share one
/// subtransaction of their own), and the next batches keep them.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn batches_run_without_savepoints_until_a_handler_fails_then_with_them(pool: PgPool) {
    let w = worker(&pool, stock::handlers().on(Provider::STRIPE, "poison", Poison).unwrap());
    let payments = |from: i64, to: i64| {
        let pool = pool.clone();
        async move {
            for i in from..to {
                let id = format!("evt_sp_{i:02}");
                stored(
                    &pool,
                    Provider::STRIPE,
                    &id,
                    "payment_intent.succeeded",
                    payment_event(&id, &format!("pi_sp_{i}"), 100 + i),
                )
                .await;
            }
        }
    };
    // The transactions a batch's effects and its statuses were written in: (effects, all).
    let writers = |n: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i64, i64)>(
                "WITH e AS (SELECT xmin::text AS x FROM payments WHERE payment_id LIKE 'pi_sp_' || $1),
                      s AS (SELECT xmin::text AS x FROM webhook_inbox WHERE event_id LIKE 'evt_sp_' || $1)
                 SELECT (SELECT count(DISTINCT x) FROM e), (SELECT count(DISTINCT x) FROM (TABLE e UNION TABLE s) u)",
            )
            .bind(n)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    payments(0, 20).await;
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied), (20, 20));
    assert_eq!(writers("%").await, (1, 1), "one transaction, no savepoint");

    payments(20, 30).await;
    stored(&pool, Provider::STRIPE, "evt_sp_poison", "poison", json!({"id": "evt_sp_poison"})).await;
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied, c.retried), (11, 10, 1), "each counted once, after the redo");
    assert_eq!(writers("2_").await, (1, 2), "redone with a savepoint around the handler's call");
    let (payments_made, messages): (i64, i64) = (
        scalar(&pool, "SELECT count(*) FROM payments").await,
        scalar(&pool, "SELECT count(*) FROM transactional_outbox").await,
    );
    assert_eq!((payments_made, messages), (30, 30), "no effect of the rolled-back try remains twice");
    let attempts: i32 = scalar(&pool, "SELECT attempts FROM webhook_inbox WHERE event_id = 'evt_sp_poison'").await;
    assert_eq!(attempts, 1, "the rolled-back try spent no attempt");

    // The next batch keeps its savepoints.
    sqlx::query(
        "UPDATE webhook_inbox SET next_attempt_at = now() + interval '1 hour' WHERE event_id = 'evt_sp_poison'",
    )
    .execute(&pool)
    .await
    .unwrap();
    payments(30, 35).await;
    w.run_once(later()).await.unwrap();
    assert_eq!(writers("3_").await, (1, 2), "guarded after a failure");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_deposit_for_a_missing_account_is_retried_and_lands_once_after_the_account_exists(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let w = Worker::new(pool.clone(), stock::handlers(), WorkerConfig { max_attempts: 10, ..fast_worker_config() });
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let batch = br#"{"transactions":[{"token":"dep_1","type":"gpa.credit","state":"COMPLETION","user_token":"acct_1","amount":25.5},{"token":"auth_1","type":"authorization","state":"PENDING","user_token":"acct_1","amount":3}]}"#;
    assert_eq!(post(r, "marqeta", &[("Authorization", &auth)], batch).await.0, StatusCode::OK);

    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.retried, c.unhandled), (1, 1));
    let (attempts, reason): (i32, String) =
        sqlx::query_as("SELECT attempts, failure_reason FROM webhook_inbox WHERE event_id = 'transactions:dep_1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempts, reason.as_str()), (1, "attempt 1: account acct_1 does not exist yet"));
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM account_deposits").await,
        0,
        "the ledger row rolled back with the savepoint"
    );

    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES ('acct_1', 100.00)").execute(&pool).await.unwrap();
    drain_all(&w, &pool).await;
    // The same batch again, and another pass: nothing moves.
    assert_eq!(post(r, "marqeta", &[("Authorization", &auth)], batch).await.1, json!({"accepted": 0, "duplicates": 2}));
    w.run_once(later()).await.unwrap();
    let balance: String = scalar(&pool, "SELECT balance::text FROM accounts WHERE account_id = 'acct_1'").await;
    assert_eq!(balance, "125.50");
    let (deposits, messages): (i64, i64) = (
        scalar(&pool, "SELECT count(*) FROM account_deposits").await,
        scalar(&pool, "SELECT count(*) FROM transactional_outbox WHERE payload->>'event' = 'balance_updated'").await,
    );
    assert_eq!((deposits, messages), (1, 1));
}

/// Four workers drain 800 deposits to eight accounts, shuffled, so that every
/// batch meets the accounts in another order: the workers queue on the
/// accounts' locks (taken in key order) and never deadlock, and every deposit
/// lands once. Applied in receive order, batches deadlock within seconds, and
/// each deadlock stalls them for `deadlock_timeout`.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn concurrent_batches_crediting_shared_accounts_never_deadlock(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPoolOptions::new().max_connections(2).connect_with(opts.clone()).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id) SELECT 'acct_' || i FROM generate_series(0, 7) AS i")
        .execute(&pool)
        .await
        .unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..800 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let payload = json!({"token": format!("dep_{i}"), "type": "gpa.credit", "state": "COMPLETION",
            "user_token": format!("acct_{}", rng % 8), "amount": "1.00"});
        stored(&pool, Provider::MARQETA, &format!("transactions:dep_{i}"), deposits::EVENT_TYPE, payload).await;
    }
    let workers_pool = PgPoolOptions::new().max_connections(4).connect_with(opts).await.unwrap();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (w, pool) = (worker(&workers_pool, stock::handlers()), workers_pool.clone());
            tokio::spawn(async move { drain_all(&w, &pool).await })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    // Closed, the workers' sessions flush their statistics.
    workers_pool.close().await;
    sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&pool).await.unwrap();
    let deadlocks: i64 =
        scalar(&pool, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").await;
    assert_eq!(deadlocks, 0, "the workers deadlocked");
    let (done, credited, balances): (i64, i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_inbox WHERE status = 'done'),
                (SELECT count(*) FROM account_deposits),
                (SELECT sum(balance)::text FROM accounts)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((done, credited, balances.as_str()), (800, 800, "800.00"));
}

/// Applies real payments, but parks inside the transaction on one event, so the
/// test can cut the worker's connection mid-batch.
struct ParkOn(&'static str);

impl Handler for ParkOn {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let outcome = PaymentSucceededHandler.handle_batch(&mut *conn, std::slice::from_ref(event)).await?[0];
        if event.event_id == self.0 {
            sqlx::query("SELECT pg_sleep(60)").execute(&mut *conn).await?;
        }
        Ok(outcome)
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_worker_cut_off_mid_batch_leaves_its_rows_and_every_effect_lands_once(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    for i in 0..20 {
        let id = format!("evt_{i:02}");
        stored(
            &pool,
            Provider::STRIPE,
            &id,
            "payment_intent.succeeded",
            payment_event(&id, &format!("pi_{i:02}"), 500),
        )
        .await;
    }
    let doomed_pool =
        PgPoolOptions::new().max_connections(1).connect_with(opts.application_name("doomed-worker")).await.unwrap();
    let doomed = Worker::new(
        doomed_pool,
        Handlers::new().on(Provider::STRIPE, "payment_intent.succeeded", ParkOn("evt_05")).unwrap(),
        fast_worker_config(),
    );
    let run = tokio::spawn(async move { doomed.run_once(later()).await });
    let parked = eventually(|| async {
        scalar::<i64>(&pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'doomed-worker' AND query LIKE '%pg_sleep%'").await == 1
    })
    .await;
    assert!(parked, "the doomed worker is mid-batch");
    // Effects 0-5 are written, uncommitted. Cut the connection, as a crash or timeout would.
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'doomed-worker'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(run.await.unwrap().is_err(), "the cut worker reports an error");
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM payments").await, 0, "nothing half-done survives");

    let c = drain_all(&worker(&pool, stock::handlers()), &pool).await;
    assert_eq!(c.applied, 20);
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM transactional_outbox),
                (SELECT count(*) FROM webhook_inbox WHERE status = 'done' AND attempts = 1)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counts, (20, 20, 20));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_lock_timeout_is_retried_without_spending_an_attempt(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let mut cfg = db_config();
    cfg.lock_timeout = Duration::from_millis(200);
    let w = Worker::new(db::pool_from(opts, &cfg), stock::handlers(), fast_worker_config());
    sqlx::query("INSERT INTO accounts (account_id) VALUES ('busy')").execute(&pool).await.unwrap();
    let deposit =
        json!({"token": "dep_b", "type": "gpa.credit", "state": "COMPLETION", "user_token": "busy", "amount": 5});
    stored(&pool, Provider::MARQETA, "transactions:dep_b", "transactions:gpa.credit", deposit).await;

    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM accounts WHERE account_id = 'busy' FOR UPDATE").execute(&mut *holder).await.unwrap();
    for _ in 0..3 {
        let c = w.run_once(later()).await.unwrap();
        assert_eq!(c.retried, 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (attempts, reason): (i32, String) =
        sqlx::query_as("SELECT attempts, failure_reason FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 0, "{reason}");
    assert!(reason.starts_with("contention (not counted as an attempt)"), "{reason}");
    holder.rollback().await.unwrap();
    drain_all(&w, &pool).await;
    assert_eq!(scalar::<String>(&pool, "SELECT balance::text FROM accounts").await, "5.00");
}

// ---------- the two triggers ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_schedule_drains_batch_after_batch_and_stops_at_the_deadline(pool: PgPool) {
    for i in 0..250 {
        stored(&pool, Provider::GITHUB, &format!("d-{i:03}"), "ping", json!({})).await;
    }
    let w = worker(&pool, stock::handlers());
    let past = process::on_schedule(&w, Instant::now()).await.unwrap();
    assert_eq!(past.taken, 0, "past the deadline no event is started");
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND attempts = 0").await,
        250
    );
    let all = process::on_schedule(&w, Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(all.taken, 250, "batch after batch, until a short one");
}

/// A run that could not do its work fails, so the Lambda's Errors metric sees the outage.
#[tokio::test]
async fn both_triggers_fail_the_invocation_when_the_database_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cfg = db_config();
    cfg.acquire_timeout = Duration::from_millis(500);
    let options: PgConnectOptions = format!("postgres://postgres@127.0.0.1:{port}/postgres").parse().unwrap();
    let w = Worker::new(db::pool_from(options, &cfg), stock::handlers(), fast_worker_config());
    let schedule = fixture("eventbridge-schedule.json");
    let err = process::handle(&w, schedule, Instant::now() + Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, process::ProcessError::Database { .. }), "{err}");
    let sqs = sqs_event(&[("m-1", r#"{"provider":"stripe","event_id":"evt_1"}"#)]);
    let err = process::handle(&w, serde_json::to_value(&sqs).unwrap(), Instant::now()).await.unwrap_err();
    assert!(err.to_string().starts_with("processing stopped on a database error"), "{err}");
}

fn sqs_event(bodies: &[(&str, &str)]) -> aws_lambda_events::event::sqs::SqsEvent {
    let records: Vec<Value> = bodies
        .iter()
        .map(|(id, body)| {
            let mut record = fixture("sqs-record.json");
            record["messageId"] = json!(id);
            record["body"] = json!(body);
            record
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_sqs_path_reports_only_the_failed_messages(pool: PgPool) {
    stored(&pool, Provider::STRIPE, "evt_ok", "payment_intent.succeeded", payment_event("evt_ok", "pi_ok", 700)).await;
    let deposit =
        json!({"token": "dep_9", "type": "gpa.credit", "state": "COMPLETION", "user_token": "nobody", "amount": 1});
    stored(&pool, Provider::MARQETA, "transactions:dep_9", "transactions:gpa.credit", deposit).await;
    let w = worker(&pool, stock::handlers());
    let event = sqs_event(&[
        ("m-ok", r#"{"provider":"stripe","event_id":"evt_ok"}"#),
        ("m-retry", r#"{"provider":"marqeta","event_id":"transactions:dep_9"}"#),
        ("m-garbage", "not json"),
        ("m-unknown", r#"{"provider":"stripe","event_id":"evt_never_received"}"#),
    ]);
    let response = process::handle(&w, serde_json::to_value(&event).unwrap(), Instant::now()).await.unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": "m-retry"}, {"itemIdentifier": "m-garbage"}]})
    );
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM payments").await, 1);
}

// ---------- documentation as tests (docs/webhook-inbox-article.txt, sections 6 and 7) ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn merge_raises_unique_violation_where_on_conflict_returns_no_row(pool: PgPool) {
    sqlx::query("CREATE TABLE keys (k text PRIMARY KEY)").execute(&pool).await.unwrap();
    async fn race(pool: &PgPool, sql: &'static str, key: &'static str) -> Result<u64, sqlx::Error> {
        let mut first = pool.begin().await.unwrap();
        sqlx::query(sql).bind(key).execute(&mut *first).await.unwrap();
        let p = pool.clone();
        let second =
            tokio::spawn(async move { sqlx::query(sql).bind(key).execute(&p).await.map(|r| r.rows_affected()) });
        let waiting = eventually(|| async {
            scalar::<i64>(
                pool,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await
                == 1
        })
        .await;
        assert!(waiting);
        first.commit().await.unwrap();
        second.await.unwrap()
    }
    let merge =
        "MERGE INTO keys USING (SELECT $1::text AS k) s ON keys.k = s.k WHEN NOT MATCHED THEN INSERT VALUES (s.k)";
    let err = race(&pool, merge, "a").await.expect_err("MERGE does not take the conflict path");
    assert_eq!(db::sqlstate(&err).as_deref(), Some("23505"));
    let upsert = "INSERT INTO keys VALUES ($1) ON CONFLICT (k) DO NOTHING";
    assert_eq!(race(&pool, upsert, "b").await.unwrap(), 0, "ON CONFLICT DO NOTHING: zero rows, no error");
    let version: i32 = scalar(&pool, "SELECT current_setting('server_version_num')::int").await;
    if version < 170000 {
        let returning = sqlx::query(&format!("{merge} RETURNING k")).bind("c").execute(&pool).await.unwrap_err();
        assert_eq!(
            db::sqlstate(&returning).as_deref(),
            Some("42601"),
            "MERGE ... RETURNING is a syntax error before PostgreSQL 17"
        );
    }
}

// ---------- inline mode ----------

fn inline_receiver(opts: PgConnectOptions, providers: Vec<Provider>) -> webhook_inbox::Receiver {
    let mut cfg = config(secrets(false));
    cfg.inline_providers = providers;
    webhook_inbox::Receiver::new(db::Connections::from_options(opts, &cfg.db), &cfg).with_handlers(stock::handlers())
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inline_mode_applies_the_effect_before_the_200_and_a_replay_changes_nothing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = inline_receiver(opts, vec![Provider::STRIPE]);
    let body = payment_event("evt_inline", "pi_inline", 900).to_string().into_bytes();
    let sig = stripe_header(STRIPE[0], &body);
    assert_eq!(post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.1, json!({"status": "accepted"}));
    // No worker has run: the effect committed with the claim.
    let state: (String, i32, i64, i64) = sqlx::query_as(
        "SELECT status, attempts, (SELECT count(*) FROM payments), (SELECT count(*) FROM transactional_outbox) FROM webhook_inbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, ("done".into(), 1, 1, 1));
    assert_eq!(post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.1, json!({"status": "duplicate"}));
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM payments").await, 1);
}

/// A hint handler's event is never fetched inside receive's transaction: it is
/// claimed pending, untouched, for the worker.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inline_mode_leaves_a_hint_handlers_event_to_the_worker(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = inline_receiver(opts, vec![Provider::STRIPE]);
    let body = json!({"id": "evt_sub", "type": "customer.subscription.updated", "data": {"object": {"id": "sub_1"}}})
        .to_string()
        .into_bytes();
    let sig = stripe_header(STRIPE[0], &body);
    assert_eq!(post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.1, json!({"status": "accepted"}));
    let state: (String, i32, Option<String>) =
        sqlx::query_as("SELECT status, attempts, failure_reason FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(state, ("pending".into(), 0, None));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_inline_handler_that_fails_still_commits_the_claim_as_pending(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = inline_receiver(opts, vec![Provider::MARQETA]);
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let batch = br#"{"transactions":[{"token":"dep_x","type":"gpa.credit","state":"COMPLETION","user_token":"acct_x","amount":10}]}"#;
    assert_eq!(
        post(&r, "marqeta", &[("Authorization", &auth)], batch).await,
        (StatusCode::OK, json!({"accepted": 1, "duplicates": 0}))
    );
    let (status, reason): (String, String) =
        sqlx::query_as("SELECT status, failure_reason FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("pending", "attempt 1 (inline): account acct_x does not exist yet")
    );
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM account_deposits").await, 0);

    sqlx::query("INSERT INTO accounts (account_id) VALUES ('acct_x')").execute(&pool).await.unwrap();
    drain_all(&worker(&pool, stock::handlers()), &pool).await;
    assert_eq!(scalar::<String>(&pool, "SELECT balance::text FROM accounts").await, "10.00");
}

/// Heavy inline work: takes the event's advisory lock, then works a while.
struct SlowExclusive;

impl Handler for SlowExclusive {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        sqlx::query("SELECT pg_sleep(1)").execute(&mut *conn).await?;
        Ok(Outcome::Applied)
    }
    fn exclusive(&self) -> bool {
        true
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_exclusive_inline_handler_makes_a_concurrent_duplicate_retry_instead_of_queueing(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let handlers = Handlers::new().on(Provider::GITHUB, "push", SlowExclusive).unwrap();
    let r = Arc::new(inline_receiver(opts, vec![Provider::GITHUB]).with_handlers(handlers));
    let body = br#"{"ref":"refs/heads/main"}"#.to_vec();
    let sig = github_signature(GITHUB[0], &body);
    let send = |r: Arc<webhook_inbox::Receiver>| {
        let (body, sig) = (body.clone(), sig.clone());
        async move {
            post(
                &r,
                "github",
                &[("X-Hub-Signature-256", &sig), ("X-GitHub-Delivery", "d-heavy"), ("X-GitHub-Event", "push")],
                &body,
            )
            .await
        }
    };
    let first = tokio::spawn(send(r.clone()));
    assert!(eventually(|| async { scalar::<i64>(&pool, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1)%' AND state = 'active' AND pid <> pg_backend_pid()").await == 1 }).await);
    let (status, answer) = send(r.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(!first.is_finished(), "the duplicate was answered while the first was still working");
    assert_eq!(first.await.unwrap(), (StatusCode::OK, json!({"status": "accepted"})));
    assert_eq!(send(r.clone()).await, (StatusCode::OK, json!({"status": "duplicate"})));
}

/// Kills its own connection, every time: the batch it is in always rolls back.
struct ConnectionKiller;

impl Handler for ConnectionKiller {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())").execute(&mut *conn).await?;
        Ok(Outcome::Applied)
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_event_that_kills_its_connection_fails_after_its_attempts_and_blocks_nobody(pool: PgPool) {
    let handlers = Handlers::new()
        .on(Provider::GITHUB, "killer", ConnectionKiller)
        .and_then(|h| h.on(Provider::STRIPE, "payment_intent.succeeded", PaymentSucceededHandler))
        .unwrap();
    let w = worker(&pool, handlers);
    stored(&pool, Provider::GITHUB, "d-killer", "killer", json!({})).await;
    for i in 0..20 {
        let id = format!("evt_{i:02}");
        stored(
            &pool,
            Provider::STRIPE,
            &id,
            "payment_intent.succeeded",
            payment_event(&id, &format!("pi_{i:02}"), 100),
        )
        .await;
    }
    // Behind the killer, in careful mode too: types no handler takes.
    for i in 0..5 {
        stored(&pool, Provider::STRIPE, &format!("evt_other_{i}"), "customer.created", json!({})).await;
    }
    let started = Instant::now();
    loop {
        let _ = w.run(later()).await; // the killer's batches fail; that is the point
        let left: i64 = scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending'").await;
        if left == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{left} events still pending");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, attempts, reason): (String, i32, String) =
        sqlx::query_as("SELECT status, attempts, failure_reason FROM webhook_inbox WHERE event_id = 'd-killer'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), attempts), ("failed", 3), "{reason}");
    let counts: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM webhook_inbox WHERE status = 'done' AND attempts = 1)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counts, (20, 20), "the others were applied once each");
    let unhandled: i64 =
        scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled' AND attempts = 0").await;
    assert_eq!(unhandled, 5, "nothing ran for them: no attempt spent, careful mode or not");
}

/// Kills its connection on an event's first `kills` runs (the payload's), then
/// applies it; remembers, per event, whether the run that applied it was
/// careful (its attempt committed before it ran).
#[derive(Default, Clone)]
struct FlakyLink {
    runs: Arc<std::sync::Mutex<std::collections::HashMap<String, (u64, bool)>>>,
}

impl Handler for FlakyLink {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let runs = self.runs.lock().unwrap().get(&event.event_id).map_or(0, |r| r.0);
        if runs < event.payload["kills"].as_u64().unwrap_or(0) {
            self.runs.lock().unwrap().insert(event.event_id.clone(), (runs + 1, false));
            sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())").execute(&mut *conn).await?;
        }
        let counted: i32 =
            sqlx::query_scalar("SELECT attempts FROM webhook_inbox WHERE provider = 'github' AND event_id = $1")
                .bind(&event.event_id)
                .fetch_one(&mut *conn)
                .await?;
        self.runs.lock().unwrap().insert(event.event_id.clone(), (runs + 1, counted > event.attempts));
        Ok(Outcome::NoEffect)
    }
}

/// After a lost connection the worker goes careful for one pass, then back to
/// batches, even when that pass lost its connection too: a network that cuts
/// a connection now and then must not keep it one event at a time for as long
/// as cuts keep coming (the full fault suite's connection cuts did, and it
/// fell behind the storm).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_careful_pass_that_loses_its_connection_too_hands_back_to_batches(pool: PgPool) {
    let flaky = FlakyLink::default();
    let handlers = Handlers::new().on(Provider::GITHUB, "flaky", flaky.clone()).unwrap();
    // Backoffs that outlast the test: an event counted and cut stays out of the way.
    let config = WorkerConfig { batch_size: 10, retry_base: Duration::from_secs(60), ..fast_worker_config() };
    let w = Worker::new(pool.clone(), handlers, config);
    for i in 0..30 {
        // d-00 cuts its first two runs (the batch's, then its careful one), d-05 its first.
        let kills = match i {
            0 => 2,
            5 => 1,
            _ => 0,
        };
        stored(&pool, Provider::GITHUB, &format!("d-{i:02}"), "flaky", json!({ "kills": kills })).await;
    }
    for _ in 0..20 {
        let _ = w.run_once(later()).await; // the cut passes fail; that is the point
    }
    let pending: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM webhook_inbox WHERE status = 'pending' ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(pending, ["d-00"], "d-00 counted and held back by its backoff; every other event applied");
    let runs = flaky.runs.lock().unwrap();
    let careful: Vec<String> = (1..30).map(|i| format!("d-{i:02}")).filter(|id| runs[id].1).collect();
    // d-05's cut sent the worker careful again for one batch's worth (d-01 to d-10); then batches.
    assert_eq!(careful, (1..=10).map(|i| format!("d-{i:02}")).collect::<Vec<_>>());
}

// ---------- receive tells process (INBOX_PROCESS_QUEUE_URL) ----------

/// After the commit, one message per new pending event; the SQS path then
/// processes it at once. A duplicate sends nothing; a queue that is gone costs
/// the sender nothing (still 200, the row stored, left to the schedule).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn receive_tells_the_process_queue_of_new_events_after_the_commit(_: PgPoolOptions, opts: PgConnectOptions) {
    use webhook_inbox::receive::notify::ProcessQueue;
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let url = sqs.create_queue().queue_name("process").send().await.unwrap().queue_url().unwrap().to_string();
    let app = TestApp::spawn(opts.clone(), secrets(false)).await;
    let r = receiver(opts.clone(), secrets(false)).with_process_queue(ProcessQueue::new(sqs.clone(), &url));

    let body = payment_event("evt_q", "pi_q", 1200).to_string().into_bytes();
    let sig = stripe_header(STRIPE[0], &body);
    assert_eq!(post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.1, json!({"status": "accepted"}));
    assert_eq!(post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.1, json!({"status": "duplicate"}));
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let batch = br#"{"transactions":[{"token":"q1","type":"authorization"},{"token":"q2","type":"authorization"}]}"#;
    assert_eq!(post(&r, "marqeta", &[("Authorization", &auth)], batch).await.0, StatusCode::OK);

    let received = sqs.receive_message().queue_url(&url).max_number_of_messages(10).send().await.unwrap();
    let mut bodies: Vec<String> = received.messages().iter().filter_map(|m| m.body().map(String::from)).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [
            r#"{"event_id":"evt_q","provider":"stripe"}"#,
            r#"{"event_id":"transactions:q1","provider":"marqeta"}"#,
            r#"{"event_id":"transactions:q2","provider":"marqeta"}"#,
        ],
        "one message per new event; the duplicate sent none"
    );
    // The SQS path takes them as the Lambda would: the payment lands.
    let records: Vec<(&str, &str)> = bodies.iter().map(|b| ("m", b.as_str())).collect();
    let w = app.worker(stock::handlers());
    process::on_sqs(&w, sqs_event(&records)).await.unwrap();
    assert_eq!(app.scalar::<i64>("SELECT count(*) FROM payments").await, 1);

    let gone = receiver(opts, secrets(false))
        .with_process_queue(ProcessQueue::new(sqs, format!("{}/123456789012/no-such-queue", moto.url)));
    let body = payment_event("evt_lost", "pi_lost", 5).to_string().into_bytes();
    let sig = stripe_header(STRIPE[0], &body);
    assert_eq!(post(&gone, "stripe", &[("Stripe-Signature", &sig)], &body).await.0, StatusCode::OK);
    assert_eq!(app.scalar::<String>("SELECT status FROM webhook_inbox WHERE event_id = 'evt_lost'").await, "pending");
}

/// A pending event, inserted as receive's claim would, on `conn` (a
/// transaction of the caller's, to commit when it chooses).
async fn pending_on(conn: &mut PgConnection, event_id: &str) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
         VALUES ('stripe', $1, 'customer.created', '{}', 'pending', '\\x7b7d', '{}', 0)",
    )
    .bind(event_id)
    .execute(conn)
    .await
    .unwrap();
}

/// The worker's take starts after the last event it took (it does not walk
/// the queue's past); an event whose transaction began first but committed
/// after later ones is behind that position, and the next pass from the
/// queue's head takes it: none is skipped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_event_committed_behind_the_workers_position_is_taken_by_its_next_full_pass(pool: PgPool) {
    let w = Worker::new(pool.clone(), Handlers::new(), WorkerConfig { batch_size: 2, ..fast_worker_config() });
    let later = || Instant::now() + Duration::from_secs(10);
    // Its transaction begins first: the earliest received_at, committed last.
    let mut late = pool.begin().await.unwrap();
    pending_on(&mut late, "evt_late").await;
    for id in ["evt_a", "evt_b", "evt_c"] {
        pending_on(&mut pool.acquire().await.unwrap(), id).await;
    }
    assert_eq!(w.run_once(later()).await.unwrap().taken, 2, "evt_a and evt_b, from the head");
    late.commit().await.unwrap();
    assert_eq!(w.run_once(later()).await.unwrap().taken, 1, "evt_c, after its position");
    let status = "SELECT status FROM webhook_inbox WHERE event_id = 'evt_late'";
    assert_eq!(scalar::<String>(&pool, status).await, "pending", "behind the position: not walked over");
    assert_eq!(w.run_once(later()).await.unwrap().taken, 1, "caught up: the next take is from the head");
    assert_eq!(scalar::<String>(&pool, status).await, "unhandled");
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending'").await, 0);
}

/// Eight receivers committing 1,000 events out of order (each transaction
/// holds its events 0 to 20 ms before it commits) while two workers take
/// small batches all along: every event is taken, once.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn receives_committing_out_of_order_beside_two_workers_leave_no_event_behind(pool: PgPool) {
    const RECEIVERS: usize = 8;
    const EACH: usize = 125;
    let config = WorkerConfig { batch_size: 10, ..fast_worker_config() };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (w, stop) = (Worker::new(pool.clone(), Handlers::new(), config.clone()), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut taken = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let pass = w.run_once(Instant::now() + Duration::from_secs(10)).await.unwrap();
                taken += pass.taken;
                if pass.taken == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            taken
        }));
    }
    let mut receivers = Vec::new();
    for r in 0..RECEIVERS {
        let pool = pool.clone();
        receivers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let mut tx = pool.begin().await.unwrap();
                pending_on(&mut tx, &format!("evt_{r}_{i}")).await;
                tokio::time::sleep(Duration::from_millis(((r * 7 + i * 13) % 21) as u64)).await;
                tx.commit().await.unwrap();
            }
        }));
    }
    for r in receivers {
        r.await.unwrap();
    }
    let until = Instant::now() + Duration::from_secs(15);
    let left = "SELECT count(*) FROM webhook_inbox WHERE status = 'pending'";
    while scalar::<i64>(&pool, left).await > 0 {
        assert!(Instant::now() < until, "events still pending 15 s after the last commit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut taken = 0;
    for w in workers {
        taken += w.await.unwrap();
    }
    assert_eq!(taken, RECEIVERS * EACH, "each event taken once");
    let unhandled = "SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'";
    assert_eq!(scalar::<i64>(&pool, unhandled).await, (RECEIVERS * EACH) as i64);
}
