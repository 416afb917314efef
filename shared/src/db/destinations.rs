//! `relay_destinations`: each destination's state, shared by every relay
//! process (paused by an operator, its circuit open), and what the relays
//! configured it as.

use sqlx::PgPool;

use super::inbox::Audit;

/// A destination's name as messages and the destinations file say it: 1 to
/// 64 of `a-z`, `0-9`, `_` and `-`.
pub fn is_destination_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(feature = "relay")]
/// What a relay may do with a destination now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Send.
    Open,
    /// Paused by an operator: nothing is sent, nothing spends an attempt.
    Paused,
    /// Its circuit is open and cooling down: nothing is sent.
    Cooling,
    /// Its circuit's cool-down is over and this relay won the probe: send one
    /// message; the circuit closes if it goes, and cools down again if not.
    Probe,
}

#[cfg(feature = "relay")]
/// This destination's gate. A relay that finds the cool-down over claims the
/// probe by restarting the cool-down in the same statement: other relays keep
/// seeing it open, so one message probes, not one per relay.
pub(crate) async fn gate(pool: &PgPool, name: &str, cool_down: std::time::Duration) -> Result<Gate, sqlx::Error> {
    let (paused, open, probe): (Option<bool>, Option<bool>, bool) = super::query_as(
        "WITH probe AS (
             UPDATE relay_destinations SET opened_at = now()
             WHERE name = $1 AND paused_at IS NULL AND opened_at <= now() - $2 * interval '1 millisecond'
             RETURNING 1)
         SELECT (SELECT paused_at IS NOT NULL FROM relay_destinations WHERE name = $1),
                (SELECT opened_at IS NOT NULL FROM relay_destinations WHERE name = $1),
                EXISTS (SELECT 1 FROM probe)",
    )
    .bind(name)
    .bind(cool_down.as_millis() as i64)
    .fetch_one(super::Autocommit(pool))
    .await?;
    Ok(match (paused.unwrap_or(false), open.unwrap_or(false), probe) {
        (true, _, _) => Gate::Paused,
        (false, _, true) => Gate::Probe,
        (false, true, false) => Gate::Cooling,
        (false, false, false) => Gate::Open,
    })
}

#[cfg(feature = "relay")]
/// Records that a relay starts with these destinations configured, each with what it sends to.
pub(crate) async fn register(pool: &PgPool, destinations: &[(String, String)]) -> Result<(), sqlx::Error> {
    let (names, targets): (Vec<&str>, Vec<&str>) = destinations.iter().map(|(n, t)| (n.as_str(), t.as_str())).unzip();
    super::query(
        "INSERT INTO relay_destinations (name, target, seen_at)
         SELECT name, target, now() FROM unnest($1::text[], $2::text[]) AS d (name, target)
         ON CONFLICT (name) DO UPDATE SET target = excluded.target, seen_at = excluded.seen_at",
    )
    .bind(&names)
    .bind(&targets)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

#[cfg(feature = "relay")]
/// Opens the circuit after `failures` consecutive failures, the last for `reason`.
pub(crate) async fn open(pool: &PgPool, name: &str, failures: u32, reason: &str) -> Result<(), sqlx::Error> {
    super::query(
        "INSERT INTO relay_destinations (name, opened_at, failures, last_error) VALUES ($1, now(), $2, $3)
         ON CONFLICT (name) DO UPDATE SET opened_at = now(), failures = $2, last_error = $3",
    )
    .bind(name)
    .bind(failures as i32)
    .bind(reason)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

#[cfg(feature = "relay")]
/// Closes the circuit: a probe went through.
pub(crate) async fn close(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    super::query("UPDATE relay_destinations SET opened_at = NULL, failures = 0 WHERE name = $1")
        .bind(name)
        .execute(super::Autocommit(pool))
        .await?;
    Ok(())
}

/// Pauses (`pause`) or resumes a destination, with an audit record, in one
/// statement; false when it already was so. A destination no relay has
/// configured yet may be paused too (its messages wait either way).
pub(crate) async fn set_paused(pool: &PgPool, name: &str, pause: bool, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    // The change, and its audit record from what it returned.
    macro_rules! audited {
        ($change:literal) => {
            concat!(
                "WITH changed AS (",
                $change,
                "),
                 audited AS (
                     INSERT INTO inbox_audit (actor, action, reason, destination, from_status, attempts)
                     SELECT $2, $3, $4, $1, from_status, 0 FROM changed)
                 SELECT count(*) FROM changed"
            )
        };
    }
    let sql = if pause {
        audited!(
            "INSERT INTO relay_destinations AS d (name, paused_at, paused_by, pause_reason) VALUES ($1, now(), $2, $4)
             ON CONFLICT (name) DO UPDATE SET paused_at = now(), paused_by = $2, pause_reason = $4
             WHERE d.paused_at IS NULL
             RETURNING 'running' AS from_status"
        )
    } else {
        audited!(
            "UPDATE relay_destinations SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
             WHERE name = $1 AND paused_at IS NOT NULL
             RETURNING 'paused' AS from_status"
        )
    };
    let changed: i64 = super::query_scalar(sql)
        .bind(name)
        .bind(by.actor)
        .bind(by.action)
        .bind(by.reason)
        .fetch_one(super::Autocommit(pool))
        .await?;
    Ok(changed == 1)
}

/// A destination as `inbox outbox destinations`, the console and the gauges
/// show it: its state and its messages. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DestinationState {
    /// Its name, as messages and the destinations file say it.
    pub name: String,
    /// What a relay sends it to (none: no relay has started with it configured;
    /// its messages wait).
    pub target: Option<String>,
    /// When a relay last started with it configured.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub seen_at: Option<String>,
    /// When an operator paused it (none: not paused).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub paused_at: Option<String>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// Why.
    pub pause_reason: Option<String>,
    /// Since when its circuit is open (none: closed).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub opened_at: Option<String>,
    /// The consecutive failures that opened it.
    pub failures: i32,
    /// The last of them.
    pub last_error: Option<String>,
    /// Messages neither sent nor dead.
    pub backlog: i64,
    /// Age of the oldest of them, 0 when there is none.
    pub oldest_backlog_ms: f64,
    /// Messages dead.
    pub dead: i64,
}

impl DestinationState {
    /// `paused`, `open` (its circuit), `unconfigured` (no relay knows it), or `running`.
    pub fn state(&self) -> &'static str {
        if self.paused_at.is_some() {
            "paused"
        } else if self.opened_at.is_some() {
            "open"
        } else if self.target.is_none() {
            "unconfigured"
        } else {
            "running"
        }
    }

    /// Why it is in its state, in a sentence (empty while it runs). The
    /// texts are as stored: escape them for a terminal or a page.
    pub fn why(&self) -> String {
        let or = |v: &Option<String>, none: &'static str| v.clone().unwrap_or_else(|| none.into());
        match self.state() {
            "paused" => format!(
                "by {} since {}: {}",
                or(&self.paused_by, "?"),
                or(&self.paused_at, "?"),
                or(&self.pause_reason, "")
            ),
            "open" => format!(
                "since {} after {} failures: {}",
                or(&self.opened_at, "?"),
                self.failures,
                or(&self.last_error, "")
            ),
            "unconfigured" => "no relay has it configured: its messages wait".into(),
            _ => String::new(),
        }
    }
}

/// Every destination a relay configured, an operator paused, or a message names, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<DestinationState>, sqlx::Error> {
    super::query_as(
        "WITH backlog AS (
             SELECT destination, count(*) AS backlog, min(created_at) AS oldest
             FROM transactional_outbox WHERE processed_at IS NULL AND dead_at IS NULL GROUP BY destination),
         dead AS (
             SELECT destination, count(*) AS dead FROM transactional_outbox WHERE dead_at IS NOT NULL GROUP BY destination),
         names AS (
             SELECT name FROM relay_destinations UNION SELECT destination FROM backlog UNION SELECT destination FROM dead)
         SELECT n.name, d.target, to_json(d.seen_at)#>>'{}' AS seen_at, to_json(d.paused_at)#>>'{}' AS paused_at,
         d.paused_by, d.pause_reason, to_json(d.opened_at)#>>'{}' AS opened_at,
                coalesce(d.failures, 0) AS failures, d.last_error,
                coalesce(b.backlog, 0) AS backlog,
                coalesce(extract(epoch FROM now() - b.oldest) * 1000, 0)::float8 AS oldest_backlog_ms,
                coalesce(x.dead, 0) AS dead
         FROM names n
         LEFT JOIN relay_destinations d ON d.name = n.name
         LEFT JOIN backlog b ON b.destination = n.name
         LEFT JOIN dead x ON x.destination = n.name
         ORDER BY n.name",
    )
    .fetch_all(super::Autocommit(pool))
    .await
}

#[cfg(feature = "relay")]
/// Messages waiting for a destination none of `configured` is: counted by the
/// relay each pass (they wait, never dead), through the destination index.
pub(crate) async fn unrouted(pool: &PgPool, configured: &[String]) -> Result<i64, sqlx::Error> {
    super::query_scalar(
        "SELECT count(*) FROM transactional_outbox
         WHERE processed_at IS NULL AND dead_at IS NULL AND destination <> ALL($1)",
    )
    .bind(configured)
    .fetch_one(super::Autocommit(pool))
    .await
}
