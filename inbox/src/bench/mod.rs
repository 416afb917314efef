//! `inbox bench`: each stage side by side with its peer on the same machine,
//! the sides alternated over several rounds so that drift hits both:
//! - receive over HTTP against pgbench running the identical INSERT (prepared,
//!   same payload, same concurrency), all new and half duplicates;
//! - process draining pending events, with no handler and with the stock
//!   handlers, against graphile-worker (from npm, installed by the bench)
//!   draining as many no-op jobs carrying the same payload.
//!
//! Each figure is the median of the rounds with its spread; with `--out` the
//! whole run is written as Markdown (`docs/benchmarks.md`).

mod growth;
mod lambda;
mod listing;
mod stages;

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
    dev, Handlers, ReceiveConfig, Receiver, Stage, Worker, WorkerConfig,
};

/// The sections of a run, in order.
pub const SECTIONS: [&str; 9] =
    ["receive", "marqeta", "prune", "process", "relay", "verify", "lambda", "growth", "listing"];

pub struct Bench {
    /// Seconds per side and round, for the receive comparisons.
    pub seconds: u64,
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
    webhook_inbox::dev::stripe_signature(DEV_STRIPE, t, body.as_bytes())
}

/// pgbench's side: the claim's INSERT, once per new delivery, and sent again
/// for a duplicate (`copies` = 2: every delivery arrives twice).
fn pgbench_script(copies: usize) -> String {
    // pgbench substitutes `:id` even inside literals, so the body holds a placeholder.
    let b = body("bench-pg-@ID@").replace('\'', "''");
    let sig = signature(1_796_000_000, &body("x"));
    let insert = format!(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index) \
         VALUES ('stripe', 'bench-pg-' || :id::text, 'payment_intent.succeeded', replace('{b}', '@ID@', :id::text)::jsonb, 'pending', NULL, \
         convert_to(replace('{b}', '@ID@', :id::text), 'UTF8'), \
         '{{\"stripe-signature\":\"{sig}\",\"content-type\":\"application/json\"}}'::jsonb, 0) \
         ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id;\n"
    );
    format!("\\set id random(1, 9000000000000000)\n{}", insert.repeat(copies))
}

/// pgbench running the claim's INSERT at `c` clients until `until` (each
/// delivery `copies` times); its output.
async fn pgbench(url: &str, c: usize, copies: usize, until: Until) -> Result<String> {
    let script = std::env::temp_dir().join(format!("inbox-bench-{}.sql", std::process::id()));
    std::fs::write(&script, pgbench_script(copies))?;
    let pgbench = dev::postgres_bin_dir()?.join("pgbench");
    let threads = c.min(std::thread::available_parallelism().map_or(2, |n| n.get())).to_string();
    let until = match until {
        Until::Seconds(s) => ["-T".to_string(), s.to_string()],
        Until::Deliveries(n) => ["-t".to_string(), n.to_string()],
    };
    let out = tokio::process::Command::new(&pgbench)
        .args(["-n", "-M", "prepared", "-c", &c.to_string(), "-j", &threads])
        .args(until)
        .arg("-f")
        .arg(&script)
        .arg(url)
        .output()
        .await
        .with_context(|| format!("running {}", pgbench.display()))?;
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "pgbench failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    Ok(stdout)
}

impl Bench {
    fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }

    /// The first concurrency of the run: the one the sections with a single concurrency use.
    fn in_flight(&self) -> usize {
        self.concurrency.first().copied().unwrap_or(8)
    }

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
            "inbox bench: {} rounds, receive {} s per side at {:?} in flight, process {} events with {} workers, {cores} cores",
            self.rounds, self.seconds, self.concurrency, self.events, self.workers
        );
        let mut report = Report::default();
        // The worker on an empty inbox first: the figure its runs on a full one are compared with.
        let empty = if self.runs("process") { Some(self.process_empty(&pool).await?) } else { None };
        // Then the inbox holds a retention window, as in production, for every section on it.
        retain(&pool, 0, self.retained).await?;
        // Every section starts on tables holding none of the bench's rows, dead or alive (the retained ones stay).
        if self.runs("receive") {
            for &c in &self.concurrency {
                for copies in [1, 2] {
                    clean(&pool).await?;
                    self.receive(&url, &config, c, copies, &mut report).await?;
                }
            }
        }
        if self.runs("marqeta") {
            clean(&pool).await?;
            self.marqeta(&config, &mut report).await?;
        }
        if self.runs("prune") {
            clean(&pool).await?;
            self.prune(&pool, &config, &mut report).await?;
        }
        if let Some(empty) = empty {
            self.process(&pool, &url, empty, &mut report).await?;
        }
        if self.runs("relay") {
            clean(&pool).await?;
            self.relay(&pool, &mut report).await?;
        }
        if self.runs("verify") {
            self.verify(&mut report)?;
        }
        if self.runs("lambda") {
            lambda::lambda(self, &url, &mut report).await?;
        }
        if self.runs("growth") {
            self.growth(&pool, &config, &mut report).await?;
        }
        if self.runs("listing") {
            self.listing(&pool, &config, &mut report).await?;
        }
        if self.runs("process") {
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

    /// Receive at `c` in flight, each delivery sent `copies` times, against pgbench.
    async fn receive(
        &self,
        url: &str,
        config: &ReceiveConfig,
        c: usize,
        copies: usize,
        report: &mut Report,
    ) -> Result<()> {
        let kind = if copies == 1 { "all new" } else { "50% duplicates" };
        let mut peer = Figure::new(format!("pgbench, same INSERT prepared, {c} clients, {kind}"), "deliveries/s");
        let mut ours =
            Figure::new(format!("receive over HTTP (serve, group commit), {c} in flight, {kind}"), "deliveries/s");
        let mut p50 = Figure::new(format!("receive p50, {c} in flight, {kind}"), "ms");
        let mut p99 = Figure::new(format!("receive p99, {c} in flight, {kind}"), "ms");
        let mut load = Figure::new(format!("load generator's CPU share, {c} in flight, {kind}"), "% of the machine");
        // Group commit's targets: past pgbench's single-row ceiling, more so as more deliveries are in flight.
        let mut ratio =
            Check::at_least(format!("receive / pgbench, {c} in flight, {kind}"), if c >= 32 { 1.3 } else { 1.0 });
        let mut p99_check = Check::at_most(format!("receive p99 (ms), {c} in flight, {kind}"), 10.0);
        for round in 1..=self.rounds {
            let ceiling = self.pgbench(url, c, copies).await?;
            let http = self.http(config, c, Load::Stripe { copies }).await?;
            println!(
                "receive {c} in flight, {kind}, round {round}: pgbench {ceiling:.0}/s | HTTP {:.0}/s (p50 {:.2} ms, p99 {:.2} ms, load generator {:.0}% CPU) | {:.2}",
                http.rate, http.p50, http.p99, http.load_share * 100.0, http.rate / ceiling
            );
            peer.values.push(ceiling);
            ours.values.push(http.rate);
            p50.values.push(http.p50);
            p99.values.push(http.p99);
            load.values.push(http.load_share * 100.0);
            ratio.values.push(http.rate / ceiling);
            p99_check.values.push(http.p99);
        }
        report.sections.push((format!("Receive, {c} in flight, {kind}"), vec![peer, ours, p50, p99, load]));
        report.checks.push(ratio);
        report.checks.push(p99_check);
        Ok(())
    }

    /// Deliveries per second pgbench gets through the claim's INSERT.
    async fn pgbench(&self, url: &str, c: usize, copies: usize) -> Result<f64> {
        let stdout = pgbench(url, c, copies, Until::Seconds(self.seconds)).await?;
        // "tps = 1234.567890 (without initial connection time)"
        let tps: f64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
        Ok(tps * copies as f64)
    }

    async fn http(&self, config: &ReceiveConfig, c: usize, load: Load) -> Result<Http> {
        http(config, c, load, Until::Seconds(self.seconds)).await
    }

    /// The worker with no handler on an empty inbox (no retained row), a round each: events/s.
    async fn process_empty(&self, pool: &PgPool) -> Result<Vec<f64>> {
        let mut rates = Vec::new();
        for round in 1..=self.rounds {
            clean(pool).await?;
            seed(pool, self.events, false).await?;
            let rate = self.drain(pool, false).await?;
            println!("process, {} events, no handler, empty inbox, round {round}: {rate:.0} events/s", self.events);
            rates.push(rate);
        }
        Ok(rates)
    }

    /// Drains `events` pending events with no handler, then with the stock
    /// handlers, on the inbox holding the retained rows, against graphile-worker
    /// (as many processes as we have workers).
    async fn process(&self, pool: &PgPool, url: &str, empty: Vec<f64>, report: &mut Report) -> Result<()> {
        // One account per ten deposits: workers meet on an account now and then, not on every batch.
        sqlx::query(
            "INSERT INTO accounts (account_id) SELECT 'acct_bench_' || i FROM generate_series(0, $1 - 1) AS i
             ON CONFLICT DO NOTHING",
        )
        .bind(accounts(self.events))
        .execute(pool)
        .await?;
        let gw = GraphileWorker::install().await?;
        let w = self.workers;
        let mut peer = Figure::new(
            format!("graphile-worker {GRAPHILE_WORKER}, {} no-op jobs, {w} processes of 24 jobs", self.events),
            "jobs/s",
        );
        let retained = self.retained;
        let mut on_empty =
            Figure::new(format!("process, {} events, no handler, {w} workers, empty inbox", self.events), "events/s");
        on_empty.values = empty;
        let mut bare = Figure::new(
            format!("process, {} events, no handler, {w} workers, {retained} retained", self.events),
            "events/s",
        );
        let mut stock = Figure::new(
            format!(
                "process, {} events, stock handlers (payments, orders, deposits), {w} workers, {retained} retained",
                self.events
            ),
            "events/s",
        );
        for round in 1..=self.rounds {
            let jobs = gw.drain(pool, url, self.events, w).await?;
            println!("{}, round {round}: {jobs:.0} jobs/s", peer.name);
            peer.values.push(jobs);
            for (figure, handlers) in [(&mut bare, false), (&mut stock, true)] {
                clean(pool).await?;
                seed(pool, self.events, handlers).await?;
                let rate = self.drain(pool, handlers).await?;
                println!("{}, round {round}: {rate:.0} events/s", figure.name);
                figure.values.push(rate);
            }
        }
        sqlx::query("DROP SCHEMA IF EXISTS graphile_worker CASCADE").execute(pool).await?;
        let per_round = |f: &Figure| f.values.iter().zip(&peer.values).map(|(a, b)| a / b).collect::<Vec<_>>();
        report.checks.push(Check {
            values: per_round(&bare),
            ..Check::at_least(
                format!("process (no handler, {retained} retained) / graphile-worker (no-op jobs), {w} a side"),
                1.5,
            )
        });
        report.checks.push(Check {
            values: per_round(&stock),
            ..Check::at_least(
                format!("process (stock handlers, {retained} retained) / graphile-worker (no-op jobs), {w} a side"),
                1.0,
            )
        });
        report.sections.push((
            format!("Process, {w} workers against {w} graphile-worker processes"),
            vec![peer, on_empty, bare, stock],
        ));
        Ok(())
    }

    /// The worker with no handler on an empty inbox and on one holding
    /// `growth_rows` retained events, each in a freshly migrated schema of its
    /// own, alternated round by round. The retained window is vacuumed and
    /// checkpointed before the first drain: an old window is settled on disk,
    /// and the write-out of a fresh one would be measured instead of the history.
    async fn process_history(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        const EMPTY: &str = "bench_history_empty";
        const FULL: &str = "bench_history_full";
        let rows = self.growth_rows.max(self.retained);
        let size = self.workers as u32 * 2 + 2;
        for schema in [EMPTY, FULL] {
            growth::migrated_schema(pool, &config.db, schema).await?;
        }
        let empty = growth::schema_pool(&config.db, EMPTY, size)?;
        let full = growth::schema_pool(&config.db, FULL, size)?;
        retain(&full, 0, rows).await?;
        sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
        let name = |inbox: String| {
            Figure::new(
                format!("process, {} events, no handler, {} workers, {inbox}", self.events, self.workers),
                "events/s",
            )
        };
        let (mut on_empty, mut on_full) = (name("empty inbox".into()), name(format!("{rows} retained")));
        let mut ratio = Check::at_least(format!("process (no handler), {rows} retained / empty inbox"), 0.9);
        for round in 1..=self.rounds {
            for (p, figure) in [(&empty, &mut on_empty), (&full, &mut on_full)] {
                sqlx::query("DELETE FROM webhook_inbox WHERE event_id LIKE 'bench-%'").execute(p).await?;
                sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(p).await?;
                seed(p, self.events, false).await?;
                let rate = self.drain(p, false).await?;
                println!("{}, round {round}: {rate:.0} events/s", figure.name);
                figure.values.push(rate);
            }
            ratio.values.push(on_full.values[round - 1] / on_empty.values[round - 1]);
        }
        empty.close().await;
        full.close().await;
        for schema in [EMPTY, FULL] {
            sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(pool).await?;
        }
        report.checks.push(ratio);
        report
            .sections
            .push((format!("Process as the inbox fills: empty, and {rows} retained"), vec![on_empty, on_full]));
        Ok(())
    }

    async fn drain(&self, pool: &PgPool, handlers: bool) -> Result<f64> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(3600);
        let workers: Vec<_> = (0..self.workers)
            .map(|_| {
                let h = if handlers { stock::handlers() } else { Handlers::new() };
                let worker = Worker::new(pool.clone(), h, WorkerConfig::default());
                tokio::spawn(async move { worker.run(deadline).await.map_err(|e| anyhow::anyhow!("{e}")) })
            })
            .collect();
        let mut taken = 0;
        for w in workers {
            taken += w.await??.taken;
        }
        let elapsed = started.elapsed().as_secs_f64();
        // Through the queue's and the failures' partial indexes: the retained rows are not read.
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND event_id LIKE 'bench-%')
                  + (SELECT count(*) FROM webhook_inbox WHERE status = 'failed' AND event_id LIKE 'bench-%')",
        )
        .fetch_one(pool)
        .await?;
        // `taken` may exceed the events: one retried after contention is taken again.
        ensure!(
            left == 0 && taken >= self.events,
            "the drain left {left} events neither done nor unhandled ({taken} taken)"
        );
        Ok(self.events as f64 / elapsed)
    }
}

const GRAPHILE_WORKER: &str = "0.17.3";

/// graphile-worker from npm, in a folder of its own under the temporary directory.
struct GraphileWorker {
    dir: PathBuf,
}

impl GraphileWorker {
    async fn install() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("inbox-bench-graphile-worker-{GRAPHILE_WORKER}"));
        std::fs::create_dir_all(&dir)?;
        if !dir.join("node_modules/graphile-worker/package.json").exists() {
            println!("installing graphile-worker {GRAPHILE_WORKER} from npm into {}", dir.display());
            let out = tokio::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
                .arg(&dir)
                .arg(format!("graphile-worker@{GRAPHILE_WORKER}"))
                .output()
                .await
                .context("running npm (graphile-worker is the process bench's peer)")?;
            ensure!(
                out.status.success(),
                "npm install graphile-worker failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(dir.join("graphile.mjs"), include_str!("../../bench/graphile.mjs"))?;
        Ok(GraphileWorker { dir })
    }

    fn node(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg(self.dir.join("graphile.mjs")).args(args).kill_on_drop(true);
        cmd
    }

    /// Jobs per second `processes` worker processes drain `n` no-op jobs at,
    /// from the first job done to the last (their start-up left out).
    async fn drain(&self, pool: &PgPool, url: &str, n: usize, processes: usize) -> Result<f64> {
        let mut seed = self.node(&["seed", url, &n.to_string()]).stdin(std::process::Stdio::piped()).spawn()?;
        {
            use tokio::io::AsyncWriteExt;
            let mut stdin = seed.stdin.take().context("seed's stdin")?;
            stdin.write_all(body("bench-gw").as_bytes()).await?;
        }
        ensure!(seed.wait().await?.success(), "graphile-worker's seed failed");
        let count = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM graphile_worker._private_jobs").fetch_one(pool).await
        };
        ensure!(count().await? == n as i64, "graphile-worker was not given {n} jobs");
        let workers: Vec<_> = (0..processes)
            .map(|_| self.node(&["work", url]).stdout(std::process::Stdio::null()).spawn())
            .collect::<Result<_, _>>()?;
        let mut first = None;
        let started = Instant::now();
        loop {
            let left = count().await?;
            if left < n as i64 && first.is_none() {
                first = Some((Instant::now(), n as i64 - left));
            }
            if left == 0 {
                break;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(600),
                "graphile-worker did not drain its jobs in 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(workers);
        let (first, done_then) = first.context("no job was done")?;
        Ok((n as i64 - done_then).max(1) as f64 / first.elapsed().as_secs_f64())
    }
}

struct Http {
    rate: f64,
    p50: f64,
    p99: f64,
    load_share: f64,
}

/// Seconds of CPU the calling thread has used (Linux: `/proc/thread-self/schedstat`, in ns).
fn thread_cpu() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").context("reading the thread's CPU time")?;
    let ns: f64 = stat.split_whitespace().next().context("empty schedstat")?.parse()?;
    Ok(ns / 1e9)
}

/// A task aborted with its owner (the bench's stand-in servers and proxies).
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What each client of the load generator sends.
#[derive(Clone, Copy)]
enum Load {
    /// Unique signed Stripe events, each sent `copies` times in a row.
    Stripe { copies: usize },
    /// Marqeta batches (Basic auth) of `items` new deposits each.
    Marqeta { items: usize },
}

/// How long the clients send: for a time, or a number of deliveries each.
#[derive(Clone, Copy)]
enum Until {
    Seconds(u64),
    Deliveries(u64),
}

/// `c` keep-alive clients against an in-process `inbox dev` server for
/// `config`, sending `load` until `until`. The load generator runs on a thread
/// of its own, so that its CPU time can be read.
async fn http(config: &ReceiveConfig, c: usize, load: Load, until: Until) -> Result<Http> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut config = config.clone();
    config.db.pool_size = c as u32;
    // As `inbox serve` receives: group commit as its environment sets it (INBOX_GROUP_COMMIT_MAX=1
    // turns it off), every delivery counted in the Prometheus metrics.
    let group = webhook_inbox::config::ServeConfig::read(&webhook_inbox::config::Env::process())?.group;
    let receiver = Arc::new(Receiver::from_config(&config)?.with_group_commit(group));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let server = tokio::spawn(webhook_inbox::serve::webhooks(listener, receiver, shutdown));

    let generator = std::thread::spawn(move || -> Result<(Vec<Duration>, f64, Duration)> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let started = Instant::now();
        let cpu_before = thread_cpu()?;
        let latencies = rt.block_on(async move {
            let clients: Vec<_> = (0..c).map(|i| tokio::spawn(client(addr, i, load, until))).collect();
            let mut latencies = Vec::new();
            for client in clients {
                latencies.extend(client.await??);
            }
            Ok::<_, anyhow::Error>(latencies)
        })?;
        Ok((latencies, thread_cpu()? - cpu_before, started.elapsed()))
    });
    let (mut latencies, cpu, elapsed) = tokio::task::spawn_blocking(move || generator.join())
        .await?
        .map_err(|_| anyhow::anyhow!("load generator panicked"))??;
    let _ = stop.send(());
    let _ = server.await;

    ensure!(!latencies.is_empty(), "no delivery was answered");
    latencies.sort_unstable();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    Ok(Http {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        load_share: cpu / (elapsed.as_secs_f64() * cores),
    })
}

/// `p` of sorted `latencies`, in ms.
fn percentile(latencies: &[Duration], p: f64) -> f64 {
    let i = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
    latencies.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// One keep-alive connection sending unique signed deliveries (a Stripe event
/// `copies` times in a row, or a Marqeta batch) until `until`; the latency of
/// each answer, each answer checked.
async fn client(addr: std::net::SocketAddr, c: usize, load: Load, until: Until) -> Result<Vec<Duration>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let started = Instant::now();
    let basic = format!("Basic {}", B64.encode(format!("{DEV_MARQETA_USERNAME}:{DEV_MARQETA_PASSWORD}")));
    let mut latencies = Vec::new();
    let mut i = 0u64;
    loop {
        match until {
            Until::Seconds(s) if started.elapsed() >= Duration::from_secs(s) => break,
            Until::Deliveries(n) if latencies.len() as u64 >= n => break,
            _ => {}
        }
        i += 1;
        let (b, copies, auth) = match load {
            Load::Stripe { copies } => {
                // As long as pgbench's ids (16 digits), so that rows compare byte for byte.
                let id = run % 1_000_000_000_000_000 + c as u128 * 10_000_000_000 + u128::from(i);
                let b = body(&format!("bench-ht-{id:016}"));
                let t = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
                let sig = signature(t, &b);
                (b, copies, ("stripe-signature", sig))
            }
            Load::Marqeta { items } => {
                let batch: Vec<_> = (0..items)
                    .map(|k| {
                        serde_json::json!({"token": format!("bench-mq-{run}-{c}-{i}-{k}"), "type": "gpa.credit",
                            "state": "COMPLETION", "user_token": "acct_bench_0", "amount": "1.00"})
                    })
                    .collect();
                (serde_json::json!({ "transactions": batch }).to_string(), 1, ("authorization", basic.clone()))
            }
        };
        let b = Bytes::from(b);
        let path = if matches!(load, Load::Stripe { .. }) { "/webhooks/stripe" } else { "/webhooks/marqeta" };
        for copy in 0..copies {
            let req = http::Request::post(path)
                .header("host", addr.to_string())
                .header("content-type", "application/json")
                .header(auth.0, &auth.1)
                .body(Full::new(b.clone()))?;
            let sent = Instant::now();
            let response = sender.send_request(req).await?;
            let status = response.status();
            let answer = response.into_body().collect().await?.to_bytes();
            latencies.push(sent.elapsed());
            let want = match load {
                Load::Stripe { .. } if copy == 0 => r#"{"status":"accepted"}"#.to_string(),
                Load::Stripe { .. } => r#"{"status":"duplicate"}"#.to_string(),
                Load::Marqeta { items } => format!(r#"{{"accepted":{items},"duplicates":0}}"#),
            };
            if status != 200 || !answer.starts_with(want.as_bytes()) {
                bail!("unexpected answer {status}: {}", String::from_utf8_lossy(&answer));
            }
        }
    }
    Ok(latencies)
}

/// `n` pending events: with `handlers`, a third each of Stripe payments,
/// Shopify order snapshots and Marqeta deposits (every one with an effect and
/// an outbox message); without, events no handler takes. Same size either way.
async fn seed(pool: &PgPool, n: usize, handlers: bool) -> Result<()> {
    let pad = "x".repeat(1100);
    let sql = if handlers {
        format!(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
             SELECT p, 'bench-' || i, t, j, 'pending', convert_to(j::text, 'UTF8'), '{{}}', 0
             FROM generate_series(1, $1) AS i,
             LATERAL (SELECT CASE i % 3 WHEN 0 THEN 'stripe' WHEN 1 THEN 'shopify' ELSE 'marqeta' END AS p) AS provider,
             LATERAL (SELECT CASE p WHEN 'stripe' THEN '{pay}' WHEN 'shopify' THEN 'orders/updated' ELSE '{dep}' END AS t) AS type,
             LATERAL (SELECT CASE p
                 WHEN 'stripe' THEN jsonb_build_object('id', 'bench-' || i, 'type', '{pay}', 'data', jsonb_build_object('object',
                     jsonb_build_object('id', 'pi_bench_' || i, 'amount_received', 2000, 'currency', 'usd', 'note', '{pad}')))
                 WHEN 'shopify' THEN jsonb_build_object('id', 7000000000 + i, 'financial_status', 'paid', 'total_price', '20.00',
                     'updated_at', '2026-11-30T08:00:00Z', 'note', '{pad}')
                 ELSE jsonb_build_object('token', 'dep_bench_' || i, 'type', 'gpa.credit', 'state', 'COMPLETION',
                     'user_token', 'acct_bench_' || (i % {accounts}), 'amount', '1.00', 'note', '{pad}')
                 END AS j) AS payload",
            pay = payments::EVENT_TYPE,
            dep = deposits::EVENT_TYPE,
            accounts = accounts(n),
        )
    } else {
        format!(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
             SELECT 'stripe', 'bench-' || i, 'bench.no_handler', j, 'pending', convert_to(j::text, 'UTF8'), '{{}}', 0
             FROM generate_series(1, $1) AS i,
             LATERAL (SELECT jsonb_build_object('id', 'bench-' || i, 'type', 'bench.no_handler', 'data', jsonb_build_object('object',
                 jsonb_build_object('id', 'pi_bench_' || i, 'amount_received', 2000, 'currency', 'usd', 'note', '{pad}'))) AS j) AS payload"
        )
    };
    sqlx::query(&sql).bind(n as i64).execute(pool).await.context("seeding pending events")?;
    sqlx::query("ANALYZE webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Retained events `from..to` (`done`, received over the last 60 days, the
/// bench's 1.5 KB payload): what a production inbox holds for deduplication.
async fn retain(pool: &PgPool, from: usize, to: usize) -> Result<()> {
    if to <= from {
        return Ok(());
    }
    println!("storing {} retained events (done, over 60 days)", to - from);
    let pad = "x".repeat(1100);
    let sql = format!(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index,
                                    received_at, processed_at, attempts)
         SELECT 'stripe', 'retained-' || i, 'payment_intent.succeeded', j, 'done', convert_to(j::text, 'UTF8'), '{{}}', 0,
                now() - (i % 5184000) * interval '1 second', now() - (i % 5184000) * interval '1 second', 1
         FROM generate_series($1::bigint, $2::bigint - 1) AS i,
         LATERAL (SELECT jsonb_build_object('id', 'retained-' || i, 'type', 'payment_intent.succeeded', 'data',
             jsonb_build_object('object', jsonb_build_object('id', 'pi_retained_' || i, 'amount_received', 2000,
                 'currency', 'usd', 'note', '{pad}'))) AS j) AS payload"
    );
    for start in (from..to).step_by(250_000) {
        let end = (start + 250_000).min(to);
        sqlx::query(&sql).bind(start as i64).bind(end as i64).execute(pool).await.context("storing retained events")?;
    }
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Removes the retained events.
async fn forget_retained(pool: &PgPool) -> Result<()> {
    sqlx::query("DELETE FROM webhook_inbox WHERE event_id LIKE 'retained-%'").execute(pool).await?;
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Accounts the deposits of `events` go to: one per ten deposits (a third of the events).
fn accounts(events: usize) -> i64 {
    (events as i64 / 30).max(1)
}

/// Removes every row the bench made (they all carry `bench` in their keys).
async fn clean(pool: &PgPool) -> Result<()> {
    sqlx::raw_sql(
        "DELETE FROM webhook_inbox WHERE event_id LIKE 'bench-%' OR event_id LIKE 'transactions:bench-%';
         DELETE FROM webhook_bodies b WHERE position('bench-mq-'::bytea IN raw_body) > 0
             AND NOT EXISTS (SELECT 1 FROM webhook_inbox i WHERE i.body_sha256 = b.sha256);
         DELETE FROM transactional_outbox WHERE message_key LIKE '%bench%';
         DELETE FROM payments WHERE payment_id LIKE 'pi_bench_%';
         DELETE FROM orders WHERE order_id LIKE '7000%';
         DELETE FROM account_deposits WHERE token LIKE 'dep_bench_%';
         UPDATE accounts SET balance = 0 WHERE account_id LIKE 'acct_bench_%';",
    )
    .execute(pool)
    .await
    .context("removing the bench's rows")?;
    // Each section starts on tables without the dead rows of the one before
    // (millions after the receive sections), as the peers start on fresh ones.
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox, webhook_bodies, transactional_outbox")
        .execute(pool)
        .await
        .context("vacuuming after the bench's rows")?;
    Ok(())
}

async fn versions(pool: &PgPool) -> Result<(String, String)> {
    let pg: String =
        sqlx::query_scalar("SELECT 'PostgreSQL ' || current_setting('server_version')").fetch_one(pool).await?;
    let pgbench = dev::postgres_bin_dir()?.join("pgbench");
    let out = tokio::process::Command::new(&pgbench).arg("--version").output().await?;
    Ok((pg, String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

impl Report {
    fn markdown(&self, bench: &Bench, cores: usize, pg: &str, pgbench: &str) -> String {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(|m| m.trim().to_string()))
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let c = bench.in_flight();
        let mut doc = String::from("# Benchmarks\n\n");
        let _ = writeln!(
            doc,
            "Written by `inbox bench --out docs/benchmarks.md` ({} build): {} rounds, the two sides of \
             each comparison alternated in every round; each figure is the median of the rounds, with the \
             lowest and highest. Where a target is missed, [performance.md](performance.md) explains the \
             gap with a profile and names the next lever.\n\n\
             - Machine: {cores} cores ({cpu}), load generator, server and PostgreSQL sharing them.\n\
             - PostgreSQL: {pg}; {pgbench}.\n\
             - The inbox holds {} `done` events received over 60 days (its retention window) in every section \
             after the first process figure, as a production inbox does.\n\
             - Receive: {} s per side and round; bodies of about 1.5 KB (Stripe events, signed); `inbox serve`'s \
             path: its HTTP server, group commit ({}), every delivery counted in its Prometheus metrics; \
             `synchronous_commit` on. pgbench runs the claim's single-row INSERT (prepared) with the same body, \
             the same concurrency, and each delivery twice for the duplicate runs.\n\
             - Process: {} pending events per round drained by {} workers (batches of {}, no savepoint per event \
             until a handler fails), with no handler (events no handler takes: unhandled, without effect) and \
             with the stock handlers (a third each of Stripe payments, Shopify order snapshots and Marqeta \
             deposits to one account per ten deposits, each with its effect and its outbox message); against \
             graphile-worker {GRAPHILE_WORKER} (npm) draining as many no-op jobs carrying the same payload, as many \
             processes as we have workers, each of 24 concurrent jobs, `localQueue` 500, \
             `completeJobBatchDelay` 0, measured from its first job done to its last. The worker with no handler \
             is measured on an empty inbox first; last, it alternates between two freshly migrated schemas, \
             one empty and one holding {} retained events (vacuumed and checkpointed before the first drain, \
             as an old window is settled on disk).\n\
             - Marqeta batches: {c} in flight for {} s, ten new deposits per batch (Basic auth), all items \
             claimed in one statement, the body stored once.\n\
             - Prune: {} `done` rows older than any retention seeded per round; receive at {c} in flight for \
             {} s alone, then again while the prune deletes them (batches of `INBOX_PRUNE_BATCH`, each its own \
             transaction); rows/s over the time the prune ran. The prune may end before the receive window does \
             (see its rows/s): receive's p99 with prune is over the whole window.\n\
             - Relay: outbox messages of about 1.5 KB to a local HTTP sink (the HTTP sink of `relay`, \
             `RELAY_CONCURRENCY` and `RELAY_BATCH_SIZE` at their defaults), {} s per round.\n\
             - Verification: a signed Stripe delivery's signature check and event parsing, in process on \
             one thread, {} s per side and round: the coded scheme, and the same contract declared as data.\n\
             - Lambda: each function binary exec'd with a Lambda environment against a stand-in Runtime \
             API on loopback, timed from the spawn to its first poll; the size of the arm64 `bootstrap` artifact \
             `scripts/build-lambdas` builds (of the native binary if there is none; 10^6 bytes to the MB); `receive` \
             then given signed API Gateway events one at a time (warm latency from the event handed over to \
             the answer, peak RSS), and, in a second instance behind a counting TCP proxy, database round trips \
             per delivery (the client speaking again after the server answered).\n\
             - Growth: {} deliveries at {c} in flight on each side, each side in a freshly migrated schema of \
             its own; WAL is the LSN's advance, stored bytes the growth of every table, TOAST table and index \
             of the schema, both per row stored. Claim latency: new 1.5 KB events claimed one at a time on one \
             connection, on an empty inbox and on one holding {} events (small payloads: the claim's cost is in \
             the indexes).\n\
             - Listing: the console's `ops::list_events` on {} events over 60 days in a freshly migrated schema \
             (five providers, eight types and one of 0.01%, 0.1% failed, 0.1% unhandled, 1,000 pending), on the \
             console's pool settings; each filter run 12 times a round, the figure the median of the last 7 (the \
             first warm the cache, as a console in use has it); a page of 50.\n",
            if cfg!(debug_assertions) { "debug" } else { "release" },
            bench.rounds,
            bench.retained,
            bench.seconds,
            group_commit(),
            bench.events,
            bench.workers,
            WorkerConfig::default().batch_size,
            bench.growth_rows.max(bench.retained),
            bench.seconds,
            bench.events * 10,
            bench.seconds,
            bench.seconds,
            bench.seconds,
            (bench.events / 2).max(c),
            bench.growth_rows,
            bench.growth_rows,
        );
        for (title, figures) in &self.sections {
            let _ = writeln!(
                doc,
                "## {title}\n\n| figure | median | lowest | highest | unit |\n| --- | --- | --- | --- | --- |"
            );
            for f in figures {
                let (lo, hi) = f.spread();
                let _ = writeln!(doc, "| {} | {} | {} | {} | {} |", f.name, fmt(f.median()), fmt(lo), fmt(hi), f.unit);
            }
            doc.push('\n');
        }
        let _ = writeln!(
            doc,
            "## Targets\n\n| check | median | per round | target | met |\n| --- | --- | --- | --- | --- |"
        );
        for c in &self.checks {
            let rounds: Vec<String> = c.values.iter().map(|&v| fmt(v)).collect();
            let met = if c.met() { "yes" } else { "no" };
            let bound = if c.at_most { "<=" } else { ">=" };
            let _ = writeln!(
                doc,
                "| {} | {} | {} | {bound} {} | {met} |",
                c.name,
                fmt(c.median()),
                rounds.join(", "),
                fmt(c.target)
            );
        }
        doc
    }
}

/// Group commit as the bench's receive runs it (the environment's `INBOX_GROUP_COMMIT_*`).
fn group_commit() -> String {
    match webhook_inbox::config::ServeConfig::read(&webhook_inbox::config::Env::process()) {
        Ok(c) if c.group.is_on() => format!(
            "up to {} deliveries a group, {} committers, a wait of {} µs",
            c.group.max,
            c.group.committers,
            c.group.wait.as_micros()
        ),
        Ok(_) => "off: one claim per delivery".into(),
        Err(e) => format!("unreadable: {e}"),
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
