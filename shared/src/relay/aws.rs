//! AWS sinks for the relay (official AWS SDK for Rust): SQS `SendMessageBatch`,
//! SNS `PublishBatch` and EventBridge `PutEvents`, with per-entry failures
//! handled one by one.

use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use crate::{
    db::outbox::Outgoing,
    relay::{RepliesFuture, Sink, SinkReply},
};

/// The three services take at most 10 entries and 256 KiB a call, and 256 KiB an entry.
const ENTRIES_PER_CALL: usize = 10;
const BYTES_PER_CALL: usize = 256 * 1024;
/// Room left in an entry for attributes and, for EventBridge, the envelope.
const BYTES_PER_ENTRY: usize = 250 * 1024;

/// Deliveries in order: entries too large for the service are refused at once
/// (they never fit), the rest are sent in calls within both limits.
async fn in_calls<'a, F, Fut>(
    messages: &'a [Outgoing],
    size: impl Fn(&Outgoing) -> usize,
    mut send: F,
) -> Vec<SinkReply>
where
    F: FnMut(Vec<&'a Outgoing>) -> Fut,
    Fut: std::future::Future<Output = Vec<SinkReply>>,
{
    let mut out: Vec<Option<SinkReply>> = vec![None; messages.len()];
    let mut calls: Vec<Vec<usize>> = vec![vec![]];
    let mut bytes = 0;
    for (i, m) in messages.iter().enumerate() {
        let n = size(m);
        if n > BYTES_PER_ENTRY {
            out[i] = Some(SinkReply::Rejected(format!("{n} bytes is over the service's limit for one message")));
            continue;
        }
        let call = calls.last_mut().expect("never empty");
        if call.len() == ENTRIES_PER_CALL || bytes + n > BYTES_PER_CALL {
            calls.push(vec![]);
            bytes = 0;
        }
        bytes += n;
        calls.last_mut().expect("never empty").push(i);
    }
    // Side by side, so a chunk takes one call's time at most (the sink's budget).
    let calls: Vec<Vec<usize>> = calls.into_iter().filter(|c| !c.is_empty()).collect();
    let sent = calls.iter().map(|call| send(call.iter().map(|i| &messages[*i]).collect()));
    let results = futures_util::future::join_all(sent.collect::<Vec<_>>()).await;
    for (call, results) in calls.into_iter().zip(results) {
        for (i, d) in call.into_iter().zip(results) {
            out[i] = Some(d);
        }
    }
    out.into_iter()
        .map(|d| d.unwrap_or(SinkReply::Retryable { reason: "no result for the entry".into(), retry_after: None }))
        .collect()
}

/// `RELAY_SQS_QUEUE_URL`. The body is the payload; the key rides along as the
/// `message_key` attribute. On a FIFO queue, `MessageDeduplicationId` is the key
/// and `MessageGroupId` the ordering key (else the aggregate id).
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    fifo: bool,
}

impl SqsSink {
    /// To `queue_url`, through `client`.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        let queue_url = queue_url.into();
        SqsSink { fifo: queue_url.ends_with(".fifo"), client, queue_url }
    }

    async fn send(&self, chunk: Vec<&Outgoing>) -> Vec<SinkReply> {
        let entries: Result<Vec<_>, _> = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let key = MessageAttributeValue::builder().data_type("String").string_value(&m.message_key).build()?;
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(m.payload.0.to_string())
                    .message_attributes("message_key", key)
                    .set_message_deduplication_id(self.fifo.then(|| dedup_id(&m.message_key)))
                    .set_message_group_id(
                        self.fifo.then(|| m.ordering_key.clone().unwrap_or_else(|| m.aggregate_id.clone())),
                    )
                    .build()
            })
            .collect();
        let entries = match entries {
            Ok(e) => e,
            Err(e) => return vec![SinkReply::Rejected(format!("SQS entry: {e}")); chunk.len()],
        };
        let sent = self.client.send_message_batch().queue_url(&self.queue_url).set_entries(Some(entries)).send().await;
        let output = match sent {
            Ok(o) => o,
            Err(e) => {
                let reason = format!("SQS SendMessageBatch: {}", aws_sdk_sqs::error::DisplayErrorContext(&e));
                return vec![SinkReply::Retryable { reason, retry_after: None }; chunk.len()];
            }
        };
        let ok = output.successful().iter().map(|e| Some(e.id()));
        let failed = output.failed().iter().map(|f| (f.id(), f.code(), f.message(), f.sender_fault()));
        batch_replies("SQS", chunk.len(), ok, failed)
    }
}

/// An SNS topic (`sns_topic_arn`): the message is the payload; the key rides
/// along as the `message_key` attribute. On a FIFO topic, `MessageDeduplicationId`
/// is the key and `MessageGroupId` the ordering key (else the aggregate id).
pub struct SnsSink {
    client: aws_sdk_sns::Client,
    topic_arn: String,
    fifo: bool,
}

impl SnsSink {
    /// To the topic `topic_arn`, through `client`.
    pub fn new(client: aws_sdk_sns::Client, topic_arn: impl Into<String>) -> Self {
        let topic_arn = topic_arn.into();
        SnsSink { fifo: topic_arn.ends_with(".fifo"), client, topic_arn }
    }

    async fn publish(&self, chunk: Vec<&Outgoing>) -> Vec<SinkReply> {
        use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
        let entries: Result<Vec<_>, _> = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let key = MessageAttributeValue::builder().data_type("String").string_value(&m.message_key).build()?;
                PublishBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message(m.payload.0.to_string())
                    .message_attributes("message_key", key)
                    .set_message_deduplication_id(self.fifo.then(|| dedup_id(&m.message_key)))
                    .set_message_group_id(
                        self.fifo.then(|| m.ordering_key.clone().unwrap_or_else(|| m.aggregate_id.clone())),
                    )
                    .build()
            })
            .collect();
        let entries = match entries {
            Ok(e) => e,
            Err(e) => return vec![SinkReply::Rejected(format!("SNS entry: {e}")); chunk.len()],
        };
        let sent = self
            .client
            .publish_batch()
            .topic_arn(&self.topic_arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await;
        let output = match sent {
            Ok(o) => o,
            Err(e) => {
                let reason = format!("SNS PublishBatch: {}", aws_sdk_sns::error::DisplayErrorContext(&e));
                return vec![SinkReply::Retryable { reason, retry_after: None }; chunk.len()];
            }
        };
        let ok = output.successful().iter().map(|e| e.id());
        let failed = output.failed().iter().map(|f| (f.id(), f.code(), f.message(), f.sender_fault()));
        batch_replies("SNS", chunk.len(), ok, failed)
    }
}

impl Sink for SnsSink {
    fn target(&self) -> String {
        format!("sns {}", self.topic_arn)
    }

    fn batch_size(&self) -> usize {
        ENTRIES_PER_CALL
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(in_calls(
            messages,
            |m| m.payload.0.to_string().len() + m.message_key.len(),
            move |chunk| self.publish(chunk),
        ))
    }
}

/// A batch call's replies, entry by entry (ids are the entries' positions):
/// what `service` lists as successful is delivered, a failure the sender
/// caused is refused, another is retried, and an entry it leaves out is retried.
fn batch_replies<'a>(
    service: &str,
    n: usize,
    successful: impl Iterator<Item = Option<&'a str>>,
    failed: impl Iterator<Item = (&'a str, &'a str, Option<&'a str>, bool)>,
) -> Vec<SinkReply> {
    let unknown =
        SinkReply::Retryable { reason: format!("{service} reported nothing for the entry"), retry_after: None };
    let mut out = vec![unknown; n];
    let index = |id: &str| id.parse::<usize>().ok().filter(|i| *i < n);
    for i in successful.flatten().filter_map(index) {
        out[i] = SinkReply::Delivered;
    }
    for (id, code, message, sender_fault) in failed {
        let Some(i) = index(id) else {
            continue;
        };
        let reason = format!("{service} {code}: {}", message.unwrap_or(""));
        out[i] =
            if sender_fault { SinkReply::Rejected(reason) } else { SinkReply::Retryable { reason, retry_after: None } };
    }
    out
}

/// SQS and SNS deduplication ids are at most 128 characters: a longer key is hashed.
fn dedup_id(key: &str) -> String {
    use sha2::{Digest, Sha256};
    if key.len() <= 128 && key.chars().all(|c| c.is_ascii_graphic()) {
        key.to_string()
    } else {
        hex::encode(Sha256::digest(key.as_bytes()))
    }
}

impl Sink for SqsSink {
    fn target(&self) -> String {
        format!("sqs {}", self.queue_url)
    }

    fn batch_size(&self) -> usize {
        ENTRIES_PER_CALL
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(in_calls(
            messages,
            |m| m.payload.0.to_string().len() + m.message_key.len(),
            move |chunk| self.send(chunk),
        ))
    }
}

/// `RELAY_EVENT_BUS`: source `webhook-inbox`, detail type the payload's `event`
/// (else the aggregate type), detail `{"message_key", "aggregate_type", "aggregate_id", "payload"}`.
pub struct EventBridgeSink {
    client: aws_sdk_eventbridge::Client,
    bus: String,
}

impl EventBridgeSink {
    /// To the bus `bus`, through `client`.
    pub fn new(client: aws_sdk_eventbridge::Client, bus: impl Into<String>) -> Self {
        EventBridgeSink { client, bus: bus.into() }
    }

    async fn put(&self, chunk: Vec<&Outgoing>) -> Vec<SinkReply> {
        let entries: Vec<PutEventsRequestEntry> = chunk
            .iter()
            .map(|m| {
                let detail_type =
                    m.payload.0.get("event").and_then(|e| e.as_str()).unwrap_or(&m.aggregate_type).to_string();
                let detail = serde_json::json!({
                    "message_key": m.message_key,
                    "aggregate_type": m.aggregate_type,
                    "aggregate_id": m.aggregate_id,
                    "payload": m.payload.0,
                });
                PutEventsRequestEntry::builder()
                    .event_bus_name(&self.bus)
                    .source("webhook-inbox")
                    .detail_type(detail_type)
                    .detail(detail.to_string())
                    .build()
            })
            .collect();
        let output = match self.client.put_events().set_entries(Some(entries)).send().await {
            Ok(o) => o,
            Err(e) => {
                let reason = format!("EventBridge PutEvents: {}", aws_sdk_eventbridge::error::DisplayErrorContext(&e));
                return vec![SinkReply::Retryable { reason, retry_after: None }; chunk.len()];
            }
        };
        // Result entries come back in request order; a failed one has an error code.
        let results = output.entries();
        (0..chunk.len())
            .map(|i| match results.get(i).and_then(|r| r.error_code().map(|c| (c, r.error_message().unwrap_or("")))) {
                None if i < results.len() => SinkReply::Delivered,
                None => SinkReply::Retryable {
                    reason: "EventBridge returned no result for the entry".into(),
                    retry_after: None,
                },
                Some((code, message)) => {
                    let reason = format!("EventBridge {code}: {message}");
                    if code.contains("Throttl")
                        || code.contains("InternalFailure")
                        || code.contains("ServiceUnavailable")
                    {
                        SinkReply::Retryable { reason, retry_after: None }
                    } else {
                        SinkReply::Rejected(reason)
                    }
                }
            })
            .collect()
    }
}

impl Sink for EventBridgeSink {
    fn target(&self) -> String {
        format!("eventbridge {}", self.bus)
    }

    fn batch_size(&self) -> usize {
        ENTRIES_PER_CALL
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(in_calls(
            messages,
            |m| m.payload.0.to_string().len() + m.message_key.len() + 512,
            move |chunk| self.put(chunk),
        ))
    }
}
