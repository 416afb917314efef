//! The claim under contention, as a delivery sees it: concurrent identical
//! deliveries, another writer holding the key past the lock timeout, a retry
//! under repeatable read, Marqeta batches overlapping. (The claim's own SQL
//! under contention is unit-tested beside it, `shared/src/receive/claim/tests.rs`.)

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tokio::sync::Barrier;
use webhook_inbox::Receiver;

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

/// Another writer (a second receiver, a reconcile) inserts `id` in `tx`, uncommitted: it holds the key.
async fn hold(tx: &mut sqlx::PgConnection, id: &str) {
    let inserted = sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
         VALUES ('stripe', $1, 'x', '{}', '\\x7b7d', 0)",
    )
    .bind(id)
    .execute(tx)
    .await
    .unwrap();
    assert_eq!(inserted.rows_affected(), 1);
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_claim_stuck_behind_a_lock_past_lock_timeout_answers_503(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let mut cfg = config(secrets(false));
    cfg.db.lock_timeout = Duration::from_millis(300);
    let r = Receiver::connect_with(opts, &cfg);
    let body = stripe_body("evt_locked");
    let mut tx = pool.begin().await.unwrap();
    hold(&mut tx, "evt_locked").await;
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
async fn under_repeatable_read_the_receivers_retry_answers_duplicate(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = Arc::new(receiver(repeatable_read(opts), secrets(false)));
    let body = stripe_body("evt_rr");
    let mut tx = pool.begin().await.unwrap();
    hold(&mut tx, "evt_rr").await;
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
