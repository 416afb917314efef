//! The providers we accept webhooks from.

use std::fmt;

/// A provider we accept webhooks from; the path segment of `/webhooks/{provider}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    Stripe,
    Shopify,
    Marqeta,
    Github,
    Standard,
}

impl Provider {
    pub const ALL: [Provider; 5] =
        [Provider::Stripe, Provider::Shopify, Provider::Marqeta, Provider::Github, Provider::Standard];

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Stripe => "stripe",
            Provider::Shopify => "shopify",
            Provider::Marqeta => "marqeta",
            Provider::Github => "github",
            Provider::Standard => "standard",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<&str> for Provider {
    type Error = UnknownProvider;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Provider::ALL.into_iter().find(|p| p.as_str() == s).ok_or(UnknownProvider)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown provider")]
pub struct UnknownProvider;
