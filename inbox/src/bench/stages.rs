//! The stages with no peer on the machine: Marqeta batches over HTTP, prune
//! while receive runs (and what it costs receive), the relay against a local
//! HTTP sink that answers at once or after 50 ms, and the declared scheme's
//! verification against the coded one's.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn, Response};
use hyper_util::rt::TokioIo;
use sqlx::PgPool;
use tokio::net::TcpListener;
use webhook_inbox::{
    config::{Catalog, Secret, Secrets, DEV_STRIPE},
    schemes::{self, Delivery},
    sinks::HttpSink,
    Destination, DestinationLimits, Provider, PruneConfig, Pruner, ReceiveConfig, Relay, RelayConfig,
};

use super::{body, signature, Bench, Check, Figure, Load, Report, Task};

/// Stripe's contract written as data, as the library's differential test judges it against the coded scheme.
const STRIPE_AS_DATA: &str = include_str!("../../../shared/src/receive/providers/declared/stripe_as_data.toml");

/// Items per Marqeta batch, as Marqeta sends them by default.
const BATCH_ITEMS: usize = 10;

impl Bench {
    /// Signature check and event parsing alone, in process on one thread, on the
    /// same signed Stripe delivery: the coded scheme, and its contract declared as data.
    pub(super) fn verify(&self, report: &mut Report) -> Result<()> {
        let file = format!("[stripe-as-data]\n{STRIPE_AS_DATA}redelivery_days = 30\n");
        let catalog = Catalog::with_file(Some(&file), |_| None).map_err(anyhow::Error::msg)?;
        let declared = Provider::try_from("stripe-as-data")?;
        let mut secrets = Secrets { stripe: vec![Secret::new(DEV_STRIPE)], ..Secrets::default() };
        secrets.declared.insert(declared, vec![Secret::new(DEV_STRIPE)]);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        let payload = body("bench-verify");
        let mut headers = http::HeaderMap::new();
        headers.insert("stripe-signature", signature(now, &payload).parse()?);
        let d = Delivery { headers: &headers, body: payload.as_bytes(), now: now as i64 };
        let sides = [("coded", Provider::STRIPE), ("declared", declared)];
        let mut figures: Vec<Figure> = sides
            .iter()
            .map(|(kind, _)| Figure::new(format!("verify + events, {kind} Stripe, one thread"), "deliveries/s"))
            .collect();
        let mut ratio = Check::at_least("declared / coded, verify + events in process", 0.5);
        for round in 1..=self.rounds {
            let mut rates = [0.0; 2];
            for (i, (_, p)) in sides.iter().enumerate() {
                let scheme = schemes::configured(&catalog, &secrets, *p).context("configured above")?;
                ensure!(scheme.verify(&d).is_ok(), "the bench's delivery does not verify with {p}");
                let (started, mut n) = (Instant::now(), 0u64);
                while started.elapsed() < Duration::from_secs(self.seconds) {
                    for _ in 0..100 {
                        std::hint::black_box(scheme.verify(std::hint::black_box(&d)).is_ok());
                        std::hint::black_box(scheme.events(&d));
                    }
                    n += 100;
                }
                rates[i] = n as f64 / started.elapsed().as_secs_f64();
                figures[i].values.push(rates[i]);
            }
            println!(
                "verify + events, round {round}: coded {:.0}/s | declared {:.0}/s | {:.2}",
                rates[0],
                rates[1],
                rates[1] / rates[0]
            );
            ratio.values.push(rates[1] / rates[0]);
        }
        report.sections.push(("Verification, in process".into(), figures));
        report.checks.push(ratio);

        // A stranger's unsigned 1 MiB Twilio form under 16 signature headers:
        // the signed bytes (the sorted form) are built once per delivery and
        // 16 candidates tried in all, so it costs what one header does.
        let twilio = Provider::try_from("twilio")?;
        let url = |p: Provider| (p == twilio).then(|| "https://bench.example/webhooks/twilio".to_string());
        let catalog = Catalog::with_file(None, url).map_err(anyhow::Error::msg)?;
        let mut secrets = Secrets::default();
        secrets.declared.insert(twilio, vec![Secret::new("bench-twilio-token")]);
        let scheme = schemes::configured(&catalog, &secrets, twilio).context("configured above")?;
        let form: String = (0..16_000).map(|i| format!("Field{i:05}=value-{i:0>48}&")).collect();
        let mut headers = [http::HeaderMap::new(), http::HeaderMap::new()];
        headers[0].append("x-twilio-signature", "bm90IGEgc2lnbmF0dXJlIG9mIHRoaXMgZm9ybQ==".parse()?);
        for _ in 0..16 {
            headers[1].append("x-twilio-signature", "bm90IGEgc2lnbmF0dXJlIG9mIHRoaXMgZm9ybQ==".parse()?);
        }
        for h in &mut headers {
            h.insert("content-type", "application/x-www-form-urlencoded".parse()?);
        }
        let sides = ["one signature header", "16 signature headers"];
        let mut figures: Vec<Figure> = sides
            .iter()
            .map(|side| {
                Figure::new(format!("verify, unsigned {} KiB Twilio form, {side}", form.len() / 1024), "deliveries/s")
            })
            .collect();
        let mut cost = Check::at_most("16 signature headers / one, time per refused delivery", 2.0);
        for round in 1..=self.rounds {
            let mut rates = [0.0; 2];
            for (i, h) in headers.iter().enumerate() {
                let d = Delivery { headers: h, body: form.as_bytes(), now: now as i64 };
                ensure!(scheme.verify(&d).is_err(), "the bench's Twilio form is not signed");
                let (started, mut n) = (Instant::now(), 0u64);
                while started.elapsed() < Duration::from_secs(self.seconds) {
                    std::hint::black_box(scheme.verify(std::hint::black_box(&d)).is_err());
                    n += 1;
                }
                rates[i] = n as f64 / started.elapsed().as_secs_f64();
                figures[i].values.push(rates[i]);
            }
            println!(
                "unsigned Twilio form, round {round}: one header {:.0}/s | 16 headers {:.0}/s | cost {:.2}x",
                rates[0],
                rates[1],
                rates[0] / rates[1]
            );
            cost.values.push(rates[0] / rates[1]);
        }
        report.sections.push(("Verification, a stranger's large unsigned form".into(), figures));
        report.checks.push(cost);
        Ok(())
    }

    /// Marqeta batches of ten new items over HTTP: items per second.
    pub(super) async fn marqeta(&self, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let c = self.in_flight();
        let mut items = Figure::new(format!("receive, Marqeta batches of {BATCH_ITEMS}, {c} in flight"), "items/s");
        let mut p99 = Figure::new(format!("receive p99, Marqeta batches of {BATCH_ITEMS}, {c} in flight"), "ms");
        for round in 1..=self.rounds {
            let h = self.http(config, c, Load::Marqeta { items: BATCH_ITEMS }).await?;
            let rate = h.rate * BATCH_ITEMS as f64;
            println!("Marqeta batches, {c} in flight, round {round}: {rate:.0} items/s (p99 {:.2} ms)", h.p99);
            items.values.push(rate);
            p99.values.push(h.p99);
        }
        report.sections.push(("Receive, Marqeta batches".into(), vec![items, p99]));
        Ok(())
    }

    /// Prune deleting old `done` rows while receive runs: rows per second, and
    /// receive's p99 with the prune running and without (alternated).
    pub(super) async fn prune(&self, pool: &PgPool, config: &ReceiveConfig, report: &mut Report) -> Result<()> {
        let c = self.in_flight();
        // The configured retention (INBOX_RETENTION_DAYS, ...): the bench's old rows
        // are older than any retention allows, and nothing else is pruned that
        // the prune function would not prune.
        let retention = PruneConfig::read(&webhook_inbox::config::Env::process())?;
        // Enough old rows for the prune to run through most of the receive window.
        let old_rows = self.events * 10;
        let mut rows = Figure::new(format!("prune, {old_rows} old rows, while receive runs"), "rows/s");
        let mut without = Figure::new(format!("receive p99, {c} in flight, without prune"), "ms");
        let mut with = Figure::new(format!("receive p99, {c} in flight, prune running"), "ms");
        for round in 1..=self.rounds {
            sqlx::query(
                "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index,
                     received_at, processed_at)
                 SELECT 'stripe', 'bench-old-' || i, 'bench.old', '{\"note\": \"old\"}', 'done', '\\x00', '{}', 0,
                     now() - interval '36600 days', now() - interval '36600 days'
                 FROM generate_series(1, $1) AS i",
            )
            .bind(old_rows as i64)
            .execute(pool)
            .await
            .context("seeding old rows")?;
            let alone = self.http(config, c, Load::Stripe { copies: 1 }).await?;

            let pruner = Pruner::new(pool.clone(), retention.clone());
            let stop = Arc::new(AtomicBool::new(false));
            let prune = tokio::spawn({
                let stop = stop.clone();
                async move {
                    let started = Instant::now();
                    let mut deleted = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let (pruned, short) = pruner.run_once().await?;
                        deleted += pruned.done;
                        if short {
                            break;
                        }
                    }
                    Ok::<_, anyhow::Error>((deleted, started.elapsed()))
                }
            });
            let during = self.http(config, c, Load::Stripe { copies: 1 }).await?;
            stop.store(true, Ordering::Relaxed);
            let (deleted, elapsed) = prune.await??;
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE event_id LIKE 'bench-old-%'")
                .fetch_one(pool)
                .await?;
            ensure!(deleted > 0, "the prune deleted nothing while receive ran");
            sqlx::query("DELETE FROM webhook_inbox WHERE event_id LIKE 'bench-old-%'").execute(pool).await?;
            let rate = deleted as f64 / elapsed.as_secs_f64();
            println!(
                "prune during receive, round {round}: {rate:.0} rows/s ({deleted} in {:.1} s, {left} left) | receive p99 {:.2} ms alone, {:.2} ms with prune",
                elapsed.as_secs_f64(),
                alone.p99,
                during.p99
            );
            rows.values.push(rate);
            without.values.push(alone.p99);
            with.values.push(during.p99);
        }
        report.sections.push(("Prune while receive runs".into(), vec![rows, without, with]));
        Ok(())
    }

    /// The relay draining outbox messages to a local HTTP sink that answers at
    /// once, then to one that answers after 50 ms, at the default concurrency.
    pub(super) async fn relay(&self, pool: &PgPool, report: &mut Report) -> Result<()> {
        let config = RelayConfig::default();
        let limits = DestinationLimits::default();
        let mut figures = Vec::new();
        for delay in [Duration::ZERO, Duration::from_millis(50)] {
            let label =
                if delay.is_zero() { "answering at once".to_string() } else { format!("answering in {delay:?}") };
            let mut f = Figure::new(
                format!(
                    "relay to an HTTP sink {label}, concurrency {}, batches of {}",
                    limits.concurrency, config.batch_size
                ),
                "messages/s",
            );
            for round in 1..=self.rounds {
                let sink = SinkServer::start(delay).await?;
                // More than the relay can send in the time given: the rate is over a full window.
                let messages = if delay.is_zero() { self.events / 2 } else { 400 * self.seconds as usize };
                sqlx::query(
                    "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key)
                     SELECT 'bench', i::text, $2::jsonb, 'bench-relay-' || i FROM generate_series(1, $1) AS i",
                )
                .bind(messages as i64)
                .bind(body("bench-relay"))
                .execute(pool)
                .await
                .context("seeding outbox messages")?;
                let http = HttpSink::new(sink.url(), limits.timeout)?;
                let relay = Relay::new(pool.clone(), vec![Destination::new("default", http)], config.clone());
                let started = Instant::now();
                let window = Duration::from_secs(self.seconds);
                let mut sent = 0;
                while started.elapsed() < window {
                    let r = relay.run_once(started + window + Duration::from_secs(15)).await?;
                    ensure!(r.retried == 0 && r.dead == 0, "the sink refused messages: {r:?}");
                    sent += r.sent;
                    if r.leased == 0 {
                        break;
                    }
                }
                let rate = sent as f64 / started.elapsed().as_secs_f64();
                let received = sink.received.load(Ordering::Relaxed);
                ensure!(received >= sent as u64, "the sink got {received} messages, the relay counted {sent} sent");
                sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'")
                    .execute(pool)
                    .await?;
                println!("{}, round {round}: {rate:.0} messages/s ({sent} sent)", f.name);
                f.values.push(rate);
            }
            figures.push(f);
        }
        report.sections.push(("Relay".into(), figures));
        Ok(())
    }
}

/// A local HTTP sink: answers 200 to every POST, after `delay`, counting them.
struct SinkServer {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
    _task: Task,
}

impl SinkServer {
    async fn start(delay: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicU64::new(0));
        let count = received.clone();
        let task = Task(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        let count = count.clone();
                        async move {
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            count.fetch_add(1, Ordering::Relaxed);
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        }));
        Ok(SinkServer { addr, received, _task: task })
    }

    fn url(&self) -> String {
        format!("http://{}/sink", self.addr)
    }
}
