//! Lambda `relay` (scheduled): delivers outbox messages until a short batch or
//! the deadline less a margin. The logic is `webhook_inbox::relay`.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{self, DbConfig, SinkConfig},
    db,
    relay::{Relay, RelayConfig},
    runtime::{deadline, stage::Stage},
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    let sinks = SinkConfig::read(&env)?.build().await?;
    if sinks.is_empty() {
        return Err("no sink configured: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL or RELAY_EVENT_BUS".into());
    }
    let relay = Relay::new(db::pool(&DbConfig::read(&env, 1)?)?, sinks, RelayConfig::read(&env)?);
    let margin = config::deadline_margin(&env)?;
    let relay = &relay;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let relayed = match relay.run(deadline::drain_until(event.context.deadline, margin)).await {
            Ok(relayed) => relayed,
            Err(stopped) => {
                stopped.tally.metrics().emit();
                return Err(stopped.into());
            }
        };
        relayed.metrics().emit();
        tracing::info!(?relayed, "relayed");
        Ok::<_, Error>(serde_json::to_value(relayed)?)
    }))
    .await
}
