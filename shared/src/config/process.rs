//! The worker's settings, its ignore rules, and the alerts of the same file.

use super::{invalid, Env, IgnoreRules};
use crate::{alerts::AlertRules, config::ConfigError, process::worker::WorkerConfig};
use webhook_inbox_schemes::text::escape;

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
            rules: IgnoreRules::read(env)?,
        })
    }
}

impl IgnoreRules {
    /// The rules of the file `INBOX_RULES_FILE` names, or of the text
    /// `INBOX_RULES` holds (a Lambda function's environment, a test); none
    /// when neither is set.
    pub fn read(env: &Env) -> Result<IgnoreRules, ConfigError> {
        read_rules(env, IgnoreRules::parse).map(Option::unwrap_or_default)
    }
}

impl AlertRules {
    /// The `[[alert]]` entries of the same file (or text) as [`IgnoreRules::read`]'s;
    /// [`AlertRules::defaults`] when it declares none, or neither is set.
    pub fn read(env: &Env) -> Result<AlertRules, ConfigError> {
        let declared = read_rules(env, AlertRules::parse)?.unwrap_or_default();
        Ok(if declared.is_empty() { AlertRules::defaults() } else { declared })
    }
}

/// The rules file (`INBOX_RULES_FILE`) or text (`INBOX_RULES`), parsed; none when neither is set.
fn read_rules<T>(env: &Env, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, ConfigError> {
    match (env.var("INBOX_RULES_FILE"), env.var("INBOX_RULES")) {
        (Some(_), Some(_)) => Err(invalid("INBOX_RULES", "set together with INBOX_RULES_FILE: use one or the other")),
        (Some(path), None) => {
            let shown = format!("\"{}\"", escape(&path));
            let text = std::fs::read_to_string(&path)
                .map_err(|e| invalid("INBOX_RULES_FILE", format!("cannot read {shown}: {e}")))?;
            parse(&text).map(Some).map_err(|reason| invalid("INBOX_RULES_FILE", format!("{shown}: {reason}")))
        }
        (None, Some(text)) => parse(&text).map(Some).map_err(|reason| invalid("INBOX_RULES", reason)),
        (None, None) => Ok(None),
    }
}
