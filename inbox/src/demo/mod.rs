//! `inbox demo`: the whole pipeline, and its guarantees, in a minute. It starts
//! the stack (receive over HTTP, the worker, the relay to a sink that fails now
//! and then), fires a storm signed exactly as each provider signs, waits for
//! the pipeline to settle, and checks the invariants against what it sent.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use sqlx::PgPool;
use tokio::net::TcpListener;
use webhook_inbox::{
    config::Secrets, sinks::HttpSink, Destination, ReceiveConfig, Receiver, Relay, RelayConfig, Stage, Worker,
    WorkerConfig,
};

mod storm;

use storm::{Consumer, Rng};

/// The storm's size: PaymentIntents; orders and Marqeta batches scale with it.
pub(crate) struct Demo {
    pub payments: usize,
}

impl Demo {
    /// Runs the demo on `config`'s database; true when every invariant holds.
    pub(crate) async fn run(&self, config: ReceiveConfig) -> Result<bool> {
        let pool = config.db.pool()?;
        stock::app().migrate(&pool).await.context("applying migrations")?;
        let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await?;
        if existing > 0 {
            bail!("the demo checks its invariants on an empty inbox; this database holds {existing} events (unset DATABASE_URL to use a throwaway PostgreSQL)");
        }
        sqlx::query("INSERT INTO accounts (account_id) SELECT 'acct_demo_' || i FROM generate_series(0, 4) AS i")
            .execute(&pool)
            .await?;

        // The stack: receive over HTTP, the worker, the relay to a sink that fails now and then.
        let mut receive = config.clone();
        receive.secrets = Secrets::development();
        let receiver = Arc::new(Receiver::from_config(&receive)?);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}/webhooks", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::watch::channel(());
        let until = |mut stopped: tokio::sync::watch::Receiver<()>| async move {
            let _ = stopped.changed().await;
        };
        let server = tokio::spawn(webhook_inbox_service::serve::webhooks(
            listener,
            receiver,
            Default::default(),
            until(stopped.clone()),
        ));
        let worker_config = WorkerConfig { poll: Duration::from_millis(50), ..WorkerConfig::default() };
        let worker = Worker::new(pool.clone(), stock::handlers(), worker_config);
        let worker = tokio::spawn({
            let stopped = until(stopped.clone());
            async move { worker.run_until(Duration::from_millis(50), stopped).await }
        });
        let (sink_url, sink) = Consumer::start(Some(7)).await?;
        let relay_config = RelayConfig { retry_base: Duration::from_millis(50), ..RelayConfig::default() };
        let http = HttpSink::new(sink_url, Duration::from_secs(5))?;
        let relay = Relay::new(pool.clone(), vec![Destination::new("default", http)], relay_config);
        let relay = tokio::spawn({
            let stopped = until(stopped.clone());
            async move { relay.run_until(Duration::from_millis(50), stopped).await }
        });

        let started = Instant::now();
        let (waves, expected) = storm::storm(self.payments, &mut Rng(0x5eed_1234_abcd_ef01));
        // reqwest is built without a default crypto provider (the library's choice); ring is ours.
        #[allow(deprecated)] // rustls 0.23.48 deprecates ring's provider: see webhook_inbox's http_client
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        let mut sent = BTreeMap::<(&str, u16), usize>::new();
        for (i, wave) in waves.iter().enumerate() {
            if i > 0 {
                // Late retries, after the first copies were processed.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let results = futures_util::future::join_all(wave.chunks(32).map(|chunk| {
                let client = client.clone();
                let base = base.clone();
                async move {
                    let mut statuses = Vec::new();
                    for d in chunk {
                        let mut req = client.post(format!("{base}/{}", d.provider)).body(d.body.clone());
                        for (k, v) in &d.headers {
                            req = req.header(*k, v);
                        }
                        let status = req.send().await.map(|r| r.status().as_u16()).unwrap_or(0);
                        statuses.push((d.provider, d.forged, status));
                    }
                    statuses
                }
            }))
            .await;
            for (provider, forged, status) in results.into_iter().flatten() {
                if forged && status != 401 || !forged && status != 200 {
                    println!(
                        "unexpected: a {} {provider} delivery got {status}",
                        if forged { "forged" } else { "signed" }
                    );
                }
                *sent.entry((provider, status)).or_default() += 1;
            }
        }
        let deliveries: usize = sent.values().sum();
        println!("sent {deliveries} deliveries in {:.1} s:", started.elapsed().as_secs_f64());
        for ((provider, status), n) in &sent {
            println!("  {provider:8} HTTP {status}: {n}");
        }

        // Settle: nothing pending, nothing waiting in the outbox.
        let settled = storm::wait_settled(&pool, Duration::from_secs(60)).await?;
        let _ = stop.send(());
        let _ = tokio::join!(server, worker, relay);
        println!("settled in {:.1} s{}", started.elapsed().as_secs_f64(), if settled { "" } else { " (TIMED OUT)" });

        let held: (i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM webhook_inbox), (SELECT count(*) FROM webhook_inbox WHERE status = 'done'),
                    (SELECT count(*) FROM webhook_inbox WHERE status = 'failed'),
                    (SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'), (SELECT count(*) FROM payments),
                    (SELECT count(*) FROM orders), (SELECT count(*) FROM account_deposits),
                    (SELECT count(*) FROM transactional_outbox WHERE processed_at IS NOT NULL)",
        )
        .fetch_one(&pool)
        .await?;
        println!(
            "the database holds {} inbox rows ({} done, {} failed, {} unhandled), {} payments, {} orders, {} deposits, {} outbox messages sent",
            held.0, held.1, held.2, held.3, held.4, held.5, held.6, held.7
        );
        let consumer = std::mem::take(&mut *sink.lock().expect("the consumer's state"));
        let refused = sent.iter().filter(|((_, status), _)| *status == 401).map(|(_, n)| n).sum::<usize>();
        let mut checks = storm::check(&pool, &expected, refused).await?;
        checks.push(consumer_check(&pool, &consumer).await?);
        let mut all = settled;
        for (ok, what) in &checks {
            println!("{} {what}", if *ok { "ok  " } else { "FAIL" });
            all &= ok;
        }
        println!("{}", if all { "every invariant holds" } else { "SOME INVARIANT FAILED" });
        Ok(all)
    }
}

/// The consumer applies the first body under each key and drops the rest, which
/// is safe only if every copy under a key is the same message.
async fn consumer_check(pool: &PgPool, consumer: &Consumer) -> Result<(bool, String)> {
    let keys: BTreeSet<String> =
        sqlx::query_scalar("SELECT message_key FROM transactional_outbox").fetch_all(pool).await?.into_iter().collect();
    let delivered: BTreeSet<String> = consumer.accepted.keys().cloned().collect();
    let copies = consumer.accepted.values().map(Vec::len).sum::<usize>() - delivered.len();
    let consistent = consumer.accepted.values().all(|bodies| bodies.iter().all(|b| b == &bodies[0]));
    Ok((
        delivered == keys && consistent,
        format!(
            "every message delivered and applied once per key: {} keys from {} requests ({} refused by the sink and retried, {copies} repeats dropped)",
            delivered.len(),
            consumer.requests,
            consumer.refused
        ),
    ))
}
