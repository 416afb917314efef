//! The relay's settings and destinations: the `default` destination from the
//! `RELAY_*` variables, the others from `RELAY_DESTINATIONS_FILE`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde::Deserialize;

use super::{invalid, ConfigError, Env};
use crate::{
    relay::{aws, signing::Signer, sink::Fanout, Destination, DestinationLimits, HttpSink, RelayConfig, Sink},
    App, Message,
};

impl RelayConfig {
    /// `RELAY_BATCH_SIZE` (100), `RELAY_RETRY_BASE_MS` (1000), `RELAY_LEASE_MS` (300000).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let d = RelayConfig::default();
        Ok(RelayConfig {
            batch_size: env.positive("RELAY_BATCH_SIZE", d.batch_size)?,
            retry_base: env.millis("RELAY_RETRY_BASE_MS", d.retry_base.as_millis() as u64)?,
            lease: env.millis("RELAY_LEASE_MS", d.lease.as_millis() as u64)?,
        })
    }
}

impl DestinationLimits {
    /// Every destination's defaults: `RELAY_CONCURRENCY` (8),
    /// `RELAY_RATE_PER_SECOND` (none), `RELAY_HTTP_TIMEOUT_MS` (10000; any
    /// sink's, despite its name), `RELAY_MAX_ATTEMPTS` (10),
    /// `RELAY_CIRCUIT_FAILURES` (10), `RELAY_CIRCUIT_COOL_DOWN_MS` (30000).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let d = DestinationLimits::default();
        let rate = match env.var("RELAY_RATE_PER_SECOND") {
            Some(v) => Some(rate(&v).map_err(|reason| invalid("RELAY_RATE_PER_SECOND", reason))?),
            None => None,
        };
        let limits = DestinationLimits {
            concurrency: env.positive("RELAY_CONCURRENCY", d.concurrency)?,
            rate_per_second: rate,
            timeout: env.millis("RELAY_HTTP_TIMEOUT_MS", d.timeout.as_millis() as u64)?,
            max_attempts: env.positive("RELAY_MAX_ATTEMPTS", d.max_attempts)?,
            circuit_failures: env.positive("RELAY_CIRCUIT_FAILURES", d.circuit_failures)?,
            circuit_cool_down: env.millis("RELAY_CIRCUIT_COOL_DOWN_MS", d.circuit_cool_down.as_millis() as u64)?,
        };
        if limits.timeout.is_zero() {
            return Err(invalid("RELAY_HTTP_TIMEOUT_MS", "must be at least 1"));
        }
        Ok(limits)
    }
}

fn rate(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{v:?} is not a number of messages a second above 0")),
    }
}

/// Where a destination's messages go, as configured.
#[derive(Clone, Debug)]
pub enum Target {
    /// `url`: POSTed, signed when the destination has a signing secret.
    Http {
        /// The URL.
        url: String,
        /// The secrets `signing_secret_env` named.
        signer: Option<Signer>,
    },
    /// `sqs_queue_url`.
    Sqs(String),
    /// `event_bus`.
    EventBus(String),
    /// `sns_topic_arn`.
    Sns(String),
    /// `nats_subject`, on the server `nats_url_env` names (`RELAY_NATS_URL` by default).
    Nats {
        /// The server's URL (it may hold credentials: never shown).
        url: String,
        /// The subject.
        subject: String,
    },
    /// `amqp_exchange`, on the broker `amqp_url_env` names (`RELAY_AMQP_URL` by default).
    Amqp {
        /// The broker's URL (it may hold credentials: never shown).
        url: String,
        /// The exchange.
        exchange: String,
    },
    /// `sink`: a team's own, by the name it was registered under ([`App::with_sink`]).
    Registered(String),
    /// The `default` destination with more than one of the `RELAY_*` sinks:
    /// each message to each of them.
    Each(Vec<Target>),
}

/// One destination as configured.
#[derive(Clone, Debug)]
pub struct DestinationConfig {
    /// Its name.
    pub name: String,
    /// Where its messages go.
    pub target: Target,
    /// Its limits.
    pub limits: DestinationLimits,
}

/// The relay's destinations: `default` from `RELAY_HTTP_URL`,
/// `RELAY_SQS_QUEUE_URL` and `RELAY_EVENT_BUS` (each message to each of them,
/// as before destinations), and one per `[destination.NAME]` table of the TOML
/// file `RELAY_DESTINATIONS_FILE` names (or of `RELAY_DESTINATIONS`, the text
/// itself, for a Lambda stack). See the repository's `docs/destinations.md`.
#[derive(Clone, Debug, Default)]
pub struct Destinations(pub Vec<DestinationConfig>);

/// One `[destination.NAME]` table, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    url: Option<String>,
    sqs_queue_url: Option<String>,
    event_bus: Option<String>,
    sns_topic_arn: Option<String>,
    nats_subject: Option<String>,
    nats_url_env: Option<String>,
    amqp_exchange: Option<String>,
    amqp_url_env: Option<String>,
    sink: Option<String>,
    concurrency: Option<usize>,
    rate_per_second: Option<f64>,
    timeout_ms: Option<u64>,
    max_attempts: Option<i32>,
    circuit_failures: Option<u32>,
    circuit_cool_down_ms: Option<u64>,
    signing_secret_env: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    destination: BTreeMap<String, Entry>,
}

fn http_url(url: &str) -> Result<(), String> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        Ok(_) => Err("is not an http:// or https:// URL with a host".into()),
        Err(e) => Err(format!("is not a URL ({e})")),
    }
}

impl Destinations {
    /// Reads the destinations, refusing at once (naming the variable, the
    /// table and the key) a file that is not TOML, an unknown key, a bad
    /// value, a destination with no sink or with two, an unset signing secret.
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let defaults = DestinationLimits::read(env)?;
        let mut out = Vec::new();
        let mut each = Vec::new();
        // The `default` destination's deliveries signed as Standard Webhooks,
        // as a file's `signing_secret_env` signs a destination's.
        let signer = match env.var("RELAY_SIGNING_SECRET") {
            Some(secrets) => Some(Signer::new(&secrets).map_err(|reason| invalid("RELAY_SIGNING_SECRET", reason))?),
            None => None,
        };
        if let Some(url) = env.var("RELAY_HTTP_URL") {
            http_url(&url).map_err(|reason| invalid("RELAY_HTTP_URL", reason))?;
            each.push(Target::Http { url, signer: signer.clone() });
        } else if signer.is_some() {
            return Err(invalid("RELAY_SIGNING_SECRET", "signs RELAY_HTTP_URL's deliveries, which is not set"));
        }
        if let Some(queue) = env.var("RELAY_SQS_QUEUE_URL") {
            each.push(Target::Sqs(queue));
        }
        if let Some(bus) = env.var("RELAY_EVENT_BUS") {
            each.push(Target::EventBus(bus));
        }
        if !each.is_empty() {
            let target = if each.len() == 1 { each.remove(0) } else { Target::Each(each) };
            out.push(DestinationConfig { name: Message::DEFAULT_DESTINATION.into(), target, limits: defaults.clone() });
        }
        let (var, text) = match (env.var("RELAY_DESTINATIONS_FILE"), env.var("RELAY_DESTINATIONS")) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "RELAY_DESTINATIONS",
                    "set together with RELAY_DESTINATIONS_FILE: use one or the other",
                ))
            }
            (Some(path), None) => (
                "RELAY_DESTINATIONS_FILE",
                std::fs::read_to_string(&path)
                    .map_err(|e| invalid("RELAY_DESTINATIONS_FILE", format!("cannot read {path}: {e}")))?,
            ),
            (None, Some(text)) => ("RELAY_DESTINATIONS", text),
            (None, None) => return Ok(Destinations(out)),
        };
        let file: File =
            toml::from_str(&text).map_err(|e| invalid(var, webhook_inbox_schemes::text::toml_error(&text, &e)))?;
        for (name, entry) in file.destination {
            let at = |key: &str, reason: String| {
                invalid(var, format!("[destination.{}] {key}: {reason}", webhook_inbox_schemes::text::escape(&name)))
            };
            if !crate::db::destinations::is_destination_name(&name) {
                return Err(at("name", "a destination's name is 1 to 64 of a-z, 0-9, _ and -".into()));
            }
            if out.iter().any(|d| d.name == name) {
                return Err(at(
                    "name",
                    "is configured by RELAY_HTTP_URL, RELAY_SQS_QUEUE_URL or RELAY_EVENT_BUS too: use one or the other"
                        .into(),
                ));
            }
            let signer = match &entry.signing_secret_env {
                Some(secret_var) => {
                    let secrets = env.var(secret_var).ok_or_else(|| {
                        at(
                            "signing_secret_env",
                            format!("{} is not set", webhook_inbox_schemes::text::escape(secret_var)),
                        )
                    })?;
                    Some(Signer::new(&secrets).map_err(|reason| {
                        at(
                            "signing_secret_env",
                            format!("{}: {reason}", webhook_inbox_schemes::text::escape(secret_var)),
                        )
                    })?)
                }
                None => None,
            };
            let mut targets = Vec::new();
            if let Some(url) = entry.url {
                http_url(&url).map_err(|reason| at("url", reason))?;
                targets.push(("url", Target::Http { url, signer: signer.clone() }));
            }
            if let Some(queue) = entry.sqs_queue_url {
                targets.push(("sqs_queue_url", Target::Sqs(queue)));
            }
            if let Some(bus) = entry.event_bus {
                targets.push(("event_bus", Target::EventBus(bus)));
            }
            if let Some(topic) = entry.sns_topic_arn {
                if !topic.starts_with("arn:") || topic.split(':').count() != 6 {
                    return Err(at("sns_topic_arn", "not a topic's ARN (arn:aws:sns:REGION:ACCOUNT:NAME)".into()));
                }
                targets.push(("sns_topic_arn", Target::Sns(topic)));
            }
            // A broker's URL comes from a variable: it may hold credentials.
            let server = |key: &str, named: &Option<String>, default: &str| {
                let var = named.as_deref().unwrap_or(default);
                env.var(var).ok_or_else(|| at(key, format!("{} is not set", webhook_inbox_schemes::text::escape(var))))
            };
            if let Some(subject) = entry.nats_subject {
                targets.push((
                    "nats_subject",
                    Target::Nats { url: server("nats_url_env", &entry.nats_url_env, "RELAY_NATS_URL")?, subject },
                ));
            } else if entry.nats_url_env.is_some() {
                return Err(at("nats_url_env", "without nats_subject".into()));
            }
            if let Some(exchange) = entry.amqp_exchange {
                targets.push((
                    "amqp_exchange",
                    Target::Amqp { url: server("amqp_url_env", &entry.amqp_url_env, "RELAY_AMQP_URL")?, exchange },
                ));
            } else if entry.amqp_url_env.is_some() {
                return Err(at("amqp_url_env", "without amqp_exchange".into()));
            }
            if let Some(sink) = entry.sink {
                targets.push(("sink", Target::Registered(sink)));
            }
            let target = match targets.len() {
                1 => targets.remove(0),
                0 => {
                    return Err(at(
                        "url",
                        "no sink: give one of url, sqs_queue_url, event_bus, sns_topic_arn, nats_subject, amqp_exchange or sink"
                            .into(),
                    ))
                }
                _ => {
                    let keys: Vec<&str> = targets.iter().map(|(k, _)| *k).collect();
                    return Err(at(keys[1], format!("a destination has one sink; this one names {}", keys.join(", "))));
                }
            };
            if signer.is_some() && target.0 != "url" {
                return Err(at("signing_secret_env", "only an HTTP destination (url) is signed".into()));
            }
            let limits = DestinationLimits {
                concurrency: positive(entry.concurrency, defaults.concurrency).map_err(|r| at("concurrency", r))?,
                rate_per_second: match entry.rate_per_second {
                    Some(r) => Some(rate(&r.to_string()).map_err(|reason| at("rate_per_second", reason))?),
                    None => defaults.rate_per_second,
                },
                timeout: Duration::from_millis(
                    positive(entry.timeout_ms, defaults.timeout.as_millis() as u64).map_err(|r| at("timeout_ms", r))?,
                ),
                max_attempts: positive(entry.max_attempts, defaults.max_attempts).map_err(|r| at("max_attempts", r))?,
                circuit_failures: positive(entry.circuit_failures, defaults.circuit_failures)
                    .map_err(|r| at("circuit_failures", r))?,
                circuit_cool_down: Duration::from_millis(
                    positive(entry.circuit_cool_down_ms, defaults.circuit_cool_down.as_millis() as u64)
                        .map_err(|r| at("circuit_cool_down_ms", r))?,
                ),
            };
            out.push(DestinationConfig { name, target: target.1, limits });
        }
        Ok(Destinations(out))
    }

    /// No destination is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The destinations themselves, with `app`'s registered sinks
    /// ([`App::with_sink`]); AWS credentials and region come from the usual
    /// AWS environment. A `sink` no one registered is refused here, at start-up.
    pub async fn build(&self, app: &App) -> Result<Vec<Destination>, ConfigError> {
        let mut sdk = None;
        let mut out = Vec::new();
        for d in &self.0 {
            let sink = build(&d.target, &d.name, d.limits.timeout, app, &mut sdk).await?;
            out.push(Destination::shared(d.name.clone(), sink).with_limits(d.limits.clone()));
        }
        Ok(out)
    }
}

fn positive<T: PartialOrd + From<u8>>(value: Option<T>, default: T) -> Result<T, String> {
    match value {
        Some(v) if v < T::from(1) => Err("must be at least 1".into()),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

async fn build(
    target: &Target,
    name: &str,
    timeout: Duration,
    app: &App,
    sdk: &mut Option<aws_config::SdkConfig>,
) -> Result<Arc<dyn Sink>, ConfigError> {
    async fn aws(sdk: &mut Option<aws_config::SdkConfig>) -> &aws_config::SdkConfig {
        if sdk.is_none() {
            *sdk = Some(crate::core::aws::from_env().await);
        }
        sdk.as_ref().expect("just set")
    }
    Ok(match target {
        Target::Http { url, signer } => {
            let sink = HttpSink::new(url.clone(), timeout)?;
            Arc::new(match signer {
                Some(signer) => sink.signed(signer.clone()),
                None => sink,
            })
        }
        Target::Sqs(queue) => Arc::new(aws::SqsSink::new(aws_sdk_sqs::Client::new(aws(sdk).await), queue.clone())),
        Target::EventBus(bus) => {
            Arc::new(aws::EventBridgeSink::new(aws_sdk_eventbridge::Client::new(aws(sdk).await), bus.clone()))
        }
        Target::Sns(topic) => Arc::new(aws::SnsSink::new(aws_sdk_sns::Client::new(aws(sdk).await), topic.clone())),
        #[cfg(feature = "nats")]
        Target::Nats { url, subject } => {
            Arc::new(crate::relay::nats::NatsSink::connect(url, subject.clone()).await.map_err(|reason| {
                invalid("RELAY_DESTINATIONS_FILE", format!("[destination.{name}] nats_subject: {reason}"))
            })?)
        }
        #[cfg(feature = "amqp")]
        Target::Amqp { url, exchange } => Arc::new(crate::relay::amqp::AmqpSink::new(url.clone(), exchange.clone())),
        #[cfg(not(feature = "nats"))]
        Target::Nats { .. } => {
            return Err(invalid(
                "RELAY_DESTINATIONS_FILE",
                format!("[destination.{name}] nats_subject: this build has no NATS sink (the `nats` feature)"),
            ))
        }
        #[cfg(not(feature = "amqp"))]
        Target::Amqp { .. } => {
            return Err(invalid(
                "RELAY_DESTINATIONS_FILE",
                format!("[destination.{name}] amqp_exchange: this build has no AMQP sink (the `amqp` feature)"),
            ))
        }
        Target::Registered(sink) => app.sink(sink).ok_or_else(|| {
            let known = app.sink_names();
            invalid(
                "RELAY_DESTINATIONS_FILE",
                format!(
                    "[destination.{name}] sink: no sink is registered as {:?} (App::with_sink); registered: {}",
                    webhook_inbox_schemes::text::escape(sink),
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                ),
            )
        })?,
        Target::Each(targets) => {
            let mut sinks = Vec::new();
            for t in targets {
                sinks.push(Box::pin(build(t, name, timeout, app, sdk)).await?);
            }
            Arc::new(Fanout(sinks))
        }
    })
}
