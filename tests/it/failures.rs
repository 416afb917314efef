//! The worker when handlers fail: a poison event among a thousand, a failure
//! mid-batch, savepoints only after one, a missing account, shared accounts,
//! a worker cut off mid-batch, a lock timeout, hostile text in an error.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use stock::{deposits, payments::PaymentSucceededHandler};
use webhook_inbox::{BatchHandler, Event, Handler, HandlerError, Handlers, Outcome, Worker, WorkerConfig};
use webhook_inbox_schemes::Provider;

use crate::process::{drain_all, payment_event, stored, worker};

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
    let w = Worker::new(cfg.pool_with(opts), stock::handlers(), fast_worker_config());
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
