//! The relay: delivers outbox messages to their sinks, at least once, each
//! under its stable `message_key`. A crash between publishing and marking
//! re-sends the message with the same key, so consumers deduplicate on it.

use crate::core::text::Escaped;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use sqlx::PgPool;

pub mod aws;
pub mod http;

pub use http::HttpSink;

use crate::{
    core::backoff::backoff,
    db::outbox::{self, Dispatch, Outgoing},
    runtime::{
        stage::{Pass, Reported, Stage, Tally},
        trace,
    },
};

/// What a sink replied about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkReply {
    Delivered,
    /// Worth another try (5xx, 408, 429, timeouts), no sooner than `retry_after` if the sink said so.
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Will never be accepted (other 4xx): dead at once.
    Rejected(String),
}

pub type ReplyFuture<'a> = Pin<Box<dyn Future<Output = SinkReply> + Send + 'a>>;
pub type RepliesFuture<'a> = Pin<Box<dyn Future<Output = Vec<SinkReply>> + Send + 'a>>;

/// A destination for outbox messages.
pub trait Sink: Send + Sync {
    fn name(&self) -> &'static str;
    /// The longest one [`Sink::deliver_all`] call of a chunk may take (its own
    /// timeouts): the relay starts no chunk it could not finish before its deadline.
    fn budget(&self) -> Duration;
    /// One result per message, in order.
    fn deliver_all<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a>;
}

/// The relay's settings (`RelayConfig::read` from the environment).
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `RELAY_BATCH_SIZE` (100): messages leased at once.
    pub batch_size: i64,
    /// `RELAY_CONCURRENCY` (8): messages in flight at once; each such chunk's
    /// results are recorded as soon as it is done.
    pub concurrency: usize,
    /// `RELAY_MAX_ATTEMPTS` (10): then a retryable message is dead.
    pub max_attempts: i32,
    /// `RELAY_RETRY_BASE_MS` (1000), doubled per attempt, capped at an hour.
    pub retry_base: Duration,
    /// `RELAY_LEASE_MS` (300000): how long a leased message is left alone; longer
    /// than a batch can take, or another relay sends it again meanwhile.
    pub lease: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            concurrency: 8,
            max_attempts: 10,
            retry_base: Duration::from_secs(1),
            lease: Duration::from_secs(300),
        }
    }
}

/// What a pass (or a run of passes) of the relay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Relayed {
    /// Messages leased.
    pub leased: usize,
    /// Taken by every sink: sent.
    pub sent: usize,
    /// Refused for now: due again after their backoff.
    pub retried: usize,
    /// Refused for good, or out of attempts: dead (`inbox outbox --dead`).
    pub dead: usize,
    /// Leased but not started before the deadline: released at once, no attempt spent.
    pub released: usize,
}

impl Reported for Relayed {
    /// The `relay` function's metrics: `relayed`, `relay_retried`, `relay_dead`.
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let mut m = crate::runtime::metrics::Metrics::new("relay");
        m.count("relayed", self.sent as u64)
            .count("relay_retried", self.retried as u64)
            .count("relay_dead", self.dead as u64);
        vec![m]
    }
}

impl Tally for Relayed {
    fn add(&mut self, r: &Relayed) {
        self.leased += r.leased;
        self.sent += r.sent;
        self.retried += r.retried;
        self.dead += r.dead;
        self.released += r.released;
    }

    fn is_empty(&self) -> bool {
        self.leased == 0
    }
}

impl Stage for Relay {
    type Tally = Relayed;
    const NAME: &'static str = "relay";

    /// More may wait after a full lease that was not cut short by the deadline.
    async fn run_once(&self, deadline: Instant) -> Result<Pass<Relayed>, sqlx::Error> {
        let r = Relay::run_once(self, deadline).await?;
        Ok(Pass { tally: r, more: r.leased as i64 >= self.config.batch_size && r.released == 0 })
    }
}

/// The relay stage: outbox messages to their sinks, at least once, each under
/// its `message_key`. Run it as a [`Stage`] (`run`, `run_until`), or one batch
/// with [`Relay::run_once`]; its sinks come from
/// [`SinkConfig::build`](crate::config::SinkConfig::build).
pub struct Relay {
    pool: PgPool,
    sinks: Arc<Vec<Arc<dyn Sink>>>,
    config: RelayConfig,
}

impl Relay {
    /// A relay on `pool` to `sinks` (every message goes to each of them).
    pub fn new(pool: PgPool, sinks: Vec<Arc<dyn Sink>>, config: RelayConfig) -> Self {
        Relay { pool, sinks: Arc::new(sinks), config }
    }

    /// One batch: lease up to `batch_size` messages, then deliver them a chunk
    /// (`concurrency`) at a time to every sink, recording each chunk's results as
    /// soon as they are known: a function killed mid-batch loses at most one
    /// chunk's results (those messages go out again when their lease ends, under
    /// the same key). A chunk is started only if every sink's budget fits before
    /// `deadline`; the messages not started are released at once, untouched.
    /// A message counts as sent once every sink took it; if one did not, it goes
    /// to all of them again later, under the same key.
    pub async fn run_once(&self, deadline: Instant) -> Result<Relayed, sqlx::Error> {
        if !self.fits(deadline) {
            return Ok(Relayed::default());
        }
        let messages = outbox::lease_unsent(&self.pool, self.config.batch_size, self.config.lease).await?;
        let mut relayed = Relayed { leased: messages.len(), ..Relayed::default() };
        let mut chunks = messages.chunks(self.config.concurrency);
        let mut unstarted: Vec<&Outgoing> = Vec::new();
        while let Some(chunk) = chunks.next() {
            if !self.fits(deadline) {
                unstarted.extend(chunk.iter().chain(chunks.flatten()));
                break;
            }
            // Each message's span, a child of the processing that wrote it (traces on); the
            // sinks send it on (the HTTP sink as `traceparent`).
            let mut spans: Vec<Option<trace::Span>> = chunk
                .iter()
                .map(|m| {
                    let mut span = trace::start("relay", trace::Kind::Producer, m.trace_context.as_deref());
                    if let Some(span) = &mut span {
                        span.set("messaging.message.id", crate::core::text::escape(&m.message_key));
                    }
                    span
                })
                .collect();
            let traced: Vec<Outgoing>;
            let chunk = if spans.iter().any(Option::is_some) {
                traced = chunk
                    .iter()
                    .zip(&spans)
                    .map(|(m, span)| Outgoing {
                        trace_context: span.as_ref().map(trace::Span::traceparent),
                        ..m.clone()
                    })
                    .collect();
                &traced[..]
            } else {
                chunk
            };
            let outcomes =
                match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), self.deliver(chunk))
                    .await
                {
                    Ok(outcomes) => outcomes,
                    // A sink outlasted its own budget: what it did is unknown, so each message is retried.
                    Err(_) => {
                        vec![
                            SinkReply::Retryable { reason: "no answer before the deadline".into(), retry_after: None };
                            chunk.len()
                        ]
                    }
                };
            let dispatches: Vec<(i64, i32, Dispatch)> =
                chunk.iter().zip(outcomes).map(|(m, d)| (m.id, m.attempts, self.dispatch(m.attempts, d))).collect();
            for ((_, _, d), span) in dispatches.iter().zip(&mut spans) {
                match d {
                    Dispatch::Sent => relayed.sent += 1,
                    Dispatch::Retry { .. } => relayed.retried += 1,
                    Dispatch::Dead(_) => relayed.dead += 1,
                }
                if let Some(span) = span {
                    match d {
                        Dispatch::Sent => span.set("webhook.outcome", "sent"),
                        Dispatch::Retry { reason, .. } | Dispatch::Dead(reason) => {
                            span.fail(crate::core::text::escape(reason))
                        }
                    }
                }
            }
            outbox::record_results(&self.pool, &dispatches).await?;
        }
        if !unstarted.is_empty() {
            let leases: Vec<(i64, i32)> = unstarted.iter().map(|m| (m.id, m.attempts)).collect();
            outbox::release(&self.pool, &leases).await?;
            relayed.released = unstarted.len();
        }
        Ok(relayed)
    }

    /// Whether a chunk started now would finish before `deadline`, its sinks
    /// (called one after the other) each taking its whole budget.
    fn fits(&self, deadline: Instant) -> bool {
        let budget: Duration = self.sinks.iter().map(|s| s.budget()).sum();
        Instant::now() + budget <= deadline
    }

    /// One chunk through every sink in turn; each message's first failure is its outcome.
    async fn deliver(&self, chunk: &[Outgoing]) -> Vec<SinkReply> {
        let mut outcomes = vec![SinkReply::Delivered; chunk.len()];
        for sink in self.sinks.iter() {
            let (pending, idx): (Vec<Outgoing>, Vec<usize>) = chunk
                .iter()
                .zip(0..)
                .filter(|(_, i)| outcomes[*i] == SinkReply::Delivered)
                .map(|(m, i)| (m.clone(), i))
                .unzip();
            if pending.is_empty() {
                break;
            }
            for (i, result) in idx.into_iter().zip(sink.deliver_all(&pending).await) {
                if result != SinkReply::Delivered {
                    tracing::info!(sink = sink.name(), message_key = %Escaped(&chunk[i].message_key), ?result, "not delivered");
                    outcomes[i] = result;
                }
            }
        }
        outcomes
    }

    fn dispatch(&self, attempts: i32, delivery: SinkReply) -> Dispatch {
        match delivery {
            SinkReply::Delivered => Dispatch::Sent,
            SinkReply::Rejected(reason) => Dispatch::Dead(reason),
            SinkReply::Retryable { reason, .. } if attempts >= self.config.max_attempts => {
                Dispatch::Dead(format!("after {attempts} attempts: {reason}"))
            }
            SinkReply::Retryable { reason, retry_after } => {
                let after = backoff(self.config.retry_base, attempts - 1).max(retry_after.unwrap_or_default());
                Dispatch::Retry { after, reason }
            }
        }
    }
}
