//! Destinations: each message to its own, each destination in its own lane
//! (its concurrency, rate, retries, circuit breaker and pause), order per
//! key, signed deliveries and a team's own sinks, against a real PostgreSQL
//! and real local HTTP servers (wiremock).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use inbox_tests::later;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::{
    config::{Destinations, Env},
    enqueue,
    ops::{self, Audit},
    sinks::{HttpSink, Outgoing, RepliesFuture, Signer, Sink, SinkReply},
    App, Destination, DestinationLimits, Message, Relay, RelayConfig, Stage,
};
use wiremock::{
    matchers::{header, method},
    Mock, MockServer, Request, ResponseTemplate,
};

use crate::sdk::{sdk, Script};

fn config() -> RelayConfig {
    RelayConfig { batch_size: 100, retry_base: Duration::from_millis(1), lease: Duration::from_secs(60) }
}

fn http(server: &MockServer) -> HttpSink {
    HttpSink::new(server.uri(), Duration::from_secs(10)).unwrap()
}

fn to(name: &str, sink: impl Sink, limits: DestinationLimits) -> Destination {
    Destination::new(name, sink).with_limits(limits)
}

async fn answering(status: u16, delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(status).set_delay(delay)).mount(&server).await;
    server
}

/// Writes messages `{prefix}{i}` to `destination`, with `key` as their ordering key, through the public API.
async fn write(pool: &PgPool, destination: &str, prefix: &str, n: usize, key: Option<&str>) {
    let mut conn = pool.acquire().await.unwrap();
    for i in 0..n {
        let id = format!("{prefix}{i}");
        let mut m = Message::new("thing", &id, id.clone(), json!({"id": id})).to(destination);
        if let Some(key) = key {
            m = m.ordered_by(key);
        }
        assert!(enqueue(&mut conn, &m).await.unwrap());
    }
}

fn keys(requests: &[Request]) -> Vec<String> {
    requests.iter().map(|r| r.headers["idempotency-key"].to_str().unwrap().to_string()).collect()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn each_message_goes_to_its_own_destination_and_one_no_relay_knows_waits(pool: PgPool) {
    let (billing, default) = (answering(200, Duration::ZERO).await, answering(200, Duration::ZERO).await);
    write(&pool, "billing", "bill-", 3, None).await;
    write(&pool, "default", "plain-", 2, None).await;
    let mut conn = pool.acquire().await.unwrap();
    enqueue(&mut conn, &Message::new("thing", "x", "plain-2", json!({}))).await.unwrap(); // names none: `default`
    drop(conn);
    write(&pool, "nowhere", "lost-", 2, None).await;
    let relay = Relay::new(
        pool.clone(),
        vec![
            to("billing", http(&billing), DestinationLimits::default()),
            to("default", http(&default), DestinationLimits::default()),
        ],
        config(),
    );
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.dead, r.unrouted), (6, 0, 2));
    let mut got = keys(&billing.received_requests().await.unwrap());
    got.sort();
    assert_eq!(got, ["bill-0", "bill-1", "bill-2"]);
    let mut got = keys(&default.received_requests().await.unwrap());
    got.sort();
    assert_eq!(got, ["plain-0", "plain-1", "plain-2"]);
    // The unrouted ones wait untouched: no attempt, not dead; the operator sees why.
    let untouched = "SELECT count(*) FROM transactional_outbox
                     WHERE destination = 'nowhere' AND attempts = 0 AND dead_at IS NULL AND processed_at IS NULL";
    assert_eq!(count(&pool, untouched).await, 2);
    let listed = ops::destinations(&pool).await.unwrap();
    let nowhere = listed.iter().find(|d| d.name == "nowhere").unwrap();
    assert_eq!((nowhere.state(), nowhere.backlog), ("unconfigured", 2));
    let billing_row = listed.iter().find(|d| d.name == "billing").unwrap();
    assert_eq!(billing_row.state(), "running");
    assert!(billing_row.target.as_deref().unwrap().starts_with("http http://127.0.0.1:"));
}

/// A destination answering in 5 s beside one answering at once: the fast one's
/// messages, those written during the pass too, are all delivered while the
/// slow one's are still in flight.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_slow_destination_does_not_hold_up_another(pool: PgPool) {
    let (slow, fast) = (answering(200, Duration::from_secs(5)).await, answering(200, Duration::ZERO).await);
    write(&pool, "slow", "slow-", 4, None).await;
    write(&pool, "fast", "fast-", 200, None).await;
    let limits = DestinationLimits { concurrency: 4, ..DestinationLimits::default() };
    let relay = Relay::new(
        pool.clone(),
        vec![to("slow", http(&slow), limits.clone()), to("fast", http(&fast), limits)],
        config(),
    );
    let started = Instant::now();
    let run = tokio::spawn(async move { relay.run(later()).await.unwrap() });
    let fast_sent = "SELECT count(*) FROM transactional_outbox WHERE destination = 'fast' AND processed_at IS NOT NULL";
    while count(&pool, fast_sent).await < 200 {
        assert!(started.elapsed() < Duration::from_secs(4), "the fast destination waited for the slow one");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Messages written while the slow one holds the pass open go too (the fast lane keeps looking).
    write(&pool, "fast", "later-", 50, None).await;
    while count(&pool, fast_sent).await < 250 {
        assert!(started.elapsed() < Duration::from_millis(4500), "new fast messages waited for the slow ones");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slow_sent = "SELECT count(*) FROM transactional_outbox WHERE destination = 'slow' AND processed_at IS NOT NULL";
    assert_eq!(count(&pool, slow_sent).await, 0, "the slow ones are still in flight");
    let r = run.await.unwrap();
    assert_eq!(r.sent, 254);
}

/// Sending is a pipeline: one message answered in 2 s takes one slot; the
/// others go through the other slot meanwhile, not after it.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_slow_message_takes_one_slot_not_its_chunk(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("idempotency-key", "m-0"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(2)))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).with_priority(2).mount(&server).await;
    write(&pool, "default", "m-", 30, None).await;
    let limits = DestinationLimits { concurrency: 2, ..DestinationLimits::default() };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), limits)], config());
    let started = Instant::now();
    let run = tokio::spawn(async move { relay.run(later()).await.unwrap() });
    let others = "SELECT count(*) FROM transactional_outbox WHERE message_key <> 'm-0' AND processed_at IS NOT NULL";
    while count(&pool, others).await < 29 {
        assert!(started.elapsed() < Duration::from_millis(1800), "the others waited for the slow one's chunk");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(run.await.unwrap().sent, 30);
}

/// Consecutive failures open the circuit: nothing more is sent and no
/// attempt spent until the cool-down ends; then one message probes, and the
/// circuit closes when it goes through.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_failing_destination_opens_its_circuit_then_one_probe_closes_it(pool: PgPool) {
    let server = answering(503, Duration::ZERO).await;
    write(&pool, "default", "c-", 10, None).await;
    let limits = DestinationLimits {
        concurrency: 1,
        circuit_failures: 3,
        circuit_cool_down: Duration::from_millis(400),
        ..DestinationLimits::default()
    };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), limits)], config());
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.retried, r.open), (0, 3, 1));
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
    let untouched = "SELECT count(*) FROM transactional_outbox WHERE attempts = 0 AND next_attempt_at IS NULL";
    assert_eq!(count(&pool, untouched).await, 7, "released untouched, no attempt spent");
    let state = &ops::destinations(&pool).await.unwrap()[0];
    assert_eq!((state.state(), state.failures), ("open", 3));
    assert!(state.last_error.as_deref().unwrap().starts_with("HTTP 503"));

    // Cooling down: nothing is sent.
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.leased, r.open), (0, 1));
    assert_eq!(server.received_requests().await.unwrap().len(), 3);

    // The destination recovers; after the cool-down one message probes, and the circuit closes.
    server.reset().await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    // The probe goes through; the circuit closes and the rest follow in the same run.
    let probe = relay.run(later()).await.unwrap();
    assert_eq!((probe.sent, probe.open), (10, 0));
    assert_eq!(ops::destinations(&pool).await.unwrap()[0].state(), "running");
    assert_eq!(server.received_requests().await.unwrap().len(), 10);
}

/// A probe that fails keeps the circuit open for another cool-down, and
/// spends no attempt of its message (an outage probed for hours leaves none dead).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_failed_probe_cools_down_again(pool: PgPool) {
    let server = answering(500, Duration::ZERO).await;
    write(&pool, "default", "p-", 5, None).await;
    let limits = DestinationLimits {
        concurrency: 1,
        circuit_failures: 1,
        circuit_cool_down: Duration::from_millis(300),
        ..DestinationLimits::default()
    };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), limits)], config());
    assert_eq!(relay.run(later()).await.unwrap().open, 1);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let attempts = "SELECT sum(attempts) FROM transactional_outbox";
    assert_eq!(count(&pool, attempts).await, 1, "the failure that opened the circuit");
    let probe = relay.run(later()).await.unwrap();
    assert_eq!((probe.leased, probe.released, probe.open), (1, 1, 1));
    assert_eq!(relay.run(later()).await.unwrap().leased, 0, "cooling down again");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    assert_eq!(count(&pool, attempts).await, 1, "a failed probe spends no attempt");
}

/// A paused destination's messages wait, none sent, none spending an attempt,
/// the others' flow; on resume they go in the order written. Both audited.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_paused_destination_waits_and_resumes_in_order(pool: PgPool) {
    let (paused, other) = (answering(200, Duration::ZERO).await, answering(200, Duration::ZERO).await);
    write(&pool, "billing", "b-", 12, None).await;
    write(&pool, "email", "e-", 3, None).await;
    let by = Audit { actor: "alice", action: "pause_destination", reason: "billing is deploying" };
    assert!(ops::pause_destination(&pool, "billing", &by).await.unwrap());
    assert!(!ops::pause_destination(&pool, "billing", &by).await.unwrap(), "paused already");
    let one = DestinationLimits { concurrency: 1, ..DestinationLimits::default() };
    let relay = Relay::new(
        pool.clone(),
        vec![to("billing", http(&paused), one.clone()), to("email", http(&other), one)],
        config(),
    );
    let r = relay.run(later()).await.unwrap();
    assert_eq!((r.sent, r.paused), (3, 1), "the other destination flows");
    let (billing, email) = (r.destinations["billing"], r.destinations["email"]);
    assert_eq!((billing.paused, billing.sent, email.paused, email.sent), (true, 0, false, 3), "{r:?}");
    assert!(paused.received_requests().await.unwrap().is_empty());
    let untouched = "SELECT count(*) FROM transactional_outbox WHERE destination = 'billing' AND attempts = 0";
    assert_eq!(count(&pool, untouched).await, 12);
    let state = ops::destinations(&pool).await.unwrap().into_iter().find(|d| d.name == "billing").unwrap();
    assert_eq!((state.state(), state.paused_by.as_deref(), state.backlog), ("paused", Some("alice"), 12));

    let by = Audit { actor: "alice", action: "resume_destination", reason: "deployed" };
    assert!(ops::resume_destination(&pool, "billing", &by).await.unwrap());
    assert_eq!(relay.run(later()).await.unwrap().sent, 12);
    let expected: Vec<String> = (0..12).map(|i| format!("b-{i}")).collect();
    assert_eq!(keys(&paused.received_requests().await.unwrap()), expected, "in the order written");
    let history = ops::destination_history(&pool, "billing").await.unwrap();
    let actions: Vec<(&str, &str, &str)> =
        history.iter().map(|h| (h.action.as_str(), h.from_status.as_str(), h.reason.as_str())).collect();
    assert_eq!(
        actions,
        [("pause_destination", "running", "billing is deploying"), ("resume_destination", "paused", "deployed")]
    );
}

/// Pausing takes effect on a relay already sending: what is in flight ends,
/// what is leased goes back untouched.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_pause_stops_a_relay_already_sending(pool: PgPool) {
    let server = answering(200, Duration::from_millis(200)).await;
    write(&pool, "default", "q-", 100, None).await;
    let one = DestinationLimits { concurrency: 1, ..DestinationLimits::default() };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), one)], config());
    let run = tokio::spawn(async move { relay.run(later()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by = Audit { actor: "bob", action: "pause_destination", reason: "stop" };
    ops::pause_destination(&pool, "default", &by).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(3), run).await.expect("the relay stops within a second").unwrap();
    assert!(r.sent < 20 && r.released > 70, "{r:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM transactional_outbox WHERE attempts = 0").await, r.released as i64);
}

/// Messages of one ordering key go one at a time in the order written; a
/// failing one holds back only the later messages of its key.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn one_key_goes_in_order_and_a_failing_message_holds_back_only_its_key(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("idempotency-key", "a-0"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(3)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).with_priority(2).mount(&server).await;
    write(&pool, "default", "a-", 5, Some("order_a")).await;
    write(&pool, "default", "b-", 5, Some("order_b")).await;
    write(&pool, "default", "free-", 5, None).await;
    let limits = DestinationLimits { concurrency: 8, ..DestinationLimits::default() };
    let backoff = RelayConfig { retry_base: Duration::from_millis(300), ..config() };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), limits)], backoff);
    let first = relay.run(later()).await.unwrap();
    // a-0 failed once and holds a-1..a-4; order_b and the free ones went.
    let sent: Vec<String> = keys(&server.received_requests().await.unwrap());
    assert!(sent.iter().filter(|k| k.starts_with("a-")).all(|k| k == "a-0"), "{sent:?}");
    assert_eq!(first.sent, 10, "{first:?}");
    for _ in 0..100 {
        relay.run(later()).await.unwrap();
        if count(&pool, "SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = keys(&server.received_requests().await.unwrap());
    let of = |p: &str| sent.iter().filter(|k| k.starts_with(p)).cloned().collect::<Vec<_>>();
    assert_eq!(of("a-"), ["a-0", "a-0", "a-0", "a-0", "a-1", "a-2", "a-3", "a-4"]);
    assert_eq!(of("b-"), ["b-0", "b-1", "b-2", "b-3", "b-4"]);
}

/// A message dead for good lets the next of its key go, and says it held others.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_dead_message_lets_its_key_go_on_and_says_it_held_others(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("idempotency-key", "k-0"))
        .respond_with(ResponseTemplate::new(422).set_body_string("bad amount"))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).with_priority(2).mount(&server).await;
    write(&pool, "default", "k-", 3, Some("acct_1")).await;
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), DestinationLimits::default())], config());
    let mut sent = 0;
    for _ in 0..5 {
        sent += relay.run(later()).await.unwrap().sent;
    }
    assert_eq!(sent, 2);
    let reason: String = sqlx::query_scalar("SELECT last_error FROM transactional_outbox WHERE message_key = 'k-0'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(reason, "HTTP 422: bad amount (it held back 2 later message(s) of its ordering key until now)");
}

/// Two relays on one backlog of one key: still one at a time, in order.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn two_relays_keep_one_key_in_order(pool: PgPool) {
    let server = answering(200, Duration::from_millis(5)).await;
    write(&pool, "default", "o-", 40, Some("acct")).await;
    let relays: Vec<_> = (0..2)
        .map(|_| {
            let relay =
                Relay::new(pool.clone(), vec![to("default", http(&server), DestinationLimits::default())], config());
            let pool = pool.clone();
            tokio::spawn(async move {
                for _ in 0..400 {
                    relay.run(later()).await.unwrap();
                    if count(&pool, "SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL").await == 0 {
                        return;
                    }
                }
            })
        })
        .collect();
    for r in relays {
        r.await.unwrap();
    }
    let expected: Vec<String> = (0..40).map(|i| format!("o-{i}")).collect();
    assert_eq!(keys(&server.received_requests().await.unwrap()), expected);
}

/// `rate_per_second` spaces the starts: 21 messages at 20 a second take a second.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_rate_limit_spaces_the_deliveries(pool: PgPool) {
    let server = answering(200, Duration::ZERO).await;
    write(&pool, "default", "r-", 21, None).await;
    let limits = DestinationLimits { concurrency: 8, rate_per_second: Some(20.0), ..DestinationLimits::default() };
    let relay = Relay::new(pool.clone(), vec![to("default", http(&server), limits)], config());
    let started = Instant::now();
    assert_eq!(relay.run(later()).await.unwrap().sent, 21);
    assert!(started.elapsed() >= Duration::from_millis(950), "{:?}", started.elapsed());
}

/// Signed deliveries verify with Standard Webhooks' own libraries (npm and
/// PyPI), under the current secret and the one being rotated out; a changed
/// body does not.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn signed_deliveries_verify_with_the_standard_webhooks_libraries(pool: PgPool) {
    let server = answering(200, Duration::ZERO).await;
    let (current, previous) = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD");
    let signer = Signer::new(&format!("{current} {previous}")).unwrap();
    let sink = http(&server).signed(signer);
    write(&pool, "default", "s-", 2, None).await;
    let relay = Relay::new(pool.clone(), vec![to("default", sink, DestinationLimits::default())], config());
    assert_eq!(relay.run(later()).await.unwrap().sent, 2);
    for request in server.received_requests().await.unwrap() {
        let headers: serde_json::Map<String, serde_json::Value> =
            ["webhook-id", "webhook-timestamp", "webhook-signature"]
                .iter()
                .map(|h| (h.to_string(), json!(request.headers[*h].to_str().unwrap())))
                .collect();
        assert_eq!(headers["webhook-id"], request.headers["idempotency-key"].to_str().unwrap());
        let body = String::from_utf8(request.body.clone()).unwrap();
        for script in [Script::Node, Script::Python] {
            for secret in [current, previous] {
                let verify = |body: &str| {
                    sdk(
                        script,
                        json!({"provider": "standard", "op": "verify", "secret": secret, "body": body, "headers": headers}),
                    )
                };
                assert_eq!(verify(&body)["valid"], true, "{secret}: {}", verify(&body));
                assert_eq!(verify(&body.replace("s-", "S-"))["valid"], false, "a changed body fails");
            }
        }
    }
}

/// A team's own sink, registered on the App and named in the destinations
/// file; a name no one registered stops the relay at start-up.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_teams_own_sink_is_registered_on_the_app_and_named_in_the_file(pool: PgPool) {
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);
    impl Sink for Recorder {
        fn target(&self) -> String {
            "recorder".into()
        }
        fn batch_size(&self) -> usize {
            5
        }
        fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
            Box::pin(async move {
                messages
                    .iter()
                    .map(|m| {
                        if m.message_key == "mine-3" {
                            panic!("a bug in the team's sink");
                        }
                        self.0.lock().unwrap().push(m.message_key.clone());
                        SinkReply::Delivered
                    })
                    .collect()
            })
        }
    }
    let recorder = Recorder::default();
    let app = App::default().with_sink("kafka", recorder.clone());
    let file = [("RELAY_DESTINATIONS", "[destination.events]\nsink = \"kafka\"\nconcurrency = 5\n")];
    let destinations = Destinations::read(&Env::from_pairs(&file)).unwrap();
    let later_retry = RelayConfig { retry_base: Duration::from_secs(60), ..config() };
    let relay = Relay::new(pool.clone(), destinations.build(&app).await.unwrap(), later_retry);
    write(&pool, "events", "mine-", 12, None).await;
    let r = relay.run(later()).await.unwrap();
    // The batch of five holding mine-3 panicked: retried, not lost; the others went.
    assert_eq!((r.sent, r.retried), (7, 5), "{r:?}");
    assert_eq!(recorder.0.lock().unwrap().len(), 7 + 3, "what the sink did before it panicked is re-sent");
    let reason: String = sqlx::query_scalar("SELECT last_error FROM transactional_outbox WHERE message_key = 'mine-3'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(reason, "the sink panicked");

    let err = destinations.build(&App::default()).await.unwrap_err().to_string();
    assert!(err.contains("[destination.events] sink: no sink is registered as \"kafka\""), "{err}");
}

/// A sink that keeps the keys it was handed, in order; the first call commits
/// `late` first (a writer's transaction that began before the others').
#[derive(Clone, Default)]
struct Keeps {
    late: Arc<tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Postgres>>>>,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Sink for Keeps {
    fn target(&self) -> String {
        "keeps".into()
    }
    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(async move {
            if let Some(late) = self.late.lock().await.take() {
                late.commit().await.unwrap();
            }
            self.keys.lock().unwrap().extend(messages.iter().map(|m| m.message_key.clone()));
            vec![SinkReply::Delivered; messages.len()]
        })
    }
}

/// A lane's lease starts after the last message it leased, so it does not
/// walk again over the index entries of messages already sent (which a
/// snapshot held open keeps). A message whose transaction commits after later
/// ones' is behind that position: the lease from the head that follows a
/// short one takes it, in the same pass.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_message_committed_behind_the_lanes_position_is_leased_from_the_head_after(pool: PgPool) {
    let sink = Keeps::default();
    // Its transaction begins first (the lowest id) and commits as the first message is delivered.
    let mut late = pool.begin().await.unwrap();
    enqueue(&mut late, &Message::new("thing", "late", "late", json!({})).to("events")).await.unwrap();
    *sink.late.lock().await = Some(late);
    write(&pool, "events", "m-", 3, None).await;
    let one_at_a_time = DestinationLimits { concurrency: 1, ..DestinationLimits::default() };
    let two_a_lease = RelayConfig { batch_size: 2, ..config() };
    let relay = Relay::new(pool.clone(), vec![to("events", sink.clone(), one_at_a_time)], two_a_lease);
    let r = relay.run(later()).await.unwrap();
    assert_eq!(r.sent, 4, "{r:?}");
    let keys = sink.keys.lock().unwrap().clone();
    assert_eq!(keys, ["m-0", "m-1", "m-2", "late"], "m-2 leased after m-1, then `late` from the head");
}

/// Eight writers committing 1,000 messages out of order (each transaction
/// holds its message 0 to 20 ms), a quarter of them under their writer's
/// ordering key, while two relays deliver all along: each message is
/// delivered once, and each ordering key's messages in order.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn writers_committing_out_of_order_beside_two_relays_leave_no_message_behind(pool: PgPool) {
    const WRITERS: usize = 8;
    const EACH: usize = 125;
    let sink = Keeps::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut relays = Vec::new();
    for _ in 0..2 {
        let limits = DestinationLimits { concurrency: 4, ..DestinationLimits::default() };
        let config = RelayConfig { batch_size: 10, ..config() };
        let relay = Relay::new(pool.clone(), vec![to("events", sink.clone(), limits)], config);
        let stop = stop.clone();
        relays.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if relay.run(later()).await.unwrap().sent == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let mut tx = pool.begin().await.unwrap();
                let key = format!("m-{w}-{i}");
                let mut m = Message::new("thing", &key, key.clone(), json!({})).to("events");
                let ordering = format!("k-{w}");
                if i % 4 == 0 {
                    m = m.ordered_by(&ordering);
                }
                enqueue(&mut tx, &m).await.unwrap();
                tokio::time::sleep(Duration::from_millis(((w * 7 + i * 13) % 21) as u64)).await;
                tx.commit().await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let until = Instant::now() + Duration::from_secs(15);
    while count(&pool, "SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL").await > 0 {
        assert!(Instant::now() < until, "messages still unsent 15 s after the last commit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in relays {
        r.await.unwrap();
    }
    let keys = sink.keys.lock().unwrap().clone();
    let mut once = keys.clone();
    once.sort();
    once.dedup();
    assert_eq!((keys.len(), once.len()), (WRITERS * EACH, WRITERS * EACH), "each message delivered once");
    for k in (0..WRITERS).map(|w| format!("k-{w}")) {
        let by_id: Vec<String> =
            sqlx::query_scalar("SELECT message_key FROM transactional_outbox WHERE ordering_key = $1 ORDER BY id")
                .bind(&k)
                .fetch_all(&pool)
                .await
                .unwrap();
        let delivered: Vec<String> = keys.iter().filter(|key| by_id.contains(key)).cloned().collect();
        assert_eq!(delivered, by_id, "{k}: in order");
    }
}
