//! The `[[alert]]` entries of the rules file (`INBOX_RULES_FILE`, beside its
//! `[[ignore]]` entries): what to watch, how much is too much, for how long,
//! and where to say so.
//!
//! ```toml
//! [[alert]]
//! condition = "failed"                 # failed, rejected_signatures, oldest_pending, dead_outbox,
//!                                      # circuit_open, pause_overdue
//! provider = "stripe"                  # failed, rejected_signatures: this provider only (else each on its own)
//! threshold = 10                       # failed 10, rejected_signatures 5, dead_outbox 1
//! window = "5m"                        # failed, rejected_signatures: 5m
//! older_than = "15m"                   # oldest_pending: 15m
//! resolve_after = "5m"                 # cleared this long, then resolved: 5m
//! remind_every = "1h"                  # while open and not acknowledged: 1h ("never": none)
//! notify = [{ destination = "ops-slack", format = "slack" }, { destination = "oncall" }]
//! ```

use std::{collections::HashSet, time::Duration};

use serde::Deserialize;

use webhook_inbox_schemes::{text::escape, Provider};

/// What an alert watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Events of a provider that failed within the window, at least the threshold.
    Failed,
    /// Deliveries to a provider rejected (signature or timestamp) within the window, at least the threshold.
    RejectedSignatures,
    /// The oldest pending event the worker may take (held ones aside) is older than `older_than`.
    OldestPending,
    /// Dead outbox messages of a destination, at least the threshold.
    DeadOutbox,
    /// A destination's circuit is open.
    CircuitOpen,
    /// A pause is older than its `--alarm-after`.
    PauseOverdue,
}

impl Condition {
    /// Its name in the file and in `inbox_alerts.condition`.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Failed => "failed",
            Condition::RejectedSignatures => "rejected_signatures",
            Condition::OldestPending => "oldest_pending",
            Condition::DeadOutbox => "dead_outbox",
            Condition::CircuitOpen => "circuit_open",
            Condition::PauseOverdue => "pause_overdue",
        }
    }
}

/// How a channel's notifications are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `{"text": ...}`: a Slack incoming webhook's (and Mattermost's, Discord's `/slack`) shape.
    Slack,
    /// `{"type": "alert.opened", "alert": {...}}`, signed as Standard Webhooks when its destination signs.
    #[default]
    Json,
}

/// Where an alert's notifications go: a relay destination (`RELAY_DESTINATIONS_FILE`), in a format.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Channel {
    /// The relay destination's name.
    pub destination: String,
    /// The message's shape.
    #[serde(default)]
    pub format: Format,
}

/// One `[[alert]]` entry, checked, its defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertRule {
    /// Its name (unique in the file): `condition`, or `condition provider`, unless given.
    pub name: String,
    /// What it watches.
    pub condition: Condition,
    /// For `failed` and `rejected_signatures`: this provider only.
    pub provider: Option<Provider>,
    /// How many (failed, rejected_signatures, dead_outbox) make it hold.
    pub threshold: i64,
    /// Over how long (failed, rejected_signatures).
    pub window: Duration,
    /// How old (oldest_pending).
    pub older_than: Duration,
    /// Cleared this long, it is resolved.
    pub resolve_after: Duration,
    /// While open and not acknowledged, a reminder this often (none: never).
    pub remind_every: Option<Duration>,
    /// Where its notifications go.
    pub notify: Vec<Channel>,
}

/// The alert rules of one file, in its order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlertRules {
    alerts: Vec<AlertRule>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    alert: Vec<AlertEntry>,
    // The [[ignore]] entries are the worker's (crate::core::rules::IgnoreRules).
    #[serde(default, rename = "ignore")]
    _ignore: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertEntry {
    name: Option<String>,
    condition: Condition,
    provider: Option<String>,
    threshold: Option<i64>,
    window: Option<String>,
    older_than: Option<String>,
    resolve_after: Option<String>,
    remind_every: Option<String>,
    #[serde(default)]
    notify: Vec<Channel>,
}

/// `30s`, `5m`, `2h`, `1d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{:?} is not a duration (30s, 5m, 2h, 1d)", escape(text));
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let n: u64 = text[..split].parse().map_err(|_| bad())?;
    let unit = match &text[split..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit).filter(|s| *s <= 366 * 86_400).map(Duration::from_secs).ok_or_else(bad)
}

impl AlertRules {
    /// Reads and checks the `[[alert]]` entries of a rules file's text; the
    /// error names the alert and the key. `toml_error` says where a TOML error is.
    pub fn parse(text: &str) -> Result<AlertRules, String> {
        let file: File = toml::from_str(text).map_err(|e| webhook_inbox_schemes::text::toml_error(text, &e))?;
        let mut names = HashSet::new();
        let mut alerts = Vec::new();
        for (i, entry) in file.alert.into_iter().enumerate() {
            let rule = AlertRule::new(entry).map_err(|why| format!("[[alert]] #{}: {why}", i + 1))?;
            if !names.insert(rule.name.clone()) {
                return Err(format!(
                    "[[alert]] #{}: the name {:?} is taken by another alert",
                    i + 1,
                    escape(&rule.name)
                ));
            }
            alerts.push(rule);
        }
        Ok(AlertRules { alerts })
    }

    /// The alerts in effect when the rules file declares none (or there is
    /// no rules file): each with the defaults above and no channel, so they
    /// show in `inbox alerts` and the console's Alerts page and notify no one.
    /// A file's own `[[alert]]` entries replace them all.
    ///
    /// | name | holds when |
    /// | --- | --- |
    /// | `failed` | 10 events of a provider failed in the last 5 minutes (one alert per provider) |
    /// | `rejected_signatures` | 5 deliveries to a provider were rejected (signature or timestamp) in the last 5 minutes |
    /// | `oldest_pending` | the oldest pending event the worker may take has waited 15 minutes |
    /// | `dead_outbox` | a destination has a dead outbox message |
    /// | `circuit_open` | a destination's circuit is open |
    /// | `pause_overdue` | a pause is older than its `--alarm-after` |
    pub fn defaults() -> AlertRules {
        let rule = |condition| AlertRule::new(AlertEntry::of(condition)).expect("the defaults are valid rules");
        let conditions = [
            Condition::Failed,
            Condition::RejectedSignatures,
            Condition::OldestPending,
            Condition::DeadOutbox,
            Condition::CircuitOpen,
            Condition::PauseOverdue,
        ];
        AlertRules { alerts: conditions.into_iter().map(rule).collect() }
    }

    /// No alerts.
    pub fn is_empty(&self) -> bool {
        self.alerts.is_empty()
    }

    /// The alerts, in the file's order.
    pub fn rules(&self) -> &[AlertRule] {
        &self.alerts
    }
}

impl AlertEntry {
    /// An entry naming only its condition: every default.
    fn of(condition: Condition) -> AlertEntry {
        AlertEntry {
            name: None,
            condition,
            provider: None,
            threshold: None,
            window: None,
            older_than: None,
            resolve_after: None,
            remind_every: None,
            notify: Vec::new(),
        }
    }
}

impl AlertRule {
    fn new(e: AlertEntry) -> Result<AlertRule, String> {
        let duration = |key: &str, v: Option<String>, default: Duration| match v {
            Some(text) => parse_duration(&text).map_err(|why| format!("{key}: {why}")),
            None => Ok(default),
        };
        let counted = matches!(e.condition, Condition::Failed | Condition::RejectedSignatures | Condition::DeadOutbox);
        let windowed = matches!(e.condition, Condition::Failed | Condition::RejectedSignatures);
        let only = |key: &str, set: bool, allowed: bool| match set && !allowed {
            true => Err(format!("{key} does not apply to the condition {}", e.condition.as_str())),
            false => Ok(()),
        };
        only("provider", e.provider.is_some(), windowed)?;
        only("threshold", e.threshold.is_some(), counted)?;
        only("window", e.window.is_some(), windowed)?;
        only("older_than", e.older_than.is_some(), e.condition == Condition::OldestPending)?;
        let provider = match &e.provider {
            Some(p) => Some(
                Provider::try_from(p.as_str())
                    .map_err(|_| format!("provider {:?}: not a provider's name", escape(p)))?,
            ),
            None => None,
        };
        let threshold = e.threshold.unwrap_or(match e.condition {
            Condition::Failed => 10,
            Condition::RejectedSignatures => 5,
            _ => 1,
        });
        if threshold < 1 {
            return Err("threshold: at least 1".into());
        }
        let remind_every = match e.remind_every.as_deref() {
            Some("never") => None,
            other => Some(duration("remind_every", other.map(str::to_string), Duration::from_secs(3600))?)
                .filter(|d| !d.is_zero()),
        };
        let name = e.name.unwrap_or_else(|| match &provider {
            Some(p) => format!("{} {p}", e.condition.as_str()),
            None => e.condition.as_str().to_string(),
        });
        if name.is_empty() || name.chars().count() > 128 || name.chars().any(webhook_inbox_schemes::text::is_unsafe) {
            return Err(format!("name {:?}: 1 to 128 printable characters", escape(&name)));
        }
        for c in &e.notify {
            if !crate::db::destinations::is_destination_name(&c.destination) {
                return Err(format!("notify: {:?} is not a destination's name", escape(&c.destination)));
            }
        }
        Ok(AlertRule {
            name,
            condition: e.condition,
            provider,
            threshold,
            window: duration("window", e.window, Duration::from_secs(300))?,
            older_than: duration("older_than", e.older_than, Duration::from_secs(900))?,
            resolve_after: duration("resolve_after", e.resolve_after, Duration::from_secs(300))?,
            remind_every,
            notify: e.notify,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_in_and_mistakes_name_the_alert_and_key() {
        let rules = AlertRules::parse(
            r#"
[[ignore]]
provider = "github"
type = "ping"

[[alert]]
condition = "failed"
provider = "stripe"
notify = [{ destination = "ops-slack", format = "slack" }, { destination = "oncall" }]

[[alert]]
condition = "oldest_pending"
older_than = "30s"
remind_every = "never"
"#,
        )
        .unwrap();
        let [failed, oldest] = rules.rules() else { panic!("two alerts") };
        assert_eq!(
            (failed.name.as_str(), failed.threshold, failed.window),
            ("failed stripe", 10, Duration::from_secs(300))
        );
        assert_eq!(failed.notify[0].format, Format::Slack);
        assert_eq!(failed.notify[1].format, Format::Json);
        assert_eq!((oldest.older_than, oldest.remind_every), (Duration::from_secs(30), None));
        for (text, said) in [
            ("[[alert]]\ncondition = \"failing\"", "unknown variant `failing`"),
            ("[[alert]]\ncondition = \"failed\"\nwindow = \"5 minutes\"", "[[alert]] #1: window:"),
            ("[[alert]]\ncondition = \"dead_outbox\"\nprovider = \"stripe\"", "provider does not apply"),
            ("[[alert]]\ncondition = \"failed\"\nthreshold = 0", "threshold: at least 1"),
            (
                "[[alert]]\ncondition = \"failed\"\n[[alert]]\ncondition = \"failed\"",
                "#2: the name \"failed\" is taken",
            ),
            (
                "[[alert]]\ncondition = \"failed\"\nnotify = [{ destination = \"Ops Slack\" }]",
                "not a destination's name",
            ),
            ("[[alert]]\ncondition = \"failed\"\nsevrity = 1", "unknown field `sevrity`"),
        ] {
            let err = AlertRules::parse(text).unwrap_err();
            assert!(err.contains(said), "{text:?}: {err}");
        }
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        let defaults = AlertRules::defaults();
        let named: Vec<&str> = defaults.rules().iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            named,
            ["failed", "rejected_signatures", "oldest_pending", "dead_outbox", "circuit_open", "pause_overdue"]
        );
        assert!(defaults.rules().iter().all(|r| r.notify.is_empty() && r.provider.is_none()));
        assert!(parse_duration("99999999999999999d").is_err() && parse_duration("").is_err());
    }
}
