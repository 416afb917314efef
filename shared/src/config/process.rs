//! The worker's settings.

use super::Env;
use crate::{core::error::ConfigError, process::worker::WorkerConfig};

impl WorkerConfig {
    /// `INBOX_BATCH_SIZE` (100), `INBOX_MAX_ATTEMPTS` (10), `INBOX_RETRY_BASE_MS` (1000), `INBOX_POLL_MS` (200).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let d = WorkerConfig::default();
        Ok(WorkerConfig {
            batch_size: env.positive("INBOX_BATCH_SIZE", d.batch_size)?,
            max_attempts: env.positive("INBOX_MAX_ATTEMPTS", d.max_attempts)?,
            retry_base: env.millis("INBOX_RETRY_BASE_MS", d.retry_base.as_millis() as u64)?,
            poll: env.millis("INBOX_POLL_MS", d.poll.as_millis() as u64)?,
        })
    }
}
