//! The AMQP 0-9-1 sink (RabbitMQ, Amazon MQ): each message published to the
//! destination's exchange, routed by its aggregate type, persistent, with the
//! message key as `message_id`, and confirmed by the broker (publisher
//! confirms) before it counts as delivered.

use lapin::{
    options::{BasicPublishOptions, ConfirmSelectOptions},
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
};
use tokio::sync::Mutex;

use super::{sink::shown, RepliesFuture, Sink, SinkReply};
use crate::db::outbox::Outgoing;

/// `amqp_exchange` (with the broker from `amqp_url_env`). Published
/// `mandatory`: a message no queue is bound for comes back and is retried,
/// never dropped by the broker. The connection is made on the first
/// delivery and remade after it fails.
pub struct AmqpSink {
    url: String,
    exchange: String,
    channel: Mutex<Option<Channel>>,
}

impl AmqpSink {
    /// A sink publishing to `exchange` on the broker at `url`
    /// (`amqp://user:password@host:5672/%2f`, or `amqps://`).
    pub fn new(url: impl Into<String>, exchange: impl Into<String>) -> Self {
        AmqpSink { url: url.into(), exchange: exchange.into(), channel: Mutex::new(None) }
    }

    /// The open channel, in confirm mode, connecting first if there is none.
    async fn channel(&self) -> Result<Channel, String> {
        let mut held = self.channel.lock().await;
        if let Some(channel) = held.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| format!("cannot connect to the AMQP broker: {e}"))?;
        let channel = connection.create_channel().await.map_err(|e| format!("AMQP channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("AMQP publisher confirms: {e}"))?;
        *held = Some(channel.clone());
        Ok(channel)
    }

    async fn publish(&self, channel: &Channel, m: &Outgoing) -> SinkReply {
        let properties = BasicProperties::default()
            .with_delivery_mode(2) // persistent
            .with_content_type("application/json".into())
            .with_message_id(m.message_key.as_str().into())
            .with_type(m.aggregate_type.as_str().into());
        let body = m.payload.0.to_string().into_bytes();
        let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
        let confirm = match channel
            .basic_publish(self.exchange.as_str().into(), m.aggregate_type.as_str().into(), options, &body, properties)
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => return SinkReply::retry(format!("AMQP publish: {e}")),
        };
        match confirm.await {
            Ok(Confirmation::Ack(None)) => SinkReply::Delivered,
            Ok(Confirmation::Ack(Some(_))) => SinkReply::retry(format!(
                "no queue is bound to exchange {:?} for routing key {:?}: returned by the broker",
                self.exchange, m.aggregate_type
            )),
            Ok(Confirmation::Nack(_)) => SinkReply::retry("the broker refused the message (nack)"),
            Ok(Confirmation::NotRequested) => SinkReply::retry("the channel is not in confirm mode"),
            Err(e) => SinkReply::retry(format!("AMQP confirm: {e}")),
        }
    }
}

impl Sink for AmqpSink {
    fn target(&self) -> String {
        format!("amqp {} {}", shown(&self.url), self.exchange)
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(async move {
            let channel = match self.channel().await {
                Ok(channel) => channel,
                Err(reason) => return vec![SinkReply::retry(reason); messages.len()],
            };
            let replies: Vec<SinkReply> =
                futures_util::future::join_all(messages.iter().map(|m| self.publish(&channel, m))).await;
            if !channel.status().connected() {
                // Connect again at the next delivery.
                *self.channel.lock().await = None;
            }
            replies
        })
    }
}
