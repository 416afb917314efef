//! The relay's AWS sinks against moto: SQS (FIFO too), SNS, EventBridge;
//! a missing queue retried, a message too large for SQS dead and the others
//! sent; and an HTTP destination's redirect not followed, a 408 retried. (A late
//! result from an expired lease changing nothing is the outbox's own unit test.)

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use inbox_tests::later;
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    sinks::{EventBridgeSink, Sink, SnsSink, SqsSink},
    Stage,
};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

use crate::relay::{http_sink, killed_after_publishing, messages, relay, relay_once_each, row};

/// Every message in the queue, as (message_key attribute, body).
async fn drain_queue(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    expected: usize,
) -> Vec<(String, Value, std::collections::HashMap<String, String>)> {
    let mut out = Vec::new();
    for _ in 0..50 {
        let r = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap();
        for m in r.messages() {
            let key = m
                .message_attributes()
                .and_then(|a| a.get("message_key"))
                .and_then(|v| v.string_value())
                .unwrap_or("")
                .to_string();
            let attrs = m
                .attributes()
                .map(|a| a.iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect())
                .unwrap_or_default();
            out.push((key, serde_json::from_str(m.body().unwrap()).unwrap(), attrs));
        }
        if out.len() >= expected && r.messages().is_empty() {
            break;
        }
    }
    out
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn sqs_deliveries_land_in_the_queue_with_their_keys(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let url = sqs.create_queue().queue_name("outbox").send().await.unwrap().queue_url().unwrap().to_string();
    messages(&pool, 23).await;
    let sink: Arc<dyn Sink> = Arc::new(SqsSink::new(sqs.clone(), &url));
    let r = relay(&pool, sink).run(Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((r.sent, r.dead), (23, 0), "three SendMessageBatch calls of at most 10");
    let got = drain_queue(&sqs, &url, 23).await;
    let keys: HashSet<String> = got.iter().map(|(k, _, _)| k.clone()).collect();
    assert_eq!(keys, (0..23).map(|i| format!("payment_succeeded:pi_{i}")).collect::<HashSet<_>>());
    assert!(got.iter().all(|(k, body, _)| k == &format!("payment_succeeded:{}", body["payment_id"].as_str().unwrap())));
}

/// An SNS topic (an alert's channel on AWS, or any destination's): each
/// message published once, its key an attribute, as a queue subscribed to the
/// topic (raw delivery) receives it; a topic that does not exist is retried.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn sns_deliveries_reach_the_topic_s_subscribers_with_their_keys(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let aws = moto.aws().await;
    let (sns, sqs) = (aws_sdk_sns::Client::new(&aws), aws_sdk_sqs::Client::new(&aws));
    let topic = sns.create_topic().name("alerts").send().await.unwrap().topic_arn().unwrap().to_string();
    let url = sqs.create_queue().queue_name("on-call").send().await.unwrap().queue_url().unwrap().to_string();
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();
    messages(&pool, 23).await;
    let r = relay(&pool, Arc::new(SnsSink::new(sns.clone(), &topic))).run(later()).await.unwrap();
    assert_eq!((r.sent, r.dead), (23, 0), "three PublishBatch calls of at most 10");
    let got = drain_queue(&sqs, &url, 23).await;
    let keys: HashSet<String> = got.iter().map(|(k, _, _)| k.clone()).collect();
    assert_eq!(keys, (0..23).map(|i| format!("payment_succeeded:pi_{i}")).collect::<HashSet<_>>());
    assert_eq!(got.len(), 23, "each once");

    sqlx::query("INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key) VALUES ('p', '1', '{}', 'late')")
        .execute(&pool)
        .await
        .unwrap();
    let gone = format!("{topic}-gone");
    let r = relay_once_each(&pool, Arc::new(SnsSink::new(sns, gone))).run_once(later()).await.unwrap();
    assert_eq!((r.sent, r.retried + r.dead), (0, 1), "a topic that does not exist takes nothing");
    let error: String = sqlx::query_scalar("SELECT last_error FROM transactional_outbox WHERE message_key = 'late'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(error.contains("SNS"), "{error}");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_fifo_queue_gets_the_key_as_deduplication_id_and_drops_a_resend(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let url = sqs
        .create_queue()
        .queue_name("outbox.fifo")
        .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    messages(&pool, 3).await;
    let sink: Arc<dyn Sink> = Arc::new(SqsSink::new(sqs.clone(), &url));
    // A relay that published and died before marking: the same messages go out twice.
    let lease = Duration::from_millis(300);
    killed_after_publishing(&pool, "default", sink.clone(), 3, lease).await;
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let r = relay(&pool, sink).run_once(later()).await.unwrap();
    assert_eq!(r.sent, 3);
    let got = drain_queue(&sqs, &url, 3).await;
    assert_eq!(got.len(), 3, "the FIFO queue deduplicated the re-send on the message key");
    for (key, body, attrs) in &got {
        assert_eq!(attrs.get("MessageDeduplicationId"), Some(key));
        assert_eq!(
            attrs.get("MessageGroupId").map(String::as_str),
            body["payment_id"].as_str(),
            "grouped by aggregate id"
        );
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_missing_queue_is_retried_not_lost(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    messages(&pool, 2).await;
    let sink: Arc<dyn Sink> = Arc::new(SqsSink::new(sqs, format!("{}/123456789012/no-such-queue", moto.url)));
    let r = relay_once_each(&pool, sink).run_once(later()).await.unwrap();
    assert_eq!((r.sent, r.retried), (0, 2));
    let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL AND dead_at IS NULL AND last_error LIKE 'SQS%'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unsent, 2);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn eventbridge_deliveries_reach_a_rule_target_with_their_keys(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let aws = moto.aws().await;
    let (sqs, eb) = (aws_sdk_sqs::Client::new(&aws), aws_sdk_eventbridge::Client::new(&aws));
    let url = sqs.create_queue().queue_name("bus-target").send().await.unwrap().queue_url().unwrap().to_string();
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    eb.create_event_bus().name("inbox-bus").send().await.unwrap();
    eb.put_rule()
        .name("all-outbox")
        .event_bus_name("inbox-bus")
        .event_pattern(r#"{"source":["webhook-inbox"]}"#)
        .send()
        .await
        .unwrap();
    eb.put_targets()
        .rule("all-outbox")
        .event_bus_name("inbox-bus")
        .targets(aws_sdk_eventbridge::types::Target::builder().id("q").arn(arn).build().unwrap())
        .send()
        .await
        .unwrap();
    messages(&pool, 12).await;
    let sink: Arc<dyn Sink> = Arc::new(EventBridgeSink::new(eb, "inbox-bus"));
    let r = relay(&pool, sink).run(Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((r.sent, r.dead), (12, 0));
    let got = drain_queue(&sqs, &url, 12).await;
    let keys: HashSet<String> =
        got.iter().map(|(_, event, _)| event["detail"]["message_key"].as_str().unwrap().to_string()).collect();
    assert_eq!(keys, (0..12).map(|i| format!("payment_succeeded:pi_{i}")).collect::<HashSet<_>>());
    assert!(got
        .iter()
        .all(|(_, event, _)| event["detail-type"] == "payment_succeeded" && event["source"] == "webhook-inbox"));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_redirect_is_not_followed_and_not_counted_as_delivered(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hook"))
        .respond_with(ResponseTemplate::new(302).insert_header("Location", "/elsewhere"))
        .mount(&server)
        .await;
    Mock::given(method("GET")).and(path("/elsewhere")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    messages(&pool, 1).await;
    let r = relay(&pool, http_sink(&server)).run_once(later()).await.unwrap();
    assert_eq!((r.sent, r.dead), (0, 1));
    assert!(row(&pool).await.3.unwrap().starts_with("HTTP 302"));
    assert_eq!(server.received_requests().await.unwrap().len(), 1, "the redirect was not followed");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_408_is_retried(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(408)).mount(&server).await;
    messages(&pool, 1).await;
    let r = relay_once_each(&pool, http_sink(&server)).run_once(later()).await.unwrap();
    assert_eq!((r.retried, r.dead), (1, 0));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_message_too_large_for_sqs_is_dead_and_the_others_go(pool: PgPool) {
    let moto = inbox_tests::Moto::start();
    let sqs = aws_sdk_sqs::Client::new(&moto.aws().await);
    let url = sqs.create_queue().queue_name("sized").send().await.unwrap().queue_url().unwrap().to_string();
    messages(&pool, 2).await;
    sqlx::query("INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key) VALUES ('blob', 'b', $1, 'blob:1')")
        .bind(json!({"data": "x".repeat(300 * 1024)}))
        .execute(&pool)
        .await
        .unwrap();
    // Twelve 100 KiB messages: more than fit in one call by size, fewer than ten a call.
    for i in 0..12 {
        sqlx::query("INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key) VALUES ('blob', 'b', $1, $2)")
            .bind(json!({"data": "y".repeat(100 * 1024)}))
            .bind(format!("medium:{i}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let sink: Arc<dyn Sink> = Arc::new(SqsSink::new(sqs.clone(), &url));
    let r = relay(&pool, sink).run_once(later()).await.unwrap();
    assert_eq!((r.sent, r.dead, r.retried), (14, 1, 0));
    let reason: String = sqlx::query_scalar("SELECT last_error FROM transactional_outbox WHERE message_key = 'blob:1'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(reason.contains("over the service's limit"), "{reason}");
    assert_eq!(drain_queue(&sqs, &url, 14).await.len(), 14);
}
