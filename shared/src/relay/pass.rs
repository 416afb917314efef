//! One pass of a lane, as a pipeline. Each turn it looks at the gate (paused,
//! open, cooling, probing), records the results known (at [`RECORD_AT`], or
//! once the oldest waited [`RECORD_WITHIN`]), gives leased messages back if the
//! gate closed, leases what the free slots could take next, starts what the
//! slots, the rate and the deadline allow; then it waits for the first of a
//! lease, a recording, a delivery or a tick. The lease and the recordings run
//! beside the deliveries, so the pipeline does not empty while a statement is
//! on its way. The pass ends once nothing is leased, in flight or unrecorded,
//! and there is nothing more to lease.

use std::{
    collections::{HashMap, VecDeque},
    panic::AssertUnwindSafe,
    time::{Duration, Instant},
};

use futures_util::FutureExt as _;
use tokio::task::{JoinHandle, JoinSet};
use webhook_inbox_schemes::text::{escape, Escaped};

use super::{
    lane::Lane,
    sink::{checked, headline},
    DestinationRelayed, Relayed, SinkReply,
};
use crate::{
    db::{
        destinations::Gate,
        on_lost_connection_again as again,
        outbox::{self, Dispatch, Outgoing},
    },
    runtime::{stage::Pass, trace},
};

/// Results are recorded once this many are known, or once the oldest waited this long.
const RECORD_AT: usize = 64;
const RECORD_WITHIN: Duration = Duration::from_millis(50);
/// How often a busy lane looks again whether its destination was paused, or its circuit opened elsewhere.
const GATE_EVERY: Duration = Duration::from_secs(1);

/// A delivery call that ended: its messages and their replies.
type Flight = (Vec<Outgoing>, Vec<SinkReply>);

impl Lane {
    /// Leases, delivers and records until the backlog is drained, the
    /// destination is paused or its circuit opens, or the deadline leaves no
    /// room for another delivery (the steps: [`LanePass`]).
    pub(crate) async fn pass(&self, deadline: Instant) -> Result<Pass<Relayed>, sqlx::Error> {
        self.register().await?;
        let tally = LanePass::run(self, deadline).await?;
        // A pass ends with its backlog drained, or with the deadline: never more to do before it.
        Ok(Pass { tally, more: false })
    }
}

/// A pass's state: what is leased, in flight and known but not recorded.
struct LanePass<'a> {
    lane: &'a Lane,
    deadline: Instant,
    /// The destination's gate, and when it was read.
    gate: Gate,
    gate_at: Instant,
    tally: Relayed,
    /// Leased, not started.
    buffer: VecDeque<Outgoing>,
    /// The delivery calls on their way, and how many messages they carry.
    flying: JoinSet<Flight>,
    in_flight: usize,
    /// Results not recorded yet; when the oldest was known.
    results: Vec<(i64, i32, Dispatch)>,
    first_result: Option<Instant>,
    /// Whether a result in `results` leaves a message due behind the lease's
    /// position once recorded (a retry, or a message whose result lets the
    /// next one of its ordering key go).
    results_behind: bool,
    spans: HashMap<i64, trace::Span>,
    /// No more leases this pass: nothing was due with nothing in flight, the
    /// probe is out, or the deadline leaves no room for another delivery.
    drained: bool,
    /// Recordings done so far, and how many were when a lease came back
    /// empty: a lease is worth trying again only once more are (a message
    /// recorded sent or dead lets the next one of its ordering key go).
    recorded: u64,
    empty_at: Option<u64>,
    /// The lease on its way; where it started (`None`: the head) and how many it asked for.
    leasing: Option<JoinHandle<Result<Vec<Outgoing>, sqlx::Error>>>,
    lease_from: (Option<i64>, i64),
    /// The recordings on their way; each says whether it left a message behind the position.
    recording: JoinSet<Result<bool, sqlx::Error>>,
}

impl<'a> LanePass<'a> {
    /// The pass's loop: each turn, its steps in order, then a wait.
    async fn run(lane: &'a Lane, deadline: Instant) -> Result<Relayed, sqlx::Error> {
        let gate = lane.gate().await?;
        let mut pass = LanePass {
            lane,
            deadline,
            gate,
            gate_at: Instant::now(),
            tally: Relayed::default(),
            buffer: VecDeque::new(),
            flying: JoinSet::new(),
            in_flight: 0,
            results: Vec::new(),
            first_result: None,
            results_behind: false,
            spans: HashMap::new(),
            drained: false,
            recorded: 0,
            empty_at: None,
            leasing: None,
            lease_from: (None, 0),
            recording: JoinSet::new(),
        };
        loop {
            pass.look_at_gate().await?;
            pass.record_if_due();
            pass.release_unless_sending().await?;
            pass.lease_if_wanted();
            let wake = pass.start_deliveries().await?;
            if pass.is_over() {
                break;
            }
            pass.wait(wake).await?;
        }
        pass.finish().await
    }

    fn sending(&self) -> bool {
        matches!(self.gate, Gate::Open | Gate::Probe)
    }

    /// Reads the gate again once [`GATE_EVERY`] has passed, while it is open.
    async fn look_at_gate(&mut self) -> Result<(), sqlx::Error> {
        if self.gate == Gate::Open && self.gate_at.elapsed() >= GATE_EVERY {
            self.gate = self.lane.gate().await?;
            self.gate_at = Instant::now();
        }
        Ok(())
    }

    /// Records the results known, beside the deliveries, once there are
    /// enough, the oldest waited long enough, or nothing else is in flight.
    fn record_if_due(&mut self) {
        let record_by = self.first_result.map(|at| at + RECORD_WITHIN);
        let due = self.results.len() >= RECORD_AT
            || record_by.is_some_and(|at| at <= Instant::now())
            || self.flying.is_empty();
        if self.results.is_empty() || !due {
            return;
        }
        let (pool, batch) = (self.lane.pool().clone(), std::mem::take(&mut self.results));
        let behind = std::mem::take(&mut self.results_behind);
        self.recording.spawn(async move { again(|| outbox::record_results(&pool, &batch)).await.map(|()| behind) });
        self.first_result = None;
    }

    /// Gives back what waits to start once the destination is paused or its circuit open.
    async fn release_unless_sending(&mut self) -> Result<(), sqlx::Error> {
        if !self.sending() && !self.buffer.is_empty() {
            self.tally.released += self.lane.release(self.buffer.drain(..).collect()).await?;
        }
        Ok(())
    }

    /// Sends the next lease while fewer wait than the free slots could take
    /// (a probe: once, with nothing else in flight), unless the deadline
    /// leaves no room for another delivery.
    fn lease_if_wanted(&mut self) {
        let limits = &self.lane.destination().limits;
        let wanted = match self.gate {
            Gate::Probe => self.buffer.is_empty() && self.in_flight == 0,
            _ => self.buffer.len() < limits.concurrency,
        };
        if self.leasing.is_some() || !wanted || self.drained || !self.sending() || self.empty_at == Some(self.recorded)
        {
            return;
        }
        if Instant::now() + limits.timeout > self.deadline {
            self.drained = true;
            return;
        }
        // The probe is the destination's first due message, and the pass's last lease.
        let (n, from) = match self.gate {
            Gate::Probe => (1, None),
            _ => (self.lane.lease_size(), self.lane.scan().start()),
        };
        self.lease_from = (from, n);
        self.leasing = Some(self.lane.lease(n, from));
        self.drained = self.gate == Gate::Probe;
    }

    /// Starts what the free slots, the rate and the deadline allow; when the
    /// rate allows the next start, if it held one back.
    async fn start_deliveries(&mut self) -> Result<Option<Instant>, sqlx::Error> {
        let limits = &self.lane.destination().limits;
        while self.sending() && !self.buffer.is_empty() && self.in_flight < limits.concurrency {
            if Instant::now() + limits.timeout > self.deadline {
                self.tally.released += self.lane.release(self.buffer.drain(..).collect()).await?;
                break;
            }
            let k = self
                .buffer
                .len()
                .min(limits.concurrency - self.in_flight)
                .min(self.lane.destination().sink.batch_size().max(1));
            if let Some(wake) = self.lane.take_rate(k) {
                return Ok(Some(wake));
            }
            let batch: Vec<Outgoing> = self.buffer.drain(..k).map(|m| self.lane.traced(m, &mut self.spans)).collect();
            self.in_flight += batch.len();
            let (sink, timeout) = (self.lane.destination().sink.clone(), limits.timeout);
            self.flying.spawn(async move {
                let n = batch.len();
                let replies =
                    match tokio::time::timeout(timeout, AssertUnwindSafe(sink.deliver(&batch)).catch_unwind()).await {
                        Ok(Ok(replies)) => checked(n, replies),
                        Ok(Err(_)) => vec![SinkReply::retry("the sink panicked"); n],
                        // What the sink did is unknown: each message goes again, under the same key.
                        Err(_) => vec![SinkReply::retry(format!("no answer within {} ms", timeout.as_millis())); n],
                    };
                (batch, replies)
            });
        }
        Ok(None)
    }

    /// Nothing leased, in flight or unrecorded, and nothing more to lease.
    fn is_over(&self) -> bool {
        self.flying.is_empty()
            && self.buffer.is_empty()
            && self.results.is_empty()
            && self.leasing.is_none()
            && self.recording.is_empty()
            && (self.drained || !self.sending() || self.empty_at == Some(self.recorded))
    }

    /// Waits for the first of a lease, a recording, a delivery, or the next
    /// thing due besides (a start the rate allows, a record, a look at the gate).
    async fn wait(&mut self, wake: Option<Instant>) -> Result<(), sqlx::Error> {
        let gate_tick = (self.gate == Gate::Open).then_some(self.gate_at + GATE_EVERY);
        let tick = [wake, self.first_result.map(|at| at + RECORD_WITHIN), gate_tick]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let leased = async {
            match self.leasing.as_mut() {
                Some(lease) => lease.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            lease = leased => {
                self.leasing = None;
                self.leased(lease.map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))??);
            }
            Some(done) = self.recording.join_next() => {
                if done.map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?? {
                    self.lane.scan().behind();
                }
                self.recorded += 1;
            }
            // A delivery task cannot panic (the sink's panic is caught) or be cancelled.
            Some(Ok((batch, replies))) = self.flying.join_next() => self.delivered(batch, replies).await?,
            () = tokio::time::sleep_until(tick.into()) => {}
        }
        Ok(())
    }

    /// A lease came back: its messages wait to start.
    fn leased(&mut self, leased: Vec<Outgoing>) {
        let (from, n) = self.lease_from;
        if self.gate != Gate::Probe {
            let full = leased.len() as i64 >= n;
            self.lane.scan().taken(from.as_ref(), leased.last().map(|m| m.id), full, false);
        }
        // An empty lease from the position is followed by one from the head.
        if leased.is_empty() && from.is_none() {
            self.empty_at = Some(self.recorded);
            self.drained |= self.in_flight == 0 && self.recording.is_empty() && self.results.is_empty();
        }
        self.tally.leased += leased.len();
        self.buffer.extend(leased);
    }

    /// A delivery call ended: each reply moves the circuit breaker and becomes a result to record.
    async fn delivered(&mut self, batch: Vec<Outgoing>, replies: Vec<SinkReply>) -> Result<(), sqlx::Error> {
        self.in_flight -= batch.len();
        for (m, reply) in batch.iter().zip(replies) {
            let probing = self.gate == Gate::Probe;
            if let Some(g) = self.lane.observe(&reply, self.gate).await? {
                self.gate = g;
                self.gate_at = Instant::now();
            }
            // A failed probe spends no attempt: the destination failed, not the message,
            // and an outage probed for an hour must not leave messages dead.
            if probing && matches!(reply, SinkReply::Retryable { .. }) {
                self.spans.remove(&m.id);
                self.tally.released += self.lane.release(vec![m.clone()]).await?;
                continue;
            }
            let dispatch = self.lane.dispatch(m.attempts, reply);
            self.tally.count(&dispatch);
            if let Some(mut span) = self.spans.remove(&m.id) {
                match &dispatch {
                    Dispatch::Sent => span.set("webhook.outcome", "sent"),
                    Dispatch::Retry { reason, .. } | Dispatch::Dead(reason) => span.fail(escape(headline(reason))),
                }
            }
            if let Dispatch::Retry { reason, .. } | Dispatch::Dead(reason) = &dispatch {
                tracing::info!(destination = %Escaped(self.lane.name()), message_key = %Escaped(&m.message_key), reason = %Escaped(headline(reason)), "not delivered");
            }
            self.results_behind |= matches!(dispatch, Dispatch::Retry { .. }) || m.ordering_key.is_some();
            self.results.push((m.id, m.attempts, dispatch));
        }
        self.first_result.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Records what is left, and the pass's counts with the gate it ended at.
    async fn finish(mut self) -> Result<Relayed, sqlx::Error> {
        again(|| outbox::record_results(self.lane.pool(), &self.results)).await?;
        if self.results_behind {
            self.lane.scan().behind();
        }
        let t = &mut self.tally;
        match self.gate {
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
        t.destinations.insert(self.lane.name().to_string(), mine);
        Ok(self.tally)
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
