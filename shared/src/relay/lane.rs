//! One destination's lane: its lease, its messages in flight (a pipeline: a
//! message starts as soon as a slot is free), its rate, its retries and its
//! circuit breaker. Lanes share nothing but the pool, so one destination's
//! trouble stays its own. Its statements run again when a connection is lost
//! under them (each is safe to run twice): a cut costs no pass, and no
//! delivery's result.

use std::{
    collections::{HashMap, VecDeque},
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use futures_util::FutureExt as _;
use sqlx::PgPool;
use tokio::task::JoinSet;

use super::{sink::checked, Destination, DestinationRelayed, RelayConfig, Relayed, SinkReply};
use crate::{
    core::backoff::backoff,
    db::{
        destinations::{self, Gate},
        on_lost_connection_again as again,
        outbox::{self, Dispatch, Outgoing},
    },
    runtime::{scan::Scan, stage::Pass, trace},
};
use webhook_inbox_schemes::text::Escaped;

/// Results are recorded once this many are known, or once the oldest waited this long.
const RECORD_AT: usize = 64;
const RECORD_WITHIN: Duration = Duration::from_millis(50);
/// How often a busy lane looks again whether its destination was paused, or its circuit opened elsewhere.
const GATE_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Lane {
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

/// A delivery call that ended: its messages and their replies.
type Flight = (Vec<Outgoing>, Vec<SinkReply>);

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

    fn name(&self) -> &str {
        &self.destination.name
    }

    /// How many messages to lease at once: a batch, but no more than the rate
    /// lets start within half a lease (or another relay would take them over).
    fn lease_size(&self) -> i64 {
        let by_rate = self
            .destination
            .limits
            .rate_per_second
            .map_or(i64::MAX, |r| (r * self.config.lease.as_secs_f64() / 2.0).floor() as i64);
        self.config.batch_size.min(by_rate).max(1)
    }

    /// Leases, delivers and records until the backlog is drained, the
    /// destination is paused or its circuit opens, or the deadline leaves no
    /// room for another delivery.
    pub(crate) async fn pass(&self, deadline: Instant) -> Result<Pass<Relayed>, sqlx::Error> {
        let limits = &self.destination.limits;
        if !self.registered.load(Ordering::Relaxed) {
            let entry = (self.name().to_string(), self.destination.sink.target());
            again(|| destinations::register(&self.pool, std::slice::from_ref(&entry))).await?;
            self.registered.store(true, Ordering::Relaxed);
        }
        let mut gate = again(|| destinations::gate(&self.pool, self.name(), limits.circuit_cool_down)).await?;
        let mut gate_at = Instant::now();
        let mut t = Relayed::default();
        let mut buffer: VecDeque<Outgoing> = VecDeque::new();
        let mut flying: JoinSet<Flight> = JoinSet::new();
        let mut in_flight = 0usize;
        let mut results: Vec<(i64, i32, Dispatch)> = Vec::new();
        // Whether a result in `results` leaves a message due behind the lease's
        // position once recorded (a retry, or a message whose result lets the
        // next one of its ordering key go).
        let mut results_behind = false;
        let mut first_result: Option<Instant> = None;
        let mut spans: HashMap<i64, trace::Span> = HashMap::new();
        // No more leases this pass: nothing was due with nothing in flight, the
        // probe is out, or the deadline leaves no room for another delivery.
        let mut drained = false;
        // Results recorded so far, and how many were when a lease came back
        // empty: a lease is worth trying again only once more are (a message
        // recorded sent or dead lets the next one of its ordering key go).
        let mut recorded = 0u64;
        let mut empty_at: Option<u64> = None;
        // The next lease and the recordings run beside the deliveries: the
        // pipeline does not empty while a statement is on its way.
        let mut leasing: Option<tokio::task::JoinHandle<Result<Vec<Outgoing>, sqlx::Error>>> = None;
        // Where the lease on its way started (`None`: the head), and how many it asked for.
        let mut lease_from: (Option<i64>, i64) = (None, 0);
        let mut recording: JoinSet<Result<bool, sqlx::Error>> = JoinSet::new();
        loop {
            if gate == Gate::Open && gate_at.elapsed() >= GATE_EVERY {
                gate = again(|| destinations::gate(&self.pool, self.name(), limits.circuit_cool_down)).await?;
                gate_at = Instant::now();
            }
            let record_by = first_result.map(|at| at + RECORD_WITHIN);
            if !results.is_empty()
                && (results.len() >= RECORD_AT || record_by.is_some_and(|at| at <= Instant::now()) || flying.is_empty())
            {
                let (pool, batch) = (self.pool.clone(), std::mem::take(&mut results));
                let behind = std::mem::take(&mut results_behind);
                recording.spawn(async move { again(|| outbox::record_results(&pool, &batch)).await.map(|()| behind) });
                first_result = None;
            }
            let sending = matches!(gate, Gate::Open | Gate::Probe);
            if !sending && !buffer.is_empty() {
                t.released += self.release(buffer.drain(..).collect()).await?;
            }
            let room = Instant::now() + limits.timeout <= deadline;
            // The next lease goes out while fewer wait than the free slots could take
            // (a probe: once, with nothing else in flight).
            let wanted = match gate {
                Gate::Probe => buffer.is_empty() && in_flight == 0,
                _ => buffer.len() < limits.concurrency,
            };
            if leasing.is_none() && wanted && !drained && sending && empty_at != Some(recorded) {
                if room {
                    // The probe is the destination's first due message.
                    let (n, from) = match gate {
                        Gate::Probe => (1, None),
                        _ => (self.lease_size(), self.scan.start()),
                    };
                    lease_from = (from, n);
                    let (pool, name, lease) = (self.pool.clone(), self.name().to_string(), self.config.lease);
                    leasing = Some(tokio::spawn(async move {
                        again(|| outbox::lease_unsent(&pool, &name, n, lease, from)).await
                    }));
                    // The probe is one message.
                    drained = gate == Gate::Probe;
                } else {
                    drained = true;
                }
            }
            // Start what the free slots, the rate and the deadline allow.
            let mut wake: Option<Instant> = None;
            while sending && !buffer.is_empty() && in_flight < limits.concurrency {
                if Instant::now() + limits.timeout > deadline {
                    t.released += self.release(buffer.drain(..).collect()).await?;
                    break;
                }
                let k = buffer.len().min(limits.concurrency - in_flight).min(self.destination.sink.batch_size().max(1));
                if let Some(rate) = limits.rate_per_second {
                    let mut next = self.next_start.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    if *next > now {
                        wake = Some(*next);
                        break;
                    }
                    *next = (*next).max(now) + Duration::from_secs_f64(k as f64 / rate);
                }
                let batch: Vec<Outgoing> = buffer.drain(..k).map(|m| self.traced(m, &mut spans)).collect();
                in_flight += batch.len();
                let sink = self.destination.sink.clone();
                let timeout = limits.timeout;
                flying.spawn(async move {
                    let n = batch.len();
                    let replies = match tokio::time::timeout(
                        timeout,
                        AssertUnwindSafe(sink.deliver(&batch)).catch_unwind(),
                    )
                    .await
                    {
                        Ok(Ok(replies)) => checked(n, replies),
                        Ok(Err(_)) => vec![SinkReply::retry("the sink panicked"); n],
                        // What the sink did is unknown: each message goes again, under the same key.
                        Err(_) => vec![SinkReply::retry(format!("no answer within {} ms", timeout.as_millis())); n],
                    };
                    (batch, replies)
                });
            }
            if flying.is_empty()
                && buffer.is_empty()
                && results.is_empty()
                && leasing.is_none()
                && recording.is_empty()
                && (drained || !sending || empty_at == Some(recorded))
            {
                break;
            }
            // The next thing due besides a result: a start the rate allows, a record, a look at the gate.
            let gate_tick = (gate == Gate::Open).then_some(gate_at + GATE_EVERY);
            let tick = [wake, first_result.map(|at| at + RECORD_WITHIN), gate_tick]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let leased = async {
                match leasing.as_mut() {
                    Some(lease) => lease.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                lease = leased => {
                    leasing = None;
                    let leased = lease.map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))??;
                    let (from, n) = lease_from;
                    if gate != Gate::Probe {
                        let full = leased.len() as i64 >= n;
                        self.scan.taken(from.as_ref(), leased.last().map(|m| m.id), full, false);
                    }
                    // An empty lease from the position is followed by one from the head.
                    if leased.is_empty() && from.is_none() {
                        empty_at = Some(recorded);
                        drained |= in_flight == 0 && recording.is_empty() && results.is_empty();
                    }
                    t.leased += leased.len();
                    buffer.extend(leased);
                }
                Some(done) = recording.join_next() => {
                    if done.map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?? {
                        self.scan.behind();
                    }
                    recorded += 1;
                }
                Some(done) = flying.join_next() => {
                    // A delivery task cannot panic (the sink's panic is caught) or be cancelled.
                    let Ok((batch, replies)) = done else { continue };
                    in_flight -= batch.len();
                    for (m, reply) in batch.iter().zip(replies) {
                        let probing = gate == Gate::Probe;
                        if let Some(g) = self.observe(&reply, gate).await? {
                            gate = g;
                            gate_at = Instant::now();
                        }
                        // A failed probe spends no attempt: the destination failed, not the message,
                        // and an outage probed for an hour must not leave messages dead.
                        if probing && matches!(reply, SinkReply::Retryable { .. }) {
                            spans.remove(&m.id);
                            t.released += self.release(vec![m.clone()]).await?;
                            continue;
                        }
                        let dispatch = self.dispatch(m.attempts, reply);
                        t.count(&dispatch);
                        if let Some(mut span) = spans.remove(&m.id) {
                            match &dispatch {
                                Dispatch::Sent => span.set("webhook.outcome", "sent"),
                                Dispatch::Retry { reason, .. } | Dispatch::Dead(reason) => {
                                    span.fail(webhook_inbox_schemes::text::escape(super::sink::headline(reason)))
                                }
                            }
                        }
                        if let Dispatch::Retry { reason, .. } | Dispatch::Dead(reason) = &dispatch {
                            tracing::info!(destination = %Escaped(self.name()), message_key = %Escaped(&m.message_key), reason = %Escaped(super::sink::headline(reason)), "not delivered");
                        }
                        results_behind |= matches!(dispatch, Dispatch::Retry { .. }) || m.ordering_key.is_some();
                        results.push((m.id, m.attempts, dispatch));
                    }
                    first_result.get_or_insert_with(Instant::now);
                }
                () = tokio::time::sleep_until(tick.into()) => {}
            }
        }
        again(|| outbox::record_results(&self.pool, &results)).await?;
        if results_behind {
            self.scan.behind();
        }
        match gate {
            Gate::Paused => t.paused = 1,
            Gate::Cooling => t.open = 1,
            Gate::Open | Gate::Probe => {}
        }
        let mine = DestinationRelayed {
            sent: t.sent,
            retried: t.retried,
            dead: t.dead,
            paused: t.paused == 1,
            open: t.open == 1,
        };
        t.destinations.insert(self.name().to_string(), mine);
        // A pass ends with its backlog drained, or with the deadline: never more to do before it.
        Ok(Pass { tally: t, more: false })
    }

    /// Counts a reply toward the circuit breaker; the gate it leaves, if it changed it.
    async fn observe(&self, reply: &SinkReply, gate: Gate) -> Result<Option<Gate>, sqlx::Error> {
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
    fn traced(&self, m: Outgoing, spans: &mut HashMap<i64, trace::Span>) -> Outgoing {
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
    async fn release(&self, messages: Vec<Outgoing>) -> Result<usize, sqlx::Error> {
        let leases: Vec<(i64, i32)> = messages.iter().map(|m| (m.id, m.attempts)).collect();
        again(|| outbox::release(&self.pool, &leases)).await?;
        self.scan.behind();
        Ok(leases.len())
    }

    fn dispatch(&self, attempts: i32, reply: SinkReply) -> Dispatch {
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

impl Relayed {
    fn count(&mut self, d: &Dispatch) {
        match d {
            Dispatch::Sent => self.sent += 1,
            Dispatch::Retry { .. } => self.retried += 1,
            Dispatch::Dead(_) => self.dead += 1,
        }
    }
}

/// A lane's counts, as `serve` reports them: the gauges come from the
/// database apart (one lane's view of them would overwrite another's).
#[cfg(feature = "serve")]
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct LaneRelayed(Relayed);

#[cfg(feature = "serve")]
impl crate::runtime::stage::Tally for LaneRelayed {
    fn add(&mut self, other: &Self) {
        self.0.add(&other.0);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(feature = "serve")]
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
#[cfg(feature = "serve")]
impl crate::runtime::stage::Stage for Lane {
    type Tally = LaneRelayed;
    const NAME: &'static str = "relay";

    async fn run_once(&self, deadline: Instant) -> Result<Pass<LaneRelayed>, sqlx::Error> {
        let pass = self.pass(deadline).await?;
        Ok(Pass { tally: LaneRelayed(pass.tally), more: pass.more })
    }
}
