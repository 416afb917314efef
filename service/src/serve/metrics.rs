//! Prometheus metrics for `inbox serve` (`/metrics` on the admin port), through
//! the `metrics` crate and its Prometheus exporter: the same counts and gauges
//! as the functions' EMF lines, under the same names.
//!
//! An EMF count `name` of function `f` (and provider `p`) is the counter
//! `webhook_inbox_<name>_total{function="f",provider="p"}`; a gauge is
//! `webhook_inbox_<name>`, and an age in milliseconds
//! `webhook_inbox_<name>_seconds`, in seconds as Prometheus has it. Beside
//! them: receive's latency (`webhook_inbox_receive_duration_seconds`), its
//! group commits (`webhook_inbox_receive_group_size`, recorded by the
//! committers), and the passes that failed (`webhook_inbox_pass_errors_total{function}`).
//!
//! Without the recorder installed ([`install`], once per process) every call
//! here does nothing.

use std::{sync::OnceLock, time::Duration};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use webhook_inbox::host::{Kind, Metrics, Unit};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's recorder (once; later calls return the same handle).
pub(super) fn install() -> Result<&'static PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle);
    }
    // Histograms as Prometheus histograms (buckets), not summaries: they add up across instances.
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("webhook_inbox_receive_duration_seconds".into()),
            &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full("webhook_inbox_receive_group_size".into()),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        )?
        .build_recorder();
    let handle = recorder.handle();
    // Another recorder installed first (a team's own) keeps its place; ours then only renders nothing.
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was installed already: /metrics shows only what it renders");
    }
    Ok(HANDLE.get_or_init(|| handle))
}

/// The text `/metrics` answers.
pub(super) fn render() -> String {
    HANDLE.get().map(PrometheusHandle::render).unwrap_or_default()
}

/// Adds an EMF line's values to the metrics.
pub(super) fn record(m: &Metrics) {
    let labels = |provider: Option<&str>| {
        let mut labels = vec![("function", m.function().to_string())];
        if let Some(p) = provider {
            labels.push(("provider", p.to_string()));
        }
        if let Some(d) = m.destination() {
            labels.push(("destination", d.to_string()));
        }
        labels
    };
    for (name, value, unit, kind) in m.values() {
        match (kind, unit) {
            (Kind::Count, _) => {
                metrics::counter!(format!("webhook_inbox_{name}_total"), &labels(m.provider())).increment(value as u64)
            }
            (Kind::Gauge, Unit::Milliseconds) => {
                metrics::gauge!(format!("webhook_inbox_{name}_seconds"), &labels(m.provider())).set(value / 1000.0)
            }
            (Kind::Gauge, Unit::Count) => {
                metrics::gauge!(format!("webhook_inbox_{name}"), &labels(m.provider())).set(value)
            }
        }
    }
}

/// One delivery: its counts, and how long it took to answer.
pub(super) fn delivered(m: &Metrics, took: Duration) {
    record(m);
    metrics::histogram!("webhook_inbox_receive_duration_seconds").record(took.as_secs_f64());
}

/// A stage's pass that failed (the database, most often).
pub(super) fn pass_failed(function: &'static str) {
    metrics::counter!("webhook_inbox_pass_errors_total", "function" => function).increment(1);
}
