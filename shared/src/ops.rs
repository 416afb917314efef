//! What the operator's commands (`inbox show`, `failed`, `replay`, `requeue`,
//! `outbox`, `stats`) do, from code: find an event and its history, re-check
//! its kept bytes, list events page by page, put events back to pending (by filter, in batches, with an
//! audit record), retry dead outbox messages, and count what the inbox holds.
//!
//! Each reads or writes a [`sqlx::PgPool`] in short autocommit statements,
//! safe against a live inbox. What a stranger sent (ids, types, payload
//! values, failure reasons) is in these rows as it came: print it through
//! [`escape`] (or [`escape_json`]).

pub use crate::core::text::{escape, escape_json};
pub use crate::db::audit::{history, AuditRecord};
pub use crate::db::inbox::{
    count_matching, counts_by_status, list_events, list_failed, replay, requeue_all, secret_usage, status_counts,
    stored_event, BadCursor, Count, Cursor, EventPage, EventQuery, EventSummary, FailedEvent, Filter, IdMatch,
    Matching, Replayed, Requeue, Requeued, SecretUse, Since, Status, StoredEvent,
};
pub use crate::db::outbox::{event_messages, list_unsent, retry_dead, retry_message, OutboxMessage};
use crate::{
    config::{Catalog, Secrets},
    ingest::providers::{verify_stored, Schemes},
    schemes::{Rejected, RejectionKind, Verified},
    Provider,
};

/// Whether a stored delivery's kept headers and raw bytes still verify against
/// `secrets` (the built-in and declared schemes of `catalog`), a signed
/// timestamp judged as at its arrival. Which secret verified is
/// [`Verified::secret_index`], a position in `secrets`' list for the provider
/// ([`Secrets::fingerprints`] gives its fingerprint).
pub fn verify_kept(event: &StoredEvent, catalog: &Catalog, secrets: &Secrets) -> Result<Verified, Rejected> {
    let provider = Provider::try_from(event.provider.as_str())
        .map_err(|_| Rejected::new(RejectionKind::Unconfigured, "not a provider name"))?;
    verify_stored(&Schemes::new(catalog, secrets), provider, &event.headers.0, &event.raw_body, event.received_epoch)
}
