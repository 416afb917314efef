//! Assertions on what the worker made of an event, as rivertest's
//! `RequireInserted` is for River's jobs: its status, and what its handler
//! enqueued in the outbox. Each fails the test (a panic) with what there is
//! instead: the event's status, attempts and failure reason, or every message
//! it did enqueue.

use serde_json::Value;

use super::TestInbox;
use crate::{
    core::status::Status,
    db::{self, inbox::StoredEvent},
};

/// An outbox message as its handler enqueued it ([`crate::Message`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Enqueued {
    /// The key the relay sends it under.
    pub message_key: String,
    /// Where it goes.
    pub destination: String,
    /// What it is about.
    pub aggregate_type: String,
    /// Which one.
    pub aggregate_id: String,
    /// Its ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// What the consumer gets.
    #[sqlx(json)]
    pub payload: Value,
}

impl TestInbox {
    /// The event `event_id` of `provider` as stored, which must have ended
    /// `status`.
    ///
    /// # Panics
    ///
    /// When it is not stored, or stands otherwise: the panic says how (its
    /// status, attempts and failure reason).
    ///
    /// ```no_run
    /// # async fn a_test(inbox: webhook_inbox::testing::TestInbox) {
    /// use webhook_inbox::ops::Status;
    ///
    /// inbox.drain().await.unwrap();
    /// let paid = inbox.require_status("stripe", "evt_1", Status::Done).await;
    /// assert_eq!(paid.attempts, 1);
    /// # }
    /// ```
    pub async fn require_status(&self, provider: &str, event_id: &str, status: Status) -> StoredEvent {
        let stored = db::inbox::stored_event(&self.pool, provider, event_id).await;
        let event = stored
            .unwrap_or_else(|e| panic!("reading {provider} {event_id}: the database: {e}"))
            .unwrap_or_else(|| panic!("{provider} {event_id} is not stored: expected it {status}"));
        if event.status != status {
            panic!(
                "{provider} {event_id} is {} after {} attempt(s), expected {status}{}",
                event.status,
                event.attempts,
                event.failure_reason.as_deref().map(|r| format!("; failure reason: {r}")).unwrap_or_default()
            );
        }
        event
    }

    /// The outbox messages the handler of `provider`'s `event_id` enqueued
    /// for `destination` ([`crate::Message::DEFAULT_DESTINATION`] for a message that
    /// names none), in the order written.
    ///
    /// # Panics
    ///
    /// When it enqueued none for `destination`: the panic lists every message
    /// the event did enqueue, and where.
    ///
    /// ```no_run
    /// # async fn a_test(inbox: webhook_inbox::testing::TestInbox) {
    /// let sent = inbox.require_enqueued("stripe", "evt_1", "billing").await;
    /// assert_eq!((sent.len(), sent[0].payload["invoice"].as_str()), (1, Some("in_1")));
    /// # }
    /// ```
    pub async fn require_enqueued(&self, provider: &str, event_id: &str, destination: &str) -> Vec<Enqueued> {
        let all = self.enqueued(provider, event_id).await;
        let found: Vec<Enqueued> = all.iter().filter(|m| m.destination == destination).cloned().collect();
        if found.is_empty() {
            panic!("{provider} {event_id} enqueued nothing for {destination:?}; it enqueued {}", listed(&all));
        }
        found
    }

    /// Requires that the handler of `provider`'s `event_id` enqueued no outbox message.
    ///
    /// # Panics
    ///
    /// When it enqueued any: the panic lists them.
    pub async fn require_nothing_enqueued(&self, provider: &str, event_id: &str) {
        let all = self.enqueued(provider, event_id).await;
        if !all.is_empty() {
            panic!("{provider} {event_id} enqueued {}, expected nothing", listed(&all));
        }
    }

    async fn enqueued(&self, provider: &str, event_id: &str) -> Vec<Enqueued> {
        db::query_as(
            "SELECT message_key, destination, aggregate_type, aggregate_id, ordering_key, payload
             FROM transactional_outbox WHERE event_provider = $1 AND event_id = $2 ORDER BY id",
        )
        .bind(provider)
        .bind(event_id)
        .fetch_all(db::Autocommit(&self.pool))
        .await
        .unwrap_or_else(|e| panic!("reading {provider} {event_id}'s outbox messages: the database: {e}"))
    }
}

/// Messages as a panic lists them.
fn listed(messages: &[Enqueued]) -> String {
    if messages.is_empty() {
        return "nothing".into();
    }
    let each: Vec<String> = messages
        .iter()
        .map(|m| format!("{:?} for {:?} ({} {})", m.message_key, m.destination, m.aggregate_type, m.aggregate_id))
        .collect();
    format!("{} message(s): {}", messages.len(), each.join(", "))
}
