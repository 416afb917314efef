//! Lambda `prune` (scheduled): retention in batches until done or the deadline
//! less a margin. The logic is `webhook_inbox::retention`.

use std::time::Duration;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{parse_env, DbConfig},
    db, process,
    retention::{Pruner, RetentionConfig},
    telemetry,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    // A retention shorter than a provider's redelivery window stops the function here, with the reason.
    let pruner = Pruner::new(db::pool(&DbConfig::from_env(1)?)?, RetentionConfig::from_env()?);
    let margin = Duration::from_millis(parse_env("INBOX_DEADLINE_MARGIN_MS", process::DEFAULT_DEADLINE_MARGIN.as_millis() as u64)?);
    let pruner = &pruner;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let pruned = pruner.run(process::drain_until(event.context.deadline, margin)).await?;
        tracing::info!(?pruned, "pruned");
        Ok::<_, Error>(serde_json::to_value(pruned)?)
    }))
    .await
}
