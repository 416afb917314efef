//! The providers known (built in and declared) and their webhook secrets,
//! read from the environment, or from any lookup of variables by name.

use crate::{
    catalog::{Catalog, Kind},
    secret::{decode_standard_secret, MarqetaAuth, Secret, Secrets},
    ConfigError, Provider,
};

/// Where settings are read: the process environment ([`ProcessEnv`]), or
/// any lookup of a variable by name (a closure, a test's map).
pub trait Vars {
    /// The variable's value, if it is set.
    fn var(&self, name: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String>> Vars for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnv;

impl Vars for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// A variable's value, trimmed; unset or blank is `None`.
fn get(env: &(impl Vars + ?Sized), name: &str) -> Option<String> {
    env.var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn invalid(var: impl Into<std::borrow::Cow<'static, str>>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { var: var.into(), reason: reason.into() }
}

impl Catalog {
    /// The built-in providers and those `INBOX_PROVIDERS_FILE` (a path) or
    /// `INBOX_PROVIDERS` (the text itself, for a Lambda stack) declares, with
    /// the `<NAME>_WEBHOOK_URL` of each whose signature covers its URL.
    pub fn read(env: &(impl Vars + ?Sized)) -> Result<Self, ConfigError> {
        let text = match (get(env, "INBOX_PROVIDERS_FILE"), get(env, "INBOX_PROVIDERS")) {
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
        let url = |p: Provider| get(env, &format!("{}_WEBHOOK_URL", p.env_prefix()));
        Catalog::with_file(text.as_ref().map(|(_, t)| t.as_str()), url)
            .map_err(|reason| invalid(text.as_ref().map_or("INBOX_PROVIDERS", |(var, _)| var), reason))
    }
}

/// How one configured secret becomes key bytes, or why it cannot (never showing it).
type Decode<'a> = Box<dyn Fn(&str) -> Result<Secret, String> + 'a>;

impl Secrets {
    /// Reads every `*_WEBHOOK_*` variable; each may hold several comma-separated secrets.
    pub fn read(env: &(impl Vars + ?Sized), catalog: &Catalog) -> Result<Self, ConfigError> {
        let list = |var: &str| -> Vec<String> {
            get(env, var)
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
}
