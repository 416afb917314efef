//! A declared provider's contract as written in a providers file: the TOML
//! shapes, before any check.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One provider's entry in a providers file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Description {
    /// Another provider's contract under this name (its own secret, URL and route).
    pub(crate) alias: Option<String>,
    pub(crate) signature: Option<SignatureDescription>,
    pub(crate) algorithm: Option<String>,
    pub(crate) encoding: Option<String>,
    pub(crate) secret: Option<SecretDescription>,
    pub(crate) signed: Option<String>,
    pub(crate) timestamp: Option<TimestampDescription>,
    pub(crate) event_id: Option<OneOrMany>,
    pub(crate) event_type: Option<OneOrMany>,
    /// A JSON pointer to an array: one event per element.
    pub(crate) batch: Option<String>,
    pub(crate) redelivery_days: Option<u32>,
    pub(crate) challenge: Option<ChallengeDescription>,
    pub(crate) ping: Option<PingDescription>,
}

impl Description {
    /// Whether it says anything about signing (an alias must not).
    pub(crate) fn has_contract(&self) -> bool {
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
pub(crate) struct ChallengeDescription {
    /// A template whose value, equal to `equals`, makes the delivery a handshake.
    pub(crate) when: String,
    pub(crate) equals: String,
    /// The answer as text ...
    pub(crate) respond: Option<String>,
    /// ... or as a JSON object of templates.
    pub(crate) respond_json: Option<BTreeMap<String, String>>,
}

/// A ping the provider sends unsigned before it signs anything (WooCommerce's,
/// on saving a webhook: the form `webhook_id=<id>`), which wants a 200. Only a
/// delivery with no signature header, whose body is a form of exactly these
/// fields, each once and not empty, is one; it is answered and never stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PingDescription {
    pub(crate) form: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignatureDescription {
    pub(crate) header: OneOrMany,
    pub(crate) prefix: Option<String>,
    /// Separator between the items of a key-value list (`,` in `t=1,v1=ab`).
    pub(crate) items: Option<String>,
    /// Separator between a key and its value (`=` by default).
    pub(crate) pairs: Option<String>,
    /// The key of the signature items.
    pub(crate) key: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretDescription {
    /// `utf8` (the default) or `base64`.
    pub(crate) encoding: Option<String>,
    /// Removed before decoding when present (`whsec_`).
    pub(crate) prefix: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TimestampDescription {
    pub(crate) from: String,
    /// `unix` (seconds, the default), `unix-ms` or `rfc3339`.
    pub(crate) format: Option<String>,
    /// Seconds either side of now (required, and not 0).
    pub(crate) tolerance_secs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(super) fn items(&self) -> &[String] {
        match self {
            OneOrMany::One(s) => std::slice::from_ref(s),
            OneOrMany::Many(v) => v,
        }
    }
}
