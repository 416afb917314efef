//! One destination's lane: its lease, its messages in flight (a pipeline: a
//! message starts as soon as a slot is free; each pass: `pass.rs`),
//! its rate, its retries and its circuit breaker. Lanes share nothing but the
//! pool, so one destination's trouble stays its own. Its statements run again
//! when a connection is lost under them (each is safe to run twice): a cut
//! costs no pass, and no delivery's result.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::{Destination, RelayConfig, SinkReply};
use crate::{
    core::backoff::backoff,
    db::{
        destinations::{self, Gate},
        on_lost_connection_again as again,
        outbox::{self, Dispatch, Outgoing},
    },
    runtime::{scan::Scan, trace},
};
use webhook_inbox_schemes::text::Escaped;

/// One destination's share of the relay: a [`Stage`](crate::Stage) of its
/// own, so that a host runs each destination on its own loop and a slow one
/// waits for nothing but itself ([`Relay::into_lanes`](crate::Relay::into_lanes)).
pub struct Lane {
    pool: PgPool,
    destination: Destination,
    config: RelayConfig,
    /// This process's relay said, once, that it has the destination configured.
    registered: AtomicBool,
    /// When the rate allows the next start (this process).
    next_start: Mutex<Instant>,
    /// Retryable failures in a row (this process): the circuit opens at the limit.
    failures: AtomicU32,
    /// Where the next lease starts: after the last message leased.
    scan: Scan<i64>,
}

impl Lane {
    pub(crate) fn new(pool: PgPool, destination: Destination, config: RelayConfig) -> Self {
        Lane {
            pool,
            destination,
            config,
            registered: AtomicBool::new(false),
            next_start: Mutex::new(Instant::now()),
            failures: AtomicU32::new(0),
            scan: Scan::default(),
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.destination.name
    }

    /// How many messages to lease at once: a batch, but no more than the rate
    /// lets start within half a lease (or another relay would take them over).
    pub(super) fn lease_size(&self) -> i64 {
        let by_rate = self
            .destination
            .limits
            .rate_per_second
            .map_or(i64::MAX, |r| (r * self.config.lease.as_secs_f64() / 2.0).floor() as i64);
        self.config.batch_size.min(by_rate).max(1)
    }

    /// Says once, for this process, that the relay has the destination configured.
    pub(super) async fn register(&self) -> Result<(), sqlx::Error> {
        if !self.registered.load(Ordering::Relaxed) {
            let entry = (self.name().to_string(), self.destination.sink.target());
            again(|| destinations::register(&self.pool, std::slice::from_ref(&entry))).await?;
            self.registered.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(super) fn destination(&self) -> &Destination {
        &self.destination
    }

    pub(super) fn scan(&self) -> &Scan<i64> {
        &self.scan
    }

    /// The destination's gate: open, paused, cooling, or the probe's turn.
    pub(super) async fn gate(&self) -> Result<Gate, sqlx::Error> {
        again(|| destinations::gate(&self.pool, self.name(), self.destination.limits.circuit_cool_down)).await
    }

    /// Leases up to `n` due messages from `from` (`None`: the head), beside whatever runs.
    pub(super) fn lease(&self, n: i64, from: Option<i64>) -> JoinHandle<Result<Vec<Outgoing>, sqlx::Error>> {
        let (pool, name, lease) = (self.pool.clone(), self.name().to_string(), self.config.lease);
        tokio::spawn(async move { again(|| outbox::lease_unsent(&pool, &name, n, lease, from)).await })
    }

    /// Takes the rate's room for `k` starts now (this process); when the rate
    /// allows them instead, if not now.
    pub(super) fn take_rate(&self, k: usize) -> Option<Instant> {
        let rate = self.destination.limits.rate_per_second?;
        let mut next = self.next_start.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if *next > now {
            return Some(*next);
        }
        *next = (*next).max(now) + Duration::from_secs_f64(k as f64 / rate);
        None
    }

    /// Counts a reply toward the circuit breaker; the gate it leaves, if it changed it.
    pub(super) async fn observe(&self, reply: &SinkReply, gate: Gate) -> Result<Option<Gate>, sqlx::Error> {
        let limits = &self.destination.limits;
        match reply {
            SinkReply::Delivered => {
                self.failures.store(0, Ordering::Relaxed);
                if gate == Gate::Probe {
                    again(|| destinations::close(&self.pool, self.name())).await?;
                    tracing::info!(destination = %Escaped(self.name()), "circuit closed: the probe went through");
                    return Ok(Some(Gate::Open));
                }
            }
            SinkReply::Retryable { reason, .. } => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if gate == Gate::Probe {
                    // The probe's claim restarted the cool-down already.
                    return Ok(Some(Gate::Cooling));
                }
                if gate == Gate::Open && failures >= limits.circuit_failures {
                    again(|| destinations::open(&self.pool, self.name(), failures, reason)).await?;
                    tracing::warn!(destination = %Escaped(self.name()), failures, reason = %Escaped(super::sink::headline(reason)), "circuit opened");
                    self.failures.store(0, Ordering::Relaxed);
                    return Ok(Some(Gate::Cooling));
                }
            }
            // The destination answered: the message is at fault, not the destination.
            SinkReply::Rejected(_) => {}
        }
        Ok(None)
    }

    /// The message as handed to the sink: with the relay's span as its
    /// `traceparent`, when traces are on.
    pub(super) fn traced(&self, m: Outgoing, spans: &mut HashMap<i64, trace::Span>) -> Outgoing {
        let Some(mut span) = trace::start("relay", trace::Kind::Producer, m.trace_context.as_deref()) else {
            return m;
        };
        span.set("messaging.message.id", webhook_inbox_schemes::text::escape(&m.message_key));
        span.set("messaging.destination.name", webhook_inbox_schemes::text::escape(&m.destination));
        let m = Outgoing { trace_context: Some(span.traceparent()), ..m };
        spans.insert(m.id, span);
        m
    }

    /// Gives leased messages back untouched; how many.
    pub(super) async fn release(&self, messages: Vec<Outgoing>) -> Result<usize, sqlx::Error> {
        let leases: Vec<(i64, i32)> = messages.iter().map(|m| (m.id, m.attempts)).collect();
        again(|| outbox::release(&self.pool, &leases)).await?;
        self.scan.behind();
        Ok(leases.len())
    }

    pub(super) fn dispatch(&self, attempts: i32, reply: SinkReply) -> Dispatch {
        match reply {
            SinkReply::Delivered => Dispatch::Sent,
            SinkReply::Rejected(reason) => Dispatch::Dead(reason),
            SinkReply::Retryable { reason, .. } if attempts >= self.destination.limits.max_attempts => {
                Dispatch::Dead(format!("after {attempts} attempts: {reason}"))
            }
            SinkReply::Retryable { reason, retry_after } => {
                let after = backoff(self.config.retry_base, attempts - 1).max(retry_after.unwrap_or_default());
                Dispatch::Retry { after, reason }
            }
        }
    }
}

/// A lane's counts, as `serve` reports them: the gauges come from the
/// database apart (one lane's view of them would overwrite another's).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct LaneRelayed(super::Relayed);

impl crate::runtime::stage::Tally for LaneRelayed {
    fn add(&mut self, other: &Self) {
        self.0.add(&other.0);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl crate::runtime::stage::Reported for LaneRelayed {
    /// `relayed`, `relay_retried`, `relay_dead`, labelled with the lane's destination.
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let each = self.0.destinations.iter().map(|(name, d)| {
            let mut m = crate::runtime::metrics::Metrics::new("relay").for_destination(name);
            m.count("relayed", d.sent as u64)
                .count("relay_retried", d.retried as u64)
                .count("relay_dead", d.dead as u64);
            m
        });
        each.collect()
    }
}

/// One lane on its own loop (`serve`): it waits for nothing but its destination.
impl crate::runtime::stage::Stage for Lane {
    type Tally = LaneRelayed;
    const NAME: &'static str = "relay";

    async fn run_once(&self, deadline: Instant) -> Result<crate::runtime::stage::Pass<LaneRelayed>, sqlx::Error> {
        let pass = self.pass(deadline).await?;
        Ok(crate::runtime::stage::Pass { tally: LaneRelayed(pass.tally), more: pass.more })
    }
}
