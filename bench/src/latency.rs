//! Received → delivered: signed Stripe `payment_intent.succeeded` events at a
//! steady 100 a second, through `inbox serve` run as deployed (its own
//! process, every role but the console, configured by its environment only,
//! the stock handlers), then through the `receive`, `process` and `relay`
//! functions under the stand-in Runtime API. The payments handler writes an
//! outbox message for each event, and the relay sends it to a local HTTP
//! sink. Each event's latency runs from just before its delivery is sent to
//! its message reaching the sink; an event whose message never arrives fails
//! the run.

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::{process::Command, sync::Notify, task::JoinSet};
use webhook_inbox::config::DEV_STRIPE;

use super::{
    body,
    lambda::{self, drain, Instance},
    percentile, signature,
    stages::local_sink,
    Bench, Check, Figure, Report, Task,
};

/// Events a second, steady.
pub(super) const RATE: u64 = 100;

impl Bench {
    pub(super) async fn latency(&self, url: &str, report: &mut Report) -> Result<()> {
        let mut figures = Vec::new();
        for way in ["serve", "the functions"] {
            let name = |p: &str| format!("received → delivered {p}, {RATE} events/s through {way}");
            let (mut p50, mut p99) = (Figure::new(name("p50"), "ms"), Figure::new(name("p99"), "ms"));
            let mut p50_check = Check::at_most(format!("{} (ms)", name("p50")), 1000.0);
            let mut p99_check = Check::at_most(format!("{} (ms)", name("p99")), 3000.0);
            for round in 1..=self.rounds {
                let n = RATE * self.seconds;
                let took = if way == "serve" {
                    through_serve(url, n, round).await?
                } else {
                    through_lambda(url, n, round).await?
                };
                let (a, b) = (percentile(&took, 0.50), percentile(&took, 0.99));
                self.round(format_args!("latency through {way}, round {round}: {n} events received → delivered p50 {a:.0} ms, p99 {b:.0} ms"));
                p50.values.push(a);
                p99.values.push(b);
                p50_check.values.push(a);
                p99_check.values.push(b);
            }
            figures.extend([p50, p99]);
            report.checks.extend([p50_check, p99_check]);
        }
        report.sections.push(("Received → delivered".into(), figures));
        Ok(())
    }
}

/// Sends `n` events at [`RATE`] to a fresh `inbox serve` and answers each
/// one's time to its sink, sorted.
async fn through_serve(database_url: &str, n: u64, round: usize) -> Result<Vec<Duration>> {
    let sink = Arrivals::start().await?;
    let port = free_port()?;
    let admin_port = free_port()?;
    let mut serve = Command::new(super::beside("inbox")?)
        // The stock application: its payment handler writes the message the sink receives.
        .args(["serve", "--stock", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--admin-port", &admin_port.to_string()])
        .env("DATABASE_URL", database_url)
        .env("STRIPE_WEBHOOK_SECRET", DEV_STRIPE)
        .env("RELAY_HTTP_URL", sink.url())
        .env_remove("INBOX_ROLES")
        .env_remove("RELAY_DESTINATIONS_FILE")
        .env_remove("RELAY_DESTINATIONS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting inbox serve")?;
    // Drained all along: a full pipe would stall it.
    let stderr = serve.stderr.take().map(drain);
    let client = webhook_inbox::sinks::http_client(Duration::from_secs(10))?;
    let base = format!("http://127.0.0.1:{port}");
    let up = Instant::now();
    while !client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        if let Some(status) = serve.try_wait()? {
            let err = match stderr {
                Some(e) => String::from_utf8_lossy(&e.await?).into_owned(),
                None => String::new(),
            };
            bail!("inbox serve exited ({status}) before it was ready: {err}");
        }
        ensure!(up.elapsed() < Duration::from_secs(30), "inbox serve not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let mut deliveries = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE as u32);
    for i in 0..n {
        tick.tick().await;
        let id = format!("bench-e2e-{run}-{round}-{i}");
        let b = body(&id);
        let t = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let request = client
            .post(format!("{base}/webhooks/stripe"))
            .header("content-type", "application/json")
            .header("stripe-signature", signature(t, &b))
            .body(b);
        sent.insert(id, Instant::now());
        deliveries.spawn(async move {
            let response = request.send().await?;
            let status = response.status();
            let answer = response.text().await?;
            ensure!(status == 200 && answer.contains("accepted"), "unexpected answer {status}: {answer}");
            Ok(())
        });
    }
    while let Some(answered) = deliveries.join_next().await {
        answered??;
    }

    let took = arrived(&sink, &sent).await;
    let _ = serve.start_kill();
    let _ = serve.wait().await;
    took
}

/// Waits up to 30 s for every event's message and answers each one's time
/// from `sent` to its arrival, sorted.
async fn arrived(sink: &Arrivals, sent: &HashMap<String, Instant>) -> Result<Vec<Duration>> {
    let patience = Instant::now() + Duration::from_secs(30);
    while sink.count() < sent.len() {
        ensure!(
            Instant::now() < patience,
            "{} of {} events' messages reached the sink within 30 s of the last delivery",
            sink.count(),
            sent.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let arrivals = sink.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
    let mut took = Vec::with_capacity(sent.len());
    for (id, at) in sent {
        let arrived = arrivals.get(id).with_context(|| format!("no message for {id} reached the sink"))?;
        took.push(arrived.saturating_duration_since(*at));
    }
    took.sort_unstable();
    Ok(took)
}

/// The same through the functions, each under the stand-in Runtime API: the
/// bench hands `receive` each delivery as API Gateway would, and plays the two
/// queues' event sources: each event `receive` accepted becomes a record for
/// `process` (batches of up to 10, as the template's event source mapping
/// takes them, the next one as soon as `process` answered the last), and each
/// `process` invocation nudges `relay`. One instance of each function (the
/// template allows two of `process` and `relay`); the time a real queue and
/// its poller add between two functions is not in these figures.
async fn through_lambda(database_url: &str, n: u64, round: usize) -> Result<Vec<Duration>> {
    let sink = Arrivals::start().await?;
    let sink_url = sink.url();
    let mut receive = Instance::start_with(&lambda::binary("receive")?, database_url, &[]).await?;
    let mut process = Instance::start_with(&lambda::binary("process")?, database_url, &[]).await?;
    let relay_env = [("RELAY_HTTP_URL", sink_url.as_str())];
    let mut relay = Instance::start_with(&lambda::binary("relay")?, database_url, &relay_env).await?;
    let fixture: Value = serde_json::from_str(include_str!("../../tests/data/apigw-http-v2.json"))?;
    let record: Value = serde_json::from_str(include_str!("../../tests/data/sqs-record.json"))?;
    let sqs = move |bodies: &[String]| -> Result<Bytes> {
        let records: Vec<Value> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                let mut r = record.clone();
                r["messageId"] = json!(format!("bench-{i}"));
                r["body"] = json!(body);
                r
            })
            .collect();
        Ok(serde_json::to_vec(&json!({ "Records": records }))?.into())
    };

    let queued = Arc::new(Mutex::new(Vec::<String>::new()));
    let (to_process, to_relay) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let mut functions: JoinSet<Result<()>> = JoinSet::new();
    {
        let (queued, to_process, to_relay, sqs) = (queued.clone(), to_process.clone(), to_relay.clone(), sqs.clone());
        functions.spawn(async move {
            loop {
                let batch: Vec<String> = {
                    let mut q = queued.lock().unwrap_or_else(PoisonError::into_inner);
                    let k = q.len().min(10);
                    q.drain(..k).collect()
                };
                if batch.is_empty() {
                    to_process.notified().await;
                    continue;
                }
                let (_, answer) = process.invoke(&sqs(&batch)?).await?;
                let answer: Value = serde_json::from_slice(&answer).unwrap_or_default();
                ensure!(
                    answer["batchItemFailures"].as_array().map_or(true, Vec::is_empty),
                    "process failed events: {answer}"
                );
                to_relay.notify_one();
            }
        });
    }
    functions.spawn(async move {
        let nudge = sqs(&["{}".to_string()])?;
        loop {
            to_relay.notified().await;
            relay.invoke(&nudge).await?;
        }
    });

    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE as u32);
    for i in 0..n {
        tick.tick().await;
        let id = format!("bench-e2e-{run}-{round}-{i}");
        let event = lambda::delivery(&fixture, &id)?;
        sent.insert(id.clone(), Instant::now());
        receive.deliver(&event, "accepted").await?;
        queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(json!({ "provider": "stripe", "event_id": id }).to_string());
        to_process.notify_one();
        if let Some(stopped) = functions.try_join_next() {
            stopped??;
        }
    }
    let took = tokio::select! {
        took = arrived(&sink, &sent) => took,
        Some(stopped) = functions.join_next() => Err(stopped?.err().unwrap_or_else(|| anyhow::anyhow!("a function stopped"))),
    };
    functions.shutdown().await;
    took
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A local HTTP sink noting when each event's message first arrived (by the
/// `stripe_event_id` the stock payments handler writes into it).
struct Arrivals {
    addr: SocketAddr,
    arrivals: Arc<Mutex<HashMap<String, Instant>>>,
    _task: Task,
}

impl Arrivals {
    async fn start() -> Result<Self> {
        let arrivals = Arc::new(Mutex::new(HashMap::new()));
        let noted = arrivals.clone();
        let (addr, task) = local_sink(move |req: hyper::Request<hyper::body::Incoming>| {
            let noted = noted.clone();
            async move {
                let at = Instant::now();
                let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let id = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v["stripe_event_id"].as_str().map(str::to_owned));
                if let Some(id) = id {
                    noted.lock().unwrap_or_else(PoisonError::into_inner).entry(id).or_insert(at);
                }
            }
        })
        .await?;
        Ok(Arrivals { addr, arrivals, _task: task })
    }

    fn url(&self) -> String {
        format!("http://{}/sink", self.addr)
    }

    fn count(&self) -> usize {
        self.arrivals.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
