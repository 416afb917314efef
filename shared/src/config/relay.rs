//! The relay's settings and sinks.

use std::{sync::Arc, time::Duration};

use super::{invalid, ConfigError, Env};
use crate::relay::{aws, HttpSink, RelayConfig, Sink};

impl RelayConfig {
    /// `RELAY_BATCH_SIZE` (100), `RELAY_CONCURRENCY` (8), `RELAY_MAX_ATTEMPTS` (10),
    /// `RELAY_RETRY_BASE_MS` (1000), `RELAY_LEASE_MS` (300000).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let d = RelayConfig::default();
        Ok(RelayConfig {
            batch_size: env.positive("RELAY_BATCH_SIZE", d.batch_size)?,
            concurrency: env.positive("RELAY_CONCURRENCY", d.concurrency)?,
            max_attempts: env.positive("RELAY_MAX_ATTEMPTS", d.max_attempts)?,
            retry_base: env.millis("RELAY_RETRY_BASE_MS", d.retry_base.as_millis() as u64)?,
            lease: env.millis("RELAY_LEASE_MS", d.lease.as_millis() as u64)?,
        })
    }
}

/// The relay's sinks, as configured: any of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkConfig {
    /// `RELAY_HTTP_URL`, with `RELAY_HTTP_TIMEOUT_MS` (10000).
    pub http: Option<(String, Duration)>,
    /// `RELAY_SQS_QUEUE_URL`.
    pub sqs_queue_url: Option<String>,
    /// `RELAY_EVENT_BUS`.
    pub event_bus: Option<String>,
}

impl SinkConfig {
    /// Reads these settings from `env` (the variables are named on each field).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let http = match env.var("RELAY_HTTP_URL") {
            Some(url) => {
                match url::Url::parse(&url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
                    Ok(_) => return Err(invalid("RELAY_HTTP_URL", "is not an http:// or https:// URL with a host")),
                    Err(e) => return Err(invalid("RELAY_HTTP_URL", format!("is not a URL ({e})"))),
                }
                Some((url, env.millis("RELAY_HTTP_TIMEOUT_MS", 10_000)?))
            }
            None => None,
        };
        Ok(SinkConfig { http, sqs_queue_url: env.var("RELAY_SQS_QUEUE_URL"), event_bus: env.var("RELAY_EVENT_BUS") })
    }

    /// The sinks themselves; AWS credentials and region come from the usual AWS environment.
    pub async fn build(&self) -> Result<Vec<Arc<dyn Sink>>, ConfigError> {
        let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
        if let Some((url, timeout)) = &self.http {
            sinks.push(Arc::new(HttpSink::new(url.clone(), *timeout)?));
        }
        if self.sqs_queue_url.is_some() || self.event_bus.is_some() {
            let sdk = crate::core::aws::from_env().await;
            if let Some(queue) = &self.sqs_queue_url {
                sinks.push(Arc::new(aws::SqsSink::new(aws_sdk_sqs::Client::new(&sdk), queue.clone())));
            }
            if let Some(bus) = &self.event_bus {
                sinks.push(Arc::new(aws::EventBridgeSink::new(aws_sdk_eventbridge::Client::new(&sdk), bus.clone())));
            }
        }
        Ok(sinks)
    }
}
