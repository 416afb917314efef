//! Each function binary run as Lambda runs it: exec'd with a Lambda
//! environment against a stand-in Runtime API (a small HTTP/1 server on
//! loopback, written here so that nothing but the binary is measured).
//!
//! - Exec to first poll: from just before the spawn to the first
//!   `GET /2018-06-01/runtime/invocation/next` reaching the stand-in, once per
//!   binary and round: the part of a cold start the code decides (the binary
//!   is already in the page cache; Lambda's own init is not included).
//! - Binary size: the native binary beside this `inbox` and, when
//!   `scripts/build-lambdas` has built it, the arm64 `target/lambda/<name>/bootstrap`
//!   that is deployed; the 10 MB target (10^6 bytes) is checked on the
//!   bootstrap when there is one.
//! - Warm invocations of `receive`: signed Stripe deliveries as API Gateway
//!   HTTP API events, one at a time after a first (cold) one; each from the
//!   stand-in sending the event to its `POST .../response` arriving, which must
//!   say 200 `accepted`. Peak RSS is the process's `VmHWM` after them.
//! - Database round trips per delivery: a second `receive` talks to PostgreSQL
//!   through a counting TCP proxy, so that the latencies above carry no extra
//!   hop, for new events and then the same events again (duplicates). A round
//!   trip is the client speaking again after the server spoke; the
//!   connection's setup (in the first invocation) is left out. The physical
//!   minimum is one.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    str::FromStr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    sync::mpsc,
    task::{JoinHandle, JoinSet},
};
use webhook_inbox::config::DEV_STRIPE;

use super::{body, signature, Bench, Check, Figure, Report, Task};

/// Every function binary, with the variables it needs beyond the Lambda
/// environment and `DATABASE_URL` to reach its first poll: relay stops without
/// a sink, reconcile with nothing to reconcile. Nothing is sent to port 9.
const FUNCTIONS: [(&str, &[(&str, &str)]); 6] = [
    ("receive", &[("STRIPE_WEBHOOK_SECRET", DEV_STRIPE)]),
    ("process", &[]),
    ("relay", &[("RELAY_HTTP_URL", "http://127.0.0.1:9/")]),
    ("prune", &[]),
    ("reconcile", &[("STRIPE_API_KEY", "sk_test_bench"), ("STRIPE_API_BASE", "http://127.0.0.1:9")]),
    ("migrate", &[]),
];

/// How long a function may stay silent (not start, not answer) before the bench gives up.
const SILENCE: Duration = Duration::from_secs(30);

pub(super) async fn lambda(bench: &Bench, url: &str, report: &mut Report) -> Result<()> {
    let binaries = binaries()?;
    let receive = &binaries[0]; // FUNCTIONS starts with it
    let n = if bench.seconds <= 1 { 50 } else { 1000 };
    let fixture: Value = serde_json::from_str(include_str!("../../tests/data/apigw-http-v2.json"))
        .context("reading the API Gateway HTTP API fixture")?;
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();

    for b in &binaries {
        let deployed = match b.bootstrap_mb {
            Some(mb) => format!("arm64 bootstrap {mb:.2} MB"),
            None => "no arm64 bootstrap (scripts/build-lambdas builds it)".into(),
        };
        bench.round(format_args!("lambda {}: native {:.2} MB, {deployed}", b.name, b.native_mb));
    }
    let mut starts: Vec<Figure> =
        binaries.iter().map(|b| Figure::new(format!("{}: exec to first poll", b.name), "ms")).collect();
    let mut p50 = Figure::new("receive: warm invocation p50, all new", "ms");
    let mut p99 = Figure::new("receive: warm invocation p99, all new", "ms");
    let mut rss = Figure::new(format!("receive: peak RSS after {n} warm invocations"), "MB");
    let mut trips_new = Figure::new("receive: database round trips per delivery, all new", "round trips");
    let mut trips_dup = Figure::new("receive: database round trips per delivery, duplicate", "round trips");

    for round in 1..=bench.rounds {
        let events = |phase: &str| -> Result<Vec<Bytes>> {
            (0..=n).map(|i| delivery(&fixture, &format!("bench-lambda-{run}-{round}-{phase}-{i}"))).collect()
        };
        for (b, start) in binaries.iter().zip(&mut starts) {
            let mut instance = Instance::start(b, url).await?;
            bench.round(format_args!(
                "lambda {}, round {round}: exec to first poll {:.2} ms",
                b.name,
                ms(instance.first_poll)
            ));
            start.values.push(ms(instance.first_poll));
            if b.name != "receive" {
                continue;
            }
            let took = instance.warm(&events("latency")?).await?;
            let pct = |p: f64| super::percentile(&took, p);
            let peak = instance.peak_rss()?;
            bench.round(format_args!(
                "lambda receive, round {round}: {n} warm invocations p50 {:.2} ms, p99 {:.2} ms, peak RSS {peak:.1} MB",
                pct(0.50),
                pct(0.99)
            ));
            p50.values.push(pct(0.50));
            p99.values.push(pct(0.99));
            rss.values.push(peak);
        }

        let (new, dup) = round_trips(receive, url, &events("trips")?).await?;
        bench.round(format_args!(
            "lambda receive, round {round}: database round trips per delivery {new:.2} all new, {dup:.2} duplicate"
        ));
        trips_new.values.push(new);
        trips_dup.values.push(dup);
    }

    let mut figures = Vec::new();
    for (b, start) in binaries.iter().zip(starts) {
        let (size, which) = b.bootstrap_mb.map_or((b.native_mb, "native"), |mb| (mb, "arm64 bootstrap"));
        report
            .checks
            .push(Check { values: start.values.clone(), ..Check::at_most(format!("{} (ms)", start.name), 20.0) });
        report.checks.push(Check {
            values: vec![size],
            ..Check::at_most(format!("{}: binary size (MB, {which})", b.name), 10.0)
        });
        figures.push(start);
        figures.push(Figure { values: vec![size], ..Figure::new(format!("{}: binary size, {which}", b.name), "MB") });
    }
    report.sections.push(("Lambda, each function binary".into(), figures));
    report
        .sections
        .push((format!("Lambda, receive, {n} warm invocations per round"), vec![p50, p99, rss, trips_new, trips_dup]));
    Ok(())
}

/// Round trips per delivery of a fresh `receive` talking to PostgreSQL through
/// the counting proxy: `events[1..]` after `events[0]` (which connects), all
/// new, then each again as a duplicate.
async fn round_trips(receive: &Binary, url: &str, events: &[Bytes]) -> Result<(f64, f64)> {
    let proxy = Proxy::start(url).await?;
    let mut instance = Instance::start(receive, &proxy.url).await?;
    instance.deliver(&events[0], "accepted").await?;
    proxy.take();
    let mut per_delivery = Vec::new();
    for want in ["accepted", "duplicate"] {
        for event in &events[1..] {
            instance.deliver(event, want).await?;
        }
        per_delivery.push(proxy.take() as f64 / (events.len() - 1) as f64);
    }
    Ok((per_delivery[0], per_delivery[1]))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) struct Binary {
    name: &'static str,
    path: PathBuf,
    env: &'static [(&'static str, &'static str)],
    native_mb: f64,
    bootstrap_mb: Option<f64>,
}

/// The function binaries beside this `inbox` (same target directory and profile).
pub(super) fn binaries() -> Result<Vec<Binary>> {
    FUNCTIONS.iter().map(|&(name, _)| binary(name)).collect()
}

/// The function binary `name` (of [`FUNCTIONS`]) beside the bench's.
pub(super) fn binary(name: &str) -> Result<Binary> {
    let (name, env) = *FUNCTIONS.iter().find(|(n, _)| *n == name).with_context(|| format!("no function {name}"))?;
    let path = super::beside(name)?;
    let target = path.parent().and_then(Path::parent).context("the bench's binary is not in a target directory")?;
    let mb = |path: &Path| std::fs::metadata(path).map(|m| m.len() as f64 / 1e6);
    let native_mb = mb(&path).with_context(|| format!("reading {}", path.display()))?;
    let bootstrap_mb = mb(&target.join("lambda").join(name).join("bootstrap")).ok();
    Ok(Binary { name, path, env, native_mb, bootstrap_mb })
}

/// A signed Stripe delivery of event `id`, as API Gateway's HTTP API hands it to the function.
pub(super) fn delivery(fixture: &Value, id: &str) -> Result<Bytes> {
    let body = body(id);
    let t = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let mut event = fixture.clone();
    let fields = event.as_object_mut().context("the API Gateway fixture is not a JSON object")?;
    fields
        .insert("headers".into(), json!({"content-type": "application/json", "stripe-signature": signature(t, &body)}));
    fields.insert("body".into(), json!(body));
    fields.insert("isBase64Encoded".into(), json!(false));
    Ok(serde_json::to_vec(&event)?.into())
}

/// What the stand-in Runtime API saw.
enum Call {
    /// `GET .../invocation/next`, when it arrived.
    Poll(Instant),
    /// `POST .../invocation/<id>/response`, and how long after its event was sent.
    Answer { request: String, took: Duration, body: Bytes },
    /// Anything else: an init or invocation error.
    Other(String),
}

struct StandIn {
    calls: mpsc::UnboundedSender<Call>,
    /// Events to hand out, with their request ids; a poll waits for one.
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<(String, Bytes)>>,
    /// When the last event went out.
    sent: Mutex<Option<Instant>>,
}

impl StandIn {
    async fn answer(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, http::Error> {
        let arrived = Instant::now();
        let path = req.uri().path().to_string();
        let route = path.strip_prefix("/2018-06-01/runtime/invocation/");
        if route == Some("next") {
            let _ = self.calls.send(Call::Poll(arrived));
            let Some((request, event)) = self.events.lock().await.recv().await else {
                return std::future::pending().await;
            };
            let deadline = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + Duration::from_secs(60);
            *self.sent.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            return Response::builder()
                .header("content-type", "application/json")
                .header("lambda-runtime-aws-request-id", request)
                .header("lambda-runtime-deadline-ms", deadline.as_millis().to_string())
                .header("lambda-runtime-invoked-function-arn", "arn:aws:lambda:us-east-1:123456789012:function:bench")
                .header("lambda-runtime-trace-id", "Root=1-00000000-000000000000000000000000;Sampled=0")
                .body(Full::new(event));
        }
        let method = req.method().clone();
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let call = match route.and_then(|r| r.strip_suffix("/response")) {
            Some(request) => {
                let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner).take();
                let took = sent.map_or(Duration::ZERO, |s| arrived.saturating_duration_since(s));
                Call::Answer { request: request.to_string(), took, body }
            }
            None => Call::Other(format!("{method} {path}: {}", String::from_utf8_lossy(&body))),
        };
        let _ = self.calls.send(call);
        Response::builder().status(202).body(Full::new(Bytes::new()))
    }
}

async fn serve(listener: TcpListener, api: Arc<StandIn>) {
    let mut connections = JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        let api = api.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let api = api.clone();
                async move { api.answer(req).await }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// One function process and its stand-in Runtime API.
pub(super) struct Instance {
    name: &'static str,
    child: Child,
    calls: mpsc::UnboundedReceiver<Call>,
    events: mpsc::UnboundedSender<(String, Bytes)>,
    invocations: u64,
    output: Vec<JoinHandle<Vec<u8>>>,
    first_poll: Duration,
    _api: Task,
}

impl Instance {
    /// Execs the binary and waits for its first poll.
    async fn start(binary: &Binary, database_url: &str) -> Result<Instance> {
        Instance::start_with(binary, database_url, &[]).await
    }

    /// [`Instance::start`], with `env` set beyond the binary's own.
    pub(super) async fn start_with(binary: &Binary, database_url: &str, env: &[(&str, &str)]) -> Result<Instance> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let api_addr = listener.local_addr()?;
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let api = StandIn { calls: calls_tx, events: tokio::sync::Mutex::new(events_rx), sent: Mutex::new(None) };
        let api = Task(tokio::spawn(serve(listener, Arc::new(api))));
        let name = binary.name;
        let mut command = Command::new(&binary.path);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", api_addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "2026/11/30/[$LATEST]bench")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("DATABASE_URL", database_url)
            .envs(binary.env.iter().copied())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawned = Instant::now();
        let mut child = command.spawn().with_context(|| format!("starting {}", binary.path.display()))?;
        // Drained all along: a full pipe would stall the function.
        let output = [child.stdout.take().map(drain), child.stderr.take().map(drain)].into_iter().flatten().collect();
        let mut instance =
            Instance { name, child, calls, events, invocations: 0, output, first_poll: Duration::ZERO, _api: api };
        match instance.call().await? {
            Call::Poll(at) => instance.first_poll = at.saturating_duration_since(spawned),
            Call::Other(call) => bail!("{name} reported {call} before polling for an event"),
            Call::Answer { .. } => bail!("{name} answered before it was given an event"),
        }
        Ok(instance)
    }

    /// The stand-in's next call; an error if the function exits or stays silent.
    async fn call(&mut self) -> Result<Call> {
        tokio::select! {
            call = self.calls.recv() => call.context("the stand-in Runtime API stopped"),
            status = self.child.wait() => {
                let output = self.output().await;
                bail!("{} exited ({}); its last output:\n{output}", self.name, status?)
            }
            () = tokio::time::sleep(SILENCE) => bail!("{} was silent for {} s", self.name, SILENCE.as_secs()),
        }
    }

    /// Hands `event` to the function; how long it took to answer, which must be 200 with `want`.
    pub(super) async fn deliver(&mut self, event: &Bytes, want: &str) -> Result<Duration> {
        let (took, body) = self.invoke(event).await?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
        let inner: Value = answer["body"].as_str().and_then(|b| serde_json::from_str(b).ok()).unwrap_or_default();
        ensure!(
            answer["statusCode"] == 200 && inner["status"] == want,
            "{} answered {} where 200 {want} was expected",
            self.name,
            String::from_utf8_lossy(&body)
        );
        Ok(took)
    }

    /// Hands `event` to the function: how long it took to answer, and the
    /// answer; an invocation error fails.
    pub(super) async fn invoke(&mut self, event: &Bytes) -> Result<(Duration, Bytes)> {
        self.invocations += 1;
        let expected = format!("bench-{}", self.invocations);
        self.events.send((expected.clone(), event.clone())).map_err(|_| anyhow!("the stand-in Runtime API stopped"))?;
        loop {
            match self.call().await? {
                Call::Poll(_) => continue,
                Call::Answer { request, took, body } => {
                    ensure!(request == expected, "{} answered request {request}, not {expected}", self.name);
                    return Ok((took, body));
                }
                Call::Other(call) => bail!("{} reported {call}", self.name),
            }
        }
    }

    /// How long each of `events[1..]` took to answer, sorted, after `events[0]` (the cold invocation).
    async fn warm(&mut self, events: &[Bytes]) -> Result<Vec<Duration>> {
        self.deliver(&events[0], "accepted").await?;
        let mut took = Vec::with_capacity(events.len());
        for event in &events[1..] {
            took.push(self.deliver(event, "accepted").await?);
        }
        took.sort_unstable();
        Ok(took)
    }

    /// The process's peak resident memory so far (`VmHWM`), in MB.
    fn peak_rss(&self) -> Result<f64> {
        let pid = self.child.id().context("the function has exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading the function's status")?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse().ok())
            .context("no VmHWM in the function's /proc status")?;
        Ok(kb * 1024.0 / 1e6)
    }

    /// The last lines the exited function wrote.
    async fn output(&mut self) -> String {
        let mut text = String::new();
        for task in std::mem::take(&mut self.output) {
            text.push_str(&String::from_utf8_lossy(&task.await.unwrap_or_default()));
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

pub(super) fn drain(mut stream: impl AsyncRead + Unpin + Send + 'static) -> JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        out
    })
}

/// A TCP proxy to PostgreSQL that counts round trips: the client speaking
/// again after the server spoke, over all its connections.
struct Proxy {
    /// The database URL with the proxy in place of PostgreSQL's address.
    url: String,
    trips: Arc<AtomicU64>,
    _task: Task,
}

const TCP_URL: &str = "use a URL like postgres://user@host:port/db";

impl Proxy {
    async fn start(url: &str) -> Result<Proxy> {
        let options = PgConnectOptions::from_str(url).context("parsing the database URL")?;
        ensure!(
            options.get_socket().is_none() && !options.get_host().starts_with('/'),
            "counting round trips needs PostgreSQL over TCP, not a Unix socket: {TCP_URL}"
        );
        let upstream = (options.get_host().to_string(), options.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let at_proxy = |u: &String| {
            PgConnectOptions::from_str(u).is_ok_and(|o| o.get_host() == "127.0.0.1" && o.get_port() == addr.port())
        };
        let proxied = with_address(url, addr)
            .filter(at_proxy)
            .with_context(|| format!("cannot put the round-trip counter in front of this database URL: {TCP_URL}"))?;
        let trips = Arc::new(AtomicU64::new(0));
        let task = Task(tokio::spawn(forward(listener, upstream, trips.clone())));
        Ok(Proxy { url: proxied, trips, _task: task })
    }

    /// Round trips since the last call.
    fn take(&self) -> u64 {
        self.trips.swap(0, SeqCst)
    }
}

/// `url` with `addr` in place of its host and port.
fn with_address(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let user = authority.rfind('@').map_or("", |at| &authority[..=at]);
    Some(format!("{scheme}://{user}{addr}{path}"))
}

async fn forward(listener: TcpListener, upstream: (String, u16), trips: Arc<AtomicU64>) {
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        let (upstream, trips) = (upstream.clone(), trips.clone());
        connections.spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let ((mut from_client, mut to_client), (mut from_server, mut to_server)) =
                (client.into_split(), server.into_split());
            let server_spoke = AtomicBool::new(false);
            let up = async {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                    if server_spoke.swap(false, SeqCst) {
                        trips.fetch_add(1, SeqCst);
                    }
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown().await;
            };
            let down = async {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    server_spoke.store(true, SeqCst);
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_client.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}
