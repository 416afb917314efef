//! The `relay` binary, driven through a stand-in Lambda Runtime API as its
//! SQS trigger invokes it (`process` told the relay's queue): the invocation
//! runs a pass and the waiting messages reach their destination.

use std::time::Duration;

use inbox_tests::lambda::{answered, database_url, logs, runtime_api, spawn_function};
use serde_json::json;
use sqlx::PgPool;
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_sqs_nudge_runs_a_pass_and_the_messages_reach_their_destination(pool: PgPool) {
    let sink = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&sink).await;
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination)
         SELECT 'invoice', i::text, '{}', 'receipt:' || i, 'email' FROM generate_series(1, 3) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let url = database_url(&pool);
    let nudge = json!({"Records": [{"messageId": "m-1", "receiptHandle": "h", "body": "{}",
        "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:relay", "awsRegion": "us-east-1",
        "attributes": {}, "messageAttributes": {}, "md5OfBody": ""}]});
    let api = runtime_api("relay", nudge).await;
    let destinations = format!("[destination.email]\nurl = \"{}/mail\"\n", sink.uri());
    let child = spawn_function(
        env!("CARGO_BIN_EXE_relay"),
        "relay",
        &api,
        &[("DATABASE_URL", url), ("RELAY_DESTINATIONS", destinations)],
    );
    let done = answered(&api, Duration::from_secs(30)).await;
    let logs = logs(child);
    assert!(done, "no answer; logs:\n{logs}");
    assert_eq!(sink.received_requests().await.unwrap().len(), 3, "{logs}");
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE processed_at IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sent, 3);
    assert!(logs.contains("\"relayed\":3"), "its metrics line: {logs}");
}
