//! The `process` binary on an SQS batch, driven through a stand-in Lambda
//! Runtime API as Lambda would: each message names one event; only the
//! messages that must come back (unreadable, or a transient failure to retry)
//! are reported as failures, never the whole batch for one message.

use std::time::Duration;

use inbox_tests::lambda::{database_url, logs, result, runtime_api, spawn_function};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::Provider;

/// An SQS event of one record per `(message id, body)`, as AWS documents it.
fn sqs_event(bodies: &[(&str, &str)]) -> Value {
    let records: Vec<Value> = bodies
        .iter()
        .map(|(id, body)| {
            let mut record = inbox_tests::fixture("sqs-record.json");
            record["messageId"] = json!(id);
            record["body"] = json!(body);
            record
        })
        .collect();
    json!({ "Records": records })
}

fn payment_event(event_id: &str, pi: &str, amount: i64) -> Value {
    json!({"id": event_id, "type": "payment_intent.succeeded",
           "data": {"object": {"id": pi, "amount_received": amount, "currency": "usd", "customer": "cus_1"}}})
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_sqs_path_reports_only_the_failed_messages(pool: PgPool) {
    let payment = payment_event("evt_ok", "pi_ok", 700).to_string();
    inbox_tests::store(&pool, Provider::STRIPE, "evt_ok", "payment_intent.succeeded", &payment).await;
    let deposit =
        json!({"token": "dep_9", "type": "gpa.credit", "state": "COMPLETION", "user_token": "nobody", "amount": 1});
    inbox_tests::store(&pool, Provider::MARQETA, "transactions:dep_9", "transactions:gpa.credit", &deposit.to_string())
        .await;
    let event = sqs_event(&[
        // As receive writes it (functions/receive/tests/process_queue.rs): the payment lands.
        ("m-ok", r#"{"event_id":"evt_ok","provider":"stripe"}"#),
        // The stock handler retries a deposit for an account it does not know yet.
        ("m-retry", r#"{"provider":"marqeta","event_id":"transactions:dep_9"}"#),
        ("m-garbage", "not json"),
        ("m-unknown", r#"{"provider":"stripe","event_id":"evt_never_received"}"#),
    ]);
    let api = runtime_api("process", event).await;
    let child =
        spawn_function(env!("CARGO_BIN_EXE_process"), "process", &api, &[("DATABASE_URL", database_url(&pool))]);
    let answered = result(&api, "req-1", Duration::from_secs(30)).await;
    let logs = logs(child);
    let response = match answered {
        Some(Ok(response)) => response,
        other => panic!("the invocation was not answered with a result: {other:?}; logs:\n{logs}"),
    };
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": "m-retry"}, {"itemIdentifier": "m-garbage"}]})
    );
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(payments, 1);
}
