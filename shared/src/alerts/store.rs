//! `inbox_alerts`: every statement on it, and the measures the conditions read.

use std::time::Duration;

use sqlx::{types::Json, PgConnection, PgPool};

use super::rules::{AlertRule, Channel, Condition};
use crate::db::{self, inbox::Audit};

/// An alert as `inbox alerts`, the console and its notifications show it.
/// Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Alert {
    /// Its number (`inbox alerts ack 7`).
    pub id: i64,
    /// The `[[alert]]`'s name.
    pub rule: String,
    /// Its condition (`failed`, `oldest_pending`, ...).
    pub condition: String,
    /// What it is about: a provider, a destination, a pause's scope; empty for the whole inbox.
    pub scope: String,
    /// `open`, `acknowledged` or `resolved`.
    pub state: String,
    /// When it opened.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub first_seen: String,
    /// When it last held.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub last_seen: String,
    /// Evaluations that found it holding.
    pub seen: i32,
    /// The last measure (a count, or an age in seconds).
    pub value: f64,
    /// The highest.
    pub peak: f64,
    /// The last evaluation's sentence (a stranger's text may be in it: escape it for a terminal or a page).
    pub summary: String,
    /// Since when it no longer holds (resolved after the rule's `resolve_after`).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub cleared_at: Option<String>,
    /// Reminders sent.
    pub reminders: i32,
    /// When it was acknowledged, and by whom.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub acknowledged_at: Option<String>,
    /// Who acknowledged it.
    pub acknowledged_by: Option<String>,
    /// When it was resolved.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub resolved_at: Option<String>,
    /// `inbox` when its condition cleared.
    pub resolved_by: Option<String>,
    /// Where its notifications go (the rule's, when it opened).
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub channels: Json<Vec<Channel>>,
}

const COLUMNS: &str = "id, rule, condition, scope, state, to_json(first_seen)#>>'{}' AS first_seen,
     to_json(last_seen)#>>'{}' AS last_seen, seen, value, peak, summary,
    to_json(cleared_at)#>>'{}' AS cleared_at, reminders, to_json(acknowledged_at)#>>'{}' AS acknowledged_at,
    acknowledged_by, to_json(resolved_at)#>>'{}' AS resolved_at, resolved_by, channels";

/// The alerts still open or acknowledged, and (with `resolved`) the latest resolved ones, newest first.
pub async fn list(pool: &PgPool, resolved: bool, limit: i64) -> Result<Vec<Alert>, sqlx::Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM inbox_alerts WHERE state <> 'resolved' OR $1 ORDER BY (state = 'resolved'), id DESC LIMIT $2"
    );
    db::query_as(&sql).bind(resolved).bind(limit).fetch_all(db::Autocommit(pool)).await
}

/// One alert.
pub async fn get(pool: &PgPool, id: i64) -> Result<Option<Alert>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM inbox_alerts WHERE id = $1");
    db::query_as(&sql).bind(id).fetch_optional(db::Autocommit(pool)).await
}

/// The key of the evaluation's advisory lock: the pauses' gate's first half, 2.
const EVALUATION: (i32, i32) = (0x696e_6278, 2);

/// Whether this transaction evaluates now: no other holds the evaluation, and
/// none ran in the last `every` (every process may try; one a minute goes).
pub(super) async fn begin_run(conn: &mut PgConnection, every: Duration) -> Result<bool, sqlx::Error> {
    db::query_scalar(
        "WITH ran AS (
             UPDATE inbox_alert_runs SET evaluated_at = now()
             WHERE evaluated_at <= now() - $3 * interval '1 millisecond' AND pg_try_advisory_xact_lock($1, $2)
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM ran)",
    )
    .bind(EVALUATION.0)
    .bind(EVALUATION.1)
    .bind(every.as_millis() as i64)
    .fetch_one(conn)
    .await
}

/// The live alerts (open or acknowledged), locked for the evaluation.
pub(super) async fn live(conn: &mut PgConnection) -> Result<Vec<Alert>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM inbox_alerts WHERE state <> 'resolved' ORDER BY id FOR UPDATE");
    db::query_as(&sql).fetch_all(conn).await
}

/// What a condition measures now, per scope, where it holds.
pub(super) struct Measured {
    pub scope: String,
    pub value: f64,
    pub summary: String,
}

/// The scopes where `rule`'s condition holds now.
pub(super) async fn measure(conn: &mut PgConnection, rule: &AlertRule) -> Result<Vec<Measured>, sqlx::Error> {
    let ms = |d: Duration| d.as_millis() as i64;
    let provider = rule.provider.map(|p| p.as_str().to_string());
    let rows: Vec<(String, f64, String)> = match rule.condition {
        Condition::Failed => {
            db::query_as(
                "SELECT provider, count(*)::float8,
                        format('%s events of %s failed in the last %s (alert at %s)', count(*), provider, $4, $3)
                 FROM webhook_inbox
                 WHERE status = 'failed' AND coalesce(processed_at, received_at) > now() - $1 * interval '1 millisecond'
                   AND ($2::text IS NULL OR provider = $2)
                 GROUP BY provider HAVING count(*) >= $3",
            )
            .bind(ms(rule.window))
            .bind(&provider)
            .bind(rule.threshold)
            .bind(super::words(rule.window))
            .fetch_all(conn)
            .await?
        }
        Condition::RejectedSignatures => {
            db::query_as(
                "SELECT provider, sum(rejected)::float8,
                        format('%s deliveries to %s rejected (signature or timestamp) in the last %s (alert at %s): '
                               'a rotated secret not deployed?', sum(rejected), provider, $4, $3)
                 FROM inbox_receive_minutes
                 WHERE minute > now() - $1 * interval '1 millisecond' AND ($2::text IS NULL OR provider = $2)
                 GROUP BY provider HAVING sum(rejected) >= $3",
            )
            .bind(ms(rule.window))
            .bind(&provider)
            .bind(rule.threshold)
            .bind(super::words(rule.window))
            .fetch_all(conn)
            .await?
        }
        Condition::OldestPending => {
            db::query_as(
                "SELECT '', extract(epoch FROM now() - min(received_at))::float8,
                        format('the oldest pending event has waited %s s (alert at %s)',
                               round(extract(epoch FROM now() - min(received_at))), $2)
                 FROM webhook_inbox WHERE status = 'pending' AND held_by IS NULL
                 HAVING min(received_at) < now() - $1 * interval '1 millisecond'",
            )
            .bind(ms(rule.older_than))
            .bind(super::words(rule.older_than))
            .fetch_all(conn)
            .await?
        }
        Condition::DeadOutbox => {
            db::query_as(
                "SELECT destination, count(*)::float8,
                        format('%s outbox messages for %s are dead (the relay gave up on them)', count(*), destination)
                 FROM transactional_outbox WHERE dead_at IS NOT NULL
                 GROUP BY destination HAVING count(*) >= $1",
            )
            .bind(rule.threshold)
            .fetch_all(conn)
            .await?
        }
        Condition::CircuitOpen => {
            db::query_as(
                "SELECT name, extract(epoch FROM now() - opened_at)::float8,
                        format('the circuit of %s is open since %s, after %s failures: %s',
                               name, date_trunc('second', opened_at), failures, left(coalesce(last_error, ''), 200))
                 FROM relay_destinations WHERE opened_at IS NOT NULL",
            )
            .fetch_all(conn)
            .await?
        }
        Condition::PauseOverdue => {
            db::query_as(
                "SELECT provider || coalesce(' ' || event_type, ''), extract(epoch FROM now() - paused_at)::float8,
                        format('processing of %s has been paused for %s by %s: %s', provider || coalesce(' ' || event_type, ''),
                               CASE WHEN paused_at > now() - interval '2 hours'
                                    THEN round(extract(epoch FROM now() - paused_at) / 60) || ' min'
                                    ELSE round((extract(epoch FROM now() - paused_at) / 3600)::numeric, 1) || ' h' END,
                               paused_by, left(reason, 200))
                 FROM inbox_pauses WHERE paused_at < now() - alarm_after",
            )
            .fetch_all(conn)
            .await?
        }
    };
    Ok(rows.into_iter().map(|(scope, value, summary)| Measured { scope, value, summary }).collect())
}

/// Opens an alert.
pub(super) async fn open(conn: &mut PgConnection, rule: &AlertRule, m: &Measured) -> Result<Alert, sqlx::Error> {
    let sql = format!(
        "INSERT INTO inbox_alerts (rule, condition, scope, value, peak, summary, channels)
         VALUES ($1, $2, $3, $4, $4, $5, $6) RETURNING {COLUMNS}"
    );
    db::query_as(&sql)
        .bind(&rule.name)
        .bind(rule.condition.as_str())
        .bind(&m.scope)
        .bind(m.value)
        .bind(&m.summary)
        .bind(Json(&rule.notify))
        .fetch_one(conn)
        .await
}

/// A live alert still holds.
pub(super) async fn holds(conn: &mut PgConnection, id: i64, m: &Measured) -> Result<(), sqlx::Error> {
    db::query(
        "UPDATE inbox_alerts SET last_seen = now(), seen = seen + 1, value = $2, peak = greatest(peak, $2),
                                 summary = $3, cleared_at = NULL
         WHERE id = $1",
    )
    .bind(id)
    .bind(m.value)
    .bind(&m.summary)
    .execute(conn)
    .await?;
    Ok(())
}

/// A live alert no longer holds: since when (now, if it just cleared).
pub(super) async fn cleared(conn: &mut PgConnection, id: i64) -> Result<f64, sqlx::Error> {
    db::query_scalar(
        "UPDATE inbox_alerts SET cleared_at = coalesce(cleared_at, now()) WHERE id = $1
         RETURNING extract(epoch FROM now() - cleared_at)::float8",
    )
    .bind(id)
    .fetch_one(conn)
    .await
}

/// Resolves a live alert, by `by`; the alert as it is then, if it was live.
pub(super) async fn resolve(conn: &mut PgConnection, id: i64, by: &str) -> Result<Option<Alert>, sqlx::Error> {
    let sql = format!(
        "UPDATE inbox_alerts SET state = 'resolved', resolved_at = now(), resolved_by = $2, notified_at = now()
         WHERE id = $1 AND state <> 'resolved' RETURNING {COLUMNS}"
    );
    db::query_as(&sql).bind(id).bind(by).fetch_optional(conn).await
}

/// An open alert due a reminder (`every` since its last notification): counted, and due again in `every`.
pub(super) async fn remind(conn: &mut PgConnection, id: i64, every: Duration) -> Result<Option<Alert>, sqlx::Error> {
    let sql = format!(
        "UPDATE inbox_alerts SET notified_at = now(), reminders = reminders + 1
         WHERE id = $1 AND state = 'open' AND notified_at <= now() - $2 * interval '1 millisecond'
         RETURNING {COLUMNS}"
    );
    db::query_as(&sql).bind(id).bind(every.as_millis() as i64).fetch_optional(conn).await
}

/// Acknowledges an open alert (no more reminders), with an audit record; false when it was not open.
pub async fn acknowledge(pool: &PgPool, id: i64, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    let n: i64 = db::query_scalar(
        "WITH acked AS (
             UPDATE inbox_alerts SET state = 'acknowledged', acknowledged_at = now(), acknowledged_by = $2
             WHERE id = $1 AND state = 'open' RETURNING id),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, alert_id, from_status, attempts)
             SELECT $2, $3, $4, id, 'open', 0 FROM acked)
         SELECT count(*) FROM acked",
    )
    .bind(id)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_one(db::Autocommit(pool))
    .await?;
    Ok(n == 1)
}

/// Audits a resolution by hand, in its transaction.
pub(super) async fn audit(
    conn: &mut PgConnection,
    alert: &Alert,
    from: &str,
    by: &Audit<'_>,
) -> Result<(), sqlx::Error> {
    db::query(
        "INSERT INTO inbox_audit (actor, action, reason, alert_id, from_status, attempts) VALUES ($1, $2, $3, $4, $5, 0)",
    )
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .bind(alert.id)
    .bind(from)
    .execute(conn)
    .await?;
    Ok(())
}
