//! The providers we accept webhooks from, by name.
//!
//! A name is the path segment of `/webhooks/{provider}` and the `provider`
//! column: five providers have code of their own (these constants), the others
//! are declared (`crate::declared`), built in or configured.

use std::{collections::HashSet, fmt, sync::Mutex};

/// A provider's name: lower-case ASCII letters, digits, `-` and `_`, at most
/// 64 characters. Names are interned, so a `Provider` is a cheap `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Provider(&'static str);

/// The longest provider name.
pub const MAX_NAME_CHARS: usize = 64;

impl Provider {
    /// Stripe (`Stripe-Signature`).
    pub const STRIPE: Provider = Provider("stripe");
    /// Shopify (`X-Shopify-Hmac-Sha256`).
    pub const SHOPIFY: Provider = Provider("shopify");
    /// Marqeta (Basic auth, optionally `X-Marqeta-Signature`).
    pub const MARQETA: Provider = Provider("marqeta");
    /// GitHub (`X-Hub-Signature-256`).
    pub const GITHUB: Provider = Provider("github");
    /// Standard Webhooks and Svix senders (`webhook-signature`).
    pub const STANDARD: Provider = Provider("standard");

    /// The providers with code of their own.
    pub const CODED: [Provider; 5] =
        [Provider::STRIPE, Provider::SHOPIFY, Provider::MARQETA, Provider::GITHUB, Provider::STANDARD];

    /// The name, as in `/webhooks/{provider}` and the `provider` column.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// The prefix of the provider's environment variables: `twitch` is `TWITCH`, `my-shop` is `MY_SHOP`.
    pub fn env_prefix(self) -> String {
        self.0.to_ascii_uppercase().replace('-', "_")
    }
}

impl AsRef<str> for Provider {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

/// Whether `s` is a provider's name: 1 to 64 lower-case letters, digits, `-`
/// or `_` (checked without interning it).
pub fn is_provider_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_CHARS
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Names seen so far, each stored once for the life of the process. Only
/// configured names and names read back from the database get here: receive
/// looks a caller's path segment up among its schemes without interning it.
static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

impl TryFrom<&str> for Provider {
    type Error = InvalidName;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        if let Some(p) = Provider::CODED.into_iter().find(|p| p.0 == s) {
            return Ok(p);
        }
        if !is_provider_name(s) {
            return Err(InvalidName);
        }
        let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
        let names = names.get_or_insert_with(HashSet::new);
        let name = match names.get(s) {
            Some(name) => *name,
            None => {
                let name: &'static str = Box::leak(s.to_string().into_boxed_str());
                names.insert(name);
                name
            }
        };
        Ok(Provider(name))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("not a provider name (1 to 64 lower-case letters, digits, '-' or '_')")]
/// Not a provider name.
pub struct InvalidName;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_interned_and_compared_by_value() {
        for p in Provider::CODED {
            assert_eq!(Provider::try_from(p.as_str()).unwrap(), p);
        }
        let a = Provider::try_from("my-shop_2").unwrap();
        let b = Provider::try_from(String::from("my-shop_2").as_str()).unwrap();
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "interned once");
        assert_eq!(a.env_prefix(), "MY_SHOP_2");
        for bad in ["", "Stripe", "pay pal", "a/b", "é", &"x".repeat(65)] {
            assert!(Provider::try_from(bad).is_err(), "{bad:?}");
        }
    }
}
