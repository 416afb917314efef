//! Lambda `prune` (scheduled): retention in batches until done or the deadline
//! less a margin. The logic is `webhook_inbox::retention`.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{self, DbConfig},
    db,
    retention::{Pruner, RetentionConfig},
    runtime::{deadline, stage::Stage},
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    // A retention shorter than a provider's redelivery window stops the function here, with the reason.
    let env = config::Env::resolved().await?;
    let pruner = Pruner::new(db::pool(&DbConfig::read(&env, 1)?)?, RetentionConfig::read(&env)?);
    let margin = config::deadline_margin(&env)?;
    let pruner = &pruner;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let pruned = match pruner.run(deadline::drain_until(event.context.deadline, margin)).await {
            Ok(pruned) => pruned,
            Err(stopped) => {
                stopped.tally.metrics().emit();
                return Err(stopped.into());
            }
        };
        pruned.metrics().emit();
        tracing::info!(?pruned, "pruned");
        Ok::<_, Error>(serde_json::to_value(pruned)?)
    }))
    .await
}
