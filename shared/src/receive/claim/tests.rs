//! The claim's SQL under contention, against a real PostgreSQL: an open
//! transaction holding the key, repeatable read, overlapping batches; and
//! the fallback for a value PostgreSQL refuses.

use std::{future::Future, sync::Arc, time::Duration};

use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tokio::sync::Barrier;
use webhook_inbox_schemes::{Events, NewEvent, Provider};

use super::*;
use crate::db::{Connections, DbConfig};

fn event(id: &str) -> NewEvent {
    NewEvent::pending(id.into(), "test.event", "{}".into())
}

fn envelope_of<'a>(provider: Provider, raw_body: &'a [u8], headers: &'a Value) -> Envelope<'a> {
    Envelope {
        provider,
        raw_body,
        headers,
        secret_index: Some(0),
        secret_fingerprint: None,
        replay_guard: false,
        trace_context: None,
    }
}

fn envelope(headers: &Value) -> Envelope<'_> {
    envelope_of(Provider::STRIPE, b"{}", headers)
}

/// Receive's settings for a test's connections (the connect options come from the test).
fn db_config() -> DbConfig {
    DbConfig::with_url("unused: connect options come from the test")
}

async fn count(pool: &PgPool) -> i64 {
    db::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(pool).await.unwrap()
}

/// Polls until `f` is true or 10 s pass.
async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..200 {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Claims of this test's database waiting on a lock.
async fn lock_waiters(pool: &PgPool) -> i64 {
    db::query_scalar(
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
    claim(&mut *tx, &envelope(&headers), &event(id)).await.unwrap();
    let p = pool.clone();
    let waiter = tokio::spawn(async move {
        let headers = json!({});
        claim(&p, &envelope(&headers), &event(id)).await.unwrap()
    });
    // The second claim must be waiting on the first transaction's key, not finished.
    let waiting = eventually(|| async { lock_waiters(pool).await == 1 }).await;
    assert!(waiting, "the second claim waits on the row lock");
    assert!(!waiter.is_finished());
    (tx, waiter)
}

#[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
async fn a_claim_blocked_by_an_open_transaction_waits_then_reports_duplicate(pool: PgPool) {
    let (tx, waiter) = claim_behind_open_insert(&pool, "evt_wait").await;
    tx.commit().await.unwrap();
    assert_eq!(waiter.await.unwrap(), Claim::Duplicate);
    assert_eq!(count(&pool).await, 1);
}

#[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
async fn a_claim_blocked_by_a_transaction_that_rolls_back_claims_the_event(pool: PgPool) {
    let (tx, waiter) = claim_behind_open_insert(&pool, "evt_rollback").await;
    tx.rollback().await.unwrap();
    assert_eq!(waiter.await.unwrap(), Claim::New);
    assert_eq!(count(&pool).await, 1);
}

/// A database whose default isolation is REPEATABLE READ (set on a role, or by a framework).
fn repeatable_read(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([("default_transaction_isolation", "repeatable\\ read")])
}

#[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
async fn under_repeatable_read_the_claim_fails_with_40001(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let rr = PgPool::connect_with(repeatable_read(opts)).await.unwrap();
    let isolation: String = db::query_scalar("SHOW transaction_isolation").fetch_one(&rr).await.unwrap();
    assert_eq!(isolation, "repeatable read");
    let headers = json!({});
    let mut tx = pool.begin().await.unwrap();
    claim(&mut *tx, &envelope(&headers), &event("evt_rr")).await.unwrap();
    let waiter = tokio::spawn(async move {
        let headers = json!({});
        claim(&rr, &envelope(&headers), &event("evt_rr")).await
    });
    assert!(eventually(|| async { lock_waiters(&pool).await == 1 }).await);
    tx.commit().await.unwrap();
    let err = waiter.await.unwrap().expect_err("the committed row is invisible to the waiting statement's snapshot");
    assert_eq!(db::sqlstate(&err).as_deref(), Some("40001"));
}

/// Twenty batches of the same ten keys in twenty orders, released together, each
/// on its own connection and with no retry: sorted keys mean no deadlock (40P01)
/// can happen, and each key is claimed once.
#[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
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
                let env = envelope_of(Provider::MARQETA, b"{}", &headers);
                barrier.wait().await;
                claim_batch(&mut *conn, &env, &events).await
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

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Below the payload check: if PostgreSQL refuses a value for any reason that is
/// not an outage, the claim falls back to a `failed` row without the payload.
#[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
async fn the_claim_falls_back_whatever_sqlstate_the_value_raises(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let connections = Connections::from_options(opts, &db_config());
    let headers = json!({});
    for (id, payload, sqlstate) in [
        ("deep", nested(100_000), "54001"),
        ("surrogate", r#"["\ud800"]"#.to_string(), "SQLSTATE 22"),
        ("nul", r#"["\u0000"]"#.to_string(), "SQLSTATE 22"),
    ] {
        let env = envelope_of(Provider::GITHUB, payload.as_bytes(), &headers);
        let events = Events::Single(NewEvent::pending(id.into(), "push", payload.clone()));
        let claimed = claim_delivery(&connections, &env, &events, None).await.unwrap();
        assert_eq!(claimed, Claimed::Single(Claim::New), "{id}");
        let (status, why): (String, String) =
            db::query_as("SELECT status, failure_reason FROM webhook_inbox WHERE event_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(status, "failed");
        assert!(why.contains(sqlstate), "{id}: {why}");
    }
    // A batch whose one item PostgreSQL refuses: the others are stored as they are.
    let env = envelope_of(Provider::MARQETA, b"batch", &headers);
    let items = vec![
        NewEvent::pending("t:ok".into(), "t", "{}".into()),
        NewEvent::pending("t:deep".into(), "t", nested(100_000)),
    ];
    let claimed = claim_delivery(&connections, &env, &Events::Batch(items), None).await.unwrap();
    assert_eq!(claimed, Claimed::Batch(BatchClaim { accepted: 2, duplicates: 0 }));
    let statuses: Vec<(String, String)> =
        db::query_as("SELECT event_id, status FROM webhook_inbox WHERE provider = 'marqeta' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(statuses, [("t:deep".into(), "failed".into()), ("t:ok".into(), "pending".into())]);
}

#[test]
fn batches_are_sorted_and_repeats_collapse_to_the_first() {
    let e = |id: &str, t: &str| NewEvent::pending(id.into(), t, "{}".into());
    let events = [e("b", "first"), e("a", "x"), e("b", "second")];
    let v: Vec<_> = sorted_unique(&events).iter().map(|e| (e.event_id.as_str(), e.event_type.as_str())).collect();
    assert_eq!(v, [("a", "x"), ("b", "first")]);
}
