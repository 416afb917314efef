//! What the inbox holds: `inbox stats`, `providers`, `events`, `failed` and
//! `show`. Each prints a table for people, or JSON with `--json` for scripts.

use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::{Catalog, Env, Secrets},
    ops::{self, rfc3339, Cursor, EventQuery, Filter, Status},
    Provider,
};

use crate::cli::{age, check_times, print_json, print_table, Output};

pub(crate) async fn stats(pool: &PgPool, env: &Env<'_>, out: &Output) -> Result<()> {
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
    if configured.is_some() && secrets.iter().any(|s| s.secret_fingerprint.is_some() && position(s).is_none()) {
        say!(
            "(\"not configured here\": this shell's environment has no such secret; `inbox dev` makes its \
             development secrets for itself, and prints them at start: export those here to match them)"
        );
    }
    Ok(())
}

/// `inbox providers`: each provider with a secret (every known one with `all`),
/// the URL to register with it, how it signs, and how long it may redeliver.
pub(crate) fn providers(env: &Env<'_>, base_url: &str, all: bool, out: &Output) -> Result<()> {
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

pub(crate) async fn events(
    pool: &PgPool,
    query: &EventQuery,
    after: Option<&Cursor>,
    limit: i64,
    out: &Output,
) -> Result<()> {
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

pub(crate) async fn failed(pool: &PgPool, filter: &Filter, limit: i64, out: &Output) -> Result<()> {
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

pub(crate) async fn show(pool: &PgPool, env: &Env<'_>, provider: &str, event_id: &str, out: &Output) -> Result<()> {
    let Some(event) = ops::stored_event(pool, provider, event_id).await? else {
        bail!("no event {event_id:?} from provider {provider:?}");
    };
    let history = ops::history(pool, provider, event_id).await?;
    let messages = ops::event_messages(pool, provider, event_id).await?;
    let verification = reverify(env, &event);
    if out.json {
        print_json(&json!({
            "provider": event.provider, "event_id": event.event_id, "event_type": event.event_type,
            "status": event.status.as_str(), "source": event.source, "attempts": event.attempts,
            "received_at": rfc3339(event.received_at), "processed_at": event.processed_at.map(rfc3339),
            "next_attempt_at": event.next_attempt_at.map(rfc3339), "failure_reason": event.failure_reason,
            "secret_index": event.secret_index, "secret_fingerprint": event.secret_fingerprint,
            "headers": event.headers.0, "payload": event.payload.map(|p| p.0),
            "raw_body_bytes": event.raw_body.len(), "verification": verification, "history": history,
            "outbox": messages, "held_by_pause": event.held_by, "erased_at": event.erased_at.map(rfc3339),
            "erased_by": event.erased_by, "restored_at": event.restored_at.map(rfc3339),
            "raw_erased_at": event.raw_erased_at.map(rfc3339),
        }));
        return Ok(());
    }
    say!("{} {} ({}), {}, from {}", event.provider, event.event_id, event.event_type, event.status, event.source);
    let time = |t: Option<SystemTime>| t.map_or_else(|| "-".to_string(), rfc3339);
    say!("received {}; processed {}", rfc3339(event.received_at), time(event.processed_at));
    say!("attempts {}; next attempt {}", event.attempts, time(event.next_attempt_at));
    if let Some(at) = event.erased_at.map(rfc3339) {
        say!(
            "erased on {at} by {}: its payload, raw bytes and headers are gone; a redelivery is still a duplicate",
            event.erased_by.as_deref().unwrap_or("?")
        );
    }
    if let Some(at) = event.raw_erased_at.map(rfc3339) {
        say!("its raw bytes were erased on {at} with another event of its batch (the batch's body held that one's data); its payload stays");
    }
    if let Some(at) = event.restored_at.map(rfc3339) {
        say!("restored from prune's archive on {at} (`inbox restore`)");
    }
    if event.held_by.is_some() {
        say!("held by a pause: it waits, spending no attempt, until `inbox resume` (`inbox pauses` lists the pauses)");
    }
    match &event.failure_reason {
        Some(reason) if event.status == Status::Ignored => say!(
            "{reason}; to run it after all: inbox requeue --status ignored --provider {} --type {:?}",
            event.provider,
            event.event_type
        ),
        Some(reason) => say!("failure: {reason}"),
        None => {}
    }
    if event.status == Status::Unhandled {
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

/// Whether the stored bytes still verify against the secrets configured now.
fn reverify(env: &Env<'_>, event: &ops::StoredEvent) -> String {
    match Catalog::read(env).and_then(|c| Secrets::read(env, &c).map(|s| (c, s))) {
        Ok((catalog, secrets)) => ops::verification(event, &catalog, &secrets).to_string(),
        Err(e) => format!("not checked: {e}"),
    }
}
