//! Behind PgBouncer (Debian's 1.18) with `INBOX_DB_POOLER=proxy`, in
//! transaction pooling (16 clients sharing 4 server sessions, handed out in
//! turn) and in session pooling: the migrations, receive (one claim at a time,
//! and in groups as `inbox serve` claims), process, relay,
//! prune and reconcile all work, with no error in PgBouncer's log (no
//! prepared-statement clash, 42P05 or 26000; no refused startup parameter) and
//! no advisory lock left behind. Without the setting PgBouncer refuses the
//! connection, which shows the setting is what makes the difference.
//!
//! A binary of its own: behind a transaction pooler every statement of the
//! process is unnamed, and the other tests keep the named ones.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use inbox_tests::{
    later, marqeta_basic, pgbouncer::PgBouncer, request, secrets, send, stripe_header, MARQETA_PASSWORDS, MARQETA_USER,
    STRIPE,
};
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{
    config::{Catalog, DbConfig, Env, Secret},
    reconciliation::{ReconcileConfig, StripeEvents},
    sinks::HttpSink,
    Destination, GroupConfig, PruneConfig, Pruner, ReceiveConfig, Receiver, Relay, RelayConfig, Stage, Worker,
};
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

fn through(bouncer: &PgBouncer, opts: &PgConnectOptions, pooler: &str) -> DbConfig {
    let url = format!("postgres://postgres@127.0.0.1:{}/{}", bouncer.port, opts.get_database().unwrap());
    let pairs = [("DATABASE_URL", url.as_str()), ("INBOX_DB_POOLER", pooler), ("INBOX_DB_POOL_SIZE", "16")];
    let config = DbConfig::read(&Env::from_pairs(&pairs), 1).unwrap();
    config
}

fn receiver(db: DbConfig) -> Receiver {
    let config = ReceiveConfig {
        db,
        catalog: Catalog::builtin(),
        secrets: secrets(false),
        max_body_bytes: 1 << 20,
        inline_providers: vec![],
        process_queue_url: None,
        rules: Default::default(),
    };
    Receiver::from_config(&config).unwrap()
}

fn payment(i: usize) -> Vec<u8> {
    json!({"id": format!("evt_pb_{i}"), "type": "payment_intent.succeeded",
        "data": {"object": {"id": format!("pi_pb_{i}"), "amount_received": 100 + i, "currency": "eur"}}})
    .to_string()
    .into_bytes()
}

#[sqlx::test(migrations = false)]
async fn every_stage_works_behind_pgbouncer_in_transaction_pooling(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    every_stage(pool_options, opts, "transaction", 4).await;
}

#[sqlx::test(migrations = false)]
async fn every_stage_works_behind_pgbouncer_in_session_pooling(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    // A session keeps its server: one per client connection.
    every_stage(pool_options, opts, "session", 40).await;
}

async fn every_stage(pool_options: PgPoolOptions, opts: PgConnectOptions, mode: &str, servers: u32) {
    let direct: PgPool = pool_options.connect_with(opts.clone()).await.unwrap();
    let bouncer = PgBouncer::start(opts.get_host(), opts.get_port(), servers, mode);
    let db = through(&bouncer, &opts, "proxy");
    let pool = db.pool().unwrap();

    // migrations: three deploys at once, each all or nothing, one after the other.
    let app = stock::app();
    let (a, b, c) = tokio::join!(app.migrate(&pool), app.migrate(&pool), app.migrate(&pool));
    for result in [a, b, c] {
        result.unwrap_or_else(|e| panic!("{e}; pgbouncer log:\n{}", bouncer.log()));
    }
    let applied: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_inbox_migrations), (SELECT count(*) FROM webhook_inbox_reference_migrations)",
    )
    .fetch_one(&direct)
    .await
    .unwrap();
    let expected = (webhook_inbox_migrations::INBOX.iter().count() as i64, stock::MIGRATIONS.iter().count() as i64);
    assert_eq!(applied, expected);

    // receive: 16 at a time, 200 payments each sent twice, and 20 Marqeta batches of 10.
    let receiver = Arc::new(receiver(db.clone()));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let receiver = receiver.clone();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in (worker..200).step_by(16) {
                let body = payment(i);
                let sig = stripe_header(STRIPE[0], &body);
                for _ in 0..2 {
                    statuses.push(send(&receiver, request("stripe", &[("Stripe-Signature", &sig)], &body)).await.0);
                }
            }
            for b in (worker..20).step_by(16) {
                let items: Vec<_> = (0..10)
                    .map(|k| json!({"token": format!("pb_{b}_{k}"), "type": "authorization", "state": "PENDING"}))
                    .collect();
                let body = json!({"transactions": items}).to_string();
                let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
                statuses
                    .push(send(&receiver, request("marqeta", &[("Authorization", &auth)], body.as_bytes())).await.0);
            }
            statuses
        }));
    }
    for task in tasks {
        for status in task.await.unwrap() {
            assert_eq!(status, StatusCode::OK, "pgbouncer log:\n{}", bouncer.log());
        }
    }
    // receive as `inbox serve` does, with group commit: 200 more payments, each twice, 16 at a time.
    let grouped = Arc::new(self::receiver(db.clone()).with_group_commit(GroupConfig::default()));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let grouped = grouped.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in (200 + worker..400).step_by(16) {
                let body = payment(i);
                let sig = stripe_header(STRIPE[0], &body);
                for _ in 0..2 {
                    answers.push(send(&grouped, request("stripe", &[("Stripe-Signature", &sig)], &body)).await);
                }
            }
            answers
        }));
    }
    let mut accepted = 0;
    for task in tasks {
        for (status, answer) in task.await.unwrap() {
            assert_eq!(status, StatusCode::OK, "{answer}; pgbouncer log:\n{}", bouncer.log());
            accepted += usize::from(answer["status"] == "accepted");
        }
    }
    assert_eq!(accepted, 200);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&direct).await.unwrap();
    assert_eq!(rows, 400 + 200);

    // process: the whole queue through the pooler.
    let worker = Worker::new(pool.clone(), stock::handlers(), inbox_tests::fast_worker_config());
    let processed = worker.run(later()).await.unwrap_or_else(|e| panic!("{e}; pgbouncer log:\n{}", bouncer.log()));
    assert_eq!(processed.taken, 600);
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(&direct).await.unwrap();
    assert_eq!(payments, 400);

    // relay: every outbox message to a sink.
    let sink = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&sink).await;
    let http = Destination::new("default", HttpSink::new(sink.uri(), Duration::from_secs(5)).unwrap());
    let relayed = Relay::new(pool.clone(), vec![http], RelayConfig::default()).run(later()).await.unwrap();
    assert_eq!(relayed.sent, 400);

    // prune: nothing is old enough, but every statement runs.
    let pruner = Pruner::new(pool.clone(), PruneConfig::read(&Env::from_pairs(&[])).unwrap());
    pruner.run(later()).await.unwrap();

    // reconcile: Stripe's API gives three events, one already known.
    let api = MockServer::start().await;
    let events: Vec<_> =
        [1, 2, 500].iter().map(|i| serde_json::from_slice::<serde_json::Value>(&payment(*i)).unwrap()).collect();
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": events, "has_more": false})))
        .mount(&api)
        .await;
    let config = ReconcileConfig {
        first_lookback: Duration::from_secs(3600),
        overlap: Duration::from_secs(300),
        window: Duration::from_secs(2 * 3600),
    };
    let found = webhook_inbox::reconciliation::Source::reconcile(
        &StripeEvents::new(api.uri(), Secret::new("sk")).unwrap(),
        &pool,
        &config,
        later(),
    )
    .await
    .unwrap();
    assert_eq!((found.applied, found.already_known), (1, 2));

    let log = bouncer.log();
    for refused in ["prepared statement", "unsupported startup parameter", "ERROR"] {
        assert!(!log.contains(refused), "{refused} in the pgbouncer log:\n{log}");
    }
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&direct)
    .await
    .unwrap();
    assert_eq!(advisory, 0, "an advisory lock outlived its transaction");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn without_the_setting_pgbouncer_refuses_the_startup_parameters(_: PgPoolOptions, opts: PgConnectOptions) {
    let bouncer = PgBouncer::start(opts.get_host(), opts.get_port(), 40, "transaction");
    let receiver = receiver(through(&bouncer, &opts, "none"));
    let body = payment(1);
    let sig = stripe_header(STRIPE[0], &body);
    let (status, _) = send(&receiver, request("stripe", &[("Stripe-Signature", &sig)], &body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "nothing acknowledged that was not stored");
    assert!(bouncer.log().contains("unsupported startup parameter"), "{}", bouncer.log());
}
