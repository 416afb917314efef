//! Alerts with a lifecycle: the `[[alert]]` entries of the rules file
//! ([`AlertRules`]) are evaluated once a minute wherever the stages run (the
//! `process` function's schedule, `inbox serve`'s process role, `inbox
//! dev`). A condition that holds opens **one** alert per scope (a provider, a
//! destination, a pause), updated while it holds; once it has cleared for the
//! rule's `resolve_after`, the alert is resolved, and a new one opens if the
//! condition comes back. Notifications (opened; a reminder while open and not
//! acknowledged; resolved) are outbox messages written in the transaction
//! that changes the alert, one per channel under a stable key: the relay
//! delivers each at least once and a consumer sees it once.

mod rules;
mod store;

use std::time::Duration;

use serde_json::json;
use sqlx::{PgConnection, PgPool};

pub use rules::{parse_duration, AlertRule, AlertRules, Channel, Condition, Format};
pub use store::{acknowledge, get, list, Alert};

use crate::db::{
    self,
    inbox::Audit,
    outbox::{enqueue, Message},
};

/// At most one evaluation this often, whichever process runs it.
pub const EVERY: Duration = Duration::from_secs(60);

/// What an evaluation did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Evaluated {
    /// False when another process evaluated less than a minute ago (or is evaluating now): nothing was read.
    pub ran: bool,
    /// Alerts opened.
    pub opened: usize,
    /// Alerts resolved (their condition cleared for `resolve_after`).
    pub resolved: usize,
    /// Reminders sent.
    pub reminded: usize,
    /// Alerts live (open or acknowledged) after it.
    pub live: usize,
    /// Notifications written to the outbox.
    pub notifications: usize,
}

/// How a notification is about its alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Opened,
    Reminder,
    Resolved,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Opened => "opened",
            Kind::Reminder => "reminder",
            Kind::Resolved => "resolved",
        }
    }
}

/// A duration in words: `90 s`, `5 min`, `2 h`, `1 d`.
fn words(d: Duration) -> String {
    match d.as_secs() {
        s if s % 86_400 == 0 && s > 0 => format!("{} d", s / 86_400),
        s if s % 3600 == 0 && s > 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

impl AlertRules {
    /// Evaluates the rules now, if no other process did in the last `every`
    /// ([`EVERY`] on a schedule; zero to evaluate now, as `inbox alerts
    /// evaluate` does): one transaction, which opens, updates, resolves and
    /// reminds, and writes the notifications with them.
    pub async fn evaluate(&self, pool: &PgPool, every: Duration) -> Result<Evaluated, sqlx::Error> {
        let mut tx = pool.begin().await?;
        if !store::begin_run(&mut tx, every).await? {
            return Ok(Evaluated::default());
        }
        let mut done = Evaluated { ran: true, ..Evaluated::default() };
        let live = store::live(&mut tx).await?;
        for rule in self.rules() {
            let holding = store::measure(&mut tx, rule).await?;
            for m in &holding {
                match live.iter().find(|a| a.rule == rule.name && a.scope == m.scope) {
                    Some(alert) => store::holds(&mut tx, alert.id, m).await?,
                    None => {
                        let alert = store::open(&mut tx, rule, m).await?;
                        done.opened += 1;
                        done.notifications += notify(&mut tx, &alert, Kind::Opened, 0).await?;
                    }
                }
            }
            for alert in live.iter().filter(|a| a.rule == rule.name) {
                if holding.iter().any(|m| m.scope == alert.scope) {
                    if let Some(every) = rule.remind_every {
                        if let Some(alert) = store::remind(&mut tx, alert.id, every).await? {
                            done.reminded += 1;
                            done.notifications += notify(&mut tx, &alert, Kind::Reminder, alert.reminders).await?;
                        }
                    }
                } else if store::cleared(&mut tx, alert.id).await? >= rule.resolve_after.as_secs_f64() {
                    if let Some(alert) = store::resolve(&mut tx, alert.id, "inbox").await? {
                        done.resolved += 1;
                        done.notifications += notify(&mut tx, &alert, Kind::Resolved, 0).await?;
                    }
                }
            }
        }
        // An alert whose rule this file does not have is left as it is: another
        // process may run another file (a deploy under way, `inbox alerts
        // evaluate` with rules of its own); `inbox alerts resolve` ends it.
        done.live = live.len() + done.opened - done.resolved;
        tx.commit().await?;
        Ok(done)
    }
}

/// Evaluates `rules` (if any) at most once a minute ([`EVERY`]), adding
/// `alerts_opened`, `alerts_resolved`, `alerts_reminded` and the gauge
/// `alerts_live` to `metrics` when it ran, `alerts_failed` (and an error in
/// the log) when it could not.
pub async fn evaluate_counted(rules: &AlertRules, pool: &PgPool, metrics: &mut crate::runtime::metrics::Metrics) {
    if rules.is_empty() {
        return;
    }
    match rules.evaluate(pool, EVERY).await {
        Ok(e) if e.ran => {
            metrics
                .count("alerts_opened", e.opened as u64)
                .count("alerts_resolved", e.resolved as u64)
                .count("alerts_reminded", e.reminded as u64)
                .gauge("alerts_live", e.live as f64);
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "alerts not evaluated");
            metrics.count("alerts_failed", 1);
        }
    }
}

/// Resolves a live alert by hand, with an audit record and its resolved
/// notification; false when it was not live. If its condition still holds,
/// the next evaluation opens a new one.
pub async fn resolve(pool: &PgPool, id: i64, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let before: Option<String> = db::query_scalar("SELECT state FROM inbox_alerts WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(alert) = store::resolve(&mut tx, id, by.actor).await? else {
        return Ok(false);
    };
    store::audit(&mut tx, &alert, before.as_deref().unwrap_or("open"), by).await?;
    notify(&mut tx, &alert, Kind::Resolved, 0).await?;
    tx.commit().await?;
    Ok(true)
}

/// Writes `alert`'s notification to each of its channels; how many were new.
async fn notify(conn: &mut PgConnection, alert: &Alert, kind: Kind, n: i32) -> Result<usize, sqlx::Error> {
    let id = alert.id.to_string();
    let mut written = 0;
    for channel in alert.channels.0.iter() {
        let key = match kind {
            Kind::Reminder => format!("alert:{id}:reminder:{n}:{}", channel.destination),
            _ => format!("alert:{id}:{}:{}", kind.as_str(), channel.destination),
        };
        let payload = match channel.format {
            Format::Slack => slack(alert, kind),
            Format::Json => json!({"type": format!("alert.{}", kind.as_str()), "alert": alert}),
        };
        let message = Message::new("alert", &id, key, payload).to(&channel.destination);
        written += usize::from(enqueue(conn, &message).await?);
    }
    Ok(written)
}

/// A Slack message: `{"text": ...}`, with `&`, `<` and `>` escaped as Slack's
/// mrkdwn wants, and the summary (which may quote a destination's answer, a
/// stranger's text) in a code span: it links, mentions and formats nothing.
fn slack(alert: &Alert, kind: Kind) -> serde_json::Value {
    use webhook_inbox_schemes::text::short_time;
    let esc = |t: &str| {
        webhook_inbox_schemes::text::escape(t).replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
    };
    let (mark, what) = match kind {
        Kind::Opened => (":rotating_light:", "opened"),
        Kind::Reminder => (":bell:", "still open"),
        Kind::Resolved => (":white_check_mark:", "resolved"),
    };
    let ack = match kind {
        Kind::Resolved => format!(
            "Open since {}; resolved by {}.",
            short_time(&alert.first_seen),
            esc(alert.resolved_by.as_deref().unwrap_or("inbox"))
        ),
        _ => format!("Since {}. `inbox alerts ack {}` stops the reminders.", short_time(&alert.first_seen), alert.id),
    };
    // A code span ends at the next backtick: none is left in it.
    let summary = esc(&alert.summary).replace('`', "'");
    json!({"text": format!("{mark} *{}* {what} (alert #{}): `{summary}`. {ack}", esc(&alert.rule), alert.id)})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination's answer quoted in a circuit's summary: in Slack it links,
    /// mentions and formats nothing.
    #[test]
    fn a_stranger_s_text_in_a_summary_reaches_slack_inert() {
        let alert = Alert {
            id: 7,
            rule: "circuit".into(),
            condition: "circuit_open".into(),
            scope: "billing".into(),
            state: "open".into(),
            first_seen: "2026-12-06 10:00:00+00".into(),
            last_seen: "2026-12-06 10:00:00+00".into(),
            seen: 1,
            value: 1.0,
            peak: 1.0,
            summary: "the circuit of billing is open: HTTP 400: <https://evil.example|click> <!here> *now* `x` _y_"
                .into(),
            cleared_at: None,
            reminders: 0,
            acknowledged_at: None,
            acknowledged_by: None,
            resolved_at: None,
            resolved_by: None,
            channels: sqlx::types::Json(vec![]),
        };
        let text = slack(&alert, Kind::Opened)["text"].as_str().unwrap().to_string();
        let quoted = text.split_once(": `").unwrap().1.rsplit_once("`. ").unwrap().0;
        assert!(!quoted.contains(['`', '<', '>']), "{text}");
        assert!(quoted.contains("&lt;https://evil.example|click&gt; &lt;!here&gt; *now* 'x' _y_"), "{text}");
    }
}
