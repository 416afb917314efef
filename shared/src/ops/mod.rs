//! What the operator's commands (`inbox show`, `failed`, `replay`, `requeue`,
//! `outbox`, `stats`) do, from code: find an event and its history, re-check
//! its kept bytes, list events page by page, put events back to pending (by filter, in batches, with an
//! audit record), retry dead outbox messages, see, pause and resume the
//! relay's destinations, pause and resume processing by provider and type
//! ([`pause_events`], [`resume_events`]), count what the inbox holds, and try
//! ignore rules on the stored events ([`rule_matches`]); run a requeue or an
//! erasure by selection as a job in the background ([`start_job`]).
//!
//! Each reads or writes a [`sqlx::PgPool`] in short autocommit statements,
//! safe against a live inbox. What a stranger sent (ids, types, payload
//! values, failure reasons) is in these rows as it came: print it through
//! [`escape`] (or [`escape_json`]).

pub use crate::core::selection::{BadCursor, Cursor, EventQuery, Filter, IdMatch, PayloadMatch, Since};
pub use crate::core::status::Status;
pub use crate::db::audit::{history, AuditRecord};
pub use crate::db::destinations::{is_destination_name, list as destinations, DestinationState};
pub use crate::db::inbox::{
    count_erasure, count_matching, counts_by_provider, erase, erase_counted, erase_matching, list_events, list_failed,
    replay, requeue_all, secret_usage, status_counts, stored_event, Audit, Count, EraseError, EraseOptions, Erased,
    Erasure, EventPage, EventSummary, FailedEvent, InboxGauges, Matching, Replayed, Requeued, SecretUse, StoredEvent,
    SEARCH_TIMEOUT,
};
pub use crate::db::minutes::{failed_since as failed_per_minute, since as received_per_minute, MinuteCounts};
pub use crate::db::outbox::{event_messages, list_unsent, retry_dead, retry_message, OutboxGauges, OutboxMessage};
pub use crate::db::pauses::{
    history as pause_history, list as pauses, pause as pause_events, release, resume as resume_events, Pause, Released,
    Scope as PauseScope, RELEASE_CHUNK,
};
pub use crate::db::sqlstate;
use std::time::Duration;
pub use webhook_inbox_schemes::text::{escape, escape_json, rfc3339};

mod jobs;

/// The queue's levels now ([`InboxGauges`]), each from a partial index.
pub async fn inbox_gauges(pool: &sqlx::PgPool) -> Result<InboxGauges, sqlx::Error> {
    db::inbox::gauges(db::Autocommit(pool)).await
}

/// The outbox's levels now ([`OutboxGauges`]).
pub async fn outbox_gauges(pool: &sqlx::PgPool) -> Result<OutboxGauges, sqlx::Error> {
    db::outbox::gauges(db::Autocommit(pool)).await
}
pub use jobs::{cancel_job, job, jobs, start_job, Canceller, Job, JobWork, JOBS_AT_ONCE};

use crate::{
    config::{Catalog, Secrets},
    core::rules::IgnoreRules,
    db,
    schemes::{Rejected, RejectionKind, Verified},
    Provider,
};
use webhook_inbox_schemes::{catalog::Kind, verify_stored, Schemes};

/// Why an operator action was not done: the jobs' error so far, which the
/// API answers as 404, 409, or as its database errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What it names does not exist (an event, a job, a destination).
    #[error("{0}")]
    NotFound(String),
    /// It exists, and its state forbids the action now (a job that has ended,
    /// as many jobs running as allowed).
    #[error("{0}")]
    Conflict(String),
    /// The database refused a statement or did not answer; what the action
    /// did before it stays done.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What an ignore rules file would have done to the stored events ([`rule_matches`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RuleMatches {
    /// The stored events of the rules' providers that were read.
    pub examined: u64,
    /// Each rule, in the file's order.
    pub rules: Vec<RuleMatch>,
}

/// One rule's share of [`RuleMatches`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RuleMatch {
    /// Its name (`#N` when it has none).
    pub name: String,
    /// Its provider.
    pub provider: String,
    /// Its type as written (`*` for every type).
    pub event_type: String,
    /// Events it would have ignored: those it is the first rule to match, as the worker decides.
    pub matched: u64,
    /// The first of them in key order (provider, id), to look at with `inbox show`.
    pub example: Option<String>,
}

/// Tries `rules` on the stored events (those received in the last `since`,
/// if given, whatever their status): how many each would have ignored, as the
/// worker decides it (the first rule that matches). Reads the rules'
/// providers' events in pages of the primary key, so it runs against a live
/// inbox in short statements; the payload only where a condition reads it.
pub async fn rule_matches(
    pool: &sqlx::PgPool,
    rules: &IgnoreRules,
    since: Option<Duration>,
) -> Result<RuleMatches, sqlx::Error> {
    const PAGE: i64 = 5_000;
    let mut out = RuleMatches {
        examined: 0,
        rules: rules
            .ignore_rules()
            .iter()
            .map(|r| RuleMatch {
                name: r.name().into(),
                provider: r.provider().to_string(),
                event_type: r.event_type(),
                matched: 0,
                example: None,
            })
            .collect(),
    };
    let mut providers: Vec<String> = out.rules.iter().map(|r| r.provider.clone()).collect();
    providers.sort();
    providers.dedup();
    let ruled = rules.payload_patterns();
    let mut after = (String::new(), String::new());
    loop {
        let page = db::inbox::ruled_events(pool, (&providers, &ruled), &after, since, PAGE).await?;
        for e in &page {
            out.examined += 1;
            let Ok(provider) = Provider::try_from(e.provider.as_str()) else { continue };
            let Some(rule) = rules.ignoring(provider, &e.event_type, e.payload.as_deref()) else { continue };
            let i = rules.ignore_rules().iter().position(|r| std::ptr::eq(r, rule)).expect("one of its rules");
            out.rules[i].matched += 1;
            out.rules[i].example.get_or_insert_with(|| format!("{} {}", e.provider, e.event_id));
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = (last.provider.clone(), last.event_id.clone()),
            _ => return Ok(out),
        }
    }
}

/// The queues' gauges, as the alarms and `inbox stats` read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Gauges {
    /// The inbox's: pending events, the oldest one's age, failures in the last hour.
    pub inbox: InboxGauges,
    /// The outbox's: the relay's backlog, its oldest message's age, dead messages.
    pub outbox: OutboxGauges,
}

/// [`Gauges`], each from a partial index.
pub async fn gauges(pool: &sqlx::PgPool) -> Result<Gauges, sqlx::Error> {
    Ok(Gauges {
        inbox: db::inbox::gauges(db::Autocommit(pool)).await?,
        outbox: db::outbox::gauges(db::Autocommit(pool)).await?,
    })
}

/// How a provider known here signs its deliveries, as `inbox providers` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderContract {
    /// The provider.
    pub provider: Provider,
    /// Where its contract comes from: `code`, `built in`, `providers file`,
    /// or `alias of <provider>` (with ` (providers file)` when declared there).
    pub contract: String,
    /// The headers its signature travels in.
    pub signature: String,
    /// What identifies an event and is not signed: a captured delivery sent
    /// again could change it (empty when everything is signed).
    pub unsigned_identity: Vec<String>,
    /// Its signature covers the URL: `<NAME>_WEBHOOK_URL` must name the URL it
    /// was registered with ([`Catalog::url`]).
    pub signs_url: bool,
    /// The longest it may redeliver an event, in days.
    pub redelivery_days: u32,
}

/// Every provider of `catalog`, in name order, with its signing contract.
pub fn provider_contracts(catalog: &Catalog) -> Vec<ProviderContract> {
    catalog
        .entries()
        .map(|e| {
            let p = e.provider;
            let contract = match (&e.alias_of, &e.kind, e.configured) {
                (Some(of), _, true) => format!("alias of {of} (providers file)"),
                (Some(of), _, false) => format!("alias of {of}"),
                (None, Kind::Coded, _) => "code".into(),
                (None, _, true) => "providers file".into(),
                (None, _, false) => "built in".into(),
            };
            let signature = match &e.kind {
                Kind::Declared(r) => r.headers.join(", "),
                Kind::Standard => "webhook-signature, svix-signature".into(),
                Kind::Coded => match p {
                    Provider::STRIPE => "Stripe-Signature",
                    Provider::SHOPIFY => "X-Shopify-Hmac-Sha256",
                    Provider::GITHUB => "X-Hub-Signature-256",
                    Provider::MARQETA => "Authorization (Basic), X-Marqeta-Signature",
                    _ => "webhook-signature, svix-signature",
                }
                .into(),
            };
            let unsigned_identity = match &e.kind {
                Kind::Declared(r) => r.unsigned_identity(),
                Kind::Coded if p == Provider::SHOPIFY => vec!["X-Shopify-Webhook-Id".into(), "X-Shopify-Topic".into()],
                Kind::Coded if p == Provider::GITHUB => vec!["X-GitHub-Delivery".into(), "X-GitHub-Event".into()],
                Kind::Standard | Kind::Coded => vec![],
            };
            let signs_url = matches!(&e.kind, Kind::Declared(r) if r.needs_url());
            ProviderContract {
                provider: p,
                contract,
                signature,
                unsigned_identity,
                signs_url,
                redelivery_days: e.redelivery_days,
            }
        })
        .collect()
}

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

/// An erasure's audit reason ([`audit_reason`]), refused when it holds what
/// is being erased: the audit record outlives the erasure, so it names the
/// request (its reference), never the person: no e-mail address, and not the
/// text the selection searches payloads for.
pub fn erase_reason(text: &str, searched: Option<&PayloadMatch>) -> Result<String, String> {
    let text = audit_reason(text)?;
    let lower = text.to_lowercase();
    let searched = match searched {
        Some(PayloadMatch::Text(t)) => Some(t.to_lowercase()),
        Some(PayloadMatch::Json(j)) => Some(j.to_string().to_lowercase()),
        None => None,
    };
    if searched.is_some_and(|s| !s.trim().is_empty() && lower.contains(s.trim())) {
        return Err("the reason holds the text being erased: it is kept in the audit, so name the request (its reference) instead".into());
    }
    let email = |w: &str| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric());
        w.split_once('@').is_some_and(|(user, host)| !user.is_empty() && host.contains('.'))
    };
    if text.split_whitespace().any(email) {
        return Err(
            "the reason holds an e-mail address: it is kept in the audit, so name the request (its reference) instead"
                .into(),
        );
    }
    Ok(text)
}

/// Pauses the destination `name`: every relay stops sending to it within a
/// second (what is in flight ends; what is leased goes back untouched), and
/// its messages wait, none dropped, none spending an attempt, to go in order
/// on [`resume_destination`]. Audited under `by`; false when it was paused
/// already. A name no relay has configured yet may be paused too.
pub async fn pause_destination(pool: &sqlx::PgPool, name: &str, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    db::destinations::set_paused(pool, name, true, by).await
}

/// Resumes a paused destination (audited under `by`); false when it was not paused.
pub async fn resume_destination(pool: &sqlx::PgPool, name: &str, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    db::destinations::set_paused(pool, name, false, by).await
}

/// A destination's history of pauses and resumes, oldest first.
pub async fn destination_history(pool: &sqlx::PgPool, name: &str) -> Result<Vec<AuditRecord>, sqlx::Error> {
    db::audit::destination_history(pool, name).await
}

/// Whether a stored delivery's kept headers and raw bytes still verify against
/// `secrets` (the built-in and declared schemes of `catalog`), a signed
/// timestamp judged as at its arrival. Which secret verified is
/// [`Verified::secret_index`], a position in `secrets`' list for the provider
/// ([`Secrets::fingerprints`] gives its fingerprint).
pub fn verify_kept(event: &StoredEvent, catalog: &Catalog, secrets: &Secrets) -> Result<Verified, Rejected> {
    let provider = Provider::try_from(event.provider.as_str())
        .map_err(|_| Rejected::new(RejectionKind::Unconfigured, "not a provider name"))?;
    let received = event.received_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    verify_stored(&Schemes::new(catalog, secrets), provider, &event.headers.0, &event.raw_body, received)
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
    /// Its raw bytes were erased (with it, or with another event of its batch).
    BytesErased,
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
            Verification::BytesErased => f.write_str("not checked: its raw bytes were erased"),
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
    if event.erased_at.is_some() || event.raw_erased_at.is_some() {
        return Verification::BytesErased;
    }
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
