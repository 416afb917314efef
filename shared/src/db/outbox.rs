//! `transactional_outbox`: side effects recorded in the transaction that caused them.

use sqlx::{types::Json, PgConnection, PgExecutor};

use super::inbox::Audit;

/// One message to publish, built with [`Message::new`], sent to the
/// destination `default` unless [`Message::to`] names another, in any order
/// unless [`Message::ordered_by`] gives it an ordering key.
///
/// `message_key` is derived from what happened (not from the row id), so a
/// message written twice, or re-sent after a crash, carries the same key and
/// consumers can deduplicate on it.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    message_key: String,
    payload: serde_json::Value,
    destination: &'a str,
    ordering_key: Option<&'a str>,
}

impl<'a> Message<'a> {
    /// The destination of a message that names none.
    pub const DEFAULT_DESTINATION: &'static str = "default";

    /// A message about `aggregate_id` of kind `aggregate_type` (the invoice
    /// `in_123`), for its consumers and the relay's routing (an AMQP
    /// destination's routing key is the `aggregate_type`), under
    /// `message_key`: stable, derived from the business key
    /// (`receipt:in_123`), so that a twin event or a replay finds it written,
    /// and consumers deduplicate on it (the relay sends it as the
    /// `Idempotency-Key`, `webhook-id`, `Nats-Msg-Id` or AMQP `message_id`).
    /// `payload` is what the consumer gets.
    pub fn new(
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        message_key: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Message {
            aggregate_type,
            aggregate_id,
            message_key: message_key.into(),
            payload,
            destination: Self::DEFAULT_DESTINATION,
            ordering_key: None,
        }
    }

    /// Sends it to `destination` (a `[destination.NAME]` of
    /// `RELAY_DESTINATIONS_FILE`) instead of `default`. A message for a
    /// destination no relay has configured waits for one; it is never dropped.
    pub fn to(mut self, destination: &'a str) -> Self {
        self.destination = destination;
        self
    }

    /// Gives it an ordering key: the messages of one key to one destination
    /// are delivered one at a time, in the order they were written (their id
    /// order); a failing one holds back the later ones of its key until it is
    /// sent or dead.
    pub fn ordered_by(mut self, key: &'a str) -> Self {
        self.ordering_key = Some(key);
        self
    }

    /// Its key.
    pub fn key(&self) -> &str {
        &self.message_key
    }
}

/// Writes a message unless one with the same key exists; true when written.
/// In a handler, [`crate::Event::enqueue`] also records which event wrote it.
pub async fn enqueue(conn: &mut PgConnection, m: &Message<'_>) -> Result<bool, sqlx::Error> {
    enqueue_for(conn, m, None, None).await
}

/// [`enqueue`], recording the event whose handler wrote it (`provider`,
/// `event_id`), and the `traceparent` of its processing when traces are on.
pub(crate) async fn enqueue_for(
    conn: &mut PgConnection,
    m: &Message<'_>,
    event: Option<(&str, &str)>,
    trace_context: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let row: Option<(i64,)> = super::query_as(
        "INSERT INTO transactional_outbox
             (aggregate_type, aggregate_id, payload, message_key, event_provider, event_id, trace_context,
              destination, ordering_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (message_key) DO NOTHING
         RETURNING id",
    )
    .bind(m.aggregate_type)
    .bind(m.aggregate_id)
    .bind(Json(&m.payload))
    .bind(&m.message_key)
    .bind(event.map(|e| e.0))
    .bind(event.map(|e| e.1))
    .bind(trace_context)
    .bind(m.destination)
    .bind(m.ordering_key)
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// Many messages in one statement, each with the event that wrote it and its
/// `traceparent` ([`enqueue_for`]'s), given ids in their order: for each,
/// whether it was written (false when its key exists, or came earlier in
/// `messages`).
pub(crate) async fn enqueue_all_for(
    conn: &mut PgConnection,
    messages: &[(&Message<'_>, (&str, &str), Option<&str>)],
) -> Result<Vec<bool>, sqlx::Error> {
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    fn column<T>(rows: &[T], f: impl Fn(&T) -> Option<String>) -> Vec<Option<String>> {
        rows.iter().map(f).collect()
    }
    let payloads: Vec<Json<&serde_json::Value>> = messages.iter().map(|(m, ..)| Json(&m.payload)).collect();
    let written: Vec<String> = super::query_scalar(
        "INSERT INTO transactional_outbox
             (aggregate_type, aggregate_id, payload, message_key, event_provider, event_id, trace_context,
              destination, ordering_key)
         SELECT a, i, p, k, ep, ei, tc, d, o
         FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::text[]) WITH ORDINALITY AS m (a, i, p, k, ep, ei, tc, d, o, n)
         ORDER BY n
         ON CONFLICT (message_key) DO NOTHING
         RETURNING message_key",
    )
    .bind(column(messages, |(m, ..)| Some(m.aggregate_type.to_string())))
    .bind(column(messages, |(m, ..)| Some(m.aggregate_id.to_string())))
    .bind(payloads)
    .bind(column(messages, |(m, ..)| Some(m.message_key.clone())))
    .bind(column(messages, |(_, e, _)| Some(e.0.to_string())))
    .bind(column(messages, |(_, e, _)| Some(e.1.to_string())))
    .bind(column(messages, |(_, _, t)| t.map(str::to_string)))
    .bind(column(messages, |(m, ..)| Some(m.destination.to_string())))
    .bind(column(messages, |(m, ..)| m.ordering_key.map(str::to_string)))
    .fetch_all(conn)
    .await?;
    let mut written: std::collections::HashSet<String> = written.into_iter().collect();
    // The first message of a key is the one written; a later one in `messages` is not.
    Ok(messages.iter().map(|(m, ..)| written.remove(&m.message_key)).collect())
}

#[cfg(feature = "relay")]
/// A message on its way out, as a [`Sink`](crate::sinks::Sink) gets it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Outgoing {
    /// Its id in `transactional_outbox`.
    pub id: i64,
    /// What it is about ([`Message::new`]).
    pub aggregate_type: String,
    /// Which one.
    pub aggregate_id: String,
    /// What the consumer gets.
    pub payload: sqlx::types::Json<serde_json::Value>,
    /// The key consumers deduplicate on: the same on every attempt.
    pub message_key: String,
    /// Its destination.
    pub destination: String,
    /// Its ordering key, if it has one ([`Message::ordered_by`]).
    pub ordering_key: Option<String>,
    /// Attempts including this one.
    pub attempts: i32,
    /// As leased, the `traceparent` of the processing that wrote it; as handed
    /// to the sinks, the relay's own span's (sent on as `traceparent`). None without traces.
    pub trace_context: Option<String>,
}

#[cfg(feature = "relay")]
/// Leases up to `limit` due, unsent messages of `destination` for `lease`, in
/// id order, skipping those another relay holds, and those behind an earlier
/// unsent message of the same ordering key (sent, or dead, it lets the next
/// one go). The lease is committed at once: no transaction stays open across
/// the sink's network calls. A relay that dies leaves its lease to expire, and
/// the messages go out again, under the same key. The lease starts after the
/// message `after` (a lane remembers the last it leased:
/// [`crate::runtime::scan`]), or at the destination's head.
pub(crate) async fn lease_unsent(
    pool: &sqlx::PgPool,
    destination: &str,
    limit: i64,
    lease: std::time::Duration,
    after: Option<i64>,
) -> Result<Vec<Outgoing>, sqlx::Error> {
    macro_rules! lease {
        ($bound:literal) => {
            concat!(
                "WITH batch AS (
                     SELECT id FROM transactional_outbox AS o
                     WHERE destination = $3 AND processed_at IS NULL AND dead_at IS NULL",
                $bound,
                "
                       AND (next_attempt_at IS NULL OR next_attempt_at <= now())
                       AND (ordering_key IS NULL OR NOT EXISTS (
                           SELECT 1 FROM transactional_outbox AS e
                           WHERE e.destination = o.destination AND e.ordering_key = o.ordering_key AND e.id < o.id
                             AND e.processed_at IS NULL AND e.dead_at IS NULL))
                     ORDER BY id
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED)
                 UPDATE transactional_outbox AS o
                 SET attempts = o.attempts + 1, next_attempt_at = now() + $2 * interval '1 millisecond'
                 FROM batch WHERE o.id = batch.id
                 RETURNING o.id, o.aggregate_type, o.aggregate_id, o.payload, o.message_key, o.destination, o.ordering_key,
                           o.attempts, o.trace_context"
            )
        };
    }
    // Two statements, not one with an optional bound: a plan cached for one
    // would not start the index scan at the position for the other.
    let statement = match after {
        None => super::query_as(lease!("")),
        Some(_) => super::query_as(lease!(" AND id > $4")),
    };
    let statement = statement.bind(limit).bind(lease.as_millis() as i64).bind(destination);
    let statement = match after {
        None => statement,
        Some(after) => statement.bind(after),
    };
    statement.fetch_all(super::Autocommit(pool)).await.map(|mut rows: Vec<Outgoing>| {
        rows.sort_by_key(|m| m.id);
        rows
    })
}

#[cfg(feature = "relay")]
/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dispatch {
    Sent,
    Retry { after: std::time::Duration, reason: String },
    Dead(String),
}

#[cfg(feature = "relay")]
/// Records every result of a batch in one statement. (In both UPDATEs the ids
/// are also given as `id = ANY($1)`: joined only to `unnest`, whose size the
/// planner cannot see, the statement walked every unsent message, and a
/// backlog of 10,000 slowed the relay tenfold.) `processed_at` is set only
/// here, after the sink confirmed. Each result names the lease it belongs to
/// (the attempt number): a relay whose lease ran out and was taken over by
/// another writes nothing, so it cannot undo the other's result. A dead
/// message that held back later messages of its ordering key says how many.
pub(crate) async fn record_results(pool: &sqlx::PgPool, results: &[(i64, i32, Dispatch)]) -> Result<(), sqlx::Error> {
    if results.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::new();
    let mut leases = Vec::new();
    let mut outcomes = Vec::new();
    let mut delays: Vec<Option<i64>> = Vec::new();
    let mut reasons: Vec<Option<String>> = Vec::new();
    for (id, attempts, d) in results {
        ids.push(*id);
        leases.push(*attempts);
        let (outcome, delay, reason) = match d {
            Dispatch::Sent => ("sent", None, None),
            Dispatch::Retry { after, reason } => ("retry", Some(after.as_millis() as i64), Some(reason.clone())),
            Dispatch::Dead(reason) => ("dead", None, Some(reason.clone())),
        };
        outcomes.push(outcome);
        delays.push(delay);
        reasons.push(reason);
    }
    super::query(
        "UPDATE transactional_outbox AS o
         SET processed_at = CASE WHEN r.outcome = 'sent' THEN now() END,
             dead_at = CASE WHEN r.outcome = 'dead' THEN now() END,
             next_attempt_at = CASE WHEN r.outcome = 'retry' THEN now() + r.delay_ms * interval '1 millisecond' END,
             last_error = r.reason || CASE WHEN r.outcome = 'dead' AND o.ordering_key IS NOT NULL THEN coalesce((
                 SELECT format(' (it held back %s later message(s) of its ordering key until now)', count(*))
                 FROM transactional_outbox AS l
                 WHERE l.destination = o.destination AND l.ordering_key = o.ordering_key AND l.id > o.id
                   AND l.processed_at IS NULL AND l.dead_at IS NULL
                 HAVING count(*) > 0), '') ELSE '' END
         FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::int[]) AS r (id, outcome, delay_ms, reason, lease)
         WHERE o.id = ANY($1) AND o.id = r.id AND o.attempts = r.lease AND o.processed_at IS NULL AND o.dead_at IS NULL",
    )
    .bind(&ids)
    .bind(&outcomes)
    .bind(&delays)
    .bind(&reasons)
    .bind(&leases)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

#[cfg(feature = "relay")]
/// Gives leased messages back untouched (the attempt counted by the lease is
/// undone, and they are due at once), if the lease is still this relay's.
pub(crate) async fn release(pool: &sqlx::PgPool, leases: &[(i64, i32)]) -> Result<(), sqlx::Error> {
    let (ids, attempts): (Vec<i64>, Vec<i32>) = leases.iter().copied().unzip();
    super::query(
        "UPDATE transactional_outbox AS o
         SET attempts = o.attempts - 1, next_attempt_at = NULL
         FROM unnest($1::bigint[], $2::int[]) AS r (id, lease)
         WHERE o.id = ANY($1) AND o.id = r.id AND o.attempts = r.lease AND o.processed_at IS NULL AND o.dead_at IS NULL",
    )
    .bind(&ids)
    .bind(&attempts)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

/// Deletes up to `limit` outbox messages sent before `days` ago.
pub(crate) async fn delete_sent_before<'e>(ex: impl PgExecutor<'e>, days: u32, limit: i64) -> Result<u64, sqlx::Error> {
    let done = super::query(
        "DELETE FROM transactional_outbox
         WHERE id IN (SELECT id FROM transactional_outbox
                      WHERE processed_at IS NOT NULL AND processed_at < now() - make_interval(days => $1)
                      LIMIT $2
                      FOR UPDATE SKIP LOCKED)",
    )
    .bind(days as i32)
    .bind(limit)
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}

/// The relay's backlog, for alarms and `inbox stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct OutboxGauges {
    /// Messages neither sent nor dead.
    pub backlog: i64,
    /// Age of the oldest of them, 0 when there is none.
    pub oldest_backlog_ms: f64,
    /// Messages dead: refused for good, or out of attempts.
    pub dead: i64,
}

pub(crate) async fn gauges<'e>(ex: impl PgExecutor<'e>) -> Result<OutboxGauges, sqlx::Error> {
    super::query_as(
        "SELECT count(*) AS backlog,
                coalesce(extract(epoch FROM now() - min(created_at)) * 1000, 0)::float8 AS oldest_backlog_ms,
                (SELECT count(*) FROM transactional_outbox WHERE dead_at IS NOT NULL) AS dead
         FROM transactional_outbox WHERE processed_at IS NULL AND dead_at IS NULL",
    )
    .fetch_one(ex)
    .await
}

/// A message, as `inbox outbox` and an event's page list it. Timestamps are PostgreSQL's own text.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutboxMessage {
    /// Its id in `transactional_outbox` (what [`retry_message`] takes).
    pub id: i64,
    /// The key the relay sends it under (a consumer deduplicates on it).
    pub message_key: String,
    /// What it is about, as its handler said ([`crate::Message`]).
    pub aggregate_type: String,
    /// Which one.
    pub aggregate_id: String,
    /// Where it goes.
    pub destination: String,
    /// Its ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// Delivery attempts so far.
    pub attempts: i32,
    /// When its handler's transaction wrote it.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_at: String,
    /// When the relay tries it next (none: as soon as it runs).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub next_attempt_at: Option<String>,
    /// When the relay sent it, if it has.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub sent_at: Option<String>,
    /// When the relay gave up on it (a dead message), if it has.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub dead_at: Option<String>,
    /// Why its last attempt failed.
    pub last_error: Option<String>,
}

/// Unsent messages (or, with `dead`, the dead ones), oldest first.
pub async fn list_unsent(pool: &sqlx::PgPool, dead: bool, limit: i64) -> Result<Vec<OutboxMessage>, sqlx::Error> {
    super::query_as(
        "SELECT id, message_key, aggregate_type, aggregate_id, destination, ordering_key, attempts,
                to_json(created_at)#>>'{}' AS created_at,
                to_json(next_attempt_at)#>>'{}' AS next_attempt_at, to_json(processed_at)#>>'{}' AS sent_at,
                to_json(dead_at)#>>'{}' AS dead_at, last_error
         FROM transactional_outbox
         WHERE processed_at IS NULL AND (dead_at IS NOT NULL) = $1
         ORDER BY id LIMIT $2",
    )
    .bind(dead)
    .bind(limit)
    .fetch_all(super::Autocommit(pool))
    .await
}

/// The messages the handler of one event wrote ([`crate::Event::enqueue`]),
/// sent or not, in the order written.
pub async fn event_messages(
    pool: &sqlx::PgPool,
    provider: &str,
    event_id: &str,
) -> Result<Vec<OutboxMessage>, sqlx::Error> {
    super::query_as(
        "SELECT id, message_key, aggregate_type, aggregate_id, destination, ordering_key, attempts,
                to_json(created_at)#>>'{}' AS created_at,
                to_json(next_attempt_at)#>>'{}' AS next_attempt_at, to_json(processed_at)#>>'{}' AS sent_at,
                to_json(dead_at)#>>'{}' AS dead_at, last_error
         FROM transactional_outbox WHERE event_provider = $1 AND event_id = $2 ORDER BY id",
    )
    .bind(provider)
    .bind(event_id)
    .fetch_all(super::Autocommit(pool))
    .await
}

/// The statement that gives the messages `picked` selects (`id`, `event_provider`,
/// `event_id`, `attempts`, `last_error`, `dead_at`; locked) a fresh start, and
/// audits each with `$2` (actor), `$3` (action) and `$4` (reason).
macro_rules! retry_picked {
    ($picked:literal) => {
        concat!(
            "WITH picked AS (",
            $picked,
            "),
         retried AS (
             UPDATE transactional_outbox AS o SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
             FROM picked WHERE o.id = picked.id
             RETURNING o.id),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, provider, event_id, message_id, from_status, attempts, failure_reason)
             SELECT $2, $3, $4, event_provider, event_id, id, CASE WHEN dead_at IS NULL THEN 'waiting' ELSE 'dead' END,
                    attempts, last_error
             FROM picked)
         SELECT count(*) FROM retried"
        )
    };
}

/// Gives a dead (or waiting) message a fresh start: due now, attempts reset,
/// its last error kept until the next attempt, with an audit record (under the
/// event whose handler wrote it, if one did). A sent message is left alone.
/// Returns whether it was found unsent.
pub async fn retry_message(pool: &sqlx::PgPool, id: i64, by: &Audit<'_>) -> Result<bool, sqlx::Error> {
    let n: i64 = super::query_scalar(retry_picked!(
        "SELECT id, event_provider, event_id, attempts, last_error, dead_at FROM transactional_outbox
         WHERE id = $1 AND processed_at IS NULL FOR UPDATE"
    ))
    .bind(id)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_one(super::Autocommit(pool))
    .await?;
    Ok(n == 1)
}

/// [`retry_message`] for up to `limit` dead messages, in one short statement; call it
/// again until it returns less than `limit`.
pub async fn retry_dead(pool: &sqlx::PgPool, limit: i64, by: &Audit<'_>) -> Result<u64, sqlx::Error> {
    let n: i64 = super::query_scalar(retry_picked!(
        "SELECT id, event_provider, event_id, attempts, last_error, dead_at FROM transactional_outbox
         WHERE dead_at IS NOT NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    ))
    .bind(limit)
    .bind(by.actor)
    .bind(by.action)
    .bind(by.reason)
    .fetch_one(super::Autocommit(pool))
    .await?;
    Ok(n as u64)
}

#[cfg(test)]
#[cfg(feature = "relay")]
mod tests {
    use std::time::Duration;

    use sqlx::PgPool;

    use super::{enqueue, lease_unsent, record_results, Dispatch, Message};

    async fn one_message(pool: &PgPool) {
        let mut conn = pool.acquire().await.unwrap();
        let m = Message::new("payment", "pi_0", "payment_succeeded:pi_0", serde_json::json!({"payment_id": "pi_0"}));
        assert!(enqueue(&mut conn, &m).await.unwrap());
    }

    /// (attempts, sent, dead, last_error) of the only message.
    async fn row(pool: &PgPool) -> (i32, bool, bool, Option<String>) {
        crate::db::query_as(
            "SELECT attempts, processed_at IS NOT NULL, dead_at IS NOT NULL, last_error FROM transactional_outbox",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// A leased message is no other relay's until its lease runs out; then it
    /// is leased again, the attempt counted, under the same key.
    #[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
    async fn a_leased_message_is_left_alone_until_its_lease_runs_out(pool: PgPool) {
        one_message(&pool).await;
        let first = lease_unsent(&pool, "default", 10, Duration::from_millis(300), None).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].attempts, 1);
        let meanwhile = lease_unsent(&pool, "default", 10, Duration::from_millis(300), None).await.unwrap();
        assert!(meanwhile.is_empty(), "held by the first lease: {meanwhile:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let again = lease_unsent(&pool, "default", 10, Duration::from_secs(60), None).await.unwrap();
        assert_eq!(again.len(), 1, "the lease ran out");
        assert_eq!((again[0].id, again[0].attempts), (first[0].id, 2));
        assert_eq!(again[0].message_key, first[0].message_key);
    }

    /// A relay whose lease ran out while it worked, and whose messages another
    /// relay has since leased (and then sent), cannot undo that with its late
    /// result.
    #[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
    async fn a_late_result_from_an_expired_lease_changes_nothing(pool: PgPool) {
        one_message(&pool).await;
        let slow = lease_unsent(&pool, "default", 10, Duration::from_millis(10), None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let taken_over = lease_unsent(&pool, "default", 10, Duration::from_secs(60), None).await.unwrap();
        assert_eq!(taken_over.len(), 1, "the slow relay's lease ran out");
        let late = [(slow[0].id, slow[0].attempts, Dispatch::Dead("HTTP 500 after the lease ran out".into()))];
        record_results(&pool, &late).await.unwrap();
        assert_eq!(row(&pool).await, (2, false, false, None), "the other relay's lease still holds it");

        record_results(&pool, &[(taken_over[0].id, taken_over[0].attempts, Dispatch::Sent)]).await.unwrap();
        record_results(&pool, &late).await.unwrap();
        assert_eq!(row(&pool).await, (2, true, false, None));
    }
}
