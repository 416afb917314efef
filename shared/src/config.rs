//! Typed configuration read once from the environment.

pub use crate::db::DbConfig;

use std::time::Duration;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};

use crate::core::provider::Provider;
pub use crate::core::secret::{MarqetaAuth, Secret, Secrets};

/// Errors in the environment, reported at start-up and never containing a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}: {reason}")]
    Invalid { var: &'static str, reason: String },
}

fn invalid(var: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        var,
        reason: reason.into(),
    }
}

impl Secrets {
    /// Reads every `*_WEBHOOK_*` variable; each may hold several comma-separated secrets.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let list = |var: &'static str| -> Vec<String> {
            get(var)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
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
                        format!(
                            "secret #{} is not base64 (after an optional whsec_ prefix)",
                            i + 1
                        ),
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
                    return Err(invalid(
                        "MARQETA_WEBHOOK_USERNAME",
                        "longer than 50 characters",
                    ));
                }
                // Marqeta's own rule; a password cannot contain the comma that separates rotated ones.
                if let Some(i) = passwords
                    .iter()
                    .position(|p| !(20..=50).contains(&p.expose().len()))
                {
                    return Err(invalid(
                        "MARQETA_WEBHOOK_PASSWORD",
                        format!(
                            "password #{} is not 20 to 50 characters long (Marqeta's rule)",
                            i + 1
                        ),
                    ));
                }
                Some(MarqetaAuth {
                    username: Secret::new(user.as_bytes()),
                    passwords,
                    signing_secrets,
                })
            }
            ([], false) => {
                return Err(invalid(
                    "MARQETA_WEBHOOK_USERNAME",
                    "missing while MARQETA_WEBHOOK_PASSWORD is set",
                ))
            }
            (_, true) => {
                return Err(invalid(
                    "MARQETA_WEBHOOK_PASSWORD",
                    "missing while MARQETA_WEBHOOK_USERNAME is set",
                ))
            }
            (_, false) => {
                return Err(invalid(
                    "MARQETA_WEBHOOK_USERNAME",
                    "holds one username, not a list",
                ))
            }
        };

        Ok(Secrets {
            stripe: plain("STRIPE_WEBHOOK_SECRET"),
            shopify: plain("SHOPIFY_WEBHOOK_SECRET"),
            github: plain("GITHUB_WEBHOOK_SECRET"),
            standard,
            marqeta,
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
        }
    }
}

pub const DEV_STRIPE: &str = "whsec_dev_stripe_secret";
pub const DEV_SHOPIFY: &str = "dev_shopify_secret";
pub const DEV_GITHUB: &str = "dev_github_secret";
pub const DEV_STANDARD: &str = "whsec_ZGV2X3N0YW5kYXJkX3dlYmhvb2tzX3NlY3JldA==";
pub const DEV_MARQETA_USERNAME: &str = "marqeta";
pub const DEV_MARQETA_PASSWORD: &str = "dev_marqeta_password";

/// Standard Webhooks keys are base64 after an optional `whsec_` prefix.
pub fn decode_standard_secret(s: &str) -> Option<Secret> {
    let key = B64.decode(s.strip_prefix("whsec_").unwrap_or(s)).ok()?;
    (!key.is_empty()).then(|| Secret::new(key))
}

impl DbConfig {
    /// `DATABASE_URL`, `INBOX_DB_POOL_SIZE` (default `default_pool`), and the
    /// `INBOX_*_TIMEOUT_MS` variables (acquire 2000, lock 2000, statement 5000,
    /// idle in transaction 10000).
    pub fn from_env(default_pool: u32) -> Result<Self, ConfigError> {
        let ms = |var: &'static str, default: u64| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(parse_env(var, default)?))
        };
        Ok(DbConfig {
            url: std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()),
            pool_size: parse_env("INBOX_DB_POOL_SIZE", default_pool)?,
            acquire_timeout: ms("INBOX_DB_ACQUIRE_TIMEOUT_MS", 2000)?,
            lock_timeout: ms("INBOX_LOCK_TIMEOUT_MS", 2000)?,
            statement_timeout: ms("INBOX_STATEMENT_TIMEOUT_MS", 5000)?,
            idle_in_transaction_timeout: ms("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000)?,
        })
    }
}

pub fn parse_env<T: std::str::FromStr>(var: &'static str, default: T) -> Result<T, ConfigError> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| invalid(var, format!("{v:?} is not a valid number"))),
        _ => Ok(default),
    }
}

/// Everything the receive handler needs.
#[derive(Clone, Debug)]
pub struct Config {
    pub db: DbConfig,
    pub secrets: Secrets,
    /// `INBOX_MAX_BODY_BYTES`, default 1 MiB: larger bodies get 413 before any hashing.
    pub max_body_bytes: usize,
    /// `INBOX_INLINE_PROVIDERS` (e.g. `stripe,shopify`): receive applies their
    /// handlers inside the claim's transaction.
    pub inline_providers: Vec<Provider>,
}

pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

fn inline_providers(value: Option<&str>) -> Result<Vec<Provider>, ConfigError> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            Provider::try_from(name).map_err(|_| {
                invalid(
                    "INBOX_INLINE_PROVIDERS",
                    format!("unknown provider {name:?}"),
                )
            })
        })
        .collect()
}

impl Config {
    pub fn from_env(default_pool: u32) -> Result<Self, ConfigError> {
        Ok(Config {
            db: DbConfig::from_env(default_pool)?,
            secrets: Secrets::from_env()?,
            max_body_bytes: parse_env("INBOX_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)?,
            inline_providers: inline_providers(
                std::env::var("INBOX_INLINE_PROVIDERS").ok().as_deref(),
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn comma_separated_secrets_are_all_kept_in_order() {
        let s = Secrets::from_lookup(lookup(&[("STRIPE_WEBHOOK_SECRET", "whsec_a, whsec_b,,")]))
            .unwrap();
        let stripe: Vec<&[u8]> = s.stripe.iter().map(Secret::expose).collect();
        assert_eq!(stripe, [b"whsec_a".as_slice(), b"whsec_b"]);
        assert!(!s.is_configured(Provider::Shopify));
    }

    #[test]
    fn standard_secret_must_be_base64_and_the_error_hides_it() {
        let err = Secrets::from_lookup(lookup(&[("STANDARD_WEBHOOK_SECRET", "whsec_not*base64")]))
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("secret #1 is not base64"), "{text}");
        assert!(!text.contains("not*base64"), "{text}");
    }

    #[test]
    fn marqeta_needs_both_username_and_password() {
        let err = Secrets::from_lookup(lookup(&[("MARQETA_WEBHOOK_USERNAME", "u")])).unwrap_err();
        assert!(err.to_string().contains("MARQETA_WEBHOOK_PASSWORD"));
        let ok = Secrets::from_lookup(lookup(&[
            ("MARQETA_WEBHOOK_USERNAME", "u"),
            (
                "MARQETA_WEBHOOK_PASSWORD",
                "password-one-0123456789,password-two-0123456789",
            ),
        ]))
        .unwrap();
        assert_eq!(ok.marqeta.unwrap().passwords.len(), 2);
        let short = Secrets::from_lookup(lookup(&[
            ("MARQETA_WEBHOOK_USERNAME", "u"),
            ("MARQETA_WEBHOOK_PASSWORD", "short"),
        ]));
        let err = short.unwrap_err().to_string();
        assert!(err.contains("20 to 50") && !err.contains("short"), "{err}");
    }

    #[test]
    fn inline_providers_are_names_and_unknown_ones_are_refused() {
        assert_eq!(
            inline_providers(Some("stripe, marqeta")).unwrap(),
            [Provider::Stripe, Provider::Marqeta]
        );
        assert!(inline_providers(None).unwrap().is_empty());
        assert!(inline_providers(Some("stripe,paypal"))
            .unwrap_err()
            .to_string()
            .contains("paypal"));
    }

    #[test]
    fn secret_debug_is_redacted() {
        assert_eq!(
            format!("{:?}", Secret::new("whsec_live")),
            "Secret(<redacted>)"
        );
    }

    #[test]
    fn development_secrets_cover_every_provider() {
        let s = Secrets::development();
        assert!(Provider::ALL.iter().all(|p| s.is_configured(*p)));
    }
}
