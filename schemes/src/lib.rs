//! Webhook providers' signing and delivery contracts, with no async runtime
//! and no database: verify a delivery over its exact bytes, then read the
//! events it carries.
//!
//! Each provider is a [`Scheme`]: five in code of their own ([`stripe`],
//! [`shopify`], [`github`], [`marqeta`], [`standard`] for Standard Webhooks),
//! two dozen more written as data ([`declared`], listed with the rest in the
//! [`catalog::Catalog`]). A scheme first verifies the raw bytes
//! ([`Scheme::verify`]: a [`Verified`], or a [`Rejected`] saying why in words
//! safe to send back), and only then parses them into the events to claim
//! ([`Scheme::events`]). [`Schemes`] holds every configured provider's.
//!
//! The `webhook-inbox` crate builds its receive stage on this one and
//! re-exports it as `webhook_inbox::schemes`; it stands alone too, in a proxy,
//! a test or another framework's handler:
//!
//! ```
//! use hmac::{Hmac, Mac};
//! use http::HeaderMap;
//! use sha2::Sha256;
//! use webhook_inbox_schemes::{secret::Secret, stripe::Stripe, Delivery, Events, RejectionKind, Scheme};
//!
//! let stripe = Stripe::new(vec![Secret::new("whsec_test")]);
//! let body = br#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;
//! let now = 1_767_225_600; // Unix seconds
//!
//! // What Stripe sends: `t=<unix>,v1=<hex HMAC-SHA256 of "{t}.{body}">`.
//! let mut mac = Hmac::<Sha256>::new_from_slice(b"whsec_test").unwrap();
//! mac.update(format!("{now}.").as_bytes());
//! mac.update(body);
//! let signature = format!("t={now},v1={}", hex::encode(mac.finalize().into_bytes()));
//! let mut headers = HeaderMap::new();
//! headers.insert("stripe-signature", signature.parse().unwrap());
//!
//! let delivery = Delivery { headers: &headers, body, now };
//! assert_eq!(stripe.verify(&delivery).unwrap().secret_index, 0);
//! let Events::Single(event) = stripe.events(&delivery) else { panic!("one event") };
//! assert_eq!((event.event_id.as_str(), event.event_type.as_str()), ("evt_1", "invoice.paid"));
//!
//! // A body changed in transit, or a stale timestamp, is refused.
//! let forged = Delivery { body: br#"{"id":"evt_1","type":"invoice.paid","amount":0}"#, ..delivery };
//! assert_eq!(stripe.verify(&forged).unwrap_err().kind(), RejectionKind::NoMatch);
//! let late = Delivery { now: now + 3600, ..delivery };
//! assert_eq!(stripe.verify(&late).unwrap_err().kind(), RejectionKind::Stale);
//! ```
//!
//! [`text`] escapes what a stranger sent before it reaches a terminal, a log
//! or a page; [`payload`] is what a usable payload is.

use std::{borrow::Cow, fmt, sync::Arc};

use hmac::Mac;
use http::HeaderMap;
use sha2::{Digest, Sha256};

pub use crate::{
    env::{ProcessEnv, Vars},
    error::ConfigError,
    event::{event_type_of, InitialStatus, NewEvent, MAX_EVENT_ID_CHARS, MAX_EVENT_TYPE_CHARS},
    provider::{is_provider_name, InvalidName, Provider, MAX_NAME_CHARS},
};
use crate::{
    payload::Fields,
    secret::{Secret, Secrets},
};

pub mod catalog;
pub mod declared;
mod env;
mod error;
mod event;
pub mod github;
pub mod marqeta;
pub mod payload;
mod provider;
pub mod secret;
pub mod shopify;
pub mod standard;
pub mod stripe;
pub mod text;

/// Signatures tried per delivery, in all (across header values and list
/// items): a sender rotating keys sends two or three; a stranger's thousands
/// cost no more.
pub const MAX_SIGNATURES: usize = 16;

/// A delivery as received: headers and the exact bytes, after API Gateway's base64 decoding.
#[derive(Clone, Copy)]
pub struct Delivery<'a> {
    /// The request's headers, repeated ones included.
    pub headers: &'a HeaderMap,
    /// The body's exact bytes: what the provider signed.
    pub body: &'a [u8],
    /// Unix seconds, for the schemes that sign a timestamp.
    pub now: i64,
}

/// Proof that a delivery is authentic: which configured secret matched (by index, never the secret).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The position of the secret that verified, in the list the scheme was given.
    pub secret_index: usize,
}

/// Why a delivery was refused: a [`RejectionKind`] to match on, and words
/// safe to send back (never a secret or an expected signature).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    kind: RejectionKind,
    reason: Cow<'static, str>,
}

/// What kind of refusal a [`Rejected`] is (each is answered 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The signature header (or the credentials, or another header the
    /// contract signs) is absent.
    Missing,
    /// Present, but not of the contract's form: not hex or base64, a timestamp
    /// that is not a number, a list without the signature's key, ...
    Malformed,
    /// Signed, but the signed timestamp is outside the tolerance: a replay,
    /// or a clock off.
    Stale,
    /// Well formed, but no configured secret verifies it (or the credentials
    /// are wrong).
    NoMatch,
    /// No secret is configured for the provider, so nothing can verify.
    Unconfigured,
}

impl Rejected {
    /// A refusal of this kind, for this reason.
    pub fn new(kind: RejectionKind, reason: impl Into<Cow<'static, str>>) -> Self {
        Rejected { kind, reason: reason.into() }
    }

    /// [`RejectionKind::Missing`].
    pub fn missing(reason: impl Into<Cow<'static, str>>) -> Self {
        Rejected::new(RejectionKind::Missing, reason)
    }

    /// [`RejectionKind::Malformed`].
    pub fn malformed(reason: impl Into<Cow<'static, str>>) -> Self {
        Rejected::new(RejectionKind::Malformed, reason)
    }

    /// [`RejectionKind::Stale`].
    pub fn stale(reason: impl Into<Cow<'static, str>>) -> Self {
        Rejected::new(RejectionKind::Stale, reason)
    }

    /// [`RejectionKind::NoMatch`].
    pub fn no_match(reason: impl Into<Cow<'static, str>>) -> Self {
        Rejected::new(RejectionKind::NoMatch, reason)
    }

    /// What kind of refusal it is.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The reason, as answered.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What a verified delivery turns into.
#[derive(Debug, PartialEq, Eq)]
pub enum Events {
    /// The delivery is one event.
    Single(NewEvent),
    /// Marqeta: one row per item, answered with counts (a ping is an empty batch).
    Batch(Vec<NewEvent>),
}

/// A provider's signing and delivery contract.
pub trait Scheme: Send + Sync {
    /// The provider it verifies for: its route is `POST /webhooks/{provider}`.
    fn provider(&self) -> Provider;
    /// Checks the signature over the raw bytes, in constant time, before anything is parsed.
    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verified, Rejected>;
    /// The events of a verified delivery. Never fails: what cannot be used is stored as `failed`.
    fn events(&self, delivery: &Delivery<'_>) -> Events;
    /// Lower-case names of the headers kept with each row (identity, sequencing, signature).
    fn kept_headers(&self) -> Cow<'_, [&str]>;
    /// Whether the event's id (or type) is read from something the signature
    /// does not cover (a signed timestamp only narrows a replay's window): then the
    /// signed bytes are deduplicated too (with the event's type: one body
    /// may come under several topics), so that a captured delivery sent
    /// again under another id is a duplicate (a suspected replay), not a new
    /// event.
    fn guards_replays(&self) -> bool {
        false
    }
    /// The answer to a verified handshake (the provider checking the endpoint), which is no event.
    fn challenge(&self, _delivery: &Delivery<'_>, _verified: Verified) -> Option<Challenged> {
        None
    }
    /// The answer to an unsigned ping, asked before `verify` (WooCommerce's, on
    /// saving a webhook): no event, never stored, and never a delivery that
    /// carries a signature header.
    fn ping(&self, _delivery: &Delivery<'_>) -> Option<Challenged> {
        None
    }
}

/// What a handshake is answered, with `200`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenged {
    /// The answer's `Content-Type`.
    pub content_type: &'static str,
    /// The answer's body.
    pub body: String,
}

/// The configured schemes; a provider with no secret has none, so no unauthenticated endpoint exists.
pub struct Schemes {
    schemes: Vec<Arc<dyn Scheme>>,
    catalog: catalog::Catalog,
}

impl Schemes {
    /// The scheme of every provider `secrets` configures: the coded ones,
    /// and those `catalog` declares or names as Standard Webhooks.
    pub fn new(catalog: &catalog::Catalog, secrets: &Secrets) -> Self {
        let mut v: Vec<Arc<dyn Scheme>> = Vec::new();
        if !secrets.stripe.is_empty() {
            v.push(Arc::new(stripe::Stripe::new(secrets.stripe.clone())));
        }
        if !secrets.shopify.is_empty() {
            v.push(Arc::new(shopify::Shopify::new(secrets.shopify.clone())));
        }
        if let Some(auth) = &secrets.marqeta {
            v.push(Arc::new(marqeta::Marqeta::new(auth.clone())));
        }
        if !secrets.github.is_empty() {
            v.push(Arc::new(github::Github::new(secrets.github.clone())));
        }
        if !secrets.standard.is_empty() {
            v.push(Arc::new(standard::Standard::new(secrets.standard.clone())));
        }
        for (provider, keys) in secrets.declared.iter().filter(|(_, keys)| !keys.is_empty()) {
            match catalog.get(*provider).map(|e| &e.kind) {
                Some(catalog::Kind::Standard) => v.push(Arc::new(standard::Standard::named(*provider, keys.clone()))),
                Some(catalog::Kind::Declared(rules)) => v.push(Arc::new(declared::Declared::new(
                    *provider,
                    (**rules).clone(),
                    keys.clone(),
                    catalog.url(*provider).map(str::to_string),
                ))),
                Some(catalog::Kind::Coded) | None => {}
            }
        }
        Schemes { schemes: v, catalog: catalog.clone() }
    }

    /// Schemes of a team's own (`webhook_inbox::App::with_scheme`), found before
    /// the built-in ones.
    pub fn add(&mut self, schemes: &[Arc<dyn Scheme>]) {
        self.schemes.splice(0..0, schemes.iter().cloned());
    }

    /// The scheme of `provider`, shared.
    pub fn get_shared(&self, provider: Provider) -> Option<Arc<dyn Scheme>> {
        self.schemes.iter().find(|s| s.provider() == provider).cloned()
    }

    /// The scheme of `provider`.
    pub fn get(&self, provider: Provider) -> Option<&dyn Scheme> {
        self.find(provider.as_str())
    }

    /// The scheme of a route's `{provider}`, looked up without interning the caller's text.
    pub fn find(&self, name: &str) -> Option<&dyn Scheme> {
        self.schemes.iter().find(|s| s.provider().as_str() == name).map(|b| b.as_ref())
    }

    /// Every provider this deployment knows, configured or not.
    pub fn catalog(&self) -> &catalog::Catalog {
        &self.catalog
    }
}

/// Re-checks a stored delivery (`inbox show`): its kept headers and raw bytes
/// against the secrets configured now, a signed timestamp judged as at
/// `received_epoch`, when it arrived.
pub fn verify_stored(
    schemes: &Schemes,
    provider: Provider,
    headers: &serde_json::Value,
    body: &[u8],
    received_epoch: i64,
) -> Result<Verified, Rejected> {
    let scheme = schemes
        .get(provider)
        .ok_or_else(|| Rejected::new(RejectionKind::Unconfigured, "no secret is configured for the provider"))?;
    // A repeated header is kept as an array of its values (rows stored before
    // that hold them joined with ", ": those are also tried split).
    let kept = |split: bool| {
        let mut map = HeaderMap::new();
        for (name, value) in headers.as_object().into_iter().flatten() {
            let Ok(name) = http::HeaderName::from_bytes(name.as_bytes()) else { continue };
            let values: Vec<&str> = match value {
                serde_json::Value::String(s) if split => s.split(", ").collect(),
                serde_json::Value::String(s) => vec![s],
                serde_json::Value::Array(items) => items.iter().filter_map(serde_json::Value::as_str).collect(),
                _ => vec![],
            };
            for value in values.into_iter().filter_map(|v| http::HeaderValue::from_str(v).ok()) {
                map.append(name.clone(), value);
            }
        }
        map
    };
    let verify = |map: &HeaderMap| scheme.verify(&Delivery { headers: map, body, now: received_epoch });
    verify(&kept(false)).or_else(|refused| verify(&kept(true)).map_err(|_| refused))
}

// ---- helpers shared by the schemes ----

/// Every value of a header, as text (values that are not visible ASCII are skipped).
pub(crate) fn header_values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::trim)
}

/// The first non-empty value of a header.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    header_values(headers, name).find(|v| !v.is_empty())
}

/// The index of the first secret whose HMAC over `message` equals any candidate
/// signature, compared in constant time. Empty candidates, and empty keys
/// (which anyone can sign with), never match.
pub(crate) fn first_matching<M>(secrets: &[Secret], message: &[&[u8]], candidates: &[Vec<u8>]) -> Option<usize>
where
    M: Mac + hmac::digest::KeyInit + Clone,
{
    let candidates: Vec<&Vec<u8>> = candidates.iter().filter(|c| !c.is_empty()).collect();
    if candidates.is_empty() {
        return None;
    }
    secrets.iter().position(|secret| {
        if secret.expose().is_empty() {
            return false;
        }
        let mut mac = <M as Mac>::new_from_slice(secret.expose()).expect("HMAC takes keys of any length");
        for part in message {
            mac.update(part);
        }
        candidates.iter().any(|sig| mac.clone().verify_slice(sig).is_ok())
    })
}

/// Candidate signatures signed with the same `K` (a timestamp).
pub(crate) type Group<K> = (K, Vec<Vec<u8>>);

/// The candidate signatures of a delivery's signature header values, at most
/// [`MAX_SIGNATURES`] in all (across values and the items of each), grouped
/// by what each is signed with (its timestamp): one MAC per group and
/// secret. `parse` reads one value; the error is the last value's refusal,
/// when no value gave a candidate.
pub(crate) fn candidate_groups<'a, K: PartialEq>(
    values: impl Iterator<Item = &'a str>,
    mut parse: impl FnMut(&'a str) -> Result<(K, Vec<Vec<u8>>), Rejected>,
) -> Result<Vec<Group<K>>, Option<Rejected>> {
    let mut groups: Vec<Group<K>> = Vec::new();
    let (mut tried, mut reason) = (0, None);
    for value in values.take(MAX_SIGNATURES) {
        match parse(value) {
            Ok((key, mut candidates)) => {
                candidates.truncate(MAX_SIGNATURES - tried);
                tried += candidates.len();
                match groups.iter_mut().find(|(seen, _)| *seen == key) {
                    Some((_, group)) => group.extend(candidates),
                    None => groups.push((key, candidates)),
                }
            }
            Err(r) => reason = Some(r),
        }
        if tried == MAX_SIGNATURES {
            break;
        }
    }
    if groups.is_empty() {
        Err(reason)
    } else {
        Ok(groups)
    }
}

/// `sha256:<hex of body>`: the id of an event whose own id cannot be read.
pub fn body_digest_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

/// A usable event id: non-empty, printable, at most 255 characters.
pub(crate) fn valid_event_id(id: &str) -> bool {
    !id.is_empty() && id.chars().count() <= MAX_EVENT_ID_CHARS && !id.chars().any(char::is_control)
}

/// A body that is JSON, with the top-level fields the schemes read. `unusable`
/// says why the payload cannot be used (nesting too deep, a number out of
/// range, a `\u0000` that `jsonb` refuses, ...): the fields are then read
/// leniently, so the `failed` row keeps the provider's own id.
pub(crate) struct Json<'a> {
    pub text: Cow<'a, str>,
    pub fields: Fields,
    pub unusable: Option<String>,
}

pub(crate) const NUL_REASON: &str = "body contains \\u0000, which PostgreSQL jsonb cannot store";

/// Parses a body as JSON and checks it is usable ([`crate::payload`]), or says why it is not JSON.
pub(crate) fn parse_json(body: &[u8]) -> Result<Json<'_>, String> {
    let text = std::str::from_utf8(body).map_err(|_| "body is not UTF-8".to_string())?;
    parse_json_text(Cow::Borrowed(text))
}

pub(crate) fn parse_json_text(text: Cow<'_, str>) -> Result<Json<'_>, String> {
    match payload::check(&text) {
        Ok(checked) => {
            Ok(Json { fields: checked.fields, unusable: checked.has_nul.then(|| NUL_REASON.to_string()), text })
        }
        Err(unusable) => {
            let fields = payload::lenient_fields(&text)?;
            Ok(Json { text, fields, unusable: Some(unusable.0) })
        }
    }
}

/// The one event of a single-event delivery, or a `failed` row saying why it cannot be used.
pub(crate) fn single_event(
    body: &[u8],
    id: Option<String>,
    event_type: &str,
    json: Result<Json<'_>, String>,
) -> Events {
    Events::Single(event_from(body, id, event_type, json))
}

impl NewEvent {
    /// The event of a verified body, `id` being its id as read from the
    /// signed bytes (or a header): `pending` when the body is JSON that
    /// PostgreSQL's `jsonb` takes and the id is usable (1 to 255 printable
    /// characters), else `failed` with the reason, keyed by the body's digest
    /// when the id is not usable. The constructor for a scheme of your own.
    pub fn from_json(body: &[u8], id: Option<String>, event_type: &str) -> Self {
        event_from(body, id, event_type, parse_json(body))
    }
}

/// An event from its bytes, its id (if one could be read) and its JSON: `pending`
/// when usable, else `failed` with the reason, keyed by the bytes' digest when
/// there is no usable id.
pub(crate) fn event_from(
    body: &[u8],
    id: Option<String>,
    event_type: &str,
    json: Result<Json<'_>, String>,
) -> NewEvent {
    let id = id.filter(|id| valid_event_id(id));
    match (id, json) {
        (id, Ok(Json { unusable: Some(reason), .. })) => {
            NewEvent::unusable(id.unwrap_or_else(|| body_digest_id(body)), event_type, None, reason)
        }
        (Some(id), Ok(json)) => NewEvent::pending(id, event_type, json.text.into_owned()),
        (None, Ok(json)) => NewEvent::unusable(
            body_digest_id(body),
            event_type,
            Some(json.text.into_owned()),
            "no usable event id (missing, empty, over 255 characters or with control characters)",
        ),
        (id, Err(reason)) => NewEvent::unusable(id.unwrap_or_else(|| body_digest_id(body)), event_type, None, reason),
    }
}

/// The HMAC-SHA256 of `message` under `key`, for tests.
#[cfg(test)]
pub(crate) fn test_hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = <hmac::Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
pub(crate) mod test_support {
    use http::{HeaderMap, HeaderName, HeaderValue};

    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    pub(crate) fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::{test_support::*, *};

    /// A scheme given an empty key in code (not through the environment,
    /// which refuses one) matches nothing with it: anyone can compute `HMAC(key = "")`.
    #[test]
    fn an_empty_key_matches_nothing() {
        let empty = [Secret::new(Vec::new())];
        let mac = test_hmac(b"", b"body");
        assert_eq!(first_matching::<hmac::Hmac<Sha256>>(&empty, &[b"body"], &[mac]), None);
    }

    /// Each coded scheme says why, as a kind: no header, a header of the wrong
    /// form, and a well-formed signature under another secret.
    #[test]
    fn the_coded_schemes_refuse_by_kind() {
        let secret = || vec![Secret::new(&b"right"[..])];
        let schemes: Vec<(Box<dyn Scheme>, &str)> = vec![
            (Box::new(stripe::Stripe::new(secret())), "stripe-signature"),
            (Box::new(shopify::Shopify::new(secret())), "x-shopify-hmac-sha256"),
            (Box::new(github::Github::new(secret())), "x-hub-signature-256"),
        ];
        let body = br#"{"id":"evt_1","type":"x"}"#;
        let wrong = |name: &str| -> String {
            let mac = |parts: &[&[u8]]| {
                let mut m = hmac::Hmac::<Sha256>::new_from_slice(b"wrong").unwrap();
                parts.iter().for_each(|p| m.update(p));
                m.finalize().into_bytes().to_vec()
            };
            match name {
                "stripe-signature" => {
                    let t = now().to_string();
                    format!("t={t},v1={}", hex::encode(mac(&[t.as_bytes(), b".", body])))
                }
                "x-shopify-hmac-sha256" => {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.encode(mac(&[body]))
                }
                _ => format!("sha256={}", hex::encode(mac(&[body]))),
            }
        };
        for (scheme, name) in &schemes {
            let kind = |h: &[(&str, &str)]| {
                let h = headers(h);
                scheme.verify(&Delivery { headers: &h, body, now: now() }).unwrap_err().kind()
            };
            assert_eq!(kind(&[]), RejectionKind::Missing, "{name}");
            assert_eq!(kind(&[(name, "%%not a signature%%")]), RejectionKind::Malformed, "{name}");
            assert_eq!(kind(&[(name, &wrong(name))]), RejectionKind::NoMatch, "{name}");
        }
        let standard = standard::Standard::new(secret());
        let h = headers(&[("webhook-id", "msg_1"), ("webhook-timestamp", "1"), ("webhook-signature", "v1,AAAA")]);
        let stale = standard.verify(&Delivery { headers: &h, body, now: now() }).unwrap_err();
        assert_eq!(stale.kind(), RejectionKind::Stale, "{stale}");
    }

    #[test]
    fn event_types_are_cut_at_128_characters_on_a_char_boundary() {
        let long = "é".repeat(200);
        assert_eq!(crate::event::event_type_of(&long).chars().count(), 128);
    }
}
