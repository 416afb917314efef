//! `inbox bench`: receive's throughput over HTTP against PostgreSQL's own
//! ceiling, pgbench running the identical INSERT at the same concurrency.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use tokio::net::{TcpListener, TcpStream};
use webhook_inbox::{
    config::{Secrets, DEV_STRIPE},
    db,
    dev::embedded_pg,
    dev::server,
    ReceiveConfig, Receiver,
};

pub struct Bench {
    pub concurrency: usize,
    pub seconds: u64,
    /// Rounds of (pgbench, HTTP), alternated so that drift on a shared machine hits both sides.
    pub rounds: usize,
}

/// One event body, the same shape over HTTP and in pgbench.
fn body(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","api_version":"2026-10-28","type":"payment_intent.succeeded","livemode": false,"data":{{"object":{{"id":"pi_{id}","object":"payment_intent","amount":2000,"amount_received":2000,"currency":"usd","customer":"cus_bench","status":"succeeded"}}}}}}"#
    )
}

fn signature(t: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(DEV_STRIPE.as_bytes()).expect("any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

fn pgbench_script() -> String {
    // pgbench substitutes `:id` even inside literals, so the body holds a placeholder.
    let b = body("bench-pg-@ID@").replace('\'', "''");
    let sig = signature(1_796_000_000, &body("x"));
    format!(
        "\\set id random(1, 9000000000000000)\n\
         INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, failure_reason, raw_body, headers, secret_index) \
         VALUES ('stripe', 'bench-pg-' || :id::text, 'payment_intent.succeeded', replace('{b}', '@ID@', :id::text)::jsonb, 'pending', NULL, \
         convert_to(replace('{b}', '@ID@', :id::text), 'UTF8'), \
         '{{\"stripe-signature\":\"{sig}\",\"content-type\":\"application/json\"}}'::jsonb, 0) \
         ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id;\n"
    )
}

impl Bench {
    pub async fn run(&self, mut config: ReceiveConfig) -> Result<()> {
        let url = config.db.url.clone().context("no database")?;
        config.db.pool_size = self.concurrency as u32;
        config.secrets = Secrets { stripe: Secrets::development().stripe, ..Secrets::default() };
        let pool = db::pool(&config.db)?;
        db::migrate(&pool).await.context("applying migrations")?;
        println!(
            "receive bench: concurrency {}, {} s per side, {} rounds, {} cores",
            self.concurrency,
            self.seconds,
            self.rounds,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let mut ratios = Vec::new();
        for round in 1..=self.rounds {
            let ceiling = self.pgbench(&url).await?;
            let (rate, p50, p99) = self.http(&config).await?;
            println!(
                "round {round}: pgbench (same INSERT, prepared) {ceiling:>7.0}/s | HTTP POST /webhooks/stripe {rate:>7.0}/s (p50 {p50:.2} ms, p99 {p99:.2} ms) | ratio {:.2}",
                rate / ceiling
            );
            ratios.push(rate / ceiling);
        }
        ratios.sort_by(f64::total_cmp);
        println!("median ratio HTTP / pgbench: {:.2} (target 0.80)", ratios[ratios.len() / 2]);

        sqlx::query("DELETE FROM webhook_inbox WHERE provider = 'stripe' AND event_id LIKE 'bench-%'")
            .execute(&pool)
            .await
            .context("removing the bench rows")?;
        Ok(())
    }

    async fn pgbench(&self, url: &str) -> Result<f64> {
        let script = std::env::temp_dir().join(format!("inbox-bench-{}.sql", std::process::id()));
        std::fs::write(&script, pgbench_script())?;
        let pgbench = embedded_pg::find_bin_dir()?.join("pgbench");
        let threads = self.concurrency.min(std::thread::available_parallelism().map_or(2, |n| n.get())).to_string();
        let out = tokio::process::Command::new(&pgbench)
            .args(["-n", "-M", "prepared", "-c", &self.concurrency.to_string(), "-j", &threads])
            .args(["-T", &self.seconds.to_string(), "-f"])
            .arg(&script)
            .arg(url)
            .output()
            .await
            .with_context(|| format!("running {}", pgbench.display()))?;
        let _ = std::fs::remove_file(&script);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("pgbench failed: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
        }
        // "tps = 1234.567890 (without initial connection time)"
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no tps in pgbench's output: {stdout}"))
    }

    async fn http(&self, config: &ReceiveConfig) -> Result<(f64, f64, f64)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let receiver = Arc::new(Receiver::new(db::Connections::new(&config.db)?, config));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::serve(listener, receiver, async {
            let _ = stopped.await;
        }));

        let deadline = Instant::now() + Duration::from_secs(self.seconds);
        let clients: Vec<_> = (0..self.concurrency).map(|c| tokio::spawn(client(addr, c, deadline))).collect();
        let started = Instant::now();
        let mut latencies = Vec::new();
        for c in clients {
            latencies.extend(c.await??);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let _ = stop.send(());
        let _ = server.await;

        latencies.sort_unstable();
        let pct =
            |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)));
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Ok((latencies.len() as f64 / elapsed, ms(pct(0.50)), ms(pct(0.99))))
    }
}

/// One keep-alive connection sending unique signed deliveries until the deadline.
async fn client(addr: std::net::SocketAddr, c: usize, deadline: Instant) -> Result<Vec<Duration>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let mut latencies = Vec::new();
    let mut i = 0u64;
    while Instant::now() < deadline {
        i += 1;
        let b = body(&format!("bench-http-{run}-{c}-{i}"));
        let t = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let req = http::Request::post("/webhooks/stripe")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .header("stripe-signature", signature(t, &b))
            .body(Full::new(Bytes::from(b)))?;
        let sent = Instant::now();
        let response = sender.send_request(req).await?;
        let status = response.status();
        let answer = response.into_body().collect().await?.to_bytes();
        latencies.push(sent.elapsed());
        if status != 200 || !answer.starts_with(br#"{"status":"accepted"}"#) {
            bail!("unexpected answer {status}: {}", String::from_utf8_lossy(&answer));
        }
    }
    Ok(latencies)
}
