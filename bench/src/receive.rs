//! Receive over HTTP against pgbench's ceiling: the load generator, its clients, pgbench.

use super::*;

/// pgbench's side: the claim's INSERT, once per new delivery, and sent again
/// for a duplicate (`copies` = 2: every delivery arrives twice).
pub(super) fn pgbench_script(copies: usize) -> String {
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
pub(super) async fn pgbench(url: &str, c: usize, copies: usize, until: Until) -> Result<String> {
    run_pgbench(url, c, &pgbench_script(copies), until).await
}

/// pgbench running `script` (prepared) at `c` clients until `until`; its output.
pub(super) async fn run_pgbench(url: &str, c: usize, script: &str, until: Until) -> Result<String> {
    let text = script;
    let script = std::env::temp_dir().join(format!("inbox-bench-{}.sql", std::process::id()));
    std::fs::write(&script, text)?;
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
    /// Receive at `c` in flight, each delivery sent `copies` times, against pgbench.
    pub(super) async fn receive(
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
        let mut cpu = Figure::new(format!("receive's own CPU per delivery, {c} in flight, {kind}"), "µs");
        // Group commit's targets: past pgbench's single-row ceiling, more so as more deliveries are in flight.
        let mut ratio =
            Check::at_least(format!("receive / pgbench, {c} in flight, {kind}"), if c >= 32 { 1.5 } else { 1.2 });
        let mut p99_check = Check::at_most(format!("receive p99 (ms), {c} in flight, {kind}"), 10.0);
        let mut cpu_check = Check::at_most(format!("receive's own CPU per delivery (µs), {c} in flight, {kind}"), 45.0);
        for round in 1..=self.rounds {
            let ceiling = self.pgbench(url, c, copies).await?;
            let http = self.http(config, c, Load::Stripe { copies }).await?;
            self.round(format_args!(
                "receive {c} in flight, {kind}, round {round}: pgbench {ceiling:.0}/s | HTTP {:.0}/s (p50 {:.2} ms, p99 {:.2} ms, {:.0} µs CPU a delivery, load generator {:.0}% CPU) | {:.2}",
                http.rate,
                http.p50,
                http.p99,
                http.cpu_us,
                http.load_share * 100.0,
                http.rate / ceiling
            ));
            peer.values.push(ceiling);
            ours.values.push(http.rate);
            p50.values.push(http.p50);
            p99.values.push(http.p99);
            load.values.push(http.load_share * 100.0);
            cpu.values.push(http.cpu_us);
            cpu_check.values.push(http.cpu_us);
            ratio.values.push(http.rate / ceiling);
            p99_check.values.push(http.p99);
        }
        report.sections.push((format!("Receive, {c} in flight, {kind}"), vec![peer, ours, p50, p99, cpu, load]));
        report.checks.extend([ratio, p99_check, cpu_check]);
        Ok(())
    }

    /// Deliveries per second pgbench gets through the claim's INSERT.
    pub(super) async fn pgbench(&self, url: &str, c: usize, copies: usize) -> Result<f64> {
        let stdout = pgbench(url, c, copies, Until::Seconds(self.seconds)).await?;
        // "tps = 1234.567890 (without initial connection time)"
        let tps: f64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
        Ok(tps * copies as f64)
    }

    pub(super) async fn http(&self, config: &ReceiveConfig, c: usize, load: Load) -> Result<Http> {
        http(config, c, load, Until::Seconds(self.seconds)).await
    }
}

pub(super) struct Http {
    pub(super) rate: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) load_share: f64,
    /// The CPU time of the bench's process (receive: HTTP, verification, the
    /// claims' client side) less the load generator's, per delivery, in µs.
    pub(super) cpu_us: f64,
}

/// Seconds of CPU the calling thread has used (Linux: `/proc/thread-self/schedstat`, in ns).
pub(super) fn thread_cpu() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").context("reading the thread's CPU time")?;
    let ns: f64 = stat.split_whitespace().next().context("empty schedstat")?.parse()?;
    Ok(ns / 1e9)
}

/// Seconds of CPU the whole process has used, every thread's, those ended
/// included (Linux: `/proc/self/stat`'s utime and stime, in 1/100 s).
fn process_cpu() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading the process's CPU time")?;
    // The fields after the command's name, which is in parentheses: the 14th and 15th of the line.
    let after = stat.rsplit_once(')').context("no command name in /proc/self/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> { Ok(fields.get(i).context("a short /proc/self/stat")?.parse::<f64>()?) };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// A task aborted with its owner (the bench's stand-in servers and proxies).
pub(super) struct Task(pub(super) tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What each client of the load generator sends.
#[derive(Clone, Copy)]
pub(super) enum Load {
    /// Unique signed Stripe events, each sent `copies` times in a row.
    Stripe { copies: usize },
    /// Marqeta batches (Basic auth) of `items` new deposits each.
    Marqeta { items: usize },
}

/// How long the clients send: for a time, or a number of deliveries each.
#[derive(Clone, Copy)]
pub(super) enum Until {
    Seconds(u64),
    Deliveries(u64),
}

/// `c` keep-alive clients against an in-process `inbox dev` server for
/// `config`, sending `load` until `until`. The load generator runs on a thread
/// of its own, so that its CPU time can be read.
pub(super) async fn http(config: &ReceiveConfig, c: usize, load: Load, until: Until) -> Result<Http> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut config = config.clone();
    config.db.pool_size = c as u32;
    // As `inbox serve` receives: group commit as its environment sets it (INBOX_GROUP_COMMIT_MAX=1
    // turns it off), every delivery counted in the Prometheus metrics.
    let group = webhook_inbox_service::serve::ServeConfig::read(&webhook_inbox::config::Env::process())?.group;
    let receiver = Arc::new(Receiver::from_config(&config)?.with_group_commit(group));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let server = tokio::spawn(webhook_inbox_service::serve::webhooks(listener, receiver, Default::default(), shutdown));

    let process_before = process_cpu()?;
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
    let receive_cpu = process_cpu()? - process_before - cpu;
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
        cpu_us: receive_cpu.max(0.0) / latencies.len() as f64 * 1e6,
    })
}

/// `p` of sorted `latencies`, in ms.
pub(super) fn percentile(latencies: &[Duration], p: f64) -> f64 {
    let i = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
    latencies.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// One keep-alive connection sending unique signed deliveries (a Stripe event
/// `copies` times in a row, or a Marqeta batch) until `until`; the latency of
/// each answer, each answer checked.
pub(super) async fn client(addr: std::net::SocketAddr, c: usize, load: Load, until: Until) -> Result<Vec<Duration>> {
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
