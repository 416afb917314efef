//! `inbox-bench`: each stage side by side with its peer on the same machine,
//! the sides alternated over several rounds so that drift hits both:
//! - receive over HTTP against pgbench running the identical INSERT (prepared,
//!   same payload, same concurrency), all new and half duplicates;
//! - process draining pending events, with no handler and with the stock
//!   handlers, against graphile-worker (from npm, installed by the bench)
//!   draining as many no-op jobs carrying the same payload.
//!
//! Each figure is the median of the rounds with its spread; with `--out` the
//! whole run is written as Markdown (`docs/benchmarks.md`).
//!
//! A package of its own, apart from the operator's binary (as sqlxmq keeps its
//! stress test apart): it runs the `inbox` binary and the functions' binaries
//! built beside it (`cargo build --release --workspace`).

mod growth;
mod lambda;
mod latency;
mod listing;
mod process;
mod receive;
mod report;
mod stages;

use process::{clean, forget_retained, retain, GRAPHILE_WORKER};
use receive::{http, percentile, pgbench, Load, Task, Until};
use report::{fmt, versions};

use std::{
    fmt::Write as _,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, ensure, Context, Result};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sqlx::PgPool;
use stock::{deposits, payments};
use tokio::net::{TcpListener, TcpStream};
use webhook_inbox::{
    config::{DbConfig, Secrets, DEV_MARQETA_PASSWORD, DEV_MARQETA_USERNAME, DEV_STRIPE},
    Handlers, ReceiveConfig, Receiver, Stage, Worker, WorkerConfig,
};
use webhook_inbox_service::dev;

/// Measure each stage side by side with its peer (receive against pgbench
/// running the identical INSERT; process draining pending events), on
/// DATABASE_URL (its rows removed afterwards) or an embedded throwaway PostgreSQL.
#[derive(clap::Parser, Debug)]
#[command(name = "inbox-bench", version)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

/// The workspace's binary `name` built beside this one (`inbox`, a function's).
fn beside(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the bench's own binary")?;
    let path = exe.parent().context("the bench's binary has no directory")?.join(name);
    let build = if cfg!(debug_assertions) { "cargo build --workspace" } else { "cargo build --release --workspace" };
    ensure!(path.exists(), "no `{name}` binary at {}: run `{build}` first", path.display());
    Ok(path)
}

/// An error is one line (with its causes) on stderr and exit status 1.
fn main() -> std::process::ExitCode {
    // Its own lines say what it does: the log only warns. The bench's own
    // statements (seeding millions of rows, vacuums) are slow by design:
    // sqlx's slow-statement warnings would print their SQL whole.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn,sqlx::query=error");
    }
    webhook_inbox::config::init_logging();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> std::process::ExitCode {
    let bench = <Cli as clap::Parser>::parse().args.bench();
    let run = async {
        dev::with_database(ReceiveConfig::from_env(16)?, |config| async move { bench.run(config).await }).await
    };
    match run.await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("error: {e:#}\n"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The sections of a run, in order.
pub const SECTIONS: [&str; 11] =
    ["receive", "marqeta", "prune", "process", "snapshot", "relay", "latency", "verify", "lambda", "growth", "listing"];

/// A run's settings (its flags).
pub struct Bench {
    /// Seconds per side and round, for the receive comparisons.
    pub seconds: u64,
    /// Rounds of each comparison: the figures are their medians.
    pub rounds: usize,
    /// Deliveries in flight, for each receive comparison.
    pub concurrency: Vec<usize>,
    /// Pending events (and graphile-worker jobs) each process round drains.
    pub events: usize,
    /// Workers draining them at once, and graphile-worker processes on its side.
    pub workers: usize,
    /// `done` events the inbox holds while the stages are measured (its retention window).
    pub retained: usize,
    /// Events stored in the inbox whose claim latency is compared with an empty one's.
    pub growth_rows: usize,
    /// The sections to run (of [`SECTIONS`]); all when empty.
    pub only: Vec<String>,
    /// Where to write the Markdown report.
    pub out: Option<PathBuf>,
    /// Each round's figures printed as they come (else one line per section).
    pub verbose: bool,
}

/// `inbox-bench`'s arguments.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Deliveries in flight, one receive comparison each.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32])]
    concurrency: Vec<usize>,
    /// Pending events each process round drains.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Workers draining them, and as many graphile-worker processes on the other side.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// `done` events the inbox holds (its retention window) while receive, process and the
    /// other stages are measured, as a production inbox does.
    #[arg(long, default_value_t = 1_000_000)]
    retained: usize,
    /// Events stored in the inbox whose claim latency is compared with an empty inbox's, and that the console's listing pages through.
    #[arg(long, default_value_t = 5_000_000)]
    growth_rows: usize,
    /// Run only these sections (to profile one, say); every section by default.
    #[arg(long, value_delimiter = ',', value_parser = SECTIONS)]
    only: Vec<String>,
    /// Write the report (Markdown) there, e.g. docs/benchmarks.md.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// The smallest run that exercises every comparison (CI): 1 s, 1 round, 2 in flight, 2,000 events, 2,000 retained, 20,000 stored.
    #[arg(long)]
    smoke: bool,
    /// Print each round's figures as they come (by default, one line as each section starts, and the figures at the end).
    #[arg(long, short)]
    verbose: bool,
}

impl BenchArgs {
    /// The bench these arguments ask for (`--smoke`: the smallest that exercises every comparison).
    pub fn bench(self) -> Bench {
        if self.smoke {
            return Bench {
                seconds: 1,
                rounds: 1,
                concurrency: vec![2],
                events: 2_000,
                workers: 2,
                retained: 2_000,
                growth_rows: 20_000,
                only: self.only,
                out: self.out,
                verbose: self.verbose,
            };
        }
        Bench {
            seconds: self.seconds.max(1),
            rounds: self.rounds.max(1),
            concurrency: self.concurrency.into_iter().map(|c| c.max(1)).collect(),
            events: self.events.max(1),
            workers: self.workers.max(1),
            retained: self.retained,
            growth_rows: self.growth_rows.max(1),
            only: self.only,
            out: self.out,
            verbose: self.verbose,
        }
    }
}

/// One figure over the rounds.
struct Figure {
    name: String,
    unit: &'static str,
    values: Vec<f64>,
}

impl Figure {
    fn new(name: impl Into<String>, unit: &'static str) -> Self {
        Figure { name: name.into(), unit, values: Vec::new() }
    }

    fn median(&self) -> f64 {
        median(&self.values)
    }

    fn spread(&self) -> (f64, f64) {
        let min = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (min, max)
    }
}

/// A figure checked against its target: a ratio of ours over the peer's, or
/// an absolute figure, per round.
struct Check {
    name: String,
    values: Vec<f64>,
    target: f64,
    /// The target is a ceiling (latency, size) rather than a floor (speed).
    at_most: bool,
}

impl Check {
    fn at_least(name: impl Into<String>, target: f64) -> Self {
        Check { name: name.into(), values: Vec::new(), target, at_most: false }
    }

    fn at_most(name: impl Into<String>, target: f64) -> Self {
        Check { name: name.into(), values: Vec::new(), target, at_most: true }
    }

    fn median(&self) -> f64 {
        median(&self.values)
    }

    fn met(&self) -> bool {
        if self.at_most {
            self.median() <= self.target
        } else {
            self.median() >= self.target
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[derive(Default)]
struct Report {
    sections: Vec<(String, Vec<Figure>)>,
    checks: Vec<Check>,
}

/// One event body, the same shape over HTTP, in pgbench and in the process
/// rounds: a Stripe event of about 1.5 KB.
fn body(id: &str) -> String {
    let metadata = "x".repeat(1100);
    format!(
        r#"{{"id":"{id}","object":"event","api_version":"2026-10-28","type":"payment_intent.succeeded","livemode": false,"data":{{"object":{{"id":"pi_{id}","object":"payment_intent","amount":2000,"amount_received":2000,"currency":"usd","customer":"cus_bench","status":"succeeded","metadata":{{"note":"{metadata}"}}}}}}}}"#
    )
}

fn signature(t: u64, body: &str) -> String {
    webhook_inbox_service::dev::stripe_signature(DEV_STRIPE, t, body.as_bytes())
}

impl Bench {
    fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }

    /// A round's figures, as they come: printed with `--verbose`.
    fn round(&self, line: std::fmt::Arguments<'_>) {
        if self.verbose {
            println!("{line}");
        }
    }

    /// The first concurrency of the run: the one the sections with a single concurrency use.
    fn in_flight(&self) -> usize {
        self.concurrency.first().copied().unwrap_or(8)
    }

    /// Runs the sections asked for, one after another, and prints the figures and ratios.
    pub async fn run(&self, mut config: ReceiveConfig) -> Result<()> {
        let url = config.db.url.clone().context("no database")?;
        config.db.pool_size = self.concurrency.iter().copied().max().unwrap_or(8) as u32;
        let dev = Secrets::development();
        config.secrets = Secrets { stripe: dev.stripe, marqeta: dev.marqeta, ..Secrets::default() };
        // The bench's own statements (seeding, cleaning up millions of rows) may take long.
        let pool = DbConfig { statement_timeout: Duration::ZERO, ..config.db.clone() }.pool()?;
        stock::app().migrate(&pool).await.context("applying migrations")?;
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!(
            "inbox-bench: {} rounds, receive {} s per side at {:?} in flight, process {} events with {} workers, {cores} cores",
            self.rounds, self.seconds, self.concurrency, self.events, self.workers
        );
        // What the sections need besides this binary, before half an hour of work depends on it.
        if self.runs("lambda") {
            lambda::binaries()?;
        }
        if self.runs("relay") {
            std::process::Command::new("wrk")
                .arg("--version")
                .output()
                .context("running wrk (`apt-get install wrk`; scripts/test does)")?;
        }
        let mut report = Report::default();
        // One line as each section starts (each round's figures with --verbose).
        let started = Instant::now();
        let section = |name: &str| println!("[{:>5} s] {name}", started.elapsed().as_secs());
        // What a run cut short left behind goes first: the empty inbox must be empty.
        clean(&pool).await?;
        forget_retained(&pool).await?;
        // The worker on an empty inbox first: the figure its runs on a full one are compared with.
        let empty = if self.runs("process") {
            section("process, on an empty inbox");
            Some(self.process_empty(&pool).await?)
        } else {
            None
        };
        section(&format!("storing the retention window: {} done events over 60 days", self.retained));
        // Then the inbox holds a retention window, as in production, for every section on it.
        retain(&pool, 0, self.retained).await?;
        // Every section starts on tables holding none of the bench's rows, dead or alive (the retained ones stay).
        if self.runs("receive") {
            for &c in &self.concurrency {
                for copies in [1, 2] {
                    section(&format!(
                        "receive, {c} in flight, {}",
                        if copies == 1 { "all new" } else { "50% duplicates" }
                    ));
                    clean(&pool).await?;
                    self.receive(&url, &config, c, copies, &mut report).await?;
                }
            }
        }
        if self.runs("marqeta") {
            section("Marqeta batches");
            clean(&pool).await?;
            self.marqeta(&config, &mut report).await?;
        }
        if self.runs("prune") {
            section("prune, while receive runs");
            clean(&pool).await?;
            self.prune(&pool, &config, &mut report).await?;
        }
        if let Some(empty) = empty {
            section("process against graphile-worker, no handler and the stock handlers");
            self.process(&pool, &url, empty, &mut report).await?;
        }
        if self.runs("snapshot") {
            section("a snapshot held open: process and relay");
            self.process_snapshot(&pool, &mut report).await?;
        }
        if self.runs("relay") {
            section("relay");
            clean(&pool).await?;
            self.relay(&pool, &url, &mut report).await?;
        }
        if self.runs("latency") {
            section("received → delivered, through serve and through the functions");
            clean(&pool).await?;
            self.latency(&url, &mut report).await?;
        }
        if self.runs("verify") {
            section("verification");
            self.verify(&mut report)?;
        }
        if self.runs("lambda") {
            section("the Lambda functions");
            lambda::lambda(self, &url, &mut report).await?;
        }
        if self.runs("growth") {
            section("growth: WAL and bytes per event, compression, claim latency");
            self.growth(&pool, &config, &mut report).await?;
        }
        if self.runs("listing") {
            section("the console's listing");
            self.listing(&pool, &config, &mut report).await?;
        }
        if self.runs("process") {
            section("process as the inbox fills");
            self.process_history(&pool, &config, &mut report).await?;
        }
        clean(&pool).await?;
        forget_retained(&pool).await?;
        clean(&pool).await?;

        let (pg_version, pgbench_version) = versions(&pool).await?;
        let doc = report.markdown(self, cores, &pg_version, &pgbench_version);
        if let Some(out) = &self.out {
            std::fs::write(out, &doc).with_context(|| format!("writing {}", out.display()))?;
            println!("written to {}", out.display());
        }
        for c in &report.checks {
            let bound = if c.at_most { "at most" } else { "at least" };
            println!("{}: {} (target: {bound} {})", c.name, fmt(c.median()), fmt(c.target));
        }
        Ok(())
    }
}
