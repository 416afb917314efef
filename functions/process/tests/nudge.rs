//! The `process` binary, driven through a stand-in Lambda Runtime API, tells
//! the relay's queue (moto's SQS) after an invocation whose handlers wrote
//! outbox messages, once; after one that wrote none, nothing.

use std::time::Duration;

use inbox_tests::lambda::{answered, database_url, logs, runtime_api, spawn_function};
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::Provider;

async fn invoke(pool: &PgPool, moto: &inbox_tests::Moto, queue: &str) -> String {
    let url = database_url(pool);
    let api = runtime_api("process", json!({"source": "aws.events"})).await;
    let vars = [
        ("DATABASE_URL", url),
        ("INBOX_RELAY_QUEUE_URL", queue.to_string()),
        ("AWS_ENDPOINT_URL", moto.url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ];
    let child = spawn_function(env!("CARGO_BIN_EXE_process"), "process", &api, &vars);
    let done = answered(&api, Duration::from_secs(30)).await;
    let logs = logs(child);
    assert!(done, "no answer; logs:\n{logs}");
    logs
}

async fn waiting(sqs: &aws_sdk_sqs::Client, queue: &str) -> usize {
    let got = sqs.receive_message().queue_url(queue).max_number_of_messages(10).send().await.unwrap();
    got.messages().len()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_invocation_that_wrote_outbox_messages_tells_the_relay_queue_once(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let queue = sqs.create_queue().queue_name("relay").send().await.unwrap().queue_url().unwrap().to_string();

    // An event no handler writes a message for: no nudge.
    inbox_tests::store(&pool, Provider::STRIPE, "evt_quiet", "charge.updated", "{}").await;
    invoke(&pool, &moto, &queue).await;
    assert_eq!(waiting(&sqs, &queue).await, 0, "nothing written, nothing told");

    // Two payments: their handler writes two messages; the relay is told once.
    for (event, pi) in [("evt_1", "pi_1"), ("evt_2", "pi_2")] {
        let payload = json!({"id": event, "type": "payment_intent.succeeded",
            "data": {"object": {"id": pi, "amount_received": 500, "currency": "eur"}}});
        inbox_tests::store(&pool, Provider::STRIPE, event, "payment_intent.succeeded", &payload.to_string()).await;
    }
    let logs = invoke(&pool, &moto, &queue).await;
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox").fetch_one(&pool).await.unwrap();
    assert_eq!(written, 2, "{logs}");
    assert_eq!(waiting(&sqs, &queue).await, 1, "one nudge per invocation; logs:\n{logs}");
}
