//! `inbox archive list` and `inbox restore`: prune's archive in S3
//! (`INBOX_ARCHIVE_S3_BUCKET`), and archived events put back into a database.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::{
    archive::{self, Archive, Location, RestoreOptions},
    config::{Catalog, Env, Secrets},
    ArchiveConfig,
};

use crate::cli::{print_json, print_table, progress, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum ArchiveCommand {
    /// What the archive holds, by provider and day (events, objects, bytes); `--objects` lists each object.
    List {
        #[arg(long, value_parser = crate::cli::provider_name)]
        provider: Option<String>,
        /// The days that start with this: 2026-10 for a month, 2026-10-01 for a day (with --provider).
        #[arg(long, requires = "provider")]
        day: Option<String>,
        /// Each object, with its key (for `inbox restore s3://bucket/key`).
        #[arg(long)]
        objects: bool,
        /// The archive's bucket.
        #[arg(long, env = "INBOX_ARCHIVE_S3_BUCKET")]
        bucket: String,
        /// The objects' keys start with this.
        #[arg(long, env = "INBOX_ARCHIVE_S3_PREFIX", default_value = "inbox/")]
        prefix: String,
        #[command(flatten)]
        out: Output,
    },
}

pub(crate) async fn act(command: ArchiveCommand) -> Result<()> {
    let ArchiveCommand::List { provider, day, objects, bucket, prefix, out } = command;
    let archive = Archive::from_env(ArchiveConfig { bucket: bucket.clone(), prefix }).await;
    let found = archive.list(provider.as_deref(), day.as_deref()).await?;
    if out.json {
        print_json(&json!(found));
        return Ok(());
    }
    if found.is_empty() {
        say!("nothing archived under s3://{bucket}/{}", archive.config().prefix);
        return Ok(());
    }
    let count = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
    if objects {
        let rows: Vec<Vec<String>> =
            found.iter().map(|o| vec![o.key.clone(), count(o.events), o.bytes.to_string()]).collect();
        print_table(&["KEY", "EVENTS", "BYTES"], &rows);
        return Ok(());
    }
    let mut days: BTreeMap<(&str, &str), (Option<u64>, u64, i64)> = BTreeMap::new();
    for o in &found {
        let d = days.entry((&o.provider, &o.day)).or_insert((Some(0), 0, 0));
        d.0 = d.0.zip(o.events).map(|(a, b)| a + b);
        d.1 += 1;
        d.2 += o.bytes;
    }
    let rows: Vec<Vec<String>> = days
        .iter()
        .map(|((p, d), (events, objects, bytes))| {
            vec![p.to_string(), d.to_string(), count(*events), objects.to_string(), bytes.to_string()]
        })
        .collect();
    print_table(&["PROVIDER", "DAY", "EVENTS", "OBJECTS", "BYTES"], &rows);
    Ok(())
}

/// `inbox restore SOURCE`: the events archived there, back into the database
/// as they were, each line checked against the providers and secrets this
/// process reads (as the functions read them).
pub(crate) async fn restore(
    pool: &PgPool,
    source: &Location,
    dry_run: bool,
    unverified: bool,
    out: &Output,
) -> Result<()> {
    let env = Env::resolved().await?;
    let catalog = Catalog::read(&env)?;
    let options = RestoreOptions {
        dry_run,
        secrets: Secrets::read(&env, &catalog)?,
        catalog,
        unverified,
        actor: crate::cli::operator(&env),
    };
    let bar = progress(0, "objects", out);
    let done = archive::restore(pool, source, None, &options, |d| bar.set_position(d.objects)).await?;
    bar.finish_and_clear();
    if out.json {
        print_json(&json!({"dry_run": dry_run, "restore": done}));
    } else {
        let verb = if dry_run { "would be restored" } else { "restored" };
        say!(
            "{} object(s), {} event(s): {} {verb}, {} stored already (left as they are), {} refused{}",
            done.objects,
            done.lines,
            done.restored,
            done.duplicates,
            done.rejected,
            if dry_run { " (nothing changed)" } else { "" }
        );
        if done.unverified > 0 {
            say!("  {} of them not verified with a secret configured here (--unverified)", done.unverified);
        }
        for reason in &done.reasons {
            say!("  refused: {reason}");
        }
        if done.restored > 0 && !dry_run {
            say!("to run today's handlers over them: inbox requeue --status done,unhandled,ignored,failed --provider ...");
        }
    }
    if done.rejected > 0 {
        bail!("{} line(s) or object(s) refused", done.rejected);
    }
    Ok(())
}
