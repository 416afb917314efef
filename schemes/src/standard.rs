//! Standard Webhooks (and Svix): `webhook-signature: v1,<base64> [v1,<base64> ...]`
//! over `"{webhook-id}.{webhook-timestamp}.{body}"`, keyed by the base64-decoded `whsec_` secret.

use std::borrow::Cow;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use sha2::Sha256;

use super::{
    first_matching, header, parse_json, single_event, Delivery, Events, Provider, Rejected, Scheme, Verified,
    MAX_SIGNATURES,
};
use crate::secret::Secret;

/// Seconds between `webhook-timestamp` and now, in both directions.
pub const TOLERANCE_SECS: i64 = 300;

/// Standard Webhooks: `webhook-signature` (or `svix-signature`) over
/// `"{id}.{timestamp}.{body}"`, within [`TOLERANCE_SECS`].
pub struct Standard {
    /// `standard`, or a sender's own name (`clerk`, `resend`, ...: aliases).
    provider: Provider,
    secrets: Vec<Secret>,
}

impl Standard {
    /// As provider `standard`.
    pub fn new(secrets: Vec<Secret>) -> Self {
        Standard::named(Provider::STANDARD, secrets)
    }

    /// As `provider`: a sender's own name for the same contract (`clerk`, `resend`, ...).
    pub fn named(provider: Provider, secrets: Vec<Secret>) -> Self {
        Standard { provider, secrets }
    }
}

/// The three headers, from the `webhook-` set or else the `svix-` set.
struct Headers<'a> {
    id: Option<&'a str>,
    timestamp: Option<&'a str>,
    signature: Vec<&'a str>,
}

fn headers<'a>(d: &Delivery<'a>) -> Headers<'a> {
    let prefix = if header(d.headers, "webhook-id").is_some() || header(d.headers, "svix-id").is_none() {
        "webhook"
    } else {
        "svix"
    };
    let get = |name: &str| header(d.headers, &format!("{prefix}-{name}"));
    Headers {
        id: get("id"),
        timestamp: get("timestamp"),
        signature: d
            .headers
            .get_all(format!("{prefix}-signature"))
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(str::split_ascii_whitespace)
            .collect(),
    }
}

impl Scheme for Standard {
    fn provider(&self) -> Provider {
        self.provider
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        let h = headers(d);
        let id = h.id.ok_or_else(|| Rejected::missing("missing webhook-id header"))?;
        let t = h.timestamp.ok_or_else(|| Rejected::missing("missing webhook-timestamp header"))?;
        if h.signature.is_empty() {
            return Err(Rejected::missing("missing webhook-signature header"));
        }
        let ts: i64 = t.parse().map_err(|_| Rejected::malformed("webhook-timestamp is not a number"))?;
        if d.now.abs_diff(ts) > TOLERANCE_SECS as u64 {
            return Err(Rejected::stale("webhook-timestamp is outside the 300 s tolerance"));
        }
        // Only `v1,` (HMAC-SHA256) entries count; `v1a,` (ed25519) and unknown versions are skipped.
        let candidates: Vec<Vec<u8>> = h
            .signature
            .iter()
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|b64| B64.decode(b64).ok())
            .filter(|sig| !sig.is_empty())
            .take(MAX_SIGNATURES)
            .collect();
        if candidates.is_empty() {
            return Err(Rejected::malformed("webhook-signature has no v1 signature"));
        }
        first_matching::<Hmac<Sha256>>(&self.secrets, &[id.as_bytes(), b".", t.as_bytes(), b".", d.body], &candidates)
            .map(|secret_index| Verified { secret_index })
            .ok_or_else(|| Rejected::no_match("no v1 signature in webhook-signature matches a configured secret"))
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        let json = parse_json(d.body);
        let event_type = json.as_ref().ok().and_then(|j| j.fields.kind.clone()).unwrap_or_else(|| "unknown".into());
        single_event(d.body, headers(d).id.map(str::to_string), &event_type, json)
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&[
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "svix-id",
            "svix-timestamp",
            "svix-signature",
            "content-type",
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{headers as hdrs, now};
    use hmac::Mac;

    const BODY: &[u8] = br#"{"type":"invoice.paid","timestamp":"2026-11-29T00:00:00Z","data":{}}"#;
    const OLD: &[u8] = b"old-secret-bytes";
    const NEW: &[u8] = b"new-secret-bytes";

    fn sign(key: &[u8], id: &str, t: i64) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(format!("{id}.{t}.").as_bytes());
        mac.update(BODY);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }

    fn check(prefix: &str, t: i64, signature: &str) -> Result<Verified, Rejected> {
        let (id, ts) = (format!("{prefix}-id"), format!("{prefix}-timestamp"));
        let sig = format!("{prefix}-signature");
        let h = hdrs(&[(&id, "msg_1"), (&ts, &t.to_string()), (&sig, signature)]);
        Standard::new(vec![Secret::new(OLD), Secret::new(NEW)]).verify(&Delivery {
            headers: &h,
            body: BODY,
            now: now(),
        })
    }

    #[test]
    fn signature_matrix() {
        let t = now();
        assert_eq!(check("webhook", t, &sign(OLD, "msg_1", t)), Ok(Verified { secret_index: 0 }));
        assert_eq!(check("webhook", t, &sign(NEW, "msg_1", t)), Ok(Verified { secret_index: 1 }));
        assert_eq!(check("svix", t, &sign(NEW, "msg_1", t)), Ok(Verified { secret_index: 1 }));
        let several = format!("v1a,AAAA {} {}", sign(b"other", "msg_1", t), sign(NEW, "msg_1", t));
        assert_eq!(check("webhook", t, &several), Ok(Verified { secret_index: 1 }));
        assert!(check("webhook", t, &sign(b"other", "msg_1", t)).unwrap_err().to_string().contains("matches"));
        assert!(check("webhook", t, &sign(OLD, "msg_2", t)).is_err(), "the id is signed");
        assert!(check("webhook", t, "v1,").unwrap_err().to_string().contains("no v1"));
        assert!(check("webhook", t, "v1a,c2lnbmF0dXJl").unwrap_err().to_string().contains("no v1"));
        for stale in [t - 330, t + 330] {
            assert!(check("webhook", stale, &sign(OLD, "msg_1", stale)).unwrap_err().to_string().contains("tolerance"));
        }
        let h = hdrs(&[("webhook-id", "msg_1"), ("webhook-timestamp", &t.to_string())]);
        let err = Standard::new(vec![Secret::new(OLD)]).verify(&Delivery { headers: &h, body: BODY, now: t });
        assert_eq!(err.unwrap_err().to_string(), "missing webhook-signature header");
    }

    #[test]
    fn id_header_and_body_type_identify_the_event() {
        let h = hdrs(&[("svix-id", "msg_9")]);
        let Events::Single(e) = Standard::new(vec![]).events(&Delivery { headers: &h, body: BODY, now: 0 }) else {
            panic!()
        };
        assert_eq!((e.event_id.as_str(), e.event_type.as_str()), ("msg_9", "invoice.paid"));
    }
}
