//! Shopify: `X-Shopify-Hmac-Sha256` is base64 of HMAC-SHA256 over the raw body. No timestamp is signed.

use std::borrow::Cow;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use sha2::Sha256;

use super::{
    first_matching, header, header_values, parse_json, single_event, Delivery, Events, Provider, Rejected, Scheme,
    Verified, MAX_SIGNATURES,
};
use crate::secret::Secret;

/// The signature header: base64 HMAC-SHA256 of the body.
pub const HMAC_HEADER: &str = "x-shopify-hmac-sha256";
/// The webhook's id, the event id.
pub const WEBHOOK_ID: &str = "x-shopify-webhook-id";
/// The event's type.
pub const TOPIC: &str = "x-shopify-topic";

/// Shopify's scheme: `X-Shopify-Hmac-Sha256` over the body, the id and topic from its headers.
pub struct Shopify {
    secrets: Vec<Secret>,
}

impl Shopify {
    /// Verifying with any of `secrets` (two or more while one is rotated).
    pub fn new(secrets: Vec<Secret>) -> Self {
        Shopify { secrets }
    }
}

impl Scheme for Shopify {
    fn provider(&self) -> Provider {
        Provider::SHOPIFY
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        let candidates: Vec<Vec<u8>> =
            header_values(d.headers, HMAC_HEADER).filter_map(|v| B64.decode(v).ok()).take(MAX_SIGNATURES).collect();
        if header_values(d.headers, HMAC_HEADER).all(str::is_empty) {
            return Err(Rejected::missing("missing X-Shopify-Hmac-Sha256 header"));
        }
        if candidates.iter().all(Vec::is_empty) {
            return Err(Rejected::malformed("X-Shopify-Hmac-Sha256 holds no base64 signature"));
        }
        first_matching::<Hmac<Sha256>>(&self.secrets, &[d.body], &candidates)
            .map(|secret_index| Verified { secret_index })
            .ok_or_else(|| Rejected::no_match("X-Shopify-Hmac-Sha256 does not match a configured secret"))
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        let id = header(d.headers, WEBHOOK_ID).map(str::to_string);
        let topic = header(d.headers, TOPIC).unwrap_or("unknown");
        single_event(d.body, id, topic, parse_json(d.body))
    }

    /// X-Shopify-Webhook-Id and X-Shopify-Topic are not signed, and nothing signed is dated.
    fn guards_replays(&self) -> bool {
        true
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&[
            WEBHOOK_ID,
            "x-shopify-event-id",
            TOPIC,
            "x-shopify-triggered-at",
            "x-shopify-shop-domain",
            "x-shopify-api-version",
            HMAC_HEADER,
            "content-type",
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{test_support::*, InitialStatus};
    use hmac::Mac;

    const BODY: &[u8] = br#"{"id":820982911946154508,"total_price":"49.99"}"#;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        B64.encode(mac.finalize().into_bytes())
    }

    fn check(pairs: &[(&str, &str)]) -> Result<Verified, Rejected> {
        let h = headers(pairs);
        Shopify::new(vec![Secret::new("old"), Secret::new("new")]).verify(&Delivery { headers: &h, body: BODY, now: 0 })
    }

    #[test]
    fn signature_matrix() {
        assert_eq!(check(&[("X-Shopify-Hmac-Sha256", &sign("old", BODY))]), Ok(Verified { secret_index: 0 }));
        assert_eq!(check(&[("X-Shopify-Hmac-Sha256", &sign("new", BODY))]), Ok(Verified { secret_index: 1 }));
        assert!(check(&[("X-Shopify-Hmac-Sha256", &sign("other", BODY))]).is_err());
        assert!(check(&[("X-Shopify-Hmac-Sha256", "")]).unwrap_err().to_string().contains("missing"));
        assert!(check(&[]).unwrap_err().to_string().contains("missing"));
        assert!(check(&[("X-Shopify-Hmac-Sha256", "not base64!")]).is_err());
        let twice = [("X-Shopify-Hmac-Sha256", "AAAA"), ("X-Shopify-Hmac-Sha256", &sign("new", BODY) as &str)];
        assert_eq!(check(&twice), Ok(Verified { secret_index: 1 }));
    }

    #[test]
    fn the_webhook_id_header_is_the_event_id_and_the_topic_the_type() {
        let h = headers(&[("X-Shopify-Webhook-Id", "b54557e4"), ("X-Shopify-Topic", "orders/create")]);
        let Events::Single(e) = Shopify::new(vec![]).events(&Delivery { headers: &h, body: BODY, now: 0 }) else {
            panic!()
        };
        assert_eq!(
            (e.event_id.as_str(), e.event_type.as_str(), e.status),
            ("b54557e4", "orders/create", InitialStatus::Pending)
        );
        let h = headers(&[("X-Shopify-Topic", "orders/create")]);
        let Events::Single(e) = Shopify::new(vec![]).events(&Delivery { headers: &h, body: BODY, now: 0 }) else {
            panic!()
        };
        assert_eq!(e.status, InitialStatus::Failed);
        assert!(e.event_id.starts_with("sha256:"));
        assert!(e.payload.is_some(), "the JSON is still kept");
    }
}
