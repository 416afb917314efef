//! Growth: what a stored event costs on disk and in WAL, against pgbench's
//! identical row, and whether the claim slows down as the inbox fills.
//!
//! Each side runs in a schema of its own, freshly migrated (the connections
//! set `search_path`), so that its tables hold only its rows: bytes per event
//! are the growth of every table, TOAST and index of the schema over the rows
//! stored, and WAL per event is the LSN's advance over them.

use std::{
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use sqlx::{postgres::PgConnectOptions, Connection, PgConnection, PgPool};
use webhook_inbox::{
    config::DbConfig,
    reconciliation::{claim, Found},
    schemes::NewEvent,
    App, Provider, ReceiveConfig,
};

use super::{body, http, pgbench, signature, Bench, Check, Figure, Load, Report, Until};

const EMPTY: &str = "bench_growth_empty";
const FULL: &str = "bench_growth_full";

impl Bench {
    pub(super) async fn growth(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let c = self.in_flight();
        let deliveries = (self.events / 2).max(c);
        let per_client = deliveries.div_ceil(c) as u64;
        let mut wal_peer = Figure::new(format!("pgbench, WAL per row ({deliveries} rows, {c} clients)"), "bytes");
        let mut wal_ours =
            Figure::new(format!("receive, WAL per stored event ({deliveries} events, {c} in flight)"), "bytes");
        let mut size_peer = Figure::new("pgbench, table, TOAST and indexes per row", "bytes");
        let mut size_ours = Figure::new("receive, table, TOAST and indexes per stored event", "bytes");
        let mut wal_ratio = Check::at_most("receive's WAL per event / pgbench's identical row", 1.1);
        for round in 1..=self.rounds {
            let (peer, ()) = self
                .in_schema(pool, config, EMPTY, |schema_url| async move {
                    pgbench(&schema_url, c, 1, Until::Deliveries(per_client)).await.map(|_| ())
                })
                .await?;
            let (ours, ()) = self
                .in_schema(pool, config, EMPTY, |schema_url| async move {
                    let mut config = config.clone();
                    config.db.url = Some(schema_url);
                    http(&config, c, Load::Stripe { copies: 1 }, Until::Deliveries(per_client)).await.map(|_| ())
                })
                .await?;
            self.round(format_args!(
                "growth, round {round}: pgbench {:.0} B WAL, {:.0} B stored per row | receive {:.0} B WAL, {:.0} B stored per event",
                peer.wal, peer.bytes, ours.wal, ours.bytes
            ));
            wal_peer.values.push(peer.wal);
            wal_ours.values.push(ours.wal);
            size_peer.values.push(peer.bytes);
            size_ours.values.push(ours.bytes);
            wal_ratio.values.push(ours.wal / peer.wal);
        }
        report.sections.push(("Growth per stored event".into(), vec![wal_peer, wal_ours, size_peer, size_ours]));
        report.checks.push(wal_ratio);
        self.compression(pool, config, report).await?;
        self.claim_latency(pool, config, report).await
    }

    /// TOAST compression, pglz (PostgreSQL's default) against lz4 (the
    /// inbox's, where the server has it): events shaped as a real Stripe
    /// PaymentIntent event (about 2 KB; ids, amounts and addresses vary, no
    /// repeated filler) written into a freshly migrated inbox by one INSERT
    /// on one connection, the two alternated; the statement's time, WAL and
    /// bytes per event.
    async fn compression(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let lz4: bool = sqlx::query_scalar(
            "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
        )
        .fetch_one(pool)
        .await?;
        if !lz4 {
            println!("compression: this server has no lz4, nothing to compare");
            return Ok(());
        }
        let n = (self.events / 5).max(1000);
        let figure =
            |what: &str, method: &str, unit| Figure::new(format!("{method}, {what} ({n} events of about 2 KB)"), unit);
        let mut figures = Vec::new();
        for method in ["pglz", "lz4"] {
            figures.push([
                figure("the INSERT's time per event", method, "µs"),
                figure("WAL per event", method, "bytes"),
                figure("table, TOAST and indexes per event", method, "bytes"),
            ]);
        }
        let mut ratio = Check::at_most("lz4 / pglz, the INSERT's time per event of about 2 KB", 1.0);
        for round in 1..=self.rounds {
            let mut times = Vec::new();
            for (method, [time, wal, bytes]) in ["pglz", "lz4"].into_iter().zip(figures.iter_mut()) {
                let (stored, took) = self
                    .in_schema(pool, config, EMPTY, |schema_url| insert_stripe_shaped(schema_url, method, n))
                    .await?;
                let per_event = took.as_secs_f64() / n as f64 * 1e6;
                self.round(format_args!(
                    "compression, round {round}, {method}: {per_event:.1} µs, {:.0} B WAL, {:.0} B stored per event",
                    stored.wal, stored.bytes
                ));
                time.values.push(per_event);
                wal.values.push(stored.wal);
                bytes.values.push(stored.bytes);
                times.push(per_event);
            }
            ratio.values.push(times[1] / times[0]);
        }
        report.sections.push(("TOAST compression, pglz and lz4".into(), figures.into_iter().flatten().collect()));
        report.checks.push(ratio);
        Ok(())
    }

    /// The claim's latency, one at a time, on an empty inbox and on one holding
    /// `growth_rows` events (alternated round by round).
    async fn claim_latency(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let url = config.db.url.as_deref().context("no database")?;
        let claims = if self.growth_rows >= 1_000_000 { 2_000 } else { 200 };
        let rows = self.growth_rows;
        let mut empty_p50 = Figure::new(format!("claim p50, empty inbox, {claims} claims one at a time"), "ms");
        let mut empty_p99 = Figure::new(format!("claim p99, empty inbox, {claims} claims one at a time"), "ms");
        let mut full_p50 = Figure::new(format!("claim p50, {rows} events stored"), "ms");
        let mut full_p99 = Figure::new(format!("claim p99, {rows} events stored"), "ms");
        let mut ratio = Check::at_most(format!("claim p50 with {rows} events / empty inbox"), 1.2);
        for schema in [EMPTY, FULL] {
            migrated_schema(pool, &config.db, schema).await?;
        }
        let seeding = Instant::now();
        let seed = schema_pool(&config.db, FULL, 2)?;
        // Small payloads: the claim's cost is in the indexes, whose keys are the
        // same as for full-size events.
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index,
                 received_at, processed_at)
             SELECT 'stripe', 'evt_' || md5(i::text), 'payment_intent.succeeded', '{}', 'done', '\\x00', '{}', 0,
                 now() - (($1 - i) * interval '1 ms'), now()
             FROM generate_series(1, $1) AS i",
        )
        .bind(rows as i64)
        .execute(&seed)
        .await
        .context("seeding the full inbox")?;
        sqlx::query("VACUUM ANALYZE webhook_inbox").execute(&seed).await?;
        seed.close().await;
        self.round(format_args!("claim latency: {rows} events stored in {:.0} s", seeding.elapsed().as_secs_f64()));
        for round in 1..=self.rounds {
            let empty = claim_times(url, EMPTY, round, claims).await?;
            let full = claim_times(url, FULL, round, claims).await?;
            self.round(format_args!(
                "claim latency, round {round}: empty p50 {:.3} ms, p99 {:.3} ms | {rows} stored p50 {:.3} ms, p99 {:.3} ms",
                empty.0, empty.1, full.0, full.1
            ));
            empty_p50.values.push(empty.0);
            empty_p99.values.push(empty.1);
            full_p50.values.push(full.0);
            full_p99.values.push(full.1);
            ratio.values.push(full.0 / empty.0);
        }
        for schema in [EMPTY, FULL] {
            sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).execute(pool).await?;
        }
        report
            .sections
            .push(("Claim latency as the inbox grows".into(), vec![empty_p50, empty_p99, full_p50, full_p99]));
        report.checks.push(ratio);
        Ok(())
    }

    /// Runs `fill` against `schema`, freshly migrated; WAL and bytes per row it stored.
    async fn in_schema<F, Fut, T>(
        &self,
        pool: &PgPool,
        config: &ReceiveConfig,
        schema: &str,
        fill: F,
    ) -> Result<(Stored, T)>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let url = config.db.url.as_deref().context("no database")?;
        migrated_schema(pool, &config.db, schema).await?;
        let before = footprint(pool, schema).await?;
        let filled = fill(schema_url(url, schema)).await?;
        let after = footprint(pool, schema).await?;
        let rows: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {schema}.webhook_inbox")).fetch_one(pool).await?;
        ensure!(rows > 0, "nothing was stored in {schema}");
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(pool).await?;
        Ok((Stored { wal: (after.0 - before.0) / rows as f64, bytes: (after.1 - before.1) / rows as f64 }, filled))
    }
}

/// Writes `n` events shaped as Stripe's `payment_intent.succeeded` into the
/// inbox at `url`, its payload and raw bytes compressed with `method`; the
/// INSERT's time (the bodies are made beforehand, kept uncompressed).
async fn insert_stripe_shaped(url: String, method: &str, n: usize) -> Result<Duration> {
    let mut conn = PgConnection::connect(&url).await?;
    sqlx::raw_sql(&format!(
        "ALTER TABLE webhook_inbox ALTER COLUMN payload SET COMPRESSION {method}, ALTER COLUMN raw_body SET COMPRESSION {method};
         CREATE TEMP TABLE stripe_shaped (id text, body text);
         ALTER TABLE stripe_shaped ALTER COLUMN body SET STORAGE EXTERNAL"
    ))
    .execute(&mut conn)
    .await?;
    sqlx::query(STRIPE_SHAPED).bind(n as i64).execute(&mut conn).await.context("making the bodies")?;
    let started = Instant::now();
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
         SELECT 'stripe', id, 'payment_intent.succeeded', body::jsonb, 'pending', convert_to(body, 'UTF8'), '{}', 0
         FROM stripe_shaped",
    )
    .execute(&mut conn)
    .await?;
    Ok(started.elapsed())
}

/// `$1` bodies shaped as a Stripe `payment_intent.succeeded` event (its
/// PaymentIntent's fields as Stripe sends them), each with its own ids,
/// amount, customer, email and address.
const STRIPE_SHAPED: &str = "
INSERT INTO stripe_shaped
SELECT 'evt_' || substr(md5(i::text), 1, 24), jsonb_build_object(
  'id', 'evt_' || substr(md5(i::text), 1, 24), 'object', 'event', 'api_version', '2026-10-28.acacia',
  'created', 1796000000 + i, 'livemode', false, 'pending_webhooks', 2,
  'request', jsonb_build_object('id', 'req_' || substr(md5('r' || i), 1, 14), 'idempotency_key', md5('k' || i)),
  'type', 'payment_intent.succeeded',
  'data', jsonb_build_object('object', jsonb_build_object(
    'id', 'pi_' || substr(md5('p' || i), 1, 24), 'object', 'payment_intent', 'amount', i % 100000, 'amount_capturable', 0,
    'amount_details', jsonb_build_object('tip', '{}'::jsonb), 'amount_received', i % 100000, 'application', null,
    'application_fee_amount', null,
    'automatic_payment_methods', jsonb_build_object('allow_redirects', 'always', 'enabled', true),
    'canceled_at', null, 'cancellation_reason', null, 'capture_method', 'automatic_async',
    'client_secret', 'pi_' || substr(md5('p' || i), 1, 24) || '_secret_' || substr(md5('s' || i), 1, 25),
    'confirmation_method', 'automatic', 'created', 1796000000 + i, 'currency', 'usd',
    'customer', 'cus_' || substr(md5('c' || (i % 5000)), 1, 14), 'description', 'Order #' || (100000 + i),
    'last_payment_error', null, 'latest_charge', 'ch_' || substr(md5('ch' || i), 1, 24), 'livemode', false,
    'metadata', jsonb_build_object('order_id', (100000 + i)::text, 'cart', substr(md5('cart' || i), 1, 16),
        'email', 'customer' || (i % 5000) || '@example.com'),
    'next_action', null, 'on_behalf_of', null, 'payment_method', 'pm_' || substr(md5('pm' || i), 1, 24),
    'payment_method_configuration_details', jsonb_build_object('id', 'pmc_1QxYzABCDEF', 'parent', null),
    'payment_method_options', jsonb_build_object(
        'card', jsonb_build_object('installments', null, 'mandate_options', null, 'network', null,
            'request_three_d_secure', 'automatic'),
        'link', jsonb_build_object('persistent_token', null)),
    'payment_method_types', jsonb_build_array('card', 'link'), 'processing', null,
    'receipt_email', 'customer' || (i % 5000) || '@example.com', 'review', null, 'setup_future_usage', null,
    'shipping', jsonb_build_object(
        'address', jsonb_build_object('city', 'Springfield', 'country', 'US', 'line1', (i % 999) || ' Main Street',
            'line2', null, 'postal_code', lpad((i % 99999)::text, 5, '0'), 'state', 'IL'),
        'carrier', null, 'name', 'Customer ' || (i % 5000), 'phone', null, 'tracking_number', null),
    'source', null, 'statement_descriptor', null, 'statement_descriptor_suffix', null, 'status', 'succeeded',
    'transfer_data', null, 'transfer_group', null)))::text
FROM generate_series(1, $1) AS i";

struct Stored {
    wal: f64,
    bytes: f64,
}

/// The current WAL position and the bytes of every relation of `schema`.
async fn footprint(pool: &PgPool, schema: &str) -> Result<(f64, f64)> {
    let (lsn, bytes): (f64, f64) = sqlx::query_as(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8,
                coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')",
    )
    .bind(schema)
    .fetch_one(pool)
    .await?;
    Ok((lsn, bytes))
}

/// `url` with its connections' `search_path` set to `schema`.
pub(super) fn schema_url(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// A pool of `size` connections on `schema` with no statement timeout (for seeding).
pub(super) fn schema_pool(db: &DbConfig, schema: &str, size: u32) -> Result<PgPool> {
    let url = schema_url(db.url.as_deref().context("no database")?, schema);
    let cfg = DbConfig { url: Some(url), pool_size: size, statement_timeout: Duration::ZERO, ..db.clone() };
    Ok(cfg.pool()?)
}

/// `schema`, dropped if there, created and migrated.
pub(super) async fn migrated_schema(pool: &PgPool, db: &DbConfig, schema: &str) -> Result<()> {
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).execute(pool).await?;
    let p = schema_pool(db, schema, 2)?;
    App::default().migrate(&p).await.with_context(|| format!("migrating {schema}"))?;
    p.close().await;
    Ok(())
}

/// p50 and p99 (ms) of `n` claims of new full-size events, one at a time on one
/// connection: the webhook claim's statement, as reconcile calls it.
async fn claim_times(url: &str, schema: &str, round: usize, n: usize) -> Result<(f64, f64)> {
    let mut conn =
        PgConnection::connect_with(&PgConnectOptions::from_str(url)?.options([("search_path", schema)])).await?;
    let headers = serde_json::json!({"stripe-signature": signature(1_796_000_000, "x")});
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("bench-claim-{round}-{i}");
        let raw = body(&id);
        let event = NewEvent::pending(id, "payment_intent.succeeded", raw.clone());
        let mut found = Found::default();
        let started = Instant::now();
        claim(&mut conn, Provider::STRIPE, raw.as_bytes(), &headers, &event, &mut found).await?;
        times.push(started.elapsed());
        ensure!(found.applied == 1, "a new event was not claimed as new: {found:?}");
    }
    conn.close().await?;
    times.sort_unstable();
    Ok((super::percentile(&times, 0.50), super::percentile(&times, 0.99)))
}
