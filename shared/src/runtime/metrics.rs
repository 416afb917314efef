//! Metrics as CloudWatch Embedded Metric Format: one JSON line on stdout per
//! invocation, which CloudWatch Logs turns into metrics. No SDK call, nothing
//! in the hot path but a counter; the line is written after the answer.
//!
//! The namespace is `WebhookInbox`; every line has the dimension `function`,
//! `provider` where the counts are one provider's (receive, reconcile), and
//! `destination` where they are one relay destination's.
//! Counts are `Count`, ages `Milliseconds`.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Map, Value};

/// The CloudWatch namespace of every metric.
pub const NAMESPACE: &str = "WebhookInbox";

/// What a value counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Things.
    Count,
    /// An age or a duration.
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
        }
    }
}

/// One invocation's metrics, written as one EMF line.
#[derive(Debug, Clone)]
pub struct Metrics {
    function: &'static str,
    provider: Option<String>,
    destination: Option<String>,
    values: BTreeMap<&'static str, (f64, Unit, Kind)>,
}

/// A count of things that happened, or a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Things that happened, added up across reports.
    Count,
    /// A level now: each report replaces the last.
    Gauge,
}

impl Metrics {
    /// No values yet, of the stage `function` (`receive`, `process`, `relay`, ...).
    pub fn new(function: &'static str) -> Self {
        Metrics { function, provider: None, destination: None, values: BTreeMap::new() }
    }

    /// These counts are one provider's.
    pub fn for_provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// These values are one relay destination's.
    pub fn for_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Adds `n` to a count (a count of zero is still reported: an alarm on
    /// "no data" and one on zero are different alarms).
    pub fn count(&mut self, name: &'static str, n: u64) -> &mut Self {
        self.values.entry(name).or_insert((0.0, Unit::Count, Kind::Count)).0 += n as f64;
        self
    }

    /// A level (a count of things now, not of things that happened).
    pub fn gauge(&mut self, name: &'static str, value: f64) -> &mut Self {
        self.values.insert(name, (value, Unit::Count, Kind::Gauge));
        self
    }

    /// An age or a duration now, in milliseconds.
    pub fn gauge_ms(&mut self, name: &'static str, ms: f64) -> &mut Self {
        self.values.insert(name, (ms, Unit::Milliseconds, Kind::Gauge));
        self
    }

    /// The function (stage) the values are of.
    pub fn function(&self) -> &'static str {
        self.function
    }

    /// The provider the values are of, if they are one provider's.
    pub fn provider(&self) -> Option<&str> {
        self.provider.as_deref()
    }

    /// The relay destination the values are of, if they are one destination's.
    pub fn destination(&self) -> Option<&str> {
        self.destination.as_deref()
    }

    /// Each value: its name, the value, its unit and its kind.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, f64, Unit, Kind)> + '_ {
        self.values.iter().map(|(name, (value, unit, kind))| (*name, *value, *unit, *kind))
    }

    /// No value was set.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The EMF document, stamped `timestamp_ms`.
    pub fn document(&self, timestamp_ms: u64) -> Value {
        let mut dimensions = vec!["function"];
        let mut root = Map::new();
        root.insert("function".into(), json!(self.function));
        if let Some(provider) = &self.provider {
            dimensions.push("provider");
            root.insert("provider".into(), json!(provider));
        }
        if let Some(destination) = &self.destination {
            dimensions.push("destination");
            root.insert("destination".into(), json!(destination));
        }
        let definitions: Vec<Value> =
            self.values.iter().map(|(name, (_, unit, _))| json!({"Name": name, "Unit": unit.as_str()})).collect();
        for (name, (value, _, _)) in &self.values {
            root.insert((*name).into(), json!(value));
        }
        root.insert(
            "_aws".into(),
            json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{"Namespace": NAMESPACE, "Dimensions": [dimensions], "Metrics": definitions}],
            }),
        );
        Value::Object(root)
    }

    /// Writes the line to stdout, where the Lambda runtime sends it to CloudWatch Logs.
    pub fn emit(&self) {
        if self.is_empty() {
            return;
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        println!("{}", self.document(now));
    }
}
