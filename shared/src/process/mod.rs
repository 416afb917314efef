//! Processing: the handler registry, the worker, and the `process` function's
//! two triggers (schedule and SQS), as plain functions tests call directly.

pub mod handler;
pub mod handlers;
pub mod hints;
pub(crate) mod inline;
pub mod worker;

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
pub enum ProcessError {
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

/// Dispatches on the event's shape: an SQS batch (`Records`) or a schedule (anything else).
#[cfg(feature = "internals")]
pub async fn handle(worker: &Worker, event: Value, deadline: Instant) -> Result<Value, ProcessError> {
    handle_counted(worker, event, deadline).await.0
}

/// [`handle`], and the invocation's metrics: its counts, and on a schedule the
/// queue's gauges (`pending`, `oldest_pending_age`, `failed_last_hour`,
/// `outbox_backlog`, `outbox_oldest_age`), taken once a minute whatever else runs.
pub async fn handle_counted(
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
pub async fn on_schedule(worker: &Worker, deadline: Instant) -> Result<Processed, ProcessError> {
    stage::run(worker, deadline).await.map_err(|Stopped { tally, source }| {
        tracing::error!(error = %source, counts = ?tally, "drain stopped");
        ProcessError::Database { counts: tally, source }
    })
}

/// The SQS message body that names one inbox event.
#[derive(Debug, Deserialize)]
pub struct EventRef {
    pub provider: String,
    pub event_id: String,
}

/// SQS: each message names one event. Only the messages that must come back
/// (unreadable, or a transient failure to retry) are reported as failures; the
/// others are deleted from the queue. Never a whole-batch failure for one message.
/// An event that is not due (in backoff), already done, or held by another
/// worker is acknowledged: the schedule owns it from there. If the database
/// could not be reached, the invocation fails (the whole batch comes back, and
/// what was done is acknowledged as done next time).
#[cfg(feature = "internals")]
pub async fn on_sqs(worker: &Worker, event: SqsEvent) -> Result<SqsBatchResponse, ProcessError> {
    sqs_counted(worker, event).await.0
}

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
