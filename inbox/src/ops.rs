//! The operator's commands, all against `DATABASE_URL`: `stats`, `failed`,
//! `show`, `replay`, `requeue`, `outbox`. Each prints a table for people, or
//! JSON with `--json` for scripts.

use std::{ops::ControlFlow, time::Duration};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::{Catalog, Env, IgnoreRules, Secrets},
    ops::{self, Audit, Cursor, EventQuery, Filter, Replayed, Since, Status},
    Provider,
};

/// Requeue and retry work in batches of this many rows, each its own short statement.
pub const BATCH: i64 = 500;

#[derive(Args, Debug, Clone)]
pub struct Output {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum RulesCommand {
    /// Check a rules file (as the worker does at start-up) and try it on the
    /// stored events: how many each ignore rule would have ignored.
    Check {
        /// The file (INBOX_RULES_FILE's format: docs/operate.md#ignore-rules).
        file: std::path::PathBuf,
        /// Only events received in the last 30m, 2h, 7d, ...
        #[arg(long, value_parser = ago)]
        since: Option<Duration>,
        #[command(flatten)]
        out: Output,
    },
}

/// A duration ago (`30m`, `2h`, `7d`), not a timestamp.
pub fn ago(text: &str) -> Result<Duration, String> {
    match Since::parse(text)? {
        Since::Ago(d) => Ok(d),
        Since::At(_) => Err("a duration (30m, 2h, 7d)".into()),
    }
}

/// `inbox rules check`: the file refused with its reason, or each rule's matches.
pub async fn rules_check(pool: &PgPool, file: &std::path::Path, since: Option<Duration>, out: &Output) -> Result<()> {
    let shown = ops::escape(&file.display().to_string()).into_owned();
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {shown}"))?;
    let rules = match IgnoreRules::parse(&text) {
        Ok(rules) => rules,
        Err(reason) => bail!("{shown}: {reason}"),
    };
    let found = ops::rule_matches(pool, &rules, since).await?;
    if out.json {
        print_json(&serde_json::to_value(&found)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = found
        .rules
        .iter()
        .map(|r| {
            let example = r.example.clone().unwrap_or_else(|| "-".into());
            vec![r.name.clone(), r.provider.clone(), r.event_type.clone(), r.matched.to_string(), example]
        })
        .collect();
    print_table(&["rule", "provider", "type", "would ignore", "for example"], &rows);
    let window = since.map_or(String::new(), |d| format!(" received in the last {}", age(d.as_millis() as f64)));
    say!(
        "{shown} is valid: {} rule(s); {} stored event(s) of their providers{window} read",
        rows.len(),
        found.examined
    );
    Ok(())
}

/// Connects, and says clearly what is missing: the setting, the server, or the schema.
pub async fn connect(pool: PgPool, where_: &str) -> Result<PgPool> {
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
async fn check_times(pool: &PgPool, since: &Option<Since>, until: &Option<Since>) -> Result<()> {
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
pub fn operator(env: &Env<'_>) -> String {
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

pub async fn stats(pool: &PgPool, env: &Env<'_>, out: &Output) -> Result<()> {
    let counts = ops::counts_by_provider(pool).await?;
    let ops::Gauges { inbox: gauges, outbox } = ops::gauges(pool).await?;
    let secrets = ops::secret_usage(pool, Duration::from_secs(7 * 86_400)).await?;
    // Where each fingerprint is in the lists configured here (none, in a shell without the secrets).
    let configured = Catalog::read(env).and_then(|c| Secrets::read(env, &c)).ok();
    let position = |s: &ops::SecretUse| -> Option<usize> {
        let (provider, fingerprint) = (Provider::try_from(s.provider.as_str()).ok()?, s.secret_fingerprint.as_deref()?);
        configured.as_ref()?.fingerprints(provider).iter().position(|f| f == fingerprint).map(|i| i + 1)
    };
    if out.json {
        let counts: Vec<Value> =
            counts.iter().map(|(p, s, n)| json!({"provider": p, "status": s, "count": n})).collect();
        // No age when nothing waits: null, as the table's "-", not 0.
        let mut inbox_gauges = serde_json::to_value(gauges)?;
        if gauges.pending == gauges.held {
            inbox_gauges["oldest_pending_ms"] = Value::Null;
        }
        let mut outbox_gauges = serde_json::to_value(outbox)?;
        if outbox.backlog == 0 {
            outbox_gauges["oldest_backlog_ms"] = Value::Null;
        }
        print_json(&json!({
            "events": counts,
            "inbox": inbox_gauges,
            "outbox": outbox_gauges,
            "secrets_last_7_days": secrets.iter().map(|s| {
                let mut v = serde_json::to_value(s).expect("a row serializes");
                v["configured_as"] = position(s).map_or(Value::Null, |p| p.into());
                v
            }).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = counts.iter().map(|(p, s, n)| vec![p.clone(), s.clone(), n.to_string()]).collect();
    print_table(&["provider", "status", "events"], &rows);
    say!();
    say!(
        "pending: {} (oldest {})   failed in the last hour: {}",
        gauges.pending,
        age(gauges.oldest_pending_ms),
        gauges.failed_last_hour
    );
    if gauges.held > 0 || gauges.overdue_pauses > 0 {
        say!(
            "paused: {} of them held (not counted in the oldest), {} pause(s) overdue: `inbox pauses` lists them",
            gauges.held,
            gauges.overdue_pauses
        );
    }
    say!("outbox: {} waiting (oldest {}), {} dead", outbox.backlog, age(outbox.oldest_backlog_ms), outbox.dead);
    say!();
    say!("which secret verified deliveries in the last 7 days (by fingerprint; `inbox providers --json` lists those configured):");
    let rows: Vec<Vec<String>> = secrets
        .iter()
        .map(|s| {
            let secret = match (&s.secret_fingerprint, position(s), s.secret_index) {
                (Some(f), Some(p), _) => format!("{f} (#{p} here)"),
                (Some(f), None, _) if configured.is_some() => format!("{f} (not configured here)"),
                (Some(f), None, _) => f.clone(),
                (None, _, Some(i)) => format!("#{} then (stored before fingerprints)", i + 1),
                (None, _, None) => "-".into(),
            };
            vec![s.provider.clone(), secret, s.deliveries.to_string(), s.last_received_at.clone()]
        })
        .collect();
    print_table(&["provider", "secret", "deliveries", "last"], &rows);
    Ok(())
}

pub async fn failed(pool: &PgPool, filter: &Filter, limit: i64, out: &Output) -> Result<()> {
    check_times(pool, &filter.since, &filter.until).await?;
    let events = ops::list_failed(pool, filter, limit).await?;
    if out.json {
        print_json(&json!(events));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.provider.clone(),
                e.event_id.clone(),
                e.event_type.clone(),
                e.attempts.to_string(),
                e.failed_at.clone(),
                e.failure_reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(&["provider", "event_id", "type", "attempts", "failed at", "reason"], &rows);
    say!("{} shown (--limit {limit})", events.len());
    Ok(())
}

pub async fn show(pool: &PgPool, env: &Env<'_>, provider: &str, event_id: &str, out: &Output) -> Result<()> {
    let Some(event) = ops::stored_event(pool, provider, event_id).await? else {
        bail!("no event {event_id:?} from provider {provider:?}");
    };
    let history = ops::history(pool, provider, event_id).await?;
    let messages = ops::event_messages(pool, provider, event_id).await?;
    let verification = reverify(env, &event);
    if out.json {
        print_json(&json!({
            "provider": event.provider, "event_id": event.event_id, "event_type": event.event_type,
            "status": event.status, "source": event.source, "attempts": event.attempts,
            "received_at": event.received_at, "processed_at": event.processed_at,
            "next_attempt_at": event.next_attempt_at, "failure_reason": event.failure_reason,
            "secret_index": event.secret_index, "secret_fingerprint": event.secret_fingerprint,
            "headers": event.headers.0, "payload": event.payload.map(|p| p.0),
            "raw_body_bytes": event.raw_body.len(), "verification": verification, "history": history,
            "outbox": messages, "held_by_pause": event.held_by, "erased_at": event.erased_at, "erased_by": event.erased_by,
            "restored_at": event.restored_at, "raw_erased_at": event.raw_erased_at,
        }));
        return Ok(());
    }
    say!("{} {} ({}), {}, from {}", event.provider, event.event_id, event.event_type, event.status, event.source);
    say!("received {}; processed {}", event.received_at, event.processed_at.as_deref().unwrap_or("-"));
    say!("attempts {}; next attempt {}", event.attempts, event.next_attempt_at.as_deref().unwrap_or("-"));
    if let Some(at) = &event.erased_at {
        say!(
            "erased on {at} by {}: its payload, raw bytes and headers are gone; a redelivery is still a duplicate",
            event.erased_by.as_deref().unwrap_or("?")
        );
    }
    if let Some(at) = &event.raw_erased_at {
        say!("its raw bytes were erased on {at} with another event of its batch (the batch's body held that one's data); its payload stays");
    }
    if let Some(at) = &event.restored_at {
        say!("restored from prune's archive on {at} (`inbox restore`)");
    }
    if event.held_by.is_some() {
        say!("held by a pause: it waits, spending no attempt, until `inbox resume` (`inbox pauses` lists the pauses)");
    }
    match &event.failure_reason {
        Some(reason) if event.status == Status::Ignored.as_str() => say!(
            "{reason}; to run it after all: inbox requeue --status ignored --provider {} --type {:?}",
            event.provider,
            event.event_type
        ),
        Some(reason) => say!("failure: {reason}"),
        None => {}
    }
    if event.status == Status::Unhandled.as_str() {
        say!(
            "unhandled: no handler took {:?} when it was processed; once one is deployed: inbox requeue --status unhandled --provider {} --type {:?}",
            event.event_type, event.provider, event.event_type
        );
    }
    if let Some(f) = &event.secret_fingerprint {
        say!("verified at receive by the secret {f}");
    }
    say!("verification: {verification}");
    say!("headers: {}", event.headers.0);
    match &event.payload {
        Some(p) => {
            // Line by line: the pretty JSON's own line breaks kept, what is in its strings escaped.
            for (i, line) in serde_json::to_string_pretty(&p.0)?.lines().enumerate() {
                say!("{}{line}", if i == 0 { "payload: " } else { "" });
            }
        }
        None => say!("payload: none stored ({} raw bytes kept)", event.raw_body.len()),
    }
    if history.is_empty() {
        say!("history: never requeued");
    }
    for h in &history {
        say!(
            "history: {} {} by {}: {:?} (was {}, {} attempts{})",
            h.at,
            h.action,
            h.actor,
            h.reason,
            h.from_status,
            h.attempts,
            h.failure_reason.as_deref().map(|r| format!(", {r}")).unwrap_or_default()
        );
    }
    if messages.is_empty() {
        say!("outbox: no message written by its handler");
    }
    for m in &messages {
        let state = match (&m.sent_at, &m.dead_at) {
            (Some(at), _) => format!("sent {at}"),
            (None, Some(at)) => format!("dead since {at}: {}", m.last_error.as_deref().unwrap_or("-")),
            (None, None) => format!("waiting, {} attempts", m.attempts),
        };
        say!("outbox: #{} {} ({} {}), {state}", m.id, m.message_key, m.aggregate_type, m.aggregate_id);
    }
    Ok(())
}

/// `inbox providers`: each provider with a secret (every known one with `all`),
/// the URL to register with it, how it signs, and how long it may redeliver.
pub fn providers(env: &Env<'_>, base_url: &str, all: bool, out: &Output) -> Result<()> {
    let catalog = Catalog::read(env)?;
    let secrets = Secrets::read(env, &catalog)?;
    let base = base_url.trim_end_matches('/');
    let rows: Vec<Value> = ops::provider_contracts(&catalog)
        .into_iter()
        .filter(|c| all || secrets.is_configured(c.provider))
        .map(|c| {
            let p = c.provider;
            let url = match (c.signs_url, catalog.url(p)) {
                (true, Some(url)) => url.to_string(),
                (true, None) => format!("{}_WEBHOOK_URL (not set; it is signed)", p.env_prefix()),
                (false, _) => format!("{base}/webhooks/{p}"),
            };
            json!({
                "provider": p.as_str(), "url": url, "secrets": secrets.count(p),
                "secret_fingerprints": secrets.fingerprints(p), "contract": c.contract,
                "signature": c.signature, "unsigned_identity": c.unsigned_identity, "redelivery_days": c.redelivery_days,
            })
        })
        .collect();
    if out.json {
        print_json(&json!(rows));
        return Ok(());
    }
    if rows.is_empty() {
        say!(
            "no provider has a secret here (`inbox dev` would use its development secrets; --all lists every provider)"
        );
        return Ok(());
    }
    let cell = |r: &Value, k: &str| match &r[k] {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    };
    let keys = ["provider", "url", "secrets", "contract", "signature", "unsigned_identity", "redelivery_days"];
    let table: Vec<Vec<String>> = rows.iter().map(|r| keys.iter().map(|k| cell(r, k)).collect()).collect();
    let head = ["provider", "url", "secrets", "contract", "signature header", "id or type unsigned", "redelivery days"];
    print_table(&head, &table);
    Ok(())
}

/// Whether the stored bytes still verify against the secrets configured now.
fn reverify(env: &Env<'_>, event: &ops::StoredEvent) -> String {
    match Catalog::read(env).and_then(|c| Secrets::read(env, &c).map(|s| (c, s))) {
        Ok((catalog, secrets)) => ops::verification(event, &catalog, &secrets).to_string(),
        Err(e) => format!("not checked: {e}"),
    }
}

pub async fn replay(pool: &PgPool, provider: &str, event_id: &str, by: &Audit<'_>, out: &Output) -> Result<()> {
    let replayed = ops::replay(pool, provider, event_id, by).await?;
    let from = match &replayed {
        Replayed::NotFound => bail!("no event {event_id:?} from provider {provider:?}"),
        Replayed::AlreadyPending => bail!("{provider} {event_id} is already pending: nothing to replay"),
        Replayed::WithoutPayload => bail!(
            "{provider} {event_id} was stored without a payload (its body was never usable; see its failure reason): no handler could take it"
        ),
        Replayed::Erased { at, by } => {
            bail!("{provider} {event_id} was erased on {at} by {by}: nothing is left to process")
        }
        Replayed::Requeued { from } => from,
    };
    if out.json {
        print_json(&json!({"provider": provider, "event_id": event_id, "requeued_from": from}));
    } else {
        say!("{provider} {event_id}: {from} -> pending, attempts reset (audited as {:?} by {})", by.reason, by.actor);
    }
    Ok(())
}

/// A provider as typed (`Stripe`, ` stripe `): its name, lower-cased, so that
/// it matches the stored rows; a name no provider can have is refused.
pub fn provider_name(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    Provider::try_from(name.as_str())
        .map(|p| p.as_str().to_string())
        .map_err(|_| "is not a provider name (letters, digits, - and _; `inbox providers --all` lists them)".into())
}

/// `--status` of `events`: any status.
pub fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| "one of pending, done, unhandled, ignored, failed".into())
}

/// `--after`: a cursor a page of `events` ended with.
pub fn parse_cursor(text: &str) -> Result<Cursor, String> {
    Cursor::parse(text.trim()).map_err(|e| format!("{e} (copy it from the end of the page before)"))
}

pub async fn events(pool: &PgPool, query: &EventQuery, after: Option<&Cursor>, limit: i64, out: &Output) -> Result<()> {
    check_times(pool, &query.since, &query.until).await?;
    let page = ops::list_events(pool, query, after, limit).await?;
    let next = page.next.as_ref().map(Cursor::to_string);
    if out.json {
        print_json(&json!({ "events": page.events, "next": next }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .events
        .iter()
        .map(|e| {
            vec![
                e.provider.clone(),
                e.event_id.clone(),
                e.event_type.clone(),
                e.status.clone(),
                e.attempts.to_string(),
                e.received_at.clone(),
                e.failure_reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(&["provider", "event_id", "type", "status", "attempts", "received", "reason"], &rows);
    match next {
        Some(next) => say!("{} shown; the next page: --after {next}", page.events.len()),
        None => say!("{} shown; no more", page.events.len()),
    }
    Ok(())
}

/// `--status`: the statuses `requeue` takes (never `pending`: those are queued already).
pub fn parse_requeue_status(text: &str) -> Result<Status, String> {
    match Status::parse(text) {
        Some(Status::Pending) => Err("pending events are queued already".into()),
        Some(status) => Ok(status),
        None => Err("one of unhandled, ignored, failed, done".into()),
    }
}

pub async fn requeue(pool: &PgPool, filter: &Filter, by: &Audit<'_>, dry_run: bool, out: &Output) -> Result<()> {
    check_times(pool, &filter.since, &filter.until).await?;
    let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    let what = format!("{} event(s)", statuses.join(" or "));
    if dry_run {
        let found = ops::count_matching(pool, filter).await?;
        if out.json {
            print_json(
                &json!({"matching": found.matching, "without_payload": found.without_payload, "requeued": 0, "dry_run": true}),
            );
        } else {
            say!(
                "{} {what} match, {} of them without a payload (skipped); nothing changed (--dry-run)",
                found.matching,
                found.without_payload
            );
        }
        return Ok(());
    }
    let bar = progress(0, "requeued", out);
    let done = ops::requeue_all(pool, filter, by, BATCH, |so_far| {
        bar.set_length((so_far.matching - so_far.without_payload).max(0) as u64);
        bar.set_position(so_far.requeued);
        ControlFlow::Continue(())
    })
    .await?;
    bar.finish_and_clear();
    if out.json {
        let mut report = serde_json::to_value(done)?;
        report["dry_run"] = false.into();
        print_json(&report);
    } else {
        say!("{} {what} back to pending, attempts reset (audited as {:?} by {})", done.requeued, by.reason, by.actor);
        if done.held > 0 {
            say!(
                "{} left where they were: another transaction held them (a worker, prune) or they changed meanwhile; run the same requeue again",
                done.held
            );
        }
        if done.without_payload > 0 {
            say!(
                "{} skipped: without a payload (their body was never usable, or they were erased; `inbox show` says which)",
                done.without_payload
            );
        }
    }
    Ok(())
}

pub fn progress(len: u64, done: &str, out: &Output) -> indicatif::ProgressBar {
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

pub fn age(ms: f64) -> String {
    match ms {
        ms if ms <= 0.0 => "-".into(),
        ms if ms < 120_000.0 => format!("{:.0} s", ms / 1000.0),
        ms if ms < 7_200_000.0 => format!("{:.0} min", ms / 60_000.0),
        ms => format!("{:.1} h", ms / 3_600_000.0),
    }
}

pub fn print_json(v: &Value) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{}", ops::escape_json(&serde_json::to_string_pretty(v).expect("JSON prints")));
}

/// Left-aligned columns, each as wide as its widest cell (cells are cut at 80 characters).
pub fn print_table(head: &[&str], rows: &[Vec<String>]) {
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
