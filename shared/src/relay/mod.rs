//! The relay: delivers outbox messages to their destinations, at least once,
//! each under its stable `message_key`. A crash between publishing and marking
//! re-sends the message with the same key, so consumers deduplicate on it.
//!
//! Each destination has its own lane ([`lane`]): its own lease, its messages
//! in flight, its rate, its retries and its circuit breaker, so that a slow,
//! failing or paused destination holds up only its own messages.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use sqlx::PgPool;

#[cfg(feature = "amqp")]
pub(crate) mod amqp;
pub(crate) mod aws;
pub(crate) mod http;
pub(crate) mod lane;
#[cfg(feature = "nats")]
pub(crate) mod nats;
mod pass;
pub(crate) mod signing;
pub(crate) mod sink;

pub use http::HttpSink;
pub use sink::{RepliesFuture, Sink, SinkReply};

use crate::runtime::stage::{Pass, Reported, Stage, Tally};

/// The relay's settings (`RelayConfig::read` from the environment); each
/// destination has its own [`DestinationLimits`] besides.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `RELAY_BATCH_SIZE` (100): the most messages a destination's lane leases at once.
    pub batch_size: i64,
    /// `RELAY_RETRY_BASE_MS` (1000), doubled per attempt, capped at an hour.
    pub retry_base: Duration,
    /// `RELAY_LEASE_MS` (300000): how long a leased message is left alone; longer
    /// than a message can wait for its turn and its delivery, or another relay
    /// sends it again meanwhile.
    pub lease: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig { batch_size: 100, retry_base: Duration::from_secs(1), lease: Duration::from_secs(300) }
    }
}

/// How hard the relay may push one destination, and when it gives up on it.
/// The environment's `RELAY_*` variables give the defaults (see
/// `DestinationLimits::read`); each `[destination.NAME]` may set its own.
#[derive(Debug, Clone, PartialEq)]
pub struct DestinationLimits {
    /// `concurrency` (`RELAY_CONCURRENCY`, 8): messages in flight at once; a
    /// message starts as soon as one ends.
    pub concurrency: usize,
    /// `rate_per_second` (`RELAY_RATE_PER_SECOND`, none): messages started a
    /// second, by each relay process (with N relays running, up to N times
    /// this reaches the destination: give each `limit / N`).
    pub rate_per_second: Option<f64>,
    /// `timeout_ms` (`RELAY_TIMEOUT_MS`, 10000): the longest one delivery may
    /// take; then it counts as a retryable failure.
    pub timeout: Duration,
    /// `max_attempts` (`RELAY_MAX_ATTEMPTS`, 10): then a retryable message is dead.
    pub max_attempts: i32,
    /// `circuit_failures` (`RELAY_CIRCUIT_FAILURES`, 10): consecutive
    /// retryable failures that open the destination's circuit.
    pub circuit_failures: u32,
    /// `circuit_cool_down_ms` (`RELAY_CIRCUIT_COOL_DOWN_MS`, 30000): how long
    /// an open circuit sends nothing before one message probes it.
    pub circuit_cool_down: Duration,
}

impl Default for DestinationLimits {
    fn default() -> Self {
        DestinationLimits {
            concurrency: 8,
            rate_per_second: None,
            timeout: Duration::from_secs(10),
            max_attempts: 10,
            circuit_failures: 10,
            circuit_cool_down: Duration::from_secs(30),
        }
    }
}

/// A named place messages go ([`crate::Message::to`]): its sink and its limits.
#[derive(Clone)]
pub struct Destination {
    name: String,
    sink: Arc<dyn Sink>,
    limits: DestinationLimits,
}

impl Destination {
    /// The destination `name` (`default` for messages that name none), sent
    /// to `sink`, with the default limits.
    pub fn new(name: impl Into<String>, sink: impl Sink) -> Self {
        Destination::shared(name, Arc::new(sink))
    }

    /// [`Destination::new`] for a sink already shared.
    pub fn shared(name: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        Destination { name: name.into(), sink, limits: DestinationLimits::default() }
    }

    /// These limits instead of the defaults.
    pub fn with_limits(mut self, limits: DestinationLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limits.
    pub fn limits(&self) -> &DestinationLimits {
        &self.limits
    }

    /// What its sink sends to.
    pub fn target(&self) -> String {
        self.sink.target()
    }
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("name", &self.name)
            .field("target", &self.sink.target())
            .field("limits", &self.limits)
            .finish()
    }
}

/// What a pass (or a run of passes) of the relay did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Relayed {
    /// Messages leased.
    pub leased: usize,
    /// Taken by the destination's sink: sent.
    pub sent: usize,
    /// Refused for now: due again after their backoff.
    pub retried: usize,
    /// Refused for good, or out of attempts: dead (`inbox outbox --dead`).
    pub dead: usize,
    /// Leased but not started (the deadline came, the destination was paused
    /// or its circuit opened): released at once, no attempt spent.
    pub released: usize,
    /// Destinations paused by an operator, as last seen.
    pub paused: usize,
    /// Destinations whose circuit is open, as last seen.
    pub open: usize,
    /// Messages waiting for a destination no relay has configured, as last
    /// counted: they wait, never dead (alarmed on).
    pub unrouted: i64,
    /// Each destination's share of the figures above, by name.
    pub destinations: std::collections::BTreeMap<String, DestinationRelayed>,
}

/// What a pass (or a run of passes) did for one destination.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DestinationRelayed {
    /// Taken by its sink.
    pub sent: usize,
    /// Refused for now.
    pub retried: usize,
    /// Dead.
    pub dead: usize,
    /// Paused by an operator, as last seen.
    pub paused: bool,
    /// Its circuit open, as last seen.
    pub open: bool,
}

impl DestinationRelayed {
    /// Counts add up; the state is `later`'s.
    fn add(&mut self, later: &DestinationRelayed) {
        self.sent += later.sent;
        self.retried += later.retried;
        self.dead += later.dead;
        self.paused = later.paused;
        self.open = later.open;
    }

    /// `relayed`, `relay_retried`, `relay_dead`, and the gauges
    /// `relay_destination_paused` and `relay_destination_open` (1 or 0),
    /// with the dimension `destination`.
    fn metrics(&self, name: &str) -> crate::runtime::metrics::Metrics {
        let mut m = crate::runtime::metrics::Metrics::new("relay").for_destination(name);
        m.count("relayed", self.sent as u64)
            .count("relay_retried", self.retried as u64)
            .count("relay_dead", self.dead as u64)
            .gauge("relay_destination_paused", f64::from(u8::from(self.paused)))
            .gauge("relay_destination_open", f64::from(u8::from(self.open)));
        m
    }
}

impl Reported for Relayed {
    /// The `relay` function's metrics: `relayed`, `relay_retried`,
    /// `relay_dead`, and the gauges `relay_paused`, `relay_open` and
    /// `relay_unrouted`; then a line per destination (the dimension
    /// `destination`) with its counts and its state.
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let mut m = crate::runtime::metrics::Metrics::new("relay");
        m.count("relayed", self.sent as u64)
            .count("relay_retried", self.retried as u64)
            .count("relay_dead", self.dead as u64)
            .gauge("relay_paused", self.paused as f64)
            .gauge("relay_open", self.open as f64)
            .gauge("relay_unrouted", self.unrouted as f64);
        std::iter::once(m).chain(self.destinations.iter().map(|(name, d)| d.metrics(name))).collect()
    }
}

impl Tally for Relayed {
    /// Counts add up; the gauges are the latest pass's.
    fn add(&mut self, r: &Relayed) {
        self.leased += r.leased;
        self.sent += r.sent;
        self.retried += r.retried;
        self.dead += r.dead;
        self.released += r.released;
        self.paused = r.paused;
        self.open = r.open;
        self.unrouted = r.unrouted;
        for (name, d) in &r.destinations {
            self.destinations.entry(name.clone()).or_default().add(d);
        }
    }

    fn is_empty(&self) -> bool {
        self.leased == 0
    }
}

impl Relayed {
    /// Another lane's pass, at the same time: every figure adds up.
    fn merge(&mut self, r: &Relayed) {
        self.leased += r.leased;
        self.sent += r.sent;
        self.retried += r.retried;
        self.dead += r.dead;
        self.released += r.released;
        self.paused += r.paused;
        self.open += r.open;
        self.unrouted += r.unrouted;
        for (name, d) in &r.destinations {
            self.destinations.entry(name.clone()).or_default().add(d);
        }
    }
}

/// The relay stage: outbox messages to their destinations, at least once,
/// each under its `message_key`, each destination in its own lane. Run it as
/// a [`Stage`] (`run`, `run_until`), or one pass with [`Relay::run_once`]; its
/// destinations come from
/// [`Destinations`](crate::config::Destinations) (the environment and
/// `RELAY_DESTINATIONS_FILE`), or from code.
pub struct Relay {
    pool: PgPool,
    lanes: Vec<lane::Lane>,
    configured: Vec<String>,
}

impl Relay {
    /// A relay on `pool` to `destinations`. Messages naming a destination not
    /// among them wait (counted as `unrouted`).
    pub fn new(pool: PgPool, destinations: Vec<Destination>, config: RelayConfig) -> Self {
        let configured = destinations.iter().map(|d| d.name.clone()).collect();
        let lanes = destinations.into_iter().map(|d| lane::Lane::new(pool.clone(), d, config.clone())).collect();
        Relay { pool, lanes, configured }
    }

    /// One pass of every destination's lane at once: each leases its due
    /// messages and keeps as many in flight as its `concurrency` allows (a
    /// message starts as soon as a slot is free), recording results in
    /// batches as they come, until its backlog is drained or `deadline`
    /// leaves no room for another delivery (what is leased but not started
    /// is released at once, untouched). A killed relay loses at most the
    /// results not recorded yet: those messages go out again when their lease
    /// ends, under the same key.
    pub async fn run_once(&self, deadline: Instant) -> Result<Relayed, sqlx::Error> {
        <Relay as Stage>::run_once(self, deadline).await.map(|pass| pass.tally)
    }

    /// Messages waiting for a destination this relay does not have.
    async fn unrouted(&self) -> Result<i64, sqlx::Error> {
        crate::db::destinations::unrouted(&self.pool, &self.configured).await
    }

    /// Its destinations' names.
    pub fn destinations(&self) -> &[String] {
        &self.configured
    }

    /// Each lane as a stage of its own (reporting its counts), and the
    /// relay's gauges apart (for `serve`, which runs each lane on its own
    /// loop: a lane waits for nothing but its own destination).
    pub fn into_lanes(self) -> (Vec<lane::Lane>, RelayGauges) {
        (self.lanes, RelayGauges { pool: self.pool, configured: self.configured })
    }
}

/// The relay's gauges (`relay_paused`, `relay_open`, `relay_unrouted`), read
/// from the database: `serve` reports them apart from its lanes' counts.
pub struct RelayGauges {
    pool: PgPool,
    configured: Vec<String>,
}

impl RelayGauges {
    /// `relay_paused`, `relay_open`, `relay_unrouted`; and for each
    /// destination (the label `destination`) `relay_destination_paused`,
    /// `relay_destination_open` (1 or 0) and `relay_destination_backlog`.
    pub async fn read(&self) -> Result<Vec<crate::runtime::metrics::Metrics>, sqlx::Error> {
        use crate::runtime::metrics::Metrics;
        let listed = crate::db::destinations::list(&self.pool).await?;
        let unrouted: i64 = listed.iter().filter(|d| !self.configured.contains(&d.name)).map(|d| d.backlog).sum();
        let flag = |on: bool| f64::from(u8::from(on));
        let mut all = Metrics::new("relay");
        all.gauge("relay_paused", listed.iter().filter(|d| d.state() == "paused").count() as f64)
            .gauge("relay_open", listed.iter().filter(|d| d.state() == "open").count() as f64)
            .gauge("relay_unrouted", unrouted as f64);
        let each = listed.iter().map(|d| {
            let mut m = Metrics::new("relay").for_destination(&d.name);
            m.gauge("relay_destination_paused", flag(d.state() == "paused"))
                .gauge("relay_destination_open", flag(d.state() == "open"))
                .gauge("relay_destination_backlog", d.backlog as f64);
            m
        });
        Ok(std::iter::once(all).chain(each).collect())
    }
}

impl Stage for Relay {
    type Tally = Relayed;
    const NAME: &'static str = "relay";

    /// Every lane drains its backlog, or stops at the deadline: a pass leaves
    /// nothing it could still do before it. A lane whose backlog is drained
    /// looks again every 250 ms while another is still busy, so that a
    /// slow destination holding the pass open (a Lambda invocation) holds up
    /// none of the others' new messages.
    async fn run_once(&self, deadline: Instant) -> Result<Pass<Relayed>, sqlx::Error> {
        let busy = AtomicUsize::new(self.lanes.len());
        let passes =
            futures_util::future::join_all(self.lanes.iter().map(|l| until_all_idle(l, deadline, &busy))).await;
        let mut relayed = Relayed { unrouted: self.unrouted().await?, ..Relayed::default() };
        for pass in passes {
            relayed.merge(&pass?);
        }
        Ok(Pass { tally: relayed, more: false })
    }
}

/// How often a lane with nothing to send looks again while another lane of the same pass is still busy.
const IDLE_POLL: Duration = Duration::from_millis(250);

/// One lane's passes until every lane of `busy` is idle at once, or the deadline.
async fn until_all_idle(lane: &lane::Lane, deadline: Instant, busy: &AtomicUsize) -> Result<Relayed, sqlx::Error> {
    let mut tally = Relayed::default();
    let mut idle = false;
    loop {
        let pass = lane.pass(deadline).await?;
        tally.add(&pass.tally);
        let worked = pass.tally.leased > 0;
        if worked == idle {
            // Busy again, or idle now.
            if worked {
                busy.fetch_add(1, Ordering::SeqCst);
            } else {
                busy.fetch_sub(1, Ordering::SeqCst);
            }
            idle = !worked;
        }
        if worked {
            continue;
        }
        if busy.load(Ordering::SeqCst) == 0 || Instant::now() + IDLE_POLL >= deadline {
            return Ok(tally);
        }
        tokio::time::sleep(IDLE_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::stage::Reported;

    /// The function's line keeps its totals; each destination has a line of
    /// its own, under the dimension `destination`, with its counts and state.
    #[test]
    fn each_destination_reports_its_counts_and_its_state_under_its_name() {
        let mut lanes = Relayed::default();
        let billing = Relayed {
            paused: 1,
            destinations: [("billing".into(), DestinationRelayed { paused: true, ..Default::default() })].into(),
            ..Relayed::default()
        };
        let email = Relayed {
            sent: 3,
            dead: 1,
            destinations: [("email".into(), DestinationRelayed { sent: 3, dead: 1, ..Default::default() })].into(),
            ..Relayed::default()
        };
        lanes.merge(&billing);
        lanes.merge(&email);
        let lines: Vec<serde_json::Value> = lanes.metrics().iter().map(|m| m.document(0)).collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!((lines[0]["relayed"].as_f64(), lines[0]["relay_paused"].as_f64()), (Some(3.0), Some(1.0)));
        assert!(lines[0].get("destination").is_none());
        let of = |name: &str| lines.iter().find(|l| l["destination"] == name).unwrap().clone();
        let (billing, email) = (of("billing"), of("email"));
        assert_eq!(
            billing["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["function", "destination"]])
        );
        assert_eq!((billing["relay_destination_paused"].as_f64(), billing["relayed"].as_f64()), (Some(1.0), Some(0.0)));
        let email_figures =
            (email["relayed"].as_f64(), email["relay_dead"].as_f64(), email["relay_destination_paused"].as_f64());
        assert_eq!(email_figures, (Some(3.0), Some(1.0), Some(0.0)));

        // Over passes the counts add up and the state is the latest.
        let mut run = lanes.clone();
        let resumed = Relayed {
            sent: 2,
            destinations: [("billing".into(), DestinationRelayed { sent: 2, ..Default::default() })].into(),
            ..Relayed::default()
        };
        run.add(&resumed);
        assert_eq!(run.destinations["billing"], DestinationRelayed { sent: 2, ..Default::default() });
        assert_eq!(run.destinations["email"].sent, 3);
    }
}
