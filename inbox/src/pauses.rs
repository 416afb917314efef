//! `inbox pause`, `inbox resume`, `inbox pauses`: processing paused by
//! provider, or by provider and event type, and resumed in receive order.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::ops::{self, Audit, PauseScope, Released};

use crate::cli::{age, print_json, print_table, Output};

/// What `pause` and `resume` name.
#[derive(Args, Debug)]
pub(crate) struct ScopeArgs {
    /// The provider whose events wait.
    #[arg(long, value_parser = crate::cli::provider_name)]
    pub provider: String,
    /// Only its events of exactly this type (e.g. orders/paid); every type when absent.
    #[arg(long = "type")]
    pub event_type: Option<String>,
}

impl ScopeArgs {
    fn scope(&self) -> Result<PauseScope> {
        PauseScope::new(&self.provider, self.event_type.as_deref()).map_err(anyhow::Error::msg)
    }
}

/// `inbox pause`: from its commit no event of the scope is processed.
pub(crate) async fn pause(
    pool: &PgPool,
    scope: &ScopeArgs,
    alarm_after: Duration,
    by: &Audit<'_>,
    out: &Output,
) -> Result<()> {
    let scope = scope.scope()?;
    let paused = ops::pause_events(pool, &scope, alarm_after, by).await?;
    let now = ops::pauses(pool).await?.into_iter().find(|p| p.scope() == scope);
    if out.json {
        print_json(&json!({"scope": scope, "paused": paused, "pause": now}));
    } else if paused {
        say!(
            "{scope} paused: its events are still received (200) and wait, pending, spending no attempt; \
             `inbox resume --provider {}{}` processes them in receive order. Alarm (PauseOverdue) after {}.",
            scope.provider,
            scope.event_type.as_ref().map(|t| format!(" --type '{t}'")).unwrap_or_default(),
            age(alarm_after.as_millis() as f64)
        );
    } else if let Some(p) = now {
        say!("{scope} was paused already, by {} since {}: {} (nothing changed)", p.paused_by, p.paused_at, p.reason);
    }
    Ok(())
}

/// `inbox resume`: releases the held events, oldest first, printing progress;
/// with `no_wait`, leaves that to the workers' passes.
pub(crate) async fn resume(
    pool: &PgPool,
    scope: &ScopeArgs,
    no_wait: bool,
    by: &Audit<'_>,
    out: &Output,
) -> Result<()> {
    let scope = scope.scope()?;
    let Some(id) = ops::resume_events(pool, &scope, by).await? else {
        if out.json {
            print_json(&json!({"scope": scope, "resumed": false}));
            return Ok(());
        }
        bail!("{scope} is not paused (`inbox pauses` lists what is)");
    };
    let held = ops::pauses(pool).await?.into_iter().find(|p| p.id == id).map_or(0, |p| p.held);
    if no_wait {
        if out.json {
            print_json(&json!({"scope": scope, "resumed": true, "held": held, "released": 0}));
        } else {
            say!("{scope} resuming: the workers release its {held} held events, oldest first, on their next passes");
        }
        return Ok(());
    }
    let bar = crate::cli::progress(held.max(0) as u64, "released", out);
    let mut released = 0;
    loop {
        match ops::release(pool, id, ops::RELEASE_CHUNK).await? {
            Released::Some(n) => released += n,
            Released::Resumed(n) => {
                released += n;
                break;
            }
            // A worker releases a chunk now: wait for it.
            Released::Busy => tokio::time::sleep(Duration::from_millis(100)).await,
            // A worker released the last of them (or it was paused again).
            Released::NotResuming => break,
        }
        bar.set_position(released);
    }
    bar.finish_and_clear();
    let still = ops::pauses(pool).await?.into_iter().find(|p| p.id == id);
    if out.json {
        print_json(&json!({"scope": scope, "resumed": still.is_none(), "released": released}));
    } else if let Some(p) = still {
        say!("{scope} was paused again by {} while it resumed: {}", p.paused_by, p.reason);
    } else {
        say!("{scope} resumed: {released} held events released here, in receive order; new events are processed again");
    }
    Ok(())
}

/// `inbox pauses`: what is paused, since when, by whom, why, and what each holds.
pub(crate) async fn list(pool: &PgPool, history: Option<&str>, out: &Output) -> Result<()> {
    if let Some(provider) = history {
        let records = ops::pause_history(pool, provider).await?;
        if out.json {
            print_json(&json!(records));
            return Ok(());
        }
        let rows: Vec<Vec<String>> =
            records.iter().map(|r| vec![r.at.clone(), r.action.clone(), r.actor.clone(), r.reason.clone()]).collect();
        print_table(&["at", "action", "by", "why"], &rows);
        return Ok(());
    }
    let pauses = ops::pauses(pool).await?;
    if out.json {
        print_json(&json!(pauses));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = pauses
        .iter()
        .map(|p| {
            let state = match (p.state(), p.overdue()) {
                ("resuming", _) => format!("resuming ({} released)", p.released),
                (_, true) => "paused, OVERDUE".into(),
                (state, false) => state.into(),
            };
            vec![
                p.provider.clone(),
                p.event_type.clone().unwrap_or_else(|| "*".into()),
                state,
                p.held.to_string(),
                age(p.age_ms),
                p.paused_by.clone(),
                p.reason.clone(),
            ]
        })
        .collect();
    print_table(&["provider", "type", "state", "held", "for", "by", "why"], &rows);
    Ok(())
}
