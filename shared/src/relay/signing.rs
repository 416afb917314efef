//! Signed deliveries, as Standard Webhooks signs them: `webhook-id` (the
//! message key), `webhook-timestamp` (Unix seconds) and `webhook-signature`,
//! `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per secret,
//! space-separated, so that a consumer rotating its secret accepts either.
//! Any Standard Webhooks verifier (the standardwebhooks libraries, Svix's)
//! checks what the HTTP sink sends.

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use webhook_inbox_schemes::secret::Secret;

/// The secrets a destination's deliveries are signed with: `whsec_<base64>`
/// (or bare base64), the first the current one; during a rotation, two.
#[derive(Clone, Debug)]
pub struct Signer {
    keys: Vec<Secret>,
}

impl Signer {
    /// From the text of `signing_secret_env`: secrets separated by commas or
    /// spaces. Says which one is not base64, never showing it.
    pub fn new(secrets: &str) -> Result<Self, String> {
        let keys = secrets
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .enumerate()
            .map(|(i, s)| {
                webhook_inbox_schemes::secret::decode_standard_secret(s)
                    .ok_or_else(|| format!("secret #{} is not base64 (after an optional whsec_ prefix)", i + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err("holds no secret".into());
        }
        Ok(Signer { keys })
    }

    /// The `webhook-signature` value for a delivery of `body` as `id` at `timestamp`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.keys
            .iter()
            .map(|key| {
                let mut mac = Hmac::<Sha256>::new_from_slice(key.expose()).expect("HMAC takes any key length");
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp.to_string().as_bytes());
                mac.update(b".");
                mac.update(body);
                format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}
