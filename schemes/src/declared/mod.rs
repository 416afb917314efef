//! Declared providers: a signing contract written as data (`builtin.toml`, or
//! the file `INBOX_PROVIDERS_FILE` names), checked at start-up and verified by
//! one scheme. docs/providers.md documents the format; in short:
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

use std::borrow::Cow;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use serde_json::value::RawValue;
use sha1::Sha1;
use sha2::{Sha256, Sha512};

use super::{
    body_digest_id, candidate_groups, event_from, first_matching, header, header_values, parse_json, parse_json_text,
    Challenged, Delivery, Events, Json, NewEvent, Provider, Rejected, Scheme, Verified, MAX_SIGNATURES,
};
use crate::{payload::storable, secret::Secret};

mod contract;
mod description;
mod pointer;
mod template;
mod time;

pub use contract::{Algorithm, Encoding, Parse, Rules, TimestampRule};
pub(crate) use description::Description;
pub use template::{Part, Source, Template};
pub use time::{format_time, parse_time, TimeFormat};

use contract::Respond;
pub use pointer::json_text;
use pointer::pointer;

/// Rows one batch delivery may make; past it the delivery is kept whole as one failed row.
pub const MAX_BATCH_ITEMS: usize = 1000;
/// Stripe's contract written as data: the coded scheme's twin, judged alike by
/// the differential test and timed against it by `inbox-bench --only verify`
/// (which reads the same file).
#[cfg(test)]
pub const STRIPE_AS_DATA: &str = include_str!("stripe_as_data.toml");

/// The largest body a ping may have: a handful of short fields.
const MAX_PING_BYTES: usize = 1024;

/// A provider whose contract is written as data ([`Rules`]).
pub struct Declared {
    provider: Provider,
    rules: Rules,
    secrets: Vec<Secret>,
    url: Option<String>,
    kept: Vec<String>,
    /// An id or type read from an unsigned header.
    guarded: bool,
}

impl Declared {
    /// `provider`'s scheme under `rules`, verifying with any of `secrets`;
    /// `url` is the public URL the provider was given, where `rules` sign it.
    pub fn new(provider: Provider, rules: Rules, secrets: Vec<Secret>, url: Option<String>) -> Self {
        let kept = rules.kept_headers();
        // A signed timestamp only narrows the window (Linear's is 60 s): the bytes are guarded all the same.
        let guarded = !rules.unsigned_identity().is_empty();
        Declared { provider, rules, secrets, url, kept, guarded }
    }

    /// One value of a signature header: its signed timestamp's text (checked
    /// for age) and its candidate signatures, decoded.
    fn candidates<'a>(&self, value: &'a str, d: &Delivery<'a>) -> Result<(Cow<'a, str>, Vec<Vec<u8>>), Rejected> {
        let r = &self.rules;
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
            None => Cow::Borrowed(""),
            Some(t) => self.timestamp(t, d, &list)?,
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
            return Err(Rejected::malformed(format!(
                "{} holds no {} signature{}",
                r.headers[0],
                encoding_name(r.encoding),
                form_hint(&r.parse)
            )));
        }
        Ok((timestamp, candidates))
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
            other => return Err(Rejected::malformed(format!("{other:?} is no timestamp"))),
        };
        let text = text.ok_or_else(|| Rejected::missing(format!("missing timestamp ({what})")))?;
        let seconds = parse_time(&text, t.format)
            .ok_or_else(|| Rejected::malformed(format!("timestamp ({what}) is not {}", format_name(t.format))))?;
        let tolerance = t.tolerance_secs;
        if d.now.abs_diff(seconds) > tolerance {
            return Err(Rejected::stale(format!("timestamp ({what}) is outside the {tolerance} s tolerance")));
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

pub(super) fn mac<M: hmac::Mac + hmac::digest::KeyInit>(key: &[u8], message: &[Cow<'_, [u8]>]) -> Vec<u8> {
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
        let r = &self.rules;
        // Every value (a repeated header, or DocuSign's one header per key) and every item of its list.
        let values = r.headers.iter().flat_map(|name| header_values(d.headers, name)).filter(|v| !v.is_empty());
        let groups = candidate_groups(values, |value| self.candidates(value, d)).map_err(|reason| {
            reason.unwrap_or_else(|| Rejected::missing(format!("missing {} header", r.headers.join(" or "))))
        })?;
        // The signed bytes are built once (a sorted 1 MiB form is no small thing), the timestamp set per group.
        let message = r.message(d, self.url.as_deref(), "")?;
        for (timestamp, candidates) in &groups {
            let parts: Vec<&[u8]> = message
                .iter()
                .zip(&r.signed.0)
                .map(|(bytes, part)| match part {
                    Part::Source(Source::Timestamp) => timestamp.as_bytes(),
                    _ => bytes.as_ref(),
                })
                .collect();
            let matched = match r.algorithm {
                Algorithm::Sha1 => first_matching::<Hmac<Sha1>>(&self.secrets, &parts, candidates),
                Algorithm::Sha256 => first_matching::<Hmac<Sha256>>(&self.secrets, &parts, candidates),
                Algorithm::Sha512 => first_matching::<Hmac<Sha512>>(&self.secrets, &parts, candidates),
                Algorithm::EcdsaP256Sha256 => ecdsa_matching(&self.secrets, &parts, candidates),
            };
            if let Some(secret_index) = matched {
                return Ok(Verified { secret_index });
            }
        }
        Err(Rejected::no_match(format!("{} does not match a configured secret", r.headers[0])))
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

    fn guards_replays(&self) -> bool {
        self.guarded
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
pub(super) fn form_sorted(body: &[u8]) -> Vec<u8> {
    let mut params: Vec<(String, String)> =
        form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    params.sort();
    params.dedup();
    params.into_iter().flat_map(|(k, v)| [k, v]).collect::<String>().into_bytes()
}

#[cfg(test)]
mod tests;
