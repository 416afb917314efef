//! Lambda `relay` (scheduled): delivers outbox messages until a short batch or
//! the deadline less a margin. The logic is `webhook_inbox::relay`.

use std::time::Duration;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{parse_env, DbConfig},
    db, process,
    relay::{sinks_from_env, Relay, RelayConfig},
    telemetry,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let sinks = sinks_from_env().await?;
    if sinks.is_empty() {
        return Err("no sink configured: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL or RELAY_EVENT_BUS".into());
    }
    let relay = Relay::new(db::pool(&DbConfig::from_env(1)?)?, sinks, RelayConfig::from_env()?);
    let margin = Duration::from_millis(parse_env("INBOX_DEADLINE_MARGIN_MS", process::DEFAULT_DEADLINE_MARGIN.as_millis() as u64)?);
    let relay = &relay;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let relayed = relay.run(process::drain_until(event.context.deadline, margin)).await?;
        tracing::info!(?relayed, "relayed");
        Ok::<_, Error>(serde_json::to_value(relayed)?)
    }))
    .await
}
