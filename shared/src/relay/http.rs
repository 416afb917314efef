//! The HTTP sink: `POST` the payload as JSON with `Idempotency-Key: <message_key>`,
//! signed as Standard Webhooks signs when the destination has a signing secret.

use std::time::Duration;

use super::{signing::Signer, RepliesFuture, Sink, SinkReply};
use crate::{
    core::http::{head, http_client, retry_after},
    db::outbox::Outgoing,
};
use webhook_inbox_schemes::ConfigError;

/// Response bodies kept as a dead message's reason are cut to this many bytes.
pub(crate) const REASON_BODY_BYTES: usize = 500;

/// POSTs each message's payload as JSON to one URL, with `Idempotency-Key:
/// <message_key>`, the relay's `traceparent` when traces are on, and, with a
/// [`Signer`], `webhook-id`, `webhook-timestamp` and `webhook-signature`.
/// A 2xx is delivered; a 5xx, 408, 429 (after its `Retry-After`) or no answer
/// is retried; any other status is dead at once, with its status and the start
/// of its body. Redirects are not followed.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    signer: Option<Signer>,
}

impl HttpSink {
    /// To `url`, each request bounded by `timeout` (the connection included).
    pub fn new(url: impl Into<String>, timeout: Duration) -> Result<Self, ConfigError> {
        let client = http_client(timeout).map_err(|e| ConfigError::Invalid {
            var: "RELAY_HTTP_URL".into(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(HttpSink { client, url: url.into(), signer: None })
    }

    /// Signs each delivery with `signer`.
    pub fn signed(mut self, signer: Signer) -> Self {
        self.signer = Some(signer);
        self
    }
}

impl Sink for HttpSink {
    /// The URL without its credentials, query or fragment.
    fn target(&self) -> String {
        format!("http {}", super::sink::shown(&self.url))
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(futures_util::future::join_all(messages.iter().map(|m| self.post(m))))
    }
}

impl HttpSink {
    async fn post(&self, m: &Outgoing) -> SinkReply {
        let Ok(key) = reqwest::header::HeaderValue::from_str(&m.message_key) else {
            return SinkReply::Rejected("message_key is not a valid header value".into());
        };
        // The exact bytes sent are the bytes signed.
        let body = m.payload.0.to_string().into_bytes();
        let mut request = self
            .client
            .post(&self.url)
            .header("Idempotency-Key", key.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(signer) = &self.signer {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let timestamp = now.as_secs() as i64;
            request = request
                .header("webhook-id", key)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signer.sign(&m.message_key, timestamp, &body));
        }
        // The relay's span, when traces are on: the consumer's spans join the delivery's trace.
        if let Some(traceparent) = &m.trace_context {
            request = request.header("traceparent", traceparent);
        }
        let response = match request.body(body).send().await {
            Ok(r) => r,
            // Without the URL: it may carry credentials.
            Err(e) => return SinkReply::retry(format!("HTTP request failed: {}", e.without_url())),
        };
        let status = response.status();
        if status.is_success() {
            return SinkReply::Delivered;
        }
        let retry_after = retry_after(response.headers());
        // The start of the answer only: a body without end costs these bytes, not the relay's memory.
        let cut = head(response, REASON_BODY_BYTES).await;
        let reason = format!("HTTP {}: {}", status.as_u16(), String::from_utf8_lossy(&cut));
        if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
            SinkReply::Retryable { reason, retry_after }
        } else {
            SinkReply::Rejected(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::http::tests::endless;

    /// A destination answering 400 with a body of a GiB, streamed: the reason
    /// keeps its first 500 bytes, and the relay reads no more than a few
    /// chunks (what the sockets' buffers took before the relay went away).
    #[tokio::test]
    async fn a_refusal_with_a_body_of_a_gib_is_read_to_its_reason_only() {
        let peer = endless("400 Bad Request").await;
        let sink = HttpSink::new(format!("http://{}/", peer.addr), Duration::from_secs(60)).unwrap();
        let message = Outgoing {
            id: 1,
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            payload: sqlx::types::Json(serde_json::json!({})),
            message_key: "k1".into(),
            destination: "default".into(),
            ordering_key: None,
            attempts: 1,
            trace_context: None,
        };
        let replies = sink.deliver(std::slice::from_ref(&message)).await;
        match &replies[..] {
            [SinkReply::Rejected(reason)] => assert_eq!(*reason, format!("HTTP 400: {}", "x".repeat(500))),
            other => panic!("not refused: {other:?}"),
        }
        peer.ended.await.unwrap();
        let sent = peer.written.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 64 * 1024 * 1024, "the destination wrote {sent} bytes: its answer was read past its reason");
    }
}
