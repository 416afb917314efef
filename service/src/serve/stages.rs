//! What runs beside the listeners: each stage on its own loop within the
//! [`Window`] (once the schema is there, until the drain), and the periodic
//! writers (gauges, receive's counts, alerts).

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use tokio::{
    sync::{watch, Notify},
    task::JoinHandle,
};

use super::{health::Readiness, metrics, say};
use webhook_inbox::{
    host::{run_observed, Metrics, Reported},
    Receiver, Stage,
};

/// When a stage may begin, and when it must end.
#[derive(Clone)]
pub(super) struct Window {
    /// Every migration applied.
    schema: watch::Receiver<bool>,
    /// The drain began.
    stopped: watch::Receiver<bool>,
}

impl Window {
    /// Open once `schema` says every migration is applied, closed once `stopped` says the drain began.
    pub(super) fn new(schema: watch::Receiver<bool>, stopped: watch::Receiver<bool>) -> Self {
        Window { schema, stopped }
    }

    /// Waits for the schema; false if the drain began first.
    pub(super) async fn open(&mut self) -> bool {
        tokio::select! {
            ready = self.schema.wait_for(|r| *r) => ready.is_ok(),
            _ = self.stopped.wait_for(|s| *s) => false,
        }
    }

    /// Completes when the drain begins.
    pub(super) async fn closed(mut self) {
        let _ = self.stopped.wait_for(|s| *s).await;
    }
}

/// Checks every 2 s until every migration is applied, then opens the window.
pub(super) fn schema_watch(
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

/// A batch stage, run once the window opens until it closes (its batch in
/// progress finished), its passes counted in the metrics when `counted`.
pub(super) fn spawn_stage<S>(
    stage: S,
    poll: Duration,
    wake: Option<Arc<Notify>>,
    mut window: Window,
    counted: bool,
) -> JoinHandle<()>
where
    S: Stage + 'static,
    S::Tally: Reported,
{
    tokio::spawn(async move {
        if !window.open().await {
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
        run_observed(&stage, poll, wake.as_deref(), window.closed(), observe).await
    })
}

/// The relay's gauges, every 15 s (`webhook_inbox_relay_paused`, `_open`,
/// `_unrouted`, and each destination's `webhook_inbox_relay_destination_*`).
pub(super) fn relay_gauges_every(gauges: webhook_inbox::host::RelayGauges, mut window: Window) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !window.open().await {
            return;
        }
        loop {
            match gauges.read().await {
                Ok(all) => all.iter().for_each(metrics::record),
                Err(e) => tracing::warn!(error = %e, "reading the relay's gauges"),
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = window.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Receive's counts per minute, for the console's health page: every 10 s, and once more at the end.
pub(super) fn tally_writer(receiver: Arc<Receiver>, mut window: Window) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = window.open().await;
        loop {
            let stop = tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(10)) => false,
                _ = window.stopped.wait_for(|s| *s) => true,
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
pub(super) fn alerts_every(
    pool: sqlx::PgPool,
    alerts: webhook_inbox::alerts::AlertRules,
    mut window: Window,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !window.open().await {
            return;
        }
        loop {
            let mut m = Metrics::new("process");
            webhook_inbox::alerts::evaluate_counted(&alerts, &pool, &mut m).await;
            metrics::record(&m);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = window.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// The queue's and the outbox's gauges, every 15 s.
pub(super) fn gauges(pool: sqlx::PgPool, mut window: Window) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !window.open().await {
            return;
        }
        loop {
            let mut m = Metrics::new("process");
            webhook_inbox::host::gauges(&pool, &mut m).await;
            metrics::record(&m);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(15)) => {}
                _ = window.stopped.wait_for(|s| *s) => return,
            }
        }
    })
}
