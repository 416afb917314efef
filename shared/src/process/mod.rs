//! Processing: the handler registry, the worker, and the `process` function's
//! two triggers (schedule and SQS), as plain functions tests call directly.

pub mod handlers;
pub mod worker;

use std::time::Instant;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::Deserialize;
use serde_json::Value;

use self::worker::{Counts, Worker};
use crate::runtime::stage::{self, Stopped, Tally};

/// Why an invocation failed. A run that could not do its work is an error, so
/// the Lambda's `Errors` metric (and its alarm) sees an outage.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("the invocation event is not an SQS batch: {0}")]
    BadEvent(#[from] serde_json::Error),
    /// The counts of the batches that committed before the error are kept.
    #[error("processing stopped on a database error after {counts:?}: {source}")]
    Database {
        counts: Counts,
        #[source]
        source: sqlx::Error,
    },
}

/// Dispatches on the event's shape: an SQS batch (`Records`) or a schedule (anything else).
pub async fn handle(worker: &Worker, event: Value, deadline: Instant) -> Result<Value, ProcessError> {
    if event.get("Records").is_some() {
        let sqs: SqsEvent = serde_json::from_value(event)?;
        Ok(serde_json::to_value(on_sqs(worker, sqs).await?)?)
    } else {
        Ok(serde_json::to_value(on_schedule(worker, deadline).await?)?)
    }
}

/// EventBridge schedule: drain batch after batch until a short batch or the
/// deadline; an error if the drain stopped on the database.
pub async fn on_schedule(worker: &Worker, deadline: Instant) -> Result<Counts, ProcessError> {
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
pub async fn on_sqs(worker: &Worker, event: SqsEvent) -> Result<SqsBatchResponse, ProcessError> {
    let mut response = SqsBatchResponse::default();
    let mut counts = Counts::default();
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
                return Err(ProcessError::Database { counts, source });
            }
        }
    }
    Ok(response)
}
