//! Group commit at receive (`inbox serve`, `inbox dev`): deliveries that
//! arrive together claimed in one statement and one commit, each answered
//! after it; the same key twice in a group; an outage. Real concurrency: the
//! deliveries are released together by a barrier. (A value PostgreSQL refuses
//! in a group is unit-tested beside the committer, in `shared/src/receive/claim/group.rs`.)

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tokio::sync::Barrier;
use webhook_inbox::{GroupConfig, Receiver};

/// A group that waits long enough for every delivery of a test to join it, on one committer.
const ONE_GROUP: GroupConfig =
    GroupConfig { max: 64, wait: Duration::from_millis(300), committers: 1, stall: Duration::ZERO };

fn grouped(opts: PgConnectOptions, group: GroupConfig) -> Arc<Receiver> {
    let mut cfg = config(secrets(false));
    cfg.db.pool_size = 8;
    // Longer than any test's lock wait, so a stalled group waits for the other writer, not a timeout.
    (cfg.db.lock_timeout, cfg.db.statement_timeout) = (Duration::from_secs(30), Duration::from_secs(30));
    Arc::new(Receiver::connect_with(opts, &cfg).with_group_commit(group))
}

fn payment(id: &str) -> Vec<u8> {
    json!({"id": id, "type": "payment_intent.succeeded",
        "data": {"object": {"id": format!("pi_{id}"), "amount_received": 100, "currency": "eur"}}})
    .to_string()
    .into_bytes()
}

/// Posts every body at once (released by a barrier); each answer, and whether
/// its row was visible to another connection the moment the answer came.
async fn post_together(pool: &PgPool, r: &Arc<Receiver>, bodies: Vec<Vec<u8>>) -> Vec<(StatusCode, Value, bool)> {
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (r, barrier, pool) = (r.clone(), barrier.clone(), pool.clone());
            tokio::spawn(async move {
                let sig = stripe_header(STRIPE[0], &body);
                barrier.wait().await;
                let (status, answer) = post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await;
                let id = serde_json::from_slice::<Value>(&body).unwrap()["id"].as_str().unwrap().to_string();
                let visible: bool = sqlx::query_scalar("SELECT count(*) = 1 FROM webhook_inbox WHERE event_id = $1")
                    .bind(&id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                (status, answer, visible)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// The transactions the rows were inserted in.
async fn transactions(pool: &PgPool) -> i64 {
    scalar(pool, "SELECT count(DISTINCT xmin::text) FROM webhook_inbox").await
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn deliveries_that_arrive_together_commit_once_and_each_is_answered_after_the_commit(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = grouped(opts, ONE_GROUP);
    let bodies = (0..20).map(|i| payment(&format!("evt_g_{i}"))).collect();
    for (status, answer, visible) in post_together(&pool, &r, bodies).await {
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
        assert!(visible, "answered before its row was committed");
    }
    assert_eq!(count(&pool).await, 20);
    assert_eq!(transactions(&pool).await, 1, "twenty deliveries, one commit");
    // Every column as the single claim writes it.
    let row: (String, String, String, Option<i16>, String) = sqlx::query_as(
        "SELECT event_type, status, source, secret_index, convert_from(raw_body, 'UTF8') FROM webhook_inbox
         WHERE event_id = 'evt_g_7'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let body = String::from_utf8(payment("evt_g_7")).unwrap();
    assert_eq!(row, ("payment_intent.succeeded".into(), "pending".into(), "webhook".into(), Some(0), body));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_same_key_twice_in_a_group_is_one_accepted_and_one_duplicate(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = grouped(opts, ONE_GROUP);
    let mut bodies: Vec<Vec<u8>> = (0..6).map(|i| payment(&format!("evt_k_{i}"))).collect();
    bodies.push(payment("evt_k_0"));
    bodies.push(payment("evt_k_3"));
    bodies.push(payment("evt_k_3"));
    let answers = post_together(&pool, &r, bodies).await;
    let statuses: Vec<&str> = answers
        .iter()
        .map(|(s, a, _)| {
            assert_eq!(*s, StatusCode::OK);
            a["status"].as_str().unwrap()
        })
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == "accepted").count(), 6, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == "duplicate").count(), 3, "{statuses:?}");
    assert_eq!(count(&pool).await, 6);
    assert_eq!(transactions(&pool).await, 1, "one group");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn fifty_identical_deliveries_on_four_committers_claim_once(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = grouped(opts, GroupConfig { max: 8, wait: Duration::from_millis(5), committers: 4, stall: Duration::ZERO });
    let answers = post_together(&pool, &r, vec![payment("evt_race"); 50]).await;
    let accepted = answers.iter().filter(|(s, a, v)| *s == StatusCode::OK && *v && a["status"] == "accepted").count();
    let duplicates =
        answers.iter().filter(|(s, a, v)| *s == StatusCode::OK && *v && a["status"] == "duplicate").count();
    assert_eq!((accepted, duplicates), (1, 49));
    assert_eq!(count(&pool).await, 1);
}

async fn post_one(r: &Receiver, id: &str) -> &'static str {
    let body = payment(id);
    let (status, answer) = post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!(status, StatusCode::OK, "{id}: {answer}");
    match answer["status"].as_str() {
        Some("accepted") => "accepted",
        Some("duplicate") => "duplicate",
        _ => panic!("{id}: {answer}"),
    }
}

/// Another writer of the same key (a second receiver, a reconcile) holds its
/// row lock, so one group waits for its commit (or `INBOX_LOCK_TIMEOUT_MS`,
/// then 503); the deliveries that arrive meanwhile, 8 in flight, are claimed
/// beside it by the second committer.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_group_stalled_on_another_writers_lock_holds_only_itself(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = grouped(opts, GroupConfig::default());
    let mut writer = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
         VALUES ('stripe', 'evt_held', 'payment_intent.succeeded', '{}', '\\x', 0)",
    )
    .execute(&mut *writer)
    .await
    .unwrap();
    let held = tokio::spawn({
        let r = r.clone();
        async move { post_one(&r, "evt_held").await }
    });
    let waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()";
    while scalar::<i64>(&pool, waiting).await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let flowing = async {
        for wave in 0..5 {
            let posts = (0..8).map(|i| {
                let r = r.clone();
                tokio::spawn(async move { post_one(&r, &format!("evt_flow_{wave}_{i}")).await })
            });
            for p in posts.collect::<Vec<_>>() {
                assert_eq!(p.await.unwrap(), "accepted");
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), flowing)
        .await
        .expect("the deliveries behind a stalled group waited for it");
    assert!(!held.is_finished(), "the stalled delivery was answered before the other writer committed");
    writer.commit().await.unwrap();
    assert_eq!(held.await.unwrap(), "duplicate", "the other writer's row came first");
    assert_eq!(count(&pool).await, 41);
}

/// While a group commits, the deliveries that arrive wait for it and go
/// together in the next (one commit for all), not one by one beside it.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn deliveries_that_arrive_while_a_group_commits_wait_for_it_and_go_together(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.event_id = 'evt_slow' THEN PERFORM pg_sleep(0.3); END IF; RETURN NEW; END $$;
         CREATE TRIGGER slow_claim BEFORE INSERT ON webhook_inbox FOR EACH ROW EXECUTE FUNCTION slow_claim();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let r = grouped(opts, GroupConfig { stall: Duration::from_secs(5), ..GroupConfig::default() });
    let slow = tokio::spawn({
        let r = r.clone();
        async move { post_one(&r, "evt_slow").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut arriving = Vec::new();
    for i in 0..10 {
        let r = r.clone();
        arriving.push(tokio::spawn(async move { post_one(&r, &format!("evt_after_{i}")).await }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for a in arriving {
        assert_eq!(a.await.unwrap(), "accepted");
    }
    assert_eq!(slow.await.unwrap(), "accepted");
    assert_eq!(transactions(&pool).await, 2, "the slow group, then one for the ten that arrived during it");
}

/// An outage is no refused value: every delivery of the group is answered 503, nothing acknowledged.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_group_the_database_cannot_take_answers_each_delivery_503(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = grouped(opts, ONE_GROUP);
    sqlx::query("ALTER TABLE webhook_inbox RENAME TO webhook_inbox_gone").execute(&pool).await.unwrap();
    let bodies = (0..5).map(|i| payment(&format!("evt_o_{i}"))).collect::<Vec<_>>();
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (r, barrier) = (r.clone(), barrier.clone());
            tokio::spawn(async move {
                let sig = stripe_header(STRIPE[0], &body);
                barrier.wait().await;
                post(&r, "stripe", &[("Stripe-Signature", &sig)], &body).await.0
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
