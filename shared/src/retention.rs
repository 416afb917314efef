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
    core::error::ConfigError,
    core::provider::Provider,
    db::{
        self, bodies,
        inbox::{self, Status},
        outbox,
    },
    runtime::stage::{Pass, Stage, Tally},
};

/// A retention longer than this (100 years) is a typo.
pub const MAX_DAYS: u32 = 36_500;

/// The longest a provider may redeliver an event, in days (`docs/providers.md`).
pub fn redelivery_window_days(provider: Provider) -> u32 {
    match provider {
        Provider::Stripe => 30,  // manual resend, up to 30 days
        Provider::Marqeta => 13, // 10 retries, a little over 12 days
        Provider::Github => 3,   // manual redelivery of the last 3 days
        Provider::Standard => 3, // about 28 h of retries; senders' replay windows
        Provider::Shopify => 1,  // 8 retries over 4 h
    }
}

#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Days `done` rows are kept, per provider: `INBOX_RETENTION_DAYS` (60),
    /// overridden by `INBOX_RETENTION_DAYS_<PROVIDER>`.
    pub done_days: HashMap<Provider, u32>,
    /// `INBOX_FAILED_RETENTION_DAYS` (180).
    pub failed_days: u32,
    /// `OUTBOX_RETENTION_DAYS` (7): for sent messages.
    pub outbox_days: u32,
    /// `INBOX_PRUNE_BATCH` (1000): rows per DELETE.
    pub batch_size: i64,
}

impl RetentionConfig {
    /// Refuses a retention that would forget a key while its provider may still redeliver it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (var, days) in
            [("OUTBOX_RETENTION_DAYS", self.outbox_days), ("INBOX_FAILED_RETENTION_DAYS", self.failed_days)]
                .into_iter()
                .chain(self.done_days.values().map(|d| ("INBOX_RETENTION_DAYS", *d)))
        {
            if days > MAX_DAYS {
                return Err(ConfigError::Invalid { var, reason: format!("{days} days is more than {MAX_DAYS}") });
            }
        }
        for p in Provider::ALL {
            let window = redelivery_window_days(p);
            let done = self.done_days.get(&p).copied().unwrap_or(0);
            // Failed rows remember their keys too.
            for (var, kept, what) in
                [("INBOX_RETENTION_DAYS", done, "done"), ("INBOX_FAILED_RETENTION_DAYS", self.failed_days, "failed")]
            {
                if kept < window {
                    return Err(ConfigError::Invalid {
                        var,
                        reason: format!(
                            "{what} {p} rows would be kept {kept} days, shorter than {p}'s redelivery window of {window} days: \
                             an event redelivered after its key is deleted would be processed twice"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What a pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    pub done: u64,
    pub failed: u64,
    pub outbox: u64,
    /// Batch bodies (`webhook_bodies`) no row points at any more.
    pub bodies: u64,
    /// DELETE statements run, each its own short transaction.
    pub statements: u64,
}

impl Pruned {
    /// The `prune` function's metrics: `pruned` (inbox rows), `pruned_outbox`, `pruned_bodies`.
    pub fn metrics(&self) -> crate::runtime::metrics::Metrics {
        let mut m = crate::runtime::metrics::Metrics::new("prune");
        m.count("pruned", self.done + self.failed)
            .count("pruned_outbox", self.outbox)
            .count("pruned_bodies", self.bodies);
        m
    }
}

impl Tally for Pruned {
    fn add(&mut self, p: &Pruned) {
        self.done += p.done;
        self.failed += p.failed;
        self.outbox += p.outbox;
        self.bodies += p.bodies;
        self.statements += p.statements;
    }

    fn is_empty(&self) -> bool {
        self.done + self.failed + self.outbox + self.bodies == 0
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

pub struct Pruner {
    pool: PgPool,
    config: RetentionConfig,
}

impl Pruner {
    pub fn new(pool: PgPool, config: RetentionConfig) -> Self {
        Pruner { pool, config }
    }

    /// One batch of each kind; each DELETE is its own short transaction.
    pub async fn run_once(&self) -> Result<(Pruned, bool), sqlx::Error> {
        let limit = self.config.batch_size;
        let mut pruned = Pruned::default();
        let mut short = true;
        for p in Provider::ALL {
            let n = inbox::delete_received_before(
                db::Autocommit(&self.pool),
                Some(p),
                Status::Done,
                self.config.done_days[&p],
                limit,
            )
            .await?;
            short &= (n as i64) < limit;
            pruned.done += n;
        }
        pruned.failed = inbox::delete_received_before(
            db::Autocommit(&self.pool),
            None,
            Status::Failed,
            self.config.failed_days,
            limit,
        )
        .await?;
        pruned.outbox = outbox::delete_sent_before(db::Autocommit(&self.pool), self.config.outbox_days, limit).await?;
        pruned.bodies = bodies::delete_orphans(db::Autocommit(&self.pool), limit).await?;
        pruned.statements = Provider::ALL.len() as u64 + 3;
        short &= (pruned.failed as i64) < limit && (pruned.outbox as i64) < limit && (pruned.bodies as i64) < limit;
        Ok((pruned, short))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(days: u32) -> RetentionConfig {
        RetentionConfig {
            done_days: Provider::ALL.iter().map(|p| (*p, days)).collect(),
            failed_days: 180,
            outbox_days: 7,
            batch_size: 1000,
        }
    }

    #[test]
    fn a_retention_shorter_than_a_redelivery_window_is_refused_with_the_reason() {
        assert!(config(60).validate().is_ok());
        let mut c = config(60);
        c.done_days.insert(Provider::Stripe, 10);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("done stripe rows would be kept 10 days") && err.contains("30 days"), "{err}");
        let mut c = config(60);
        c.failed_days = 5;
        assert!(
            c.validate().unwrap_err().to_string().starts_with("INBOX_FAILED_RETENTION_DAYS"),
            "failed rows are dedup memory too"
        );
        let mut c = config(60);
        c.done_days.insert(Provider::Shopify, 1);
        assert!(c.validate().is_ok(), "Shopify redelivers for 4 hours");
    }
}
