//! The `prune` binary, driven through a stand-in Lambda Runtime API, as the
//! schedule invokes it: one invocation deletes what is past its retention,
//! answers its counts, and leaves the rest.

use std::time::Duration;

use inbox_tests::lambda::{answered, database_url, logs, runtime_api, spawn_function};
use serde_json::{json, Value};
use sqlx::PgPool;

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_invocation_prunes_what_is_past_its_retention_and_answers_the_counts(pool: PgPool) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, received_at, processed_at, raw_body, secret_index)
         SELECT 'stripe', 'evt_' || i, 'charge.refunded', '{}', 'done',
                now() - make_interval(days => CASE WHEN i <= 25 THEN 90 ELSE 1 END), now(), '{}', 0
         FROM generate_series(1, 30) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let api = runtime_api("prune", json!({"source": "aws.events"})).await;
    let url = database_url(&pool);
    let child = spawn_function(env!("CARGO_BIN_EXE_prune"), "prune", &api, &[("DATABASE_URL", url)]);
    let done = answered(&api, Duration::from_secs(30)).await;
    let logs = logs(child);
    assert!(done, "no answer; logs:\n{logs}");
    let requests = api.received_requests().await.unwrap();
    let answer = requests.iter().find(|r| r.url.path().ends_with("/req-1/response")).unwrap();
    let counts: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(counts["done"], 25, "{counts}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(left, 5, "the young rows stay");
    assert!(logs.contains("\"pruned\""), "its metrics line: {logs}");
}
