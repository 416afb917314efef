//! Marqeta: mandatory Basic authentication, an optional `X-Marqeta-Signature`
//! (hex HMAC-SHA256, or legacy HMAC-SHA1, of the raw body), and batches of up
//! to 10 notifications keyed by type: `{"transactions":[{"token":"...",...}]}`.

use std::borrow::Cow;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use serde_json::value::RawValue;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{
    body_digest_id, event_from, first_matching, header, header_values, parse_json_text, Delivery, Events, NewEvent,
    Provider, Rejected, Scheme, Verified, MAX_SIGNATURES,
};
use crate::{
    payload::storable,
    secret::{MarqetaAuth, Secret},
};

/// The optional signature header: hex HMAC-SHA1 of the body.
pub const SIGNATURE: &str = "x-marqeta-signature";
/// Rows one delivery may make: Marqeta batches at most 10 notifications.
pub const MAX_BATCH_ITEMS: usize = 100;
/// The notification key of Marqeta's health check, acknowledged and never stored.
pub const PINGS: &str = "pings";

/// Marqeta's scheme: Basic credentials, and `X-Marqeta-Signature` where
/// signing secrets are configured; a delivery batches notifications.
pub struct Marqeta {
    auth: MarqetaAuth,
}

impl Marqeta {
    /// Verifying with these credentials (and secrets).
    pub fn new(auth: MarqetaAuth) -> Self {
        Marqeta { auth }
    }
}

/// Equality in time that depends on neither the contents nor the lengths.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

impl Marqeta {
    /// The index of the password that matched.
    fn check_basic(&self, d: &Delivery<'_>) -> Result<usize, Rejected> {
        let value =
            header(d.headers, "authorization").ok_or_else(|| Rejected::missing("missing Basic authorization"))?;
        let encoded = value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .map(|(_, credentials)| credentials)
            .ok_or_else(|| Rejected::malformed("Authorization is not Basic"))?;
        let decoded =
            B64.decode(encoded.trim()).map_err(|_| Rejected::malformed("Basic credentials are not base64"))?;
        let colon = decoded
            .iter()
            .position(|b| *b == b':')
            .ok_or_else(|| Rejected::malformed("Basic credentials have no colon"))?;
        let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
        let user_ok = ct_eq(user, self.auth.username.expose());
        // Every password is compared, so timing does not tell which one is in use.
        let matched = self.auth.passwords.iter().map(|p| ct_eq(password, p.expose())).collect::<Vec<_>>();
        match matched.iter().position(|m| *m) {
            Some(index) if user_ok => Ok(index),
            _ => Err(Rejected::no_match("wrong Basic username or password")),
        }
    }

    fn check_signature(&self, d: &Delivery<'_>) -> Result<usize, Rejected> {
        if header_values(d.headers, SIGNATURE).all(str::is_empty) {
            return Err(Rejected::missing(
                "missing X-Marqeta-Signature header (required while MARQETA_WEBHOOK_SECRET is set)",
            ));
        }
        let sigs: Vec<Vec<u8>> =
            header_values(d.headers, SIGNATURE).filter_map(|v| hex::decode(v).ok()).take(MAX_SIGNATURES).collect();
        let (sha256, sha1): (Vec<Vec<u8>>, Vec<Vec<u8>>) = sigs.into_iter().partition(|s| s.len() == 32);
        let secrets: &[Secret] = &self.auth.signing_secrets;
        first_matching::<Hmac<Sha256>>(secrets, &[d.body], &sha256)
            .or_else(|| first_matching::<Hmac<Sha1>>(secrets, &[d.body], &sha1))
            .ok_or_else(|| Rejected::no_match("X-Marqeta-Signature does not match a configured secret"))
    }
}

impl Scheme for Marqeta {
    fn provider(&self) -> Provider {
        Provider::MARQETA
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        let password_index = self.check_basic(d)?;
        let secret_index = if self.auth.signing_secrets.is_empty() { password_index } else { self.check_signature(d)? };
        Ok(Verified { secret_index })
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        let unusable_body =
            |reason: String| Events::Batch(vec![NewEvent::unusable(body_digest_id(d.body), "unknown", None, reason)]);
        let Ok(text) = std::str::from_utf8(d.body) else {
            return unusable_body("body is not UTF-8".into());
        };
        // Items are checked one by one, so one bad notification does not sink the batch.
        let groups = match serde_json::from_str::<Groups<'_>>(text) {
            Ok(groups) => groups.0,
            Err(e) => {
                let payload = Some(text.to_string()).filter(|t| storable(t));
                return Events::Batch(vec![NewEvent::unusable(
                    body_digest_id(d.body),
                    "unknown",
                    payload,
                    format!("body is not an object of notification lists: {e}"),
                )]);
            }
        };
        let groups: Vec<(String, &RawValue, Option<Vec<&RawValue>>)> = groups
            .into_iter()
            .filter(|(key, _)| key != PINGS)
            .map(|(key, raw)| {
                let items = serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok().filter(|_| valid_key(&key));
                (key, raw, items)
            })
            .collect();
        // Every row costs the claim time: past the cap (ten times what Marqeta sends),
        // the delivery is kept whole as one failed row, so any body under the size
        // limit gets its answer within the timeouts.
        let rows: usize = groups.iter().map(|(_, _, items)| items.as_ref().map_or(1, Vec::len)).sum();
        if rows > MAX_BATCH_ITEMS {
            return unusable_body(format!(
                "{rows} notifications in one delivery, over the limit of {MAX_BATCH_ITEMS} (Marqeta sends at most 10); kept whole"
            ));
        }
        let mut events = Vec::with_capacity(rows);
        for (key, raw, items) in groups {
            match items {
                Some(items) => events.extend(items.into_iter().map(|item| item_event(&key, item))),
                None => events.push(NewEvent::unusable(
                    body_digest_id(raw.get().as_bytes()),
                    "unknown",
                    Some(raw.get().to_string()).filter(|t| storable(t)),
                    "a notification key that is empty, long or odd, or whose value is not a list",
                )),
            }
        }
        Events::Batch(events)
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&[SIGNATURE, "content-type"])
    }
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 64 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// One notification: `event_id = "<key>:<token>"`, `event_type = "<key>:<type>"` (or the key alone).
fn item_event(key: &str, item: &RawValue) -> NewEvent {
    let json = parse_json_text(Cow::Borrowed(item.get()));
    let fields = json.as_ref().ok().map(|j| &j.fields);
    let event_type = match fields.and_then(|f| f.kind.as_deref()) {
        Some(t) => format!("{key}:{t}"),
        None => key.to_string(),
    };
    let id = fields.and_then(|f| f.token.as_deref()).map(|token| format!("{key}:{token}"));
    event_from(item.get().as_bytes(), id, &event_type, json)
}

/// The top-level object's entries in order, repeats kept: `{"transactions":[a],"transactions":[b]}`
/// holds two groups, and neither is lost.
struct Groups<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Groups<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Groups<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of notification lists")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Groups<'a>, M::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    entries.push(entry);
                }
                Ok(Groups(entries))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{test_support::*, InitialStatus};
    use hmac::Mac;

    const BODY: &[u8] =
        br#"{"transactions":[{"token":"t1","type":"gpa.credit","amount":10},{"token":"t2","type":"authorization"}]}"#;

    fn basic(user: &str, password: &str) -> String {
        format!("Basic {}", B64.encode(format!("{user}:{password}")))
    }

    fn marqeta(signing: &[&str]) -> Marqeta {
        Marqeta::new(MarqetaAuth {
            username: Secret::new("mq_user"),
            passwords: vec![Secret::new("password-one-0123456789"), Secret::new("password-two-0123456789")],
            signing_secrets: signing.iter().map(|s| Secret::new(*s)).collect(),
        })
    }

    fn hmac_hex<M: Mac + hmac::digest::KeyInit>(key: &str) -> String {
        let mut mac = <M as Mac>::new_from_slice(key.as_bytes()).unwrap();
        mac.update(BODY);
        hex::encode(mac.finalize().into_bytes())
    }

    fn check(m: &Marqeta, pairs: &[(&str, &str)]) -> Result<Verified, Rejected> {
        let h = headers(pairs);
        m.verify(&Delivery { headers: &h, body: BODY, now: 0 })
    }

    #[test]
    fn basic_auth_matrix() {
        let m = marqeta(&[]);
        let ok = basic("mq_user", "password-two-0123456789");
        assert_eq!(check(&m, &[("Authorization", &ok)]), Ok(Verified { secret_index: 1 }));
        assert!(check(&m, &[("Authorization", &basic("mq_user", "wrong-password-0123456"))]).is_err());
        assert!(check(&m, &[("Authorization", &basic("other", "password-one-0123456789"))]).is_err());
        assert!(check(&m, &[("Authorization", &basic("mq_user", ""))]).is_err());
        assert!(check(&m, &[("Authorization", "Bearer abc")]).unwrap_err().to_string().contains("not Basic"));
        assert!(check(&m, &[]).unwrap_err().to_string().contains("missing Basic"));
    }

    #[test]
    fn signature_is_required_when_a_secret_is_set_and_both_algorithms_verify() {
        let m = marqeta(&["old-signing", "new-signing"]);
        let auth = basic("mq_user", "password-one-0123456789");
        let sha256 = hmac_hex::<Hmac<Sha256>>("new-signing");
        let sha1 = hmac_hex::<Hmac<Sha1>>("old-signing");
        assert_eq!(
            check(&m, &[("Authorization", &auth), ("X-Marqeta-Signature", &sha256)]),
            Ok(Verified { secret_index: 1 })
        );
        assert_eq!(
            check(&m, &[("Authorization", &auth), ("X-Marqeta-Signature", &sha1)]),
            Ok(Verified { secret_index: 0 })
        );
        assert!(check(&m, &[("Authorization", &auth)])
            .unwrap_err()
            .to_string()
            .contains("missing X-Marqeta-Signature"));
        assert!(check(&m, &[("Authorization", &auth), ("X-Marqeta-Signature", "")]).is_err());
        let wrong = hmac_hex::<Hmac<Sha256>>("other");
        assert!(check(&m, &[("Authorization", &auth), ("X-Marqeta-Signature", &wrong)]).is_err());
        // A valid signature does not replace Basic auth.
        assert!(check(&m, &[("X-Marqeta-Signature", &sha256)]).unwrap_err().to_string().contains("Basic"));
    }

    fn events(body: &[u8]) -> Vec<NewEvent> {
        let h = headers(&[]);
        match marqeta(&[]).events(&Delivery { headers: &h, body, now: 0 }) {
            Events::Batch(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_event_per_item_keyed_by_notification_type_and_token() {
        let e = events(BODY);
        let ids: Vec<_> = e.iter().map(|e| (e.event_id.as_str(), e.event_type.as_str())).collect();
        assert_eq!(
            ids,
            [("transactions:t1", "transactions:gpa.credit"), ("transactions:t2", "transactions:authorization")]
        );
        assert_eq!(e[0].payload.as_deref(), Some(r#"{"token":"t1","type":"gpa.credit","amount":10}"#));
    }

    #[test]
    fn pings_store_nothing_and_bad_items_are_kept_as_failed() {
        assert!(events(br#"{"pings":[{"token":"marqeta","payload":"healthcheck"}]}"#).is_empty());
        let e = events(br#"{"cardtransitions":[{"state":"ACTIVE"},{"token":"c1","x":"\u0000"}]}"#);
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|e| e.status == InitialStatus::Failed));
        assert!(e[0].event_id.starts_with("sha256:"));
        assert_eq!((e[1].event_id.as_str(), e[1].payload.as_deref()), ("cardtransitions:c1", None));
        let e = events(b"[1,2]");
        assert!(e[0].event_id.starts_with("sha256:") && e[0].status == InitialStatus::Failed);
        let e = events(br#"{"bad key":[{"token":"t"}],"other":{"token":"t"}}"#);
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|e| e.status == InitialStatus::Failed && e.event_id.starts_with("sha256:")));
        assert_ne!(e[0].event_id, e[1].event_id);
    }

    #[test]
    fn a_delivery_over_the_item_cap_is_one_failed_row() {
        let items: Vec<String> = (0..=MAX_BATCH_ITEMS).map(|i| format!(r#"{{"token":"t{i}"}}"#)).collect();
        let body = format!(r#"{{"transactions":[{}]}}"#, items.join(","));
        let e = events(body.as_bytes());
        assert_eq!(e.len(), 1);
        assert!(e[0].status == InitialStatus::Failed && e[0].event_id.starts_with("sha256:"));
        assert!(e[0].failure_reason.as_deref().unwrap().contains("101 notifications"), "{:?}", e[0].failure_reason);
        let groups: Vec<String> = (0..=MAX_BATCH_ITEMS).map(|i| format!(r#""k{i}":1"#)).collect();
        assert_eq!(events(format!("{{{}}}", groups.join(",")).as_bytes()).len(), 1, "bad groups count too");
        let at_cap = format!(r#"{{"transactions":[{}]}}"#, items[..MAX_BATCH_ITEMS].join(","));
        assert_eq!(events(at_cap.as_bytes()).len(), MAX_BATCH_ITEMS);
    }

    #[test]
    fn a_repeated_notification_key_loses_no_item() {
        let e = events(br#"{"transactions":[{"token":"a"}],"transactions":[{"token":"b"}]}"#);
        let ids: Vec<_> = e.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["transactions:a", "transactions:b"]);
    }
}
