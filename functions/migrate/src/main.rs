//! Lambda `migrate`: the CloudFormation custom resource that applies the
//! schema before the other functions take traffic. The logic is
//! `webhook_inbox::migrate`.

use std::time::Duration;

use aws_lambda_events::event::cloudformation::CloudFormationCustomResourceRequest;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use sqlx::PgPool;
use webhook_inbox::{
    config::{self, DbConfig},
    core::http::http_client,
    db, migrate,
    runtime::deadline,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let http = http_client(Duration::from_secs(10))?;
    // A configuration that cannot be read (a secret it may not read, say) is
    // still answered, as a failure with the reason: CloudFormation would
    // otherwise wait for an answer that never comes.
    let pool = database().await.map_err(|e| {
        tracing::error!(error = %e, "cannot start; every request is answered FAILED");
        format!("cannot start: {e}")
    });
    let (pool, http) = (&pool, &http);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<CloudFormationCustomResourceRequest>| async move {
        // Time to answer CloudFormation after the migrations stop.
        let until = deadline::drain_until(event.context.deadline, Duration::from_secs(15));
        let db = pool.as_ref().map_err(String::as_str);
        Ok::<_, Error>(migrate::on_custom_resource(event.payload, db, http, until).await?)
    }))
    .await
}

async fn database() -> Result<PgPool, Error> {
    let env = config::Env::resolved().await?;
    Ok(db::pool(&DbConfig::read(&env, 1)?)?)
}
