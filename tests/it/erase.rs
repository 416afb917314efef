//! Erasure (`inbox erase`, `ops::erase`): one customer's data gone from the
//! inbox (payload, raw bytes, a batch's shared body once its last event is
//! erased, kept headers, failure reasons, audit copies) and from the outbox
//! messages their handlers wrote (those not sent yet are not sent), in no
//! row of the database and nowhere in a `pg_dump` of it; the keys stay, so a redelivery is still a
//! duplicate; replay and requeue refuse an erased event.

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use webhook_inbox::{
    ops::{self, Audit, Erased, EventQuery, Filter, PayloadMatch, Replayed, Since, Status},
    process::{
        handler::{Event, Handler, HandlerError, Outcome},
        handlers::Handlers,
        worker::Worker,
    },
    receive::providers::Provider,
    Message,
};

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
    let counted = ops::erase_matching(&pool, &query, &BY, true, |_| {}).await.unwrap();
    assert_eq!((counted.matching, counted.erased), (4, 4));
    assert!(holds_email(&everything(&pool, &url).await));

    // One event of the batch first: the shared body stays for the other.
    assert_eq!(
        ops::erase(&pool, "marqeta", "transactions:tx_jane_a", &BY).await.unwrap(),
        Erased::Erased { messages: 0 }
    );
    let bodies: i64 = scalar(&pool, "SELECT count(*) FROM webhook_bodies").await;
    assert_eq!(bodies, 1, "the other event of the batch still points at the body");
    let done = ops::erase_matching(&pool, &query, &BY, false, |_| {}).await.unwrap();
    assert_eq!(
        (done.matching, done.erased, done.already),
        (3, 3, 0),
        "the one erased before holds no payload to match"
    );
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM webhook_bodies").await,
        0,
        "the batch's body went with its last event"
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
    let requeued = ops::requeue_all(&pool, &filter, &replay, 100, |_| {}).await.unwrap();
    assert_eq!(requeued.requeued, 1, "the other customer's event only");
    assert_eq!(
        ops::erase(&pool, "stripe", "evt_jane_1", &BY).await.unwrap(),
        Erased::Already {
            at: scalar(&pool, "SELECT erased_at::text FROM webhook_inbox WHERE event_id = 'evt_jane_1'").await,
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
