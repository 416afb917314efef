//! The worker's settings, and its ignore rules.

use super::{invalid, Env};
use crate::{
    core::{error::ConfigError, text::escape},
    process::{rules::Rules, worker::WorkerConfig},
};

impl WorkerConfig {
    /// `INBOX_BATCH_SIZE` (100), `INBOX_MAX_ATTEMPTS` (10), `INBOX_RETRY_BASE_MS` (1000), `INBOX_POLL_MS` (200),
    /// `INBOX_RULES_FILE` (none).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let d = WorkerConfig::default();
        Ok(WorkerConfig {
            batch_size: env.positive("INBOX_BATCH_SIZE", d.batch_size)?,
            max_attempts: env.positive("INBOX_MAX_ATTEMPTS", d.max_attempts)?,
            retry_base: env.millis("INBOX_RETRY_BASE_MS", d.retry_base.as_millis() as u64)?,
            poll: env.millis("INBOX_POLL_MS", d.poll.as_millis() as u64)?,
            rules: Rules::read(env)?,
        })
    }
}

impl Rules {
    /// The rules of the file `INBOX_RULES_FILE` names, or of the text
    /// `INBOX_RULES` holds (a Lambda function's environment, a test); none
    /// when neither is set.
    pub fn read(env: &Env) -> Result<Rules, ConfigError> {
        match (env.var("INBOX_RULES_FILE"), env.var("INBOX_RULES")) {
            (Some(_), Some(_)) => {
                Err(invalid("INBOX_RULES", "set together with INBOX_RULES_FILE: use one or the other"))
            }
            (Some(path), None) => {
                let shown = format!("\"{}\"", escape(&path));
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| invalid("INBOX_RULES_FILE", format!("cannot read {shown}: {e}")))?;
                Rules::parse(&text).map_err(|reason| invalid("INBOX_RULES_FILE", format!("{shown}: {reason}")))
            }
            (None, Some(text)) => Rules::parse(&text).map_err(|reason| invalid("INBOX_RULES", reason)),
            (None, None) => Ok(Rules::default()),
        }
    }
}
