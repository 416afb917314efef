//! What a destination's messages are handed to: the built-in sinks and a team's own.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use crate::db::outbox::Outgoing;

/// A failure's kind, for the log and traces (`HTTP 400`, `SQS refused`): the
/// reason up to its first `": "`, at most 80 characters. What the destination
/// answered after it may echo what it was sent (an event's personal data):
/// only the message's `last_error` keeps that, where an erasure clears it.
pub(crate) fn headline(reason: &str) -> &str {
    let head = reason.split_once(": ").map_or(reason, |(head, _)| head);
    match head.char_indices().nth(80) {
        Some((end, _)) => &head[..end],
        None => head,
    }
}

/// What a sink replied about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkReply {
    /// Taken: the message is sent.
    Delivered,
    /// Worth another try (5xx, 408, 429, timeouts, a broker not answering), no
    /// sooner than `retry_after` if the sink said so. Counts toward the
    /// destination's circuit breaker.
    Retryable {
        /// What went wrong, kept as the message's `last_error`.
        reason: String,
        /// The sink's own wait, if it gave one (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Will never be accepted (another 4xx, a message over the sink's size
    /// limit): dead at once.
    Rejected(String),
}

impl SinkReply {
    /// A [`SinkReply::Retryable`] without a wait of the sink's own.
    pub fn retry(reason: impl Into<String>) -> Self {
        SinkReply::Retryable { reason: reason.into(), retry_after: None }
    }
}

/// What [`Sink::deliver`] returns: one reply per message, in order.
pub type RepliesFuture<'a> = Pin<Box<dyn Future<Output = Vec<SinkReply>> + Send + 'a>>;

/// Where a destination's messages go: HTTP, SQS, EventBridge, NATS JetStream
/// and RabbitMQ are built in; a team adds its own (a Kafka producer, an email
/// API) by implementing this and registering it on the
/// [`App`](crate::App::with_sink) under a name a `[destination.NAME]` of the
/// destinations file refers to (`sink = "kafka"`).
///
/// The relay calls [`Sink::deliver`] with up to [`Sink::batch_size`]
/// messages, as many calls at once as the destination's `concurrency`
/// allows, each bounded by its `timeout_ms` (a call that outlasts it counts
/// as retryable for each of its messages: what it did is unknown, and the
/// message goes again under the same key). A message is delivered at least
/// once: a sink passes [`Outgoing::message_key`] on, for its consumers to
/// deduplicate on.
///
/// ```
/// use webhook_inbox::sinks::{Outgoing, RepliesFuture, Sink, SinkReply};
///
/// /// Prints each message: a stand-in for a producer of your own.
/// struct Stdout;
///
/// impl Sink for Stdout {
///     fn target(&self) -> String {
///         "stdout".into()
///     }
///
///     fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
///         Box::pin(async move {
///             messages
///                 .iter()
///                 .map(|m| {
///                     println!("{} {}", m.message_key, m.payload.0);
///                     SinkReply::Delivered
///                 })
///                 .collect()
///         })
///     }
/// }
///
/// let app = webhook_inbox::App::default().with_sink("stdout", Stdout);
/// # drop(app);
/// ```
pub trait Sink: Send + Sync + 'static {
    /// What it sends to, for `inbox outbox destinations`, the console and the
    /// logs: never a credential (`http https://billing.internal/hooks`).
    fn target(&self) -> String;

    /// The most messages one [`Sink::deliver`] call takes (1 unless the sink
    /// sends batches, as SQS and EventBridge do: 10).
    fn batch_size(&self) -> usize {
        1
    }

    /// Delivers `messages`: one reply per message, in order.
    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a>;
}

/// Several sinks as one (the `default` destination when more than one of
/// `RELAY_HTTP_URL`, `RELAY_SQS_QUEUE_URL` and `RELAY_EVENT_BUS` is set): a
/// message is delivered once each took it, in turn; its first failure is its
/// reply, and it then goes to all of them again, under the same key.
pub(crate) struct Fanout(pub(crate) Vec<Arc<dyn Sink>>);

impl Sink for Fanout {
    fn target(&self) -> String {
        self.0.iter().map(|s| s.target()).collect::<Vec<_>>().join(" + ")
    }

    fn batch_size(&self) -> usize {
        self.0.iter().map(|s| s.batch_size()).min().unwrap_or(1).max(1)
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(async move {
            let mut replies = vec![SinkReply::Delivered; messages.len()];
            for sink in &self.0 {
                let (pending, idx): (Vec<Outgoing>, Vec<usize>) = messages
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| replies[*i] == SinkReply::Delivered)
                    .map(|(i, m)| (m.clone(), i))
                    .unzip();
                if pending.is_empty() {
                    break;
                }
                let got = checked(pending.len(), sink.deliver(&pending).await);
                for (i, reply) in idx.into_iter().zip(got) {
                    replies[i] = reply;
                }
            }
            replies
        })
    }
}

/// `replies` if there is one per message, else a retryable reply for each:
/// a sink that miscounts has not said what it delivered.
pub(crate) fn checked(messages: usize, replies: Vec<SinkReply>) -> Vec<SinkReply> {
    if replies.len() == messages {
        return replies;
    }
    let reason = format!("the sink gave {} replies for {messages} messages", replies.len());
    vec![SinkReply::retry(reason); messages]
}

/// A URL as a sink's target shows it: without its credentials, query or
/// fragment (any may carry a token).
pub(crate) fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "(not a URL)".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failure_s_headline_is_its_kind_never_what_the_destination_answered() {
        assert_eq!(super::headline("HTTP 400: {\"error\": \"no mailbox for jane@example.com\"}"), "HTTP 400");
        assert_eq!(super::headline("HTTP 503"), "HTTP 503");
        assert_eq!(super::headline(&"x".repeat(500)).len(), 80);
    }
}
