//! Prune's archive, and restore from it.
//!
//! With `INBOX_ARCHIVE_S3_BUCKET` (and `INBOX_ARCHIVE_S3_PREFIX`), prune locks
//! each batch of inbox rows it is about to delete, writes each provider's and
//! day's share of it to S3 as one gzip-compressed JSON Lines object (every
//! column; the raw bytes base64), and deletes the rows of an object only once
//! S3 has stored it, in the transaction that locked them: a failed upload
//! deletes nothing, and the pass fails visibly. Objects are named
//! `<prefix><provider>/<YYYY-MM-DD>/<unix ms>-<8 hex>-<events>.jsonl.gz`, the
//! day the events were received (UTC), so a provider's month is one key prefix.
//!
//! [`restore`] reads objects (an `s3://bucket/prefix`, a file or a folder) back
//! into a database as they were, marked restored (prune keeps them their
//! retention from then), keys already stored skipped; `inbox requeue` then
//! runs them through today's handlers.

use std::{
    collections::{BTreeMap, HashSet},
    io::Write,
};

use aws_sdk_s3::primitives::ByteStream;
use flate2::{write::GzEncoder, Compression};
use sha2::{Digest, Sha256};

use crate::core::aws::ArchiveConfig;

pub use crate::db::inbox::ArchivedEvent;
pub use restore::{restore, Location, RestoreOptions, Restored};

mod check;
mod restore;

/// The newest line format this inbox writes and reads.
pub const FORMAT: i32 = 1;

/// Something the archive could not do.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// S3 refused or could not be reached.
    #[error("S3: {0}")]
    S3(String),
    /// A local file or folder could not be read.
    #[error("{path}: {why}")]
    File {
        /// The path.
        path: String,
        /// Why (said with the path, not as a cause of its own: a chain would say it twice).
        why: std::io::Error,
    },
    /// The database.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

fn s3_error<E: std::error::Error>(e: E) -> ArchiveError {
    // The SDK's Display is terse ("service error"); its source chain says what happened.
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    ArchiveError::S3(text)
}

/// The archive's bucket, under its prefix.
#[derive(Clone, Debug)]
pub struct Archive {
    s3: aws_sdk_s3::Client,
    config: ArchiveConfig,
}

/// What storing a batch did.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// The rows of the objects stored: delete these.
    pub rows: Vec<(String, String)>,
    pub objects: u64,
    /// Rows whose object could not be stored, and why (the first failure).
    pub failed: u64,
    pub error: Option<String>,
}

/// One archive object, as [`Archive::list`] finds it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveObject {
    /// Its key (the prefix included).
    pub key: String,
    /// The provider of its events, read off the key.
    pub provider: String,
    /// The day (UTC) its events were received, read off the key.
    pub day: String,
    /// Events in it, read off the key (none for a key not named by prune).
    pub events: Option<u64>,
    /// Compressed size.
    pub bytes: i64,
}

/// An S3 client as the archive needs one: path-style addressing when the
/// endpoint is overridden (moto, MinIO and other S3-compatible stores).
pub fn s3_client(sdk: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    let path_style = sdk.endpoint_url().is_some() || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some();
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(sdk).force_path_style(path_style).build())
}

impl Archive {
    /// The archive in `config`'s bucket, through `sdk`.
    pub fn new(sdk: &aws_config::SdkConfig, config: ArchiveConfig) -> Archive {
        Archive { s3: s3_client(sdk), config }
    }

    /// The archive in `config`'s bucket, with the AWS configuration of the environment.
    pub async fn from_env(config: ArchiveConfig) -> Archive {
        Archive::new(&crate::core::aws::from_env().await, config)
    }

    /// Its bucket and prefix.
    pub fn config(&self) -> &ArchiveConfig {
        &self.config
    }

    /// Stores `events` (rows of one batch, locked), one object per provider and
    /// day; the bodies of batch items are looked up in `bodies` (digest hex to base64).
    pub(crate) async fn store(&self, events: Vec<ArchivedEvent>, bodies: &BTreeMap<String, String>) -> Stored {
        let mut groups: BTreeMap<(String, String), Vec<ArchivedEvent>> = BTreeMap::new();
        for e in events {
            let day = e.received_at.get(..10).unwrap_or("unknown").to_string();
            groups.entry((e.provider.clone(), day)).or_default().push(e);
        }
        let mut stored = Stored::default();
        for ((provider, day), events) in groups {
            let keys: Vec<(String, String)> = events.iter().map(|e| (e.provider.clone(), e.event_id.clone())).collect();
            // A key is built from a provider's name only (receive and restore take no other), and a day.
            if !is_key_part(&provider) || !is_day(&day) {
                stored.failed += keys.len() as u64;
                stored.error.get_or_insert(format!(
                    "rows of provider {:?} received {:?} not archived: not a provider's name and a day",
                    webhook_inbox_schemes::text::escape(&provider),
                    webhook_inbox_schemes::text::escape(&day)
                ));
                continue;
            }
            let key = self.object_key(&provider, &day, &events);
            let put = match encode(events, bodies) {
                Ok(bytes) => self
                    .s3
                    .put_object()
                    .bucket(&self.config.bucket)
                    .key(&key)
                    .content_type("application/gzip")
                    .body(ByteStream::from(bytes))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| s3_error(e).to_string()),
                Err(e) => Err(e.to_string()),
            };
            match put {
                Ok(()) => {
                    stored.objects += 1;
                    stored.rows.extend(keys);
                }
                Err(e) => {
                    stored.failed += keys.len() as u64;
                    stored.error.get_or_insert(format!("s3://{}/{key} not stored: {e}", self.config.bucket));
                }
            }
        }
        stored
    }

    fn object_key(&self, provider: &str, day: &str, events: &[ArchivedEvent]) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut digest = Sha256::new();
        digest.update(now.as_nanos().to_le_bytes());
        for e in events {
            digest.update(e.event_id.as_bytes());
        }
        let tag = hex::encode(&digest.finalize()[..4]);
        format!("{}{provider}/{day}/{}-{tag}-{}.jsonl.gz", self.config.prefix, now.as_millis(), events.len())
    }

    /// The objects under the prefix, those of `provider` (and of days that start
    /// with `day`: `2026-10` for a month) when given, in key order.
    pub async fn list(&self, provider: Option<&str>, day: Option<&str>) -> Result<Vec<ArchiveObject>, ArchiveError> {
        let mut under = self.config.prefix.clone();
        if let Some(p) = provider {
            under.push_str(p);
            under.push('/');
            under.push_str(day.unwrap_or(""));
        }
        let objects = list_keys(&self.s3, &self.config.bucket, &under).await?;
        Ok(objects
            .into_iter()
            .filter_map(|(key, bytes)| {
                // Only the keys prune names: `<provider>/<YYYY-MM-DD>/<ms>-<8 hex>-<events>.jsonl.gz`.
                let rest = key.strip_prefix(&self.config.prefix)?;
                let mut parts = rest.splitn(3, '/');
                let (provider, day, name) = (parts.next()?, parts.next()?, parts.next()?);
                let mut fields = name.strip_suffix(".jsonl.gz")?.split('-');
                let (ms, tag, events) = (fields.next()?, fields.next()?, fields.next()?);
                let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
                let named = digits(ms) && tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit());
                if !(is_key_part(provider) && is_day(day) && named && digits(events) && fields.next().is_none()) {
                    return None;
                }
                let events = events.parse().ok();
                Some(ArchiveObject { provider: provider.into(), day: day.into(), events, bytes, key: key.clone() })
            })
            .filter(|o| day.map_or(true, |d| o.day.starts_with(d)))
            .collect())
    }
}

/// A provider's name as receive takes one (and a key may hold).
fn is_key_part(provider: &str) -> bool {
    webhook_inbox_schemes::is_provider_name(provider)
}

/// `YYYY-MM-DD`.
fn is_day(day: &str) -> bool {
    let b = day.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter().enumerate().all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

async fn list_keys(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Result<Vec<(String, i64)>, ArchiveError> {
    let mut pages = s3.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
    let mut keys = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(s3_error)?;
        for o in page.contents() {
            if let Some(key) = o.key() {
                keys.push((key.to_string(), o.size().unwrap_or(0)));
            }
        }
    }
    Ok(keys)
}

/// One archive object's bytes: its lines as JSON, gzip-compressed; a batch
/// body's bytes on the first line that points at it only.
fn encode(events: Vec<ArchivedEvent>, bodies: &BTreeMap<String, String>) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    let mut written = HashSet::new();
    for mut e in events {
        if let Some(sha) = &e.body_sha256 {
            if written.insert(sha.clone()) {
                e.raw_body = bodies.get(sha).cloned();
            }
        }
        serde_json::to_writer(&mut gz, &e)?;
        gz.write_all(b"\n")?;
    }
    gz.finish()
}
