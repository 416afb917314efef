//! Processing: the handler registry, the worker, and the `process` function's
//! two triggers (schedule and SQS), as plain functions tests call directly.

pub(crate) mod handler;
pub(crate) mod handlers;
pub(crate) mod hints;
pub(crate) mod inline;
pub(crate) mod worker;

use std::time::Instant;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::Deserialize;
use serde_json::Value;

use self::worker::{Processed, Worker};
use crate::{
    db::{self, inbox, outbox},
    runtime::{
        metrics::Metrics,
        stage::{self, Stopped, Tally},
    },
};

/// Why an invocation failed. A run that could not do its work is an error, so
/// the Lambda's `Errors` metric (and its alarm) sees an outage.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcessError {
    #[error("the invocation event is not an SQS batch: {0}")]
    BadEvent(#[from] serde_json::Error),
    /// The counts of the batches that committed before the error are kept.
    #[error("processing stopped on a database error after {counts:?}: {source}")]
    Database {
        counts: Processed,
        #[source]
        source: sqlx::Error,
    },
}

/// Dispatches on the event's shape: an SQS batch (`Records`, see
/// `sqs_counted`) or a schedule (anything else, [`on_schedule`]); the
/// result, and the invocation's metrics: its counts, and on a schedule the
/// queue's gauges (`pending`, `oldest_pending_age`, `failed_last_hour`,
/// `outbox_backlog`, `outbox_oldest_age`), taken once a minute whatever else runs.
pub(crate) async fn handle_counted(
    worker: &Worker,
    event: Value,
    deadline: Instant,
) -> (Result<Value, ProcessError>, Metrics) {
    let mut metrics = Metrics::new("process");
    let result = if event.get("Records").is_some() {
        match serde_json::from_value::<SqsEvent>(event) {
            Ok(sqs) => {
                let (result, counts) = sqs_counted(worker, sqs).await;
                counts.count_into(&mut metrics);
                result.and_then(|r| Ok(serde_json::to_value(r)?))
            }
            Err(e) => Err(e.into()),
        }
    } else {
        let result = on_schedule(worker, deadline).await;
        match &result {
            Ok(counts) | Err(ProcessError::Database { counts, .. }) => counts.count_into(&mut metrics),
            Err(ProcessError::BadEvent(_)) => {}
        }
        gauges(worker.pool(), &mut metrics).await;
        result.and_then(|c| Ok(serde_json::to_value(c)?))
    };
    (result, metrics)
}

/// The queue's and the outbox's gauges (`pending`, `oldest_pending_age`, ...), added to `metrics`.
pub async fn gauges(pool: &sqlx::PgPool, metrics: &mut Metrics) {
    match (inbox::gauges(db::Autocommit(pool)).await, outbox::gauges(db::Autocommit(pool)).await) {
        (Ok(inbox), Ok(outbox)) => {
            metrics
                .gauge("pending", inbox.pending as f64)
                .gauge("held", inbox.held as f64)
                .gauge("overdue_pauses", inbox.overdue_pauses as f64)
                .gauge_ms("oldest_pending_age", inbox.oldest_pending_ms)
                .gauge("failed_last_hour", inbox.failed_last_hour as f64)
                .gauge("outbox_backlog", outbox.backlog as f64)
                .gauge_ms("outbox_oldest_age", outbox.oldest_backlog_ms)
                .gauge("outbox_dead", outbox.dead as f64);
        }
        (Err(e), _) | (_, Err(e)) => tracing::error!(error = %e, "gauges not taken"),
    }
}

/// EventBridge schedule: drain batch after batch until a short batch or the
/// deadline; an error if the drain stopped on the database.
pub(crate) async fn on_schedule(worker: &Worker, deadline: Instant) -> Result<Processed, ProcessError> {
    stage::run(worker, deadline).await.map_err(|Stopped { tally, source }| {
        tracing::error!(error = %source, counts = ?tally, "drain stopped");
        ProcessError::Database { counts: tally, source }
    })
}

/// The SQS message body that names one inbox event.
#[derive(Debug, Deserialize)]
pub(crate) struct EventRef {
    pub provider: String,
    pub event_id: String,
}

/// SQS: each message names one event. Only the messages that must come back
/// (unreadable, or a transient failure to retry) are reported as failures; the
/// others are deleted from the queue. Never a whole-batch failure for one message.
/// An event that is not due (in backoff), already done, or held by another
/// worker is acknowledged: the schedule owns it from there. If the database
/// could not be reached, the invocation fails (the whole batch comes back, and
/// what was done is acknowledged as done next time). The counts beside the result.
async fn sqs_counted(worker: &Worker, event: SqsEvent) -> (Result<SqsBatchResponse, ProcessError>, Processed) {
    let mut response = SqsBatchResponse::default();
    let mut counts = Processed::default();
    for message in event.records {
        let id = message.message_id.clone().unwrap_or_default();
        let Some(target) = message.body.as_deref().and_then(|b| serde_json::from_str::<EventRef>(b).ok()) else {
            tracing::error!(message_id = %id, "SQS message is not {{\"provider\",\"event_id\"}}; returned to the queue (its DLQ keeps it)");
            response.add_failure(id);
            continue;
        };
        match worker.run_event(&target.provider, &target.event_id).await {
            Ok(c) if c.retried == 0 => counts.add(&c),
            Ok(c) => {
                counts.add(&c);
                response.add_failure(id);
            }
            Err(source) => {
                tracing::error!(message_id = %id, error = %source, "processing failed on the database");
                return (Err(ProcessError::Database { counts, source }), counts);
            }
        }
    }
    (Ok(response), counts)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;
    use sqlx::{postgres::PgConnectOptions, PgPool};

    use super::{handle_counted, on_schedule, ProcessError};
    use crate::{
        db::{query, query_scalar, DbConfig},
        process::{
            handlers::Handlers,
            worker::{Worker, WorkerConfig},
        },
    };

    /// Batches of 100, retries a millisecond apart.
    fn worker(pool: PgPool) -> Worker {
        let config = WorkerConfig {
            batch_size: 100,
            max_attempts: 3,
            retry_base: Duration::from_millis(1),
            poll: Duration::from_millis(10),
            ..WorkerConfig::default()
        };
        Worker::new(pool, Handlers::new(), config)
    }

    #[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
    async fn the_schedule_drains_batch_after_batch_and_stops_at_the_deadline(pool: PgPool) {
        // 250 pending events, as receive's claim leaves them.
        query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
             SELECT 'github', format('d-%s', lpad(i::text, 3, '0')), 'ping', '{}', 'pending', '\\x7b7d', '{}', 0
             FROM generate_series(0, 249) AS i",
        )
        .execute(&pool)
        .await
        .unwrap();
        let w = worker(pool.clone());
        let past = on_schedule(&w, Instant::now()).await.unwrap();
        assert_eq!(past.taken, 0, "past the deadline no event is started");
        let untouched: i64 =
            query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND attempts = 0")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(untouched, 250);
        let all = on_schedule(&w, Instant::now() + Duration::from_secs(30)).await.unwrap();
        assert_eq!(all.taken, 250, "batch after batch, until a short one");
    }

    /// A run that could not do its work fails, so the Lambda's Errors metric sees the outage.
    #[tokio::test]
    async fn both_triggers_fail_the_invocation_when_the_database_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cfg = DbConfig::with_url("unused: the connect options are given");
        cfg.acquire_timeout = Duration::from_millis(500);
        let options: PgConnectOptions = format!("postgres://postgres@127.0.0.1:{port}/postgres").parse().unwrap();
        let w = worker(cfg.pool_with(options));
        // EventBridge's scheduled event, as AWS documents it.
        let schedule = json!({
            "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa", "detail-type": "Scheduled Event",
            "source": "aws.events", "account": "123456789012", "time": "2026-11-29T21:00:00Z", "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/inbox-process"], "detail": {}
        });
        let (result, _) = handle_counted(&w, schedule, Instant::now() + Duration::from_secs(5)).await;
        let err = result.unwrap_err();
        assert!(matches!(err, ProcessError::Database { .. }), "{err}");
        // An SQS batch of one message, as AWS documents it.
        let sqs = json!({"Records": [{
            "messageId": "m-1", "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a",
            "body": r#"{"provider":"stripe","event_id":"evt_1"}"#,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1796000000000",
                           "SenderId": "AIDAIENQZJOLO23YVJ4VO", "ApproximateFirstReceiveTimestamp": "1796000000001"},
            "messageAttributes": {}, "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:inbox", "awsRegion": "us-east-1"
        }]});
        let (result, _) = handle_counted(&w, sqs, Instant::now()).await;
        let err = result.unwrap_err();
        assert!(err.to_string().starts_with("processing stopped on a database error"), "{err}");
    }
}
