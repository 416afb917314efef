//! GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(raw body)>`. No timestamp is signed.

use std::borrow::Cow;

use hmac::Hmac;
use sha2::Sha256;

use super::{
    first_matching, header, header_values, parse_json, parse_json_text, single_event, Delivery, Events, Provider,
    Rejected, Scheme, Verified, MAX_SIGNATURES,
};
use crate::secret::Secret;

/// The signature header: `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE: &str = "x-hub-signature-256";
/// The delivery's id, the event id.
pub const DELIVERY: &str = "x-github-delivery";
/// The event's type.
pub const EVENT: &str = "x-github-event";

/// GitHub's scheme: `X-Hub-Signature-256` over the body, the event named by `X-GitHub-Event`.
pub struct Github {
    secrets: Vec<Secret>,
}

impl Github {
    /// Verifying with any of `secrets` (two or more while one is rotated).
    pub fn new(secrets: Vec<Secret>) -> Self {
        Github { secrets }
    }
}

impl Scheme for Github {
    fn provider(&self) -> Provider {
        Provider::GITHUB
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        if header_values(d.headers, SIGNATURE).all(str::is_empty) {
            return Err(Rejected::missing("missing X-Hub-Signature-256 header"));
        }
        let candidates: Vec<Vec<u8>> = header_values(d.headers, SIGNATURE)
            .filter_map(|v| v.strip_prefix("sha256="))
            .filter_map(|hex| hex::decode(hex).ok())
            .take(MAX_SIGNATURES)
            .collect();
        if candidates.iter().all(Vec::is_empty) {
            return Err(Rejected::malformed("X-Hub-Signature-256 is not of the form sha256=<hex>"));
        }
        first_matching::<Hmac<Sha256>>(&self.secrets, &[d.body], &candidates)
            .map(|secret_index| Verified { secret_index })
            .ok_or_else(|| Rejected::no_match("X-Hub-Signature-256 does not match a configured secret"))
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        // A hook may be set to deliver `application/x-www-form-urlencoded` with the JSON in `payload`.
        let form = header(d.headers, "content-type")
            .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"));
        let json = if form {
            form_urlencoded::parse(d.body)
                .find(|(k, _)| k == "payload")
                .ok_or_else(|| "form body has no payload field".to_string())
                .and_then(|(_, v)| parse_json_text(Cow::Owned(v.into_owned())))
        } else {
            parse_json(d.body)
        };
        let event = header(d.headers, EVENT).unwrap_or("unknown");
        let action = json.as_ref().ok().and_then(|j| j.fields.action.as_deref());
        let event_type = match action {
            Some(action) => format!("{event}.{action}"),
            None => event.to_string(),
        };
        single_event(d.body, header(d.headers, DELIVERY).map(str::to_string), &event_type, json)
    }

    /// X-GitHub-Delivery and X-GitHub-Event are not signed, and nothing signed is dated.
    fn guards_replays(&self) -> bool {
        true
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&[
            DELIVERY,
            EVENT,
            "x-github-hook-id",
            "x-github-hook-installation-target-type",
            "x-github-hook-installation-target-id",
            SIGNATURE,
            "content-type",
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{test_support::*, InitialStatus};
    use hmac::Mac;

    const BODY: &[u8] = br#"{"action":"opened","issue":{"number":1}}"#;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn check(pairs: &[(&str, &str)]) -> Result<Verified, Rejected> {
        let h = headers(pairs);
        Github::new(vec![Secret::new("old"), Secret::new("new")]).verify(&Delivery { headers: &h, body: BODY, now: 0 })
    }

    #[test]
    fn signature_matrix() {
        assert_eq!(check(&[("X-Hub-Signature-256", &sign("old", BODY))]), Ok(Verified { secret_index: 0 }));
        assert_eq!(check(&[("X-Hub-Signature-256", &sign("new", BODY))]), Ok(Verified { secret_index: 1 }));
        assert!(check(&[("X-Hub-Signature-256", &sign("other", BODY))])
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        assert!(check(&[]).unwrap_err().to_string().contains("missing"));
        assert!(check(&[("X-Hub-Signature-256", "sha256=")]).is_err());
        assert!(check(&[("X-Hub-Signature-256", &sign("old", BODY)[7..])]).unwrap_err().to_string().contains("form"));
        let sha1 = [("X-Hub-Signature-256", "sha1=0123456789abcdef0123456789abcdef01234567")];
        assert!(check(&sha1).is_err());
    }

    #[test]
    fn delivery_header_is_the_id_and_event_with_action_the_type() {
        let h = headers(&[("X-GitHub-Delivery", "72d3162e"), ("X-GitHub-Event", "issues")]);
        let Events::Single(e) = Github::new(vec![]).events(&Delivery { headers: &h, body: BODY, now: 0 }) else {
            panic!()
        };
        assert_eq!((e.event_id.as_str(), e.event_type.as_str()), ("72d3162e", "issues.opened"));
    }

    #[test]
    fn form_encoded_payloads_are_read() {
        let body = format!("payload={}", form_urlencoded::byte_serialize(BODY).collect::<String>());
        let h = headers(&[
            ("X-GitHub-Delivery", "d1"),
            ("X-GitHub-Event", "issues"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ]);
        let Events::Single(e) = Github::new(vec![]).events(&Delivery { headers: &h, body: body.as_bytes(), now: 0 })
        else {
            panic!()
        };
        assert_eq!(e.status, InitialStatus::Pending);
        assert_eq!(e.payload.as_deref(), Some(std::str::from_utf8(BODY).unwrap()));
    }
}
