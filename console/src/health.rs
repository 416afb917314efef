//! The health page: per provider, deliveries received, duplicate and refused
//! (receive's tally, `inbox_receive_minutes`) and events failed (the inbox's
//! failed rows) per minute over the last hours, as bar charts drawn on the
//! server (SVG, no script); the queue's and the outbox's gauges; and which
//! secrets verified the deliveries of the last 7 days, by fingerprint.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use askama::Template;
use axum::{extract::State as Shared, response::Response};
use axum_extra::extract::Query;
use serde::Deserialize;

use super::{
    auth::Signed,
    page::{html, short_time, Nav, PageError},
    State,
};
use webhook_inbox::{
    ops::{self, MinuteCounts},
    Provider,
};

/// The periods the page offers, in hours.
const PERIODS: [i64; 4] = [1, 3, 6, 24];
/// Bars a chart has at most: a longer period groups minutes into each.
const BARS: i64 = 180;
/// A chart's size, in SVG units.
const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 40.0;

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct HealthParams {
    hours: Option<i64>,
}

#[derive(Template)]
#[template(path = "console/health.html")]
struct HealthPage {
    nav: Nav,
    periods: Vec<(i64, String, bool)>,
    from: String,
    to: String,
    bucket: i64,
    providers: Vec<ProviderHealth>,
    pending: i64,
    oldest_pending: String,
    held: i64,
    overdue_pauses: i64,
    failed_last_hour: i64,
    backlog: i64,
    oldest_backlog: String,
    dead: i64,
    secrets: Vec<SecretRow>,
}

struct ProviderHealth {
    name: String,
    charts: Vec<Chart>,
}

/// One series as bars: each bar's place, height and its words (a tooltip).
struct Chart {
    series: &'static str,
    total: i64,
    peak: i64,
    bars: Vec<Bar>,
    label: String,
}

struct Bar {
    x: String,
    y: String,
    w: String,
    h: String,
    title: String,
}

struct SecretRow {
    provider: String,
    fingerprint: String,
    configured: String,
    deliveries: i64,
    last: String,
    retire: bool,
}

/// A duration as a person reads it.
fn age(ms: f64) -> String {
    let s = (ms / 1000.0).round() as i64;
    match s {
        0 => "none".into(),
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86_400),
    }
}

/// `HH:MM` (UTC) of a Unix time.
fn clock(t: i64) -> String {
    let m = t.rem_euclid(86_400) / 60;
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// `n` bars of `bucket` minutes each from `start` (Unix seconds), of the counts per minute.
fn chart(series: &'static str, provider: &str, start: i64, bucket: i64, n: i64, counts: &BTreeMap<i64, i64>) -> Chart {
    let mut values = vec![0i64; n as usize];
    for (&minute, &c) in counts {
        let i = (minute - start) / (bucket * 60);
        if (0..n).contains(&i) {
            values[i as usize] += c;
        }
    }
    let peak = values.iter().copied().max().unwrap_or(0);
    let total = values.iter().sum();
    let w = WIDTH / n as f64;
    let bars = values
        .iter()
        .enumerate()
        .filter(|(_, &v)| v > 0)
        .map(|(i, &v)| {
            let h = (v as f64 / peak as f64 * (HEIGHT - 2.0)).max(1.5);
            let at = start + i as i64 * bucket * 60;
            Bar {
                x: format!("{:.2}", i as f64 * w),
                y: format!("{:.2}", HEIGHT - h),
                w: format!("{:.2}", (w - 0.6).max(0.8)),
                h: format!("{h:.2}"),
                title: format!("{v} {series} at {} UTC", clock(at)),
            }
        })
        .collect();
    let unit = if bucket == 1 { "a minute".to_string() } else { format!("in {bucket} minutes") };
    let label = format!("{provider}: {total} {series}, at most {peak} {unit}");
    Chart { series, total, peak, bars, label }
}

pub(super) async fn health(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    Query(p): Query<HealthParams>,
) -> Result<Response, PageError> {
    let nav = signed.nav(&state);
    let hours = p.hours.filter(|h| PERIODS.contains(h)).unwrap_or(3);
    let bucket = (hours * 60 + BARS - 1) / BARS;
    let bars = (hours * 60 + bucket - 1) / bucket;
    let minutes = ops::received_per_minute(&state.read, hours).await?;
    let failed = ops::failed_per_minute(&state.read, hours).await?;
    let inbox = ops::inbox_gauges(&state.read).await?;
    let outbox = ops::outbox_gauges(&state.read).await?;
    let used = ops::secret_usage(&state.read, Duration::from_secs(7 * 86_400)).await?;

    // The window: whole minutes, from `hours` ago to the current minute.
    let now: i64 = webhook_inbox::query_scalar("SELECT extract(epoch FROM date_trunc('minute', now()))::int8")
        .fetch_one(webhook_inbox::Autocommit(&state.read))
        .await?;
    let start = now - hours * 3600 + 60;
    let mut series: BTreeMap<String, [BTreeMap<i64, i64>; 4]> = BTreeMap::new();
    for (provider, minute, c) in &minutes {
        let s = series.entry(provider.clone()).or_default();
        let MinuteCounts { received, duplicates, rejected } = *c;
        for (i, v) in [received, duplicates, rejected].into_iter().enumerate() {
            *s[i].entry(*minute).or_default() += v;
        }
    }
    for (provider, minute, n) in &failed {
        *series.entry(provider.clone()).or_default()[3].entry(*minute).or_default() += n;
    }
    // Every provider with a secret here, whether it sent anything or not.
    for e in state.catalog.entries().filter(|e| state.secrets.is_configured(e.provider)) {
        series.entry(e.provider.as_str().to_string()).or_default();
    }
    let providers = series
        .iter()
        .map(|(name, s)| {
            let name = ops::escape(name).into_owned();
            let charts = ["received", "duplicate", "rejected", "failed"]
                .into_iter()
                .zip(s)
                .map(|(label, counts)| chart(label, &name, start, bucket, bars, counts))
                .collect();
            ProviderHealth { name, charts }
        })
        .collect();

    // The secrets configured here, and those that verified deliveries lately.
    let mut secrets = Vec::new();
    for e in state.catalog.entries().filter(|e| state.secrets.is_configured(e.provider)) {
        for (i, fingerprint) in state.secrets.fingerprints(e.provider).into_iter().enumerate() {
            let use_ = used
                .iter()
                .find(|u| u.provider == e.provider.as_str() && u.secret_fingerprint.as_deref() == Some(&fingerprint));
            secrets.push(SecretRow {
                provider: e.provider.as_str().to_string(),
                configured: format!("#{} of {}", i + 1, state.secrets.count(e.provider)),
                deliveries: use_.map_or(0, |u| u.deliveries),
                last: use_.map_or_else(|| "none in 7 days".into(), |u| short_time(&u.last_received_at)),
                retire: use_.is_none() && state.secrets.count(e.provider) > 1,
                fingerprint,
            });
        }
    }
    for u in &used {
        let configured =
            Provider::try_from(u.provider.as_str()).map(|p| state.secrets.fingerprints(p)).unwrap_or_default();
        match &u.secret_fingerprint {
            Some(f) if configured.contains(f) => {}
            f => secrets.push(SecretRow {
                provider: ops::escape(&u.provider).into_owned(),
                fingerprint: f
                    .clone()
                    .unwrap_or_else(|| format!("(stored before fingerprints: #{})", u.secret_index.unwrap_or(0) + 1)),
                configured: "not configured here".into(),
                deliveries: u.deliveries,
                last: short_time(&u.last_received_at),
                retire: false,
            }),
        }
    }

    let periods = PERIODS.iter().map(|&h| (h, nav.href("/health", &[("hours", &h.to_string())]), h == hours)).collect();
    let page = HealthPage {
        nav,
        periods,
        from: clock(start),
        to: clock(now + 60),
        bucket,
        providers,
        pending: inbox.pending,
        oldest_pending: age(inbox.oldest_pending_ms),
        held: inbox.held,
        overdue_pauses: inbox.overdue_pauses,
        failed_last_hour: inbox.failed_last_hour,
        backlog: outbox.backlog,
        oldest_backlog: age(outbox.oldest_backlog_ms),
        dead: outbox.dead,
        secrets,
    };
    html(page)
}
