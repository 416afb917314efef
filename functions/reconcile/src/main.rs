//! Lambda `reconcile` (scheduled): fetch what providers never delivered. The
//! logic is `webhook_inbox::reconcile`.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use webhook_inbox::{
    config::{self, DbConfig},
    db,
    reconcile::Reconciler,
    runtime::deadline,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    let reconciler = Reconciler::read(&env)?;
    if !reconciler.is_configured() {
        return Err("nothing to reconcile: set STRIPE_API_KEY, or SHOPIFY_SHOP_DOMAIN and SHOPIFY_ACCESS_TOKEN".into());
    }
    let pool = db::pool(&DbConfig::read(&env, 1)?)?;
    let margin = config::deadline_margin(&env)?;
    let (reconciler, pool) = (&reconciler, &pool);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let deadline = deadline::drain_until(event.context.deadline, margin);
        let reconciled = reconciler.run_once(pool, deadline).await;
        reconciled.metrics().iter().for_each(|m| m.emit());
        if !reconciled.failed.is_empty() {
            let failed: Vec<String> = reconciled.failed.iter().map(|(source, e)| format!("{source}: {e}")).collect();
            return Err(Error::from(failed.join("; ")));
        }
        Ok::<_, Error>(serde_json::to_value(reconciled)?)
    }))
    .await
}
