//! One shape for every batch stage (process, relay, prune, reconcile): a config given at
//! construction, [`Stage::run_once`] doing one bounded batch and returning its
//! counts, and the two loops every function and command share: [`run`], bounded
//! by a deadline (the Lambdas, `inbox relay|prune`), and [`run_until`],
//! bounded by a shutdown signal (`inbox dev`).

use std::{
    fmt::Debug,
    future::Future,
    time::{Duration, Instant},
};

/// The counts of a pass, added up over a run.
pub trait Tally: Default + Clone + Debug + Send + Sync + serde::Serialize + 'static {
    /// Adds another pass's counts to these.
    fn add(&mut self, other: &Self);
    /// Nothing was done (nothing is logged for the pass).
    fn is_empty(&self) -> bool;
}

/// A tally as the functions and the service report it: its metric lines, and
/// what failed within a pass that still completed (a reconcile source, say).
pub trait Reported: Tally {
    /// The lines of the function's metrics (EMF on Lambda, Prometheus in `serve`).
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics>;
    /// What failed, if anything did, though the pass completed.
    fn failures(&self) -> Option<String> {
        None
    }
}

/// What one batch did, and whether more work may be waiting (a full batch).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass<T> {
    /// The batch's counts.
    pub tally: T,
    /// A full batch: more may be waiting.
    pub more: bool,
}

/// A batch stage: the worker, the relay, prune, reconcile.
pub trait Stage: Send + Sync {
    /// Its counts.
    type Tally: Tally;
    /// The stage in logs.
    const NAME: &'static str;
    /// A pause between two full batches (room for concurrent work); none by default.
    const PAUSE: Duration = Duration::ZERO;
    /// How long one pass of a long-running process ([`Stage::run_until`]) may take before it starts nothing new.
    const PASS: Duration = Duration::from_secs(60);

    /// One bounded batch; past `deadline` it starts nothing new.
    fn run_once(&self, deadline: Instant) -> impl Future<Output = Result<Pass<Self::Tally>, sqlx::Error>> + Send;

    /// Batch after batch until one comes back short or the deadline passes
    /// (what the Lambda functions do in an invocation).
    fn run(&self, deadline: Instant) -> impl Future<Output = Result<Self::Tally, Stopped<Self::Tally>>> + Send
    where
        Self: Sized,
    {
        run(self, deadline)
    }

    /// Continuously, until `shutdown`: a batch, then (when it came back short)
    /// a wait of `poll` (what a long-running process does).
    fn run_until(&self, poll: Duration, shutdown: impl Future<Output = ()> + Send) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        run_until(self, poll, shutdown)
    }
}

/// A run that could not finish its work; the counts of the batches that completed are kept.
#[derive(Debug, thiserror::Error)]
#[error("stopped on a database error after {tally:?}: {source}")]
pub struct Stopped<T: Debug> {
    /// The counts of the batches that committed.
    pub tally: T,
    /// The database's error.
    #[source]
    pub source: sqlx::Error,
}

/// Batch after batch until one comes back short or the deadline passes.
pub(crate) async fn run<S: Stage>(stage: &S, deadline: Instant) -> Result<S::Tally, Stopped<S::Tally>> {
    let mut tally = S::Tally::default();
    loop {
        match stage.run_once(deadline).await {
            Ok(pass) => {
                tally.add(&pass.tally);
                if !pass.more || Instant::now() >= deadline {
                    return Ok(tally);
                }
                if !S::PAUSE.is_zero() {
                    tokio::time::sleep(S::PAUSE).await;
                }
            }
            Err(source) => return Err(Stopped { tally, source }),
        }
    }
}

/// Runs continuously until `shutdown`: again at once after a full batch,
/// after `poll` otherwise, and no sooner than a second after an error.
pub(crate) async fn run_until<S: Stage>(stage: &S, poll: Duration, shutdown: impl Future<Output = ()>) {
    run_observed(stage, poll, None, shutdown, |_| {}).await
}

/// The stage run pass after pass until `shutdown` (as `Stage::run_until` does), each pass's counts (or error) shown to `observe` (the
/// service's metrics); a pass starts early when `wake` is told (the worker
/// nudging the relay).
pub async fn run_observed<S: Stage>(
    stage: &S,
    poll: Duration,
    wake: Option<&tokio::sync::Notify>,
    shutdown: impl Future<Output = ()>,
    observe: impl Fn(Result<&S::Tally, &sqlx::Error>),
) {
    tokio::pin!(shutdown);
    loop {
        let wait = match stage.run_once(Instant::now() + S::PASS).await {
            Ok(pass) => {
                observe(Ok(&pass.tally));
                if !pass.tally.is_empty() {
                    tracing::info!(stage = S::NAME, tally = ?pass.tally, "pass");
                }
                if pass.more {
                    S::PAUSE
                } else {
                    poll
                }
            }
            Err(e) => {
                observe(Err(&e));
                tracing::warn!(stage = S::NAME, error = %e, "pass failed; trying again");
                poll.max(Duration::from_secs(1))
            }
        };
        let nudged = async {
            match wake {
                Some(wake) => wake.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = nudged => {}
            () = &mut shutdown => return,
        }
    }
}
