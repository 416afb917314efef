//! TOAST compression: lz4 for large values where the server has it, and the
//! migration that sets it giving up behind a long transaction.

use std::time::{Duration, Instant};

use sqlx::PgPool;

/// The payload, the raw bytes (an event's, a batch's) and an outbox message's
/// payload are compressed with lz4 where the server has it, with pglz (the
/// default) where it does not: a value written now says which.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn large_values_are_compressed_with_lz4_where_the_server_has_it(pool: PgPool) {
    let lz4: bool =
        sqlx::query_scalar("SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
            .fetch_one(&pool)
            .await
            .unwrap();
    // Compressible, and past the 2 kB a row holds before PostgreSQL compresses its values.
    let big = "a webhook payload ".repeat(500);
    let writes = [
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
         VALUES ('stripe', 'evt_big', 'invoice.paid', jsonb_build_object('note', $1::text), 'pending', convert_to($1, 'UTF8'), '{}', 0)",
        "INSERT INTO webhook_bodies (sha256, raw_body) VALUES (sha256(convert_to($1, 'UTF8')), convert_to($1, 'UTF8'))",
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key)
         VALUES ('invoice', 'in_big', jsonb_build_object('note', $1::text), 'invoice_paid:in_big')",
    ];
    for sql in writes {
        sqlx::query(sql).bind(&big).execute(&pool).await.unwrap();
    }
    let methods: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT pg_column_compression(payload) FROM webhook_inbox
         UNION ALL SELECT pg_column_compression(raw_body) FROM webhook_inbox
         UNION ALL SELECT pg_column_compression(raw_body) FROM webhook_bodies
         UNION ALL SELECT pg_column_compression(payload) FROM transactional_outbox",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want = if lz4 { "lz4" } else { "pglz" };
    assert_eq!(methods, vec![Some(want.to_string()); 4], "the server has lz4: {lz4}");
}

/// The lz4 migration waits at most 5 s for the tables' lock: behind a
/// transaction holding the inbox it fails (and its run rolls back, to be
/// tried again) rather than hold receive's claims up for as long.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_lz4_migration_gives_up_behind_a_long_transaction(pool: PgPool) {
    let lz4 = include_str!("../../migrations/20261204000001_lz4_compression.sql");
    let has_lz4: bool =
        sqlx::query_scalar("SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
            .fetch_one(&pool)
            .await
            .unwrap();
    if !has_lz4 {
        // Nothing to change, nothing to wait for.
        let mut long = pool.begin().await.unwrap();
        sqlx::query("UPDATE webhook_inbox SET attempts = attempts WHERE false").execute(&mut *long).await.unwrap();
        sqlx::raw_sql(lz4).execute(&pool).await.expect("a no-op without lz4");
        return;
    }
    let mut long = pool.begin().await.unwrap();
    sqlx::query("UPDATE webhook_inbox SET attempts = attempts WHERE false").execute(&mut *long).await.unwrap();
    let started = Instant::now();
    let mut migration = pool.begin().await.unwrap();
    let err = sqlx::raw_sql(lz4).execute(&mut *migration).await.unwrap_err().to_string();
    assert!(err.contains("lock timeout"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    migration.rollback().await.unwrap();
    long.commit().await.unwrap();
    let mut migration = pool.begin().await.unwrap();
    sqlx::raw_sql(lz4).execute(&mut *migration).await.expect("once the transaction ended");
    let after: String =
        sqlx::query_scalar("SELECT current_setting('lock_timeout')").fetch_one(&mut *migration).await.unwrap();
    assert_eq!(after, "0", "the migration's own wait does not outlast it");
    migration.commit().await.unwrap();
}
