//! Typed configuration, read once: the only module that reads the environment.
//!
//! Every variable goes through an [`Env`], the process environment or pairs a
//! test gives, and every stage's settings have one reader here (`read`), with
//! `from_env` as the process-environment shorthand, one file per stage. The
//! structs themselves live with the stages that use them. A deployed function's secrets come
//! from AWS Secrets Manager ([`secrets_manager`]) through [`Env::resolved`].

mod hints;
#[cfg(feature = "reconcile")]
mod reconcile;
#[cfg(feature = "relay")]
mod relay;
pub mod secrets_manager;

mod db;
mod process;
mod prune;
mod receive;

use std::{collections::HashMap, time::Duration};

pub use crate::core::aws::config as aws_sdk;
pub use crate::core::rules::{IgnoreRule, IgnoreRules};
pub use crate::db::{redact_url, DbConfig};
pub use crate::receive::receiver::DEFAULT_MAX_BODY_BYTES;
use crate::runtime::deadline::DEFAULT_DEADLINE_MARGIN;
#[cfg(feature = "relay")]
pub use relay::{DestinationConfig, Destinations, Target};
pub use webhook_inbox_schemes::catalog::Catalog;
pub use webhook_inbox_schemes::secret::{
    decode_standard_secret, MarqetaAuth, Secret, Secrets, DEV_GITHUB, DEV_MARQETA_PASSWORD, DEV_MARQETA_USERNAME,
    DEV_SHOPIFY, DEV_STANDARD, DEV_STRIPE,
};
pub use webhook_inbox_schemes::ConfigError;

/// Where settings come from: the process environment, or a lookup a test gives.
/// Reads one variable by name.
type Lookup<'a> = Box<dyn Fn(&str) -> Option<String> + 'a>;

/// Where every setting is read from: the process environment, or a lookup a test gives.
pub struct Env<'a> {
    get: Lookup<'a>,
}

impl Env<'static> {
    /// The process environment, as it is.
    pub fn process() -> Self {
        Env::from_lookup(|name| std::env::var(name).ok())
    }

    /// The process environment with the secrets its `*_ARN` variables name
    /// fetched from Secrets Manager: the first call of a function's `main`,
    /// once per instance. Without such a variable, no AWS call is made.
    pub async fn resolved() -> Result<Self, ConfigError> {
        let env = Env::process();
        if !secrets_manager::wanted(&env) {
            return Ok(env);
        }
        let client = aws_sdk_secretsmanager::Client::new(&crate::core::aws::from_env().await);
        secrets_manager::resolve(env, &client).await
    }
}

impl<'a> Env<'a> {
    /// Settings from `get`, which reads one variable by name.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String> + 'a) -> Self {
        Env { get: Box::new(get) }
    }

    /// A test's pairs.
    pub fn from_pairs(pairs: &'a [(&'a str, &'a str)]) -> Self {
        Env::from_lookup(move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    /// These values in place of the lookup's own.
    pub fn overlay(self, values: HashMap<String, String>) -> Self {
        let Env { get } = self;
        Env::from_lookup(move |name| values.get(name).cloned().or_else(|| get(name)))
    }

    /// The value, trimmed; empty counts as unset.
    pub fn var(&self, name: &str) -> Option<String> {
        (self.get)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    /// The value parsed, or `default` when unset.
    pub fn parse<T: std::str::FromStr>(&self, name: &'static str, default: T) -> Result<T, ConfigError> {
        match self.var(name) {
            Some(v) => v.parse().map_err(|_| invalid(name, format!("{v:?} is not a valid number"))),
            None => Ok(default),
        }
    }

    /// A count that must be at least 1 (a batch size, a number of attempts),
    /// or `default` when unset: 0 is refused, never raised quietly.
    pub fn positive<T>(&self, name: &'static str, default: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + PartialOrd + From<u8>,
    {
        let value = self.parse(name, default)?;
        if value < T::from(1) {
            return Err(invalid(name, "must be at least 1"));
        }
        Ok(value)
    }

    /// `name` as a number of milliseconds, `default` when unset.
    pub fn millis(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        Ok(Duration::from_millis(self.parse(name, default)?))
    }
}

/// How the providers' catalog and secrets ([`Catalog::read`], [`Secrets::read`]) read it.
impl webhook_inbox_schemes::Vars for Env<'_> {
    fn var(&self, name: &str) -> Option<String> {
        Env::var(self, name)
    }
}

fn invalid(var: impl Into<std::borrow::Cow<'static, str>>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { var: var.into(), reason: reason.into() }
}

/// `INBOX_DEADLINE_MARGIN_MS` (7000): every scheduled function stops starting
/// work this long before its Lambda deadline. It must exceed
/// `INBOX_STATEMENT_TIMEOUT_MS`, or a statement started just before the margin
/// could outlive the function, which is then killed mid-batch.
pub fn deadline_margin(env: &Env) -> Result<Duration, ConfigError> {
    let margin = env.millis("INBOX_DEADLINE_MARGIN_MS", DEFAULT_DEADLINE_MARGIN.as_millis() as u64)?;
    let statement = DbConfig::read(env, 1)?.statement_timeout;
    if margin <= statement {
        return Err(invalid(
            "INBOX_DEADLINE_MARGIN_MS",
            format!(
                "{} ms is not above INBOX_STATEMENT_TIMEOUT_MS ({} ms): a statement started at the margin could outlive the function",
                margin.as_millis(),
                statement.as_millis()
            ),
        ));
    }
    Ok(margin)
}

/// `RUST_LOG`, and whether logs are JSON (on Lambda, `AWS_LAMBDA_FUNCTION_NAME` is set).
pub fn log_settings(env: &Env) -> (Option<String>, bool) {
    (env.var("RUST_LOG"), env.var("AWS_LAMBDA_FUNCTION_NAME").is_some())
}

/// Tracing for a binary, as the environment asks: the first call of every `main`.
pub fn init_logging() {
    let (rust_log, json) = log_settings(&Env::process());
    crate::runtime::telemetry::init(rust_log.as_deref(), json);
}

// The tests read every stage's settings: they build with the whole crate.
#[cfg(all(test, feature = "full"))]
mod tests;
