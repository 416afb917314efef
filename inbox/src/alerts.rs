//! `inbox alerts`: the alerts (`[[alert]]` in INBOX_RULES_FILE), open and
//! acknowledged, or resolved too; acknowledge, resolve, evaluate now.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::{
    alerts::{self, AlertRules},
    ops::Audit,
};

use crate::cli::{print_json, print_table, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum AlertsCommand {
    /// Acknowledge an open alert: no more reminders; it still resolves when its condition clears.
    Ack {
        id: i64,
        /// Why, for the audit record.
        #[arg(long, default_value = "acknowledged by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
    },
    /// Resolve an alert now (its resolved notification goes out); if its condition still holds, the next
    /// evaluation opens a new one.
    Resolve {
        id: i64,
        /// Why, for the audit record.
        #[arg(long, default_value = "resolved by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
    },
    /// Evaluate the alerts of INBOX_RULES_FILE (or INBOX_RULES) now, as the process schedule does every minute.
    Evaluate,
}

/// `inbox alerts`: live alerts (with `resolved`, the latest resolved ones too), newest first.
pub(crate) async fn list(pool: &PgPool, resolved: bool, out: &Output) -> Result<()> {
    let alerts = alerts::list(pool, resolved, 100).await?;
    if out.json {
        print_json(&json!(alerts));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = alerts
        .iter()
        .map(|a| {
            let since = match (&a.resolved_at, &a.cleared_at) {
                (Some(at), _) => format!("{} to {at}", a.first_seen),
                (None, Some(cleared)) => format!("{} (clear since {cleared})", a.first_seen),
                (None, None) => a.first_seen.clone(),
            };
            let by = a.acknowledged_by.as_deref().or(a.resolved_by.as_deref()).unwrap_or("");
            vec![
                a.id.to_string(),
                a.state.clone(),
                a.rule.clone(),
                a.scope.clone(),
                since,
                by.into(),
                a.summary.clone(),
            ]
        })
        .collect();
    print_table(&["#", "state", "alert", "scope", "since", "by", "what"], &rows);
    Ok(())
}

pub(crate) async fn act(pool: &PgPool, command: AlertsCommand, actor: &str, out: &Output) -> Result<()> {
    match command {
        AlertsCommand::Ack { id, reason } => {
            let by = Audit { actor, action: "acknowledge_alert", reason: &reason };
            if !alerts::acknowledge(pool, id, &by).await? {
                bail!("alert #{id} is not open (`inbox alerts --resolved` lists them all)");
            }
            done(out, id, "acknowledged: no more reminders; it resolves when its condition clears")
        }
        AlertsCommand::Resolve { id, reason } => {
            let by = Audit { actor, action: "resolve_alert", reason: &reason };
            if !alerts::resolve(pool, id, &by).await? {
                bail!("alert #{id} is not open or acknowledged (`inbox alerts --resolved` lists them all)");
            }
            done(out, id, "resolved; its notification goes out with the relay's next pass")
        }
        AlertsCommand::Evaluate => {
            // The file's [[alert]] entries, or the defaults when it declares none.
            let rules = AlertRules::read(&webhook_inbox::config::Env::resolved().await?)?;
            let e = rules.evaluate(pool, Duration::ZERO).await?;
            if out.json {
                print_json(&json!(e));
            } else if !e.ran {
                say!("another process is evaluating the alerts now: nothing done");
            } else {
                say!(
                    "{} alert(s) opened, {} resolved, {} reminded; {} live; {} notification(s) written to the outbox",
                    e.opened,
                    e.resolved,
                    e.reminded,
                    e.live,
                    e.notifications
                );
            }
            Ok(())
        }
    }
}

fn done(out: &Output, id: i64, what: &str) -> Result<()> {
    if out.json {
        print_json(&json!({"alert": id, "done": true}));
    } else {
        say!("alert #{id} {what}");
    }
    Ok(())
}
