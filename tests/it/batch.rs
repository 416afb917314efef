//! Batch handlers: the stock application's (payments, deposits) on batches
//! with twins, shared accounts and one bad event among good ones, and a
//! team's own, written from the crate's root only (typed payload, several
//! types, `Event::enqueue_all`, a wrong count of outcomes).

use std::sync::{Arc, Mutex};

use inbox_tests::{fast_worker_config, later, scalar, store, MIGRATOR};
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::{
    query, BatchHandler, Event, HandlerError, Handlers, Message, Outcome, PgConnection, Provider, RegistrationError,
    Worker,
};

fn payment(event_id: &str, pi: &str, amount: serde_json::Value) -> String {
    json!({"id": event_id, "type": "payment_intent.succeeded",
           "data": {"object": {"id": pi, "amount_received": amount, "currency": "eur"}}})
    .to_string()
}

fn deposit(token: &str, account: &str, amount: &str) -> String {
    json!({"token": token, "type": "gpa.credit", "state": "COMPLETION", "user_token": account, "amount": amount})
        .to_string()
}

async fn status(pool: &PgPool, event_id: &str) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, failure_reason FROM webhook_inbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A log line's bytes, as a test's subscriber writes them.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One malformed payment among twenty: the batch handler's call fails, the
/// worker runs its events one at a time, and only the bad one fails, with its
/// own reason; the others' payments and messages commit in the same batch.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_batch_with_one_bad_event_among_good_ones_fails_only_it_and_says_which(pool: PgPool) {
    for i in 0..21 {
        let (id, amount) = (format!("evt_b{i:02}"), if i == 10 { json!("12.00") } else { json!(100 + i) });
        store(&pool, Provider::STRIPE, &id, "payment_intent.succeeded", &payment(&id, &format!("pi_b{i}"), amount))
            .await;
    }
    let w = Worker::new(pool.clone(), stock::handlers(), fast_worker_config());
    let captured = Captured::default();
    let writer = captured.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish(),
    );
    let c = w.run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied, c.failed, c.retried), (21, 20, 1, 0));
    assert_eq!(
        status(&pool, "evt_b10").await,
        ("failed".into(), Some("attempt 1: data.object.amount_received is not an integer".into()))
    );
    let (payments, messages, done): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM transactional_outbox),
                (SELECT count(*) FROM webhook_inbox WHERE status = 'done')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((payments, messages, done), (20, 20, 20));
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("a batch handler failed; its events run one at a time"), "{logged}");
    assert!(logged.contains("evt_b10"), "the failed event is named: {logged}");
}

/// Twin events for one PaymentIntent in one batch: one payment, one message;
/// the first in receive order makes it, the twin finds it made.
#[sqlx::test(migrator = "MIGRATOR")]
async fn twin_payment_intents_in_one_batch_make_one_payment_and_one_message(pool: PgPool) {
    for (id, pi) in [("evt_t1", "pi_twin"), ("evt_x", "pi_other"), ("evt_t2", "pi_twin"), ("evt_t3", "pi_twin")] {
        store(&pool, Provider::STRIPE, id, "payment_intent.succeeded", &payment(id, pi, json!(500))).await;
    }
    let c = Worker::new(pool.clone(), stock::handlers(), fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((c.applied, c.no_effect), (2, 2));
    let made: Vec<(String, String)> =
        sqlx::query_as("SELECT payment_id, stripe_event_id FROM payments ORDER BY 1").fetch_all(&pool).await.unwrap();
    assert_eq!(made, [("pi_other".into(), "evt_x".into()), ("pi_twin".into(), "evt_t1".into())]);
    let messages: Vec<String> = sqlx::query_scalar("SELECT message_key FROM transactional_outbox ORDER BY message_key")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(messages, ["payment_succeeded:pi_other", "payment_succeeded:pi_twin"]);
}

/// Deposits to one account in one batch: credited in receive order, each
/// message carrying the balance its deposit left, in that order on the
/// account's ordering key; a token twice is credited once.
#[sqlx::test(migrator = "MIGRATOR")]
async fn deposits_to_one_account_in_one_batch_carry_their_running_balances_in_order(pool: PgPool) {
    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES ('acct_r', 100.00), ('acct_s', 0)")
        .execute(&pool)
        .await
        .unwrap();
    for (id, token, account, amount) in [
        ("transactions:dep_a", "dep_a", "acct_r", "10.00"),
        ("transactions:dep_s", "dep_s", "acct_s", "1.25"),
        ("transactions:dep_b", "dep_b", "acct_r", "20.50"),
        ("reconciled:dep_a", "dep_a", "acct_r", "10.00"),
        ("transactions:dep_c", "dep_c", "acct_r", "5"),
    ] {
        store(&pool, Provider::MARQETA, id, stock::deposits::EVENT_TYPE, &deposit(token, account, amount)).await;
    }
    let c = Worker::new(pool.clone(), stock::handlers(), fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((c.applied, c.no_effect, c.retried, c.failed), (4, 1, 0, 0));
    let messages: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT payload->>'account_id', payload->>'token', payload->>'balance'
         FROM transactional_outbox ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected = [("acct_r", "dep_a", "110.00"), ("acct_r", "dep_b", "130.50"), ("acct_r", "dep_c", "135.50")];
    let of_r: Vec<_> = messages.iter().filter(|m| m.0 == "acct_r").collect();
    assert_eq!(of_r.len(), 3, "{messages:?}");
    for (m, (account, token, balance)) in of_r.iter().zip(expected) {
        assert_eq!((m.0.as_str(), m.1.as_str(), m.2.as_str()), (account, token, balance));
    }
    assert!(messages.contains(&("acct_s".into(), "dep_s".into(), "1.25".into())), "{messages:?}");
    let balances: Vec<String> =
        sqlx::query_scalar("SELECT balance::text FROM accounts ORDER BY account_id").fetch_all(&pool).await.unwrap();
    assert_eq!(balances, ["135.50", "1.25"]);
}

/// A deposit for an account that does not exist yet, among deposits that can
/// land: it alone is retried, with its reason; the others are credited.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_missing_account_in_a_batch_retries_only_its_deposit(pool: PgPool) {
    sqlx::query("INSERT INTO accounts (account_id) VALUES ('acct_1'), ('acct_2')").execute(&pool).await.unwrap();
    for (token, account) in [("d1", "acct_1"), ("d2", "acct_missing"), ("d3", "acct_2"), ("d4", "acct_1")] {
        let id = format!("transactions:{token}");
        store(&pool, Provider::MARQETA, &id, stock::deposits::EVENT_TYPE, &deposit(token, account, "2.00")).await;
    }
    let c = Worker::new(pool.clone(), stock::handlers(), fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((c.applied, c.retried), (3, 1));
    assert_eq!(
        status(&pool, "transactions:d2").await,
        ("pending".into(), Some("attempt 1: account acct_missing does not exist yet".into()))
    );
    let (ledger, balances): (i64, String) =
        sqlx::query_as("SELECT (SELECT count(*) FROM account_deposits), (SELECT sum(balance)::text FROM accounts)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((ledger, balances.as_str()), (3, "6.00"));
}

/// A team's batch handler, typed, for two event types: one call per batch.
#[derive(Deserialize)]
struct Shipment {
    parcel: String,
    depot: String,
}

#[derive(Clone, Default)]
struct Ship {
    calls: Arc<Mutex<Vec<Vec<String>>>>,
}

impl BatchHandler for Ship {
    type Payload = Shipment;

    async fn handle_batch(
        &self,
        conn: &mut PgConnection,
        events: &[Event<Shipment>],
    ) -> Result<Vec<Outcome>, HandlerError> {
        self.calls.lock().unwrap().push(events.iter().map(|e| e.event_id.clone()).collect());
        query("INSERT INTO parcels (parcel, event_type) SELECT * FROM unnest($1::text[], $2::text[])")
            .bind(events.iter().map(|e| e.payload.parcel.as_str()).collect::<Vec<_>>())
            .bind(events.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
        // One message per depot: a second event for a depot finds its key taken.
        let messages: Vec<_> = events
            .iter()
            .map(|e| {
                let depot = &e.payload.depot;
                (e, Message::new("depot", depot, format!("depot:{depot}"), json!({"parcel": e.payload.parcel})))
            })
            .collect();
        let written = Event::enqueue_all(conn, &messages).await?;
        Ok(written.into_iter().map(|w| if w { Outcome::Applied } else { Outcome::NoEffect }).collect())
    }

    fn lock_key(&self, event: &Event<Shipment>) -> Option<String> {
        Some(event.payload.depot.clone())
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_team_s_batch_handler_takes_its_types_at_once_in_lock_key_order(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE parcels (seq SERIAL, parcel TEXT, event_type TEXT)").execute(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, message_key, payload)
         VALUES ('depot', 'lyon', 'depot:lyon', '{}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (id, ty, parcel, depot) in [
        ("s1", "parcel.shipped", "p1", "paris"),
        ("s2", "parcel.returned", "p2", "berlin"),
        ("s3", "parcel.shipped", "p3", "paris"),
        ("s4", "parcel.shipped", "p4", "lyon"),
        ("s5", "parcel.shipped", "not a parcel", ""),
    ] {
        let payload =
            if id == "s5" { json!({"parcel": 5}) } else { json!({"parcel": parcel, "depot": depot}) }.to_string();
        store(&pool, Provider::STANDARD, id, ty, &payload).await;
    }
    let ship = Ship::default();
    let handlers = Handlers::new().on_each("standard", &["parcel.shipped", "parcel.returned"], ship.clone()).unwrap();
    let c = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((c.taken, c.applied, c.no_effect, c.failed), (5, 2, 2, 1));
    assert_eq!(*ship.calls.lock().unwrap(), [["s2", "s4", "s1", "s3"]], "one call, by depot, then receive order");
    let (status, reason) = status(&pool, "s5").await;
    assert_eq!(status, "failed");
    assert!(reason.unwrap().contains("invalid type: integer `5`, expected a string"), "serde's reason");
    let messages: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT message_key, payload->>'parcel' FROM transactional_outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected = [("depot:lyon", None), ("depot:berlin", Some("p2")), ("depot:paris", Some("p1"))];
    let messages: Vec<_> = messages.iter().map(|(k, p)| (k.as_str(), p.as_deref())).collect();
    assert_eq!(messages, expected, "ids in the order given; a key taken, or taken earlier, is not written");
    let written_by: Vec<(String, String)> = sqlx::query_as(
        "SELECT o.message_key, e.event_id FROM transactional_outbox o
         JOIN webhook_inbox e ON (e.provider, e.event_id) = (o.event_provider, o.event_id) ORDER BY o.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(written_by, [("depot:berlin".into(), "s2".into()), ("depot:paris".into(), "s1".into())]);
}

/// A batch handler that returns a wrong number of outcomes has a bug: its
/// events fail with that reason, and nothing it wrote commits.
struct Miscounts;

impl BatchHandler for Miscounts {
    type Payload = serde_json::Value;

    async fn handle_batch(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Outcome>, HandlerError> {
        query("INSERT INTO miscounted VALUES ($1)").bind(events.len() as i32).execute(conn).await?;
        Ok(vec![Outcome::Applied; events.len() + 1])
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wrong_count_of_outcomes_fails_the_events_with_that_reason(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE miscounted (n INT)").execute(&pool).await.unwrap();
    for id in ["m1", "m2", "m3"] {
        store(&pool, Provider::STANDARD, id, "miscount", "{}").await;
    }
    let handlers = Handlers::new().on("standard", "miscount", Miscounts).unwrap();
    let c = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!(c.failed, 3);
    assert_eq!(
        status(&pool, "m2").await,
        ("failed".into(), Some("attempt 1: the batch handler returned 2 outcomes for a batch of 1".into()))
    );
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM miscounted").await, 0);
}

#[test]
fn a_type_twice_in_on_each_or_registered_already_is_refused() {
    let twice = Handlers::new().on_each("stripe", &["a", "b", "a"], Ship::default()).unwrap_err();
    assert_eq!(twice.to_string(), "a handler for stripe \"a\" is registered already");
    let handlers = Handlers::new().on_each("stripe", &["a", "b"], Ship::default()).unwrap();
    assert!(matches!(handlers.on_each("stripe", &["c", "b"], Ship::default()),
        Err(RegistrationError::Duplicate { event_type, .. }) if event_type == "b"));
    let none = Handlers::new().on_each("stripe", &[], Ship::default()).unwrap_err();
    assert_eq!(none.to_string(), "a handler for stripe has an empty event type, or none");
}

/// Fails on more than one event, succeeds on one, slowly: its events run one
/// at a time after each failed call.
struct SlowAlone;

impl BatchHandler for SlowAlone {
    type Payload = serde_json::Value;

    async fn handle_batch(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Outcome>, HandlerError> {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if events.len() > 1 {
            return Err(HandlerError::transient("not in a batch"));
        }
        query("INSERT INTO slow_alone VALUES ($1)").bind(&events[0].event_id).execute(conn).await?;
        Ok(vec![Outcome::Applied])
    }
}

/// Past the deadline, the events of a group running one at a time are left
/// pending, spending no attempt; those run before it are done and counted.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_group_running_one_at_a_time_stops_at_the_deadline(pool: PgPool) {
    sqlx::raw_sql("CREATE TABLE slow_alone (event_id TEXT)").execute(&pool).await.unwrap();
    for i in 0..8 {
        store(&pool, Provider::STANDARD, &format!("slow_{i}"), "slow", "{}").await;
    }
    let handlers = Handlers::new().on("standard", "slow", SlowAlone).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(450);
    let c = Worker::new(pool.clone(), handlers, fast_worker_config()).run_once(deadline).await.unwrap();
    let (done, untouched, applied): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'done'),
                count(*) FILTER (WHERE status = 'pending' AND attempts = 0),
                (SELECT count(*) FROM slow_alone)
         FROM webhook_inbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((1..8).contains(&done), "some ran before the deadline, not all: {done}");
    assert_eq!((done + untouched, applied), (8, done), "the others untouched");
    assert_eq!((c.taken, c.applied), (done as usize, done as usize), "only what ran is counted");
}
