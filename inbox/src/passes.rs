//! The one-pass commands: `inbox relay`, `reconcile` and `prune` run one
//! pass of their stage as its function would, and `migrate` applies the
//! migrations; each says what it did.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use webhook_inbox::{
    config::{self, DbConfig},
    reconciliation::{Reconciler, NOTHING_TO_RECONCILE},
    PruneConfig, Pruner, Relay, RelayConfig, Stage,
};

/// One relay pass over every configured destination.
pub(crate) async fn relay() -> Result<()> {
    let env = config::Env::resolved().await?;
    let destinations = config::Destinations::read(&env)?;
    anyhow::ensure!(
        !destinations.is_empty(),
        "no destination configured: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS or RELAY_DESTINATIONS_FILE"
    );
    let relay = Relay::new(database(&env)?, destinations.build(&stock::app()).await?, RelayConfig::read(&env)?);
    let r = relay.run(one_pass_deadline()).await?;
    say!(
        "relayed: {} leased, {} sent, {} to retry, {} dead, {} released unstarted; {} destination(s) paused, {} open; {} message(s) for no configured destination",
        r.leased,
        r.sent,
        r.retried,
        r.dead,
        r.released,
        r.paused,
        r.open,
        r.unrouted
    );
    Ok(())
}

/// One reconciliation of every configured source.
pub(crate) async fn reconcile() -> Result<()> {
    let env = config::Env::resolved().await?;
    let pool = database(&env)?;
    let reconciler = Reconciler::read(&env, &stock::app(), pool)?;
    anyhow::ensure!(reconciler.is_configured(), NOTHING_TO_RECONCILE);
    let reconciled = reconciler.run_once(one_pass_deadline()).await;
    for (source, f) in &reconciled.sources {
        say!(
            "{source}: {} fetched, {} new, {} already known, {} kept as failed{}",
            f.fetched,
            f.applied,
            f.already_known,
            f.failed,
            if f.finished { "" } else { " (stopped at the deadline: run it again to go on)" }
        );
    }
    for (source, e) in &reconciled.failed {
        say!("{source}: failed: {e}");
    }
    anyhow::ensure!(reconciled.failed.is_empty(), "{} reconciliation(s) failed", reconciled.failed.len());
    Ok(())
}

/// One prune pass (and its archive, when configured).
pub(crate) async fn prune() -> Result<()> {
    let env = config::Env::resolved().await?;
    let pruner = Pruner::new(database(&env)?, PruneConfig::read(&env)?);
    let pruned = pruner.run(one_pass_deadline()).await?;
    say!(
        "pruned: {} done, unhandled or ignored inbox rows, {} failed inbox rows, {} sent outbox messages, {} batch bodies, {} replay guards",
        pruned.done, pruned.failed, pruned.outbox, pruned.bodies, pruned.guards
    );
    if pruned.archived + pruned.not_archived > 0 {
        say!("archived: {} inbox rows in {} objects", pruned.archived, pruned.archive_objects);
    }
    match &pruned.archive_error {
        Some(e) => anyhow::bail!("{} inbox rows kept, not archived: {e}", pruned.not_archived),
        None => Ok(()),
    }
}

/// The inbox's migrations and the stock application's, on DATABASE_URL.
pub(crate) async fn migrate(app: webhook_inbox::App, stock: bool) -> Result<()> {
    let config = DbConfig::read(&config::Env::resolved().await?, 1)?;
    let url = config.url.clone().context("DATABASE_URL is not set")?;
    let version = app.migrate(&config.pool()?).await.context("applying migrations")?;
    let and_stock = if stock { " and the stock application's" } else { "" };
    say!("the inbox's migrations (version {version}){and_stock} applied to {}", config::redact_url(&url));
    Ok(())
}

/// A one-connection pool on DATABASE_URL, for the one-pass commands.
fn database(env: &config::Env) -> Result<sqlx::PgPool> {
    let config = DbConfig::read(env, 1)?;
    anyhow::ensure!(config.url.is_some(), "DATABASE_URL is not set");
    Ok(config.pool()?)
}

/// A one-pass command stops starting batches after this long, as a Lambda would at its deadline.
fn one_pass_deadline() -> Instant {
    Instant::now() + Duration::from_secs(900)
}
