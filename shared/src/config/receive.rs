//! Receive's settings.

use super::{invalid, Env};
use crate::{
    config::ConfigError,
    core::rules::IgnoreRules,
    db::DbConfig,
    receive::receiver::{ReceiveConfig, DEFAULT_MAX_BODY_BYTES},
};
use webhook_inbox_schemes::{catalog::Catalog, secret::Secrets, Provider};

pub(super) fn inline_providers(value: Option<&str>, catalog: &Catalog) -> Result<Vec<Provider>, ConfigError> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            catalog
                .find(name)
                .map(|e| e.provider)
                .ok_or_else(|| invalid("INBOX_INLINE_PROVIDERS", format!("unknown provider {name:?}")))
        })
        .collect()
}

impl ReceiveConfig {
    /// [`ReceiveConfig::read`] from the process environment.
    pub fn from_env(default_pool: u32) -> Result<Self, ConfigError> {
        Self::read(&Env::process(), default_pool)
    }

    /// The database (`DATABASE_URL`, a pool of `default_pool` unless
    /// `INBOX_DB_POOL_SIZE`), the providers and their secrets,
    /// `INBOX_MAX_BODY_BYTES`, `INBOX_INLINE_PROVIDERS`, `INBOX_PROCESS_QUEUE_URL`,
    /// and with inline providers `INBOX_RULES_FILE`.
    pub fn read(env: &Env, default_pool: u32) -> Result<Self, ConfigError> {
        let catalog = Catalog::read(env)?;
        let inline_providers = inline_providers(env.var("INBOX_INLINE_PROVIDERS").as_deref(), &catalog)?;
        let rules = if inline_providers.is_empty() { IgnoreRules::default() } else { IgnoreRules::read(env)? };
        Ok(ReceiveConfig {
            db: DbConfig::read(env, default_pool)?,
            secrets: Secrets::read(env, &catalog)?,
            max_body_bytes: env.parse("INBOX_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)?,
            inline_providers,
            catalog,
            process_queue_url: env.var("INBOX_PROCESS_QUEUE_URL"),
            rules,
        })
    }
}
