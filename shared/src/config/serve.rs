//! The service's own settings (`inbox serve`), and where it sends traces.

use std::time::Duration;

use super::{invalid, Env};
use crate::config::ConfigError;

/// The service's own settings, read from the environment (`ServeConfig::read`).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS`, default 25000: how long a shutdown waits for
    /// the requests and batches in flight (within a container's usual 30 s).
    pub drain_timeout: Duration,
    /// `INBOX_WORKERS`, default 2: workers taking batches at once (process role).
    pub workers: usize,
    /// Receive's group commit.
    pub group: crate::receive::claim::group::GroupConfig,
}

impl ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS` (25000), `INBOX_WORKERS` (2), and receive's
    /// group commit: `INBOX_GROUP_COMMIT_MAX` (64; 1 turns it off),
    /// `INBOX_GROUP_COMMIT_WAIT_US` (0), `INBOX_GROUP_COMMIT_COMMITTERS` (2) and
    /// `INBOX_GROUP_COMMIT_STALL_US` (5000).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let group = crate::receive::claim::group::GroupConfig::default();
        Ok(ServeConfig {
            drain_timeout: env.millis("INBOX_DRAIN_TIMEOUT_MS", 25_000)?,
            workers: env.positive("INBOX_WORKERS", 2usize)?,
            group: crate::receive::claim::group::GroupConfig {
                max: env.positive("INBOX_GROUP_COMMIT_MAX", group.max)?,
                wait: Duration::from_micros(env.parse("INBOX_GROUP_COMMIT_WAIT_US", 0u64)?),
                committers: env.positive("INBOX_GROUP_COMMIT_COMMITTERS", group.committers)?,
                stall: Duration::from_micros(env.parse("INBOX_GROUP_COMMIT_STALL_US", group.stall.as_micros() as u64)?),
            },
        })
    }
}

/// Where `inbox serve` sends its traces, if anywhere, and as which service:
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` (the specification's rule);
/// `OTEL_SERVICE_NAME`, default `webhook-inbox`.
pub(crate) fn otlp_traces(env: &Env) -> Result<Option<(String, String)>, ConfigError> {
    let (var, endpoint) = match (env.var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env.var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        (Some(traces), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces),
        (None, Some(base)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/traces", base.trim_end_matches('/'))),
        (None, None) => return Ok(None),
    };
    if url::Url::parse(&endpoint).map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
        return Err(invalid(var, "is not an http:// or https:// URL"));
    }
    let service = env.var("OTEL_SERVICE_NAME").unwrap_or_else(|| "webhook-inbox".into());
    Ok(Some((endpoint, service)))
}
