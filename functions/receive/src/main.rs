//! Lambda `receive`: `POST /webhooks/{provider}` behind API Gateway (REST or
//! HTTP API), a Function URL or an ALB. The logic is `webhook_inbox::Receiver`.

use std::sync::Arc;

use lambda_http::{service_fn, Error, Request};
use webhook_inbox::{config, db, ingest::notify::ProcessQueue, ReceiveConfig, Receiver};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    // Built once per Lambda instance: one request at a time, so one connection, made on first use.
    let env = config::Env::resolved().await?;
    let config = ReceiveConfig::read(&env, 1)?;
    let mut receiver = Receiver::new(db::Connections::new(&config.db)?, &config);
    if let Some(url) = &config.process_queue_url {
        receiver = receiver.with_process_queue(ProcessQueue::connect(url).await);
    }
    let receiver = Arc::new(receiver);
    lambda_http::run(service_fn(move |req: Request| {
        let receiver = receiver.clone();
        async move {
            let (response, metrics) = receiver.handle_counted(req).await;
            metrics.emit();
            Ok::<_, Error>(response)
        }
    }))
    .await
}
