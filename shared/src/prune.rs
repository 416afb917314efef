//! Retention: deletes what no provider can redeliver any more, in small batches
//! that never wait on a lock, so receive is not slowed while it runs.
//!
//! The inbox's keys are its deduplication memory: a key deleted before the
//! provider's redelivery window closes lets a resent event be processed twice.
//! So a retention shorter than that window is refused at start-up.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use sqlx::PgPool;

use crate::{
    core::{aws::ArchiveConfig, status::Status},
    db::{
        self, bodies,
        inbox::{self, Providers},
        outbox,
    },
    runtime::stage::{Pass, Reported, Stage, Tally},
};
use webhook_inbox_schemes::{catalog::Catalog, ConfigError, Provider};

pub(crate) use webhook_inbox_schemes::catalog::MAX_DAYS;

/// The rows kept for a provider's retention (`INBOX_RETENTION_DAYS`): done,
/// unhandled and ignored (nothing ran; a later handler may be replayed over them).
const FINISHED: &[Status] = &[Status::Done, Status::Unhandled, Status::Ignored];

/// How long prune keeps what (`PruneConfig::read` from the environment).
#[derive(Debug, Clone)]
pub struct PruneConfig {
    /// Every provider known here, with its redelivery window.
    pub catalog: Catalog,
    /// `INBOX_RETENTION_DAYS` (60): days `done`, `unhandled` and `ignored` rows are kept.
    pub default_days: u32,
    /// `INBOX_RETENTION_DAYS_<PROVIDER>`: a provider's own.
    pub done_days: HashMap<Provider, u32>,
    /// `INBOX_FAILED_RETENTION_DAYS` (180).
    pub failed_days: u32,
    /// `OUTBOX_RETENTION_DAYS` (7): for sent messages.
    pub outbox_days: u32,
    /// `INBOX_PRUNE_BATCH` (1000): rows per DELETE.
    pub batch_size: i64,
    /// `INBOX_ARCHIVE_S3_BUCKET`: archive each batch of inbox rows before deleting it.
    pub archive: Option<ArchiveConfig>,
}

impl PruneConfig {
    /// Days a provider's `done` rows are kept.
    pub fn done_days(&self, p: Provider) -> u32 {
        self.done_days.get(&p).copied().unwrap_or(self.default_days)
    }

    /// Refuses a retention that would forget a key while its provider may still redeliver it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if cfg!(not(feature = "archive")) && self.archive.is_some() {
            return Err(ConfigError::Invalid {
                var: "INBOX_ARCHIVE_S3_BUCKET".into(),
                reason: "this build cannot archive (it lacks the webhook-inbox crate's `archive` feature)".into(),
            });
        }
        let days = [("OUTBOX_RETENTION_DAYS", self.outbox_days), ("INBOX_FAILED_RETENTION_DAYS", self.failed_days)];
        for (var, days) in days.into_iter().chain(
            std::iter::once(("INBOX_RETENTION_DAYS", self.default_days))
                .chain(self.done_days.values().map(|d| ("INBOX_RETENTION_DAYS_<PROVIDER>", *d))),
        ) {
            if days > MAX_DAYS {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    reason: format!("{days} days is more than {MAX_DAYS}"),
                });
            }
        }
        for entry in self.catalog.entries() {
            let (p, window) = (entry.provider, entry.redelivery_days);
            let done_var = match self.done_days.contains_key(&p) {
                true => format!("INBOX_RETENTION_DAYS_{}", p.env_prefix()),
                false => "INBOX_RETENTION_DAYS".into(),
            };
            // Failed rows remember their keys too.
            for (var, kept, what) in [
                (done_var, self.done_days(p), "done"),
                ("INBOX_FAILED_RETENTION_DAYS".into(), self.failed_days, "failed"),
            ] {
                // Longer than the window, not as long: a redelivery at its very end must still find the key.
                if kept <= window {
                    return Err(ConfigError::Invalid {
                        var: var.into(),
                        reason: format!(
                            "{what} {p} rows would be kept {kept} days, not longer than {p}'s redelivery window of {window} days: \
                             an event redelivered after its key is deleted would be processed twice"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The `done` DELETEs of a pass: one per distinct override, then every other provider's rows
    /// (including a provider no longer configured) at the default.
    fn done_groups(&self) -> (Vec<(u32, Vec<&'static str>)>, Vec<&'static str>) {
        let mut groups: std::collections::BTreeMap<u32, Vec<&'static str>> = Default::default();
        for (p, days) in self.done_days.iter().filter(|(_, d)| **d != self.default_days) {
            groups.entry(*days).or_default().push(p.as_str());
        }
        let overridden = groups.values().flatten().copied().collect();
        (groups.into_iter().collect(), overridden)
    }
}

/// What a pass deleted (and archived).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    /// Done, unhandled and ignored inbox rows.
    pub done: u64,
    /// Failed inbox rows.
    pub failed: u64,
    /// Sent outbox messages.
    pub outbox: u64,
    /// Batch bodies (`webhook_bodies`) no row points at any more.
    pub bodies: u64,
    /// Replay guards (`webhook_replay_guard`) whose row is gone.
    pub guards: u64,
    /// DELETE statements run, each its own short transaction.
    pub statements: u64,
    /// Inbox rows archived (and so deleted), in `archive_objects` objects.
    pub archived: u64,
    /// Archive objects stored.
    pub archive_objects: u64,
    /// Inbox rows past retention kept because their archive object could not be stored.
    pub not_archived: u64,
    /// Why the archive could not store them (the first failure).
    pub archive_error: Option<String>,
}

impl Reported for Pruned {
    /// The `prune` function's metrics: `pruned` (inbox rows), `pruned_outbox`, `pruned_bodies`, `pruned_guards`.
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let mut m = crate::runtime::metrics::Metrics::new("prune");
        m.count("pruned", self.done + self.failed)
            .count("pruned_outbox", self.outbox)
            .count("pruned_bodies", self.bodies)
            .count("pruned_guards", self.guards)
            .count("archived", self.archived)
            .count("archive_failed", self.not_archived);
        vec![m]
    }

    /// An archive upload that failed (its rows are kept).
    fn failures(&self) -> Option<String> {
        self.archive_error.as_ref().map(|e| format!("{} rows kept, not archived: {e}", self.not_archived))
    }
}

impl Tally for Pruned {
    fn add(&mut self, p: &Pruned) {
        self.done += p.done;
        self.failed += p.failed;
        self.outbox += p.outbox;
        self.bodies += p.bodies;
        self.guards += p.guards;
        self.statements += p.statements;
        self.archived += p.archived;
        self.archive_objects += p.archive_objects;
        self.not_archived += p.not_archived;
        if self.archive_error.is_none() {
            self.archive_error.clone_from(&p.archive_error);
        }
    }

    fn is_empty(&self) -> bool {
        self.done + self.failed + self.outbox + self.bodies + self.guards + self.not_archived == 0
    }
}

impl Stage for Pruner {
    type Tally = Pruned;
    const NAME: &'static str = "prune";
    /// Gives concurrent work a moment between batches.
    const PAUSE: Duration = Duration::from_millis(5);

    async fn run_once(&self, _deadline: Instant) -> Result<Pass<Pruned>, sqlx::Error> {
        let (tally, short) = Pruner::run_once(self).await?;
        Ok(Pass { tally, more: !short })
    }
}

/// The prune stage: deletes what is past its retention, in short batches. Run
/// it as a [`Stage`] (`run`, `run_until`), or one pass with [`Pruner::run_once`].
pub struct Pruner {
    pool: PgPool,
    config: PruneConfig,
    #[cfg(feature = "archive")]
    archive: tokio::sync::OnceCell<crate::archive::Archive>,
}

impl Pruner {
    /// A pruner on `pool`, keeping what `config` says; archiving to
    /// `config.archive`, if set, through the AWS configuration of the environment.
    pub fn new(pool: PgPool, config: PruneConfig) -> Self {
        Pruner {
            pool,
            config,
            #[cfg(feature = "archive")]
            archive: Default::default(),
        }
    }

    /// This pruner, archiving to `archive` before it deletes inbox rows.
    #[cfg(feature = "archive")]
    pub fn with_archive(self, archive: crate::archive::Archive) -> Self {
        Pruner { archive: archive.into(), ..self }
    }

    #[cfg(feature = "archive")]
    async fn archive(&self) -> Option<&crate::archive::Archive> {
        match (&self.config.archive, self.archive.get()) {
            (_, Some(archive)) => Some(archive),
            (None, None) => None,
            (Some(c), None) => Some(self.archive.get_or_init(|| crate::archive::Archive::from_env(c.clone())).await),
        }
    }

    /// Deletes a batch of inbox rows past retention; archives it first when an
    /// archive is configured, deleting only what S3 stored. Returns the rows
    /// deleted and whether the batch was full (more may be due).
    #[cfg_attr(not(feature = "archive"), allow(unused_variables))]
    async fn delete_inbox(
        &self,
        providers: Providers<'_>,
        statuses: &[Status],
        days: u32,
        pruned: &mut Pruned,
    ) -> Result<(u64, bool), sqlx::Error> {
        let limit = self.config.batch_size;
        #[cfg(feature = "archive")]
        if let Some(archive) = self.archive().await {
            let mut tx = self.pool.begin().await?;
            // The uploads happen inside this transaction (its locks keep the rows as archived
            // until they are deleted): not idle for the session's usual 10 s, but bounded.
            db::query("SET LOCAL idle_in_transaction_session_timeout = '5min'").execute(&mut *tx).await?;
            let rows = inbox::archive_received_before(&mut *tx, providers, statuses, days, limit).await?;
            if rows.is_empty() {
                return Ok((0, false));
            }
            let shas: Vec<String> = rows.iter().filter_map(|r| r.body_sha256.clone()).collect();
            let bodies = inbox::bodies_base64(&mut *tx, &shas).await?.into_iter().collect();
            let taken = rows.len() as u64;
            let stored = archive.store(rows, &bodies).await;
            let keys: Vec<(&str, &str)> = stored.rows.iter().map(|(p, id)| (p.as_str(), id.as_str())).collect();
            let deleted = inbox::delete_keys(&mut *tx, &keys).await?;
            tx.commit().await?;
            pruned.archived += deleted;
            pruned.archive_objects += stored.objects;
            pruned.not_archived += stored.failed;
            if pruned.archive_error.is_none() {
                pruned.archive_error = stored.error;
            }
            // A failed upload ends the run (see `run_once`): its rows stay for the next.
            return Ok((deleted, stored.failed == 0 && taken as i64 == limit));
        }
        let n = inbox::delete_received_before(db::Autocommit(&self.pool), providers, statuses, days, limit).await?;
        Ok((n, n as i64 == limit))
    }

    /// One batch of each kind, each DELETE its own short transaction; and
    /// whether every batch came up short (nothing more is due).
    pub async fn run_once(&self) -> Result<(Pruned, bool), sqlx::Error> {
        let limit = self.config.batch_size;
        let mut pruned = Pruned::default();
        let mut short = true;
        let (groups, overridden) = self.config.done_groups();
        let default = (self.config.default_days, Providers::Except(&overridden));
        for (days, providers) in groups.iter().map(|(d, p)| (*d, Providers::Only(p))).chain([default]) {
            let (n, full) = self.delete_inbox(providers, FINISHED, days, &mut pruned).await?;
            short &= !full;
            pruned.done += n;
            pruned.statements += 1;
        }
        let (n, full) =
            self.delete_inbox(Providers::Any, &[Status::Failed], self.config.failed_days, &mut pruned).await?;
        pruned.failed = n;
        short &= !full;
        pruned.outbox = outbox::delete_sent_before(db::Autocommit(&self.pool), self.config.outbox_days, limit).await?;
        pruned.bodies = bodies::delete_orphans(db::Autocommit(&self.pool), limit).await?;
        pruned.guards = bodies::delete_orphan_guards(db::Autocommit(&self.pool), limit).await?;
        pruned.statements += 4;
        short &= [pruned.outbox, pruned.bodies, pruned.guards].iter().all(|n| (*n as i64) < limit);
        // An archive that failed ends the run: its rows stay, and the next run tries them again.
        Ok((pruned.clone(), short || pruned.not_archived > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(days: u32) -> PruneConfig {
        PruneConfig {
            catalog: Catalog::builtin(),
            default_days: days,
            done_days: HashMap::new(),
            failed_days: 180,
            outbox_days: 7,
            batch_size: 1000,
            archive: None,
        }
    }

    #[test]
    fn a_retention_not_longer_than_a_redelivery_window_is_refused_with_the_reason() {
        assert!(config(60).validate().is_ok());
        let mut c = config(60);
        c.done_days.insert(Provider::STRIPE, 10);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("INBOX_RETENTION_DAYS_STRIPE: done stripe rows would be kept 10 days")
                && err.contains("30 days"),
            "{err}"
        );
        let mut c = config(60);
        c.failed_days = 5;
        assert!(
            c.validate().unwrap_err().to_string().starts_with("INBOX_FAILED_RETENTION_DAYS"),
            "failed rows are dedup memory too"
        );
        let mut c = config(60);
        c.done_days.insert(Provider::SHOPIFY, 2);
        assert!(c.validate().is_ok(), "Shopify redelivers for 4 hours (a window of 1 day)");
        let mut c = config(60);
        c.done_days.insert(Provider::STRIPE, 30);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("kept 30 days, not longer than stripe's redelivery window of 30 days"), "{err}");
        let err = config(5).validate().unwrap_err().to_string();
        assert!(err.starts_with("INBOX_RETENTION_DAYS: "), "a declared provider's window binds the default too: {err}");
        let mut c = config(60);
        c.done_days.insert(Provider::try_from("gocardless").unwrap(), 6);
        assert!(c.validate().unwrap_err().to_string().contains("gocardless's redelivery window of 7 days"));
    }

    #[test]
    fn providers_sharing_a_retention_share_one_delete() {
        let mut c = config(60);
        assert_eq!(c.done_groups(), (vec![], vec![]), "one DELETE for everyone at the default");
        c.done_days.insert(Provider::STRIPE, 90);
        c.done_days.insert(Provider::GITHUB, 90);
        c.done_days.insert(Provider::SHOPIFY, 60);
        let (groups, overridden) = c.done_groups();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].0, 90);
        let mut names = groups[0].1.clone();
        names.sort();
        assert_eq!(names, ["github", "stripe"]);
        assert_eq!(overridden.len(), 2, "shopify's equals the default: it stays in the default DELETE");
    }
}
