//! What restore takes of an archive's line: only what receive would have
//! stored. An archive is a file anyone with the bucket's `PutObject` (or who
//! hands an operator a file) could have written, so a line is read as a
//! stranger's delivery: its provider must be one this inbox knows, its
//! payload is what its raw bytes say (derived by the provider's scheme, as
//! receive derives it; a line saying otherwise is refused), its bytes verify
//! with a secret configured here (unless the operator takes unverified
//! lines, knowingly), and its times are times that could be.

use std::collections::HashMap;

use base64::Engine;
use http::HeaderMap;
use serde_json::{value::RawValue, Value};
use sha2::{Digest, Sha256};
use sqlx::types::Json;

use super::FORMAT;
use crate::{core::status::Status, db::inbox::ArchivedEvent};
use webhook_inbox_schemes::{
    catalog::Catalog, secret::Secrets, text::escape, verify_stored, Delivery, Events, Schemes,
};

/// Batch bodies an object's lines may point back at, in bytes at most: a
/// line whose body was forgotten to stay within it is refused, named.
const BODIES_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// How far ahead of this machine's clock a time may be (clocks differ).
const SKEW_SECS: i64 = 300;

/// The earliest time a line may give: 2000-01-01.
const EPOCH_2000: i64 = 946_684_800;

/// What a line came to.
pub(super) struct Checked {
    pub(super) event: ArchivedEvent,
    /// Taken without its bytes verified with a secret configured here (the
    /// operator's `unverified`).
    pub(super) unverified: bool,
}

/// Reads lines as restore takes them (see the module's documentation).
pub(super) struct Checker {
    /// Every provider's scheme, to derive events from bytes (a development
    /// secret each: deriving needs none, and verifying is `verifier`'s).
    parsers: Schemes,
    /// The schemes of the secrets configured: what verifies.
    verifier: Schemes,
    secrets: Secrets,
    /// Lines that no secret here verifies are taken (counted), not refused.
    unverified: bool,
    now: i64,
    /// The batch bodies of the object being read, by digest (hex).
    bodies: HashMap<String, Vec<u8>>,
    bodies_bytes: usize,
}

impl Checker {
    pub(super) fn new(catalog: &Catalog, secrets: &Secrets, unverified: bool) -> Checker {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Checker {
            parsers: Schemes::new(catalog, &Secrets::development()),
            verifier: Schemes::new(catalog, secrets),
            secrets: secrets.clone(),
            unverified,
            now: now.as_secs() as i64,
            bodies: HashMap::new(),
            bodies_bytes: 0,
        }
    }

    /// A new object: the bodies of the last are not pointed at from this one.
    pub(super) fn next_object(&mut self) {
        self.bodies.clear();
        self.bodies_bytes = 0;
    }

    /// A line, parsed and checked; or why it is refused.
    pub(super) fn check(&mut self, line: &str) -> Result<Checked, String> {
        let mut e: ArchivedEvent = serde_json::from_str(line).map_err(|e| format!("not an archived event: {e}"))?;
        if e.v > FORMAT {
            return Err(format!("format {} is newer than this inbox reads ({FORMAT})", e.v));
        }
        match Status::parse(&e.status) {
            None => return Err(format!("status {:?} is not one", escape(&e.status))),
            Some(Status::Pending) => return Err("pending: the archive holds finished events only".into()),
            Some(_) => {}
        }
        let chars = |t: &str| t.chars().count();
        if !(1..=255).contains(&chars(&e.event_id)) {
            return Err("its event id is empty or too long".into());
        }
        let Some(provider) = self.parsers.find(&e.provider).map(|s| s.provider()) else {
            return Err(format!("{:?} is not a provider this inbox knows", escape(&e.provider)));
        };
        if !matches!(e.source.as_str(), "webhook" | "reconcile") {
            return Err(format!("source {:?} is neither webhook nor reconcile", escape(&e.source)));
        }
        if !(0..=1_000_000).contains(&e.attempts) {
            return Err(format!("{} attempts cannot be", e.attempts));
        }
        let received = self.time("received_at", Some(&e.received_at))?.unwrap_or_default();
        for (name, at) in [
            ("processed_at", &e.processed_at),
            ("erased_at", &e.erased_at),
            ("restored_at", &e.restored_at),
            ("raw_erased_at", &e.raw_erased_at),
        ] {
            if self.time(name, at.as_deref())?.is_some_and(|t| t < received) {
                return Err(format!("its {name} is before it was received"));
            }
        }
        // A retry's time may be ahead; a far one only postpones nothing (the event is finished).
        if let Some(at) = &e.next_attempt_at {
            rfc3339_utc(at)
                .ok_or_else(|| format!("next_attempt_at {:?} is not a time this inbox writes", escape(at)))?;
        }
        if e.erased_at.is_some() {
            // Nothing of the event is left to forge: its key, type and times only.
            if e.payload.is_some() || e.raw_body.is_some() || e.body_sha256.is_some() {
                return Err("it is erased, yet holds a payload or raw bytes".into());
            }
            if e.event_type != webhook_inbox_schemes::event_type_of(&e.event_type) || chars(&e.event_type) == 0 {
                return Err("its event type is not one receive would have stored".into());
            }
            return Ok(Checked { event: e, unverified: false });
        }
        let raw = match self.raw_bytes(&e)? {
            Some(raw) => raw,
            None if e.raw_erased_at.is_some() && self.unverified => {
                return Ok(Checked { event: e, unverified: true });
            }
            None if e.raw_erased_at.is_some() => {
                return Err("its raw bytes were erased with another event of its batch: its payload cannot be \
                            checked against them (restore it with --unverified to take it as it is)"
                    .into())
            }
            None => return Err("it has no raw bytes".into()),
        };
        // The payload and type are what the bytes say, derived as receive derives them.
        let headers = header_map(e.headers.0.get());
        let delivery = Delivery { headers: &headers, body: &raw, now: received };
        let scheme = self.parsers.get(provider).expect("found above");
        let derived = match scheme.events(&delivery) {
            Events::Single(one) => vec![one],
            Events::Batch(items) => items,
        };
        let Some(derived) = derived.into_iter().find(|d| d.event_id == e.event_id) else {
            return Err("its raw bytes hold no event of its id".into());
        };
        if derived.event_type != e.event_type {
            return Err(format!(
                "its raw bytes say its type is {:?}, not {:?}",
                escape(&derived.event_type),
                escape(&e.event_type)
            ));
        }
        let stated = e.payload.as_ref().map(|p| serde_json::from_str::<Value>(p.0.get()));
        let said = derived.payload.as_deref().map(serde_json::from_str::<Value>);
        let same = match (stated, said) {
            (None, None) => true,
            (Some(Ok(a)), Some(Ok(b))) => same_json(&a, &b),
            _ => false,
        };
        if !same {
            return Err("its payload is not what its raw bytes say".into());
        }
        // Stored as receive stores it: the bytes' own text, not the line's.
        e.payload = match derived.payload {
            Some(text) => Some(Json(RawValue::from_string(text).map_err(|e| format!("its payload: {e}"))?)),
            None => None,
        };
        let verified = e.source == "webhook"
            && self.secrets.is_configured(provider)
            && verify_stored(
                &self.verifier,
                provider,
                &serde_json::from_str(e.headers.0.get()).unwrap_or_default(),
                &raw,
                received,
            )
            .is_ok();
        if !verified && !self.unverified {
            let why = if e.source == "reconcile" {
                "it was fetched by reconcile: no signature to verify".to_string()
            } else if !self.secrets.is_configured(provider) {
                format!("no {provider} secret is configured here to verify it with")
            } else {
                format!("its bytes do not verify with the {provider} secrets configured here")
            };
            return Err(format!(
                "{why} (restore with --unverified to take such lines, their payloads as their bytes say)"
            ));
        }
        Ok(Checked { event: e, unverified: !verified })
    }

    /// The line's raw bytes: its own, or its batch's (on this line, kept for
    /// the lines after it; or on an earlier line of the object).
    fn raw_bytes(&mut self, e: &ArchivedEvent) -> Result<Option<Vec<u8>>, String> {
        let decoded = match &e.raw_body {
            Some(b) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("raw_body is not base64: {e}"))?,
            ),
            None => None,
        };
        Ok(match (&e.body_sha256, decoded) {
            (Some(sha), Some(raw)) => {
                if hex::encode(Sha256::digest(&raw)) != *sha {
                    return Err(format!("its batch body does not hash to body_sha256 {:?}", escape(sha)));
                }
                if !self.bodies.contains_key(sha) && self.bodies_bytes + raw.len() <= BODIES_KEPT_BYTES {
                    self.bodies_bytes += raw.len();
                    self.bodies.insert(sha.clone(), raw.clone());
                }
                Some(raw)
            }
            (Some(sha), None) => match self.bodies.get(sha) {
                Some(raw) => Some(raw.clone()),
                None => return Err(format!("its batch body ({:?}) is on no earlier line of this object", escape(sha))),
            },
            (None, raw) => raw,
        })
    }

    /// A time the archive writes (RFC 3339 in UTC), as Unix seconds: one
    /// that could be (from 2000, and not ahead of this clock).
    fn time(&self, name: &str, text: Option<&str>) -> Result<Option<i64>, String> {
        let Some(text) = text else { return Ok(None) };
        let t =
            rfc3339_utc(text).ok_or_else(|| format!("{name} {:?} is not a time this inbox writes", escape(text)))?;
        if !(EPOCH_2000..=self.now + SKEW_SECS).contains(&t) {
            return Err(format!("{name} {text} cannot be: before 2000, or ahead of now"));
        }
        Ok(Some(t))
    }
}

/// Kept headers (an object of names to a value or an array of values) as a map.
fn header_map(kept: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    let Ok(Value::Object(headers)) = serde_json::from_str::<Value>(kept) else { return map };
    for (name, value) in &headers {
        let Ok(name) = http::HeaderName::from_bytes(name.as_bytes()) else { continue };
        let values: Vec<&str> = match value {
            Value::String(s) => vec![s],
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        for value in values.into_iter().filter_map(|v| http::HeaderValue::from_str(v).ok()) {
            map.append(name.clone(), value);
        }
    }
    map
}

/// Whether two JSON values are the same, numbers by their value (`1.0` and
/// `1`, `1e2` and `100`: `jsonb` writes numbers its own way).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// A time as the archive writes it (RFC 3339): Unix seconds.
fn rfc3339_utc(s: &str) -> Option<i64> {
    use webhook_inbox_schemes::declared::{parse_time, TimeFormat};
    parse_time(s, TimeFormat::Rfc3339)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_s_times_read_as_unix_seconds_and_nothing_else_does() {
        assert_eq!(rfc3339_utc("1970-01-01T00:00:00.000000Z"), Some(0));
        assert_eq!(rfc3339_utc("2025-10-01T12:00:01.000000Z"), Some(1_759_320_001));
        assert_eq!(rfc3339_utc("2000-03-01T00:00:00Z"), Some(951_868_800));
        for bad in ["2025-13-45T00:00:00Z", "2025-10-01T12:00:00", "", "xT y"] {
            assert_eq!(rfc3339_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn numbers_are_the_same_by_their_value() {
        let (a, b): (Value, Value) =
            (serde_json::from_str(r#"{"a":[1.0,1e2]}"#).unwrap(), serde_json::from_str(r#"{"a":[1,100]}"#).unwrap());
        assert!(same_json(&a, &b));
        assert!(!same_json(&a, &serde_json::json!({"a": [1, 101]})));
        assert!(!same_json(&a, &serde_json::json!({"a": [1, 100], "b": 1})));
    }
}
