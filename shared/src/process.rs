//! The `process` function's two triggers, as plain functions tests call directly.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::Deserialize;
use serde_json::Value;

use crate::worker::{Counts, Worker};

/// `INBOX_DEADLINE_MARGIN_MS`, default 3000: a scheduled drain stops starting
/// batches this long before the Lambda deadline.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(3000);

/// `INBOX_DEADLINE_MARGIN_MS`, for every scheduled function.
pub fn deadline_margin_from_env() -> Result<Duration, crate::config::ConfigError> {
    let ms = crate::config::parse_env(
        "INBOX_DEADLINE_MARGIN_MS",
        DEFAULT_DEADLINE_MARGIN.as_millis() as u64,
    )?;
    Ok(Duration::from_millis(ms))
}

/// Dispatches on the event's shape: an SQS batch (`Records`) or a schedule (anything else).
pub async fn handle(
    worker: &Worker,
    event: Value,
    deadline: Instant,
) -> Result<Value, serde_json::Error> {
    if event.get("Records").is_some() {
        let sqs: SqsEvent = serde_json::from_value(event)?;
        serde_json::to_value(on_sqs(worker, sqs).await)
    } else {
        serde_json::to_value(on_schedule(worker, deadline).await)
    }
}

/// The Lambda deadline (milliseconds since the epoch) less the margin, as an `Instant`.
pub fn drain_until(deadline_epoch_ms: u64, margin: Duration) -> Instant {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Instant::now()
        + Duration::from_millis(deadline_epoch_ms.saturating_sub(now_ms)).saturating_sub(margin)
}

#[derive(Debug, serde::Serialize)]
pub struct ScheduleOutcome {
    #[serde(flatten)]
    pub counts: Counts,
    pub error: Option<String>,
}

/// EventBridge schedule: drain batch after batch until a short batch or the deadline.
pub async fn on_schedule(worker: &Worker, deadline: Instant) -> ScheduleOutcome {
    let (counts, error) = worker.drain(deadline).await;
    let error = error.map(|e| {
        tracing::error!(error = %e, "drain stopped");
        "database unavailable".to_string()
    });
    ScheduleOutcome { counts, error }
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
/// worker is acknowledged: the schedule owns it from there.
pub async fn on_sqs(worker: &Worker, event: SqsEvent) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in event.records {
        let id = message.message_id.clone().unwrap_or_default();
        let Some(target) = message
            .body
            .as_deref()
            .and_then(|b| serde_json::from_str::<EventRef>(b).ok())
        else {
            tracing::error!(message_id = %id, "SQS message is not {{\"provider\",\"event_id\"}}; returned to the queue (its DLQ keeps it)");
            response.add_failure(id);
            continue;
        };
        match worker.run_event(&target.provider, &target.event_id).await {
            Ok(counts) if counts.retried == 0 => {}
            Ok(_) => response.add_failure(id),
            Err(e) => {
                tracing::warn!(message_id = %id, error = %e, "processing failed; message returned to the queue");
                response.add_failure(id);
            }
        }
    }
    response
}
