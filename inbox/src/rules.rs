//! `inbox rules check`: an ignore rules file checked, and tried on the stored events.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use sqlx::PgPool;
use webhook_inbox::{config::IgnoreRules, ops};

use crate::cli::{age, ago, print_json, print_table, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum RulesCommand {
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

/// `inbox rules check`: the file refused with its reason, or each rule's matches.
pub(crate) async fn check(pool: &PgPool, file: &std::path::Path, since: Option<Duration>, out: &Output) -> Result<()> {
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
