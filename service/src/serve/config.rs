//! The service's own settings (`inbox serve`), and where it sends traces.

use std::time::Duration;

use webhook_inbox::config::{ConfigError, Env};
use webhook_inbox::GroupConfig;

fn invalid(var: &'static str, reason: &str) -> ConfigError {
    ConfigError::Invalid { var: var.into(), reason: reason.into() }
}

/// The service's own settings, read from the environment (`ServeConfig::read`).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS`, default 25000: how long a shutdown waits for
    /// the requests and batches in flight (within a container's usual 30 s).
    pub drain_timeout: Duration,
    /// `INBOX_WORKERS`, default 2: workers taking batches at once (process role).
    pub workers: usize,
    /// Receive's group commit.
    pub group: GroupConfig,
}

impl ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS` (25000), `INBOX_WORKERS` (2), and receive's
    /// group commit: `INBOX_GROUP_COMMIT_MAX` (64; 1 turns it off),
    /// `INBOX_GROUP_COMMIT_WAIT_US` (0), `INBOX_GROUP_COMMIT_COMMITTERS` (2) and
    /// `INBOX_GROUP_COMMIT_STALL_US` (5000).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let group = GroupConfig::default();
        Ok(ServeConfig {
            drain_timeout: env.millis("INBOX_DRAIN_TIMEOUT_MS", 25_000)?,
            workers: env.positive("INBOX_WORKERS", 2usize)?,
            group: GroupConfig {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_go_to_the_otlp_endpoint_as_the_specification_builds_it() {
        let read = |pairs: &[(&str, &str)]| otlp_traces(&Env::from_pairs(pairs));
        assert_eq!(read(&[]).unwrap(), None);
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        assert_eq!(read(&base).unwrap(), Some(("http://collector:4318/v1/traces".into(), "webhook-inbox".into())));
        let own =
            [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://otlp.example/in"), ("OTEL_SERVICE_NAME", "inbox-eu")];
        assert_eq!(read(&own).unwrap(), Some(("https://otlp.example/in".into(), "inbox-eu".into())));
        let err = read(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317")]).unwrap_err().to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && !err.contains("collector"), "{err}");
    }
}
