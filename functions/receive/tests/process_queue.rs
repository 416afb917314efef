//! The `receive` binary with `INBOX_PROCESS_QUEUE_URL` (moto's SQS), driven
//! through a stand-in Lambda Runtime API: after the commit, one message per
//! new pending event, which the `process` function's SQS path then processes
//! at once (`functions/process/tests/sqs.rs` takes a message written so). A
//! duplicate sends nothing; a queue that is gone costs the sender nothing
//! (still 200, the row stored, left to the schedule).

use std::time::Duration;

use inbox_tests::{
    apigw_v2_answer, apigw_v2_event,
    lambda::{database_url, logs, result, runtime_api_each, spawn_function},
    marqeta_basic, stripe_header, Moto, MARQETA_PASSWORDS, MARQETA_USER, STRIPE,
};
use serde_json::{json, Value};
use sqlx::PgPool;

/// Runs the binary on `deliveries` in turn (API Gateway events), telling
/// `queue`; each answer's status and JSON body.
async fn receive(pool: &PgPool, moto: &Moto, queue: &str, deliveries: Vec<Value>) -> Vec<(u16, Value)> {
    let n = deliveries.len();
    let api = runtime_api_each("receive", deliveries).await;
    let vars = [
        ("DATABASE_URL", database_url(pool)),
        ("STRIPE_WEBHOOK_SECRET", STRIPE[0].to_string()),
        ("MARQETA_WEBHOOK_USERNAME", MARQETA_USER.to_string()),
        ("MARQETA_WEBHOOK_PASSWORD", MARQETA_PASSWORDS[0].to_string()),
        ("INBOX_PROCESS_QUEUE_URL", queue.to_string()),
        ("AWS_ENDPOINT_URL", moto.url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ];
    let child = spawn_function(env!("CARGO_BIN_EXE_receive"), "receive", &api, &vars);
    let mut answers = Vec::new();
    for i in 1..=n {
        answers.push(result(&api, &format!("req-{i}"), Duration::from_secs(30)).await);
    }
    let logs = logs(child);
    answers
        .into_iter()
        .map(|a| match a {
            Some(Ok(answer)) => {
                let (status, body) = apigw_v2_answer(&answer);
                (status.as_u16(), body)
            }
            other => panic!("a delivery not answered: {other:?}; logs:\n{logs}"),
        })
        .collect()
}

fn payment(event_id: &str, pi: &str, amount: i64) -> Value {
    let body = json!({"id": event_id, "type": "payment_intent.succeeded",
        "data": {"object": {"id": pi, "amount_received": amount, "currency": "usd", "customer": "cus_1"}}})
    .to_string();
    apigw_v2_event("stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], body.as_bytes()))], body.as_bytes())
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn receive_tells_the_process_queue_of_new_events_after_the_commit(pool: PgPool) {
    let moto = Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let url = sqs.create_queue().queue_name("process").send().await.unwrap().queue_url().unwrap().to_string();

    let stripe = payment("evt_q", "pi_q", 1200);
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let batch = br#"{"transactions":[{"token":"q1","type":"authorization"},{"token":"q2","type":"authorization"}]}"#;
    let marqeta = apigw_v2_event("marqeta", &[("Authorization", &auth)], batch);
    let answers = receive(&pool, &moto, &url, vec![stripe.clone(), stripe, marqeta]).await;
    assert_eq!(answers[0], (200, json!({"status": "accepted"})));
    assert_eq!(answers[1], (200, json!({"status": "duplicate"})));
    assert_eq!(answers[2].0, 200, "{:?}", answers[2]);

    let received = sqs.receive_message().queue_url(&url).max_number_of_messages(10).send().await.unwrap();
    let mut bodies: Vec<String> = received.messages().iter().filter_map(|m| m.body().map(String::from)).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [
            r#"{"event_id":"evt_q","provider":"stripe"}"#,
            r#"{"event_id":"transactions:q1","provider":"marqeta"}"#,
            r#"{"event_id":"transactions:q2","provider":"marqeta"}"#,
        ],
        "one message per new event; the duplicate sent none"
    );

    let gone = format!("{}/123456789012/no-such-queue", moto.url);
    let answers = receive(&pool, &moto, &gone, vec![payment("evt_lost", "pi_lost", 5)]).await;
    assert_eq!(answers[0].0, 200, "{:?}", answers[0]);
    let status: String = sqlx::query_scalar("SELECT status FROM webhook_inbox WHERE event_id = 'evt_lost'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "pending");
}
