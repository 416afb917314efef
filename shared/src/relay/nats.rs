//! The NATS JetStream sink: each message published to the destination's
//! subject and acknowledged by the stream that holds it, the message key as
//! `Nats-Msg-Id`, so that JetStream drops a re-send within the stream's
//! duplicate window.

use super::{sink::shown, RepliesFuture, Sink, SinkReply};
use crate::db::outbox::Outgoing;

/// `nats_subject` (with the server from `nats_url_env`). A stream must take
/// the subject: without one JetStream answers so, and the message is retried
/// (a destination left so opens its circuit). The connection is made in the
/// background and remade when lost; a delivery meanwhile waits, within the
/// destination's timeout.
pub struct NatsSink {
    jetstream: async_nats::jetstream::Context,
    subject: String,
    server: String,
}

impl NatsSink {
    /// A sink publishing to `subject` on the server at `url`
    /// (`nats://user:password@host:4222`); it connects in the background.
    pub async fn connect(url: &str, subject: impl Into<String>) -> Result<Self, String> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(url)
            .await
            .map_err(|e| format!("cannot connect to NATS: {e}"))?;
        Ok(NatsSink { jetstream: async_nats::jetstream::new(client), subject: subject.into(), server: shown(url) })
    }

    async fn publish(&self, m: &Outgoing) -> SinkReply {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", m.message_key.as_str());
        headers.insert("Content-Type", "application/json");
        if let Some(traceparent) = &m.trace_context {
            headers.insert("traceparent", traceparent.as_str());
        }
        let body = m.payload.0.to_string().into_bytes();
        let ack = match self.jetstream.publish_with_headers(self.subject.clone(), headers, body.into()).await {
            Ok(ack) => ack,
            Err(e) => return SinkReply::retry(format!("NATS publish: {e}")),
        };
        match ack.await {
            // A duplicate is a re-send JetStream already holds: delivered.
            Ok(_) => SinkReply::Delivered,
            Err(e) => SinkReply::retry(format!("JetStream did not acknowledge: {e}")),
        }
    }
}

impl Sink for NatsSink {
    fn target(&self) -> String {
        format!("nats {} {}", self.server, self.subject)
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(futures_util::future::join_all(messages.iter().map(|m| self.publish(m))))
    }
}
