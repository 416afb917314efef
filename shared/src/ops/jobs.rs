//! Jobs: a requeue or an erasure by selection recorded in `inbox_api_jobs`
//! and run in the background, with an estimate, progress and a cancel that
//! any process sharing the database can ask (the management API starts them).

use std::{
    ops::ControlFlow,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::Notify;

use super::{count_erasure, erase_counted, requeue_all, Audit, EraseError, EraseOptions, Error};
pub use crate::db::jobs::Job;
use crate::{
    core::selection::{EventQuery, Filter},
    db::jobs as store,
};
use webhook_inbox_schemes::text::escape;

/// Jobs running at once (interrupted ones aside), whoever started them.
pub const JOBS_AT_ONCE: i64 = 4;

/// What a job does.
#[derive(Debug, Clone)]
pub enum JobWork {
    /// Puts the events a filter selects back to pending, 500 a batch
    /// ([`requeue_all`](super::requeue_all)).
    Requeue(Filter),
    /// Erases the events a query selects ([`erase_matching`](super::erase_matching)),
    /// counted once: the count is the job's estimate.
    Erase(EventQuery, EraseOptions),
}

impl JobWork {
    /// Its kind, as a [`Job`] records it: `requeue` or `erase`.
    pub fn kind(&self) -> &'static str {
        match self {
            JobWork::Requeue(_) => "requeue",
            JobWork::Erase(..) => "erase",
        }
    }
}

/// Records a job started by the API token `token` and runs it on a task of
/// its own (the current Tokio runtime's), with a heartbeat apart from its
/// batches, so that however long one takes the job reads `running`, and a
/// cancel ([`cancel_job`]) reaches it within one event or batch. `params` is
/// what was asked, kept with the job (never the personal data an erasure
/// searches for); `reason` goes into every audit record. Refused with
/// [`Error::Conflict`] while [`JOBS_AT_ONCE`] jobs run.
pub async fn start_job(pool: &PgPool, work: JobWork, params: Value, token: &str, reason: &str) -> Result<Job, Error> {
    let kind = work.kind();
    let job = match store::create_job(pool, kind, &params, token, reason, JOBS_AT_ONCE).await {
        Ok(job) => job,
        Err(store::NotStarted::Busy(n)) => {
            return Err(Error::Conflict(format!(
                "{n} jobs are running, the most at once: wait for one to end, or cancel one"
            )))
        }
        Err(store::NotStarted::Database(e)) => return Err(e.into()),
    };
    let (db, id, actor, why) = (pool.clone(), job.id, format!("api:{token}"), reason.to_string());
    tokio::spawn(async move {
        let running = Arc::new(Running::default());
        let beat = tokio::spawn(heartbeat(db.clone(), id, running.clone()));
        let by = Audit { actor: &actor, action: kind, reason: &why };
        let ran = match &work {
            JobWork::Requeue(filter) => run_requeue(&db, filter, &by, &running).await,
            JobWork::Erase(query, options) => run_erase(&db, query, &by, *options, &running).await,
        };
        beat.abort();
        finish(&db, id, ran, &running).await;
    });
    Ok(job)
}

/// The latest `limit` jobs, newest first.
pub async fn jobs(pool: &PgPool, limit: i64) -> Result<Vec<Job>, Error> {
    Ok(store::jobs(pool, limit).await?)
}

/// One job ([`Error::NotFound`] if there is none of that id).
pub async fn job(pool: &PgPool, id: i64) -> Result<Job, Error> {
    store::job(pool, id).await?.ok_or_else(|| Error::NotFound(format!("no job {id}")))
}

/// Who asks a job to stop ([`cancel_job`]).
#[derive(Debug, Clone, Copy)]
pub enum Canceller<'a> {
    /// An API token, by its name: audited as `api:{name}`.
    Token(&'a str),
    /// An operator (`inbox jobs cancel`), audited under that name.
    Operator(&'a str),
}

/// Asks an unfinished job to stop, audited as `cancel_job` by `by`: a running
/// one stops within its current event or batch (what it did stays done); an
/// interrupted one (its process stopped) is cancelled at once.
/// [`Error::Conflict`] for a job that has ended.
pub async fn cancel_job(pool: &PgPool, id: i64, by: Canceller<'_>) -> Result<Job, Error> {
    let (who, token) = match by {
        Canceller::Token(name) => (name, Some(name)),
        Canceller::Operator(name) => (name, None),
    };
    let (asked, job) = store::cancel_job(pool, id, who, token).await?;
    let job = job.ok_or_else(|| Error::NotFound(format!("no job {id}")))?;
    if !asked {
        return Err(Error::Conflict(format!("job {id} is {} already: there is nothing to cancel", job.state)));
    }
    Ok(job)
}

/// What a running job and its heartbeat share: a cancel learnt of (the runner
/// reads it between two events or batches), how far it is, what it counted
/// it will take (recorded by the heartbeat, or at the end), and a nudge that
/// brings the heartbeat early, so that a cancel is learnt of within a batch.
#[derive(Default)]
struct Running {
    cancel: AtomicBool,
    processed: AtomicU64,
    estimate: OnceLock<i64>,
    nudge: Notify,
}

impl Running {
    /// Records how far the job is; whether to stop.
    fn progress(&self, processed: u64) -> ControlFlow<()> {
        self.processed.store(processed, Ordering::Relaxed);
        self.nudge.notify_one();
        if self.cancel.load(Ordering::Relaxed) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

/// The least time between two of a job's progress records, however often it is nudged.
const RECORD_GAP: Duration = Duration::from_millis(100);

/// The job's heartbeat: every [`store::HEARTBEAT`], or when nudged (at most
/// every [`RECORD_GAP`]), its progress recorded and a cancel learnt of.
async fn heartbeat(db: PgPool, id: i64, running: Arc<Running>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(store::HEARTBEAT) => {}
            _ = running.nudge.notified() => {}
        }
        let processed = running.processed.load(Ordering::Relaxed) as i64;
        match store::job_progress(&db, id, processed, running.estimate.get().copied()).await {
            Ok(true) => running.cancel.store(true, Ordering::Relaxed),
            Ok(false) => {}
            Err(e) => tracing::warn!(job = id, error = %escape(&e.to_string()), "a job's heartbeat failed"),
        }
        tokio::time::sleep(RECORD_GAP).await;
    }
}

/// How a job's run ended: its state, the events it took and its result; or its database error.
type Ran = Result<(&'static str, i64, Value), sqlx::Error>;

/// The requeue counts what it selects before its first batch: its estimate.
async fn run_requeue(db: &PgPool, filter: &Filter, by: &Audit<'_>, running: &Running) -> Ran {
    let done = requeue_all(db, filter, by, 500, |r| {
        let _ = running.estimate.set(r.matching - r.without_payload);
        running.progress(r.requeued)
    })
    .await?;
    let state = if done.stopped { "cancelled" } else { "succeeded" };
    Ok((state, done.requeued as i64, json!({"requeued": done.requeued})))
}

async fn run_erase(db: &PgPool, query: &EventQuery, by: &Audit<'_>, options: EraseOptions, running: &Running) -> Ran {
    let counted = count_erasure(db, query, None).await?;
    let _ = running.estimate.set(counted.erased as i64);
    let result = |e: &super::Erasure| {
        json!({"matching": e.matching, "erased": e.erased, "already": e.already,
               "pending": e.pending, "dry_run": options.dry_run})
    };
    if options.dry_run {
        return Ok(("succeeded", 0, result(&counted)));
    }
    match erase_counted(db, query, counted, by, options, |e| running.progress(e.erased)).await {
        Ok(e) if e.stopped && running.cancel.load(Ordering::Relaxed) => Ok(("cancelled", e.erased as i64, result(&e))),
        Ok(e) => Ok(("succeeded", e.erased as i64, result(&e))),
        Err(EraseError::Database(e)) => Err(e),
        Err(too_many @ EraseError::TooMany { .. }) => {
            Ok(("failed", 0, json!({"refused": too_many.to_string(), "matching": counted.matching})))
        }
    }
}

/// Records how the job ended (after a failed batch, the events taken before it).
async fn finish(db: &PgPool, id: i64, ran: Ran, running: &Running) {
    let estimate = running.estimate.get().copied();
    let ended = match ran {
        Ok(("failed", processed, result)) => {
            let why = result["refused"].as_str().unwrap_or("refused").to_string();
            store::finish_job(db, id, "failed", processed, estimate, &result, Some(&why)).await
        }
        Ok((state, processed, result)) => store::finish_job(db, id, state, processed, estimate, &result, None).await,
        Err(e) => {
            tracing::error!(job = id, error = %escape(&e.to_string()), "a job failed");
            let why = "the database refused a batch or did not answer; the batches before it are done";
            let so_far = running.processed.load(Ordering::Relaxed) as i64;
            store::finish_job(db, id, "failed", so_far, estimate, &Value::Null, Some(why)).await
        }
    };
    if let Err(e) = ended {
        tracing::error!(job = id, error = %escape(&e.to_string()), "a job's end could not be recorded");
    }
}
