//! Every provider this deployment knows: the five with code of their own, the
//! declared built-ins (`builtin.toml`), and those a providers file declares
//! (`INBOX_PROVIDERS_FILE`, or its text in `INBOX_PROVIDERS`), with each one's
//! redelivery window and, where its signature covers it, its public URL.

use std::collections::BTreeMap;

use super::declared::{Description, Rules};
use crate::provider::Provider;

const BUILTIN: &str = include_str!("builtin.toml");

/// A window or a retention longer than this (100 years) is a typo.
pub const MAX_DAYS: u32 = 36_500;

/// How a provider's deliveries are verified.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Its own module (stripe, shopify, marqeta, github, standard).
    Coded,
    /// Standard Webhooks under a sender's own name (clerk, resend, ...).
    Standard,
    /// Declared as data, in the built-in contracts or the providers file.
    Declared(Box<Rules>),
}

/// One provider the deployment knows.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its name.
    pub provider: Provider,
    /// How its contract is written.
    pub kind: Kind,
    /// The longest the provider may redeliver an event: retention keeps keys at least this long.
    pub redelivery_days: u32,
    /// Declared by the providers file rather than built in.
    pub configured: bool,
    /// The provider whose contract this one shares.
    pub alias_of: Option<Provider>,
}

/// Every provider the deployment knows, configured or not: the built-in ones
/// and those of the providers file (`WEBHOOK_PROVIDERS_FILE`), with their
/// contracts, redelivery windows and URLs.
#[derive(Debug, Clone)]
pub struct Catalog {
    entries: BTreeMap<Provider, Entry>,
    /// `<NAME>_WEBHOOK_URL` of the providers whose signature covers the URL.
    urls: BTreeMap<Provider, String>,
}

/// The coded providers' redelivery windows, in days (`docs/providers.md`).
const CODED: [(Provider, u32); 5] = [
    (Provider::STRIPE, 30),  // manual resend, up to 30 days
    (Provider::MARQETA, 13), // 10 retries, a little over 12 days
    (Provider::GITHUB, 3),   // manual redelivery of the last 3 days
    (Provider::STANDARD, 3), // about 28 h of retries; senders' replay windows
    (Provider::SHOPIFY, 1),  // 8 retries over 4 h
];

impl Catalog {
    /// The built-in providers only.
    pub fn builtin() -> Catalog {
        Catalog::with_file(None, |_| None).expect("builtin.toml is valid (tested)")
    }

    /// The built-ins and a providers file's text (TOML, or JSON when it starts
    /// with `{`), with `url(provider)` giving each `<NAME>_WEBHOOK_URL`. The
    /// error says which provider and which field, never a secret (a file holds none).
    pub fn with_file(file: Option<&str>, url: impl Fn(Provider) -> Option<String>) -> Result<Catalog, String> {
        let mut entries = BTreeMap::new();
        for (p, days) in CODED {
            let entry =
                Entry { provider: p, kind: Kind::Coded, redelivery_days: days, configured: false, alias_of: None };
            entries.insert(p, entry);
        }
        let mut declared: Vec<(Provider, Description, bool)> =
            parse(BUILTIN)?.into_iter().map(|(p, d)| (p, d, false)).collect();
        if let Some(text) = file {
            for (p, d) in parse(text)? {
                if CODED.iter().any(|(c, _)| *c == p) {
                    return Err(format!("{p}: a provider with code of its own cannot be redeclared"));
                }
                declared.retain(|(q, _, _)| *q != p);
                declared.push((p, d, true));
            }
        }
        // Contracts first, then aliases, each once what it names is known (an alias may name an alias).
        let (mut pending, contracts): (Vec<_>, Vec<_>) = declared.into_iter().partition(|(_, d, _)| d.alias.is_some());
        for (p, d, configured) in contracts {
            let entry = entry(p, &d, configured, &entries).map_err(|e| format!("{p}: {e}"))?;
            entries.insert(p, entry);
        }
        while !pending.is_empty() {
            let known = |(_, d, _): &(Provider, Description, bool)| {
                d.alias.as_deref().and_then(|a| Provider::try_from(a).ok()).is_some_and(|a| entries.contains_key(&a))
            };
            let (ready, waiting): (Vec<_>, Vec<_>) = pending.into_iter().partition(known);
            if ready.is_empty() {
                // None left names a known provider: the first one's error says which is missing.
                let (p, d, configured) = &waiting[0];
                return Err(format!("{p}: {}", entry(*p, d, *configured, &entries).err().unwrap_or_default()));
            }
            for (p, d, configured) in ready {
                let entry = entry(p, &d, configured, &entries).map_err(|e| format!("{p}: {e}"))?;
                entries.insert(p, entry);
            }
            pending = waiting;
        }
        let mut urls = BTreeMap::new();
        for e in entries.values() {
            if let Kind::Declared(rules) = &e.kind {
                if rules.needs_url() {
                    if let Some(u) = url(e.provider) {
                        urls.insert(e.provider, u);
                    }
                }
            }
        }
        Ok(Catalog { entries, urls })
    }

    /// A provider's entry.
    #[doc(hidden)]
    pub fn get(&self, p: Provider) -> Option<&Entry> {
        self.entries.get(&p)
    }

    /// A name from a request, looked up without interning it.
    #[doc(hidden)]
    pub fn find(&self, name: &str) -> Option<&Entry> {
        self.entries.values().find(|e| e.provider.as_str() == name)
    }

    /// Every entry, by provider name.
    #[doc(hidden)]
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// `<NAME>_WEBHOOK_URL`, for a provider whose signature covers the URL.
    pub fn url(&self, p: Provider) -> Option<&str> {
        self.urls.get(&p).map(String::as_str)
    }
}

fn parse(text: &str) -> Result<Vec<(Provider, Description)>, String> {
    let table: BTreeMap<String, Description> = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?
    } else {
        toml::from_str(text).map_err(|e| format!("not valid TOML: {}", crate::text::toml_error(text, &e)))?
    };
    table
        .into_iter()
        .map(|(name, d)| {
            let p = Provider::try_from(name.as_str()).map_err(|e| format!("{name:?}: {e}"))?;
            Ok((p, d))
        })
        .collect()
}

fn entry(p: Provider, d: &Description, configured: bool, known: &BTreeMap<Provider, Entry>) -> Result<Entry, String> {
    let days = |inherited: Option<u32>| {
        d.redelivery_days.or(inherited).ok_or_else(|| {
            "redelivery_days is missing: how many days may the provider deliver the same event again?".to_string()
        })
    };
    let check_days = |days: u32| {
        if days > MAX_DAYS {
            Err(format!("redelivery_days {days} is more than {MAX_DAYS}"))
        } else {
            Ok(days)
        }
    };
    let Some(target) = &d.alias else {
        let rules = Rules::from_description(d)?;
        return Ok(Entry {
            provider: p,
            alias_of: None,
            kind: Kind::Declared(Box::new(rules)),
            redelivery_days: check_days(days(None)?)?,
            configured,
        });
    };
    if d.has_contract() {
        return Err("an alias takes only redelivery_days besides alias".into());
    }
    let target = Provider::try_from(target.as_str()).map_err(|e| format!("alias {target:?}: {e}"))?;
    let (kind, inherited) = match known.get(&target) {
        Some(Entry { provider, kind: Kind::Coded, redelivery_days, .. }) if *provider == Provider::STANDARD => {
            (Kind::Standard, *redelivery_days)
        }
        Some(Entry { kind: kind @ (Kind::Standard | Kind::Declared(_)), redelivery_days, .. }) => {
            (kind.clone(), *redelivery_days)
        }
        Some(Entry { provider, .. }) => {
            return Err(format!("alias {provider:?}: only standard and declared providers can be aliased"))
        }
        None => return Err(format!("alias {:?}: no such provider", d.alias.as_deref().unwrap_or_default())),
    };
    let redelivery_days = check_days(days(Some(inherited))?)?;
    Ok(Entry { provider: p, kind, redelivery_days, configured, alias_of: Some(target) })
}
