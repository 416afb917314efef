//! Pausing processing by provider, or by provider and type (`inbox pause`):
//! receive keeps claiming, the worker leaves the scope's events pending and
//! marks them held once (no attempt spent, not walked again), a resume
//! releases them in receive order; exact under concurrency (nothing of the
//! scope is processed once the pause has committed), across a restart, on
//! the SQS path and in inline mode.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use http::StatusCode;
use inbox_tests::*;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use webhook_inbox::{
    ops::{self, Audit, PauseScope, Released},
    Event, Handler, HandlerError, Handlers, Outcome, Receiver, Worker, WorkerConfig,
};
use webhook_inbox_schemes::Provider;

/// Logs each event it applies, in the order applied (committed with its
/// batch), after taking this many milliseconds.
struct Log(u64);

impl Handler for Log {
    type Payload = serde_json::Value;
    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        tokio::time::sleep(Duration::from_millis(self.0)).await;
        sqlx::query("INSERT INTO applied (event_id) VALUES ($1)").bind(&event.event_id).execute(&mut *conn).await?;
        Ok(Outcome::Applied)
    }
}

async fn logging(pool: &PgPool) -> Handlers {
    slow_logging(pool, 0).await
}

async fn slow_logging(pool: &PgPool, ms: u64) -> Handlers {
    sqlx::query("CREATE TABLE IF NOT EXISTS applied (seq BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    let types = ["orders/paid", "orders/create"];
    Handlers::new()
        .on_each(Provider::SHOPIFY, &types, Log(ms))
        .unwrap()
        .on(Provider::STRIPE, "charge.updated", Log(ms))
        .unwrap()
}

fn scope(provider: &str, event_type: Option<&str>) -> PauseScope {
    PauseScope::new(provider, event_type).unwrap()
}

const BY: Audit<'static> = Audit { actor: "on-call", action: "pause", reason: "orders handler broken" };
const RESUMED: Audit<'static> = Audit { actor: "on-call", action: "resume", reason: "fix deployed" };

async fn pause(pool: &PgPool, s: &PauseScope) -> bool {
    ops::pause_events(pool, s, Duration::from_secs(3600), &BY).await.unwrap()
}

/// Resumes `s` to the end, as `inbox resume` does, in chunks of `chunk`.
async fn resume(pool: &PgPool, s: &PauseScope, chunk: i64) -> u64 {
    let id = ops::resume_events(pool, s, &RESUMED).await.unwrap().expect("paused");
    let mut released = 0;
    loop {
        match ops::release(pool, id, chunk).await.unwrap() {
            Released::Some(n) => released += n,
            Released::Resumed(n) => return released + n,
            Released::Busy => tokio::time::sleep(Duration::from_millis(5)).await,
            Released::NotResuming => return released,
        }
    }
}

async fn applied(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT event_id FROM applied ORDER BY seq").fetch_all(pool).await.unwrap()
}

async fn held(pool: &PgPool) -> i64 {
    scalar(pool, "SELECT count(*) FROM webhook_inbox WHERE held_by IS NOT NULL").await
}

/// Every `held_by` names a pause that exists (a resume leaves none behind).
async fn no_orphans(pool: &PgPool) {
    let orphans: i64 = scalar(
        pool,
        "SELECT count(*) FROM webhook_inbox w
         WHERE held_by IS NOT NULL AND NOT EXISTS (SELECT 1 FROM inbox_pauses p WHERE p.id = w.held_by)",
    )
    .await;
    assert_eq!(orphans, 0, "events held by a pause that is gone");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_paused_provider_s_events_wait_held_spending_nothing_and_go_in_receive_order_on_resume(pool: PgPool) {
    let handlers = logging(&pool).await;
    let w = Worker::new(pool.clone(), handlers, WorkerConfig { batch_size: 4, ..fast_worker_config() });
    assert!(pause(&pool, &scope("shopify", None)).await);
    assert!(!pause(&pool, &scope("shopify", None)).await, "paused already: nothing changes");
    for i in 0..10 {
        store(&pool, Provider::SHOPIFY, &format!("sh_{i:02}"), "orders/paid", "{}").await;
        if i % 3 == 0 {
            store(&pool, Provider::STRIPE, &format!("evt_{i:02}"), "charge.updated", "{}").await;
        }
    }
    let mut total = webhook_inbox::Processed::default();
    loop {
        let pass = w.run_once(later()).await.unwrap();
        if pass.taken + pass.held == 0 {
            break;
        }
        webhook_inbox::Tally::add(&mut total, &pass);
    }
    assert_eq!((total.taken, total.held), (4, 10), "stripe's events went, shopify's are held");
    assert_eq!(applied(&pool).await, ["evt_00", "evt_03", "evt_06", "evt_09"]);
    let row: (String, i32, bool) =
        sqlx::query_as("SELECT status, attempts, held_by IS NOT NULL FROM webhook_inbox WHERE event_id = 'sh_05'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(row, ("pending".into(), 0, true), "pending, no attempt spent, held");
    assert_eq!(w.run_once(later()).await.unwrap().held, 0, "held once: not walked again");

    let gauges = ops::gauges(&pool).await.unwrap().inbox;
    assert_eq!((gauges.pending, gauges.held, gauges.oldest_pending_ms, gauges.overdue_pauses), (10, 10, 0.0, 0));
    let listed = ops::pauses(&pool).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].held, listed[0].state(), listed[0].paused_by.as_str()), (10, "paused", "on-call"));

    // Received while paused, a redelivery stays a duplicate; a new one waits too.
    store(&pool, Provider::SHOPIFY, "sh_10", "orders/paid", "{}").await;
    assert_eq!(w.run_once(later()).await.unwrap().held, 1);

    assert_eq!(resume(&pool, &scope("shopify", None), 3).await, 11);
    assert!(ops::pauses(&pool).await.unwrap().is_empty());
    while w.run_once(later()).await.unwrap().taken > 0 {}
    let order: Vec<String> = applied(&pool).await.split_off(4);
    let expected: Vec<String> = (0..=10).map(|i| format!("sh_{i:02}")).collect();
    assert_eq!(order, expected, "in receive order, each once");
    let actions: Vec<String> =
        ops::pause_history(&pool, "shopify").await.unwrap().into_iter().map(|r| r.action).collect();
    assert_eq!(actions, ["pause", "resume", "resumed"]);
    no_orphans(&pool).await;
}

/// A type's pause holds only that type; resuming the provider's pause keeps
/// it held; pausing again during a resume holds again what was released.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_type_s_pause_outlives_its_provider_s_and_a_pause_during_a_resume_holds_again(pool: PgPool) {
    let w = Worker::new(pool.clone(), logging(&pool).await, fast_worker_config());
    assert!(pause(&pool, &scope("shopify", Some("orders/paid"))).await);
    store(&pool, Provider::SHOPIFY, "paid_1", "orders/paid", "{}").await;
    store(&pool, Provider::SHOPIFY, "create_1", "orders/create", "{}").await;
    let pass = w.run_once(later()).await.unwrap();
    assert_eq!((pass.taken, pass.held), (1, 1), "orders/create went, orders/paid is held");

    assert!(pause(&pool, &scope("shopify", None)).await);
    store(&pool, Provider::SHOPIFY, "create_2", "orders/create", "{}").await;
    assert_eq!(w.run_once(later()).await.unwrap().held, 1);
    assert_eq!(resume(&pool, &scope("shopify", None), 100).await, 1);
    w.run_once(later()).await.unwrap();
    assert_eq!(applied(&pool).await, ["create_1", "create_2"], "orders/paid still paused");

    // A resume started, one chunk released, then paused again: held again.
    for i in 0..6 {
        store(&pool, Provider::SHOPIFY, &format!("paid_{}", i + 2), "orders/paid", "{}").await;
    }
    w.run_once(later()).await.unwrap();
    assert_eq!(held(&pool).await, 7);
    let s = scope("shopify", Some("orders/paid"));
    let id = ops::resume_events(&pool, &s, &RESUMED).await.unwrap().unwrap();
    assert_eq!(ops::release(&pool, id, 2).await.unwrap(), Released::Some(2));
    assert!(pause(&pool, &s).await, "a resuming scope is paused again");
    assert_eq!(ops::release(&pool, id, 2).await.unwrap(), Released::NotResuming);
    let pass = w.run_once(later()).await.unwrap();
    assert_eq!((pass.taken, pass.held), (0, 2), "the two released are held again");
    assert_eq!(applied(&pool).await.len(), 2);
    assert_eq!(resume(&pool, &s, 100).await, 7);
    while w.run_once(later()).await.unwrap().taken > 0 {}
    let paid: Vec<String> = applied(&pool).await.split_off(2);
    assert_eq!(paid, (1..=7).map(|i| format!("paid_{i}")).collect::<Vec<_>>());
    no_orphans(&pool).await;
}

/// A pause is in the database: a worker started afresh keeps holding; a
/// resume started and left (`--no-wait`, or the console's) is finished by the
/// workers' own passes, in receive order.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_pause_survives_a_restart_and_the_workers_finish_a_resume_left_to_them(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let handlers = logging(&pool).await;
    assert!(pause(&pool, &scope("shopify", None)).await);
    for i in 0..25 {
        store(&pool, Provider::SHOPIFY, &format!("sh_{i:02}"), "orders/paid", "{}").await;
    }
    assert_eq!(Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap().held, 25);
    pool.close().await;

    let pool = PgPool::connect_with(opts).await.unwrap();
    let config = WorkerConfig { batch_size: 10, ..fast_worker_config() };
    let w = Worker::new(pool.clone(), logging(&pool).await, config);
    store(&pool, Provider::SHOPIFY, "sh_25", "orders/paid", "{}").await;
    let pass = w.run_once(later()).await.unwrap();
    assert_eq!((pass.taken, pass.held), (0, 1), "still paused after the restart");
    assert_eq!(held(&pool).await, 26);

    ops::resume_events(&pool, &scope("shopify", None), &RESUMED).await.unwrap().unwrap();
    let listed = ops::pauses(&pool).await.unwrap();
    assert_eq!(listed[0].state(), "resuming");
    for _ in 0..20 {
        w.run_once(later()).await.unwrap();
    }
    assert!(ops::pauses(&pool).await.unwrap().is_empty(), "the workers finished the resume");
    assert_eq!(applied(&pool).await, (0..26).map(|i| format!("sh_{i:02}")).collect::<Vec<_>>());
    no_orphans(&pool).await;
}

/// Exact under concurrency: four workers and four receivers running, a
/// receive transaction open across the pause; once `pause` returns, no
/// shopify event is applied (the pause waited for the batches in flight),
/// while stripe's go on. Then resumed (chunks of
/// 7) while everything runs: every event applied once, none held.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn nothing_of_a_paused_scope_is_applied_once_the_pause_returns_and_nothing_is_lost(pool: PgPool) {
    // Each batch of 10 takes 50 ms or more: batches are in flight when the pause comes.
    let handlers = slow_logging(&pool, 5).await;
    let stop = Arc::new(AtomicBool::new(false));
    let config = WorkerConfig { batch_size: 10, ..fast_worker_config() };
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (w, stop) = (Worker::new(pool.clone(), handlers.clone(), config.clone()), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if w.run_once(later()).await.unwrap().taken == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for r in 0..4 {
        let (pool, stop, received) = (pool.clone(), stop.clone(), received.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (provider, kind) =
                    if i % 2 == 0 { (Provider::SHOPIFY, "orders/paid") } else { (Provider::STRIPE, "charge.updated") };
                store(&pool, provider, &format!("r{r}_{i:05}"), kind, "{}").await;
                received.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    // A receive whose transaction began before the pause and commits after it.
    let mut stale = pool.begin().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    claim_in(&mut stale, "stale_1").await;
    let shopify_applied = "SELECT count(*) FROM applied WHERE event_id IN
                               (SELECT event_id FROM webhook_inbox WHERE provider = 'shopify')";
    assert!(pause(&pool, &scope("shopify", None)).await);
    stale.commit().await.unwrap();
    let at_pause: i64 = scalar(&pool, shopify_applied).await;
    let stripe_before: i64 = scalar(&pool, "SELECT count(*) FROM applied").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(scalar::<i64>(&pool, shopify_applied).await, at_pause, "a shopify event applied after the pause");
    assert!(scalar::<i64>(&pool, "SELECT count(*) FROM applied").await > stripe_before, "stripe stopped too");
    assert!(at_pause > 0, "the workers ran before the pause");

    // The workers release chunks too (they see the resume in their gate): this loop may release none itself.
    resume(&pool, &scope("shopify", None), 7).await;
    assert!(ops::pauses(&pool).await.unwrap().is_empty(), "resumed to the end");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let w = Worker::new(pool.clone(), handlers.clone(), config);
    while w.run_once(later()).await.unwrap().taken > 0 {}
    let total = received.load(Ordering::Relaxed) as i64 + 1;
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'done'").await, total);
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM applied").await, total, "each applied once");
    assert_eq!(held(&pool).await, 0);
    no_orphans(&pool).await;
}

/// Claims a pending shopify event inside `tx` (an `INSERT ... ON CONFLICT DO
/// NOTHING` as receive's claim is), left uncommitted for the test to commit.
async fn claim_in(tx: &mut PgConnection, event_id: &str) {
    let inserted = sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, headers, secret_index)
         VALUES ('shopify', $1, 'orders/paid', '{}', '\\x7b7d', '{}', 0)
         ON CONFLICT (provider, event_id) DO NOTHING",
    )
    .bind(event_id)
    .execute(tx)
    .await
    .unwrap();
    assert_eq!(inserted.rows_affected(), 1, "{event_id} is new");
}

/// The SQS path holds a paused event (acknowledged, not processed); inline
/// receive runs no handler for it and leaves it to the worker.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_sqs_path_and_inline_receive_respect_a_pause(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let handlers = logging(&pool).await;
    assert!(pause(&pool, &scope("stripe", Some("charge.updated"))).await);
    store(&pool, Provider::STRIPE, "evt_sqs", "charge.updated", "{}").await;
    let w = Worker::new(pool.clone(), handlers.clone(), fast_worker_config());
    let counts = w.run_event("stripe", "evt_sqs").await.unwrap();
    assert_eq!((counts.taken, counts.held), (0, 1));

    let mut cfg = config(secrets(false));
    cfg.inline_providers = vec![Provider::STRIPE];
    let r = Receiver::connect_with(opts, &cfg).with_handlers(handlers);
    let body = br#"{"id": "evt_inline", "type": "charge.updated", "data": {"object": {}}}"#;
    let answer = post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], body))], body).await;
    assert_eq!(answer.0, StatusCode::OK);
    assert!(applied(&pool).await.is_empty(), "no handler ran, inline or on the SQS path");
    assert_eq!(w.run_once(later()).await.unwrap().held, 1, "the inline event is left to the worker, which holds it");
    assert_eq!(resume(&pool, &scope("stripe", Some("charge.updated")), 100).await, 2);
    w.run_once(later()).await.unwrap();
    assert_eq!(applied(&pool).await, ["evt_sqs", "evt_inline"]);
}

/// A pause older than its alarm is overdue (the PauseOverdue alarm's gauge).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_pause_older_than_its_alarm_is_overdue(pool: PgPool) {
    ops::pause_events(&pool, &scope("github", None), Duration::from_secs(7200), &BY).await.unwrap();
    assert_eq!(ops::gauges(&pool).await.unwrap().inbox.overdue_pauses, 0);
    sqlx::query("UPDATE inbox_pauses SET paused_at = now() - interval '3 hours'").execute(&pool).await.unwrap();
    assert_eq!(ops::gauges(&pool).await.unwrap().inbox.overdue_pauses, 1);
    assert!(ops::pauses(&pool).await.unwrap()[0].overdue());
    assert!(PauseScope::new("Not A Provider", None).is_err());
    assert!(PauseScope::new("shopify", Some("")).is_err());
    assert!(PauseScope::new("shopify", Some(&"x".repeat(129))).is_err());
}
