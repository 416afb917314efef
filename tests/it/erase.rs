//! Erasure (`inbox erase`, `ops::erase`): one customer's data gone from the
//! inbox (payload, raw bytes, a batch's shared body once its last event is
//! erased, kept headers, failure reasons, audit copies) and from the outbox
//! messages their handlers wrote (those not sent yet are not sent), in no
//! row of the database and nowhere in a `pg_dump` of it; the keys stay, so a redelivery is still a
//! duplicate; replay and requeue refuse an erased event.

use std::ops::ControlFlow;

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use webhook_inbox::{
    ops::{self, Audit, Erased, EventQuery, Filter, PayloadMatch, Replayed, Since, Status},
    Event, Handler, HandlerError, Handlers, Message, Outcome, Worker,
};
use webhook_inbox_schemes::Provider;

const EMAIL: &str = "jane.doe.erase-me@example.com";

/// Writes an outbox message carrying the customer's e-mail, as a receipt would.
struct Receipt;

impl Handler for Receipt {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let email = event.payload["data"]["object"]["receipt_email"].as_str().unwrap_or_default().to_string();
        let key = format!("receipt:{}", event.event_id);
        event.enqueue(conn, &Message::new("receipt", &event.event_id, key, json!({"to": email})).to("email")).await?;
        Ok(Outcome::Applied)
    }
}

fn charge(id: &str, email: &str) -> Vec<u8> {
    json!({"id": id, "type": "charge.succeeded", "data": {"object": {"id": format!("ch_{id}"), "receipt_email": email}}})
        .to_string()
        .into_bytes()
}

const BY: Audit<'static> = Audit { actor: "dpo", action: "erase", reason: "GDPR request #4411" };

/// Every row of every table of the database, as text (bytes as hex), then,
/// where a `pg_dump` of the server's major version is installed (Debian's
/// PostgreSQL 15 here and in CI; the PostgreSQL 18 run has none), what it
/// writes of the data too.
async fn everything(pool: &PgPool, url: &str) -> String {
    let tables: Vec<String> = sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
        .fetch_all(pool)
        .await
        .unwrap();
    let mut all = String::new();
    for table in tables {
        let sql = format!("SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM public.\"{table}\" AS t");
        all.push_str(&sqlx::query_scalar::<_, String>(&sql).fetch_one(pool).await.unwrap());
    }
    let major: i32 = scalar::<String>(pool, "SHOW server_version_num").await.parse::<i32>().unwrap() / 10_000;
    let pg_dump = format!("/usr/lib/postgresql/{major}/bin/pg_dump");
    if std::path::Path::new(&pg_dump).exists() {
        let out = std::process::Command::new(&pg_dump).args(["--data-only", url]).output().expect("pg_dump runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        all.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    all
}

/// Whether `text` holds the customer's e-mail, as text or as the hex of its bytes.
fn holds_email(text: &str) -> bool {
    text.contains(EMAIL) || text.contains(&hex::encode(EMAIL))
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn one_customer_s_events_are_erased_everywhere_and_their_keys_stay(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let url = format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap());
    let app = TestApp::spawn(opts, secrets(false)).await;
    let pool = app.pool.clone();
    let signed = |body: &[u8]| stripe_header(STRIPE[0], body);
    for (id, email) in [("evt_jane_1", EMAIL), ("evt_jane_2", EMAIL), ("evt_other", "someone@example.com")] {
        let body = charge(id, email);
        assert_eq!(app.post("stripe", &[("Stripe-Signature", &signed(&body))], &body).await.0, StatusCode::OK);
    }
    // A Marqeta batch: one body for two events, both the customer's.
    let batch = json!({"transactions": [
        {"token": "tx_jane_a", "type": "gpa.credit", "state": "COMPLETION", "user_token": EMAIL, "amount": "1.00"},
        {"token": "tx_jane_b", "type": "gpa.credit", "state": "COMPLETION", "user_token": EMAIL, "amount": "2.00"}]})
    .to_string();
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    assert_eq!(app.post("marqeta", &[("Authorization", &auth)], batch.as_bytes()).await.0, StatusCode::OK);
    let handlers = Handlers::new().on(Provider::STRIPE, "charge.succeeded", Receipt).unwrap();
    let w = Worker::new(pool.clone(), handlers, fast_worker_config());
    while w.run_once(later()).await.unwrap().taken > 0 {}
    // One receipt sent already, one still waiting.
    sqlx::query("UPDATE transactional_outbox SET processed_at = now() WHERE message_key = 'receipt:evt_jane_1'")
        .execute(&pool)
        .await
        .unwrap();
    let before = everything(&pool, &url).await;
    assert!(before.contains(EMAIL) && before.contains(&hex::encode(EMAIL)), "stored before, as text and as bytes");

    // Dry run: counts, changes nothing.
    let query = EventQuery {
        payload: Some(PayloadMatch::parse(EMAIL)),
        since: Some(Since::parse("1d").unwrap()),
        ..EventQuery::default()
    };
    let dry_run = ops::EraseOptions { dry_run: true, at_most: None };
    let counted = ops::erase_matching(&pool, &query, &BY, dry_run, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!((counted.matching, counted.erased), (4, 4));
    assert!(holds_email(&everything(&pool, &url).await));

    // One event of the batch first: the shared body holds its data, so it goes, and the other keeps its payload.
    assert_eq!(
        ops::erase(&pool, "marqeta", "transactions:tx_jane_a", &BY).await.unwrap(),
        Erased::Erased { messages: 0, siblings: 1 }
    );
    let bodies: i64 = scalar(&pool, "SELECT count(*) FROM webhook_bodies").await;
    assert_eq!(bodies, 0, "the batch's body went with the first of its events erased");
    // Bounded below what it holds: refused whole, nothing erased.
    let bounded = ops::EraseOptions { dry_run: false, at_most: Some(2) };
    let refused = ops::erase_matching(&pool, &query, &BY, bounded, |_| ControlFlow::Continue(())).await.unwrap_err();
    assert!(matches!(refused, ops::EraseError::TooMany { erasable: 3, at_most: 2 }), "{refused}");
    let all = ops::EraseOptions { dry_run: false, at_most: Some(3) };
    let done = ops::erase_matching(&pool, &query, &BY, all, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!(
        (done.matching, done.erased, done.already),
        (3, 3, 0),
        "the one erased before holds no payload to match"
    );

    let dumped = everything(&pool, &url).await;
    assert!(!holds_email(&dumped), "the e-mail is nowhere in the database, as text or as bytes");
    assert!(dumped.contains("someone@example.com"), "another customer's data stays");
    let row: (String, Option<Value>, bool, Value, Option<String>, String) = sqlx::query_as(
        "SELECT status, payload, raw_body IS NULL AND body_sha256 IS NULL, headers, erased_by, event_type
         FROM webhook_inbox WHERE event_id = 'evt_jane_1'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, ("done".into(), None, true, json!({}), Some("dpo".into()), "charge.succeeded".into()));
    let receipts: Vec<(String, Value, bool, Option<String>)> = sqlx::query_as(
        "SELECT message_key, payload, dead_at IS NOT NULL, last_error FROM transactional_outbox ORDER BY message_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(receipts[0], ("receipt:evt_jane_1".into(), json!({}), false, None), "sent: emptied");
    assert_eq!(
        receipts[1],
        ("receipt:evt_jane_2".into(), json!({}), true, Some("erased before it was sent".into())),
        "not sent yet: emptied and never sent"
    );

    // The keys stay: a redelivery is a duplicate, not a new event to process.
    let again = charge("evt_jane_1", EMAIL);
    let answer = app.post("stripe", &[("Stripe-Signature", &signed(&again))], &again).await;
    assert_eq!(answer, (StatusCode::OK, json!({"status": "duplicate"})));
    // Replay and requeue refuse it, saying why.
    let replay = Audit { actor: "ops", action: "replay", reason: "x" };
    assert!(matches!(
        ops::replay(&pool, "stripe", "evt_jane_1", &replay).await.unwrap(),
        Replayed::Erased { by, .. } if by == "dpo"
    ));
    let filter = Filter { statuses: vec![Status::Done], provider: Some("stripe".into()), ..Default::default() };
    let requeued = ops::requeue_all(&pool, &filter, &replay, 100, |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!(requeued.requeued, 1, "the other customer's event only");
    assert_eq!(
        ops::erase(&pool, "stripe", "evt_jane_1", &BY).await.unwrap(),
        Erased::Already {
            at: scalar(&pool, "SELECT to_json(erased_at)#>>'{}' FROM webhook_inbox WHERE event_id = 'evt_jane_1'")
                .await,
            by: "dpo".into()
        }
    );
    let audited: i64 =
        scalar(&pool, "SELECT count(*) FROM inbox_audit WHERE action = 'erase' AND reason = 'GDPR request #4411'")
            .await;
    assert_eq!(audited, 4);
}

/// A pending event is left as it is (a worker may hold it); an unknown one is named.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_pending_event_is_not_erased_under_a_worker(pool: PgPool) {
    store(&pool, Provider::GITHUB, "gh_1", "push", r#"{"pusher": {"email": "x@example.com"}}"#).await;
    assert_eq!(ops::erase(&pool, "github", "gh_1", &BY).await.unwrap(), Erased::Pending);
    assert_eq!(ops::erase(&pool, "github", "gh_nope", &BY).await.unwrap(), Erased::NotFound);
    let payload: Option<Value> = scalar(&pool, "SELECT payload FROM webhook_inbox").await;
    assert!(payload.is_some());
}

/// A Marqeta batch carries two customers' transactions in one signed body.
/// Erasing the one by payload (the GDPR workflow) takes the body too, which
/// held its data: the other keeps its payload, not the batch's bytes, and says
/// why; a redelivery of the batch (all duplicates) stores no body again.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn erasing_one_event_of_a_batch_takes_the_batch_s_body_and_a_redelivery_brings_none_back(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let url = format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap());
    let app = TestApp::spawn(opts, secrets(false)).await;
    let pool = app.pool.clone();
    let batch = json!({"transactions": [
        {"token": "tx_jane", "type": "gpa.credit", "state": "COMPLETION", "user_token": EMAIL, "amount": "1.00"},
        {"token": "tx_other", "type": "gpa.credit", "state": "COMPLETION", "user_token": "u_other", "amount": "2.00"}]})
    .to_string();
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    assert_eq!(app.post("marqeta", &[("Authorization", &auth)], batch.as_bytes()).await.0, StatusCode::OK);
    let w = Worker::new(pool.clone(), Handlers::new(), fast_worker_config());
    while w.run_once(later()).await.unwrap().taken > 0 {}

    let query = EventQuery {
        payload: Some(PayloadMatch::parse(EMAIL)),
        since: Some(Since::parse("1d").unwrap()),
        ..EventQuery::default()
    };
    let done =
        ops::erase_matching(&pool, &query, &BY, Default::default(), |_| ControlFlow::Continue(())).await.unwrap();
    assert_eq!((done.matching, done.erased), (1, 1));
    assert!(!holds_email(&everything(&pool, &url).await), "nothing holds the e-mail: the batch's body went");
    let sibling = ops::stored_event(&pool, "marqeta", "transactions:tx_other").await.unwrap().unwrap();
    assert_eq!(sibling.payload.as_ref().unwrap().0["user_token"], "u_other", "the other keeps its own payload");
    assert!(sibling.raw_erased_at.is_some() && sibling.raw_body.is_empty() && sibling.erased_at.is_none());
    let verification = ops::verification(&sibling, &webhook_inbox::config::Catalog::builtin(), &secrets(false));
    assert_eq!(verification, ops::Verification::BytesErased);

    // The provider sends the batch again: both are duplicates, and its body is not stored again.
    let again = app.post("marqeta", &[("Authorization", &auth)], batch.as_bytes()).await;
    assert_eq!(again.0, StatusCode::OK, "{:?}", again.1);
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_bodies").await, 0);
    assert!(!holds_email(&everything(&pool, &url).await), "a redelivery brings no erased data back");
}

/// What destinations answered to an event's messages is kept (a message's
/// `last_error`), and copied: a destination's last error, an open circuit's
/// alert and its Slack notification. A consumer that echoes what it was sent
/// puts the customer's e-mail in each: erasing the event clears every copy.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn erasing_an_event_clears_the_answers_kept_of_its_messages_wherever_they_were_copied(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let url = format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap());
    let pool = PgPool::connect_with(opts).await.unwrap();
    let payload = json!({"id": "evt_j", "data": {"object": {"receipt_email": EMAIL}}}).to_string();
    store(&pool, Provider::STRIPE, "evt_j", "charge.succeeded", &payload).await;
    let answer = format!("HTTP 400: {{\"error\": \"no mailbox for {EMAIL}\"}}");
    for sql in [
        "UPDATE webhook_inbox SET status = 'done', processed_at = now()",
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination, event_provider,
                                          event_id, attempts, dead_at, last_error)
         VALUES ('receipt', 'evt_j', '{}', 'receipt:evt_j', 'email', 'stripe', 'evt_j', 5, now(), $1)",
        "INSERT INTO relay_destinations (name, opened_at, failures, last_error) VALUES ('email', now(), 5, $1)",
    ] {
        sqlx::query(sql).bind(&answer).execute(&pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let rules = webhook_inbox::alerts::AlertRules::parse(
        r#"
[[alert]]
condition = "circuit_open"
notify = [{ destination = "ops-slack", format = "slack" }, { destination = "oncall" }]
"#,
    )
    .unwrap();
    assert_eq!(rules.evaluate(&pool, std::time::Duration::ZERO).await.unwrap().opened, 1);
    let before = everything(&pool, &url).await;
    assert!(before.matches(EMAIL).count() >= 5, "the message, the destination, the alert and its two notifications");

    assert!(matches!(ops::erase(&pool, "stripe", "evt_j", &BY).await.unwrap(), Erased::Erased { messages: 1, .. }));
    let after = everything(&pool, &url).await;
    assert!(!holds_email(&after), "no copy of the answer is left");
    let summary: String = scalar(&pool, "SELECT summary FROM inbox_alerts").await;
    assert!(summary.contains("the circuit of email is open") && summary.contains("[erased]"), "{summary}");
    let notices: Vec<(Value, bool)> = sqlx::query_as(
        "SELECT payload, dead_at IS NOT NULL FROM transactional_outbox WHERE aggregate_type = 'alert' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(notices, [(json!({}), true), (json!({}), true)], "not sent: emptied, and never sent");
}
