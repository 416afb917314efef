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
    sinks::{HttpSink, Outgoing, RepliesFuture, Sink, SinkReply},
    Destination, DestinationLimits, Provider, PruneConfig, Pruner, ReceiveConfig, Relay, RelayConfig, Stage,
};

use super::{
    body,
    process::hold_snapshot,
    receive::{run_pgbench, Until},
    signature, Bench, Check, Figure, Load, Report, Task,
};

/// Stripe's contract written as data, as the library's differential test judges it against the coded scheme.
const STRIPE_AS_DATA: &str = include_str!("../../schemes/src/declared/stripe_as_data.toml");

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
                let scheme = schemes::Schemes::new(&catalog, &secrets).get_shared(*p).context("configured above")?;
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
            self.round(format_args!(
                "verify + events, round {round}: coded {:.0}/s | declared {:.0}/s | {:.2}",
                rates[0],
                rates[1],
                rates[1] / rates[0]
            ));
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
        let scheme = schemes::Schemes::new(&catalog, &secrets).get_shared(twilio).context("configured above")?;
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
            self.round(format_args!(
                "unsigned Twilio form, round {round}: one header {:.0}/s | 16 headers {:.0}/s | cost {:.2}x",
                rates[0],
                rates[1],
                rates[0] / rates[1]
            ));
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
            self.round(format_args!(
                "Marqeta batches, {c} in flight, round {round}: {rate:.0} items/s (p99 {:.2} ms)",
                h.p99
            ));
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
            self.round(format_args!(
                "prune during receive, round {round}: {rate:.0} rows/s ({deleted} in {:.1} s, {left} left) | receive p99 {:.2} ms alone, {:.2} ms with prune",
                elapsed.as_secs_f64(),
                alone.p99,
                during.p99
            ));
            rows.values.push(rate);
            without.values.push(alone.p99);
            with.values.push(during.p99);
        }
        report.sections.push(("Prune while receive runs".into(), vec![rows, without, with]));
        Ok(())
    }

    /// The relay against its sink's own ceiling: to a local HTTP sink
    /// answering at once, 64 in flight, beside `wrk` driving the same sink with
    /// the same body at 64 connections; to one answering in 50 ms, 256 in
    /// flight, against 256 / 50 ms; and a destination answering at once alone,
    /// then beside one answering in 5 s.
    pub(super) async fn relay(&self, pool: &PgPool, url: &str, report: &mut Report) -> Result<()> {
        let window = Duration::from_secs(self.seconds);
        let mut wrk_rate =
            Figure::new("wrk to the sink answering at once, 64 connections, the same body", "requests/s");
        let mut at_once = Figure::new("relay to the sink answering at once, concurrency 64", "messages/s");
        let mut in_process =
            Figure::new("relay to a sink in its own process (no network), concurrency 64", "messages/s");
        let mut statements =
            Figure::new("pgbench, the relay's lease (100) and record statements, 2 clients", "messages/s");
        let mut vs_wrk = Check::at_least("relay / wrk, sink answering at once, 64 in flight", 0.8);
        let mut slow = Figure::new("relay to a sink answering in 50 ms, concurrency 256", "messages/s");
        let mut vs_ceiling = Check::at_least("relay / (256 / 50 ms), sink answering in 50 ms", 0.8);
        let mut alone = Figure::new("a destination answering at once, alone, concurrency 64", "messages/s");
        let mut beside = Figure::new("the same beside a destination answering in 5 s", "messages/s");
        let mut isolated = Check::at_least("beside a 5 s destination / alone", 0.9);
        for round in 1..=self.rounds {
            let sink = SinkServer::start(Duration::ZERO).await?;
            let peer = wrk(&sink.url(), 64, self.seconds, &body("bench-relay")).await?;
            let ours = self.relay_rate(pool, &[("fast", sink.lane(), 64, self.events)], window).await?;
            let bare = self.relay_rate(pool, &[("fast", Lane::in_process(), 64, self.events)], window).await?;
            let own = self.relay_statements(pool, url).await?;
            let ceiling = 256.0 / 0.05;
            let delayed = SinkServer::start(Duration::from_millis(50)).await?;
            let queued = (ceiling * self.seconds as f64) as usize;
            let fifty = self.relay_rate(pool, &[("fast", delayed.lane(), 256, queued)], window).await?;
            let n = (self.events / 2).max(100);
            let lone = self.relay_rate(pool, &[("fast", sink.lane(), 64, n)], window).await?;
            let stuck = SinkServer::start(Duration::from_secs(5)).await?;
            let shared =
                self.relay_rate(pool, &[("fast", sink.lane(), 64, n), ("stuck", stuck.lane(), 8, 16)], window).await?;
            self.round(format_args!(
                "relay, round {round}: wrk {peer:.0}/s | relay {ours:.0}/s ({:.2}), in process {bare:.0}/s ({:.2} of its statements under pgbench, {own:.0}/s) | 50 ms sink {fifty:.0}/s ({:.2} of {ceiling:.0}) | alone {lone:.0}/s, beside a 5 s one {shared:.0}/s ({:.2})",
                ours / peer,
                bare / own,
                fifty / ceiling,
                shared / lone
            ));
            wrk_rate.values.push(peer);
            at_once.values.push(ours);
            in_process.values.push(bare);
            statements.values.push(own);
            vs_wrk.values.push(ours / peer);
            slow.values.push(fifty);
            vs_ceiling.values.push(fifty / ceiling);
            alone.values.push(lone);
            beside.values.push(shared);
            isolated.values.push(shared / lone);
        }
        report.sections.push(("Relay".into(), vec![wrk_rate, at_once, in_process, statements, slow, alone, beside]));
        report.checks.extend([vs_wrk, vs_ceiling, isolated]);
        Ok(())
    }

    /// The relay's own ceiling in PostgreSQL: its lease and record statements
    /// run by pgbench (2 clients, as the relay has its next lease and its
    /// recordings in flight) over as many messages as it could not finish in
    /// the window; messages recorded sent a second.
    async fn relay_statements(&self, pool: &PgPool, url: &str) -> Result<f64> {
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        let seeded = 40_000 * self.seconds as usize;
        seed_messages(pool, "fast", seeded).await?;
        sqlx::query("VACUUM ANALYZE transactional_outbox").execute(pool).await?;
        let started = Instant::now();
        run_pgbench(url, 2, &relay_statements_script(), Until::Seconds(self.seconds)).await?;
        let took = started.elapsed();
        let (sent,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%' AND processed_at IS NOT NULL",
        )
        .fetch_one(pool)
        .await?;
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        ensure!(sent > 0, "pgbench recorded no message of the relay's statements as sent");
        ensure!(
            (sent as usize) < seeded,
            "pgbench sent all {seeded} seeded messages before its window ended: seed more"
        );
        Ok(sent as f64 / took.as_secs_f64())
    }

    /// Seeds each destination's messages, runs one relay over all of them,
    /// and answers the first destination's rate: its messages over the time
    /// its sink took to receive them all (or what it received in `window`).
    async fn relay_rate(
        &self,
        pool: &PgPool,
        destinations: &[(&str, Lane, usize, usize)],
        window: Duration,
    ) -> Result<f64> {
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        sqlx::query("DELETE FROM relay_destinations").execute(pool).await?;
        let mut lanes = Vec::new();
        for (name, sink, concurrency, messages) in destinations {
            seed_messages(pool, name, *messages).await?;
            let limits = DestinationLimits {
                concurrency: *concurrency,
                timeout: Duration::from_secs(10),
                ..DestinationLimits::default()
            };
            let sink: Arc<dyn Sink> = match &sink.url {
                Some(url) => Arc::new(HttpSink::new(url.clone(), limits.timeout)?),
                None => Arc::new(Counted(sink.received.clone())),
            };
            lanes.push(Destination::shared(*name, sink).with_limits(limits));
        }
        sqlx::query("VACUUM ANALYZE transactional_outbox").execute(pool).await?;
        let (_, first, _, total) = &destinations[0];
        let before = first.received.load(Ordering::Relaxed);
        let relay = Relay::new(pool.clone(), lanes, RelayConfig::default());
        let started = Instant::now();
        let deadline = started + window + Duration::from_secs(10);
        let run = tokio::spawn(async move { relay.run(deadline).await });
        let mut received = 0;
        while started.elapsed() < window {
            received = first.received.load(Ordering::Relaxed) - before;
            if received >= *total as u64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = received as f64 / started.elapsed().as_secs_f64();
        run.abort();
        let _ = run.await;
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        sqlx::query("DELETE FROM relay_destinations").execute(pool).await?;
        Ok(rate)
    }
}

impl Bench {
    /// The relay draining `--events` messages to a sink in its own process
    /// (concurrency 64), with a snapshot held open from after they were
    /// written to the drain's end (`holding`), or without: messages/s.
    pub(super) async fn relay_drain(&self, pool: &PgPool, holding: bool) -> Result<f64> {
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        sqlx::query("DELETE FROM relay_destinations").execute(pool).await?;
        seed_messages(pool, "fast", self.events).await?;
        sqlx::query("VACUUM ANALYZE transactional_outbox").execute(pool).await?;
        let snapshot = if holding { Some(hold_snapshot(pool).await?) } else { None };
        let received = Arc::new(AtomicU64::new(0));
        let limits = DestinationLimits { concurrency: 64, timeout: Duration::from_secs(10), ..Default::default() };
        let sink = Destination::new("fast", Counted(received.clone())).with_limits(limits);
        let relay = Relay::new(pool.clone(), vec![sink], RelayConfig::default());
        let started = Instant::now();
        let relayed = relay.run(started + Duration::from_secs(3600)).await?;
        let elapsed = started.elapsed().as_secs_f64();
        if let Some(tx) = snapshot {
            tx.rollback().await?;
        }
        let sent = received.load(Ordering::Relaxed) as usize;
        ensure!(
            relayed.sent == self.events && sent == self.events,
            "the relay sent {} of {} messages ({sent} arrived)",
            relayed.sent,
            self.events
        );
        sqlx::query("DELETE FROM transactional_outbox WHERE message_key LIKE 'bench-relay-%'").execute(pool).await?;
        sqlx::query("DELETE FROM relay_destinations").execute(pool).await?;
        Ok(self.events as f64 / elapsed)
    }
}

/// Seeds `n` unsent messages of about 1.5 KB for `destination`.
async fn seed_messages(pool: &PgPool, destination: &str, n: usize) -> Result<()> {
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination)
         SELECT 'bench', i::text, $2::jsonb, 'bench-relay-' || $3 || '-' || i, $3
         FROM generate_series(1, $1) AS i",
    )
    .bind(n as i64)
    .bind(body("bench-relay"))
    .bind(destination)
    .execute(pool)
    .await
    .context("seeding outbox messages")?;
    Ok(())
}

/// A pgbench script doing what the relay asks of PostgreSQL for each 100
/// messages to destination `fast`, each statement as `db::outbox` writes it:
/// the lease (its payloads fetched), then every result recorded as sent.
fn relay_statements_script() -> String {
    let lease = "WITH batch AS (SELECT id FROM transactional_outbox AS o \
         WHERE destination = 'fast' AND processed_at IS NULL AND dead_at IS NULL \
         AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
         AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM transactional_outbox AS e \
         WHERE e.destination = o.destination AND e.ordering_key = o.ordering_key AND e.id < o.id \
         AND e.processed_at IS NULL AND e.dead_at IS NULL)) ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED), \
         leased AS (UPDATE transactional_outbox AS o \
         SET attempts = o.attempts + 1, next_attempt_at = now() + 300000 * interval '1 millisecond' \
         FROM batch WHERE o.id = batch.id \
         RETURNING o.id, o.aggregate_type, o.aggregate_id, o.payload, o.message_key, o.destination, o.ordering_key, \
         o.attempts, o.trace_context) \
         SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempts), '{}') AS leases, \
         array_fill('sent'::text, ARRAY[count(*)::int]) AS outcomes, \
         array_fill(NULL::bigint, ARRAY[count(*)::int]) AS delays, array_fill(NULL::text, ARRAY[count(*)::int]) AS reasons, \
         array_agg(payload) AS payloads, array_agg(message_key) AS keys FROM leased";
    let record = "UPDATE transactional_outbox AS o \
         SET processed_at = CASE WHEN r.outcome = 'sent' THEN now() END, \
         dead_at = CASE WHEN r.outcome = 'dead' THEN now() END, \
         next_attempt_at = CASE WHEN r.outcome = 'retry' THEN now() + r.delay_ms * interval '1 millisecond' END, \
         last_error = r.reason || CASE WHEN r.outcome = 'dead' AND o.ordering_key IS NOT NULL THEN coalesce(( \
         SELECT format(' (it held back %s later message(s) of its ordering key until now)', count(*)) \
         FROM transactional_outbox AS l WHERE l.destination = o.destination AND l.ordering_key = o.ordering_key \
         AND l.id > o.id AND l.processed_at IS NULL AND l.dead_at IS NULL HAVING count(*) > 0), '') ELSE '' END \
         FROM unnest(:ids::bigint[], :outcomes::text[], :delays::bigint[], :reasons::text[], :leases::int[]) \
         AS r (id, outcome, delay_ms, reason, lease) \
         WHERE o.id = ANY(:ids::bigint[]) AND o.id = r.id AND o.attempts = r.lease \
         AND o.processed_at IS NULL AND o.dead_at IS NULL;";
    format!("{lease}\n\\gset\n{record}\n")
}

/// `wrk` POSTing `body` to `url` at `connections` for `seconds`: requests a second.
async fn wrk(url: &str, connections: usize, seconds: u64, body: &str) -> Result<f64> {
    let script = std::env::temp_dir().join(format!("inbox-bench-wrk-{}.lua", std::process::id()));
    let lua = format!(
        "wrk.method = \"POST\"\nwrk.body = {body:?}\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"Idempotency-Key\"] = \"bench-relay-1\"\n"
    );
    std::fs::write(&script, lua)?;
    let out = tokio::process::Command::new("wrk")
        .args(["-t", "2", "-c", &connections.to_string(), "-d", &format!("{seconds}s"), "-s"])
        .arg(&script)
        .arg(url)
        .output()
        .await
        .context("running wrk (`apt-get install wrk`; scripts/test does)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "wrk failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:")?.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk's output: {stdout}"))
}

struct SinkServer {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
    _task: Task,
}

/// A local HTTP/1.1 server on a free port: each request handed to
/// `on_request`, then answered `{}`. It stops when the task is dropped.
pub(super) async fn local_sink<F, Fut>(on_request: F) -> Result<(SocketAddr, Task)>
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = Task(tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let on_request = on_request.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let on_request = on_request.clone();
                    async move {
                        on_request(req).await;
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    }));
    Ok((addr, task))
}

impl SinkServer {
    async fn start(delay: Duration) -> Result<Self> {
        let received = Arc::new(AtomicU64::new(0));
        let count = received.clone();
        let (addr, task) = local_sink(move |_| {
            let count = count.clone();
            async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
        })
        .await?;
        Ok(SinkServer { addr, received, _task: task })
    }

    fn url(&self) -> String {
        format!("http://{}/sink", self.addr)
    }

    fn lane(&self) -> Lane {
        Lane { url: Some(self.url()), received: self.received.clone() }
    }
}

/// Where a destination of the relay rounds sends, and its count of what arrived.
struct Lane {
    /// The HTTP sink's URL, or none for a [`Counted`] sink in the relay's process.
    url: Option<String>,
    received: Arc<AtomicU64>,
}

impl Lane {
    fn in_process() -> Self {
        Lane { url: None, received: Arc::default() }
    }
}

/// A sink in the relay's own process that takes every message at once: the
/// relay's rate with no network and no HTTP, what its database work allows.
struct Counted(Arc<AtomicU64>);

impl Sink for Counted {
    fn target(&self) -> String {
        "in process".into()
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        self.0.fetch_add(messages.len() as u64, Ordering::Relaxed);
        Box::pin(std::future::ready(vec![SinkReply::Delivered; messages.len()]))
    }
}
