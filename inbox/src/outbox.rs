//! `inbox outbox`: messages waiting (or dead), a retry, and the relay's
//! destinations (list, pause, resume).

use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::ops::{self, Audit};

use crate::cli::{age, operator, print_json, print_table, Output, BATCH};

#[derive(Subcommand, Debug)]
pub(crate) enum OutboxCommand {
    /// Give a message (or every dead one) a fresh start: due now, attempts reset.
    Retry {
        /// The message's id (see `inbox outbox`).
        id: Option<i64>,
        /// Every dead message instead of one.
        #[arg(long, conflicts_with = "id")]
        dead: bool,
        /// Why, for the audit record.
        #[arg(long, default_value = "retried by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
    },
    /// Every destination: what it sends to, its state (running, paused, open,
    /// unconfigured), its backlog and its dead messages.
    Destinations,
    /// Pause a destination: every relay stops sending to it within a second;
    /// its messages wait (none dropped, none spending an attempt) until `resume`.
    Pause {
        /// The destination's name.
        name: String,
        /// Why, for the audit record.
        #[arg(long, value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
    },
    /// Resume a paused destination: its messages go, in order.
    Resume {
        /// The destination's name.
        name: String,
        /// Why, for the audit record.
        #[arg(long, default_value = "resumed by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
    },
}

/// `inbox outbox [COMMAND]`, as the operator (`INBOX_OPERATOR`) for what it acts on.
pub(crate) async fn act(
    pool: &PgPool,
    command: Option<OutboxCommand>,
    dead: bool,
    limit: i64,
    out: &Output,
) -> Result<()> {
    let actor = operator(&webhook_inbox::config::Env::process());
    match command {
        None => list(pool, dead, limit.max(1), out).await,
        Some(OutboxCommand::Retry { id, dead, reason }) => {
            let by = Audit { actor: &actor, action: "retry_outbox", reason: &reason };
            retry(pool, id, dead, &by, out).await
        }
        Some(OutboxCommand::Destinations) => destinations(pool, out).await,
        Some(OutboxCommand::Pause { name, reason }) => {
            let by = Audit { actor: &actor, action: "pause_destination", reason: &reason };
            set_paused(pool, &name, true, &by, out).await
        }
        Some(OutboxCommand::Resume { name, reason }) => {
            let by = Audit { actor: &actor, action: "resume_destination", reason: &reason };
            set_paused(pool, &name, false, &by, out).await
        }
    }
}

async fn list(pool: &PgPool, dead: bool, limit: i64, out: &Output) -> Result<()> {
    let messages = ops::list_unsent(pool, dead, limit).await?;
    if out.json {
        print_json(&json!(messages));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.message_key.clone(),
                m.destination.clone(),
                m.attempts.to_string(),
                m.created_at.clone(),
                m.dead_at.clone().or_else(|| m.next_attempt_at.clone()).unwrap_or_else(|| "due".into()),
                m.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let when = if dead { "dead at" } else { "next attempt" };
    print_table(&["id", "message_key", "destination", "attempts", "created", when, "last error"], &rows);
    say!("{} {} shown (--limit {limit})", messages.len(), if dead { "dead" } else { "waiting" });
    Ok(())
}

async fn retry(pool: &PgPool, id: Option<i64>, dead: bool, by: &Audit<'_>, out: &Output) -> Result<()> {
    let retried = match (id, dead) {
        (Some(id), _) => {
            if !ops::retry_message(pool, id, by).await? {
                bail!("no unsent outbox message with id {id}");
            }
            1
        }
        (None, true) => {
            let mut total = 0;
            loop {
                let n = ops::retry_dead(pool, BATCH, by).await?;
                total += n;
                if n < BATCH as u64 {
                    break total;
                }
            }
        }
        (None, false) => bail!("name a message id, or --dead for every dead message"),
    };
    if out.json {
        print_json(&json!({"retried": retried}));
    } else {
        say!("{retried} outbox message(s) due now, attempts reset");
    }
    Ok(())
}

async fn destinations(pool: &PgPool, out: &Output) -> Result<()> {
    let destinations = ops::destinations(pool).await?;
    if out.json {
        print_json(&json!(destinations));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = destinations
        .iter()
        .map(|d| {
            vec![
                d.name.clone(),
                d.state().into(),
                d.target.clone().unwrap_or_default(),
                d.backlog.to_string(),
                age(d.oldest_backlog_ms),
                d.dead.to_string(),
                d.why(),
            ]
        })
        .collect();
    print_table(&["destination", "state", "sends to", "backlog", "oldest", "dead", "why"], &rows);
    Ok(())
}

/// Destinations are named as the destinations file names them.
fn destination_name(name: &str) -> Result<&str> {
    if !ops::is_destination_name(name) {
        bail!("{} is not a destination's name (1 to 64 of a-z, 0-9, _ and -)", ops::escape(name));
    }
    Ok(name)
}

async fn set_paused(pool: &PgPool, name: &str, pause: bool, by: &Audit<'_>, out: &Output) -> Result<()> {
    let name = destination_name(name)?;
    let changed = if pause {
        ops::pause_destination(pool, name, by).await?
    } else {
        ops::resume_destination(pool, name, by).await?
    };
    let (now, was) = if pause { ("paused", "paused already") } else { ("resumed", "not paused") };
    if out.json {
        print_json(&json!({"destination": name, "changed": changed}));
    } else if changed {
        say!("{name} {now}: every relay sees it within a second");
    } else {
        say!("{name} was {was}: nothing changed");
    }
    Ok(())
}
