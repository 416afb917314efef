//! Which events an operator means, as the CLI and the console parse it: the
//! requeue's [`Filter`], the listing's [`EventQuery`], points in time, page cursors.

use std::time::Duration;

use super::status::Status;

/// Which events an operator means: the filters of `inbox failed` and `inbox
/// requeue`. Every field narrows the selection; `statuses` is required (an
/// empty list selects nothing).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Events in one of these statuses.
    pub statuses: Vec<Status>,
    /// Of this provider only (its name, as in `/webhooks/{provider}`).
    pub provider: Option<String>,
    /// Exactly this event type.
    pub event_type: Option<String>,
    /// Ended (processed, or stored as failed by receive) at or after this point.
    pub since: Option<Since>,
    /// Ended before this point.
    pub until: Option<Since>,
    /// `failure_reason ILIKE` this pattern (`%` and `_` as in SQL).
    pub reason_like: Option<String>,
}

/// A point in time: so long ago, or a timestamp PostgreSQL parses (a bad one
/// is PostgreSQL's error, when the query runs).
#[derive(Debug, Clone)]
pub enum Since {
    /// This long before now, by the database's clock.
    Ago(Duration),
    /// A timestamp, e.g. `2026-11-30 08:00Z`.
    At(String),
}

impl Since {
    /// A duration ago (`30s`, `15m`, `2h`, `7d`) or a timestamp (anything of
    /// 10 characters or more that starts with a digit: PostgreSQL reads it
    /// when the query runs), as the operator's commands and the console take it.
    pub fn parse(text: &str) -> Result<Since, String> {
        let text = text.trim();
        let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
        let seconds = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ if text.starts_with(|c: char| c.is_ascii_digit()) && text.len() >= 10 => {
                return Ok(Since::At(text.to_string()))
            }
            _ => return Err(format!("{text:?} is neither a duration (30s, 15m, 2h, 7d) nor a timestamp")),
        };
        let n: u64 = number.parse().map_err(|_| format!("{text:?}: the number is missing or too large"))?;
        n.checked_mul(seconds)
            .map(|s| Since::Ago(Duration::from_secs(s)))
            .ok_or_else(|| format!("{text:?} is too far back"))
    }

    pub(crate) fn ago_ms(&self) -> Option<i64> {
        match self {
            Since::Ago(d) => Some(d.as_millis() as i64),
            Since::At(_) => None,
        }
    }

    pub(crate) fn at(&self) -> Option<&str> {
        match self {
            Since::At(t) => Some(t),
            Since::Ago(_) => None,
        }
    }
}

/// Which events a listing shows (the console's filters). Every field narrows
/// it; the default is every event.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Of this provider only.
    pub provider: Option<String>,
    /// Of this type only.
    pub event_type: Option<String>,
    /// In one of these statuses (none: any).
    pub statuses: Vec<Status>,
    /// Received at or after this.
    pub since: Option<Since>,
    /// Received before this.
    pub until: Option<Since>,
    /// This id, or the ids that start with this text.
    pub event_id: Option<IdMatch>,
    /// Whose payload holds this text or JSON. Nothing indexes payloads (an
    /// index would cost every claim): bound the search with `since`; it stops
    /// after [`SEARCH_TIMEOUT`](crate::ops::SEARCH_TIMEOUT) with PostgreSQL's statement timeout (57014).
    pub payload: Option<PayloadMatch>,
}

/// What a payload search looks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadMatch {
    /// This text, anywhere in the payload's JSON as PostgreSQL writes `jsonb`
    /// (`{"key": "value"}`, a space after each colon and comma), case and all.
    Text(String),
    /// This JSON, contained in the payload (`@>`: an object's members and an
    /// array's elements, at the same places).
    Json(serde_json::Value),
}

impl PayloadMatch {
    /// A JSON object or array as [`PayloadMatch::Json`], anything else as [`PayloadMatch::Text`].
    pub fn parse(text: &str) -> PayloadMatch {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() || v.is_array() => PayloadMatch::Json(v),
            _ => PayloadMatch::Text(text.to_string()),
        }
    }
}

/// An event id to look for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMatch {
    /// Exactly this id.
    Exact(String),
    /// Every id that starts with this text (taken as text: `%` and `_` are themselves).
    Prefix(String),
}

/// Where a page starts: after this event, in the listing's order. Written as
/// an opaque, URL-safe text (its `Display`), read back with [`Cursor::parse`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    pub(crate) received_at: String,
    pub(crate) provider: String,
    pub(crate) event_id: String,
}

/// A text that is not a cursor a listing gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a page cursor of this listing")]
pub struct BadCursor;

impl Cursor {
    /// The cursor a page's `next` was written as.
    pub fn parse(text: &str) -> Result<Cursor, BadCursor> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).map_err(|_| BadCursor)?;
        serde_json::from_slice(&bytes).map_err(|_| BadCursor)
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::Engine as _;
        let json = serde_json::to_vec(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_or_a_timestamp() {
        assert!(matches!(Since::parse("90m"), Ok(Since::Ago(d)) if d == Duration::from_secs(5400)));
        assert!(matches!(Since::parse("7d"), Ok(Since::Ago(d)) if d == Duration::from_secs(7 * 86_400)));
        assert!(matches!(Since::parse("2026-11-30 08:00Z"), Ok(Since::At(_))));
        for bad in ["", "h", "5 weeks", "99999999999999999999h", "yesterday"] {
            assert!(Since::parse(bad).is_err(), "{bad:?}");
        }
    }
}
