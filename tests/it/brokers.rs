//! The relay's broker sinks against the machine's real servers: NATS with
//! JetStream (127.0.0.1:4222) and RabbitMQ (127.0.0.1:5672), which the test
//! command starts where they are down. What the relay published is read back
//! with the brokers' own clients.

use std::{sync::Arc, time::Duration};

use inbox_tests::later;
use lapin::{
    options::{
        BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    },
    types::FieldTable,
    Connection, ConnectionProperties, ExchangeKind,
};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::{Destinations, Env},
    enqueue, App, Message, Relay, RelayConfig, Stage,
};

const NATS: &str = "nats://127.0.0.1:4222";
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A lease longer than any publish here: one that ran out mid-publish (a
/// loaded machine, 200 ms) let the relay take its own messages again and count
/// each twice.
fn config() -> RelayConfig {
    RelayConfig { batch_size: 100, retry_base: Duration::from_secs(60), lease: Duration::from_secs(30) }
}

/// A name no other test run uses (the brokers are shared).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}{}{nanos}", std::process::id())
}

async fn write(pool: &PgPool, destination: &str, aggregate_type: &str, n: usize) {
    let mut conn = pool.acquire().await.unwrap();
    for i in 0..n {
        let key = format!("{aggregate_type}-{i}");
        let m = Message::new(aggregate_type, &key, key.clone(), json!({"n": i})).to(destination);
        enqueue(&mut conn, &m).await.unwrap();
    }
}

async fn relay(pool: &PgPool, file: String, env: &[(&'static str, &'static str)]) -> Relay {
    let file: &'static str = Box::leak(file.into_boxed_str());
    let mut pairs = vec![("RELAY_DESTINATIONS", file)];
    pairs.extend_from_slice(env);
    let pairs: &'static [(&str, &str)] = Box::leak(pairs.into_boxed_slice());
    let destinations = Destinations::read(&Env::from_pairs(pairs)).unwrap().build(&App::default()).await.unwrap();
    Relay::new(pool.clone(), destinations, config())
}

async fn last_error(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT last_error FROM transactional_outbox WHERE last_error IS NOT NULL LIMIT 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn nats_jetstream_acknowledges_each_message_and_drops_a_resend_under_its_key(pool: PgPool) {
    let client = async_nats::connect(NATS).await.expect("NATS at 127.0.0.1:4222 (scripts/test starts it)");
    let js = async_nats::jetstream::new(client);
    let name = unique("INBOX");
    let subject = format!("inbox.{name}.events");
    let stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("inbox.{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut stream = stream;
    let file = format!("[destination.events]\nnats_subject = \"{subject}\"\n");
    let relay = relay(&pool, file, &[("RELAY_NATS_URL", NATS)]).await;
    assert!(relay.destinations().contains(&"events".to_string()));
    write(&pool, "events", "order", 20).await;
    // A relay that published the first five and died before recording them.
    let sink = webhook_inbox::sinks::NatsSink::connect(NATS, subject.clone()).await.unwrap();
    let lease = Duration::from_millis(300);
    crate::relay::killed_after_publishing(&pool, "events", Arc::new(sink), 5, lease).await;
    assert_eq!(stream.info().await.unwrap().state.messages, 5, "published, not recorded");
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.dead), (20, 0));
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 20, "JetStream dropped the five re-sent under the same Nats-Msg-Id");
    let mut keys = Vec::new();
    for seq in 1..=20 {
        let m = stream.get_raw_message(seq).await.unwrap();
        let body: Value = serde_json::from_slice(&m.payload).unwrap();
        let key = m.headers.get("Nats-Msg-Id").unwrap().as_str().to_string();
        assert_eq!(key, format!("order-{}", body["n"]));
        keys.push(key);
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 20);
    js.delete_stream(&name).await.unwrap();

    // No stream takes the subject: no responder, retried (never dead), with the reason.
    let file = format!("[destination.nowhere]\nnats_subject = \"inbox.{name}.unheard\"\ntimeout_ms = 2000\n");
    let lost = relay_of(&pool, file).await;
    write(&pool, "nowhere", "unheard", 1).await;
    let r = lost.run(later()).await.unwrap();
    assert_eq!((r.sent, r.retried, r.dead), (0, 1, 0), "{r:?}");
    assert!(last_error(&pool).await.contains("no stream found"), "{}", last_error(&pool).await);
}

async fn relay_of(pool: &PgPool, file: String) -> Relay {
    relay(pool, file, &[("RELAY_NATS_URL", NATS), ("RELAY_AMQP_URL", AMQP)]).await
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn rabbitmq_confirms_each_persistent_message_with_its_key_and_returns_an_unroutable_one(pool: PgPool) {
    let conn = Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (scripts/test starts it)");
    let ch = conn.create_channel().await.unwrap();
    let (exchange, queue) = (unique("inbox-x-"), unique("inbox-q-"));
    ch.exchange_declare(
        exchange.as_str().into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "invoice".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let file = format!("[destination.rabbit]\namqp_exchange = \"{exchange}\"\n");
    let relay = relay_of(&pool, file).await;
    write(&pool, "rabbit", "invoice", 15).await;
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.dead), (15, 0));
    let mut keys = Vec::new();
    while let Some(m) = ch.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap() {
        let props = &m.delivery.properties;
        assert_eq!(*props.delivery_mode(), Some(2), "persistent");
        let body: Value = serde_json::from_slice(&m.delivery.data).unwrap();
        let key = props.message_id().as_ref().unwrap().to_string();
        assert_eq!(key, format!("invoice-{}", body["n"]));
        keys.push(key);
    }
    assert_eq!(keys.len(), 15);

    // A routing key no queue is bound for: the broker returns it; retried, never silently dropped.
    write(&pool, "rabbit", "refund", 1).await;
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.retried, r.dead), (0, 1, 0));
    assert!(last_error(&pool).await.contains("no queue is bound"), "{}", last_error(&pool).await);
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await.unwrap();
}

/// A broker that is down: retried with the reason, the other destinations unaffected; credentials never shown.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_broker_that_is_down_is_retried_and_its_credentials_never_shown(pool: PgPool) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down: &'static str = Box::leak(format!("amqp://guest:s3cr3t-pw@127.0.0.1:{port}/%2f").into_boxed_str());
    let relay = relay(&pool, "[destination.rabbit]\namqp_exchange = \"x\"\n".into(), &[("RELAY_AMQP_URL", down)]).await;
    write(&pool, "rabbit", "invoice", 2).await;
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.retried, r.dead), (0, 2, 0));
    let error = last_error(&pool).await;
    assert!(error.contains("cannot connect to the AMQP broker") && !error.contains("s3cr3t"), "{error}");
    let listed = webhook_inbox::ops::destinations(&pool).await.unwrap();
    let target = listed[0].target.clone().unwrap();
    assert!(target.starts_with("amqp amqp://127.0.0.1:") && !target.contains("s3cr3t"), "{target}");
    let missing =
        Destinations::read(&Env::from_pairs(&[("RELAY_DESTINATIONS", "[destination.n]\nnats_subject = \"a\"\n")]));
    assert!(missing.unwrap_err().to_string().contains("[destination.n] nats_url_env: RELAY_NATS_URL is not set"));
}
