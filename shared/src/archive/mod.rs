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
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
};

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine;
use flate2::{bufread::MultiGzDecoder, write::GzEncoder, Compression};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::{
    core::{aws::ArchiveConfig, status::Status, text::escape},
    db::{self, inbox},
};

pub use crate::db::inbox::ArchivedEvent;

/// The newest line format this inbox writes and reads.
pub const FORMAT: i32 = 1;

/// Lines per INSERT when restoring.
const RESTORE_CHUNK: usize = 500;

/// Rejected lines whose reasons a [`Restored`] keeps (the rest are counted).
const REASONS_KEPT: usize = 20;

/// Something the archive could not do.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// S3 refused or could not be reached.
    #[error("S3: {0}")]
    S3(String),
    /// A local file or folder could not be read.
    #[error("{path}: {source}")]
    File {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
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
                let rest = key.strip_prefix(&self.config.prefix)?;
                let mut parts = rest.splitn(3, '/');
                let (provider, day, name) = (parts.next()?, parts.next()?, parts.next()?);
                let events = name.strip_suffix(".jsonl.gz")?.rsplit('-').next()?.parse().ok();
                Some(ArchiveObject { provider: provider.into(), day: day.into(), events, bytes, key: key.clone() })
            })
            .filter(|o| day.map_or(true, |d| o.day.starts_with(d)))
            .collect())
    }
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

/// Where [`restore`] reads: `s3://bucket/prefix` (every object under it, in
/// key order), or a local `.jsonl.gz` (or `.jsonl`) file, or a folder of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Every object under a prefix (one object's key is its own prefix).
    S3 {
        /// The bucket.
        bucket: String,
        /// The keys' prefix.
        prefix: String,
    },
    /// A file, or a folder.
    Path(PathBuf),
}

impl Source {
    /// `s3://bucket/prefix`, or a path.
    pub fn parse(text: &str) -> Result<Source, String> {
        match text.strip_prefix("s3://") {
            Some(rest) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(format!("{:?} names no bucket: s3://bucket/prefix", escape(text)));
                }
                Ok(Source::S3 { bucket: bucket.into(), prefix: prefix.into() })
            }
            None if text.is_empty() => Err("name an s3://bucket/prefix, a file or a folder".into()),
            None => Ok(Source::Path(text.into())),
        }
    }
}

/// What a restore did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Restored {
    /// Objects (or files) read.
    pub objects: u64,
    /// Lines read.
    pub lines: u64,
    /// Events put back.
    pub restored: u64,
    /// Events whose key was stored already, left as they are.
    pub duplicates: u64,
    /// Lines refused (not a valid archived event), and objects not readable at all.
    pub rejected: u64,
    /// Why, for the first 20 of them (which object, which line).
    pub reasons: Vec<String>,
}

impl Restored {
    fn reject(&mut self, reason: String) {
        self.rejected += 1;
        if self.reasons.len() < REASONS_KEPT {
            self.reasons.push(reason);
        }
    }
}

/// Puts the archived events of `source` back into `pool`'s inbox as they were
/// (marked restored now), skipping keys stored already, a few hundred lines a
/// transaction; a line that is not a valid archived event, or that PostgreSQL
/// refuses (or an object not readable at all), is refused and counted, the
/// others go on; S3 or the database failing stops it. `dry_run` reads and
/// inserts every line, then rolls each transaction back: the counts are what a
/// restore would do now (a key two objects hold is counted in both).
/// An S3 source is read through `sdk`, or the AWS configuration of the
/// environment when `None`. `progress` is called after each object.
pub async fn restore(
    pool: &PgPool,
    source: &Source,
    sdk: Option<&aws_config::SdkConfig>,
    dry_run: bool,
    mut progress: impl FnMut(&Restored),
) -> Result<Restored, ArchiveError> {
    let mut done = Restored::default();
    let mut bodies_seen = HashSet::new();
    match source {
        Source::S3 { bucket, prefix } => {
            let s3 = match sdk {
                Some(sdk) => s3_client(sdk),
                None => s3_client(&crate::core::aws::from_env().await),
            };
            let keys = list_keys(&s3, bucket, prefix).await?;
            if keys.is_empty() {
                return Err(ArchiveError::S3(format!("no object under s3://{bucket}/{prefix}")));
            }
            for (key, _) in keys {
                let name = format!("s3://{bucket}/{key}");
                let object = s3.get_object().bucket(bucket).key(&key).send().await.map_err(s3_error)?;
                let bytes = object.body.collect().await.map_err(s3_error)?.into_bytes();
                let reader = Box::new(std::io::Cursor::new(bytes));
                restore_object(pool, &name, reader, dry_run, &mut bodies_seen, &mut done).await?;
                progress(&done);
            }
        }
        Source::Path(path) => {
            for file in files(path)? {
                let name = file.display().to_string();
                let opened =
                    std::fs::File::open(&file).map_err(|source| ArchiveError::File { path: name.clone(), source })?;
                let reader = Box::new(BufReader::new(opened));
                restore_object(pool, &name, reader, dry_run, &mut bodies_seen, &mut done).await?;
                progress(&done);
            }
        }
    }
    Ok(done)
}

/// A file, or a folder's `.jsonl.gz` and `.jsonl` files (recursively, in path order).
fn files(path: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    let io = |source| ArchiveError::File { path: path.display().to_string(), source };
    if !path.is_dir() {
        std::fs::metadata(path).map_err(io)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.is_dir() {
            found.extend(files(&p)?);
        } else if p.to_string_lossy().ends_with(".jsonl.gz") || p.to_string_lossy().ends_with(".jsonl") {
            found.push(p);
        }
    }
    found.sort();
    Ok(found)
}

async fn restore_object(
    pool: &PgPool,
    name: &str,
    mut reader: Box<dyn BufRead + Send>,
    dry_run: bool,
    bodies_seen: &mut HashSet<String>,
    done: &mut Restored,
) -> Result<(), ArchiveError> {
    done.objects += 1;
    // Read a line at a time (a file may be large), through every member of a gzip stream.
    let reader: Box<dyn BufRead + Send> = match reader.fill_buf() {
        Ok([0x1f, 0x8b, ..]) => Box::new(BufReader::new(MultiGzDecoder::new(reader))),
        Ok(_) => reader,
        Err(e) => {
            done.reject(format!("{}: not readable: {e}", escape(name)));
            return Ok(());
        }
    };
    let mut chunk = Chunk::default();
    for (n, line) in reader.lines().enumerate() {
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                done.reject(format!(
                    "{} line {}: not readable as (gzip-compressed) JSON Lines, and nothing after it: {e}",
                    escape(name),
                    n + 1
                ));
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        done.lines += 1;
        match checked(&line, bodies_seen) {
            Ok(event) => {
                chunk.lines.push(n + 1);
                chunk.events.push(event);
            }
            Err(reason) => done.reject(format!("{} line {}: {reason}", escape(name), n + 1)),
        }
        if chunk.events.len() == RESTORE_CHUNK {
            insert(pool, name, &chunk, dry_run, done).await?;
            chunk = Chunk::default();
        }
    }
    if !chunk.events.is_empty() {
        insert(pool, name, &chunk, dry_run, done).await?;
    }
    Ok(())
}

/// Lines to insert together, and their numbers.
#[derive(Default)]
struct Chunk {
    lines: Vec<usize>,
    events: Vec<ArchivedEvent>,
}

/// Inserts a chunk in one statement; if PostgreSQL refuses a value of it (a
/// constraint, a timestamp it cannot read), each line alone, so that only the
/// refused ones are refused, each named.
async fn insert(
    pool: &PgPool,
    name: &str,
    chunk: &Chunk,
    dry_run: bool,
    done: &mut Restored,
) -> Result<(), ArchiveError> {
    let refused = |e: &sqlx::Error| db::sqlstate(e).is_some_and(|c| c.starts_with("22") || c.starts_with("23"));
    match insert_all(pool, &chunk.events, dry_run).await {
        Ok(n) => {
            done.restored += n;
            done.duplicates += chunk.events.len() as u64 - n;
        }
        Err(e) if refused(&e) => {
            for (line, event) in chunk.lines.iter().zip(&chunk.events) {
                match insert_all(pool, std::slice::from_ref(event), dry_run).await {
                    Ok(n) => {
                        done.restored += n;
                        done.duplicates += 1 - n;
                    }
                    Err(e) if refused(&e) => {
                        let why = match &e {
                            sqlx::Error::Database(d) => d.message().to_string(),
                            other => other.to_string(),
                        };
                        done.reject(format!("{} line {line}: PostgreSQL refused it: {}", escape(name), escape(&why)));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

async fn insert_all(pool: &PgPool, events: &[ArchivedEvent], dry_run: bool) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let n = inbox::restore(&mut *tx, events).await?;
    if dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(n)
}

/// A line, parsed and checked: what PostgreSQL's constraints would refuse is
/// refused here with a reason, so that one bad line fails only itself.
fn checked(line: &str, bodies_seen: &mut HashSet<String>) -> Result<ArchivedEvent, String> {
    let e: ArchivedEvent = serde_json::from_str(line).map_err(|e| format!("not an archived event: {e}"))?;
    if e.v > FORMAT {
        return Err(format!("format {} is newer than this inbox reads ({FORMAT})", e.v));
    }
    match Status::parse(&e.status) {
        None => return Err(format!("status {:?} is not one", escape(&e.status))),
        Some(Status::Pending) => return Err("pending: the archive holds finished events only".into()),
        Some(_) => {}
    }
    let chars = |t: &str| t.chars().count();
    if !(1..=64).contains(&chars(&e.provider)) || !(1..=255).contains(&chars(&e.event_id)) {
        return Err("its provider or event id is empty or too long".into());
    }
    if chars(&e.event_type) > 128 || chars(&e.source) > 16 {
        return Err("its event type or source is too long".into());
    }
    let raw = match &e.raw_body {
        Some(b) => Some(
            base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| format!("raw_body is not base64: {e}"))?,
        ),
        None => None,
    };
    match (&e.body_sha256, raw) {
        (Some(sha), Some(raw)) => {
            if hex::encode(Sha256::digest(&raw)) != *sha {
                return Err(format!("its batch body does not hash to body_sha256 {:?}", escape(sha)));
            }
            bodies_seen.insert(sha.clone());
        }
        (Some(sha), None) if !bodies_seen.contains(sha) => {
            return Err(format!("its batch body ({:?}) is on no earlier line", escape(sha)));
        }
        (None, None) if e.erased_at.is_none() => return Err("it has no raw bytes".into()),
        _ => {}
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_an_s3_url_or_a_path() {
        assert_eq!(
            Source::parse("s3://bucket/inbox/stripe/2026-10").unwrap(),
            Source::S3 { bucket: "bucket".into(), prefix: "inbox/stripe/2026-10".into() }
        );
        assert_eq!(Source::parse("s3://bucket").unwrap(), Source::S3 { bucket: "bucket".into(), prefix: "".into() });
        assert!(Source::parse("s3:///x").unwrap_err().contains("names no bucket"));
        assert_eq!(Source::parse("a/b.jsonl.gz").unwrap(), Source::Path("a/b.jsonl.gz".into()));
    }
}
