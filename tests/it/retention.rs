//! Retention against a real PostgreSQL: only what may go goes, in batches,
//! while deliveries keep arriving.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use http::StatusCode;
use inbox_tests::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{config::Catalog, PruneConfig, Pruner, Stage};
use webhook_inbox_schemes::Provider;

fn retention(batch_size: i64) -> PruneConfig {
    let done_days: HashMap<Provider, u32> = [(Provider::SHOPIFY, 2)].into();
    PruneConfig {
        catalog: Catalog::builtin(),
        default_days: 60,
        done_days,
        failed_days: 180,
        outbox_days: 7,
        batch_size,
        archive: None,
    }
}

/// An inbox row of `status`, received `days` ago.
async fn row(pool: &PgPool, provider: Provider, id: &str, status: &str, days: i32) {
    store(pool, provider, id, "t", "{}").await;
    sqlx::query(
        "UPDATE webhook_inbox SET status = $3, received_at = now() - make_interval(days => $4),
                processed_at = CASE WHEN $3 = 'done' THEN now() END,
                failure_reason = CASE WHEN $3 = 'failed' THEN 'x' END
         WHERE provider = $1 AND event_id = $2",
    )
    .bind(provider.as_str())
    .bind(id)
    .bind(status)
    .bind(days)
    .execute(pool)
    .await
    .unwrap();
}

async fn message(pool: &PgPool, key: &str, sent_days_ago: Option<i32>) {
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, created_at, processed_at)
         VALUES ('t', 'a', '{}', $1, now() - interval '30 days', now() - make_interval(days => $2))",
    )
    .bind(key)
    .bind(sent_days_ago)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn prune_deletes_only_what_is_past_its_retention(pool: PgPool) {
    row(&pool, Provider::STRIPE, "done-61d", "done", 61).await;
    row(&pool, Provider::STRIPE, "done-10d", "done", 10).await;
    row(&pool, Provider::STRIPE, "pending-100d", "pending", 100).await;
    row(&pool, Provider::STRIPE, "failed-100d", "failed", 100).await;
    row(&pool, Provider::STRIPE, "failed-200d", "failed", 200).await;
    row(&pool, Provider::SHOPIFY, "shopify-done-5d", "done", 5).await;
    row(&pool, Provider::SHOPIFY, "shopify-done-1d", "done", 1).await;
    message(&pool, "sent-8d", Some(8)).await;
    message(&pool, "sent-2d", Some(2)).await;
    message(&pool, "unsent", None).await;

    let pruned =
        Pruner::new(pool.clone(), retention(1000)).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!((pruned.done, pruned.failed, pruned.outbox), (2, 1, 1));
    let left: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM webhook_inbox ORDER BY event_id").fetch_all(&pool).await.unwrap();
    assert_eq!(left, ["done-10d", "failed-100d", "pending-100d", "shopify-done-1d"]);
    let keys: Vec<String> = sqlx::query_scalar("SELECT message_key FROM transactional_outbox ORDER BY message_key")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(keys, ["sent-2d", "unsent"]);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn prune_never_waits_on_a_row_another_transaction_holds(pool: PgPool) {
    row(&pool, Provider::STRIPE, "held", "done", 90).await;
    row(&pool, Provider::STRIPE, "free", "done", 90).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM webhook_inbox WHERE event_id = 'held' FOR UPDATE").execute(&mut *holder).await.unwrap();
    let pruned = Pruner::new(pool.clone(), retention(10)).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(pruned.done, 1, "the held row is skipped, not waited for");
    holder.rollback().await.unwrap();
    let pruned = Pruner::new(pool.clone(), retention(10)).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(pruned.done, 1);
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// 20,000 expired rows are deleted in batches of 500 while four clients keep
/// delivering: every delivery is answered 200 and stored, and the latencies
/// before and during the prune are printed side by side.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn prune_runs_in_batches_while_deliveries_keep_arriving(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPoolOptions::new().max_connections(4).connect_with(opts.clone()).await.unwrap();
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index, status, received_at, processed_at)
         SELECT 'stripe', 'old_' || i, 't', '{}', '\\x7b7d', 0, 'done', now() - interval '90 days', now() - interval '90 days'
         FROM generate_series(1, 20000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let r = Arc::new(receiver(opts, secrets(false)));

    async fn deliver(r: Arc<webhook_inbox::Receiver>, prefix: String, until: impl Fn() -> bool) -> Vec<Duration> {
        let mut latencies = Vec::new();
        let mut i = 0;
        while !until() {
            i += 1;
            let body = format!(r#"{{"id":"{prefix}_{i}","type":"t"}}"#).into_bytes();
            let sig = stripe_header(STRIPE[0], &body);
            let started = Instant::now();
            let (status, answer) = post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await;
            latencies.push(started.elapsed());
            assert_eq!(status, StatusCode::OK, "{answer}");
        }
        latencies
    }

    // Baseline: 4 clients, 200 deliveries each, no prune.
    let mut baseline = Vec::new();
    for c in 0..4 {
        let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = r.clone();
        baseline
            .push(tokio::spawn(deliver(r, format!("base{c}"), move || counter.fetch_add(1, Ordering::SeqCst) >= 200)));
    }
    let mut before: Vec<Duration> = Vec::new();
    for b in baseline {
        before.extend(b.await.unwrap());
    }

    let pruning = Arc::new(AtomicBool::new(true));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (r, pruning) = (r.clone(), pruning.clone());
            tokio::spawn(deliver(r, format!("during{c}"), move || !pruning.load(Ordering::SeqCst)))
        })
        .collect();
    let pruned =
        Pruner::new(pool.clone(), retention(500)).run(Instant::now() + Duration::from_secs(120)).await.unwrap();
    pruning.store(false, Ordering::SeqCst);
    let mut during: Vec<Duration> = Vec::new();
    for c in clients {
        during.extend(c.await.unwrap());
    }

    assert_eq!(pruned.done, 20_000);
    assert!(
        pruned.statements >= 5 * 40,
        "in batches of 500, each its own transaction: {} statements",
        pruned.statements
    );
    let (old, new): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE event_id LIKE 'old_%'), count(*) FILTER (WHERE event_id NOT LIKE 'old_%') FROM webhook_inbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((old, new), (0, (before.len() + during.len()) as i64), "every delivery was stored");
    before.sort();
    during.sort();
    println!(
        "receive latency without prune: p50 {:?} p99 {:?} ({} deliveries); during prune: p50 {:?} p99 {:?} ({} deliveries)",
        percentile(&before, 0.5),
        percentile(&before, 0.99),
        before.len(),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        during.len()
    );
    assert!(!during.is_empty(), "deliveries ran while the prune did");
    assert!(percentile(&during, 0.99) < Duration::from_secs(1), "no delivery waited on the prune's locks");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn batch_bodies_go_once_no_row_points_at_them_and_no_delivery_brought_them_for_a_day(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let pool = app.pool.clone();
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let notes = ["kept: a row points at it", "orphan, old", "orphan, seen an hour ago"];
    let bodies: Vec<Vec<u8>> = (notes.iter().enumerate())
        .map(|(i, note)| {
            format!(r#"{{"transactions":[{{"token":"t{i}","type":"authorization","note":"{note}"}}]}}"#).into_bytes()
        })
        .collect();
    for body in &bodies {
        // Sent again, its item a duplicate: no body is stored for it a second time.
        for answer in [json!({"accepted": 1, "duplicates": 0}), json!({"accepted": 0, "duplicates": 1})] {
            assert_eq!(app.post("marqeta", &[("Authorization", &auth)], body).await, (StatusCode::OK, answer));
        }
    }
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_bodies").await, 3);
    // The rows of the last two went (as retention deletes rows): their bodies are orphans.
    sqlx::query("DELETE FROM webhook_inbox WHERE event_id <> 'transactions:t0'").execute(&pool).await.unwrap();
    sqlx::query("UPDATE webhook_bodies SET last_seen_at = now() - interval '2 days' WHERE raw_body <> $1")
        .bind(&bodies[2])
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE webhook_bodies SET last_seen_at = now() - interval '1 hour' WHERE raw_body = $1")
        .bind(&bodies[2])
        .execute(&pool)
        .await
        .unwrap();
    let pruned =
        Pruner::new(pool.clone(), retention(1000)).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(pruned.bodies, 1);
    let left: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT raw_body FROM webhook_bodies ORDER BY raw_body").fetch_all(&pool).await.unwrap();
    assert_eq!(left, [bodies[0].clone(), bodies[2].clone()]);
}

/// A replay guard is kept while the row it was claimed for is: once retention
/// deletes that row (the provider can no longer redeliver it), its digest goes too.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_replay_guard_goes_with_its_row(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let pool = app.pool.clone();
    // GitHub signs neither its delivery id nor a time: receive guards its signed bytes against replays.
    for (id, body) in [("old", &br#"{"ref":"old body"}"#[..]), ("recent", br#"{"ref":"recent body"}"#)] {
        let sig = github_signature(GITHUB[0], body);
        let headers = [("X-Hub-Signature-256", sig.as_str()), ("X-GitHub-Delivery", id), ("X-GitHub-Event", "push")];
        assert_eq!(app.post("github", &headers, body).await, (StatusCode::OK, json!({"status": "accepted"})));
    }
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_replay_guard").await, 2, "each claimed its guard");
    sqlx::query(
        "UPDATE webhook_inbox SET status = 'done', processed_at = now(), received_at = now() - interval '400 days'
         WHERE event_id = 'old'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE webhook_replay_guard SET seen_at = now() - interval '400 days'").execute(&pool).await.unwrap();
    let pruned =
        Pruner::new(pool.clone(), retention(1000)).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!((pruned.done, pruned.guards), (1, 1));
    let left: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM webhook_replay_guard").fetch_all(&pool).await.unwrap();
    assert_eq!(left, ["recent"], "the recent row's digest stays, however old its guard");
}
