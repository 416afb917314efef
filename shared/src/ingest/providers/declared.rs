//! Declared providers: a signing contract written as data (`builtin.toml`, or
//! the file `INBOX_PROVIDERS_FILE` names), checked at start-up and verified by
//! one scheme. README "Providers" documents the format; in short:
//!
//! ```toml
//! [acme]
//! signature = { header = "X-Acme-Signature", prefix = "sha256=" }   # or items/pairs/key for `t=..,v1=..` lists
//! algorithm = "sha256"                  # sha1, sha256, sha512
//! encoding = "hex"                      # hex, base64
//! signed = "{timestamp}.{body}"         # literals and {body} {url} {method} {timestamp} {header:X} {form-sorted}
//! timestamp = { from = "{header:X-Acme-Timestamp}", format = "unix", tolerance_secs = 300 }
//! event_id = ["{header:X-Acme-Delivery}", "{json:/id}"]   # first that exists; else the body's digest
//! event_type = "{json:/type}"
//! redelivery_days = 3
//! challenge = { when = "{json:/type}", equals = "url_verification", respond = "{json:/challenge}" }
//! ping = { form = ["webhook_id"] }      # an unsigned ping of exactly these form fields: 200, not stored
//! ```

use std::{borrow::Cow, collections::BTreeMap};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha1::Sha1;
use sha2::{Sha256, Sha512};

use super::{
    body_digest_id, event_from, first_matching, header, header_values, parse_json, parse_json_text, Challenged,
    Delivery, Events, Json, NewEvent, Provider, Rejected, Scheme, Verified,
};
use crate::core::{payload::storable, secret::Secret};

/// Rows one batch delivery may make; past it the delivery is kept whole as one failed row.
pub const MAX_BATCH_ITEMS: usize = 1000;
/// Stripe's contract written as data: the coded scheme's twin, judged alike by
/// the differential test and timed against it by `inbox bench --only verify`.
pub const STRIPE_AS_DATA: &str = r#"signature = { header = "Stripe-Signature", items = ",", key = "v1" }
encoding = "hex"
signed = "{timestamp}.{body}"
timestamp = { from = "{signature:t}", tolerance_secs = 300 }
event_id = "{json:/id}"
event_type = "{json:/type}"
"#;

/// Signatures tried per delivery (across header values and list items): a
/// sender rotating keys sends two or three; a stranger's thousands cost no more.
pub const MAX_SIGNATURES: usize = 16;

// ---- the description, as written ----

/// One provider's entry in a providers file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// Another provider's contract under this name (its own secret, URL and route).
    pub alias: Option<String>,
    pub signature: Option<SignatureDescription>,
    pub algorithm: Option<String>,
    pub encoding: Option<String>,
    pub secret: Option<SecretDescription>,
    pub signed: Option<String>,
    pub timestamp: Option<TimestampDescription>,
    pub event_id: Option<OneOrMany>,
    pub event_type: Option<OneOrMany>,
    /// A JSON pointer to an array: one event per element.
    pub batch: Option<String>,
    pub redelivery_days: Option<u32>,
    pub challenge: Option<ChallengeDescription>,
    pub ping: Option<PingDescription>,
}

impl Description {
    /// Whether it says anything about signing (an alias must not).
    pub fn has_contract(&self) -> bool {
        let Description {
            alias: _,
            redelivery_days: _,
            signature,
            algorithm,
            encoding,
            secret,
            signed,
            timestamp,
            event_id,
            event_type,
            batch,
            challenge,
            ping,
        } = self;
        signature.is_some()
            || algorithm.is_some()
            || encoding.is_some()
            || secret.is_some()
            || signed.is_some()
            || timestamp.is_some()
            || event_id.is_some()
            || event_type.is_some()
            || batch.is_some()
            || challenge.is_some()
            || ping.is_some()
    }
}

/// A handshake the provider sends to check the endpoint (Slack's
/// `url_verification`, Twitch's `webhook_callback_verification`, Zoom's
/// `endpoint.url_validation`): once verified, it is answered and never stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeDescription {
    /// A template whose value, equal to `equals`, makes the delivery a handshake.
    pub when: String,
    pub equals: String,
    /// The answer as text ...
    pub respond: Option<String>,
    /// ... or as a JSON object of templates.
    pub respond_json: Option<BTreeMap<String, String>>,
}

/// A ping the provider sends unsigned before it signs anything (WooCommerce's,
/// on saving a webhook: the form `webhook_id=<id>`), which wants a 200. Only a
/// delivery with no signature header, whose body is a form of exactly these
/// fields, each once and not empty, is one; it is answered and never stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PingDescription {
    pub form: Vec<String>,
}

/// The largest body a ping may have: a handful of short fields.
const MAX_PING_BYTES: usize = 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureDescription {
    pub header: OneOrMany,
    pub prefix: Option<String>,
    /// Separator between the items of a key-value list (`,` in `t=1,v1=ab`).
    pub items: Option<String>,
    /// Separator between a key and its value (`=` by default).
    pub pairs: Option<String>,
    /// The key of the signature items.
    pub key: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretDescription {
    /// `utf8` (the default) or `base64`.
    pub encoding: Option<String>,
    /// Removed before decoding when present (`whsec_`).
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimestampDescription {
    pub from: String,
    /// `unix` (seconds, the default), `unix-ms` or `rfc3339`.
    pub format: Option<String>,
    /// Seconds either side of now; none: the timestamp is signed but its age is not checked.
    pub tolerance_secs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn items(&self) -> &[String] {
        match self {
            OneOrMany::One(s) => std::slice::from_ref(s),
            OneOrMany::Many(v) => v,
        }
    }
}

// ---- the contract, checked ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha1,
    Sha256,
    Sha512,
    /// A public-key signature (SendGrid): the "secret" is the provider's P-256 public key.
    EcdsaP256Sha256,
}

impl Algorithm {
    /// The HMAC of the parts; `None` for a public-key algorithm, which only the provider can compute.
    fn hmac(self, key: &[u8], message: &[Cow<'_, [u8]>]) -> Option<Vec<u8>> {
        Some(match self {
            Algorithm::Sha1 => mac::<Hmac<Sha1>>(key, message),
            Algorithm::Sha256 => mac::<Hmac<Sha256>>(key, message),
            Algorithm::Sha512 => mac::<Hmac<Sha512>>(key, message),
            Algorithm::EcdsaP256Sha256 => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    Unix,
    UnixMs,
    Rfc3339,
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Body,
    /// `<NAME>_WEBHOOK_URL`: the public URL the provider was given.
    Url,
    Method,
    Timestamp,
    /// Form parameters sorted by name, each as name then value (Twilio).
    FormSorted,
    BodyHash,
    Header(String),
    Json(String),
    Form(String),
    /// An item of the signature header's key-value list.
    Signature(String),
    /// Hex HMAC, with the secret that verified the delivery, of the body's value at a pointer (Zoom's handshake).
    Hmac(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Literal(String),
    Source(Source),
}

/// Literals and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub Vec<Part>);

impl Template {
    /// `a{body}b`, with `{{` and `}}` for literal braces.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let (mut name, mut closed) = (String::new(), false);
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(format!("{text:?}: a '{{' is not closed"));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Source(Source::parse(&name)?));
                }
                '}' => return Err(format!("{text:?}: a '}}' has no '{{' (write '}}}}' for a literal one)")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template(parts))
    }

    fn sources(&self) -> impl Iterator<Item = &Source> {
        self.0.iter().filter_map(|p| match p {
            Part::Source(s) => Some(s),
            Part::Literal(_) => None,
        })
    }
}

impl Source {
    fn parse(name: &str) -> Result<Source, String> {
        let (kind, arg) = match name.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (name, None),
        };
        let need = |what: &str| -> Result<String, String> {
            match arg {
                Some(a) if !a.is_empty() => Ok(a.to_string()),
                _ => Err(format!("{{{kind}}} needs {what}: {{{kind}:...}}")),
            }
        };
        let plain = |s: Source| if arg.is_some() { Err(format!("{{{kind}}} takes no argument")) } else { Ok(s) };
        match kind {
            "body" => plain(Source::Body),
            "url" => plain(Source::Url),
            "method" => plain(Source::Method),
            "timestamp" => plain(Source::Timestamp),
            "form-sorted" => plain(Source::FormSorted),
            "body-hash" => plain(Source::BodyHash),
            "header" => {
                let h = need("a header name")?;
                http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| format!("{h:?} is not a header name"))?;
                Ok(Source::Header(h))
            }
            "json" => {
                let p = arg.unwrap_or_default();
                if !(p.is_empty() || p.starts_with('/')) {
                    return Err(format!("{{json:{p}}}: a JSON pointer starts with '/' (RFC 6901)"));
                }
                Ok(Source::Json(p.to_string()))
            }
            "form" => need("a form field name").map(Source::Form),
            "signature" => need("a key of the signature header's list").map(Source::Signature),
            "hmac" => match arg {
                Some(p) if p.starts_with('/') => Ok(Source::Hmac(p.to_string())),
                _ => Err("{hmac:<pointer>} needs a JSON pointer: {hmac:/payload/plainToken}".into()),
            },
            other => Err(format!(
                "unknown placeholder {{{other}}} (known: body, url, method, timestamp, form-sorted, body-hash, header:<name>, json:<pointer>, form:<field>, signature:<key>, hmac:<pointer>)"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Parse {
    /// The whole value, after an optional prefix.
    Plain { prefix: Option<String> },
    /// `t=1,v1=ab,v1=cd`: every value of `key`.
    List { items: String, pairs: String, key: String },
}

#[derive(Debug, Clone)]
pub struct TimestampRule {
    pub from: Source,
    pub format: TimeFormat,
    pub tolerance_secs: Option<u64>,
}

/// A declared provider's whole contract, checked.
#[derive(Debug, Clone)]
pub struct Rules {
    /// As written, for messages; matched case-insensitively.
    pub headers: Vec<String>,
    pub parse: Parse,
    pub algorithm: Algorithm,
    pub encoding: Encoding,
    pub secret_base64: bool,
    pub secret_prefix: Option<String>,
    pub signed: Template,
    pub timestamp: Option<TimestampRule>,
    pub event_id: Vec<Template>,
    pub event_type: Vec<Template>,
    pub batch: Option<String>,
    pub challenge: Option<Challenge>,
    /// The form fields of an unsigned ping (`ping.form`).
    pub ping: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct Challenge {
    when: Template,
    equals: String,
    respond: Respond,
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
enum Respond {
    Text(Template),
    Json(Vec<(String, Template)>),
}

impl Rules {
    /// Checks a description (without `alias`), saying what is wrong in words a user can act on.
    pub fn from_description(d: &Description) -> Result<Rules, String> {
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
                Some(TimestampRule { from, format, tolerance_secs: t.tolerance_secs })
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
    fn message<'a>(
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
                    None => return Err(Rejected::new(format!("missing {h} header (it is signed)"))),
                },
                // Refused at start-up; should one get here, it verifies nothing.
                Part::Source(other) => return Err(Rejected::new(format!("{other:?} cannot be signed"))),
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
        let mac = self
            .algorithm
            .hmac(key, &message)
            .ok_or_else(|| Rejected::new("an ECDSA contract is signed with the provider's private key, not here"))?;
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
    fn kept_headers(&self) -> Vec<String> {
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

// ---- the scheme ----

pub struct Declared {
    provider: Provider,
    rules: Rules,
    secrets: Vec<Secret>,
    url: Option<String>,
    kept: Vec<String>,
}

impl Declared {
    pub fn new(provider: Provider, rules: Rules, secrets: Vec<Secret>, url: Option<String>) -> Self {
        let kept = rules.kept_headers();
        Declared { provider, rules, secrets, url, kept }
    }

    /// One value of a signature header: its candidate signatures and its list items.
    fn verify_value<'a>(&self, value: &'a str, d: &Delivery<'a>) -> Result<Verified, Rejected> {
        let r = &self.rules;
        let name = &r.headers[0];
        let (raw, list): (Vec<&str>, Vec<(&str, &str)>) = match &r.parse {
            Parse::Plain { prefix: Some(p) } => (value.strip_prefix(p.as_str()).into_iter().collect(), vec![]),
            Parse::Plain { prefix: None } => (vec![value], vec![]),
            Parse::List { items, pairs, key } => {
                let list: Vec<(&str, &str)> = value
                    .split(items.as_str())
                    .filter_map(|item| item.trim().split_once(pairs.as_str()))
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .collect();
                (list.iter().filter(|(k, _)| k == key).map(|(_, v)| *v).collect(), list)
            }
        };
        // The timestamp first, as the providers' own verifiers do: a stale delivery is told so.
        let timestamp = match &r.timestamp {
            None => None,
            Some(t) => Some(self.timestamp(t, d, &list)?),
        };
        let candidates: Vec<Vec<u8>> = raw
            .iter()
            .filter_map(|s| match r.encoding {
                Encoding::Hex => hex::decode(s).ok(),
                Encoding::Base64 => B64.decode(s).ok(),
            })
            .filter(|c| !c.is_empty())
            .take(MAX_SIGNATURES)
            .collect();
        if candidates.is_empty() {
            return Err(Rejected::new(format!(
                "{name} holds no {} signature{}",
                encoding_name(r.encoding),
                form_hint(&r.parse)
            )));
        }
        let message = r.message(d, self.url.as_deref(), timestamp.as_deref().unwrap_or_default())?;
        let message: Vec<&[u8]> = message.iter().map(|m| m.as_ref()).collect();
        let matched = match r.algorithm {
            Algorithm::Sha1 => first_matching::<Hmac<Sha1>>(&self.secrets, &message, &candidates),
            Algorithm::Sha256 => first_matching::<Hmac<Sha256>>(&self.secrets, &message, &candidates),
            Algorithm::Sha512 => first_matching::<Hmac<Sha512>>(&self.secrets, &message, &candidates),
            Algorithm::EcdsaP256Sha256 => ecdsa_matching(&self.secrets, &message, &candidates),
        };
        matched
            .map(|secret_index| Verified { secret_index })
            .ok_or_else(|| Rejected::new(format!("{name} does not match a configured secret")))
    }

    /// The timestamp's text as sent (what is signed), once its age is checked.
    fn timestamp<'a>(
        &self,
        t: &TimestampRule,
        d: &Delivery<'a>,
        list: &[(&'a str, &'a str)],
    ) -> Result<Cow<'a, str>, Rejected> {
        let (text, what): (Option<Cow<'a, str>>, String) = match &t.from {
            Source::Header(h) => (header(d.headers, h).map(Cow::Borrowed), format!("{h} header")),
            Source::Signature(k) => (
                list.iter().find(|(key, _)| key == k).map(|(_, v)| Cow::Borrowed(*v)),
                format!("{k}= in {}", self.rules.headers[0]),
            ),
            Source::Json(p) => (json_text(d.body, p).map(Cow::Owned), format!("{p} in the body")),
            other => return Err(Rejected::new(format!("{other:?} is no timestamp"))),
        };
        let text = text.ok_or_else(|| Rejected::new(format!("missing timestamp ({what})")))?;
        let seconds = parse_time(&text, t.format)
            .ok_or_else(|| Rejected::new(format!("timestamp ({what}) is not {}", format_name(t.format))))?;
        if let Some(tolerance) = t.tolerance_secs {
            if d.now.abs_diff(seconds) > tolerance {
                return Err(Rejected::stale(format!("timestamp ({what}) is outside the {tolerance} s tolerance")));
            }
        }
        Ok(text)
    }
}

/// The index of the first public key (DER) under which any candidate (a DER
/// signature, high or low S) verifies the message.
fn ecdsa_matching(keys: &[Secret], message: &[&[u8]], candidates: &[Vec<u8>]) -> Option<usize> {
    use p256::ecdsa::{signature::Verifier, Signature, VerifyingKey};
    use p256::pkcs8::DecodePublicKey;
    let message = message.concat();
    let signatures: Vec<Signature> =
        candidates.iter().filter_map(|c| Signature::from_der(c).ok()).map(|s| s.normalize_s().unwrap_or(s)).collect();
    keys.iter().position(|k| {
        VerifyingKey::from_public_key_der(k.expose())
            .is_ok_and(|key| signatures.iter().any(|s| key.verify(&message, s).is_ok()))
    })
}

fn mac<M: hmac::Mac + hmac::digest::KeyInit>(key: &[u8], message: &[Cow<'_, [u8]>]) -> Vec<u8> {
    let mut mac = <M as hmac::Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in message {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn encoding_name(e: Encoding) -> &'static str {
    match e {
        Encoding::Hex => "hex",
        Encoding::Base64 => "base64",
    }
}

fn format_name(f: TimeFormat) -> &'static str {
    match f {
        TimeFormat::Unix => "Unix seconds",
        TimeFormat::UnixMs => "Unix milliseconds",
        TimeFormat::Rfc3339 => "an RFC 3339 date-time",
    }
}

fn form_hint(p: &Parse) -> String {
    match p {
        Parse::Plain { prefix: Some(prefix) } => format!(" (expected {prefix}<signature>)"),
        Parse::Plain { prefix: None } => String::new(),
        Parse::List { key, pairs, .. } => format!(" (expected {key}{pairs}<signature>)"),
    }
}

impl Scheme for Declared {
    fn provider(&self) -> Provider {
        self.provider
    }

    fn verify(&self, d: &Delivery<'_>) -> Result<Verified, Rejected> {
        let mut reason = None;
        // Each value on its own (a repeated header, or DocuSign's one header per key): any that verifies is enough.
        let values = self.rules.headers.iter().flat_map(|name| header_values(d.headers, name));
        for value in values.filter(|v| !v.is_empty()).take(MAX_SIGNATURES) {
            match self.verify_value(value, d) {
                Ok(v) => return Ok(v),
                Err(r) => reason = Some(r),
            }
        }
        Err(reason.unwrap_or_else(|| Rejected::new(format!("missing {} header", self.rules.headers.join(" or ")))))
    }

    fn events(&self, d: &Delivery<'_>) -> Events {
        let form = is_form(d);
        let json = if form { form_json(d.body) } else { parse_json(d.body) };
        let batch = match &self.rules.batch {
            Some(pointer) if !form => pointer,
            _ => {
                let text = json.as_ref().ok().map(|j| j.text.as_ref());
                let id = self.first(&self.rules.event_id, d, text, d.body).unwrap_or_else(|| body_digest_id(d.body));
                let kind = self.first(&self.rules.event_type, d, text, d.body).unwrap_or_else(|| "unknown".into());
                return Events::Single(event_from(d.body, Some(id), &kind, json));
            }
        };
        let whole = |reason: String| {
            let payload = std::str::from_utf8(d.body).ok().filter(|t| storable(t)).map(str::to_string);
            Events::Batch(vec![NewEvent::unusable(body_digest_id(d.body), "unknown", payload, reason)])
        };
        // Elements are checked one by one, so one bad element does not sink the batch.
        let items = std::str::from_utf8(d.body)
            .ok()
            .and_then(|text| pointer(text, batch))
            .and_then(|raw| serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok());
        let Some(items) = items else {
            return whole(match json {
                Err(reason) | Ok(Json { unusable: Some(reason), .. }) => reason,
                Ok(_) => format!("body has no array at {batch:?}"),
            });
        };
        if items.len() > MAX_BATCH_ITEMS {
            return whole(format!(
                "{} events in one delivery, over the limit of {MAX_BATCH_ITEMS}; kept whole",
                items.len()
            ));
        }
        Events::Batch(
            items
                .into_iter()
                .map(|item| {
                    let bytes = item.get().as_bytes();
                    let id = self.first(&self.rules.event_id, d, Some(item.get()), bytes);
                    let kind = self.first(&self.rules.event_type, d, Some(item.get()), bytes);
                    let id = id.unwrap_or_else(|| body_digest_id(bytes));
                    event_from(
                        bytes,
                        Some(id),
                        kind.as_deref().unwrap_or("unknown"),
                        parse_json_text(Cow::Borrowed(item.get())),
                    )
                })
                .collect(),
        )
    }

    fn kept_headers(&self) -> Cow<'_, [&str]> {
        Cow::Owned(self.kept.iter().map(String::as_str).collect())
    }

    fn ping(&self, d: &Delivery<'_>) -> Option<Challenged> {
        let fields = self.rules.ping.as_ref()?;
        if d.body.len() > MAX_PING_BYTES || self.rules.headers.iter().any(|h| d.headers.contains_key(h.as_str())) {
            return None;
        }
        let mut seen: Vec<Cow<'_, str>> = Vec::with_capacity(fields.len());
        for (name, value) in form_urlencoded::parse(d.body) {
            if value.is_empty() || !fields.iter().any(|f| *f == name) || seen.contains(&name) {
                return None;
            }
            seen.push(name);
        }
        (seen.len() == fields.len())
            .then(|| Challenged { content_type: "application/json", body: r#"{"status":"ping"}"#.into() })
    }

    fn challenge(&self, d: &Delivery<'_>, verified: Verified) -> Option<Challenged> {
        let c = self.rules.challenge.as_ref()?;
        let body = std::str::from_utf8(d.body).ok();
        let secret = self.secrets.get(verified.secret_index);
        let render = |t: &Template| self.render(t, d, body, d.body, secret);
        if render(&c.when)? != c.equals {
            return None;
        }
        Some(match &c.respond {
            Respond::Text(t) => Challenged { content_type: "text/plain", body: render(t)? },
            Respond::Json(fields) => {
                let mut object = serde_json::Map::new();
                for (k, t) in fields {
                    object.insert(k.clone(), render(t)?.into());
                }
                Challenged { content_type: "application/json", body: serde_json::Value::Object(object).to_string() }
            }
        })
    }
}

impl Declared {
    /// The first template whose every placeholder has a value. `json` is the
    /// JSON the pointers read (the body, a form body's fields, or a batch's
    /// element), `bytes` what `{body-hash}` digests.
    fn first(&self, templates: &[Template], d: &Delivery<'_>, json: Option<&str>, bytes: &[u8]) -> Option<String> {
        templates.iter().find_map(|t| self.render(t, d, json, bytes, None))
    }

    /// A template's value, when every placeholder has one; `secret` is the one
    /// that verified the delivery (for `{hmac:...}`).
    fn render(
        &self,
        t: &Template,
        d: &Delivery<'_>,
        json: Option<&str>,
        bytes: &[u8],
        secret: Option<&Secret>,
    ) -> Option<String> {
        let mut out = String::new();
        for part in &t.0 {
            match part {
                Part::Literal(l) => out.push_str(l),
                Part::Source(Source::Header(h)) => out.push_str(header(d.headers, h)?),
                Part::Source(Source::Json(p)) => out.push_str(&json_text(json?.as_bytes(), p)?),
                Part::Source(Source::Form(f)) if is_form(d) => {
                    let (_, v) = form_urlencoded::parse(d.body).find(|(k, v)| k == f.as_str() && !v.is_empty())?;
                    out.push_str(&v);
                }
                Part::Source(Source::Form(_)) => return None,
                Part::Source(Source::BodyHash) => out.push_str(&body_digest_id(bytes)),
                Part::Source(Source::Hmac(p)) => {
                    let value = json_text(json?.as_bytes(), p)?;
                    let message = [Cow::Borrowed(value.as_bytes())];
                    out.push_str(&hex::encode(self.rules.algorithm.hmac(secret?.expose(), &message)?));
                }
                // Refused at start-up; should one get here, the template has no value.
                Part::Source(_) => return None,
            }
        }
        Some(out)
    }
}

fn is_form(d: &Delivery<'_>) -> bool {
    header(d.headers, "content-type")
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"))
}

/// A form body as a JSON object of its fields (a repeated field becomes a list), the payload handlers see.
fn form_json(body: &[u8]) -> Result<Json<'static>, String> {
    let mut fields: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(body) {
        let v = serde_json::Value::String(v.into_owned());
        match fields.get_mut(k.as_ref()) {
            Some(serde_json::Value::Array(list)) => list.push(v),
            Some(first) => *first = serde_json::Value::Array(vec![first.take(), v]),
            None => {
                fields.insert(k.into_owned(), v);
            }
        }
    }
    parse_json_text(Cow::Owned(serde_json::Value::Object(fields).to_string()))
}

/// Twilio's signed form: parameters sorted by name (then value), each as name followed by value.
fn form_sorted(body: &[u8]) -> Vec<u8> {
    let mut params: Vec<(String, String)> =
        form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    params.sort();
    params.dedup();
    params.into_iter().flat_map(|(k, v)| [k, v]).collect::<String>().into_bytes()
}

/// The value at an RFC 6901 pointer, read without building the tree: each
/// step reads one member (the last of repeated keys, as `jsonb` keeps) or one
/// element, and skips the rest.
fn pointer<'a>(text: &'a str, pointer: &str) -> Option<&'a RawValue> {
    if pointer.is_empty() {
        return serde_json::from_str(text).ok();
    }
    let mut here = text;
    let mut value = None;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let mut de = serde_json::Deserializer::from_str(here);
        let found: &RawValue = match here.trim_start().as_bytes().first()? {
            b'{' => Member(&token).deserialize(&mut de).ok()??,
            b'[' => {
                let i: usize = token.parse().ok().filter(|_| token == "0" || !token.starts_with('0'))?;
                Element(i).deserialize(&mut de).ok()??
            }
            _ => return None,
        };
        de.end().ok()?;
        here = found.get();
        value = Some(found);
    }
    value
}

/// An object's member by key, its other values skipped.
struct Member<'k>(&'k str);

/// An array's element by index, the others skipped.
struct Element(usize);

/// A key, borrowed from the text unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(Key(key)) = map.next_key()? {
            if key == self.0 {
                found = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

impl<'de> DeserializeSeed<'de> for Element {
    type Value = Option<&'de RawValue>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Element {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        for i in 0.. {
            if i == self.0 {
                found = seq.next_element()?;
                if found.is_none() {
                    break;
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
        }
        Ok(found)
    }
}

/// A string's value or a number's (or boolean's) digits at a pointer; nothing for null, objects, arrays and "".
fn json_text(body: &[u8], p: &str) -> Option<String> {
    let raw = pointer(std::str::from_utf8(body).ok()?, p)?.get().trim();
    let text = match raw.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(raw).ok()?,
        b'{' | b'[' | b'n' => return None,
        _ => raw.to_string(),
    };
    (!text.is_empty()).then_some(text)
}

/// Unix seconds from a timestamp's text.
pub fn parse_time(text: &str, format: TimeFormat) -> Option<i64> {
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() && s.len() <= 18;
    match format {
        TimeFormat::Unix => digits(text).then(|| text.parse().ok()).flatten(),
        TimeFormat::UnixMs => digits(text).then(|| text.parse::<i64>().ok().map(|ms| ms / 1000)).flatten(),
        TimeFormat::Rfc3339 => rfc3339(text),
    }
}

/// `2021-07-25T10:00:00Z`, `2023-01-01T00:00:00.123456789+01:00`: Unix seconds.
fn rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let (h, m) = (rest[1..3].parse::<i64>().ok()?, rest[4..6].parse::<i64>().ok()?);
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

#[cfg(test)]
#[path = "declared_tests.rs"]
mod tests;
