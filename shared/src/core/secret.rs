//! Secrets, typed so that they never print: each provider's signing secrets,
//! and Marqeta's Basic credentials. Reading them is [`crate::config`]'s job.

use std::fmt;

use super::provider::Provider;

/// Secret bytes whose `Debug` never shows them. No `PartialEq`: secrets are
/// compared only in constant time, by the schemes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(bytes.into())
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Marqeta's Basic credentials and optional signing secrets.
#[derive(Clone, Debug)]
pub struct MarqetaAuth {
    pub username: Secret,
    /// Several passwords may be valid at once while one is being rotated.
    pub passwords: Vec<Secret>,
    /// When non-empty, a valid `X-Marqeta-Signature` is required as well.
    pub signing_secrets: Vec<Secret>,
}

/// The secrets of every provider; a provider with none configured has no endpoint.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub stripe: Vec<Secret>,
    pub shopify: Vec<Secret>,
    pub github: Vec<Secret>,
    /// Already base64-decoded, `whsec_` prefix removed.
    pub standard: Vec<Secret>,
    pub marqeta: Option<MarqetaAuth>,
}

impl Secrets {
    pub fn is_configured(&self, provider: Provider) -> bool {
        match provider {
            Provider::Stripe => !self.stripe.is_empty(),
            Provider::Shopify => !self.shopify.is_empty(),
            Provider::Github => !self.github.is_empty(),
            Provider::Standard => !self.standard.is_empty(),
            Provider::Marqeta => self.marqeta.is_some(),
        }
    }

    pub fn none_configured(&self) -> bool {
        Provider::ALL.iter().all(|p| !self.is_configured(*p))
    }
}
