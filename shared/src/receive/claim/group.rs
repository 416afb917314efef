//! Group commit, for the long-running servers (`inbox serve`, `inbox dev`):
//! deliveries that arrive together are claimed in one multi-row
//! `INSERT ... ON CONFLICT DO NOTHING RETURNING` and one commit, each answered
//! only once that commit is done.
//!
//! One commit per delivery is PostgreSQL's ceiling for single-row claims
//! (pgbench's too); a group pays it once for all its rows. One group commits
//! at a time: under a light load a delivery is alone and goes at once; under a
//! heavy one, the deliveries that arrived while the previous group committed
//! go together. [`GroupConfig::wait`] may hold a group open a little longer
//! for more. A group that stalls (a lock held by another writer of one of its
//! keys, a slow flush) holds only itself: once it has committed for
//! [`GroupConfig::stall`], another committer (each a task on a connection of
//! receive's own) starts the next group beside it.
//!
//! A group's rows are sorted by key (concurrent groups lock in one order, so
//! cannot deadlock); the same key twice in a group is one `accepted` (the
//! first to arrive) and one `duplicate`. If PostgreSQL refuses a value in the
//! group, its deliveries are claimed one by one, each with the single claim's
//! own fallback, so the refused one fails (or is kept `failed`) alone.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    sync::{mpsc, oneshot, Mutex, Notify},
    time::Instant,
};

use super::{claim_single, Claim};
pub(crate) use crate::db::inbox::GroupRow as Row;
use crate::db::{self, Connections};

/// How receive groups its claims (`ServeConfig::read` takes it from the environment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// `INBOX_GROUP_COMMIT_MAX`, default 64: deliveries per group at most; 1 turns grouping off.
    pub max: usize,
    /// `INBOX_GROUP_COMMIT_WAIT_US`, default 0: how long a group waits for more
    /// deliveries once it has its first (beyond those already queued).
    pub wait: Duration,
    /// `INBOX_GROUP_COMMIT_COMMITTERS`, default 2: groups committing at most
    /// at once (each on one of receive's connections, so at most
    /// `INBOX_DB_POOL_SIZE`).
    pub committers: usize,
    /// `INBOX_GROUP_COMMIT_STALL_US`, default 5000: how long a group commits
    /// before another committer starts the next group beside it. Until then
    /// the deliveries that arrive wait for it and go together (the fewest
    /// commits); 0 starts the next group at once.
    pub stall: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { max: 64, wait: Duration::ZERO, committers: 2, stall: Duration::from_millis(5) }
    }
}

impl GroupConfig {
    /// Grouping is on (more than one delivery per group).
    pub fn is_on(&self) -> bool {
        self.max > 1
    }
}

/// A row in the queue, and where its answer goes.
struct Waiting {
    row: Row,
    answer: oneshot::Sender<Result<Claim, sqlx::Error>>,
}

/// The queue of deliveries, and its committers (spawned on the runtime it is made on).
pub(crate) struct Grouper {
    queue: mpsc::Sender<Waiting>,
}

impl Grouper {
    /// Starts `config.committers` committers on `connections`. They end when the
    /// grouper is dropped, once the queue is empty.
    pub(crate) fn start(connections: Arc<Connections>, config: GroupConfig) -> Self {
        let (queue, received) = mpsc::channel(config.max * config.committers * 4);
        let shared = Arc::new(Committers {
            queue: Mutex::new(received),
            since: (0..config.committers).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            ended: Notify::new(),
        });
        for me in 0..config.committers {
            tokio::spawn(committer(connections.clone(), shared.clone(), me, config));
        }
        Grouper { queue }
    }

    /// Claims `row` with whatever group it joins; answered after the commit.
    pub(crate) async fn claim(&self, row: Row) -> Result<Claim, sqlx::Error> {
        let (answer, answered) = oneshot::channel();
        if self.queue.send(Waiting { row, answer }).await.is_err() {
            return Err(sqlx::Error::PoolClosed);
        }
        // A committer that is gone (aborted at the end of a drain) answers nothing: not stored, as far as we know.
        answered.await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

/// What the committers share: the queue, and when each one's group began to commit.
struct Committers {
    queue: Mutex<mpsc::Receiver<Waiting>>,
    /// Per committer: when its group began to commit, in µs after `epoch` plus one; 0 while it has none.
    since: Vec<AtomicU64>,
    epoch: Instant,
    /// Notified when a group's commit ends.
    ended: Notify,
}

impl Committers {
    /// Until when the next group waits: the latest end of `stall` after a commit in progress, if still ahead.
    fn wait_until(&self, stall: Duration) -> Option<Instant> {
        let now = self.epoch.elapsed();
        let stalls_at = |since: &AtomicU64| match since.load(Ordering::Acquire) {
            0 => None,
            us => Some(Duration::from_micros(us - 1) + stall),
        };
        self.since.iter().filter_map(stalls_at).filter(|at| *at > now).max().map(|at| self.epoch + at)
    }

    fn begin(&self, me: usize) {
        self.since[me].store(self.epoch.elapsed().as_micros() as u64 + 1, Ordering::Release);
    }

    fn end(&self, me: usize) {
        self.since[me].store(0, Ordering::Release);
        self.ended.notify_waiters();
    }
}

async fn committer(connections: Arc<Connections>, shared: Arc<Committers>, me: usize, config: GroupConfig) {
    loop {
        let group = {
            // One committer gathers at a time; the others wait for the next group.
            let mut queue = shared.queue.lock().await;
            let Some(first) = queue.recv().await else { return };
            // While a group commits, what arrives waits for it, unless it stalls.
            loop {
                let ended = shared.ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                let Some(until) = shared.wait_until(config.stall) else { break };
                tokio::select! {
                    _ = ended => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
            let mut group = vec![first];
            let until = tokio::time::Instant::now() + config.wait;
            while group.len() < config.max {
                match queue.try_recv() {
                    Ok(w) => group.push(w),
                    Err(_) if config.wait.is_zero() => break,
                    Err(_) => match tokio::time::timeout_at(until, queue.recv()).await {
                        Ok(Some(w)) => group.push(w),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            group
        };
        // Prometheus (`inbox serve`'s /metrics), when a recorder is installed; else nothing.
        ::metrics::histogram!("webhook_inbox_receive_group_size").record(group.len() as f64);
        shared.begin(me);
        let one_by_one = commit(&connections, group).await;
        shared.end(me);
        if one_by_one {
            ::metrics::counter!("webhook_inbox_receive_groups_one_by_one_total").increment(1);
        }
    }
}

/// Claims the group and answers each delivery; whether it went one by one.
async fn commit(connections: &Connections, group: Vec<Waiting>) -> bool {
    if group.len() == 1 {
        let results = one_by_one(connections, &group).await;
        answer(group, results);
        return false;
    }
    let claimed = match insert_on_a_lease(connections, &group).await {
        Err(e) if db::is_connection_lost(&e) => {
            connections.discard_idle();
            tracing::warn!(error = %e, "connection lost during a group claim; claiming again on a fresh one");
            insert_on_a_lease(connections, &group).await
        }
        other => other,
    };
    match claimed {
        Ok(inserted) => {
            // The first delivery of a key inserted is `accepted`; any other, `duplicate`.
            let mut inserted: HashSet<(String, String)> = inserted.into_iter().collect();
            let results = group
                .iter()
                .map(|w| {
                    let key = (w.row.provider.as_str().to_string(), w.row.event.event_id.clone());
                    Ok(if inserted.remove(&key) { Claim::New } else { Claim::Duplicate })
                })
                .collect();
            answer(group, results);
            false
        }
        Err(e) if db::is_refused_value(&e) => {
            tracing::warn!(error = %e, size = group.len(), "PostgreSQL refused a value of a group; claiming its deliveries one by one");
            let results = one_by_one(connections, &group).await;
            answer(group, results);
            true
        }
        Err(e) => {
            tracing::error!(error = %e, size = group.len(), "group claim failed; answering 503");
            let results =
                group.iter().map(|_| Err(sqlx::Error::Protocol(format!("the group claim failed: {e}")))).collect();
            answer(group, results);
            false
        }
    }
}

async fn insert_on_a_lease(connections: &Connections, group: &[Waiting]) -> Result<Vec<(String, String)>, sqlx::Error> {
    let mut conn = connections.acquire().await?;
    let result = retrying!(db::inbox::insert_group(db::Autocommit(&mut *conn), group.iter().map(|w| &w.row)));
    if matches!(result, Ok(_) | Err(sqlx::Error::Database(_))) {
        conn.reuse();
    }
    result
}

/// Each delivery in its own claim (the single claim, with its fallback), in arrival order.
async fn one_by_one(connections: &Connections, group: &[Waiting]) -> Vec<Result<Claim, sqlx::Error>> {
    let mut results = Vec::with_capacity(group.len());
    for w in group {
        results.push(claim_single(connections, &w.row.envelope(), &w.row.event).await);
    }
    results
}

fn answer(group: Vec<Waiting>, results: Vec<Result<Claim, sqlx::Error>>) {
    for (w, result) in group.into_iter().zip(results) {
        // A delivery whose client went away has no one to answer: its row stands.
        let _ = w.answer.send(result);
    }
}

#[cfg(test)]
mod tests {
    //! The committer against a real PostgreSQL: a value PostgreSQL refuses in a
    //! group. (What a delivery sees of grouping, through the receiver, is in the
    //! repository's `tests/it/group.rs`.)

    use std::{sync::Arc, time::Duration};

    use serde_json::json;
    use sqlx::{
        postgres::{PgConnectOptions, PgPoolOptions},
        PgPool,
    };
    use tokio::sync::Barrier;
    use webhook_inbox_schemes::{NewEvent, Provider};

    use super::*;
    use crate::db::DbConfig;

    /// A group that waits long enough for every claim of a test to join it, on one committer.
    const ONE_GROUP: GroupConfig =
        GroupConfig { max: 64, wait: Duration::from_millis(300), committers: 1, stall: Duration::ZERO };

    fn row(id: &str, payload: String) -> Row {
        Row {
            provider: Provider::GITHUB,
            event: NewEvent::pending(id.into(), "push", payload.clone()),
            raw_body: payload.into_bytes(),
            headers: json!({"x-github-delivery": id}),
            secret_index: Some(0),
            secret_fingerprint: None,
            trace_context: None,
        }
    }

    /// Below receive's own payload check: a value PostgreSQL refuses (here,
    /// nesting past its stack depth) fails only its own delivery, which is kept
    /// `failed` without its payload; the rest of its group is claimed as it is.
    #[sqlx::test(migrator = "webhook_inbox_migrations::INBOX")]
    async fn a_value_postgres_refuses_fails_only_its_own_delivery_in_the_group(
        _: PgPoolOptions,
        opts: PgConnectOptions,
    ) {
        let pool = PgPool::connect_with(opts.clone()).await.unwrap();
        let cfg = DbConfig::with_url("unused: connect options come from the test");
        let connections = Arc::new(Connections::from_options(opts, &cfg));
        let grouper = Arc::new(Grouper::start(connections, ONE_GROUP));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let rows = vec![row("g1", "{}".into()), row("g2", deep), row("g3", "[1]".into()), row("g1", "{}".into())];
        let barrier = Arc::new(Barrier::new(rows.len()));
        let tasks: Vec<_> = rows
            .into_iter()
            .map(|row| {
                let (grouper, barrier) = (grouper.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    grouper.claim(row).await.unwrap()
                })
            })
            .collect();
        let mut claims = Vec::new();
        for t in tasks {
            claims.push(t.await.unwrap());
        }
        claims.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(claims, [Claim::Duplicate, Claim::New, Claim::New, Claim::New]);
        let stored: Vec<(String, String, bool)> =
            db::query_as("SELECT event_id, status, payload IS NULL FROM webhook_inbox ORDER BY event_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            stored,
            [
                ("g1".into(), "pending".into(), false),
                ("g2".into(), "failed".into(), true),
                ("g3".into(), "pending".into(), false)
            ]
        );
    }
}
