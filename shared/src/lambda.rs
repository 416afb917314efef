//! One entry point per Lambda function: each reads its configuration (Secrets
//! Manager included), builds its pool once per instance, and serves
//! invocations until the runtime stops it. A function's `main` is one call:
//!
//! ```no_run
//! #[tokio::main]
//! async fn main() -> Result<(), webhook_inbox::lambda::Error> {
//!     let app = webhook_inbox::App::new(webhook_inbox::Handlers::new()); // your handlers, migrations, ...
//!     webhook_inbox::lambda::process(app).await
//! }
//! ```
//!
//! `receive`, `process`, `migrate`, `reconcile` and `relay` take the
//! application (its handlers for inline mode and the worker, its migrations,
//! its sources, its sinks); `prune` needs none, and the stock `relay` binary
//! serves any application without sinks of its own.

use std::{sync::Arc, time::Duration};

use serde_json::Value;

pub use lambda_http::Error;
use lambda_http::{
    lambda_runtime::{self, service_fn, LambdaEvent},
    Request,
};

use crate::{
    app::App,
    config::{self, DbConfig},
    process::{
        self,
        worker::{Worker, WorkerConfig},
    },
    prune::{PruneConfig, Pruner},
    receive::notify::ProcessQueue,
    runtime::{
        deadline,
        stage::{Reported, Stage},
    },
    ReceiveConfig, Receiver,
};

/// How often a receive instance adds its counts to `inbox_receive_minutes`
/// (after a delivery, when this much has passed since the last time).
const TALLY_EVERY: Duration = Duration::from_secs(60);

/// `receive`: `POST /webhooks/{provider}` behind API Gateway (REST or HTTP
/// API), a Function URL or an ALB; inline mode runs `app`'s handlers.
pub async fn receive(app: App) -> Result<(), Error> {
    config::init_logging();
    // Built once per Lambda instance: one request at a time, so one connection, made on first use.
    let env = config::Env::resolved().await?;
    let config = ReceiveConfig::read(&env, 1)?;
    let mut receiver = Receiver::from_config(&config)?.with_app(&app);
    if let Some(url) = &config.process_queue_url {
        receiver = receiver.with_process_queue(ProcessQueue::connect(url).await);
    }
    let receiver = Arc::new(receiver);
    lambda_http::run(lambda_http::service_fn(move |req: Request| {
        let receiver = receiver.clone();
        async move {
            let (response, metrics) = receiver.handle_counted(req).await;
            metrics.emit();
            // The console's per-minute counts: at most one statement a minute, on this instance's connection.
            if let Err(e) = receiver.write_tally(TALLY_EVERY).await {
                tracing::warn!(error = %e, "writing receive's counts to inbox_receive_minutes");
            }
            Ok::<_, Error>(response)
        }
    }))
    .await
}

/// `process`: on an EventBridge schedule, drains pending events until the
/// deadline less a margin; on SQS, processes the events the messages name and
/// reports partial batch failures. `app`'s handlers apply them. With
/// `INBOX_RELAY_QUEUE_URL`, an invocation whose handlers wrote outbox
/// messages tells the relay's queue, so they leave at once.
pub async fn process(app: App) -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    // One invocation at a time, one batch at a time: one connection.
    let pool = DbConfig::read(&env, 1)?.pool()?;
    let margin = config::deadline_margin(&env)?;
    let apis = crate::process::hints::Apis::read(&env, &app)?;
    let worker = Arc::new(Worker::new(pool, app.handlers().clone(), WorkerConfig::read(&env)?).with_apis(apis));
    let alerts = Arc::new(crate::alerts::AlertRules::read(&env)?);
    let relay_queue = match env.var("INBOX_RELAY_QUEUE_URL") {
        Some(url) => Some(Arc::new(crate::receive::notify::RelayQueue::connect(url).await)),
        None => None,
    };
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let (worker, relay_queue, alerts) = (worker.clone(), relay_queue.clone(), alerts.clone());
        async move {
            let deadline = deadline::drain_until(event.context.deadline, margin);
            let (result, mut metrics) = process::handle_counted(&worker, event.payload, deadline).await;
            // Whichever invocation comes first in a minute evaluates them.
            crate::alerts::evaluate_counted(&alerts, worker.pool(), &mut metrics).await;
            metrics.emit();
            // The messages the handlers wrote leave now, not at the relay's next schedule.
            if let (Some(queue), true) = (&relay_queue, worker.take_written() > 0) {
                queue.nudge().await;
            }
            Ok::<_, Error>(result?)
        }
    }))
    .await
}

/// `prune` (scheduled): retention in batches until done or the deadline less
/// a margin. A retention shorter than a provider's redelivery window stops it
/// at start-up, with the reason.
pub async fn prune() -> Result<(), Error> {
    config::init_logging();
    let env = config::Env::resolved().await?;
    let pruner = Pruner::new(DbConfig::read(&env, 1)?.pool()?, PruneConfig::read(&env)?);
    scheduled(pruner, config::deadline_margin(&env)?).await
}

/// `relay` (scheduled, and nudged by `process` when it wrote messages):
/// delivers outbox messages to their destinations (the `RELAY_*` variables and
/// `RELAY_DESTINATIONS_FILE`, with `app`'s own sinks, [`App::with_sink`])
/// until every destination's backlog is drained or the deadline less a margin.
#[cfg(feature = "relay")]
pub async fn relay(app: App) -> Result<(), Error> {
    use crate::{
        config::Destinations,
        relay::{Relay, RelayConfig},
    };
    config::init_logging();
    let env = config::Env::resolved().await?;
    let destinations = Destinations::read(&env)?;
    if destinations.is_empty() {
        return Err("no destination configured: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS or RELAY_DESTINATIONS_FILE".into());
    }
    let destinations = destinations.build(&app).await?;
    let relay = Relay::new(DbConfig::read(&env, 1)?.pool()?, destinations, RelayConfig::read(&env)?);
    scheduled(relay, config::deadline_margin(&env)?).await
}

/// `reconcile` (scheduled): fetches what providers never delivered, from the
/// sources the environment configures and `app`'s own ([`App::with_source`]).
#[cfg(feature = "reconcile")]
pub async fn reconcile(app: App) -> Result<(), Error> {
    use crate::reconcile::Reconciler;
    config::init_logging();
    let env = config::Env::resolved().await?;
    let reconciler = Reconciler::read(&env, &app, DbConfig::read(&env, 1)?.pool()?)?;
    if !reconciler.is_configured() {
        return Err(crate::reconcile::NOTHING_TO_RECONCILE.into());
    }
    scheduled(reconciler, config::deadline_margin(&env)?).await
}

/// A scheduled function: each invocation runs `stage` until its work is done
/// or the deadline less `margin`, writes its metrics, and answers its counts,
/// or fails with what stopped it (a database error; a source that failed).
async fn scheduled<S>(stage: S, margin: Duration) -> Result<(), Error>
where
    S: Stage,
    S::Tally: Reported,
{
    let stage = &stage;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let tally = match stage.run(deadline::drain_until(event.context.deadline, margin)).await {
            Ok(tally) => tally,
            Err(stopped) => {
                stopped.tally.metrics().iter().for_each(|m| m.emit());
                return Err(stopped.into());
            }
        };
        tally.metrics().iter().for_each(|m| m.emit());
        tracing::info!(stage = S::NAME, ?tally, "done");
        if let Some(failed) = tally.failures() {
            return Err(Error::from(failed));
        }
        Ok::<_, Error>(serde_json::to_value(tally)?)
    }))
    .await
}

/// `migrate`: the CloudFormation custom resource that applies the inbox's
/// migrations, then `app`'s, before the other functions take traffic.
#[cfg(feature = "migrate")]
pub async fn migrate(app: App) -> Result<(), Error> {
    use std::time::Duration;

    use aws_lambda_events::event::cloudformation::CloudFormationCustomResourceRequest;

    config::init_logging();
    let http = crate::core::http::http_client(Duration::from_secs(10))?;
    // A configuration that cannot be read (a secret it may not read, say) is
    // still answered, as a failure with the reason: CloudFormation would
    // otherwise wait for an answer that never comes.
    let pool =
        async { Ok::<_, Error>(DbConfig::read(&config::Env::resolved().await?, 1)?.pool()?) }.await.map_err(|e| {
            tracing::error!(error = %e, "cannot start; every request is answered FAILED");
            format!("cannot start: {e}")
        });
    let urls = crate::migrate::ResponseUrls::read(&config::Env::process());
    let (pool, http, app, urls) = (&pool, &http, &app, &urls);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<CloudFormationCustomResourceRequest>| async move {
        // Time to answer CloudFormation after the migrations stop.
        let until = deadline::drain_until(event.context.deadline, Duration::from_secs(15));
        let db = pool.as_ref().map_err(String::as_str);
        Ok::<_, Error>(crate::migrate::on_custom_resource(app, event.payload, db, http, urls, until).await?)
    }))
    .await
}
