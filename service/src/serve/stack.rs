//! One instance's stages and listeners, `inbox serve`'s and `inbox dev`'s, in
//! three steps: read every setting and check every role ([`Parts`]), start
//! the stages and the listeners ([`Running`]), and, at shutdown, drain.

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

use super::ServeConfig;
use super::{
    health::{health_router, Readiness},
    metrics,
    roles::{Role, Roles},
    say,
    stages::{alerts_every, gauges, relay_gauges_every, schema_watch, spawn_stage, tally_writer, Window},
};
use crate::listener;
use webhook_inbox::{
    alerts::AlertRules,
    config::{Destinations, Env},
    hints::Apis,
    host::Metrics,
    reconciliation::Reconciler,
    App, Destination, PruneConfig, Pruner, ReceiveConfig, Receiver, Relay, RelayConfig, Worker, WorkerConfig,
};

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
    pub(crate) async fn run(
        self,
        main: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()>,
        ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
    ) -> Result<()> {
        if self.counted {
            metrics::install().context("installing the Prometheus recorder")?;
        }
        let parts = self.read().await?;
        let running = self.start(parts, main, admin)?;
        ready(running.main_addr, running.admin_addr);
        shutdown.await;
        running.drain().await;
        Ok(())
    }

    /// Every setting read, and every role checked, before anything starts.
    async fn read(&self) -> Result<Parts> {
        let Stack { app, env, config, pool, roles, .. } = self;
        let destinations = if roles.has(Role::Relay) { Destinations::read(env)?.build(app).await? } else { vec![] };
        if roles.has(Role::Relay) && destinations.is_empty() {
            anyhow::ensure!(
                !roles.named,
                "the relay role has no destination: set RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS or RELAY_DESTINATIONS_FILE"
            );
            say("no relay destination (RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL, RELAY_EVENT_BUS, RELAY_DESTINATIONS_FILE): outbox messages stay in transactional_outbox");
        }
        let relay = if destinations.is_empty() { None } else { Some((destinations, RelayConfig::read(env)?)) };
        let reconciler =
            if roles.has(Role::Reconcile) { Some(Reconciler::read(env, app, pool.clone())?) } else { None };
        let reconciler = reconciler.filter(Reconciler::is_configured);
        anyhow::ensure!(
            !(roles.named && roles.has(Role::Reconcile) && reconciler.is_none()),
            "the reconcile role has {}",
            webhook_inbox::reconciliation::NOTHING_TO_RECONCILE
        );
        let console = if roles.has(Role::Console) {
            let read = webhook_inbox_console::read_pool(env, &config.db)?.unwrap_or_else(|| pool.clone());
            Some(webhook_inbox_console::router(
                pool.clone(),
                read,
                config.catalog.clone(),
                config.secrets.clone(),
                webhook_inbox_console::PATH,
                webhook_inbox_console::Settings::read(env)?,
            ))
        } else {
            None
        };
        let receiver = if roles.has(Role::Receive) {
            Some(Arc::new(Receiver::from_config(config)?.with_app(app).with_group_commit(self.serve.group)))
        } else {
            None
        };
        Ok(Parts {
            limits: listener::Limits::read(env)?,
            worker: WorkerConfig::read(env)?,
            apis: Apis::read(env, app)?,
            alerts: if roles.has(Role::Process) { AlertRules::read(env)? } else { AlertRules::default() },
            relay,
            retention: if roles.has(Role::Prune) { Some(PruneConfig::read(env)?) } else { None },
            reconciler,
            console,
            receiver,
        })
    }

    /// Starts the stages (each waiting for the schema) and the listeners.
    fn start(&self, parts: Parts, main: TcpListener, admin: Option<TcpListener>) -> Result<Running> {
        let Stack { app, pool, roles, serve, counted, .. } = self;
        let counted = *counted;
        let readiness = Arc::new(Readiness::new(pool.clone(), (*app).clone()));
        let (stop, stopped) = watch::channel(false);
        // The stages start once every migration is applied (a worker on a schema without the
        // application's tables would fail their events).
        let (schema, schema_ready) = watch::channel(false);
        let window = Window::new(schema_ready, stopped.clone());

        let mut stages: Vec<JoinHandle<()>> = vec![schema_watch(readiness.clone(), schema, stopped)];
        if let Some(receiver) = &parts.receiver {
            stages.push(tally_writer(receiver.clone(), window.clone()));
        }
        // The workers tell the relay's lanes when they wrote outbox messages: a message leaves
        // at once, not at the lanes' next poll.
        let nudge = Arc::new(Notify::new());
        if roles.has(Role::Process) {
            for _ in 0..serve.workers {
                let worker = Worker::new(pool.clone(), app.handlers().clone(), parts.worker.clone())
                    .with_apis(parts.apis.clone())
                    .with_nudge(nudge.clone());
                stages.push(spawn_stage(worker, parts.worker.poll, None, window.clone(), counted));
            }
            if counted {
                stages.push(gauges(pool.clone(), window.clone()));
            }
            if !parts.alerts.is_empty() {
                stages.push(alerts_every(pool.clone(), parts.alerts, window.clone()));
            }
        }
        if let Some((destinations, relay_config)) = parts.relay {
            // Each destination on its own loop: a lane waits for nothing but its own destination.
            let (lanes, relay_gauges) = Relay::new(pool.clone(), destinations, relay_config).into_lanes();
            for lane in lanes {
                stages.push(spawn_stage(lane, parts.worker.poll, Some(nudge.clone()), window.clone(), counted));
            }
            if counted {
                stages.push(relay_gauges_every(relay_gauges, window.clone()));
            }
        }
        if let Some(retention) = parts.retention {
            let pruner = Pruner::new(pool.clone(), retention);
            stages.push(spawn_stage(pruner, Duration::from_secs(3600), None, window.clone(), counted));
        }
        if let Some(reconciler) = parts.reconciler {
            // Every 15 minutes, as the function's schedule.
            stages.push(spawn_stage(reconciler, Duration::from_secs(900), None, window.clone(), counted));
        }

        let health = health_router(readiness.clone(), admin.is_none() && counted, false);
        let head_check =
            parts.console.is_some().then_some(webhook_inbox_console::unauthenticated_api as listener::HeadCheck);
        let router = match parts.console {
            Some(console) => health.merge(console),
            None => health,
        };
        let main_routed: fn(&str) -> bool = if admin.is_none() && counted {
            |p| listener::console_or_health(p) || p == "/metrics"
        } else {
            listener::console_or_health
        };
        let count = counted.then_some(metrics::delivered as fn(&Metrics, Duration));
        let site = listener::Site {
            receiver: parts.receiver,
            router: Some(router),
            routed: main_routed,
            paged: listener::console,
            head_check,
            count,
            // Said once the socket is closed: whoever reads it finds new connections refused.
            closed: Some(|| say("draining: no new connection; finishing the deliveries and batches in flight")),
        };
        let main_addr = main.local_addr()?;
        let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;

        // Draining begins at shutdown: not ready, then the listeners drain.
        let (draining, drain_started) = watch::channel(false);
        let until_draining = |mut d: watch::Receiver<bool>| async move {
            let _ = d.wait_for(|d| *d).await;
        };
        let admin_server = admin.map(|admin| {
            let site = listener::Site {
                receiver: None,
                router: Some(health_router(readiness.clone(), true, true)),
                routed: |_| true,
                paged: |_| false,
                head_check: None,
                count: None,
                closed: None,
            };
            // It answers through the drain (`/readyz` saying so), until the end.
            tokio::spawn(listener::serve_site(admin, site, parts.limits, std::future::pending(), Duration::ZERO))
        });
        let drain = serve.drain_timeout;
        let main_server =
            tokio::spawn(listener::serve_site(main, site, parts.limits, until_draining(drain_started), drain));
        Ok(Running { readiness, stop, draining, stages, main_server, admin_server, drain, main_addr, admin_addr })
    }
}

/// What an instance runs, each part read and checked.
struct Parts {
    limits: listener::Limits,
    worker: WorkerConfig,
    apis: Apis,
    alerts: AlertRules,
    /// The destinations, and how the relay sends to them; none without the relay role or a destination.
    relay: Option<(Vec<Destination>, RelayConfig)>,
    retention: Option<PruneConfig>,
    reconciler: Option<Reconciler>,
    console: Option<axum::Router>,
    receiver: Option<Arc<Receiver>>,
}

/// An instance started: what the drain stops, in its order.
struct Running {
    readiness: Arc<Readiness>,
    /// Tells the stages the drain began.
    stop: watch::Sender<bool>,
    /// Tells the main listener the drain began.
    draining: watch::Sender<bool>,
    stages: Vec<JoinHandle<()>>,
    /// The main listener's task: how many deliveries it cut at the end of the drain.
    main_server: JoinHandle<usize>,
    admin_server: Option<JoinHandle<usize>>,
    drain: Duration,
    main_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
}

impl Running {
    /// Not ready, then the listeners drain; the stages finish their batches
    /// within what is left of the drain, and past it are stopped where they are.
    async fn drain(self) {
        let started = Instant::now();
        // Not ready, then the listener closed and said so (the main site's `closed`): whoever
        // reads the line finds /readyz already answering 503 and new connections refused.
        self.readiness.draining.store(true, Ordering::SeqCst);
        let _ = self.draining.send(true);
        let _ = self.stop.send(true);
        let cut = self.main_server.await.unwrap_or(0);
        // A batch stopped mid-way rolls back: its events are pending again.
        let deadline = tokio::time::Instant::from_std(started + self.drain);
        let mut unfinished = 0;
        for stage in self.stages {
            let abort = stage.abort_handle();
            if tokio::time::timeout_at(deadline, stage).await.is_err() {
                abort.abort();
                unfinished += 1;
            }
        }
        if let Some(admin) = self.admin_server {
            admin.abort();
        }
        say(&format!(
            "drained in {} ms: {cut} deliveries answered 503 at the end of the drain, {unfinished} stages stopped mid-batch",
            started.elapsed().as_millis()
        ));
    }
}
