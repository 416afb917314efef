//! The optional hash-partitioned inbox keeps the key unique; time partitioning
//! would not, which is why it is not offered.

use std::time::{Duration, Instant};

use http::StatusCode;
use inbox_tests::*;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    Executor, PgPool,
};
use webhook_inbox::{testing, Stage, Worker, WorkerConfig};
use webhook_inbox_schemes::Provider;

const VARIANT: &str = webhook_inbox_migrations::HASH_PARTITIONED_INBOX;

/// Claims the pending event `id` as receive does: true when it is new, false for a duplicate.
async fn claim(pool: &PgPool, id: &str) -> bool {
    testing::store(pool, Provider::STRIPE, id, "t", "{}").await.unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_hash_partitioned_inbox_refuses_every_duplicate_and_spreads_keys(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    assert!(claim(&pool, "before").await);
    let indexes = |pool: PgPool| async move {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE tablename = 'webhook_inbox' ORDER BY indexname",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        names
    };
    let before = indexes(pool.clone()).await;
    let compressed: String = sqlx::query_scalar(
        "SELECT attcompression::text FROM pg_attribute WHERE attrelid = 'webhook_inbox'::regclass AND attname = 'payload'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.execute(VARIANT).await.expect("the variant applies to a migrated inbox");
    assert_eq!(indexes(pool.clone()).await, before, "every index the migrations made is made again, by its name");

    let partitioned: bool = sqlx::query_scalar("SELECT relkind = 'p' FROM pg_class WHERE relname = 'webhook_inbox'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(partitioned);
    let compression: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT a.attcompression::text FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
         WHERE c.relname LIKE 'webhook_inbox%' AND c.relkind IN ('r', 'p') AND a.attname IN ('payload', 'raw_body')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(compression, [compressed], "the table and its partitions compress as the inbox did");
    assert!(!claim(&pool, "before").await, "existing rows were moved: a duplicate");
    for i in 0..200 {
        assert!(claim(&pool, &format!("evt_{i}")).await, "evt_{i} is new");
    }
    for i in 0..200 {
        assert!(!claim(&pool, &format!("evt_{i}")).await, "evt_{i} is a duplicate");
    }
    let (rows, partitions): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT tableoid) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 201);
    assert!(partitions >= 12, "keys spread over the partitions: {partitions}");

    // The rest of the product runs unchanged on it: receive, and the worker's SKIP LOCKED.
    let r = receiver(opts, secrets(false));
    let body = br#"{"id":"evt_http","type":"payment_intent.succeeded","data":{"object":{"id":"pi_p","amount_received":5,"currency":"usd"}}}"#;
    for expected in ["accepted", "duplicate"] {
        let (status, answer) = post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], body))], body).await;
        assert_eq!((status, answer["status"].as_str()), (StatusCode::OK, Some(expected)));
    }
    let worker = Worker::new(pool.clone(), stock::handlers(), WorkerConfig::default());
    let counts = worker.run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(counts.taken, 202);
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(payments, 1);

    // The console's counts and listing read it too: its rows are its partitions'.
    pool.execute("ANALYZE webhook_inbox").await.unwrap();
    let counts = webhook_inbox::ops::status_counts(&pool, 1000).await.unwrap();
    use webhook_inbox::ops::{Count, Status};
    // The 201 events of type `t` have no handler; the one Stripe payment is done (of 202 rows, not twice that).
    let expected =
        [(Status::Unhandled, Count::Exact(201)), (Status::Ignored, Count::Exact(0)), (Status::Done, Count::Exact(1))];
    assert_eq!(counts[2..], expected);
    // Past the cap, the estimate: of 202 rows, not twice that.
    let estimated = webhook_inbox::ops::status_counts(&pool, 0).await.unwrap();
    assert_eq!(estimated[4], (Status::Done, Count::About(202)));
    let query = webhook_inbox::ops::EventQuery {
        event_id: Some(webhook_inbox::ops::IdMatch::Exact("evt_7".into())),
        ..Default::default()
    };
    let page = webhook_inbox::ops::list_events(&pool, &query, None, 10).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ["evt_7"]);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn time_partitioning_would_lose_the_keys_uniqueness(pool: PgPool) {
    // PostgreSQL refuses the key alone on a table partitioned by time...
    let refused = pool
        .execute(
            "CREATE TABLE inbox_by_month (provider text, event_id text, received_at timestamptz NOT NULL,
                                          PRIMARY KEY (provider, event_id)) PARTITION BY RANGE (received_at)",
        )
        .await
        .unwrap_err();
    assert_eq!(webhook_inbox::ops::sqlstate(&refused).as_deref(), Some("0A000"), "{refused}");

    // ...so the key must include the time, and then the same event is claimed twice.
    pool.execute(
        "CREATE TABLE inbox_by_month (provider text, event_id text, received_at timestamptz NOT NULL,
                                      PRIMARY KEY (provider, event_id, received_at)) PARTITION BY RANGE (received_at);
         CREATE TABLE inbox_2026_10 PARTITION OF inbox_by_month FOR VALUES FROM ('2026-10-01') TO ('2026-11-01');
         CREATE TABLE inbox_2026_11 PARTITION OF inbox_by_month FOR VALUES FROM ('2026-11-01') TO ('2026-12-01');",
    )
    .await
    .unwrap();
    let claim = "INSERT INTO inbox_by_month VALUES ('stripe', 'evt_1', $1::timestamptz) ON CONFLICT DO NOTHING";
    let first = sqlx::query(claim).bind("2026-10-31T23:59:59Z").execute(&pool).await.unwrap().rows_affected();
    let redelivered = sqlx::query(claim).bind("2026-11-01T00:00:05Z").execute(&pool).await.unwrap().rows_affected();
    assert_eq!((first, redelivered), (1, 1), "a redelivery across the month boundary is claimed a second time");
}
