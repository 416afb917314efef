//! The claim under contention: concurrent identical
//! deliveries, an open transaction holding the key, a lock timeout, repeatable
//! read, Marqeta batches overlapping.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tokio::sync::Barrier;
use webhook_inbox::{
    receive::claim::{self, Claim, Envelope},
    Receiver,
};
use webhook_inbox_schemes::{NewEvent, Provider};

use crate::receive::stripe_body;

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn fifty_concurrent_identical_deliveries_claim_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let mut cfg = config(secrets(false));
    cfg.db.pool_size = 50;
    let r = Arc::new(Receiver::connect_with(opts, &cfg));
    let body = stripe_body("evt_race");
    let sig = stripe_header(STRIPE[0], &body);
    let barrier = Arc::new(Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (r, barrier, body, sig) = (r.clone(), barrier.clone(), body.clone(), sig.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        statuses.push(body["status"].as_str().unwrap().to_string());
    }
    assert_eq!(statuses.iter().filter(|s| *s == "accepted").count(), 1);
    assert_eq!(statuses.iter().filter(|s| *s == "duplicate").count(), 49);
    assert_eq!(count(&pool).await, 1);
}

fn event(id: &str) -> NewEvent {
    NewEvent::pending(id.into(), "test.event", "{}".into())
}

fn envelope(headers: &Value) -> Envelope<'_> {
    Envelope {
        provider: Provider::STRIPE,
        raw_body: b"{}",
        headers,
        secret_index: Some(0),
        secret_fingerprint: None,
        replay_guard: false,
        trace_context: None,
    }
}

/// Claims of this test's database waiting on a lock.
async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO webhook_inbox%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Starts a claim while another transaction holds the same key uncommitted.
async fn claim_behind_open_insert(
    pool: &PgPool,
    id: &'static str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, tokio::task::JoinHandle<Claim>) {
    let headers = json!({});
    let mut tx = pool.begin().await.unwrap();
    claim::claim(&mut *tx, &envelope(&headers), &event(id)).await.unwrap();
    let p = pool.clone();
    let waiter = tokio::spawn(async move {
        let headers = json!({});
        claim::claim(&p, &envelope(&headers), &event(id)).await.unwrap()
    });
    // The second claim must be waiting on the first transaction's key, not finished.
    let waiting = eventually(|| async { lock_waiters(pool).await == 1 }).await;
    assert!(waiting, "the second claim waits on the row lock");
    assert!(!waiter.is_finished());
    (tx, waiter)
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_claim_blocked_by_an_open_transaction_waits_then_reports_duplicate(pool: PgPool) {
    let (tx, waiter) = claim_behind_open_insert(&pool, "evt_wait").await;
    tx.commit().await.unwrap();
    assert_eq!(waiter.await.unwrap(), Claim::Duplicate);
    assert_eq!(count(&pool).await, 1);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_claim_blocked_by_a_transaction_that_rolls_back_claims_the_event(pool: PgPool) {
    let (tx, waiter) = claim_behind_open_insert(&pool, "evt_rollback").await;
    tx.rollback().await.unwrap();
    assert_eq!(waiter.await.unwrap(), Claim::New);
    assert_eq!(count(&pool).await, 1);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_claim_stuck_behind_a_lock_past_lock_timeout_answers_503(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let mut cfg = config(secrets(false));
    cfg.db.lock_timeout = Duration::from_millis(300);
    let r = Receiver::connect_with(opts, &cfg);
    let body = stripe_body("evt_locked");
    let headers = json!({});
    let mut tx = pool.begin().await.unwrap();
    let held = NewEvent::pending("evt_locked".into(), "x", "{}".into());
    claim::claim(&mut *tx, &envelope(&headers), &held).await.unwrap();
    let (status, body) = post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(!body.to_string().contains("lock"), "no database text reaches the caller: {body}");
    tx.rollback().await.unwrap();
    assert_eq!(count(&pool).await, 0);
}

/// A database whose default isolation is REPEATABLE READ (set on a role, or by a framework).
fn repeatable_read(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([("default_transaction_isolation", "repeatable\\ read")])
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn under_repeatable_read_the_claim_fails_with_40001(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let rr = PgPool::connect_with(repeatable_read(opts)).await.unwrap();
    let isolation: String = sqlx::query_scalar("SHOW transaction_isolation").fetch_one(&rr).await.unwrap();
    assert_eq!(isolation, "repeatable read");
    let headers = json!({});
    let mut tx = pool.begin().await.unwrap();
    claim::claim(&mut *tx, &envelope(&headers), &event("evt_rr")).await.unwrap();
    let waiter = tokio::spawn(async move {
        let headers = json!({});
        claim::claim(&rr, &envelope(&headers), &event("evt_rr")).await
    });
    assert!(eventually(|| async { lock_waiters(&pool).await == 1 }).await);
    tx.commit().await.unwrap();
    let err = waiter.await.unwrap().expect_err("the committed row is invisible to the waiting statement's snapshot");
    assert_eq!(webhook_inbox::ops::sqlstate(&err).as_deref(), Some("40001"));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn under_repeatable_read_the_receivers_retry_answers_duplicate(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = Arc::new(receiver(repeatable_read(opts), secrets(false)));
    let body = stripe_body("evt_rr");
    let headers = json!({});
    let mut tx = pool.begin().await.unwrap();
    let held = NewEvent::pending("evt_rr".into(), "x", "{}".into());
    claim::claim(&mut *tx, &envelope(&headers), &held).await.unwrap();
    let sig = stripe_header(STRIPE[0], &body);
    let delivery = {
        let r = r.clone();
        tokio::spawn(async move { post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await })
    };
    assert!(eventually(|| async { lock_waiters(&pool).await == 1 }).await);
    tx.commit().await.unwrap();
    assert_eq!(
        delivery.await.unwrap(),
        (StatusCode::OK, json!({"status": "duplicate"})),
        "40001, retried, sees the row"
    );
    assert_eq!(count(&pool).await, 1);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_marqeta_batch_claims_each_item_once_within_and_across_batches(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let first = br#"{"transactions":[{"token":"c","type":"gpa.credit","state":"COMPLETION","amount":10},{"token":"a","type":"authorization"},{"token":"c","type":"gpa.credit","state":"COMPLETION","amount":10},{"token":"b","type":"authorization"}]}"#;
    assert_eq!(
        post(r, "marqeta", &[("Authorization", &auth)], first).await,
        (StatusCode::OK, json!({"accepted": 3, "duplicates": 1}))
    );
    let second =
        br#"{"transactions":[{"token":"b","type":"authorization"},{"token":"d","type":"authorization.clearing"}]}"#;
    assert_eq!(
        post(r, "marqeta", &[("Authorization", &auth)], second).await,
        (StatusCode::OK, json!({"accepted": 1, "duplicates": 1}))
    );
    assert_eq!(
        post(r, "marqeta", &[("Authorization", &auth)], first).await,
        (StatusCode::OK, json!({"accepted": 0, "duplicates": 4}))
    );
    let rows: Vec<(String, String, Value)> =
        sqlx::query_as("SELECT event_id, event_type, payload FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, ["transactions:a", "transactions:b", "transactions:c", "transactions:d"]);
    assert_eq!(rows[2].1, "transactions:gpa.credit");
    assert_eq!(rows[2].2["amount"], 10, "each row holds its own item");
    let ping = br#"{"pings":[{"token":"marqeta","payload":"healthcheck"}]}"#;
    assert_eq!(
        post(r, "marqeta", &[("Authorization", &auth)], ping).await,
        (StatusCode::OK, json!({"accepted": 0, "duplicates": 0}))
    );
    assert_eq!(count(&pool).await, 4, "a ping stores nothing");
}

/// Twenty batches of the same ten keys in twenty orders, released together, each
/// on its own connection and with no retry: sorted keys mean no deadlock (40P01)
/// can happen, and each key is claimed once.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn concurrent_overlapping_batches_neither_deadlock_nor_double_claim(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPoolOptions::new().max_connections(21).connect_with(opts).await.unwrap();
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let mut tokens: Vec<usize> = (0..10).collect();
            tokens.rotate_left(i % 10);
            if i % 2 == 1 {
                tokens.reverse();
            }
            let events: Vec<NewEvent> = tokens
                .iter()
                .map(|t| NewEvent::pending(format!("transactions:t{t}"), "transactions", "{}".into()))
                .collect();
            let (pool, barrier) = (pool.clone(), barrier.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let headers = json!({});
                let env = Envelope {
                    provider: Provider::MARQETA,
                    raw_body: b"{}",
                    headers: &headers,
                    secret_index: Some(0),
                    secret_fingerprint: None,
                    replay_guard: false,
                    trace_context: None,
                };
                barrier.wait().await;
                claim::claim_batch(&mut *conn, &env, &events).await
            })
        })
        .collect();
    let mut accepted = 0;
    for t in tasks {
        let claim = t.await.unwrap().expect("no deadlock, no error");
        assert_eq!(claim.accepted + claim.duplicates, 10);
        accepted += claim.accepted;
    }
    assert_eq!(accepted, 10);
    assert_eq!(count(&pool).await, 10);
}
