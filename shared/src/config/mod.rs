//! Typed configuration, read once: the only module that reads the environment.
//!
//! Every variable goes through an [`Env`], the process environment or pairs a
//! test gives, and every stage's settings have one reader here (`read`), with
//! `from_env` as the process-environment shorthand. The structs themselves
//! live with the stages that use them. A deployed function's secrets come
//! from AWS Secrets Manager ([`secrets_manager`]) through [`Env::resolved`].

mod hints;
#[cfg(feature = "reconcile")]
mod reconcile;
#[cfg(feature = "relay")]
mod relay;
pub mod secrets_manager;

use std::{collections::HashMap, time::Duration};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};

pub use crate::core::error::ConfigError;
pub use crate::core::secret::{MarqetaAuth, Secret, Secrets};
pub use crate::db::DbConfig;
pub use crate::ingest::providers::catalog::Catalog;
use crate::ingest::providers::catalog::Kind;
use crate::{
    core::provider::Provider, process::worker::WorkerConfig, prune::RetentionConfig,
    runtime::deadline::DEFAULT_DEADLINE_MARGIN,
};
#[cfg(feature = "relay")]
pub use relay::SinkConfig;

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

    fn millis(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        Ok(Duration::from_millis(self.parse(name, default)?))
    }
}

fn invalid(var: impl Into<std::borrow::Cow<'static, str>>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { var: var.into(), reason: reason.into() }
}

impl Catalog {
    /// The built-in providers and those `INBOX_PROVIDERS_FILE` (a path) or
    /// `INBOX_PROVIDERS` (the text itself, for a Lambda stack) declares, with
    /// the `<NAME>_WEBHOOK_URL` of each whose signature covers its URL.
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let text = match (env.var("INBOX_PROVIDERS_FILE"), env.var("INBOX_PROVIDERS")) {
            (Some(_), Some(_)) => {
                return Err(invalid("INBOX_PROVIDERS", "set together with INBOX_PROVIDERS_FILE: use one or the other"))
            }
            (Some(path), None) => Some((
                "INBOX_PROVIDERS_FILE",
                std::fs::read_to_string(&path)
                    .map_err(|e| invalid("INBOX_PROVIDERS_FILE", format!("cannot read {path}: {e}")))?,
            )),
            (None, Some(text)) => Some(("INBOX_PROVIDERS", text)),
            (None, None) => None,
        };
        let url = |p: Provider| env.var(&format!("{}_WEBHOOK_URL", p.env_prefix()));
        Catalog::with_file(text.as_ref().map(|(_, t)| t.as_str()), url)
            .map_err(|reason| invalid(text.as_ref().map_or("INBOX_PROVIDERS", |(var, _)| var), reason))
    }
}

/// How one configured secret becomes key bytes, or why it cannot (never showing it).
type Decode<'a> = Box<dyn Fn(&str) -> Result<Secret, String> + 'a>;

impl Secrets {
    /// Reads every `*_WEBHOOK_*` variable; each may hold several comma-separated secrets.
    pub fn read(env: &Env, catalog: &Catalog) -> Result<Self, ConfigError> {
        let list = |var: &str| -> Vec<String> {
            env.var(var)
                .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
                .unwrap_or_default()
        };
        let plain = |var: &'static str| list(var).into_iter().map(Secret::new).collect::<Vec<_>>();

        let standard = list("STANDARD_WEBHOOK_SECRET")
            .iter()
            .enumerate()
            .map(|(i, s)| {
                decode_standard_secret(s).ok_or_else(|| {
                    invalid(
                        "STANDARD_WEBHOOK_SECRET",
                        format!("secret #{} is not base64 (after an optional whsec_ prefix)", i + 1),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        let usernames = list("MARQETA_WEBHOOK_USERNAME");
        let passwords = plain("MARQETA_WEBHOOK_PASSWORD");
        let signing_secrets = plain("MARQETA_WEBHOOK_SECRET");
        let marqeta = match (usernames.as_slice(), passwords.is_empty()) {
            ([], true) => {
                if !signing_secrets.is_empty() {
                    return Err(invalid(
                        "MARQETA_WEBHOOK_SECRET",
                        "set without MARQETA_WEBHOOK_USERNAME and MARQETA_WEBHOOK_PASSWORD (Basic auth is mandatory)",
                    ));
                }
                None
            }
            ([user], false) => {
                if user.chars().count() > 50 {
                    return Err(invalid("MARQETA_WEBHOOK_USERNAME", "longer than 50 characters"));
                }
                // Marqeta's own rule; a password cannot contain the comma that separates rotated ones.
                if let Some(i) = passwords.iter().position(|p| !(20..=50).contains(&p.expose().len())) {
                    return Err(invalid(
                        "MARQETA_WEBHOOK_PASSWORD",
                        format!("password #{} is not 20 to 50 characters long (Marqeta's rule)", i + 1),
                    ));
                }
                Some(MarqetaAuth { username: Secret::new(user.as_bytes()), passwords, signing_secrets })
            }
            ([], false) => {
                return Err(invalid("MARQETA_WEBHOOK_USERNAME", "missing while MARQETA_WEBHOOK_PASSWORD is set"))
            }
            (_, true) => {
                return Err(invalid("MARQETA_WEBHOOK_PASSWORD", "missing while MARQETA_WEBHOOK_USERNAME is set"))
            }
            (_, false) => return Err(invalid("MARQETA_WEBHOOK_USERNAME", "holds one username, not a list")),
        };

        let mut declared = std::collections::BTreeMap::new();
        for entry in catalog.entries() {
            let p = entry.provider;
            let var = format!("{}_WEBHOOK_SECRET", p.env_prefix());
            let decode: Decode<'_> = match &entry.kind {
                Kind::Coded => continue, // read above
                Kind::Standard => Box::new(|s| {
                    decode_standard_secret(s).ok_or_else(|| "is not base64 (after an optional whsec_ prefix)".into())
                }),
                Kind::Declared(rules) => Box::new(|s| rules.decode_secret(s)),
            };
            let keys = list(&var)
                .iter()
                .enumerate()
                .map(|(i, s)| decode(s).map_err(|e| format!("secret #{} {e}", i + 1)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|reason| invalid(var.clone(), reason))?;
            if keys.is_empty() {
                continue;
            }
            if matches!(&entry.kind, Kind::Declared(r) if r.needs_url()) && catalog.url(p).is_none() {
                return Err(invalid(
                    format!("{}_WEBHOOK_URL", p.env_prefix()),
                    format!(
                        "missing: {p} signs the public URL it delivers to; set it to exactly the URL registered with {p} \
                         (it is never guessed from the request)"
                    ),
                ));
            }
            declared.insert(p, keys);
        }

        Ok(Secrets {
            stripe: plain("STRIPE_WEBHOOK_SECRET"),
            shopify: plain("SHOPIFY_WEBHOOK_SECRET"),
            github: plain("GITHUB_WEBHOOK_SECRET"),
            standard,
            marqeta,
            declared,
        })
    }

    /// Fixed, printed secrets for `inbox dev` when none are configured.
    pub fn development() -> Self {
        Secrets {
            stripe: vec![Secret::new(DEV_STRIPE)],
            shopify: vec![Secret::new(DEV_SHOPIFY)],
            github: vec![Secret::new(DEV_GITHUB)],
            standard: vec![decode_standard_secret(DEV_STANDARD).expect("valid development secret")],
            marqeta: Some(MarqetaAuth {
                username: Secret::new(DEV_MARQETA_USERNAME),
                passwords: vec![Secret::new(DEV_MARQETA_PASSWORD)],
                signing_secrets: vec![],
            }),
            declared: Default::default(),
        }
    }
}

/// `inbox dev`'s Stripe secret when none is set (and the others': never for a deployment).
pub const DEV_STRIPE: &str = "whsec_dev_stripe_secret";
/// `inbox dev`'s Shopify secret when none is set.
pub const DEV_SHOPIFY: &str = "dev_shopify_secret";
/// `inbox dev`'s GitHub secret when none is set.
pub const DEV_GITHUB: &str = "dev_github_secret";
/// `inbox dev`'s Standard Webhooks secret when none is set.
pub const DEV_STANDARD: &str = "whsec_ZGV2X3N0YW5kYXJkX3dlYmhvb2tzX3NlY3JldA==";
/// `inbox dev`'s Marqeta Basic username when none is set.
pub const DEV_MARQETA_USERNAME: &str = "marqeta";
/// `inbox dev`'s Marqeta Basic password when none is set.
pub const DEV_MARQETA_PASSWORD: &str = "dev_marqeta_password";

/// Standard Webhooks keys are base64 after an optional `whsec_` prefix.
pub fn decode_standard_secret(s: &str) -> Option<Secret> {
    let key = B64.decode(s.strip_prefix("whsec_").unwrap_or(s)).ok()?;
    (!key.is_empty()).then(|| Secret::new(key))
}

impl DbConfig {
    /// `DATABASE_URL`, `INBOX_DB_POOL_SIZE` (default `default_pool`), the
    /// `INBOX_*_TIMEOUT_MS` variables (acquire 2000, lock 2000, statement 5000,
    /// idle in transaction 10000), and `INBOX_DB_POOLER` (`none`, or `proxy`
    /// behind PgBouncer or RDS Proxy: no startup parameters).
    pub fn read(env: &Env, default_pool: u32) -> Result<Self, ConfigError> {
        let url = env.var("DATABASE_URL");
        if let Some(url) = &url {
            // Checked here, so that a mistake names the variable (and never shows the password).
            match url::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "postgres" | "postgresql") => {}
                Ok(u) => {
                    return Err(invalid(
                        "DATABASE_URL",
                        format!("is a {}: URL, not PostgreSQL's (postgres://user@host:5432/database)", u.scheme()),
                    ))
                }
                Err(e) => {
                    return Err(invalid(
                        "DATABASE_URL",
                        format!("is not a URL ({e}); expected postgres://user@host:5432/database"),
                    ))
                }
            }
        }
        Ok(DbConfig {
            url,
            pool_size: env.parse("INBOX_DB_POOL_SIZE", default_pool)?,
            acquire_timeout: env.millis("INBOX_DB_ACQUIRE_TIMEOUT_MS", 2000)?,
            lock_timeout: env.millis("INBOX_LOCK_TIMEOUT_MS", 2000)?,
            statement_timeout: env.millis("INBOX_STATEMENT_TIMEOUT_MS", 5000)?,
            idle_in_transaction_timeout: env.millis("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000)?,
            behind_proxy: match env.var("INBOX_DB_POOLER").as_deref() {
                None | Some("none") => false,
                // Set once, here: every statement of this process is then unnamed (see `db::query`).
                Some("proxy") => {
                    crate::db::set_behind_pooler();
                    true
                }
                Some(other) => {
                    return Err(invalid("INBOX_DB_POOLER", format!("{other:?} is neither \"none\" nor \"proxy\"")))
                }
            },
        })
    }
}

use crate::ingest::receive::ReceiveConfig;
pub use crate::ingest::receive::DEFAULT_MAX_BODY_BYTES;

fn inline_providers(value: Option<&str>, catalog: &Catalog) -> Result<Vec<Provider>, ConfigError> {
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
    /// `INBOX_MAX_BODY_BYTES`, `INBOX_INLINE_PROVIDERS`, `INBOX_PROCESS_QUEUE_URL`.
    pub fn read(env: &Env, default_pool: u32) -> Result<Self, ConfigError> {
        let catalog = Catalog::read(env)?;
        Ok(ReceiveConfig {
            db: DbConfig::read(env, default_pool)?,
            secrets: Secrets::read(env, &catalog)?,
            max_body_bytes: env.parse("INBOX_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)?,
            inline_providers: inline_providers(env.var("INBOX_INLINE_PROVIDERS").as_deref(), &catalog)?,
            catalog,
            process_queue_url: env.var("INBOX_PROCESS_QUEUE_URL"),
        })
    }
}

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

#[cfg(feature = "serve")]
/// The service's own settings, read from the environment (`ServeConfig::read`).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS`, default 25000: how long a shutdown waits for
    /// the requests and batches in flight (within a container's usual 30 s).
    pub drain_timeout: Duration,
    /// `INBOX_WORKERS`, default 2: workers taking batches at once (process role).
    pub workers: usize,
    /// Receive's group commit.
    pub group: crate::ingest::claim::group::GroupConfig,
}

#[cfg(feature = "serve")]
impl ServeConfig {
    /// `INBOX_DRAIN_TIMEOUT_MS` (25000), `INBOX_WORKERS` (2), and receive's
    /// group commit: `INBOX_GROUP_COMMIT_MAX` (64; 1 turns it off),
    /// `INBOX_GROUP_COMMIT_WAIT_US` (0) and `INBOX_GROUP_COMMIT_COMMITTERS` (2).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let group = crate::ingest::claim::group::GroupConfig::default();
        Ok(ServeConfig {
            drain_timeout: env.millis("INBOX_DRAIN_TIMEOUT_MS", 25_000)?,
            workers: env.positive("INBOX_WORKERS", 2usize)?,
            group: crate::ingest::claim::group::GroupConfig {
                max: env.positive("INBOX_GROUP_COMMIT_MAX", group.max)?,
                wait: Duration::from_micros(env.parse("INBOX_GROUP_COMMIT_WAIT_US", 0u64)?),
                committers: env.positive("INBOX_GROUP_COMMIT_COMMITTERS", group.committers)?,
            },
        })
    }
}

#[cfg(feature = "serve")]
/// Where `inbox serve` sends its traces, if anywhere, and as which service:
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` (the specification's rule);
/// `OTEL_SERVICE_NAME`, default `webhook-inbox`.
pub(crate) fn otlp_traces(env: &Env) -> Result<Option<(String, String)>, ConfigError> {
    let (var, endpoint) = match (env.var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env.var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        (Some(traces), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces),
        (None, Some(base)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/traces", base.trim_end_matches('/'))),
        (None, None) => return Ok(None),
    };
    if url::Url::parse(&endpoint).map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
        return Err(invalid(var, "is not an http:// or https:// URL"));
    }
    let service = env.var("OTEL_SERVICE_NAME").unwrap_or_else(|| "webhook-inbox".into());
    Ok(Some((endpoint, service)))
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

impl RetentionConfig {
    /// `INBOX_RETENTION_DAYS` (60) and `INBOX_RETENTION_DAYS_<PROVIDER>`,
    /// `INBOX_FAILED_RETENTION_DAYS` (180), `OUTBOX_RETENTION_DAYS` (7),
    /// `INBOX_PRUNE_BATCH` (1000); a retention not longer than a provider's
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
        let config = RetentionConfig {
            catalog,
            default_days,
            done_days,
            failed_days: env.parse("INBOX_FAILED_RETENTION_DAYS", 180)?,
            outbox_days: env.parse("OUTBOX_RETENTION_DAYS", 7)?,
            batch_size: env.positive("INBOX_PRUNE_BATCH", 1000i64)?,
        };
        config.validate()?;
        Ok(config)
    }
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
mod tests {
    use super::*;
    use crate::{
        reconcile::{ReconcileConfig, Reconciler},
        relay::RelayConfig,
    };

    #[test]
    fn traces_go_to_the_otlp_endpoint_as_the_specification_builds_it() {
        let read = |pairs: &[(&str, &str)]| otlp_traces(&Env::from_pairs(pairs));
        assert_eq!(read(&[]).unwrap(), None);
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        assert_eq!(read(&base).unwrap(), Some(("http://collector:4318/v1/traces".into(), "webhook-inbox".into())));
        let own =
            [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://otlp.example/in"), ("OTEL_SERVICE_NAME", "inbox-eu")];
        assert_eq!(read(&own).unwrap(), Some(("https://otlp.example/in".into(), "inbox-eu".into())));
        let err = read(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317")]).unwrap_err().to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && !err.contains("collector"), "{err}");
    }

    #[test]
    fn comma_separated_secrets_are_all_kept_in_order() {
        let s =
            Secrets::read(&Env::from_pairs(&[("STRIPE_WEBHOOK_SECRET", "whsec_a, whsec_b,,")]), &Catalog::builtin())
                .unwrap();
        let stripe: Vec<&[u8]> = s.stripe.iter().map(Secret::expose).collect();
        assert_eq!(stripe, [b"whsec_a".as_slice(), b"whsec_b"]);
        assert!(!s.is_configured(Provider::SHOPIFY));
    }

    #[test]
    fn standard_secret_must_be_base64_and_the_error_hides_it() {
        let err =
            Secrets::read(&Env::from_pairs(&[("STANDARD_WEBHOOK_SECRET", "whsec_not*base64")]), &Catalog::builtin())
                .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("secret #1 is not base64"), "{text}");
        assert!(!text.contains("not*base64"), "{text}");
    }

    #[test]
    fn marqeta_needs_both_username_and_password() {
        let err =
            Secrets::read(&Env::from_pairs(&[("MARQETA_WEBHOOK_USERNAME", "u")]), &Catalog::builtin()).unwrap_err();
        assert!(err.to_string().contains("MARQETA_WEBHOOK_PASSWORD"));
        let ok = Secrets::read(
            &Env::from_pairs(&[
                ("MARQETA_WEBHOOK_USERNAME", "u"),
                ("MARQETA_WEBHOOK_PASSWORD", "password-one-0123456789,password-two-0123456789"),
            ]),
            &Catalog::builtin(),
        )
        .unwrap();
        assert_eq!(ok.marqeta.unwrap().passwords.len(), 2);
        let short = Secrets::read(
            &Env::from_pairs(&[("MARQETA_WEBHOOK_USERNAME", "u"), ("MARQETA_WEBHOOK_PASSWORD", "short")]),
            &Catalog::builtin(),
        );
        let err = short.unwrap_err().to_string();
        assert!(err.contains("20 to 50") && !err.contains("short"), "{err}");
    }

    #[test]
    fn inline_providers_are_names_and_unknown_ones_are_refused() {
        assert_eq!(
            inline_providers(Some("stripe, marqeta"), &Catalog::builtin()).unwrap(),
            [Provider::STRIPE, Provider::MARQETA]
        );
        assert!(inline_providers(None, &Catalog::builtin()).unwrap().is_empty());
        assert!(inline_providers(Some("stripe,paypal"), &Catalog::builtin())
            .unwrap_err()
            .to_string()
            .contains("paypal"));
    }

    #[test]
    fn secret_debug_is_redacted() {
        assert_eq!(format!("{:?}", Secret::new("whsec_live")), "Secret(<redacted>)");
    }

    #[test]
    fn development_secrets_cover_every_provider() {
        let s = Secrets::development();
        assert!(Provider::CODED.iter().all(|p| s.is_configured(*p)));
    }

    #[test]
    fn every_stage_reads_its_defaults_from_an_empty_environment() {
        let env = Env::from_pairs(&[]);
        let db = DbConfig::read(&env, 2).unwrap();
        assert_eq!((db.url, db.pool_size, db.statement_timeout), (None, 2, Duration::from_secs(5)));
        let r = ReceiveConfig::read(&env, 2).unwrap();
        assert_eq!((r.max_body_bytes, r.inline_providers.len()), (DEFAULT_MAX_BODY_BYTES, 0));
        assert!(r.secrets.none_configured());
        let w = WorkerConfig::read(&env).unwrap();
        assert_eq!(
            (w.batch_size, w.max_attempts, w.retry_base, w.poll),
            (100, 10, Duration::from_secs(1), Duration::from_millis(200))
        );
        let relay = RelayConfig::read(&env).unwrap();
        assert_eq!(
            (relay.batch_size, relay.concurrency, relay.max_attempts, relay.lease),
            (100, 8, 10, Duration::from_secs(300))
        );
        assert_eq!(SinkConfig::read(&env).unwrap(), SinkConfig::default());
        let p = RetentionConfig::read(&env).unwrap();
        assert_eq!((p.done_days(Provider::STRIPE), p.failed_days, p.outbox_days, p.batch_size), (60, 180, 7, 1000));
        assert_eq!(ReconcileConfig::read(&env).unwrap().first_lookback, Duration::from_secs(72 * 3600));
        assert!(!Reconciler::read(&env, &crate::App::default()).unwrap().is_configured());
        assert_eq!(deadline_margin(&env).unwrap(), Duration::from_millis(7000));
        assert_eq!(log_settings(&env), (None, false));
    }

    #[test]
    fn each_stage_reads_its_variables_into_its_settings() {
        let pairs = [
            ("DATABASE_URL", "postgres://db/inbox"),
            ("INBOX_DB_POOL_SIZE", "7"),
            ("INBOX_DB_ACQUIRE_TIMEOUT_MS", "11"),
            ("INBOX_LOCK_TIMEOUT_MS", "12"),
            ("INBOX_STATEMENT_TIMEOUT_MS", "13"),
            ("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", "14"),
            ("INBOX_MAX_BODY_BYTES", "2048"),
            ("INBOX_INLINE_PROVIDERS", "stripe, shopify"),
            ("INBOX_PROCESS_QUEUE_URL", "https://sqs.example/process"),
            ("INBOX_BATCH_SIZE", "5"),
            ("INBOX_MAX_ATTEMPTS", "6"),
            ("INBOX_RETRY_BASE_MS", "15"),
            ("INBOX_POLL_MS", "16"),
            ("INBOX_DEADLINE_MARGIN_MS", "170"),
            ("RELAY_HTTP_URL", "https://sink.example/hook"),
            ("RELAY_HTTP_TIMEOUT_MS", "18"),
            ("RELAY_SQS_QUEUE_URL", "https://sqs.example/q"),
            ("RELAY_EVENT_BUS", "bus"),
            ("RELAY_CONCURRENCY", "3"),
            ("RELAY_BATCH_SIZE", "4"),
            ("RELAY_MAX_ATTEMPTS", "9"),
            ("RELAY_RETRY_BASE_MS", "19"),
            ("RELAY_LEASE_MS", "20"),
            ("INBOX_RETENTION_DAYS", "90"),
            ("INBOX_RETENTION_DAYS_STRIPE", "45"),
            ("INBOX_FAILED_RETENTION_DAYS", "200"),
            ("OUTBOX_RETENTION_DAYS", "8"),
            ("INBOX_PRUNE_BATCH", "500"),
            ("RECONCILE_LOOKBACK_HOURS", "24"),
            ("STRIPE_API_KEY", "sk_test_x"),
            ("SHOPIFY_SHOP_DOMAIN", "s.myshopify.com"),
            ("SHOPIFY_ACCESS_TOKEN", "shpat_x"),
            ("GITHUB_API_TOKEN", "ghp_x"),
            ("GITHUB_API_BASE", "https://ghe.example/api/v3"),
            ("GITHUB_HOOKS", "repos/o/r/hooks/1, app"),
            ("RUST_LOG", "debug"),
            ("AWS_LAMBDA_FUNCTION_NAME", "receive"),
        ];
        let env = Env::from_pairs(&pairs);
        let ms = Duration::from_millis;
        let db = DbConfig::read(&env, 2).unwrap();
        assert_eq!(db.url.as_deref(), Some("postgres://db/inbox"));
        assert_eq!(
            (db.pool_size, db.acquire_timeout, db.lock_timeout, db.statement_timeout, db.idle_in_transaction_timeout),
            (7, ms(11), ms(12), ms(13), ms(14))
        );
        let r = ReceiveConfig::read(&env, 2).unwrap();
        assert_eq!((r.max_body_bytes, r.inline_providers), (2048, vec![Provider::STRIPE, Provider::SHOPIFY]));
        assert_eq!(r.process_queue_url.as_deref(), Some("https://sqs.example/process"));
        let w = WorkerConfig::read(&env).unwrap();
        assert_eq!((w.batch_size, w.max_attempts, w.retry_base, w.poll), (5, 6, ms(15), ms(16)));
        assert_eq!(deadline_margin(&env).unwrap(), ms(170), "above the statement timeout (13 ms here)");
        let sinks = SinkConfig::read(&env).unwrap();
        assert_eq!(sinks.http, Some(("https://sink.example/hook".to_string(), ms(18))));
        assert_eq!(
            (sinks.sqs_queue_url.as_deref(), sinks.event_bus.as_deref()),
            (Some("https://sqs.example/q"), Some("bus"))
        );
        let relay = RelayConfig::read(&env).unwrap();
        assert_eq!(
            (relay.concurrency, relay.batch_size, relay.max_attempts, relay.retry_base, relay.lease),
            (3, 4, 9, ms(19), ms(20))
        );
        let p = RetentionConfig::read(&env).unwrap();
        assert_eq!(
            (p.done_days(Provider::STRIPE), p.done_days(Provider::GITHUB), p.failed_days, p.outbox_days, p.batch_size),
            (45, 90, 200, 8, 500)
        );
        assert_eq!(ReconcileConfig::read(&env).unwrap().first_lookback, Duration::from_secs(24 * 3600));
        let reconciler = Reconciler::read(&env, &crate::App::default()).unwrap();
        assert_eq!(
            reconciler.names(),
            ["stripe events", "shopify orders", "github repos/o/r/hooks/1", "github app/hook"]
        );
        let bad = |pairs: &[(&str, &str)]| {
            Reconciler::read(&Env::from_pairs(pairs), &crate::App::default()).err().map(|e| e.to_string())
        };
        assert!(bad(&[("GITHUB_API_TOKEN", "t")]).is_some_and(|e| e.contains("GITHUB_HOOKS")), "a token without hooks");
        assert!(
            bad(&[("GITHUB_API_TOKEN", "t"), ("GITHUB_HOOKS", "repos/o/r")]).is_some_and(|e| e.contains("not a hook"))
        );
        assert_eq!(log_settings(&env), (Some("debug".into()), true));
    }

    #[test]
    fn declared_providers_come_from_a_file_or_the_variable_with_their_secrets_and_urls() {
        let acme = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{url}{body}\"\nredelivery_days = 2\n";
        let path = std::env::temp_dir().join(format!("providers-{}.toml", std::process::id()));
        std::fs::write(&path, acme).unwrap();
        let path = path.to_str().unwrap();
        let acme_p = Provider::try_from("acme").unwrap();
        for source in [("INBOX_PROVIDERS_FILE", path), ("INBOX_PROVIDERS", acme)] {
            let pairs = [
                source,
                ("ACME_WEBHOOK_SECRET", "one, two"),
                ("ACME_WEBHOOK_URL", "https://x.example/prod/webhooks/acme"),
                ("CLERK_WEBHOOK_SECRET", "whsec_Y2xlcmsta2V5"),
                ("SLACK_WEBHOOK_SECRET", "s"),
            ];
            let r = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).unwrap();
            assert_eq!(r.secrets.declared[&acme_p].len(), 2, "comma-separated for rotation");
            assert_eq!(r.catalog.url(acme_p), Some("https://x.example/prod/webhooks/acme"));
            assert_eq!(r.secrets.declared[&Provider::try_from("clerk").unwrap()][0].expose(), b"clerk-key");
            assert!(r.secrets.is_configured(Provider::try_from("slack").unwrap()));
            assert!(!r.secrets.is_configured(Provider::try_from("zoom").unwrap()), "no secret, no route");
            let retention = RetentionConfig::read(&Env::from_pairs(&pairs)).unwrap();
            assert!(retention.catalog.get(acme_p).is_some());
        }
        for (pairs, expected) in [
            (
                vec![("INBOX_PROVIDERS", acme), ("ACME_WEBHOOK_SECRET", "k")],
                "ACME_WEBHOOK_URL: missing: acme signs the public URL",
            ),
            (
                vec![("INBOX_PROVIDERS_FILE", "/nonexistent/p.toml")],
                "INBOX_PROVIDERS_FILE: cannot read /nonexistent/p.toml",
            ),
            (vec![("INBOX_PROVIDERS_FILE", path), ("INBOX_PROVIDERS", acme)], "INBOX_PROVIDERS: set together with"),
            (
                vec![("INBOX_PROVIDERS", "[acme]\nalias = \"x\"")],
                "INBOX_PROVIDERS: acme: alias \"x\": no such provider",
            ),
            (vec![("RESEND_WEBHOOK_SECRET", "whsec_not*base64")], "RESEND_WEBHOOK_SECRET: secret #1 is not base64"),
            (vec![("TWILIO_WEBHOOK_SECRET", "t")], "TWILIO_WEBHOOK_URL: missing"),
        ] {
            let err = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{err}");
            assert!(!err.contains("whsec_not"), "no secret in the error");
        }
        std::fs::remove_file(path).unwrap();
    }

    /// HMAC takes a key of any length, the empty one included: a bare prefix
    /// in a rotation list would verify `HMAC(key = "")`, which anyone can compute.
    #[test]
    fn an_empty_key_is_refused_on_every_decoding_path() {
        let prefixed = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nsecret = { prefix = \"whsec_\" }\nredelivery_days = 1\n";
        let b64 = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nsecret = { prefix = \"whsec_\", encoding = \"base64\" }\nredelivery_days = 1\n";
        for (pairs, expected) in [
            (
                vec![("INBOX_PROVIDERS", prefixed), ("ACME_WEBHOOK_SECRET", "whsec_a2V5, whsec_")],
                "ACME_WEBHOOK_SECRET: secret #2 is empty",
            ),
            (vec![("INBOX_PROVIDERS", b64), ("ACME_WEBHOOK_SECRET", "whsec_")], "ACME_WEBHOOK_SECRET: secret #1 is"),
            (vec![("STANDARD_WEBHOOK_SECRET", "whsec_")], "STANDARD_WEBHOOK_SECRET: secret #1 is"),
            (vec![("CLERK_WEBHOOK_SECRET", "whsec_")], "CLERK_WEBHOOK_SECRET: secret #1 is"),
        ] {
            let err = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).map(|_| ()).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{pairs:?}: {err}");
        }
        // A scheme given an empty key in code (not through the environment) matches nothing with it.
        let empty = [Secret::new(Vec::new())];
        let mac = crate::ingest::providers::test_hmac(b"", b"body");
        assert_eq!(
            crate::ingest::providers::first_matching::<hmac::Hmac<sha2::Sha256>>(&empty, &[b"body"], &[mac]),
            None
        );
    }

    #[test]
    fn a_value_that_does_not_parse_names_its_variable() {
        for var in ["INBOX_BATCH_SIZE", "RELAY_LEASE_MS", "INBOX_RETENTION_DAYS_MARQETA", "INBOX_DB_POOL_SIZE"] {
            let pairs = [(var, "soon")];
            let env = Env::from_pairs(&pairs);
            let err = match var {
                "INBOX_BATCH_SIZE" => WorkerConfig::read(&env).unwrap_err(),
                "RELAY_LEASE_MS" => RelayConfig::read(&env).unwrap_err(),
                "INBOX_RETENTION_DAYS_MARQETA" => RetentionConfig::read(&env).unwrap_err(),
                _ => DbConfig::read(&env, 2).unwrap_err(),
            };
            assert_eq!(err.to_string(), format!("{var}: \"soon\" is not a valid number"));
        }
        let tight = [("INBOX_DEADLINE_MARGIN_MS", "5000")];
        let err = deadline_margin(&Env::from_pairs(&tight)).unwrap_err().to_string();
        assert!(err.contains("not above INBOX_STATEMENT_TIMEOUT_MS (5000 ms)"), "{err}");
        for var in
            ["INBOX_BATCH_SIZE", "INBOX_MAX_ATTEMPTS", "INBOX_PRUNE_BATCH", "RELAY_BATCH_SIZE", "RELAY_CONCURRENCY"]
        {
            let pairs = [(var, "0")];
            let env = Env::from_pairs(&pairs);
            let err = match var {
                "INBOX_PRUNE_BATCH" => RetentionConfig::read(&env).unwrap_err(),
                v if v.starts_with("RELAY") => RelayConfig::read(&env).unwrap_err(),
                _ => WorkerConfig::read(&env).unwrap_err(),
            };
            assert_eq!(err.to_string(), format!("{var}: must be at least 1"), "0 is refused, not raised");
        }
        let short = [("INBOX_RETENTION_DAYS", "2")];
        assert!(RetentionConfig::read(&Env::from_pairs(&short)).unwrap_err().to_string().contains("redelivery window"));
    }
}
