//! Restore: archived events read back from S3, a file or a folder, each line
//! checked as a stranger's delivery ([`super::check`]), inserted as they were
//! (marked restored, audited), keys stored already skipped.
//!
//! What it reads is bounded whatever the source holds: lines at most
//! [`MAX_LINE_BYTES`] (a longer one is refused and skipped, read through
//! without being kept), S3 objects streamed to a temporary file first,
//! regular files only (a symbolic link, a device or a pipe is refused by
//! name, never followed) in folders [`MAX_DEPTH`] deep at most.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
};

use flate2::bufread::MultiGzDecoder;
use sqlx::PgPool;

use super::{check::Checker, list_keys, s3_client, s3_error, ArchiveError, ArchivedEvent};
use crate::db::{self, inbox};
use webhook_inbox_schemes::{catalog::Catalog, secret::Secrets, text::escape};

/// Lines per INSERT.
const RESTORE_CHUNK: usize = 500;

/// Rejected lines whose reasons a [`Restored`] keeps (the rest are counted).
const REASONS_KEPT: usize = 20;

/// The longest line read, in bytes: a line holds a delivery's raw bytes
/// (base64) and its payload, a few times the largest body receive takes.
pub(crate) const MAX_LINE_BYTES: usize = 32 * 1024 * 1024;

/// Folders inside the folder given, at most.
pub(crate) const MAX_DEPTH: usize = 8;

/// Where [`restore`] reads: `s3://bucket/prefix` (every object under it, in
/// key order), or a local `.jsonl.gz` (or `.jsonl`) file, or a folder of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
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

impl Location {
    /// `s3://bucket/prefix`, or a path.
    pub fn parse(text: &str) -> Result<Location, String> {
        match text.strip_prefix("s3://") {
            Some(rest) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(format!("{:?} names no bucket: s3://bucket/prefix", escape(text)));
                }
                Ok(Location::S3 { bucket: bucket.into(), prefix: prefix.into() })
            }
            None if text.is_empty() => Err("name an s3://bucket/prefix, a file or a folder".into()),
            None => Ok(Location::Path(text.into())),
        }
    }
}

/// How a restore reads and checks its lines.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// Read, check and insert every line, then roll each transaction back:
    /// the counts are what a restore would do now.
    pub dry_run: bool,
    /// The providers whose lines are taken (the built-in and declared ones),
    /// and how each one's raw bytes become events.
    pub catalog: Catalog,
    /// The secrets each line's bytes must verify with.
    pub secrets: Secrets,
    /// Take the lines that cannot be verified here (no secret of their
    /// provider configured, a secret since rotated away, Marqeta's Basic
    /// credentials, which are never stored, events fetched by reconcile),
    /// counted in [`Restored::unverified`]; their payloads are still what
    /// their bytes say. Without it they are refused, each named.
    pub unverified: bool,
    /// Who restores, for each restored event's audit record.
    pub actor: String,
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
    /// Of those, taken without their bytes verified ([`RestoreOptions::unverified`]).
    pub unverified: u64,
    /// Events whose key was stored already, left as they are.
    pub duplicates: u64,
    /// Lines refused, and objects not readable at all.
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
/// (marked restored now, each audited as `restore` by the options' actor),
/// skipping keys stored already, a few hundred lines a transaction. A line is
/// taken only as receive would have stored it (docs/operate.md, Archive and restore); one that is
/// not, or that PostgreSQL refuses (or an object not readable at all), is
/// refused and counted, the others go on; S3 or the database failing stops
/// it. An S3 source is read through `sdk`, or the AWS configuration of the
/// environment when `None`. `progress` is called after each object.
pub async fn restore(
    pool: &PgPool,
    source: &Location,
    sdk: Option<&aws_config::SdkConfig>,
    options: &RestoreOptions,
    mut progress: impl FnMut(&Restored),
) -> Result<Restored, ArchiveError> {
    let mut done = Restored::default();
    let mut checker = Checker::new(&options.catalog, &options.secrets, options.unverified);
    match source {
        Location::S3 { bucket, prefix } => {
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
                let spooled = Spooled::download(&s3, bucket, &key).await?;
                let file = spooled.open().map_err(|why| ArchiveError::File { path: name.clone(), why })?;
                let object = Object { name: &name, options, checker: &mut checker };
                object.restore(pool, Box::new(BufReader::new(file)), &mut done).await?;
                progress(&done);
            }
        }
        Location::Path(path) => {
            for file in files(path)? {
                let name = file.display().to_string();
                let opened = open_regular(&file).map_err(|why| ArchiveError::File { path: name.clone(), why })?;
                let object = Object { name: &name, options, checker: &mut checker };
                object.restore(pool, Box::new(BufReader::new(opened)), &mut done).await?;
                progress(&done);
            }
        }
    }
    Ok(done)
}

/// An S3 object written to a temporary file as it streams in (never whole
/// in memory), removed when dropped.
struct Spooled(PathBuf);

impl Spooled {
    async fn download(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Spooled, ArchiveError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "inbox-restore-{}-{}.part",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |why| ArchiveError::File { path: path.display().to_string(), why };
        let spooled = Spooled(path.clone());
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(io)?;
        let mut body = s3.get_object().bucket(bucket).key(key).send().await.map_err(s3_error)?.body;
        while let Some(chunk) = body.try_next().await.map_err(s3_error)? {
            file.write_all(&chunk).map_err(io)?;
        }
        Ok(spooled)
    }

    fn open(&self) -> std::io::Result<std::fs::File> {
        std::fs::File::open(&self.0)
    }
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Opens `path` if it is a regular file (a symbolic link is not followed).
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(not_regular(&meta)));
    }
    let file = std::fs::File::open(path)?;
    // Swapped for something else between the two looks: refused all the same.
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

fn not_regular(meta: &std::fs::Metadata) -> &'static str {
    if meta.file_type().is_symlink() {
        "a symbolic link: restore reads regular files only, never a link (name the file it points at)"
    } else {
        "not a regular file (a device, a pipe or a socket): restore reads regular files only"
    }
}

/// A file, or a folder's `.jsonl.gz` and `.jsonl` regular files (in folders
/// [`MAX_DEPTH`] deep at most, links not followed), in path order.
fn files(path: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    let io = |p: &Path, why| ArchiveError::File { path: p.display().to_string(), why };
    let meta = std::fs::symlink_metadata(path).map_err(|e| io(path, e))?;
    if !meta.is_dir() {
        if !meta.file_type().is_file() {
            return Err(io(path, std::io::Error::other(not_regular(&meta))));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let mut found = Vec::new();
    let mut folders = vec![(path.to_path_buf(), 0)];
    while let Some((folder, depth)) = folders.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| io(&folder, e))? {
            let entry = entry.map_err(|e| io(&folder, e))?;
            let (p, kind) = (entry.path(), entry.file_type().map_err(|e| io(&folder, e))?);
            let named = p.to_string_lossy().ends_with(".jsonl.gz") || p.to_string_lossy().ends_with(".jsonl");
            if kind.is_dir() && depth < MAX_DEPTH {
                folders.push((p, depth + 1));
            } else if kind.is_file() && named {
                found.push(p);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// One object (or file) being read.
struct Object<'a> {
    name: &'a str,
    options: &'a RestoreOptions,
    checker: &'a mut Checker,
}

/// A line as [`read_line`] found it.
enum Line {
    End,
    Read,
    /// Longer than [`MAX_LINE_BYTES`]: read through, not kept.
    TooLong,
}

/// The next line (without its newline) into `buf`, at most `cap` bytes kept.
fn read_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Read,
            });
        }
        let (chunk, end) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if !too_long && buf.len() + chunk.len() <= cap {
            buf.extend_from_slice(chunk);
        } else {
            too_long = true;
            buf.clear();
        }
        let used = end.unwrap_or(available.len());
        reader.consume(used);
        if end.is_some() {
            return Ok(if too_long { Line::TooLong } else { Line::Read });
        }
    }
}

impl Object<'_> {
    async fn restore(
        self,
        pool: &PgPool,
        mut reader: Box<dyn BufRead + Send>,
        done: &mut Restored,
    ) -> Result<(), ArchiveError> {
        done.objects += 1;
        self.checker.next_object();
        let name = escape(self.name).into_owned();
        // A line at a time, through every member of a gzip stream.
        let mut reader: Box<dyn BufRead + Send> = match reader.fill_buf() {
            Ok([0x1f, 0x8b, ..]) => Box::new(BufReader::new(MultiGzDecoder::new(reader))),
            Ok(_) => reader,
            Err(e) => {
                done.reject(format!("{name}: not readable: {e}"));
                return Ok(());
            }
        };
        let reason = format!("restored from {}", self.name.chars().take(400).collect::<String>());
        let mut chunk = Chunk::default();
        let mut buf = Vec::new();
        for n in 1.. {
            match read_line(&mut *reader, &mut buf, MAX_LINE_BYTES) {
                Ok(Line::End) => break,
                Ok(Line::TooLong) => {
                    done.lines += 1;
                    done.reject(format!("{name} line {n}: longer than {} MiB: refused", MAX_LINE_BYTES >> 20));
                    continue;
                }
                Ok(Line::Read) => {}
                Err(e) => {
                    done.reject(format!(
                        "{name} line {n}: not readable as (gzip-compressed) JSON Lines, and nothing after it: {e}"
                    ));
                    break;
                }
            }
            let Ok(line) = std::str::from_utf8(&buf) else {
                done.lines += 1;
                done.reject(format!("{name} line {n}: not UTF-8"));
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            done.lines += 1;
            match self.checker.check(line) {
                Ok(checked) => {
                    chunk.lines.push(n);
                    chunk.unverified.push(checked.unverified);
                    chunk.events.push(checked.event);
                }
                Err(why) => done.reject(format!("{name} line {n}: {why}")),
            }
            if chunk.events.len() == RESTORE_CHUNK {
                insert(pool, &name, &chunk, self.options, &reason, done).await?;
                chunk = Chunk::default();
            }
        }
        if !chunk.events.is_empty() {
            insert(pool, &name, &chunk, self.options, &reason, done).await?;
        }
        Ok(())
    }
}

/// Lines to insert together, their numbers, and which were taken unverified.
#[derive(Default)]
struct Chunk {
    lines: Vec<usize>,
    unverified: Vec<bool>,
    events: Vec<ArchivedEvent>,
}

/// Inserts a chunk in one statement; if PostgreSQL refuses a value of it (a
/// constraint, a value it cannot read), each line alone, so that only the
/// refused ones are refused, each named.
async fn insert(
    pool: &PgPool,
    name: &str,
    chunk: &Chunk,
    options: &RestoreOptions,
    reason: &str,
    done: &mut Restored,
) -> Result<(), ArchiveError> {
    let refused = |e: &sqlx::Error| db::sqlstate(e).is_some_and(|c| c.starts_with("22") || c.starts_with("23"));
    match insert_all(pool, &chunk.events, options, reason).await {
        Ok(keys) => count(chunk, 0..chunk.events.len(), &keys, done),
        Err(e) if refused(&e) => {
            for (i, line) in chunk.lines.iter().enumerate() {
                match insert_all(pool, std::slice::from_ref(&chunk.events[i]), options, reason).await {
                    Ok(keys) => count(chunk, i..i + 1, &keys, done),
                    Err(e) if refused(&e) => {
                        let why = match &e {
                            sqlx::Error::Database(d) => d.message().to_string(),
                            other => other.to_string(),
                        };
                        done.reject(format!("{name} line {line}: PostgreSQL refused it: {}", escape(&why)));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Counts the chunk's lines `range` as restored (their keys in `keys`) or duplicates.
fn count(chunk: &Chunk, range: std::ops::Range<usize>, keys: &HashSet<(String, String)>, done: &mut Restored) {
    for i in range {
        let e = &chunk.events[i];
        if keys.contains(&(e.provider.clone(), e.event_id.clone())) {
            done.restored += 1;
            done.unverified += u64::from(chunk.unverified[i]);
        } else {
            done.duplicates += 1;
        }
    }
}

async fn insert_all(
    pool: &PgPool,
    events: &[ArchivedEvent],
    options: &RestoreOptions,
    reason: &str,
) -> Result<HashSet<(String, String)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let keys = inbox::restore(&mut *tx, events, &options.actor, reason).await?;
    if options.dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(keys.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_an_s3_url_or_a_path() {
        assert_eq!(
            Location::parse("s3://bucket/inbox/stripe/2026-10").unwrap(),
            Location::S3 { bucket: "bucket".into(), prefix: "inbox/stripe/2026-10".into() }
        );
        assert_eq!(
            Location::parse("s3://bucket").unwrap(),
            Location::S3 { bucket: "bucket".into(), prefix: "".into() }
        );
        assert!(Location::parse("s3:///x").unwrap_err().contains("names no bucket"));
        assert_eq!(Location::parse("a/b.jsonl.gz").unwrap(), Location::Path("a/b.jsonl.gz".into()));
    }

    #[test]
    fn a_line_past_the_cap_is_read_through_not_kept_and_the_next_one_is_read() {
        let text = format!("{}\nshort\n{}", "x".repeat(100), "y".repeat(5));
        let mut reader = std::io::BufReader::with_capacity(7, text.as_bytes());
        let mut buf = Vec::new();
        assert!(matches!(read_line(&mut reader, &mut buf, 10).unwrap(), Line::TooLong));
        assert!(buf.capacity() < 100, "what was over the cap was never kept");
        assert!(matches!(read_line(&mut reader, &mut buf, 10).unwrap(), Line::Read));
        assert_eq!(buf, b"short");
        assert!(matches!(read_line(&mut reader, &mut buf, 10).unwrap(), Line::Read));
        assert_eq!(buf, b"yyyyy");
        assert!(matches!(read_line(&mut reader, &mut buf, 10).unwrap(), Line::End));
    }
}
