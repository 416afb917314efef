//! Secrets, typed so that they never print: each provider's signing secrets,
//! and Marqeta's Basic credentials. They are read with [`Secrets::read`] (and [`Secrets::development`] for a local stack).

use std::{collections::BTreeMap, fmt};

use crate::Provider;

/// Secret bytes whose `Debug` never shows them. No `PartialEq`: secrets are
/// compared only in constant time, by the schemes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The secret of these bytes (already decoded, as the provider's scheme uses them).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(bytes.into())
    }

    /// The bytes themselves, for signing or verifying with them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// A stable name for the secret that does not reveal it: 16 hex digits of
    /// SHA-256 over a fixed label and the secret. Recorded with each delivery
    /// it verified, so that use is counted per secret whatever order the
    /// rotation list is in, and a rotated-out secret is retired only once
    /// nothing uses it.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new().chain_update(b"webhook-inbox secret fingerprint\0").chain_update(&self.0).finalize();
        hex::encode(&digest[..8])
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
    /// The Basic user name.
    pub username: Secret,
    /// Several passwords may be valid at once while one is being rotated.
    pub passwords: Vec<Secret>,
    /// When non-empty, a valid `X-Marqeta-Signature` is required as well.
    pub signing_secrets: Vec<Secret>,
}

/// The secrets of every provider; a provider with none configured has no endpoint.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// `STRIPE_WEBHOOK_SECRET`, as given (`whsec_...`).
    pub stripe: Vec<Secret>,
    /// `SHOPIFY_WEBHOOK_SECRET`.
    pub shopify: Vec<Secret>,
    /// `GITHUB_WEBHOOK_SECRET`.
    pub github: Vec<Secret>,
    /// Already base64-decoded, `whsec_` prefix removed.
    pub standard: Vec<Secret>,
    /// `MARQETA_WEBHOOK_USERNAME`, `MARQETA_WEBHOOK_PASSWORD` and `MARQETA_WEBHOOK_SECRET`.
    pub marqeta: Option<MarqetaAuth>,
    /// Each other provider's secrets (`<NAME>_WEBHOOK_SECRET`), decoded as its contract says.
    pub declared: BTreeMap<Provider, Vec<Secret>>,
}

impl Secrets {
    /// Whether the provider has at least one secret (an endpoint).
    pub fn is_configured(&self, provider: Provider) -> bool {
        self.count(provider) > 0
    }

    /// How many secrets (Marqeta: passwords) are configured for a provider: two or more while one rotates.
    pub fn count(&self, provider: Provider) -> usize {
        match provider {
            Provider::STRIPE => self.stripe.len(),
            Provider::SHOPIFY => self.shopify.len(),
            Provider::GITHUB => self.github.len(),
            Provider::STANDARD => self.standard.len(),
            Provider::MARQETA => self.marqeta.as_ref().map_or(0, |m| m.passwords.len()),
            other => self.declared.get(&other).map_or(0, Vec::len),
        }
    }

    /// The fingerprints of a provider's secrets, in the order configured: what
    /// a verified delivery's secret index refers to (Marqeta's signing
    /// secrets when it has them, else its Basic passwords).
    pub fn fingerprints(&self, provider: Provider) -> Vec<String> {
        let list: &[Secret] = match provider {
            Provider::STRIPE => &self.stripe,
            Provider::SHOPIFY => &self.shopify,
            Provider::GITHUB => &self.github,
            Provider::STANDARD => &self.standard,
            Provider::MARQETA => match &self.marqeta {
                Some(m) if !m.signing_secrets.is_empty() => &m.signing_secrets,
                Some(m) => &m.passwords,
                None => &[],
            },
            other => self.declared.get(&other).map_or(&[][..], Vec::as_slice),
        };
        list.iter().map(Secret::fingerprint).collect()
    }

    /// Whether no provider has a secret (a deployment that would refuse everything).
    pub fn none_configured(&self) -> bool {
        Provider::CODED.iter().all(|p| !self.is_configured(*p)) && self.declared.values().all(Vec::is_empty)
    }
}

/// Standard Webhooks keys are base64 after an optional `whsec_` prefix.
pub fn decode_standard_secret(s: &str) -> Option<Secret> {
    use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
    let key = B64.decode(s.strip_prefix("whsec_").unwrap_or(s)).ok()?;
    (!key.is_empty()).then(|| Secret::new(key))
}

impl Secrets {
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
