//! What the operator's commands share: `--json` ([`Output`]), the connection,
//! who acts (for the audit), the arguments' parsers, tables, JSON and progress.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use sqlx::PgPool;
use webhook_inbox::{
    config::Env,
    ops::{self, Cursor, Since, Status},
    Provider,
};

/// Requeue and retry work in batches of this many rows, each its own short statement.
pub(crate) const BATCH: i64 = 500;

#[derive(Args, Debug, Clone)]
pub(crate) struct Output {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A duration ago (`30m`, `2h`, `7d`), not a timestamp.
pub(crate) fn ago(text: &str) -> Result<Duration, String> {
    match Since::parse(text)? {
        Since::Ago(d) => Ok(d),
        Since::At(_) => Err("a duration (30m, 2h, 7d)".into()),
    }
}

/// Connects, and says clearly what is missing: the setting, the server, or the schema.
pub(crate) async fn connect(pool: PgPool, where_: &str) -> Result<PgPool> {
    match sqlx::query("SELECT 1 FROM webhook_inbox LIMIT 0").execute(&pool).await {
        Ok(_) => Ok(pool),
        Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42P01") => {
            bail!("{where_} has no inbox tables: run `inbox migrate` first")
        }
        // The pool only says it timed out: one connection of its own says why (refused, no such host, ...).
        Err(sqlx::Error::PoolTimedOut) => {
            let why = match sqlx::ConnectOptions::connect(&*pool.connect_options()).await {
                Err(e) => e.to_string(),
                Ok(_) => "no connection came free in time".into(),
            };
            bail!("cannot reach the database at {where_}: {why}")
        }
        Err(e) => Err(e).with_context(|| format!("cannot reach the database at {where_}")),
    }
}

/// `--since` and `--until` timestamps as PostgreSQL reads them, or which one it cannot read.
pub(crate) async fn check_times(pool: &PgPool, since: &Option<Since>, until: &Option<Since>) -> Result<()> {
    for (flag, time) in [("--since", since), ("--until", until)] {
        if let Some(Since::At(text)) = time {
            if let Err(e) = sqlx::query("SELECT $1::timestamptz").bind(text).execute(pool).await {
                match e.as_database_error() {
                    Some(d) => bail!("{flag} {text:?} is not a timestamp PostgreSQL reads: {}", d.message()),
                    None => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

/// Who is acting, for the audit record: `INBOX_OPERATOR`, else the login
/// name, else (a container sets none) the user id and the host.
pub(crate) fn operator(env: &Env<'_>) -> String {
    env.var("INBOX_OPERATOR").or_else(|| env.var("USER")).or_else(|| env.var("LOGNAME")).unwrap_or_else(|| {
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata("/proc/self").map(|m| m.uid().to_string()).unwrap_or_else(|_| "?".into());
        let host = env
            .var("HOSTNAME")
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "an unnamed host".into());
        format!("uid {uid} on {host}")
    })
}

/// A provider as typed (`Stripe`, ` stripe `): its name, lower-cased, so that
/// it matches the stored rows; a name no provider can have is refused.
pub(crate) fn provider_name(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    Provider::try_from(name.as_str())
        .map(|p| p.as_str().to_string())
        .map_err(|_| "is not a provider name (letters, digits, - and _; `inbox providers --all` lists them)".into())
}

/// `--status` of `events`: any status.
pub(crate) fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| "one of pending, done, unhandled, ignored, failed".into())
}

/// `--after`: a cursor a page of `events` ended with.
pub(crate) fn parse_cursor(text: &str) -> Result<Cursor, String> {
    Cursor::parse(text.trim()).map_err(|e| format!("{e} (copy it from the end of the page before)"))
}

/// `--status`: the statuses `requeue` takes (never `pending`: those are queued already).
pub(crate) fn parse_requeue_status(text: &str) -> Result<Status, String> {
    match Status::parse(text) {
        Some(Status::Pending) => Err("pending events are queued already".into()),
        Some(status) => Ok(status),
        None => Err("one of unhandled, ignored, failed, done".into()),
    }
}

pub(crate) fn progress(len: u64, done: &str, out: &Output) -> indicatif::ProgressBar {
    if out.json {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!("{{bar:40}} {{pos}}/{{len}} {done} ({{eta}} left)"))
            .expect("a valid template"),
    );
    bar
}

pub(crate) fn age(ms: f64) -> String {
    match ms {
        ms if ms <= 0.0 => "-".into(),
        ms if ms < 120_000.0 => format!("{:.0} s", ms / 1000.0),
        ms if ms < 7_200_000.0 => format!("{:.0} min", ms / 60_000.0),
        ms => format!("{:.1} h", ms / 3_600_000.0),
    }
}

pub(crate) fn print_json(v: &Value) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{}", ops::escape_json(&serde_json::to_string_pretty(v).expect("JSON prints")));
}

/// Left-aligned columns, each as wide as its widest cell (cells are cut at 80 characters).
pub(crate) fn print_table(head: &[&str], rows: &[Vec<String>]) {
    let cut = |s: &str| -> String {
        let s = ops::escape(s).into_owned(); // before the widths: an escape is wider than its character
        if s.chars().count() > 80 {
            format!("{}...", s.chars().take(77).collect::<String>())
        } else {
            s
        }
    };
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| cut(c)).collect()).collect();
    let widths: Vec<usize> = (0..head.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([head[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:w$}")).collect();
        say!("{}", padded.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        say!("(none)");
    }
}

/// The commands as `inbox --help` lists them: by what they are for.
const GROUPS: &[(&str, &[&str])] = &[
    ("Run it", &["dev", "serve", "console", "migrate", "demo"]),
    (
        "See what it holds",
        &["stats", "events", "failed", "show", "providers", "outbox", "pauses", "jobs", "alerts", "archive", "rules"],
    ),
    ("Act on it (each action audited)", &["replay", "requeue", "erase", "pause", "resume", "restore"]),
    ("One pass of a function", &["relay", "reconcile", "prune"]),
];

/// `cmd` with its commands listed in [`GROUPS`], each with its short about.
pub(crate) fn grouped(cmd: clap::Command) -> clap::Command {
    let width = GROUPS.iter().flat_map(|(_, names)| names.iter().map(|n| n.len())).max().unwrap_or(0);
    let mut listing = String::new();
    for (heading, names) in GROUPS {
        listing.push_str(&format!("{heading}:\n"));
        for name in *names {
            let about =
                cmd.find_subcommand(name).and_then(|c| c.get_about()).map(|a| a.to_string()).unwrap_or_default();
            listing.push_str(&format!("  {name:<width$}  {about}\n"));
        }
        listing.push('\n');
    }
    let template = format!("{{about}}\n\n{{usage-heading}} {{usage}}\n\n{listing}Options:\n{{options}}\n\n`inbox help <COMMAND>` says more of each.");
    cmd.help_template(template)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command is in `inbox --help`, in one group, and no group names one that is not.
    #[test]
    fn every_command_is_listed_in_exactly_one_group() {
        let cmd = crate::Cli::command();
        let listed: Vec<&str> = super::GROUPS.iter().flat_map(|(_, names)| names.iter().copied()).collect();
        let mut commands: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
        commands.sort_unstable();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, commands, "GROUPS against the commands");
        let help = super::grouped(cmd).render_help().to_string();
        for name in listed {
            assert_eq!(help.matches(&format!("\n  {name} ")).count(), 1, "{name} once in:\n{help}");
        }
    }
}
