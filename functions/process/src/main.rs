//! Lambda `process`: on an EventBridge schedule, drains pending events until the
//! deadline less a margin; on SQS, processes the events the messages name and
//! reports partial batch failures. The logic is `webhook_inbox::process`.

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{self, DbConfig},
    db,
    process::{
        self,
        handlers::Handlers,
        worker::{Worker, WorkerConfig},
    },
    runtime::deadline,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    // One invocation at a time, one batch at a time: one connection.
    let pool = db::pool(&DbConfig::read(&env, 1)?)?;
    let margin = config::deadline_margin(&env)?;
    let worker = Arc::new(Worker::new(pool, Handlers::reference(), WorkerConfig::read(&env)?));
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let worker = worker.clone();
        async move {
            let deadline = deadline::drain_until(event.context.deadline, margin);
            let (result, metrics) = process::handle_counted(&worker, event.payload, deadline).await;
            metrics.emit();
            Ok::<_, Error>(result?)
        }
    }))
    .await
}
