//! Lambda `migrate`: the CloudFormation custom resource that applies the
//! schema before the other functions take traffic. The logic is
//! `webhook_inbox::migrate`.

use std::time::Duration;

use aws_lambda_events::event::cloudformation::CloudFormationCustomResourceRequest;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use webhook_inbox::{
    config::{self, DbConfig},
    core::http::http_client,
    db, migrate,
    runtime::deadline,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    let pool = db::pool(&DbConfig::read(&env, 1)?)?;
    let http = http_client(Duration::from_secs(10))?;
    let (pool, http) = (&pool, &http);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<CloudFormationCustomResourceRequest>| async move {
        // Time to answer CloudFormation after the migrations stop.
        let until = deadline::drain_until(event.context.deadline, Duration::from_secs(15));
        Ok::<_, Error>(migrate::on_custom_resource(event.payload, pool, http, until).await?)
    }))
    .await
}
