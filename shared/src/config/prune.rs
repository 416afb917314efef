//! Prune's retention.

use std::collections::HashMap;

use super::{invalid, Env};
use crate::{config::ConfigError, core::aws::ArchiveConfig, prune::PruneConfig};
use webhook_inbox_schemes::catalog::Catalog;

impl PruneConfig {
    /// `INBOX_RETENTION_DAYS` (60) and `INBOX_RETENTION_DAYS_<PROVIDER>`,
    /// `INBOX_FAILED_RETENTION_DAYS` (180), `OUTBOX_RETENTION_DAYS` (7),
    /// `INBOX_PRUNE_BATCH` (1000), `INBOX_ARCHIVE_S3_BUCKET` and
    /// `INBOX_ARCHIVE_S3_PREFIX` (`inbox/`); a retention not longer than a provider's
    /// redelivery window is refused, with the reason.
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let catalog = Catalog::read(env)?;
        let default_days: u32 = env.parse("INBOX_RETENTION_DAYS", 60)?;
        let mut done_days = HashMap::new();
        for entry in catalog.entries() {
            let var = format!("INBOX_RETENTION_DAYS_{}", entry.provider.env_prefix());
            if let Some(v) = env.var(&var) {
                let days = v.parse().map_err(|_| invalid(var, format!("{v:?} is not a valid number")))?;
                done_days.insert(entry.provider, days);
            }
        }
        let config = PruneConfig {
            catalog,
            default_days,
            done_days,
            failed_days: env.parse("INBOX_FAILED_RETENTION_DAYS", 180)?,
            outbox_days: env.parse("OUTBOX_RETENTION_DAYS", 7)?,
            batch_size: env.positive("INBOX_PRUNE_BATCH", 1000i64)?,
            archive: env.var("INBOX_ARCHIVE_S3_BUCKET").map(|bucket| ArchiveConfig {
                bucket,
                prefix: env.var("INBOX_ARCHIVE_S3_PREFIX").unwrap_or_else(|| "inbox/".into()),
            }),
        };
        config.validate()?;
        Ok(config)
    }
}
