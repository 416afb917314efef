//! The HTTP sink: `POST RELAY_HTTP_URL` with `Idempotency-Key: <message_key>`.

use std::time::Duration;

use super::{RepliesFuture, ReplyFuture, Sink, SinkReply};
use crate::{
    core::error::ConfigError,
    core::http::{http_client, retry_after},
    db::outbox::Outgoing,
};

/// Response bodies kept as a dead message's reason are cut to this many bytes.
pub const REASON_BODY_BYTES: usize = 500;

/// `RELAY_HTTP_URL`: POSTs the payload as JSON with `Idempotency-Key: <message_key>`.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    timeout: Duration,
}

impl HttpSink {
    pub fn new(url: impl Into<String>, timeout: Duration) -> Result<Self, ConfigError> {
        let client = http_client(timeout).map_err(|e| ConfigError::Invalid {
            var: "RELAY_HTTP_URL".into(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(HttpSink { client, url: url.into(), timeout })
    }
}

impl Sink for HttpSink {
    fn name(&self) -> &'static str {
        "http"
    }

    /// The request timeout (connection included): a chunk's requests run side by side.
    fn budget(&self) -> Duration {
        self.timeout
    }

    fn deliver_all<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(futures_util::future::join_all(messages.iter().map(|m| self.deliver(m))))
    }
}

impl HttpSink {
    /// One message: POST it with its key.
    pub fn deliver<'a>(&'a self, m: &'a Outgoing) -> ReplyFuture<'a> {
        Box::pin(async move {
            let Ok(key) = reqwest::header::HeaderValue::from_str(&m.message_key) else {
                return SinkReply::Rejected("message_key is not a valid header value".into());
            };
            let mut request = self.client.post(&self.url).header("Idempotency-Key", key);
            // The relay's span, when traces are on: the consumer's spans join the delivery's trace.
            if let Some(traceparent) = &m.trace_context {
                request = request.header("traceparent", traceparent);
            }
            let sent = request.json(&m.payload.0).send().await;
            let response = match sent {
                Ok(r) => r,
                // Without the URL: it may carry credentials.
                Err(e) => {
                    return SinkReply::Retryable {
                        reason: format!("HTTP request failed: {}", e.without_url()),
                        retry_after: None,
                    }
                }
            };
            let status = response.status();
            if status.is_success() {
                return SinkReply::Delivered;
            }
            let retry_after = retry_after(response.headers());
            let body = response.bytes().await.unwrap_or_default();
            let cut = &body[..body.len().min(REASON_BODY_BYTES)];
            let reason = format!("HTTP {}: {}", status.as_u16(), String::from_utf8_lossy(cut));
            if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
                SinkReply::Retryable { reason, retry_after }
            } else {
                SinkReply::Rejected(reason)
            }
        })
    }
}
