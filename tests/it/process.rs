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
use stock::orders::{self, OrderSnapshot};
use tokio::sync::Barrier;
use webhook_inbox::{Handlers, Processed, Stage, Tally, Worker, WorkerConfig};
use webhook_inbox_schemes::Provider;

pub(crate) fn worker(pool: &PgPool, handlers: Handlers) -> Worker {
    Worker::new(pool.clone(), handlers, fast_worker_config())
}

/// Puts an event in the inbox as receive would.
pub(crate) async fn stored(pool: &PgPool, provider: Provider, event_id: &str, event_type: &str, payload: Value) {
    store(pool, provider, event_id, event_type, &payload.to_string()).await;
}

/// Drains until nothing is due, waiting out short backoffs; gives up after 10 s.
pub(crate) async fn drain_all(w: &Worker, pool: &PgPool) -> Processed {
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

pub(crate) fn payment_event(event_id: &str, pi: &str, amount: i64) -> Value {
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
    let r = Arc::new(webhook_inbox::Receiver::connect_with(opts, &cfg));
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

// ---------- the two triggers ----------
//
// The `process` function's triggers are tested where they are: the schedule's
// drain and an unreachable database in `shared/src/process/mod.rs`, the SQS
// path through the function's own binary in `functions/process/tests/sqs.rs`,
// and receive telling the process queue through the `receive` binary in
// `functions/receive/tests/process_queue.rs`.

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
    assert_eq!(webhook_inbox::ops::sqlstate(&err).as_deref(), Some("23505"));
    let upsert = "INSERT INTO keys VALUES ($1) ON CONFLICT (k) DO NOTHING";
    assert_eq!(race(&pool, upsert, "b").await.unwrap(), 0, "ON CONFLICT DO NOTHING: zero rows, no error");
    let version: i32 = scalar(&pool, "SELECT current_setting('server_version_num')::int").await;
    if version < 170000 {
        let returning = sqlx::query(&format!("{merge} RETURNING k")).bind("c").execute(&pool).await.unwrap_err();
        assert_eq!(
            webhook_inbox::ops::sqlstate(&returning).as_deref(),
            Some("42601"),
            "MERGE ... RETURNING is a syntax error before PostgreSQL 17"
        );
    }
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
