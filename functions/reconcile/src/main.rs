//! Lambda `reconcile` (scheduled): fetch what providers never delivered. The
//! logic is `webhook_inbox::reconcile`.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{Map, Value};
use webhook_inbox::{
    config::{self, DbConfig},
    db,
    reconcile::Reconciler,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_logging();
    let reconciler = Reconciler::from_env()?;
    if !reconciler.is_configured() {
        return Err("nothing to reconcile: set STRIPE_API_KEY, or SHOPIFY_SHOP_DOMAIN and SHOPIFY_ACCESS_TOKEN".into());
    }
    let pool = db::pool(&DbConfig::from_env(1)?)?;
    let (reconciler, pool) = (&reconciler, &pool);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<Value>| async move {
        let mut out = Map::new();
        let mut failed = Vec::new();
        for (source, result) in reconciler.run(pool).await {
            match result {
                Ok(found) => {
                    tracing::info!(source, ?found, "reconciled");
                    out.insert(source.to_string(), serde_json::to_value(found)?);
                }
                Err(e) => {
                    tracing::error!(source, error = %e, "reconcile failed");
                    failed.push(format!("{source}: {e}"));
                }
            }
        }
        if !failed.is_empty() {
            return Err(Error::from(failed.join("; ")));
        }
        Ok::<_, Error>(Value::Object(out))
    }))
    .await
}
