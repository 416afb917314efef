//! The long-running service: `inbox serve`, for a container (ECS, Kubernetes,
//! Fly, a VM) rather than Lambda, with the same binaries' stages, read from
//! the same configuration and secrets as the functions read them.
//!
//! [`run`] serves the [`Role`]s it is given (by default every role but the
//! console), so that one image runs as one deployment or as several:
//! `POST /webhooks/{provider}` with group commit at receive (deliveries that
//! arrive together claimed in one statement and one commit, see
//! [`GroupConfig`]), the worker, the relay, prune and reconcile on their
//! schedules, and the console. Beside them, on the admin port, `/healthz`
//! (alive), `/readyz` (the database reachable and every migration applied)
//! and Prometheus `/metrics` (the repository's `docs/serve.md` lists every
//! metric); the main port answers `/healthz` and `/readyz` too, for a load
//! balancer's checks. With `OTEL_EXPORTER_OTLP_ENDPOINT`, each delivery is one
//! OpenTelemetry trace from its receive through its processing to the relay of
//! the messages its handler wrote.
//!
//! On SIGTERM (or Ctrl-C) it drains: `/readyz` answers 503, no new
//! connection is taken, every delivery in flight is answered once its claim
//! has committed, each stage finishes the batch it is in (its row locks and
//! leases go with the commit), all within `INBOX_DRAIN_TIMEOUT_MS`; past it,
//! what is still in flight is answered 503 (and sent again by its provider)
//! and the stages' transactions roll back.
//!
//! A team's own service is one call:
//!
//! ```no_run
//! # fn app() -> webhook_inbox::App { webhook_inbox::App::default() }
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     webhook_inbox::serve::run(app(), webhook_inbox::serve::Settings::default()).await
//! }
//! ```

mod health;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod metrics;
#[cfg(not(feature = "internals"))]
mod metrics;
mod roles;

use std::{
    future::Future,
    net::SocketAddr,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    net::TcpListener,
    sync::{watch, Notify},
    task::JoinHandle,
};

use health::{health_router, Readiness};
pub use roles::{Role, Roles};

pub use crate::receive::claim::group::GroupConfig;
pub(crate) use crate::server::CONSOLE_PATH;
use crate::{
    app::App,
    config::{ConfigError, Destinations, Env, ServeConfig},
    process::worker::{Worker, WorkerConfig},
    prune::{PruneConfig, Pruner},
    reconcile::Reconciler,
    relay::{Relay, RelayConfig},
    runtime::{
        metrics::Metrics,
        stage::{self, Reported},
    },
    server, ReceiveConfig, Receiver,
};

/// What [`run`] is told beyond the environment: each `None` is read from it.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `INBOX_ROLES`; by default every role but the console.
    pub roles: Option<Roles>,
    /// `INBOX_HOST`, default `0.0.0.0` (a container's every interface).
    pub host: Option<String>,
    /// `PORT`, default 8080: the webhooks, the console, `/healthz` and `/readyz`.
    pub port: Option<u16>,
    /// `INBOX_ADMIN_HOST`, default the main host: where the admin port
    /// listens (`127.0.0.1`, or a private interface, to keep it off the one
    /// that faces the internet).
    pub admin_host: Option<String>,
    /// `INBOX_ADMIN_PORT`, default 9090: `/healthz`, `/readyz` (saying why
    /// not ready) and `/metrics`, for what should not face the internet.
    pub admin_port: Option<u16>,
    /// Apply the migrations (the inbox's, then the application's) before
    /// serving, as `inbox migrate` does; by default they must be there
    /// already, and `/readyz` says so until they are.
    pub migrate: bool,
}

/// A line on stdout; a closed stdout is no panic.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// Serves `receiver` (`POST /webhooks/{provider}`) on `listener` until
/// `shutdown` completes, then drains, as [`run`] receives: its listener (the
/// header and body timeouts, the connection cap, each connection on its own
/// task), every delivery counted in the process's Prometheus metrics. For a
/// binary that runs receive beside stages of its own.
pub async fn webhooks(
    listener: TcpListener,
    receiver: std::sync::Arc<crate::Receiver>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    metrics::install().map_err(std::io::Error::other)?;
    let site = server::Site { count: Some(metrics::delivered), ..server::Site::webhooks(receiver) };
    server::serve_site(listener, site, server::Limits::default(), shutdown, Duration::from_secs(10)).await;
    Ok(())
}

/// Serves `app` as `settings` and the environment say, until SIGTERM or
/// Ctrl-C, then drains (see the module's documentation). No embedded
/// PostgreSQL and no development secret: `DATABASE_URL` and the providers'
/// secrets (Secrets Manager's `*_ARN` included) are read as the functions
/// read them.
pub async fn run(app: App, settings: Settings) -> Result<()> {
    crate::config::init_logging();
    crate::runtime::keep_large_allocations_mapped();
    let env = Env::resolved().await?;
    let roles = match settings.roles.clone() {
        Some(roles) => roles,
        None => match env.var("INBOX_ROLES") {
            Some(text) => {
                Roles::parse(&text).map_err(|reason| ConfigError::Invalid { var: "INBOX_ROLES".into(), reason })?
            }
            None => Roles::default(),
        },
    };
    let config = ReceiveConfig::read(&env, 16)?;
    anyhow::ensure!(config.db.url.is_some(), "DATABASE_URL is not set: inbox serve runs on a database of yours");
    if roles.has(Role::Receive) && config.secrets.none_configured() {
        anyhow::bail!("no webhook secret is set (STRIPE_WEBHOOK_SECRET, ...): receive would refuse every delivery; serve without the receive role, or set one");
    }
    let host = settings.host.clone().or_else(|| env.var("INBOX_HOST")).unwrap_or_else(|| "0.0.0.0".into());
    let port = match settings.port {
        Some(p) => p,
        None => env.parse("PORT", 8080)?,
    };
    let admin_port = match settings.admin_port {
        Some(p) => p,
        None => env.parse("INBOX_ADMIN_PORT", 9090)?,
    };
    let admin_host =
        settings.admin_host.clone().or_else(|| env.var("INBOX_ADMIN_HOST")).unwrap_or_else(|| host.clone());
    let serve = ServeConfig::read(&env)?;
    let traces = crate::config::otlp_traces(&env)?;
    if let Some((endpoint, service)) = &traces {
        crate::runtime::trace::install(endpoint, service).context("starting the OTLP trace exporter")?;
    }
    let pool = config.db.pool()?;
    if settings.migrate {
        app.migrate(&pool).await.context("applying migrations")?;
    }
    let main = TcpListener::bind((host.as_str(), port)).await.with_context(|| format!("binding {host}:{port}"))?;
    // One port for both when they are the same (0, a free port each, is two).
    let admin = if admin_port == port && admin_host == host && port != 0 {
        None
    } else {
        Some(
            TcpListener::bind((admin_host.as_str(), admin_port))
                .await
                .with_context(|| format!("binding {admin_host}:{admin_port}"))?,
        )
    };
    let stack = Stack { app: &app, env: &env, config: &config, pool, roles, serve, counted: true };
    let served = stack
        .run(main, admin, crate::runtime::shutdown_signal(), |addr, admin| {
            let admin = admin.map_or(String::new(), |a| format!("; /healthz, /readyz and /metrics on http://{a}"));
            let traces = traces.as_ref().map_or(String::new(), |_| "; traces over OTLP".into());
            say(&format!("inbox serve ready on http://{addr}{admin}{traces}"));
        })
        .await;
    // The spans still buffered go out before the process ends.
    tokio::task::spawn_blocking(crate::runtime::trace::shutdown).await?;
    served
}

/// The stages and listeners of one instance: `inbox serve`'s, and `inbox dev`'s.
pub(crate) struct Stack<'a> {
    pub app: &'a App,
    pub env: &'a Env<'a>,
    pub config: &'a ReceiveConfig,
    pub pool: sqlx::PgPool,
    pub roles: Roles,
    pub serve: ServeConfig,
    /// Deliveries and passes recorded in the Prometheus metrics.
    pub counted: bool,
}

impl Stack<'_> {
    /// Starts every role, says `ready` (with the main and admin addresses),
    /// and runs until `shutdown`; then drains.
    pub async fn run(
        self,
        main: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()>,
        ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
    ) -> Result<()> {
        let Stack { app, env, config, pool, roles, serve, counted } = self;
        if counted {
            metrics::install().context("installing the Prometheus recorder")?;
        }
        let readiness = Arc::new(Readiness::new(pool.clone(), app.clone()));
        let (stop, stopped) = watch::channel(false);
        // The stages start once every migration is applied (a worker on a schema without the
        // application's tables would fail their events).
        let (schema, schema_ready) = watch::channel(false);
        let gate = Gate { schema: schema_ready, stopped: stopped.clone() };

        // Every setting read, and every role checked, before anything starts.
        let limits = server::Limits::read(env)?;
        let worker_config = WorkerConfig::read(env)?;
        let apis = crate::process::hints::Apis::read(env, app)?;
        let destinations = if roles.has(Role::Relay) { Destinations::read(env)?.build(app).await? } else { vec![] };
        if roles.has(Role::Relay) && destinations.is_empty() {
            anyhow::ensure!(
                !roles.named,
                "the relay role has no destination: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS or RELAY_DESTINATIONS_FILE"
            );
            say("no relay destination (RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS, RELAY_DESTINATIONS_FILE): outbox messages stay in transactional_outbox");
        }
        let relay_config = if destinations.is_empty() { None } else { Some(RelayConfig::read(env)?) };
        let retention = if roles.has(Role::Prune) { Some(PruneConfig::read(env)?) } else { None };
        let reconciler =
            if roles.has(Role::Reconcile) { Some(Reconciler::read(env, app, pool.clone())?) } else { None };
        let reconciler = reconciler.filter(Reconciler::is_configured);
        anyhow::ensure!(
            !(roles.named && roles.has(Role::Reconcile) && reconciler.is_none()),
            "the reconcile role has {}",
            crate::reconcile::NOTHING_TO_RECONCILE
        );
        let console = if roles.has(Role::Console) {
            let read = crate::console::read_pool(env, &config.db)?.unwrap_or_else(|| pool.clone());
            Some(crate::console::router_at(
                pool.clone(),
                read,
                config.catalog.clone(),
                config.secrets.clone(),
                server::CONSOLE_PATH,
                crate::console::Settings::read(env)?,
            ))
        } else {
            None
        };
        let receiver = if roles.has(Role::Receive) {
            Some(Arc::new(Receiver::from_config(config)?.with_app(app).with_group_commit(serve.group)))
        } else {
            None
        };

        let mut stages: Vec<JoinHandle<()>> = vec![schema_watch(readiness.clone(), schema, stopped.clone())];
        if let Some(receiver) = &receiver {
            stages.push(tally_writer(receiver.clone(), gate.clone()));
        }
        // The workers tell the relay's lanes when they wrote outbox messages: a message leaves
        // at once, not at the lanes' next poll.
        let nudge = Arc::new(Notify::new());
        if roles.has(Role::Process) {
            for _ in 0..serve.workers {
                let worker = Worker::new(pool.clone(), app.handlers().clone(), worker_config.clone())
                    .with_apis(apis.clone())
                    .with_nudge(nudge.clone());
                stages.push(spawn_stage(worker, worker_config.poll, None, gate.clone(), counted));
            }
            if counted {
                stages.push(gauges(pool.clone(), gate.clone()));
            }
            let alerts = crate::alerts::AlertRules::read(env)?;
            if !alerts.is_empty() {
                stages.push(alerts_every(pool.clone(), alerts, gate.clone()));
            }
        }
        if let Some(relay_config) = relay_config {
            // Each destination on its own loop: a lane waits for nothing but its own destination.
            let (lanes, relay_gauges) = Relay::new(pool.clone(), destinations, relay_config).into_lanes();
            for lane in lanes {
                stages.push(spawn_stage(lane, worker_config.poll, Some(nudge.clone()), gate.clone(), counted));
            }
            if counted {
                stages.push(relay_gauges_every(relay_gauges, gate.clone()));
            }
        }
        if let Some(retention) = retention {
            let pruner = Pruner::new(pool.clone(), retention);
            stages.push(spawn_stage(pruner, Duration::from_secs(3600), None, gate.clone(), counted));
        }
        if let Some(reconciler) = reconciler {
            // Every 15 minutes, as the function's schedule.
            stages.push(spawn_stage(reconciler, Duration::from_secs(900), None, gate.clone(), counted));
        }

        let health = health_router(readiness.clone(), admin.is_none() && counted, false);
        let gate = console.is_some().then_some(crate::console::unauthenticated_api as server::Gate);
        let router = match console {
            Some(console) => health.clone().merge(console),
            None => health.clone(),
        };
        let main_routed: fn(&str) -> bool = if admin.is_none() && counted {
            |p| server::console_or_health(p) || p == "/metrics"
        } else {
            server::console_or_health
        };
        let count = counted.then_some(metrics::delivered as fn(&Metrics, Duration));
        let site =
            server::Site { receiver, router: Some(router), routed: main_routed, paged: server::console, gate, count };
        let main_addr = main.local_addr()?;
        let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;

        // Draining begins at `shutdown`: not ready, then the listeners drain.
        let (draining, drain_started) = watch::channel(false);
        let until_draining = |mut d: watch::Receiver<bool>| async move {
            let _ = d.wait_for(|d| *d).await;
        };
        let admin_server = admin.map(|admin| {
            let site = server::Site {
                receiver: None,
                router: Some(health_router(readiness.clone(), true, true)),
                routed: |_| true,
                paged: |_| false,
                gate: None,
                count: None,
            };
            // It answers through the drain (`/readyz` saying so), until the end.
            tokio::spawn(server::serve_site(admin, site, limits, std::future::pending(), Duration::ZERO))
        });
        let drain = serve.drain_timeout;
        let main_server = tokio::spawn(server::serve_site(main, site, limits, until_draining(drain_started), drain));
        ready(main_addr, admin_addr);

        shutdown.await;
        let started = Instant::now();
        // Not ready, then said: whoever reads the line finds /readyz already answering 503.
        readiness.draining.store(true, Ordering::SeqCst);
        let _ = draining.send(true);
        let _ = stop.send(true);
        say("draining: no new connection; finishing the deliveries and batches in flight");
        let cut = main_server.await.unwrap_or(0);
        // The stages finish their batches within what is left of the drain; past it, they are stopped
        // where they are (a batch's transaction rolls back: its events are pending again).
        let deadline = tokio::time::Instant::from_std(started + drain);
        let mut unfinished = 0;
        for stage in stages {
            let abort = stage.abort_handle();
            if tokio::time::timeout_at(deadline, stage).await.is_err() {
                abort.abort();
                unfinished += 1;
            }
        }
        if let Some(admin) = admin_server {
            admin.abort();
        }
        say(&format!(
            "drained in {} ms: {cut} deliveries answered 503 at the end of the drain, {unfinished} stages stopped mid-batch",
            started.elapsed().as_millis()
        ));
        Ok(())
    }
}

/// When a stage may begin, and when it must end.
#[derive(Clone)]
struct Gate {
    /// Every migration applied.
    schema: watch::Receiver<bool>,
    /// The drain began.
    stopped: watch::Receiver<bool>,
}

impl Gate {
    /// Waits for the schema; false if the drain began first.
    async fn open(&mut self) -> bool {
        tokio::select! {
            ready = self.schema.wait_for(|r| *r) => ready.is_ok(),
            _ = self.stopped.wait_for(|s| *s) => false,
        }
    }

    /// Completes when the drain begins.
    async fn closed(mut self) {
        let _ = self.stopped.wait_for(|s| *s).await;
    }
}

/// Checks every 2 s until every migration is applied, then opens the gate.
fn schema_watch(
    readiness: Arc<Readiness>,
    schema: watch::Sender<bool>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut said = false;
        loop {
            match readiness.app.pending_migrations(&readiness.pool).await {
                Ok(pending) if pending.is_empty() => {
                    readiness.migrated.store(true, Ordering::SeqCst);
                    let _ = schema.send(true);
                    return;
                }
                Ok(pending) if !said => {
                    say(&format!("waiting for migrations before the stages start: {}", pending.join(", ")));
                    said = true;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reading the migrations applied"),
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// A batch stage, run once the gate opens until it closes (its batch in
/// progress finished), its passes counted in the metrics when `counted`.
fn spawn_stage<S>(stage: S, poll: Duration, wake: Option<Arc<Notify>>, mut gate: Gate, counted: bool) -> JoinHandle<()>
where
    S: stage::Stage + 'static,
    S::Tally: Reported,
{
    tokio::spawn(async move {
        if !gate.open().await {
            return;
        }
        let observe = move |pass: Result<&S::Tally, &sqlx::Error>| {
            if !counted {
                return;
            }
            match pass {
                Ok(tally) => {
                    tally.metrics().iter().for_each(metrics::record);
                    if tally.failures().is_some() {
                        metrics::pass_failed(S::NAME);
                    }
                }
                Err(_) => metrics::pass_failed(S::NAME),
            }
        };
        stage::run_observed(&stage, poll, wake.as_deref(), gate.closed(), observe).await
    })
}

/// The relay's gauges, every 15 s (`webhook_inbox_relay_paused`, `_open`,
/// `_unrouted`, and each destination's `webhook_inbox_relay_destination_*`).
fn relay_gauges_every(gauges: crate::relay::RelayGauges, mut gate: Gate) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !gate.open().await {
            return;
        }
        loop {
            match gauges.read().await {
                Ok(all) => all.iter().for_each(metrics::record),
                Err(e) => tracing::warn!(error = %e, "reading the relay's gauges"),
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = gate.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Receive's counts per minute, for the console's health page: every 10 s, and once more at the end.
fn tally_writer(receiver: Arc<Receiver>, mut gate: Gate) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = gate.open().await;
        loop {
            let stop = tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(10)) => false,
                _ = gate.stopped.wait_for(|s| *s) => true,
            };
            if let Err(e) = receiver.write_tally(Duration::ZERO).await {
                tracing::warn!(error = %e, "writing receive's counts to inbox_receive_minutes");
            }
            if stop {
                return;
            }
        }
    })
}

/// The alerts (`[[alert]]`), evaluated once a minute by whichever process
/// comes first: this one tries every 15 s.
fn alerts_every(pool: sqlx::PgPool, alerts: crate::alerts::AlertRules, mut gate: Gate) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !gate.open().await {
            return;
        }
        loop {
            let mut m = Metrics::new("process");
            crate::alerts::evaluate_counted(&alerts, &pool, &mut m).await;
            metrics::record(&m);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = gate.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// The queue's and the outbox's gauges, every 15 s.
fn gauges(pool: sqlx::PgPool, mut gate: Gate) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !gate.open().await {
            return;
        }
        loop {
            let mut m = Metrics::new("process");
            crate::process::gauges(&pool, &mut m).await;
            metrics::record(&m);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = gate.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}
