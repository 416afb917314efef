//! Requeue from the command line: thousands in batches and only what matches,
//! a handler added later run over every event it missed, done events taken once
//! while the worker finishes them again.

use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{fails, json_of, ok, row, url_of};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn requeue_moves_thousands_in_batches_and_only_what_matches(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, failure_reason, raw_body, secret_index, attempts, processed_at)
         SELECT 'marqeta', 'm' || i, 'x', '{}', 'failed', 'account missing: ' || i, '{}', 0, 10, now() FROM generate_series(1, 1200) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    row(&pool, "marqeta", "m_other", "failed", Some("malformed"), "1 minute").await;
    row(&pool, "stripe", "evt_keep", "failed", Some("account missing: x"), "1 minute").await;

    let dry = json_of(
        &url,
        &["requeue", "--failed", "--provider", "marqeta", "--reason-like", "account missing%", "--dry-run", "--json"],
    );
    assert_eq!(dry, json!({"matching": 1200, "without_payload": 0, "requeued": 0, "dry_run": true}));
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'failed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(failed, 1202, "a dry run changes nothing");

    let done =
        json_of(&url, &["requeue", "--failed", "--provider", "marqeta", "--reason-like", "account missing%", "--json"]);
    assert_eq!(done, json!({"matching": 1200, "without_payload": 0, "requeued": 1200, "held": 0, "dry_run": false}));
    let by_status: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT provider, status, count(*) FROM webhook_inbox GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        by_status,
        [
            ("marqeta".into(), "failed".into(), 1),
            ("marqeta".into(), "pending".into(), 1200),
            ("stripe".into(), "failed".into(), 1)
        ]
    );
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_audit WHERE action = 'requeue'").fetch_one(&pool).await.unwrap();
    assert_eq!(audited, 1200);
    let reset: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND attempts = 0 AND failure_reason IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(reset, 1200);
    assert!(fails(Some(&url), &["requeue", "--provider", "marqeta"]).contains("--status"));
    assert!(fails(Some(&url), &["requeue", "--status", "pending"]).contains("queued already"));
}

/// A handler deployed later: the events of its type that arrived before it are
/// `unhandled` (nothing ran for them), and one `requeue` by type puts them
/// through it; events of other types stay as they are.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn requeue_by_type_runs_a_handler_added_later_over_every_event_it_missed(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use webhook_inbox::{Event, HandlerError, Handlers, Message, Outcome, PgConnection, Provider, Stage, Worker};
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    for i in 0..1100 {
        let body = json!({"id": format!("evt_{i}"), "type": "invoice.paid"}).to_string();
        inbox_tests::store(&pool, Provider::STRIPE, &format!("evt_{i}"), "invoice.paid", &body).await;
    }
    inbox_tests::store(&pool, Provider::STRIPE, "evt_other", "customer.created", "{}").await;
    row(&pool, "stripe", "evt_unusable", "failed", Some("payload is not usable JSON"), "1 minute").await;
    sqlx::query("UPDATE webhook_inbox SET payload = NULL, event_type = 'invoice.paid' WHERE event_id = 'evt_unusable'")
        .execute(&pool)
        .await
        .unwrap();

    // Before the handler: nothing takes these types, and the inbox says so.
    let before = Worker::new(pool.clone(), Handlers::new(), inbox_tests::fast_worker_config());
    let counts = before.run(inbox_tests::later()).await.unwrap();
    assert_eq!(counts.unhandled, 1101);
    let stats = json_of(&url, &["stats", "--json"]);
    assert!(stats.to_string().contains(r#""status":"unhandled""#), "{stats}");
    let shown = ok(&url, &["show", "stripe", "evt_7"], &[]);
    assert!(shown.contains("unhandled: no handler took \"invoice.paid\""), "{shown}");

    // The handler is deployed; one command backfills its type.
    async fn email_receipt(conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let key = format!("receipt:{}", event.event_id);
        let message = Message::new("invoice", &event.event_id, key, json!({}));
        event.enqueue(conn, &message).await?;
        Ok(Outcome::Applied)
    }
    let args = ["requeue", "--status", "unhandled,failed", "--provider", "stripe", "--type", "invoice.paid", "--json"];
    let dry = json_of(&url, &[&args[..], &["--dry-run"]].concat());
    assert_eq!(dry, json!({"matching": 1101, "without_payload": 1, "requeued": 0, "dry_run": true}));
    let done = json_of(&url, &args);
    assert_eq!(done, json!({"matching": 1101, "without_payload": 1, "requeued": 1100, "held": 0, "dry_run": false}));
    let after = Worker::new(
        pool.clone(),
        Handlers::new().on("stripe", "invoice.paid", email_receipt).unwrap(),
        inbox_tests::fast_worker_config(),
    );
    let counts = after.run(inbox_tests::later()).await.unwrap();
    assert_eq!((counts.applied, counts.unhandled), (1100, 0));
    let state: (i64, i64, String, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM transactional_outbox WHERE message_key LIKE 'receipt:evt_%'),
                (SELECT count(*) FROM inbox_audit WHERE action = 'requeue' AND from_status = 'unhandled'),
                (SELECT status FROM webhook_inbox WHERE event_id = 'evt_other'),
                (SELECT status FROM webhook_inbox WHERE event_id = 'evt_unusable')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, (1100, 1100, "unhandled".into(), "failed".into()));
    // The event's page names the message its handler wrote, and its state.
    let shown = ok(&url, &["show", "stripe", "evt_7"], &[]);
    assert!(
        shown.contains("outbox: #") && shown.contains("receipt:evt_7 (invoice evt_7), waiting, 0 attempts"),
        "{shown}"
    );
    let json = json_of(&url, &["show", "stripe", "evt_7", "--json"]);
    assert_eq!(json["outbox"][0]["message_key"], "receipt:evt_7");
    // Nothing left to take: a second run finds what the first left, and changes nothing.
    let again = json_of(&url, &["requeue", "--status", "unhandled", "--type", "invoice.paid", "--json"]);
    assert_eq!(again, json!({"matching": 0, "without_payload": 0, "requeued": 0, "held": 0, "dry_run": false}));
}

/// Requeueing done events while a worker runs: each is taken once, however
/// fast the worker finishes it again (the requeue is fenced at its start).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn requeue_of_done_events_takes_each_once_while_the_worker_finishes_them_again(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use std::sync::Arc;
    use webhook_inbox::{Event, HandlerError, Handlers, Outcome, PgConnection, Stage, Worker};
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at)
         SELECT 'stripe', 'd' || i, 'invoice.paid', '{}', 'done', '{}', 0, now() - interval '1 hour'
         FROM generate_series(1, 3000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    async fn quick(_: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        Ok(Outcome::NoEffect)
    }
    let worker = Arc::new(Worker::new(
        pool.clone(),
        Handlers::new().on("stripe", "invoice.paid", quick).unwrap(),
        inbox_tests::fast_worker_config(),
    ));
    let stop = Arc::new(tokio::sync::Notify::new());
    let running = tokio::spawn({
        let (worker, stop) = (worker.clone(), stop.clone());
        async move { worker.run_until(std::time::Duration::from_millis(1), stop.notified()).await }
    });
    let url = url_of(&opts);
    let done = tokio::task::spawn_blocking(move || {
        json_of(&url, &["requeue", "--status", "done", "--type", "invoice.paid", "--json"])
    })
    .await
    .unwrap();
    stop.notify_waiters();
    running.await.unwrap();
    assert_eq!(done["requeued"], 3000, "{done}");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_audit").fetch_one(&pool).await.unwrap();
    assert_eq!(audited, 3000, "each event requeued once");
}
