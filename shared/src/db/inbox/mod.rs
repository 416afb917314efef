//! `webhook_inbox`: every statement on the table, one module per role. The
//! claim is one `INSERT ... ON CONFLICT DO NOTHING RETURNING`: the primary key
//! is the gate, so no check-then-act exists. Status literals stay in the SQL
//! (the queue's partial index is `WHERE status = 'pending'`), all in this folder;
//! the statuses themselves and the operator's selections are leaf types in
//! `core` ([`Status`](crate::core::status::Status), `core::selection`).

#[cfg(feature = "archive")]
mod archive;
mod claim;
mod erase;
mod listing;
mod prune;
mod queue;
mod requeue;
mod stats;

#[cfg(feature = "archive")]
pub use archive::ArchivedEvent;
#[cfg(feature = "archive")]
pub(crate) use archive::{archive_received_before, bodies_base64, delete_keys, restore};
pub(crate) use claim::insert_group;
pub(crate) use claim::GroupRow;
pub(crate) use claim::{insert, insert_batch, try_lock_event, Body};
pub(crate) use claim::{Claim, Envelope};
pub use erase::{count_erasure, erase, erase_counted, erase_matching, EraseError, EraseOptions, Erased, Erasure};
pub(crate) use listing::ruled_events;
pub use listing::{list_events, stored_event, EventPage, EventSummary, StoredEvent, SEARCH_TIMEOUT};
pub(crate) use prune::{delete_received_before, Providers};
pub(crate) use queue::{
    count_next, finish, give_up, mark_done_inline, mark_unusable, note_inline_failure, take_counted, take_one,
    take_pending, Finished, Position, Taken,
};
pub use requeue::{count_matching, list_failed, replay, requeue_all, Audit, FailedEvent, Matching, Replayed, Requeued};
pub(crate) use stats::gauges;
pub use stats::{counts_by_provider, secret_usage, status_counts, Count, InboxGauges, SecretUse};
