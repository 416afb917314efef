//! The relay against a real PostgreSQL and a real local HTTP server (wiremock).

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use inbox_tests::later;
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    sinks::{HttpSink, Outgoing, RepliesFuture, Sink, SinkReply},
    Destination, DestinationLimits, Relay, RelayConfig, Stage,
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
pub(crate) fn relay(pool: &PgPool, sink: Arc<dyn Sink>) -> Relay {
    relay_with(pool, sink, limits())
}

/// A relay to `sink` whose retries wait a minute: a run tries each message once.
pub(crate) fn relay_once_each(pool: &PgPool, sink: Arc<dyn Sink>) -> Relay {
    let config = RelayConfig { retry_base: Duration::from_secs(60), ..config() };
    Relay::new(pool.clone(), vec![Destination::shared("default", sink).with_limits(limits())], config)
}

fn relay_with(pool: &PgPool, sink: Arc<dyn Sink>, limits: DestinationLimits) -> Relay {
    Relay::new(pool.clone(), vec![Destination::shared("default", sink).with_limits(limits)], config())
}

pub(crate) fn http_sink(server: &MockServer) -> Arc<dyn Sink> {
    Arc::new(HttpSink::new(format!("{}/hook", server.uri()), Duration::from_secs(5)).unwrap())
}

pub(crate) async fn messages(pool: &PgPool, n: usize) {
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

/// Hands each call to `inner` (the messages are published), then never
/// answers: the relay is killed before it hears back.
struct PublishesThenHangs {
    inner: Arc<dyn Sink>,
    /// Messages `inner` answered for, and how many of them it took.
    answered: Arc<(AtomicUsize, AtomicUsize, tokio::sync::Notify)>,
}

impl Sink for PublishesThenHangs {
    fn target(&self) -> String {
        self.inner.target()
    }

    fn batch_size(&self) -> usize {
        self.inner.batch_size()
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(async move {
            let replies = self.inner.deliver(messages).await;
            let taken = replies.iter().filter(|r| **r == SinkReply::Delivered).count();
            self.answered.1.fetch_add(taken, Ordering::SeqCst);
            self.answered.0.fetch_add(messages.len(), Ordering::SeqCst);
            self.answered.2.notify_one();
            std::future::pending().await
        })
    }
}

/// A relay of `destination` that leases with `lease`, publishes `n` of its
/// messages through `sink`, and is killed (its pass dropped, as a Lambda at
/// its timeout) before it records any result: the messages stay leased
/// until the lease runs out. At most `n` are in flight, so exactly `n` are
/// published.
pub(crate) async fn killed_after_publishing(
    pool: &PgPool,
    destination: &str,
    sink: Arc<dyn Sink>,
    n: usize,
    lease: Duration,
) {
    let answered = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0), tokio::sync::Notify::new()));
    let hangs = PublishesThenHangs { inner: sink, answered: answered.clone() };
    let limits = DestinationLimits { concurrency: n, timeout: Duration::from_secs(30), ..limits() };
    let config = RelayConfig { batch_size: n as i64, lease, ..config() };
    let dying = Relay::new(pool.clone(), vec![Destination::new(destination, hangs).with_limits(limits)], config);
    let all_answered = async {
        while answered.0.load(Ordering::SeqCst) < n {
            answered.2.notified().await;
        }
    };
    tokio::select! {
        r = dying.run_once(later()) => panic!("the relay ended before it published {n}: {r:?}"),
        done = tokio::time::timeout(Duration::from_secs(30), all_answered) => {
            done.unwrap_or_else(|_| panic!("{n} published within 30 s"));
        }
    }
    let (published, taken) = (answered.0.load(Ordering::SeqCst), answered.1.load(Ordering::SeqCst));
    assert_eq!((published, taken), (n, n), "the sink took each message before the kill");
}

pub(crate) async fn row(pool: &PgPool) -> (i32, bool, bool, Option<String>) {
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
    let sink = http_sink(&server);
    let lease = Duration::from_millis(300);
    killed_after_publishing(&pool, "default", sink.clone(), 3, lease).await; // the crash comes before the record
    assert_eq!(relay(&pool, sink.clone()).run_once(later()).await.unwrap().leased, 0, "leased, not re-sent yet");
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
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
