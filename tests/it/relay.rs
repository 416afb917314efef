//! The relay against a real PostgreSQL and a real local HTTP server (wiremock).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use inbox_tests::later;
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    db::outbox,
    relay::aws::{EventBridgeSink, SnsSink, SqsSink},
    relay::{Destination, DestinationLimits, HttpSink, Relay, RelayConfig, Sink},
    runtime::stage::Stage,
};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

fn config() -> RelayConfig {
    RelayConfig { batch_size: 100, retry_base: Duration::from_millis(1), lease: Duration::from_secs(60) }
}

fn limits() -> DestinationLimits {
    DestinationLimits { concurrency: 8, max_attempts: 5, ..DestinationLimits::default() }
}

/// A relay to `sink` as the `default` destination.
fn relay(pool: &PgPool, sink: Arc<dyn Sink>) -> Relay {
    relay_with(pool, sink, limits())
}

/// A relay to `sink` whose retries wait a minute: a run tries each message once.
fn relay_once_each(pool: &PgPool, sink: Arc<dyn Sink>) -> Relay {
    let config = RelayConfig { retry_base: Duration::from_secs(60), ..config() };
    Relay::new(pool.clone(), vec![Destination::shared("default", sink).with_limits(limits())], config)
}

fn relay_with(pool: &PgPool, sink: Arc<dyn Sink>, limits: DestinationLimits) -> Relay {
    Relay::new(pool.clone(), vec![Destination::shared("default", sink).with_limits(limits)], config())
}

fn http_sink(server: &MockServer) -> Arc<dyn Sink> {
    Arc::new(HttpSink::new(format!("{}/hook", server.uri()), Duration::from_secs(5)).unwrap())
}

async fn messages(pool: &PgPool, n: usize) {
    for i in 0..n {
        sqlx::query("INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key) VALUES ('payment', $1, $2, $3)")
            .bind(format!("pi_{i}"))
            .bind(json!({"event": "payment_succeeded", "payment_id": format!("pi_{i}")}))
            .bind(format!("payment_succeeded:pi_{i}"))
            .execute(pool)
            .await
            .unwrap();
    }
}

fn key(r: &Request) -> String {
    r.headers.get("idempotency-key").expect("every request carries its key").to_str().unwrap().to_string()
}

async fn row(pool: &PgPool) -> (i32, bool, bool, Option<String>) {
    sqlx::query_as(
        "SELECT attempts, processed_at IS NOT NULL, dead_at IS NOT NULL, last_error FROM transactional_outbox",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn every_message_reaches_the_http_sink_with_its_key(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/hook")).respond_with(ResponseTemplate::new(204)).mount(&server).await;
    messages(&pool, 250).await;
    let relay = relay(&pool, http_sink(&server));
    let r = relay.run(Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((r.sent, r.retried, r.dead), (250, 0, 0));

    let requests = server.received_requests().await.unwrap();
    let keys: HashSet<String> = requests.iter().map(key).collect();
    assert_eq!(keys, (0..250).map(|i| format!("payment_succeeded:pi_{i}")).collect::<HashSet<_>>());
    for r in &requests {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            format!("payment_succeeded:{}", body["payment_id"].as_str().unwrap()),
            key(r),
            "the payload is the message's"
        );
        assert_eq!(r.headers.get("content-type").unwrap(), "application/json");
    }
    let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_sink_that_fails_twice_then_succeeds_gets_the_message_on_the_third_attempt(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).with_priority(2).mount(&server).await;
    messages(&pool, 1).await;
    let relay = relay(&pool, http_sink(&server));
    for _ in 0..200 {
        relay.run_once(later()).await.unwrap();
        if row(&pool).await.1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (attempts, sent, dead, _) = row(&pool).await;
    assert_eq!((attempts, sent, dead), (3, true, false));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| key(r) == "payment_succeeded:pi_0"), "every attempt carries the same key");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn retry_after_is_honoured(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "30"))
        .mount(&server)
        .await;
    messages(&pool, 1).await;
    let r = relay(&pool, http_sink(&server)).run_once(later()).await.unwrap();
    assert_eq!(r.retried, 1);
    let wait: f64 =
        sqlx::query_scalar("SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM transactional_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!((28.0..=31.0).contains(&wait), "next attempt in {wait} s");
    assert!(row(&pool).await.3.unwrap().starts_with("HTTP 429"));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn another_4xx_is_dead_with_its_status_and_a_capped_body(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(422).set_body_string("x".repeat(2000)))
        .mount(&server)
        .await;
    messages(&pool, 1).await;
    let r = relay(&pool, http_sink(&server)).run_once(later()).await.unwrap();
    assert_eq!(r.dead, 1);
    let (attempts, sent, dead, reason) = row(&pool).await;
    assert_eq!((attempts, sent, dead), (1, false, true));
    assert_eq!(reason.unwrap(), format!("HTTP 422: {}", "x".repeat(500)));
    assert_eq!(relay(&pool, http_sink(&server)).run_once(later()).await.unwrap().leased, 0, "dead stays dead");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_sink_that_keeps_failing_leaves_the_message_dead_after_its_attempts(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(500)).mount(&server).await;
    messages(&pool, 1).await;
    let relay = relay(&pool, http_sink(&server));
    for _ in 0..200 {
        relay.run_once(later()).await.unwrap();
        if row(&pool).await.2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (attempts, _, dead, reason) = row(&pool).await;
    assert_eq!((attempts, dead), (5, true));
    assert!(reason.unwrap().starts_with("after 5 attempts: HTTP 500"));
}

/// The relay publishes, then dies before it marks the messages: once the lease
/// runs out, they go out again, under the same keys, and are marked once.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_relay_killed_after_publishing_resends_with_the_same_key(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    messages(&pool, 3).await;
    let http = HttpSink::new(format!("{}/hook", server.uri()), Duration::from_secs(5)).unwrap();
    let leased = outbox::lease_unsent(&pool, "default", 10, Duration::from_millis(50), None).await.unwrap();
    http.deliver(&leased).await; // published; the crash comes before record_results
    let sink: Arc<dyn Sink> = Arc::new(http);
    assert_eq!(relay(&pool, sink.clone()).run_once(later()).await.unwrap().leased, 0, "leased, not re-sent yet");
    tokio::time::sleep(Duration::from_millis(80)).await;
    let r = relay(&pool, sink).run_once(later()).await.unwrap();
    assert_eq!(r.sent, 3);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 6);
    for i in 0..3 {
        let k = format!("payment_succeeded:pi_{i}");
        assert_eq!(
            requests.iter().filter(|r| key(r) == k).count(),
            2,
            "sent twice under one key, for the consumer to dedupe"
        );
    }
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE processed_at IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sent, 3);
}

// ---------- SQS and EventBridge, against moto ----------

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
    let sink = SqsSink::new(sqs.clone(), &url);
    // A relay that published and died before marking: the same messages go out twice.
    let leased = outbox::lease_unsent(&pool, "default", 10, Duration::from_millis(10), None).await.unwrap();
    assert!(sink.deliver(&leased).await.iter().all(|d| *d == webhook_inbox::relay::SinkReply::Delivered));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let r = relay(&pool, Arc::new(sink)).run_once(later()).await.unwrap();
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

/// A relay whose lease ran out while it worked, and whose messages another relay
/// has since sent, cannot undo that with its late result.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_late_result_from_an_expired_lease_changes_nothing(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    messages(&pool, 1).await;
    let slow = outbox::lease_unsent(&pool, "default", 10, Duration::from_millis(10), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(relay(&pool, http_sink(&server)).run_once(later()).await.unwrap().sent, 1);
    let late = [(slow[0].id, slow[0].attempts, outbox::Dispatch::Dead("HTTP 500 after the lease ran out".into()))];
    outbox::record_results(&pool, &late).await.unwrap();
    let (attempts, sent, dead, error) = row(&pool).await;
    assert_eq!((attempts, sent, dead, error), (2, true, false, None));
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

// ---------- slow sinks and the Lambda deadline ----------

async fn slow_sink_server(delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hook"))
        .respond_with(ResponseTemplate::new(204).set_delay(delay))
        .mount(&server)
        .await;
    server
}

async fn outbox_state(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE processed_at IS NOT NULL),
                count(*) FILTER (WHERE processed_at IS NULL AND attempts = 0 AND next_attempt_at IS NULL),
                count(*)
         FROM transactional_outbox",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The Lambda is killed at its timeout, wherever the relay is: the chunks that
/// were answered before are recorded, not sent again.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_relay_killed_mid_batch_has_recorded_every_chunk_answered_before(pool: PgPool) {
    let server = slow_sink_server(Duration::from_millis(1000)).await;
    messages(&pool, 20).await;
    let sink: Arc<dyn Sink> =
        Arc::new(HttpSink::new(format!("{}/hook", server.uri()), Duration::from_secs(5)).unwrap());
    let relay = relay_with(&pool, sink, DestinationLimits { concurrency: 2, ..limits() });
    let killed = tokio::time::timeout(Duration::from_millis(2500), relay.run(later())).await;
    assert!(killed.is_err(), "the run was cut off mid-batch");
    let (sent, _, _) = outbox_state(&pool).await;
    assert!(sent >= 2, "the chunks answered before the kill are recorded: {sent}");
    let requests = server.received_requests().await.unwrap().len() as i64;
    assert!(requests - sent <= 2, "at most the chunk in flight is unrecorded: {requests} sent, {sent} recorded");
}

/// A delivery starts only if the destination's timeout fits before the
/// deadline; what was leased but not started is released at once, with no
/// attempt spent.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_relay_starts_no_chunk_it_cannot_finish_before_its_deadline(pool: PgPool) {
    let server = slow_sink_server(Duration::from_millis(700)).await;
    messages(&pool, 40).await;
    let sink: Arc<dyn Sink> =
        Arc::new(HttpSink::new(format!("{}/hook", server.uri()), Duration::from_millis(1500)).unwrap());
    let slow =
        relay_with(&pool, sink, DestinationLimits { concurrency: 4, timeout: Duration::from_millis(1500), ..limits() });
    let started = Instant::now();
    let deadline = started + Duration::from_millis(3500);
    let relayed = slow.run(deadline).await.unwrap();
    assert!(Instant::now() <= deadline, "the run ended {:?} after its deadline", Instant::now() - deadline);
    let (sent, released, total) = outbox_state(&pool).await;
    assert_eq!(total, 40);
    assert!((4..=12).contains(&sent), "{sent} sent");
    assert_eq!(sent + released, 40, "the rest are released untouched, due at once");
    assert_eq!((relayed.sent as i64, relayed.released as i64), (sent, released));
    // The next run takes the released messages at once.
    let fast = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(204)).mount(&fast).await;
    let next = relay(&pool, http_sink(&fast)).run(later()).await.unwrap();
    assert_eq!(next.sent as i64, released);
}

/// A message a handler writes with `Event::enqueue` is that event's: its page
/// lists it, waiting, then sent. A twin event (the same message key) finds it
/// written and lists nothing of its own; a message written outside a handler
/// belongs to no event.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_event_lists_the_messages_its_handler_wrote_and_their_state(pool: PgPool) {
    use webhook_inbox::{
        enqueue, ops::event_messages, Event, HandlerError, Handlers, Message, Outcome, PgConnection, Provider, Worker,
        WorkerConfig,
    };
    async fn notify(conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let invoice = event.payload["invoice"].as_str().unwrap_or_default();
        let message = Message::new("invoice", invoice, format!("receipt:{invoice}"), json!({"invoice": invoice}));
        Ok(if event.enqueue(conn, &message).await? { Outcome::Applied } else { Outcome::NoEffect })
    }
    for (id, invoice) in [("evt_1", "in_1"), ("evt_twin", "in_1"), ("evt_2", "in_2")] {
        inbox_tests::store(&pool, Provider::STRIPE, id, "invoice.paid", &json!({"invoice": invoice}).to_string()).await;
    }
    let mut conn = pool.acquire().await.unwrap();
    let loose = Message::new("x", "1", "loose", json!({}));
    assert!(enqueue(&mut conn, &loose).await.unwrap());
    drop(conn);
    let handlers = Handlers::new().on("stripe", "invoice.paid", notify).unwrap();
    let one_at_a_time = WorkerConfig { batch_size: 1, ..WorkerConfig::default() }; // evt_1 before its twin
    Worker::new(pool.clone(), handlers, one_at_a_time).run(later()).await.unwrap();

    let keys = |id: &'static str| {
        let pool = pool.clone();
        async move {
            let messages = event_messages(&pool, "stripe", id).await.unwrap();
            messages.into_iter().map(|m| (m.message_key, m.sent_at.is_some())).collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("evt_1").await, [("receipt:in_1".to_string(), false)]);
    assert_eq!(keys("evt_twin").await, []);
    assert_eq!(keys("evt_2").await, [("receipt:in_2".to_string(), false)]);
    let linked: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE event_id IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(linked, 1, "only the loose message is no event's");

    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/hook")).respond_with(ResponseTemplate::new(204)).mount(&server).await;
    relay(&pool, http_sink(&server)).run(later()).await.unwrap();
    assert_eq!(keys("evt_1").await, [("receipt:in_1".to_string(), true)]);
}

/// The connection dies after the statement recording the deliveries reached the
/// server and committed: the relay runs it again on another connection, so the
/// pass still ends well, and nothing is sent twice.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_connection_cut_after_the_record_commits_costs_no_pass_and_no_resend(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/hook")).respond_with(ResponseTemplate::new(204)).mount(&server).await;
    messages(&pool, 20).await;
    let proxy = inbox_tests::cut::CutOnce::start(&pool, "SET processed_at").await;
    let r = relay(&proxy.pool, http_sink(&server)).run_once(later()).await;
    assert_eq!(proxy.cut(), 1, "the record's connection was cut");
    let r = r.expect("the pass ends well: the record ran again");
    assert_eq!(r.sent, 20);
    assert_eq!(server.received_requests().await.unwrap().len(), 20, "nothing was sent twice");
    assert_eq!(outbox_state(&pool).await, (20, 0, 20));
}
