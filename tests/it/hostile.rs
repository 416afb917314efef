//! Validly signed hostile input against a real PostgreSQL: whatever a signed
//! delivery holds, it ends `done` or `failed` with a reason, gets a definite
//! answer, and never holds back another event.

use std::time::Duration;

use http::StatusCode;
use inbox_tests::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{Event, Handler, HandlerError, Handlers, Outcome, Receiver, Stage, Worker, WorkerConfig};
use webhook_inbox_schemes::Provider;

pub(crate) fn worker(pool: &PgPool) -> Worker {
    Worker::new(pool.clone(), stock::handlers(), fast_worker_config())
}

pub(crate) fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A Stripe payment event whose `data.object.metadata` is `hostile` (raw JSON text).
pub(crate) fn payment_with(event_id: &str, pi: &str, hostile: &str) -> String {
    format!(
        r#"{{"id":"{event_id}","type":"payment_intent.succeeded","data":{{"object":{{"id":"{pi}","amount_received":100,"currency":"usd","metadata":{hostile}}}}}}}"#
    )
}

pub(crate) fn payment(event_id: &str, pi: &str) -> String {
    payment_with(event_id, pi, "{}")
}

async fn rows(pool: &PgPool) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as("SELECT event_id, status, failure_reason FROM webhook_inbox ORDER BY event_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Stores a pending Stripe payment as receive would have before today's payload check.
async fn stored_unchecked(pool: &PgPool, event_id: &str, body: &str) {
    store(pool, Provider::STRIPE, event_id, "payment_intent.succeeded", body).await;
}

// ---------- 1. payloads jsonb takes but Value cannot hold ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_pending_payload_the_worker_cannot_decode_fails_alone_and_the_queue_flows(pool: PgPool) {
    // Oldest first: the hostile rows head the queue.
    stored_unchecked(&pool, "evt_a_deep", &payment_with("evt_a_deep", "pi_deep", &nested(200))).await;
    stored_unchecked(&pool, "evt_b_huge", &payment_with("evt_b_huge", "pi_huge", r#"{"n":1e400}"#)).await;
    for i in 0..5 {
        stored_unchecked(&pool, &format!("evt_ok_{i}"), &payment(&format!("evt_ok_{i}"), &format!("pi_{i}"))).await;
    }
    let counts = worker(&pool).run(later()).await.expect("the batch must not fail as a whole");
    assert_eq!((counts.taken, counts.applied, counts.failed), (7, 5, 2));
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM payments").await, 5, "every ordinary effect applied");
    let rows = rows(&pool).await;
    assert_eq!(rows[0].1, "failed");
    assert!(rows[0].2.as_deref().unwrap().contains("nested deeper than 127 levels"), "{:?}", rows[0].2);
    assert_eq!(rows[1].1, "failed");
    assert!(rows[1].2.as_deref().unwrap().contains("number out of range"), "{:?}", rows[1].2);
    assert!(rows[2..].iter().all(|r| r.1 == "done"));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_sqs_path_decodes_per_row_too(pool: PgPool) {
    stored_unchecked(&pool, "evt_deep", &payment_with("evt_deep", "pi_deep", &nested(300))).await;
    let c = worker(&pool).run_event("stripe", "evt_deep").await.unwrap();
    assert_eq!((c.taken, c.failed), (1, 1));
    assert_eq!(rows(&pool).await[0].1, "failed");
}

/// The same rule at the door: what the worker could not use is `failed` at receive, answered 200.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn receive_fails_at_once_what_the_worker_could_not_decode(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    for inline in [false, true] {
        sqlx::query("TRUNCATE webhook_inbox").execute(&pool).await.unwrap();
        let mut cfg = config(secrets(false));
        if inline {
            cfg.inline_providers = vec![Provider::STRIPE];
        }
        let r = Receiver::connect_with(opts.clone(), &cfg).with_handlers(stock::handlers());
        for (id, hostile, reason) in [
            ("evt_deep", nested(128), "nested deeper than 127 levels"),
            ("evt_huge", r#"{"n":1e400}"#.to_string(), "number out of range"),
            ("evt_surrogate", r#""\ud800""#.to_string(), "hex escape"),
        ] {
            let body = payment_with(id, "pi_x", &hostile).into_bytes();
            let (status, answer) =
                post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
            assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})), "{id} inline={inline}");
            let (status, why, raw): (String, String, Vec<u8>) =
                sqlx::query_as("SELECT status, failure_reason, raw_body FROM webhook_inbox WHERE event_id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(status, "failed", "{id} inline={inline}");
            assert!(why.contains(reason), "{id}: {why}");
            assert_eq!(raw, body, "the signed bytes are kept");
        }
        // Within the limit (127 levels in all), the event is ordinary.
        let body = payment_with("evt_limit", "pi_limit", &nested(123)).into_bytes();
        post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
        let expect = if inline { "done" } else { "pending" };
        assert_eq!(
            scalar::<String>(&pool, "SELECT status FROM webhook_inbox WHERE event_id = 'evt_limit'").await,
            expect
        );
    }
}

// ---------- 2. whatever PostgreSQL raises for the value itself ----------

/// 100,000 levels: PostgreSQL's jsonb parser runs out of stack (SQLSTATE 54001).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_body_nested_past_postgres_stack_depth_is_200_and_failed_not_503(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let r = receiver(opts.clone(), secrets(false));
    let body = payment_with("evt_abyss", "pi_abyss", &nested(100_000)).into_bytes();
    for expect in ["accepted", "duplicate"] {
        let (status, answer) =
            post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": expect})));
    }
    let (status, no_payload): (String, bool) =
        sqlx::query_as("SELECT status, payload IS NULL FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!((status.as_str(), no_payload), ("failed", true));
}

// The claim's own fallback below that check (a value PostgreSQL refuses for
// any reason that is not an outage is kept `failed` without its payload) is
// unit-tested beside the claim: `shared/src/receive/claim/tests.rs`.

/// The fallback never turns a broken database into a 200: when the plain claim
/// fails too, the answer is 503 and nothing is acknowledged.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_claim_that_fails_for_a_reason_other_than_the_value_still_answers_503(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    sqlx::query("ALTER TABLE webhook_inbox RENAME TO webhook_inbox_gone").execute(&pool).await.unwrap();
    let body = payment_with("evt_nowhere", "pi_nowhere", &nested(100_000)).into_bytes();
    let (status, _) = post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body = payment("evt_plain", "pi_plain").into_bytes();
    let (status, _) = post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

// ---------- 9. slow clients of `inbox dev` ----------

async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got)).await;
    read.ok().map(|_| String::from_utf8_lossy(&got).into_owned())
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn dev_server_cuts_off_clients_that_send_headers_or_bodies_too_slowly(_: PgPoolOptions, opts: PgConnectOptions) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let timeouts = webhook_inbox_service::serve::Limits {
        header_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let receiver = std::sync::Arc::new(receiver(opts, secrets(false)));
    let server =
        tokio::spawn(webhook_inbox_service::serve::webhooks(listener, receiver, timeouts, std::future::pending()));

    // Connects and says nothing.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(read_until_closed(&mut silent).await.is_some(), "a silent connection is closed");

    // Half a header, then nothing.
    let mut slow_headers = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow_headers.write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    assert!(read_until_closed(&mut slow_headers).await.is_some(), "unfinished headers are cut off");

    // Headers, then 10 of the 100 bytes promised.
    let mut slow_body = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow_body
        .write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"id\":\"ev")
        .await
        .unwrap();
    let answer = read_until_closed(&mut slow_body).await.expect("an unfinished body is cut off");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // And the server still serves whoever is quick.
    let body = payment("evt_quick", "pi_quick");
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nConnection: close\r\nStripe-Signature: {}\r\nContent-Length: {}\r\n\r\n{body}",
        stripe_header(STRIPE[0], body.as_bytes()),
        body.len()
    );
    let mut quick = tokio::net::TcpStream::connect(addr).await.unwrap();
    quick.write_all(request.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut quick).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("accepted"), "{answer}");
    server.abort();
}

// ---------- 4. batches: bytes kept once, cost bounded ----------

fn sha256(bytes: &[u8]) -> Vec<u8> {
    <sha2::Sha256 as sha2::Digest>::digest(bytes).to_vec()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_marqeta_batch_keeps_its_bytes_once_and_every_item_can_be_reverified(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let app = TestApp::spawn(opts, secrets(true)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let items: Vec<String> =
        (0..10).map(|i| format!(r#"{{"token":"t{i}","type":"authorization","pad":"{}"}}"#, "x".repeat(2000))).collect();
    let body = format!(r#"{{"transactions":[{}]}}"#, items.join(",")).into_bytes();
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let sig = marqeta_signature_sha256(MARQETA_SIGNING[1], &body);
    let headers = [("Authorization", auth.as_str()), ("X-Marqeta-Signature", sig.as_str())];
    assert_eq!(post(r, "marqeta", &headers, &body).await, (StatusCode::OK, json!({"accepted": 10, "duplicates": 0})));
    assert_eq!(post(r, "marqeta", &headers, &body).await, (StatusCode::OK, json!({"accepted": 0, "duplicates": 10})));

    let (bodies, in_rows): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_bodies), (SELECT count(*) FROM webhook_inbox WHERE raw_body IS NOT NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((bodies, in_rows), (1, 0), "the batch's bytes are stored once, in no item's row");
    let stored: Vec<(String, Vec<u8>, i16)> = sqlx::query_as(
        "SELECT w.event_id, b.raw_body, w.secret_index FROM webhook_inbox AS w JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored.len(), 10);
    for (id, raw, index) in stored {
        assert_eq!(raw, body, "{id}: the exact signed bytes");
        assert_eq!(marqeta_signature_sha256(MARQETA_SIGNING[index as usize], &raw), sig, "{id}: re-verifies");
    }
    let digest: Vec<u8> = sqlx::query_scalar("SELECT sha256 FROM webhook_bodies").fetch_one(&pool).await.unwrap();
    assert_eq!(digest, sha256(&body));
}

/// 1 MiB of tiny notifications (about 60,000): before, every item's row copied
/// the whole body and the claim hit the statement timeout (503 on every retry).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_megabyte_of_tiny_marqeta_items_gets_a_definite_answer(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let mut items = Vec::new();
    let mut size = 0;
    while size < 1_000_000 {
        let item = format!(r#"{{"token":"t{}"}}"#, items.len());
        size += item.len() + 1;
        items.push(item);
    }
    let body = format!(r#"{{"transactions":[{}]}}"#, items.join(",")).into_bytes();
    assert!(body.len() < webhook_inbox::config::DEFAULT_MAX_BODY_BYTES);
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let (status, answer) = post(r, "marqeta", &[("Authorization", &auth)], &body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"accepted": 1, "duplicates": 0})));
    let (status, why, kept): (String, String, Vec<u8>) = sqlx::query_as(
        "SELECT w.status, w.failure_reason, b.raw_body FROM webhook_inbox AS w JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(status, "failed");
    assert!(why.contains(&format!("{} notifications in one delivery", items.len())), "{why}");
    assert_eq!(kept, body, "nothing lost: the whole delivery is kept");
}

// ---------- property: whatever is stored ends done or failed ----------

/// Reads the whole payload, as a real handler would.
struct ReadsPayload;

impl Handler for ReadsPayload {
    type Payload = serde_json::Value;
    async fn handle(&self, _: &mut sqlx::PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        Ok(if event.payload.to_string().is_empty() { Outcome::NoEffect } else { Outcome::Applied })
    }
}

/// Generated hostile payloads, through receive (checked) and stored unchecked
/// (as rows written before the check, or by a path that skips it): the worker
/// ends every row `done` or `failed` with a reason, and its drain never errors.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn any_stored_payload_ends_done_or_failed_and_never_stops_the_worker(_: PgPoolOptions, opts: PgConnectOptions) {
    use proptest::{
        strategy::{Strategy, ValueTree},
        test_runner::TestRunner,
    };
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let mut runner = TestRunner::deterministic();
    let strategy = hostile_json::value();
    let mut expect_done = Vec::new();
    let (mut stored_unchecked, mut refused) = (0, 0);
    for i in 0..300 {
        let data = strategy.new_tree(&mut runner).unwrap().current();
        let id = format!("evt_r{i:03}");
        let body = hostile_json::stripe_event(&id, "prop.test", &data);
        let (status, answer) =
            post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], body.as_bytes()))], body.as_bytes())
                .await;
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})), "{body:.200}");
        if webhook_inbox_schemes::payload::storable(&body) {
            expect_done.push(id);
        }
        // Unchecked: whatever jsonb takes is stored pending, for the worker to meet;
        // what PostgreSQL itself refuses (`\u0000`, a lone surrogate) never reaches it.
        let id = format!("evt_u{i:03}");
        let unchecked = hostile_json::stripe_event(&id, "prop.test", &data);
        match webhook_inbox::testing::store(&pool, Provider::STRIPE, &id, "prop.test", &unchecked).await {
            Ok(new) => {
                assert!(new, "{id} is new");
                stored_unchecked += 1;
            }
            Err(e) => {
                let code = webhook_inbox::ops::sqlstate(&e).unwrap_or_default();
                assert!(code.starts_with("22"), "only a refused value is not stored: {e} ({unchecked:.200})");
                refused += 1;
            }
        }
    }
    let config = WorkerConfig {
        batch_size: 50,
        max_attempts: 3,
        retry_base: Duration::from_millis(1),
        poll: Duration::from_millis(10),
        rules: Default::default(),
    };
    let w = Worker::new(pool.clone(), Handlers::new().on(Provider::STRIPE, "prop.test", ReadsPayload).unwrap(), config);
    let counts = w.run(later()).await.expect("the drain never errors");
    let (pending, failed_without_reason): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed' AND failure_reason IS NULL) FROM webhook_inbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((pending, failed_without_reason), (0, 0), "{counts:?}");
    let unchecked: i64 = scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE event_id LIKE 'evt_u%'").await;
    assert_eq!(unchecked, stored_unchecked, "every unchecked row stayed for the worker to end");
    assert!(stored_unchecked > 0 && refused > 0, "both kinds unchecked: {stored_unchecked} stored, {refused} refused");
    let done: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM webhook_inbox WHERE status = 'done' AND event_id LIKE 'evt_r%' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(done, expect_done, "through receive, exactly the usable payloads are processed");
    assert!(!done.is_empty() && done.len() < 300, "the generator makes both kinds: {} of 300 usable", done.len());
}
