//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...][,v0=<hex>]` over `"{t}.{body}"`.

use std::borrow::Cow;

use hmac::Hmac;
use sha2::Sha256;

use super::{
    candidate_groups, first_matching, header_values, parse_json, single_event, Delivery, Events, Provider, Rejected,
    Scheme, Verified, MAX_SIGNATURES,
};
use crate::secret::Secret;

/// The signature header.
pub const HEADER: &str = "stripe-signature";
/// Seconds between `t` and now, in both directions.
pub const TOLERANCE_SECS: i64 = 300;

/// Stripe's scheme: `Stripe-Signature` over `"{t}.{body}"`, within [`TOLERANCE_SECS`].
pub struct Stripe {
    secrets: Vec<Secret>,
}

impl Stripe {
    /// Verifying with any of `secrets` (two or more while one is rotated).
    pub fn new(secrets: Vec<Secret>) -> Self {
        Stripe { secrets }
    }
}

/// One `Stripe-Signature` value: its timestamp and every `v1` (a `v0` is test-mode: ignored).
struct Header<'a> {
    timestamp: Option<&'a str>,
    v1: Vec<&'a str>,
}

fn parse(value: &str) -> Header<'_> {
    let mut h = Header { timestamp: None, v1: Vec::new() };
    for item in value.split(',') {
        match item.trim().split_once('=') {
            Some(("t", t)) if h.timestamp.is_none() => h.timestamp = Some(t),
            Some(("v1", sig)) => h.v1.push(sig),
            _ => {}
        }
    }
    h
}

impl Scheme for Stripe {
    fn provider(&self) -> Provider {
        Provider::STRIPE
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        // A repeated header is read value by value, any that verifies being enough.
        let groups = candidate_groups(header_values(d.headers, HEADER), |value| self.candidates(value, d))
            .map_err(|reason| reason.unwrap_or_else(|| Rejected::missing("missing Stripe-Signature header")))?;
        groups
            .iter()
            .find_map(|(t, candidates)| {
                first_matching::<Hmac<Sha256>>(&self.secrets, &[t.as_bytes(), b".", d.body], candidates)
            })
            .map(|secret_index| Verified { secret_index })
            .ok_or_else(|| Rejected::no_match("no v1 signature in Stripe-Signature matches a configured secret"))
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        let mut json = parse_json(d.body);
        let (id, kind) = match &mut json {
            Ok(j) => (j.fields.id.take(), j.fields.kind.take()),
            Err(_) => (None, None),
        };
        single_event(d.body, id, kind.as_deref().unwrap_or("unknown"), json)
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&[HEADER, "content-type"])
    }
}

impl Stripe {
    /// One header value's timestamp (checked for age) and its v1 signatures.
    fn candidates<'a>(&self, value: &'a str, d: &Delivery<'_>) -> Result<(&'a str, Vec<Vec<u8>>), Rejected> {
        let h = parse(value);
        let t = h.timestamp.ok_or_else(|| Rejected::malformed("Stripe-Signature has no t= timestamp"))?;
        let ts: i64 = t.parse().map_err(|_| Rejected::malformed("Stripe-Signature timestamp is not a number"))?;
        if d.now.abs_diff(ts) > TOLERANCE_SECS as u64 {
            return Err(Rejected::stale("Stripe-Signature timestamp is outside the 300 s tolerance"));
        }
        let candidates: Vec<Vec<u8>> =
            h.v1.iter().filter_map(|s| hex::decode(s).ok()).filter(|s| !s.is_empty()).take(MAX_SIGNATURES).collect();
        if candidates.is_empty() {
            return Err(Rejected::malformed("Stripe-Signature has no v1 signature (v0 is not accepted)"));
        }
        Ok((t, candidates))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{test_support::*, InitialStatus, NewEvent, RejectionKind};
    use hmac::Mac;

    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{}}"#;

    fn sign(secret: &str, t: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    fn stripe() -> Stripe {
        Stripe::new(vec![Secret::new("whsec_old"), Secret::new("whsec_new")])
    }

    fn check(header: &str) -> Result<Verified, Rejected> {
        let h = headers(&[("Stripe-Signature", header)]);
        stripe().verify(&Delivery { headers: &h, body: BODY, now: now() })
    }

    #[test]
    fn valid_signature_with_either_rotated_secret_verifies() {
        let t = now();
        assert_eq!(check(&format!("t={t},v1={}", sign("whsec_old", t, BODY))), Ok(Verified { secret_index: 0 }));
        assert_eq!(check(&format!("t={t},v1={}", sign("whsec_new", t, BODY))), Ok(Verified { secret_index: 1 }));
    }

    #[test]
    fn any_of_several_v1_may_match() {
        let t = now();
        let h = format!("t={t},v1={},v1={},v0={}", "ab".repeat(32), sign("whsec_new", t, BODY), "cd".repeat(32));
        assert_eq!(check(&h), Ok(Verified { secret_index: 1 }));
        // The matching one first, a stale one last: a parser that keeps only the last v1 fails here.
        let h = format!("t={t},v1={},v1={}", sign("whsec_old", t, BODY), "ab".repeat(32));
        assert_eq!(check(&h), Ok(Verified { secret_index: 0 }));
    }

    #[test]
    fn at_most_sixteen_signatures_are_tried_across_repeated_headers() {
        let t = now();
        let valid = format!("t={t},v1={}", sign("whsec_new", t, BODY));
        for (bogus, ok) in [(15, true), (16, false)] {
            let first = format!("t={t},{}", vec![format!("v1={}", "ab".repeat(32)); bogus].join(","));
            let h = headers(&[("Stripe-Signature", &first), ("Stripe-Signature", &valid)]);
            let result = stripe().verify(&Delivery { headers: &h, body: BODY, now: t });
            assert_eq!(result.is_ok(), ok, "the valid one after {bogus} others: {result:?}");
        }
    }

    #[test]
    fn wrong_secret_missing_empty_and_v0_only_are_refused() {
        let t = now();
        assert!(check(&format!("t={t},v1={}", sign("whsec_other", t, BODY)))
            .unwrap_err()
            .to_string()
            .contains("matches"));
        assert!(check(&format!("t={t},v1=")).unwrap_err().to_string().contains("no v1"));
        assert!(check(&format!("t={t},v0={}", sign("whsec_old", t, BODY))).unwrap_err().to_string().contains("v0"));
        assert!(check(&format!("v1={}", sign("whsec_old", t, BODY))).unwrap_err().to_string().contains("timestamp"));
        let h = headers(&[]);
        let err = stripe().verify(&Delivery { headers: &h, body: BODY, now: t }).unwrap_err();
        assert_eq!(err.to_string(), "missing Stripe-Signature header");
    }

    #[test]
    fn timestamps_beyond_300_seconds_either_way_are_refused() {
        for t in [now() - 330, now() + 330] {
            let err = check(&format!("t={t},v1={}", sign("whsec_old", t, BODY))).unwrap_err();
            assert!(err.kind() == RejectionKind::Stale && err.to_string().contains("tolerance"), "{err}");
        }
        let t = now() - 290;
        assert!(check(&format!("t={t},v1={}", sign("whsec_old", t, BODY))).is_ok());
    }

    #[test]
    fn extreme_timestamps_are_refused_without_overflow() {
        for t in [i64::MIN, i64::MAX, 0] {
            let err = check(&format!("t={t},v1={}", "00".repeat(32))).unwrap_err();
            assert!(err.kind() == RejectionKind::Stale && err.to_string().contains("tolerance"), "{t}: {err}");
        }
    }

    #[test]
    fn a_signature_over_other_bytes_is_refused() {
        let t = now();
        let sig = sign("whsec_old", t, br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{} }"#);
        assert!(check(&format!("t={t},v1={sig}")).is_err());
    }

    #[test]
    fn events_read_id_and_type_from_the_body() {
        let h = headers(&[]);
        let d = Delivery { headers: &h, body: BODY, now: 0 };
        assert_eq!(
            stripe().events(&d),
            Events::Single(NewEvent::pending(
                "evt_1".into(),
                "payment_intent.succeeded",
                String::from_utf8(BODY.to_vec()).unwrap()
            ))
        );
        let d = Delivery { headers: &h, body: b"not json", now: 0 };
        let Events::Single(e) = stripe().events(&d) else { panic!() };
        assert_eq!(e.status, InitialStatus::Failed);
        assert!(e.event_id.starts_with("sha256:"));
        assert_eq!(e.payload, None);
    }
}
