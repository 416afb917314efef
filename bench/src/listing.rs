//! The console's listing (`ops::list_events`) on an inbox holding its
//! retention window: every filter the console offers, through the library's
//! own call, on the console's pool settings; then payload searches and the
//! counts at the top.

use std::time::Instant;

use anyhow::{Context, Result};
use base64::Engine as _;
use sqlx::PgPool;
use webhook_inbox::{
    config::DbConfig,
    ops::{self, Cursor, EventQuery, IdMatch, PayloadMatch, Since, Status},
    ReceiveConfig,
};

use super::{
    growth::{migrated_schema, schema_url},
    Bench, Check, Figure, Report,
};

const SCHEMA: &str = "bench_listing";
/// Runs of each case in a round; the figure is the median of the last `KEPT`
/// (the first warm the cache, as a console in use has it).
const RUNS: usize = 12;
const KEPT: usize = 7;
/// The target for the listing and each of its filters.
const TARGET_MS: f64 = 200.0;

/// A cursor that starts a page after this row (what a page's `next` would be).
fn cursor(received_at: &str, provider: &str, event_id: &str) -> Result<Cursor> {
    let json = serde_json::json!({"received_at": received_at, "provider": provider, "event_id": event_id});
    Ok(Cursor::parse(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string()))?)
}

impl Bench {
    pub(super) async fn listing(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let rows = self.growth_rows;
        migrated_schema(pool, &config.db, SCHEMA).await?;
        let url = config.db.url.as_deref().context("no database")?;
        // The console's own pool settings (its statement timeout included), in the schema.
        let in_schema = DbConfig { url: Some(schema_url(url, SCHEMA)), ..config.db.clone() };
        let seed = DbConfig { statement_timeout: std::time::Duration::ZERO, ..in_schema.clone() }.pool()?;
        let seeding = Instant::now();
        // 60 days of events: five providers, eight types and one rare (0.01%),
        // 0.1% failed, 0.1% unhandled, 1,000 pending, the rest done.
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, received_at, processed_at,
                                        raw_body, secret_index, failure_reason)
             SELECT (ARRAY['stripe', 'shopify', 'github', 'standard', 'marqeta'])[1 + i % 5],
                    'evt_' || md5(i::text),
                    CASE WHEN i % 10007 = 0 THEN 'customer.subscription.deleted'
                         ELSE (ARRAY['invoice.paid', 'orders/paid', 'push', 'payment_intent.succeeded', 'customer.updated',
                                     'orders/create', 'pull_request', 'charge.refunded'])[1 + (i * 7) % 8] END,
                    jsonb_build_object('id', i, 'data', jsonb_build_object('amount', i % 1000, 'customer', 'cus_' || i % 50000)),
                    s, now() - interval '60 days' + (i * 60 * 86400.0 / $1) * interval '1 second',
                    CASE WHEN s <> 'pending' THEN now() END,
                    convert_to('{\"id\":' || i || '}', 'UTF8'), 0,
                    CASE WHEN s = 'failed' THEN 'handler error: timeout' END
             FROM generate_series(1, $1) AS i,
                  LATERAL (SELECT CASE WHEN i % 1000 = 0 THEN 'failed' WHEN i % 997 = 0 THEN 'unhandled'
                                       WHEN i > $1 - 1000 THEN 'pending' ELSE 'done' END AS s) AS st",
        )
        .bind(rows as i64)
        .execute(&seed)
        .await
        .context("seeding the listing's inbox")?;
        sqlx::query("VACUUM ANALYZE webhook_inbox").execute(&seed).await?;
        self.round(format_args!("listing: {rows} events stored in {:.0} s", seeding.elapsed().as_secs_f64()));

        let (deep_at, deep_provider, deep_id): (String, String, String) = sqlx::query_as(
            "SELECT received_at::text, provider, event_id FROM webhook_inbox ORDER BY received_at DESC OFFSET $1 LIMIT 1",
        )
        .bind((rows / 2) as i64)
        .fetch_one(&seed)
        .await?;
        let some_id: String =
            sqlx::query_scalar("SELECT event_id FROM webhook_inbox WHERE provider = 'github' OFFSET $1 LIMIT 1")
                .bind((rows / 20) as i64)
                .fetch_one(&seed)
                .await?;
        let (month_ago, day_before): (String, String) =
            sqlx::query_as("SELECT (now() - interval '31 days')::text, (now() - interval '30 days')::text")
                .fetch_one(&seed)
                .await?;
        seed.close().await;
        let deep = cursor(&deep_at, &deep_provider, &deep_id)?;
        let q = |f: fn(&mut EventQuery)| {
            let mut q = EventQuery::default();
            f(&mut q);
            q
        };
        let day = Some(Since::Ago(std::time::Duration::from_secs(86_400)));
        // (name, query, after, checked against the target)
        let cases: Vec<(&str, EventQuery, Option<Cursor>, bool)> = vec![
            ("everything, first page", EventQuery::default(), None, true),
            ("everything, a page half-way down", EventQuery::default(), Some(deep.clone()), true),
            ("provider", q(|q| q.provider = Some("shopify".into())), None, true),
            ("event type", q(|q| q.event_type = Some("charge.refunded".into())), None, true),
            (
                "a rare event type (0.01%)",
                q(|q| q.event_type = Some("customer.subscription.deleted".into())),
                None,
                true,
            ),
            ("status failed", q(|q| q.statuses = vec![Status::Failed]), None, true),
            ("status unhandled, a page half-way down", q(|q| q.statuses = vec![Status::Unhandled]), Some(deep), true),
            (
                "provider, type and failed",
                q(|q| {
                    q.provider = Some("github".into());
                    q.event_type = Some("push".into());
                    q.statuses = vec![Status::Failed];
                }),
                None,
                true,
            ),
            (
                "one day, 30 days ago",
                EventQuery {
                    since: Some(Since::At(month_ago)),
                    until: Some(Since::At(day_before)),
                    ..Default::default()
                },
                None,
                true,
            ),
            (
                "event id",
                EventQuery { event_id: Some(IdMatch::Exact(some_id.clone())), ..Default::default() },
                None,
                true,
            ),
            (
                "event id and its provider",
                EventQuery {
                    provider: Some("github".into()),
                    event_id: Some(IdMatch::Exact(some_id.clone())),
                    ..Default::default()
                },
                None,
                true,
            ),
            (
                "event id prefix (10 characters)",
                EventQuery { event_id: Some(IdMatch::Prefix(some_id[..10].to_string())), ..Default::default() },
                None,
                true,
            ),
            ("event id prefix every id has", q(|q| q.event_id = Some(IdMatch::Prefix("evt_".into()))), None, true),
            (
                "payload holds a text, last day",
                EventQuery {
                    payload: Some(PayloadMatch::parse("\"cus_4242\"")),
                    since: day.clone(),
                    ..Default::default()
                },
                None,
                false,
            ),
            (
                "payload contains JSON, last day",
                EventQuery {
                    payload: Some(PayloadMatch::parse(r#"{"data": {"customer": "cus_4242"}}"#)),
                    since: day,
                    ..Default::default()
                },
                None,
                false,
            ),
            (
                "payload holds a text, last 7 days",
                EventQuery {
                    payload: Some(PayloadMatch::parse("\"cus_4242\"")),
                    since: Some(Since::Ago(std::time::Duration::from_secs(7 * 86_400))),
                    ..Default::default()
                },
                None,
                false,
            ),
        ];
        let console = in_schema.pool()?;
        let mut figures: Vec<Figure> =
            cases.iter().map(|(name, ..)| Figure::new(format!("listing, {name}, {rows} events"), "ms")).collect();
        let mut counts =
            Figure::new(format!("the counts per status (ops::status_counts, exact up to 10,000), {rows} events"), "ms");
        let mut count_star = Figure::new("count(*) by status, which they replace", "ms");
        let mut slowest = Check::at_most(format!("the slowest listing filter, {rows} events (ms)"), TARGET_MS);
        for round in 1..=self.rounds {
            let mut worst = 0.0f64;
            for ((name, query, after, checked), figure) in cases.iter().zip(&mut figures) {
                let mut times = Vec::with_capacity(RUNS);
                for _ in 0..RUNS {
                    let started = Instant::now();
                    ops::list_events(&console, query, after.as_ref(), 50)
                        .await
                        .with_context(|| format!("listing {name}"))?;
                    times.push(started.elapsed().as_secs_f64() * 1e3);
                }
                let ms = super::median(&times[RUNS - KEPT..]);
                if *checked {
                    worst = worst.max(ms);
                }
                figure.values.push(ms);
            }
            let (mut c, mut s) = (Vec::new(), Vec::new());
            for _ in 0..RUNS {
                let started = Instant::now();
                ops::status_counts(&console, 10_000).await?;
                c.push(started.elapsed().as_secs_f64() * 1e3);
                let started = Instant::now();
                sqlx::query("SELECT status, count(*) FROM webhook_inbox GROUP BY 1").execute(&console).await?;
                s.push(started.elapsed().as_secs_f64() * 1e3);
            }
            counts.values.push(super::median(&c[RUNS - KEPT..]));
            count_star.values.push(super::median(&s[RUNS - KEPT..]));
            self.round(format_args!("listing, round {round}: the slowest filter {worst:.2} ms"));
            slowest.values.push(worst);
        }
        console.close().await;
        sqlx::query(&format!("DROP SCHEMA {SCHEMA} CASCADE")).execute(pool).await?;
        figures.extend([counts, count_star]);
        report.sections.push(("The console's listing".into(), figures));
        report.checks.push(slowest);
        Ok(())
    }
}
