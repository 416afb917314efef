//! Inline mode (INBOX_INLINE_PROVIDERS): the effect applied before the 200,
//! a replay changing nothing, a hint handler's event left to the worker, a
//! failing or exclusive handler; and events that take their connection down.

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
use stock::payments::PaymentSucceededHandler;
use webhook_inbox::{Event, Handler, HandlerError, Handlers, Outcome, Stage, Worker, WorkerConfig};
use webhook_inbox_schemes::Provider;

use crate::process::{drain_all, payment_event, stored, worker};

fn inline_receiver(opts: PgConnectOptions, providers: Vec<Provider>) -> webhook_inbox::Receiver {
    let mut cfg = config(secrets(false));
    cfg.inline_providers = providers;
    webhook_inbox::Receiver::connect_with(opts, &cfg).with_handlers(stock::handlers())
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
