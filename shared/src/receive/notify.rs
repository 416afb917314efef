//! Tells `process` that work arrived: once the claim has committed, one SQS
//! message `{"provider","event_id"}` per new pending event goes to
//! `INBOX_PROCESS_QUEUE_URL`, so the event is processed within a second instead
//! of at the next schedule. Best effort: a send that fails or takes too long is
//! logged and left to the schedule, which sweeps whatever a lost message left
//! behind; the sender's answer never depends on it.

use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use webhook_inbox_schemes::Provider;

/// The longest receive waits for the queue before answering anyway.
pub(crate) const NOTIFY_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) struct ProcessQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl ProcessQueue {
    pub(crate) fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        ProcessQueue { client, url: url.into() }
    }

    /// The queue at `url`, with credentials and region from the usual AWS environment.
    pub(crate) async fn connect(url: impl Into<String>) -> Self {
        let sdk = crate::core::aws::from_env().await;
        ProcessQueue::new(aws_sdk_sqs::Client::new(&sdk), url)
    }

    /// One message per event, in calls of at most ten, all within [`NOTIFY_TIMEOUT`].
    pub(crate) async fn notify(&self, provider: Provider, event_ids: &[&str]) {
        if event_ids.is_empty() {
            return;
        }
        match tokio::time::timeout(NOTIFY_TIMEOUT, self.send(provider, event_ids)).await {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                tracing::warn!(%provider, events = event_ids.len(), %reason, "process queue not told; the schedule will take the events")
            }
            Err(_) => {
                tracing::warn!(%provider, events = event_ids.len(), "process queue too slow; the schedule will take the events")
            }
        }
    }

    async fn send(&self, provider: Provider, event_ids: &[&str]) -> Result<(), String> {
        for chunk in event_ids.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let body = serde_json::json!({ "provider": provider.as_str(), "event_id": id }).to_string();
                    SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(body).build()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let out = self
                .client
                .send_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
            if !out.failed().is_empty() {
                return Err(format!("{} of {} messages refused", out.failed().len(), chunk.len()));
            }
        }
        Ok(())
    }
}

/// Tells `relay` that messages are waiting: after a `process` invocation
/// whose handlers wrote outbox messages, one SQS message `{}` goes to
/// `INBOX_RELAY_QUEUE_URL`, and the relay function, triggered by it, runs a
/// pass at once instead of at its next schedule. Best effort, as above.
pub(crate) struct RelayQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl RelayQueue {
    /// The queue at `url`, with credentials and region from the usual AWS environment.
    pub(crate) async fn connect(url: impl Into<String>) -> Self {
        let sdk = crate::core::aws::from_env().await;
        RelayQueue { client: aws_sdk_sqs::Client::new(&sdk), url: url.into() }
    }

    /// One message, within [`NOTIFY_TIMEOUT`]; a failure is logged, and the schedule runs the relay anyway.
    pub(crate) async fn nudge(&self) {
        let sent = self.client.send_message().queue_url(&self.url).message_body("{}").send();
        match tokio::time::timeout(NOTIFY_TIMEOUT, sent).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let reason = aws_sdk_sqs::error::DisplayErrorContext(e).to_string();
                tracing::warn!(%reason, "relay queue not told; the schedule will run the relay")
            }
            Err(_) => tracing::warn!("relay queue too slow; the schedule will run the relay"),
        }
    }
}
