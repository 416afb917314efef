//! The worker: takes pending inbox rows with `FOR UPDATE SKIP LOCKED`, in
//! receive order, and applies each one's handler inside one transaction per
//! batch, in the order of the handlers' lock keys (receive order among equal
//! keys; see [`crate::Handler::lock_key`]; a [`crate::BatchHandler`]'s
//! events in one call): without a savepoint while no handler fails, with one
//! per handler call for a batch that had a failure (run again from the
//! start) and the few after it. The row locks
//! are held until commit, so a worker that dies leaves nothing half-done: its
//! transaction rolls back and the rows are simply pending again (no
//! `processing` status, no lease, no reaper).

mod apply;
mod deferred;
mod group;

use std::time::{Duration, Instant};

use deferred::{Deferred, HINT_LEASE};
use sqlx::PgPool;

use crate::{
    core::rules::IgnoreRules,
    core::status::Status,
    db::{
        self,
        inbox::{self, Finished, Position, Taken},
    },
    process::{handler::Outcome, handlers::Handlers, hints::Apis},
    runtime::{
        stage::{Pass, Reported, Stage, Tally},
        trace,
    },
};
use webhook_inbox_schemes::text::Escaped;

/// The worker's settings (`WorkerConfig::read` takes them from the environment).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `INBOX_BATCH_SIZE`, default 100: events per transaction.
    pub batch_size: i64,
    /// `INBOX_MAX_ATTEMPTS`, default 10: then a transient failure is final.
    pub max_attempts: i32,
    /// `INBOX_RETRY_BASE_MS`, default 1000: first backoff, doubled per attempt, capped at an hour.
    pub retry_base: Duration,
    /// `INBOX_POLL_MS`, default 200: the idle wait of a continuously running worker.
    pub poll: Duration,
    /// `INBOX_RULES_FILE`: the events that end `ignored` (none by default).
    pub rules: IgnoreRules,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            batch_size: 100,
            max_attempts: 10,
            retry_base: Duration::from_secs(1),
            poll: Duration::from_millis(200),
            rules: IgnoreRules::default(),
        }
    }
}

impl WorkerConfig {
    /// How long a transient failure waits before its next attempt: the base
    /// doubled per attempt made, with jitter, capped at an hour.
    pub fn backoff(&self, attempts_before: i32) -> Duration {
        crate::core::backoff::backoff(self.retry_base, attempts_before)
    }
}

/// What a pass did, event by event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Processed {
    /// Events taken from the queue.
    pub taken: usize,
    /// Applied by their handler with an effect ([`crate::Outcome::Applied`]).
    pub applied: usize,
    /// Applied by their handler without one ([`crate::Outcome::NoEffect`]).
    pub no_effect: usize,
    /// Event types no handler takes: `unhandled`, nothing ran.
    pub unhandled: usize,
    /// Events an ignore rule matched (`INBOX_RULES_FILE`): `ignored`, nothing ran.
    pub ignored: usize,
    /// Left pending for a later attempt (a transient failure, contention).
    pub retried: usize,
    /// Failed for good, with the reason on the row.
    pub failed: usize,
    /// Left pending by a pause (`inbox pause`), no attempt spent: held until it is resumed.
    pub held: usize,
}

impl Processed {
    /// `claimed`, `processed` (with an effect or without), `unhandled`, `retried`, `failed`.
    pub(crate) fn count_into(&self, m: &mut crate::runtime::metrics::Metrics) {
        m.count("claimed", self.taken as u64)
            .count("processed", (self.applied + self.no_effect) as u64)
            .count("unhandled", self.unhandled as u64)
            .count("ignored", self.ignored as u64)
            .count("retried", self.retried as u64)
            .count("failed", self.failed as u64)
            .count("held", self.held as u64);
    }
}

impl Reported for Processed {
    /// The `process` function's metrics (claimed, processed, unhandled, ignored, retried, failed, held).
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let mut m = crate::runtime::metrics::Metrics::new("process");
        self.count_into(&mut m);
        vec![m]
    }
}

impl Tally for Processed {
    fn add(&mut self, o: &Processed) {
        self.taken += o.taken;
        self.applied += o.applied;
        self.no_effect += o.no_effect;
        self.unhandled += o.unhandled;
        self.ignored += o.ignored;
        self.retried += o.retried;
        self.failed += o.failed;
        self.held += o.held;
    }

    fn is_empty(&self) -> bool {
        self.taken == 0 && self.held == 0
    }
}

/// How one event ends this pass.
enum Finish {
    Done,
    /// No handler takes the event's type.
    Unhandled,
    /// An ignore rule matched; why.
    Ignored(String),
    /// `counted`: false when the event lost to another transaction (40001, 40P01,
    /// 55P03): that says nothing about the event, so it spends no attempt.
    Retry {
        after: Duration,
        reason: String,
        counted: bool,
    },
    Failed(String),
    /// A hint handler's event, pending while its object is fetched ([`HINT_LEASE`]).
    Lease,
}

impl Stage for Worker {
    type Tally = Processed;
    const NAME: &'static str = "process";

    async fn run_once(&self, deadline: Instant) -> Result<Pass<Processed>, sqlx::Error> {
        let counts = Worker::run_once(self, deadline).await?;
        Ok(Pass { tally: counts, more: (counts.taken + counts.held) as i64 >= self.config.batch_size })
    }
}

/// The worker: takes due pending events with `FOR UPDATE SKIP LOCKED` and
/// applies their handlers, a batch per transaction. As a [`crate::Stage`] it
/// drains until a deadline (`run`) or runs until a shutdown (`run_until`).
pub struct Worker {
    pool: PgPool,
    handlers: Handlers,
    /// [`Handlers::keys`]: the events a batch fetches the payload and headers of.
    handled: Vec<String>,
    /// [`IgnoreRules::payload_patterns`]: the events a batch fetches the payload of for a rule.
    ruled: Vec<String>,
    config: WorkerConfig,
    /// The APIs hint handlers' objects are fetched from.
    apis: Apis,
    /// Set when a batch lost its connection: the next pass (one) goes event by
    /// event, counting each attempt before it runs (see [`Worker::run_careful`]).
    careful: std::sync::atomic::AtomicBool,
    /// Batches still to run with a savepoint per event, after one whose
    /// handler failed (see [`Worker::run_once`]).
    guarded: std::sync::atomic::AtomicU32,
    /// Outbox messages its handlers wrote since the last look ([`Worker::take_written`]).
    written: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Told after a batch that wrote outbox messages (`serve`'s relay lanes wait on it).
    nudge: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Where the next batch's take starts (see [`super::scan`]).
    scan: crate::runtime::scan::Scan<Position>,
    /// The pauses' release epoch its last take saw (-1: none yet): a take
    /// from a position that sees another goes again from the head, where a
    /// resume released events ([`db::pauses`]).
    epoch: std::sync::atomic::AtomicI64,
    /// A pause being resumed, seen by its last take: it releases a chunk of
    /// its events after the batch ([`db::pauses::release`]).
    resuming: std::sync::atomic::AtomicI64,
}

/// After a handler fails in a batch without savepoints, this many batches
/// run with them (a failure tends to come with others: an account not there
/// yet, an API down), before batches go without again.
const GUARDED_BATCHES: u32 = 10;

/// How a batch runs its handlers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// All in the batch's transaction, no savepoint: two round trips fewer per
    /// event. A handler's failure rolls the whole batch back, to be run again guarded.
    Optimistic,
    /// A savepoint per handler call (a batch handler's, then one per event
    /// if it fails): a failure rolls back that event alone.
    Guarded,
}

/// What a batch came to.
enum Batch<'h> {
    /// Committed; its hint handlers' events wait for their objects.
    Done(Processed, Vec<Deferred<'h>>),
    /// A handler failed in an optimistic batch: rolled back, nothing recorded.
    Redo,
}

impl Worker {
    /// A worker on `pool` with these handlers.
    pub fn new(pool: PgPool, handlers: Handlers, config: WorkerConfig) -> Self {
        let handled = handlers.keys();
        let ruled = config.rules.payload_patterns();
        Worker {
            pool,
            handlers,
            handled,
            ruled,
            config,
            apis: Apis::default(),
            careful: std::sync::atomic::AtomicBool::new(false),
            guarded: std::sync::atomic::AtomicU32::new(0),
            written: Default::default(),
            nudge: None,
            scan: Default::default(),
            epoch: std::sync::atomic::AtomicI64::new(-1),
            resuming: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Tells `relay` after each batch whose handlers wrote outbox messages
    /// (a relay in the same process then starts at once, not at its next poll).
    pub fn with_nudge(mut self, relay: std::sync::Arc<tokio::sync::Notify>) -> Self {
        self.nudge = Some(relay);
        self
    }

    /// The outbox messages its handlers wrote since the last call (the
    /// `process` function nudges the relay when there are any).
    pub(crate) fn take_written(&self) -> usize {
        self.written.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// The APIs its hint handlers' objects are fetched from
    /// ([`crate::hints`]); none by default.
    pub fn with_apis(mut self, apis: Apis) -> Self {
        self.apis = apis;
        self
    }

    /// Its settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Its pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// One batch: take up to `batch_size` due events, apply them, commit once.
    /// Past `deadline`, the events not yet started are left pending, untouched.
    ///
    /// The handlers run in the batch's transaction without a savepoint each
    /// (two round trips fewer per event). If one fails, the batch rolls back
    /// whole and runs again with a savepoint per event, so that the failure
    /// is recorded on its own event and the others' effects commit; the next
    /// few batches keep the savepoints.
    pub async fn run_once(&self, deadline: Instant) -> Result<Processed, sqlx::Error> {
        use std::sync::atomic::Ordering;
        if self.careful.load(Ordering::Relaxed) {
            return self.run_careful(deadline).await;
        }
        let guarded = self.guarded.load(Ordering::Relaxed);
        let mode = if guarded > 0 {
            self.guarded.store(guarded - 1, Ordering::Relaxed);
            Mode::Guarded
        } else {
            Mode::Optimistic
        };
        let mut result = self.take_and_apply(deadline, mode).await;
        if matches!(result, Ok(Batch::Redo)) {
            self.guarded.store(GUARDED_BATCHES, Ordering::Relaxed);
            result = self.take_and_apply(deadline, Mode::Guarded).await;
        }
        if result.as_ref().is_err_and(db::is_connection_lost) {
            self.careful.store(true, Ordering::Relaxed);
        }
        let counts = self.then_hints(result?, deadline).await;
        let resuming = self.resuming.swap(0, Ordering::Relaxed);
        if resuming > 0 {
            db::pauses::release(&self.pool, resuming, db::pauses::RELEASE_CHUNK).await?;
        }
        if let Some(relay) = &self.nudge {
            if self.take_written() > 0 {
                relay.notify_waiters();
            }
        }
        counts
    }

    async fn take_and_apply(&self, deadline: Instant, mode: Mode) -> Result<Batch<'_>, sqlx::Error> {
        use std::sync::atomic::Ordering;
        let keys = (self.handled.as_slice(), self.ruled.as_slice());
        let mut tx = self.pool.begin().await?;
        let (resuming, mut epoch) = db::pauses::enter(&mut tx).await?;
        // A resume released events since the last take, maybe behind the
        // position: from the head, where they are, and on from there.
        let released = |e: i64| e != self.epoch.load(Ordering::Relaxed);
        if released(epoch) {
            self.scan.rewind();
        }
        let mut from = self.scan.start();
        let mut rows = inbox::take_pending(&mut tx, self.config.batch_size, keys, from.as_ref()).await?;
        if from.is_some() && rows.first().is_some_and(|r| released(r.epoch)) {
            // One committed between the gate and the take: this take's marks undone.
            tx.rollback().await?;
            tx = self.pool.begin().await?;
            epoch = db::pauses::enter(&mut tx).await?.1;
            self.scan.rewind();
            from = self.scan.start();
            rows = inbox::take_pending(&mut tx, self.config.batch_size, keys, None).await?;
        }
        self.epoch.store(rows.first().map_or(epoch, |r| r.epoch), Ordering::Relaxed);
        self.resuming.store(resuming.unwrap_or(0), Ordering::Relaxed);
        let n = rows.len();
        let last = rows.last().map(|r| Position { received_at_us: r.received_at_us, event_id: r.event_id.clone() });
        let batch = self.apply_all(tx, rows, deadline, false, mode).await?;
        if let Batch::Done(counts, _) = &batch {
            // Retried, waiting for a hint's object, or left by the deadline: pending behind the position.
            let behind = counts.retried > 0 || counts.taken + counts.held < n;
            self.scan.taken(from.as_ref(), last, n as i64 >= self.config.batch_size, behind);
        }
        Ok(batch)
    }

    /// After a batch lost its connection (an event that crashes the backend, a
    /// statement timeout on the whole session, ...), the batch rolled back and
    /// no attempt was counted: the same event would sink every batch forever.
    /// So, for one pass, event by event, each attempt is committed before the
    /// event runs (and the event is held back by its backoff meanwhile): the
    /// pass ends at the first event that loses its connection again, counted
    /// and held back, or after a batch's worth. Then batches resume, whatever
    /// the pass came to: an event that keeps cutting the connection sinks one
    /// batch per backoff, reaches its maximum attempts and fails, and the
    /// others go on; a network that keeps cutting connections now and then
    /// costs a short careful pass per cut, not careful mode for as long as cuts
    /// keep coming.
    async fn run_careful(&self, deadline: Instant) -> Result<Processed, sqlx::Error> {
        self.careful.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut total = Processed::default();
        for _ in 0..self.config.batch_size {
            if Instant::now() >= deadline {
                return Ok(total);
            }
            let Some(row) = inbox::count_next(&self.pool, self.config.retry_base).await? else {
                break;
            };
            let counts = if row.attempts >= self.config.max_attempts {
                self.give_up(&row).await?
            } else {
                let mut tx = self.pool.begin().await?;
                db::pauses::enter(&mut tx).await?;
                let rows = inbox::take_counted(&mut tx, &row.provider, &row.event_id).await?;
                self.then_hints(self.apply_all(tx, rows, deadline, true, Mode::Guarded).await?, deadline).await?
            };
            total.add(&counts);
        }
        Ok(total)
    }

    async fn give_up(&self, row: &Taken) -> Result<Processed, sqlx::Error> {
        let reason = format!("attempt {}: processing lost its connection every time; given up", row.attempts);
        tracing::warn!(provider = %row.provider, event_id = %Escaped(&row.event_id), reason = %Escaped(&reason), "event failed");
        inbox::give_up(&self.pool, &row.provider, &row.event_id, &reason).await?;
        Ok(Processed { taken: 1, failed: 1, ..Processed::default() })
    }

    /// One named event, if it is pending, due and nobody holds it (the SQS path);
    /// `taken` is 0 when there was nothing to do.
    pub async fn run_event(&self, provider: &str, event_id: &str) -> Result<Processed, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        db::pauses::enter(&mut tx).await?;
        let rows = inbox::take_one(&mut tx, provider, event_id).await?;
        self.then_hints(self.apply_all(tx, rows, far_future(), false, Mode::Guarded).await?, far_future()).await
    }
}

/// How the event's processing ended, on its span.
fn ended(span: Option<&mut trace::Span>, end: &Finish) {
    let Some(span) = span else { return };
    match end {
        Finish::Done => span.set("webhook.outcome", "done"),
        Finish::Unhandled => span.set("webhook.outcome", "unhandled"),
        Finish::Ignored(_) => span.set("webhook.outcome", "ignored"),
        Finish::Lease => span.set("webhook.outcome", "fetching"),
        Finish::Retry { reason, .. } => {
            span.set("webhook.outcome", "retry");
            span.fail(webhook_inbox_schemes::text::escape(reason));
        }
        Finish::Failed(reason) => {
            span.set("webhook.outcome", "failed");
            span.fail(webhook_inbox_schemes::text::escape(reason));
        }
    }
}

fn count_outcome(outcome: Outcome, counts: &mut Processed) {
    match outcome {
        Outcome::Applied => counts.applied += 1,
        Outcome::NoEffect => counts.no_effect += 1,
    }
}

/// How `row` is recorded as it ends; `precounted`: its attempt was already
/// committed (careful mode).
fn finished_row(row: Taken, end: Finish, precounted: bool) -> Finished {
    let counted = |yes: bool| i32::from(yes && !precounted);
    let (status, delay, reason, attempts) = match end {
        Finish::Done => (Status::Done, None, None, counted(true)),
        // Nothing ran: no attempt spent (and careful mode's, counted before, undone).
        Finish::Unhandled => (Status::Unhandled, None, None, -i32::from(precounted)),
        Finish::Ignored(why) => (Status::Ignored, None, Some(why), -i32::from(precounted)),
        Finish::Lease => (Status::Pending, Some(HINT_LEASE), None, -i32::from(precounted)),
        Finish::Retry { after, reason, counted: counted_attempt } => {
            (Status::Pending, Some(after), Some(reason), counted(counted_attempt))
        }
        Finish::Failed(reason) => (Status::Failed, None, Some(reason), counted(true)),
    };
    Finished { provider: row.provider, event_id: row.event_id, status, delay, reason, attempts }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_an_hour() {
        let c = WorkerConfig { retry_base: Duration::from_millis(1000), ..WorkerConfig::default() };
        for (attempts, full) in [(0, 1000u64), (1, 2000), (3, 8000)] {
            let d = c.backoff(attempts).as_millis() as u64;
            assert!((full / 2..=full).contains(&d), "attempt {attempts}: {d} ms");
        }
        let cap = crate::core::backoff::RETRY_CAP;
        assert!(c.backoff(30) <= cap && c.backoff(30) >= cap / 2);
    }
}
