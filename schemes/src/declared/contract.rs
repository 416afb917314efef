//! A description checked into the contract a scheme verifies by: every
//! mistake refused at start-up in words a user can act on.

use std::borrow::Cow;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use sha1::Sha1;
use sha2::{Sha256, Sha512};

use super::{
    description::{ChallengeDescription, Description, OneOrMany},
    form_sorted, mac,
    template::{Part, Source, Template},
    time::TimeFormat,
};
use crate::{header, secret::Secret, Delivery, Rejected};

/// What signs (`algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA1 (`hmac-sha1`).
    Sha1,
    /// HMAC-SHA256 (`hmac-sha256`).
    Sha256,
    /// HMAC-SHA512 (`hmac-sha512`).
    Sha512,
    /// A public-key signature (SendGrid): the "secret" is the provider's P-256 public key.
    EcdsaP256Sha256,
}

impl Algorithm {
    /// The HMAC of the parts; `None` for a public-key algorithm, which only the provider can compute.
    pub(super) fn hmac(self, key: &[u8], message: &[Cow<'_, [u8]>]) -> Option<Vec<u8>> {
        Some(match self {
            Algorithm::Sha1 => mac::<Hmac<Sha1>>(key, message),
            Algorithm::Sha256 => mac::<Hmac<Sha256>>(key, message),
            Algorithm::Sha512 => mac::<Hmac<Sha512>>(key, message),
            Algorithm::EcdsaP256Sha256 => return None,
        })
    }
}

/// How the signature is written (`encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal.
    Hex,
    /// Standard base64.
    Base64,
}

/// How the signature header is read (`signature`).
#[derive(Debug, Clone)]
pub enum Parse {
    /// The whole value, after an optional prefix.
    Plain {
        /// Text before the signature (`sha256=`).
        prefix: Option<String>,
    },
    /// `t=1,v1=ab,v1=cd`: every value of `key`.
    List {
        /// What separates the items (`,`).
        items: String,
        /// What separates an item's key from its value (`=`).
        pairs: String,
        /// The key of the signatures (`v1`).
        key: String,
    },
}

/// Where a signed timestamp is and how it is written (`timestamp`).
#[derive(Debug, Clone)]
pub struct TimestampRule {
    /// Where it is read.
    pub from: Source,
    /// How it is written.
    pub format: TimeFormat,
    /// Seconds either side of now.
    pub tolerance_secs: u64,
}

/// A declared provider's whole contract, checked.
#[derive(Debug, Clone)]
pub struct Rules {
    /// As written, for messages; matched case-insensitively.
    pub headers: Vec<String>,
    /// How the signature header is read.
    pub parse: Parse,
    /// What signs.
    pub algorithm: Algorithm,
    /// How the signature is written.
    pub encoding: Encoding,
    /// Whether the secret as configured is base64 of the key.
    pub secret_base64: bool,
    /// A prefix the secret as configured carries, not part of the key (`whsec_`).
    pub secret_prefix: Option<String>,
    /// What is signed.
    pub signed: Template,
    /// The signed timestamp, when there is one.
    pub timestamp: Option<TimestampRule>,
    /// Where the event's id is, the first that has one.
    pub event_id: Vec<Template>,
    /// Where the event's type is, the first that has one.
    pub event_type: Vec<Template>,
    /// A JSON pointer to an array: one event per element.
    pub batch: Option<String>,
    /// A handshake answered and never stored.
    pub challenge: Option<Challenge>,
    /// The form fields of an unsigned ping (`ping.form`).
    pub ping: Option<Vec<String>>,
}

/// A handshake the provider sends to check the endpoint, answered once verified.
#[derive(Debug, Clone)]
pub struct Challenge {
    pub(super) when: Template,
    pub(super) equals: String,
    pub(super) respond: Respond,
}

impl Challenge {
    fn templates(&self) -> Vec<&Template> {
        let mut all = vec![&self.when];
        match &self.respond {
            Respond::Text(t) => all.push(t),
            Respond::Json(fields) => all.extend(fields.iter().map(|(_, t)| t)),
        }
        all
    }
}

#[derive(Debug, Clone)]
pub(super) enum Respond {
    Text(Template),
    Json(Vec<(String, Template)>),
}

impl Rules {
    /// Checks a description (without `alias`), saying what is wrong in words a user can act on.
    pub(crate) fn from_description(d: &Description) -> Result<Rules, String> {
        let sig = d.signature.as_ref().ok_or("signature is missing (signature = { header = \"...\" })")?;
        let headers = sig.header.items().to_vec();
        if headers.is_empty() {
            return Err("signature.header names no header".into());
        }
        for h in &headers {
            http::HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| format!("signature.header: {h:?} is not a header name"))?;
        }
        let parse = match (&sig.items, &sig.key) {
            (Some(items), Some(key)) if !items.is_empty() && !key.is_empty() => {
                if sig.prefix.is_some() {
                    return Err("signature: prefix applies to a plain value, not to a key-value list".into());
                }
                let pairs = sig.pairs.clone().unwrap_or_else(|| "=".into());
                if pairs.is_empty() {
                    return Err("signature.pairs is empty".into());
                }
                Parse::List { items: items.clone(), pairs, key: key.clone() }
            }
            (None, None) if sig.pairs.is_none() => {
                Parse::Plain { prefix: sig.prefix.clone().filter(|p| !p.is_empty()) }
            }
            _ => return Err("signature: a key-value list needs both items (the separator) and key".into()),
        };
        let algorithm = match d.algorithm.as_deref().unwrap_or("sha256") {
            "sha1" => Algorithm::Sha1,
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            "ecdsa-p256-sha256" => Algorithm::EcdsaP256Sha256,
            other => {
                return Err(format!(
                    "algorithm {other:?} is not one of sha1, sha256, sha512 (HMAC) or ecdsa-p256-sha256"
                ))
            }
        };
        let encoding = match d.encoding.as_deref() {
            Some("hex") => Encoding::Hex,
            Some("base64") => Encoding::Base64,
            Some(other) => return Err(format!("encoding {other:?} is neither hex nor base64")),
            None => return Err("encoding is missing (hex or base64)".into()),
        };
        let (secret_base64, secret_prefix) = match &d.secret {
            None => (false, None),
            Some(s) => {
                let base64 = match s.encoding.as_deref().unwrap_or("utf8") {
                    "utf8" => false,
                    "base64" => true,
                    other => return Err(format!("secret.encoding {other:?} is neither utf8 nor base64")),
                };
                (base64, s.prefix.clone().filter(|p| !p.is_empty()))
            }
        };
        let signed = Template::parse(d.signed.as_deref().ok_or("signed is missing (for example \"{body}\")")?)
            .map_err(|e| format!("signed: {e}"))?;
        for s in signed.sources() {
            if matches!(
                s,
                Source::Json(_) | Source::Form(_) | Source::BodyHash | Source::Signature(_) | Source::Hmac(_)
            ) {
                return Err(format!(
                    "signed: {s:?} cannot be signed; use body, url, method, timestamp, header or form-sorted"
                ));
            }
        }
        if !signed.sources().any(|s| matches!(s, Source::Body | Source::FormSorted)) {
            return Err("signed does not cover the body ({body} or {form-sorted}): anyone could change it".into());
        }
        let timestamp = match &d.timestamp {
            None => None,
            Some(t) => {
                let from = match Template::parse(&t.from).map_err(|e| format!("timestamp.from: {e}"))?.0.as_slice() {
                    [Part::Source(s @ (Source::Header(_) | Source::Json(_) | Source::Signature(_)))] => s.clone(),
                    _ => {
                        return Err(
                            "timestamp.from is one of {header:<name>}, {json:<pointer>}, {signature:<key>}".into()
                        )
                    }
                };
                if matches!(from, Source::Signature(_)) && !matches!(parse, Parse::List { .. }) {
                    return Err("timestamp.from {signature:...} needs a key-value list signature".into());
                }
                let format = match t.format.as_deref().unwrap_or("unix") {
                    "unix" => TimeFormat::Unix,
                    "unix-ms" => TimeFormat::UnixMs,
                    "rfc3339" => TimeFormat::Rfc3339,
                    other => return Err(format!("timestamp.format {other:?} is not one of unix, unix-ms, rfc3339")),
                };
                // A signed timestamp whose age nobody checks bounds no replay.
                let tolerance_secs = t.tolerance_secs.filter(|s| *s > 0).ok_or(
                    "timestamp.tolerance_secs is missing: how many seconds either side of now a signed timestamp may be \
                     (300 is usual; what the provider documents, else a little more than its retries take to re-sign)",
                )?;
                Some(TimestampRule { from, format, tolerance_secs })
            }
        };
        if timestamp.is_none() && signed.sources().any(|s| *s == Source::Timestamp) {
            return Err("signed uses {timestamp}, but no timestamp = { from = ... } says where it is".into());
        }
        let templates = |field: &str, v: &Option<OneOrMany>| -> Result<Vec<Template>, String> {
            let mut out = Vec::new();
            for text in v.iter().flat_map(OneOrMany::items) {
                let t = Template::parse(text).map_err(|e| format!("{field}: {e}"))?;
                if let Some(s) = t.sources().find(|s| {
                    matches!(s, Source::Body | Source::Url | Source::Method | Source::Timestamp | Source::FormSorted)
                        || matches!(s, Source::Signature(_) | Source::Hmac(_))
                }) {
                    return Err(format!("{field}: {s:?} cannot be read here; use header, json, form or body-hash"));
                }
                out.push(t);
            }
            Ok(out)
        };
        let event_id = templates("event_id", &d.event_id)?;
        let event_type = templates("event_type", &d.event_type)?;
        if let Some(b) = &d.batch {
            if !(b.is_empty() || b.starts_with('/')) {
                return Err(format!("batch: {b:?} is not a JSON pointer (\"\" for the whole body, or \"/events\")"));
            }
            if event_id.iter().flat_map(Template::sources).any(|s| matches!(s, Source::Header(_) | Source::Form(_))) {
                return Err(
                    "event_id of a batch reads each element ({json:...}, {body-hash}); a header is the same for all"
                        .into(),
                );
            }
        }
        let challenge = match &d.challenge {
            None => None,
            Some(c) => Some(challenge(c)?),
        };
        if algorithm == Algorithm::EcdsaP256Sha256 {
            if d.secret.is_some() {
                return Err("secret: an ECDSA contract's key is the provider's public key, base64 DER or PEM; nothing to say about it".into());
            }
            let mut answer = challenge.iter().flat_map(|c| c.templates()).flat_map(Template::sources);
            if answer.any(|s| matches!(s, Source::Hmac(_))) {
                return Err("challenge: {hmac:...} needs an HMAC contract".into());
            }
        }
        let ping = match &d.ping {
            None => None,
            Some(p) if p.form.is_empty() || p.form.iter().any(String::is_empty) => {
                return Err("ping.form names no field, or an empty one: a ping is a form of these fields".into())
            }
            Some(p) => Some(p.form.clone()),
        };
        Ok(Rules {
            challenge,
            ping,
            headers,
            parse,
            algorithm,
            encoding,
            secret_base64,
            secret_prefix,
            signed,
            timestamp,
            event_id,
            event_type,
            batch: d.batch.clone(),
        })
    }

    /// The headers the event's id or type is read from that the signature does
    /// not cover: what a captured delivery sent again could change.
    pub fn unsigned_identity(&self) -> Vec<String> {
        self.unsigned_in(self.event_id.iter().chain(&self.event_type))
    }

    /// [`Rules::unsigned_identity`], of the event's id alone.
    pub fn unsigned_id(&self) -> Vec<String> {
        self.unsigned_in(self.event_id.iter())
    }

    fn unsigned_in<'t>(&self, templates: impl Iterator<Item = &'t Template>) -> Vec<String> {
        let signed: Vec<String> = self
            .signed
            .sources()
            .filter_map(|s| match s {
                Source::Header(h) => Some(h.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        let mut unsigned: Vec<String> = Vec::new();
        for s in templates.flat_map(Template::sources) {
            if let Source::Header(h) = s {
                if !signed.contains(&h.to_ascii_lowercase()) && !unsigned.iter().any(|u| u.eq_ignore_ascii_case(h)) {
                    unsigned.push(h.clone());
                }
            }
        }
        unsigned
    }

    /// Whether the signed bytes include the public URL (`<NAME>_WEBHOOK_URL`).
    pub fn needs_url(&self) -> bool {
        self.signed.sources().any(|s| *s == Source::Url)
    }

    /// A configured secret as key bytes; the error never shows the secret.
    pub fn decode_secret(&self, s: &str) -> Result<Secret, String> {
        if self.algorithm == Algorithm::EcdsaP256Sha256 {
            use p256::pkcs8::DecodePublicKey;
            let armor: String =
                s.lines().filter(|l| !l.starts_with("-----")).flat_map(|l| l.split_whitespace()).collect();
            return match B64.decode(armor) {
                Ok(der) if p256::ecdsa::VerifyingKey::from_public_key_der(&der).is_ok() => Ok(Secret::new(der)),
                _ => Err("is not a P-256 public key (base64 DER, or PEM)".into()),
            };
        }
        let s = match &self.secret_prefix {
            Some(p) => s.strip_prefix(p.as_str()).unwrap_or(s),
            None => s,
        };
        if s.is_empty() {
            // HMAC takes the empty key too, and anyone can sign with it.
            let after = self.secret_prefix.as_deref().map(|p| format!(" after the {p} prefix")).unwrap_or_default();
            return Err(format!("is empty{after}"));
        }
        if !self.secret_base64 {
            return Ok(Secret::new(s.as_bytes()));
        }
        match B64.decode(s) {
            Ok(key) if !key.is_empty() => Ok(Secret::new(key)),
            _ => Err(format!(
                "is not base64{}",
                self.secret_prefix.as_deref().map(|p| format!(" (after an optional {p} prefix)")).unwrap_or_default()
            )),
        }
    }

    /// The bytes the provider signs, in order.
    pub(super) fn message<'a>(
        &self,
        d: &Delivery<'a>,
        url: Option<&'a str>,
        timestamp: &'a str,
    ) -> Result<Vec<Cow<'a, [u8]>>, Rejected> {
        let mut message = Vec::with_capacity(self.signed.0.len());
        for part in &self.signed.0 {
            message.push(match part {
                Part::Literal(l) => Cow::Owned(l.as_bytes().to_vec()),
                Part::Source(Source::Body) => Cow::Borrowed(d.body),
                Part::Source(Source::Url) => Cow::Borrowed(url.unwrap_or_default().as_bytes()),
                Part::Source(Source::Method) => Cow::Borrowed(&b"POST"[..]),
                Part::Source(Source::Timestamp) => Cow::Borrowed(timestamp.as_bytes()),
                Part::Source(Source::FormSorted) => Cow::Owned(form_sorted(d.body)),
                Part::Source(Source::Header(h)) => match header(d.headers, h) {
                    Some(v) => Cow::Borrowed(v.as_bytes()),
                    None => return Err(Rejected::missing(format!("missing {h} header (it is signed)"))),
                },
                // Refused at start-up; should one get here, it verifies nothing.
                Part::Source(other) => return Err(Rejected::malformed(format!("{other:?} cannot be signed"))),
            });
        }
        Ok(message)
    }

    /// Signs a delivery as the provider does: the signature header's value.
    /// `timestamp` is the text the provider puts where `timestamp.from` reads
    /// it (the caller sets the header or body field; a `{signature:...}`
    /// timestamp is written here). For tests, and to show a user what to send.
    pub fn sign(
        &self,
        key: &[u8],
        d: &Delivery<'_>,
        url: Option<&str>,
        timestamp: Option<&str>,
    ) -> Result<String, Rejected> {
        let message = self.message(d, url, timestamp.unwrap_or_default())?;
        let mac = self.algorithm.hmac(key, &message).ok_or_else(|| {
            Rejected::malformed("an ECDSA contract is signed with the provider's private key, not here")
        })?;
        let sig = match self.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => B64.encode(mac),
        };
        Ok(match &self.parse {
            Parse::Plain { prefix } => format!("{}{sig}", prefix.as_deref().unwrap_or_default()),
            Parse::List { items, pairs, key } => match (&self.timestamp, timestamp) {
                (Some(TimestampRule { from: Source::Signature(t), .. }), Some(ts)) => {
                    format!("{t}{pairs}{ts}{items}{key}{pairs}{sig}")
                }
                _ => format!("{key}{pairs}{sig}"),
            },
        })
    }

    /// Lower-case names of the headers this contract reads, kept with each row.
    pub(super) fn kept_headers(&self) -> Vec<String> {
        let mut names: Vec<String> = self.headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        let read =
            self.signed.sources().chain(self.event_id.iter().chain(&self.event_type).flat_map(Template::sources));
        let read = read.chain(self.timestamp.as_ref().map(|t| &t.from));
        for s in read {
            if let Source::Header(h) = s {
                names.push(h.to_ascii_lowercase());
            }
        }
        names.push("content-type".into());
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }
}

fn challenge(c: &ChallengeDescription) -> Result<Challenge, String> {
    let template = |field: &str, text: &str, hmac: bool| -> Result<Template, String> {
        let t = Template::parse(text).map_err(|e| format!("challenge.{field}: {e}"))?;
        let readable = |s: &Source| match s {
            Source::Header(_) | Source::Json(_) | Source::Form(_) => true,
            Source::Hmac(_) => hmac,
            _ => false,
        };
        let unreadable = t.sources().find(|s| !readable(s));
        if let Some(s) = unreadable {
            return Err(format!(
                "challenge.{field}: {s:?} cannot be read here; use header, json, form (or hmac in an answer)"
            ));
        }
        Ok(t)
    };
    let respond = match (&c.respond, &c.respond_json) {
        (Some(text), None) => Respond::Text(template("respond", text, true)?),
        (None, Some(fields)) => Respond::Json(
            fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), template(&format!("respond_json.{k}"), v, true)?)))
                .collect::<Result<_, String>>()?,
        ),
        _ => return Err("challenge needs respond (text) or respond_json (an object), one of them".into()),
    };
    Ok(Challenge { when: template("when", &c.when, false)?, equals: c.equals.clone(), respond })
}
