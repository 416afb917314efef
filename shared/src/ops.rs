//! What the operator's commands (`inbox show`, `failed`, `replay`, `requeue`,
//! `outbox`, `stats`) do, from code: find an event and its history, re-check
//! its kept bytes, list events page by page, put events back to pending (by filter, in batches, with an
//! audit record), retry dead outbox messages, and count what the inbox holds.
//!
//! Each reads or writes a [`sqlx::PgPool`] in short autocommit statements,
//! safe against a live inbox. What a stranger sent (ids, types, payload
//! values, failure reasons) is in these rows as it came: print it through
//! [`escape`] (or [`escape_json`]).

pub use crate::core::selection::{BadCursor, Cursor, EventQuery, Filter, IdMatch, PayloadMatch, Since};
pub use crate::core::status::Status;
pub use crate::core::text::{escape, escape_json};
pub use crate::db::audit::{history, AuditRecord};
pub use crate::db::inbox::{
    count_matching, counts_by_status, list_events, list_failed, replay, requeue_all, secret_usage, status_counts,
    stored_event, Count, EventPage, EventSummary, FailedEvent, Matching, Replayed, Requeue, Requeued, SecretUse,
    StoredEvent, SEARCH_TIMEOUT,
};
pub use crate::db::outbox::{event_messages, list_unsent, retry_dead, retry_message, OutboxMessage};
use crate::{
    config::{Catalog, Secrets},
    receive::providers::{verify_stored, Schemes},
    schemes::{Rejected, RejectionKind, Verified},
    Provider,
};

/// The longest reason an audit record takes, in characters (`--reason`, the
/// console's forms): a sentence, not a document.
pub const MAX_REASON_CHARS: usize = 500;

/// An audit reason as given, or why it is refused (over [`MAX_REASON_CHARS`]).
pub fn audit_reason(text: &str) -> Result<String, String> {
    let n = text.chars().count();
    if n > MAX_REASON_CHARS {
        return Err(format!("a reason is at most {MAX_REASON_CHARS} characters (this one is {n})"));
    }
    Ok(text.to_string())
}

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

/// Whether a stored event's kept bytes verify against the secrets configured
/// now, as `inbox show` and the console say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// They verify with the provider's secret at this position (0 first) in
    /// the list configured, whose fingerprint this is.
    Verified {
        /// The provider.
        provider: Provider,
        /// Its position in the provider's list of secrets.
        secret_index: usize,
        /// Its fingerprint ([`Secrets::fingerprints`]).
        fingerprint: String,
    },
    /// No secret is configured at all, and they verify with `inbox dev`'s
    /// development secret for the provider (its database, looked at from elsewhere).
    DevelopmentSecret(Provider),
    /// Fetched from the provider's API by reconcile: there is no signature to check.
    Reconciled,
    /// No secret of this provider is configured here to check with.
    NoSecret(Provider),
    /// The row names no provider known here.
    UnknownProvider,
    /// They do not verify with any configured secret, for this reason.
    Fails(Provider, Rejected),
}

impl Verification {
    /// Whether the bytes verified (with a configured secret or a development one).
    pub fn verified(&self) -> bool {
        matches!(self, Verification::Verified { .. } | Verification::DevelopmentSecret(_))
    }

    /// Whether the configured secrets say the bytes are not what was signed
    /// (Marqeta's Basic credentials, never stored, cannot say so).
    pub fn refuted(&self) -> bool {
        matches!(self, Verification::Fails(p, _) if *p != Provider::MARQETA)
    }
}

impl std::fmt::Display for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verification::Verified { provider, secret_index, fingerprint } => {
                write!(f, "verifies with {provider} secret #{} ({fingerprint})", secret_index + 1)
            }
            Verification::DevelopmentSecret(p) => {
                write!(f, "verifies with inbox dev's development {p} secret (none is configured here)")
            }
            Verification::Reconciled => f.write_str("fetched from the provider's API by reconcile: no signature"),
            Verification::NoSecret(p) => write!(f, "not checked: no {p} secret is configured here"),
            Verification::UnknownProvider => f.write_str("not checked: not a provider known here"),
            Verification::Fails(p, reason) if *p == Provider::MARQETA => write!(
                f,
                "not verified: {reason} (Basic credentials are never stored; only X-Marqeta-Signature can be re-checked)"
            ),
            Verification::Fails(_, reason) => write!(f, "DOES NOT VERIFY with the secrets configured here: {reason}"),
        }
    }
}

/// Re-checks a stored event's kept bytes ([`verify_kept`]) and says which
/// secret verified them, or why none did. Where no secret is configured at
/// all, `inbox dev`'s development secrets are tried, and named only when they verify.
pub fn verification(event: &StoredEvent, catalog: &Catalog, secrets: &Secrets) -> Verification {
    let Ok(provider) = Provider::try_from(event.provider.as_str()) else {
        return Verification::UnknownProvider;
    };
    if event.source == "reconcile" {
        return Verification::Reconciled;
    }
    if !secrets.is_configured(provider) {
        if secrets.none_configured() && verify_kept(event, catalog, &Secrets::development()).is_ok() {
            return Verification::DevelopmentSecret(provider);
        }
        return Verification::NoSecret(provider);
    }
    match verify_kept(event, catalog, secrets) {
        Ok(v) => Verification::Verified {
            provider,
            secret_index: v.secret_index,
            fingerprint: secrets.fingerprints(provider).get(v.secret_index).cloned().unwrap_or_default(),
        },
        Err(reason) => Verification::Fails(provider, reason),
    }
}
