//! `inbox demo`: the whole pipeline, and its guarantees, in a minute. It starts
//! the stack (receive over HTTP, the worker, the relay to a sink that fails now
//! and then), fires a storm signed exactly as each provider signs, waits for
//! the pipeline to settle, and checks the invariants against what it sent.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::{server::conn::http1, service::service_fn, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use sha2::Sha256;
use sqlx::PgPool;
use tokio::net::TcpListener;
use webhook_inbox::{
    config::{Secrets, DEV_MARQETA_PASSWORD, DEV_MARQETA_USERNAME, DEV_SHOPIFY, DEV_STRIPE},
    core::http::http_client,
    db::{self, inbox, outbox},
    dev::server,
    process::{
        handlers::Handlers,
        worker::{Worker, WorkerConfig},
    },
    relay::{HttpSink, Relay, RelayConfig, Sink},
    runtime::stage::Stage,
    ReceiveConfig, Receiver,
};

/// The storm's size: PaymentIntents; orders and Marqeta batches scale with it.
pub struct Demo {
    pub payments: usize,
}

/// A deterministic generator (xorshift64*): the same storm every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// One HTTP delivery as a provider would make it.
#[derive(Clone)]
struct Delivery {
    provider: &'static str,
    headers: Vec<(&'static str, String)>,
    body: String,
    /// Signed with the wrong secret on purpose: must get 401 and store nothing.
    forged: bool,
}

/// What the storm should leave behind.
#[derive(Default)]
struct Expected {
    /// Every validly signed event, by (provider, event_id).
    events: BTreeSet<(String, String)>,
    /// Events sent with a bad signature only.
    forged: BTreeSet<(String, String)>,
    /// PaymentIntent -> amount.
    payments: BTreeMap<String, i64>,
    /// The poison event's id.
    poison: String,
    /// Order -> (updated_at, status, total) of its newest snapshot.
    orders: BTreeMap<String, (String, String, String)>,
    /// Deposit token -> (account, amount in cents).
    deposits: BTreeMap<String, (String, i64)>,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn stripe(body: String, secret: &str) -> Delivery {
    let t = now();
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    let sig = format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()));
    Delivery { provider: "stripe", headers: vec![("stripe-signature", sig)], body, forged: secret != DEV_STRIPE }
}

fn shopify(webhook_id: &str, topic: &str, body: String) -> Delivery {
    let mut mac = Hmac::<Sha256>::new_from_slice(DEV_SHOPIFY.as_bytes()).expect("any key length");
    mac.update(body.as_bytes());
    let headers = vec![
        ("x-shopify-hmac-sha256", B64.encode(mac.finalize().into_bytes())),
        ("x-shopify-webhook-id", webhook_id.to_string()),
        ("x-shopify-topic", topic.to_string()),
    ];
    Delivery { provider: "shopify", headers, body, forged: false }
}

fn marqeta(body: String) -> Delivery {
    let basic = B64.encode(format!("{DEV_MARQETA_USERNAME}:{DEV_MARQETA_PASSWORD}"));
    Delivery { provider: "marqeta", headers: vec![("authorization", format!("Basic {basic}"))], body, forged: false }
}

/// The storm: every delivery (copies included) in the order they go out, and what it should leave.
fn storm(size: usize, rng: &mut Rng) -> (Vec<Vec<Delivery>>, Expected) {
    let mut expected = Expected::default();
    let mut waves: Vec<Vec<Delivery>> = vec![Vec::new(), Vec::new()];
    let send = |rng: &mut Rng, d: Delivery, waves: &mut Vec<Vec<Delivery>>| {
        // 1 to 3 concurrent copies now, and one late retry in the second wave for a fifth of them.
        for _ in 0..1 + rng.below(3) {
            waves[0].push(d.clone());
        }
        if rng.below(5) == 0 {
            waves[1].push(d);
        }
    };

    // Stripe: one payment_intent.succeeded per PaymentIntent, and a twin event (another id) for a fourth.
    for i in 0..size {
        let pi = format!("pi_demo_{i}");
        let amount = 1000 + 25 * i as i64;
        expected.payments.insert(pi.clone(), amount);
        let twins = if i % 4 == 0 { 2 } else { 1 };
        for twin in 0..twins {
            let id = format!("evt_demo_{i}_{twin}");
            expected.events.insert(("stripe".into(), id.clone()));
            let body = json!({"id": id, "object": "event", "type": "payment_intent.succeeded",
                "data": {"object": {"id": pi, "object": "payment_intent", "amount_received": amount, "currency": "usd"}}});
            send(rng, stripe(body.to_string(), DEV_STRIPE), &mut waves);
        }
    }
    // One poison event: validly signed, but no handler can apply it.
    expected.poison = "evt_demo_poison".into();
    expected.events.insert(("stripe".into(), expected.poison.clone()));
    let poison = json!({"id": expected.poison, "type": "payment_intent.succeeded",
        "data": {"object": {"id": "pi_poison", "amount_received": "a lot", "currency": "usd"}}});
    send(rng, stripe(poison.to_string(), DEV_STRIPE), &mut waves);
    // Forgeries: a wrong secret, never stored.
    for i in 0..size / 4 + 1 {
        let id = format!("evt_forged_{i}");
        expected.forged.insert(("stripe".into(), id.clone()));
        let body = json!({"id": id, "type": "payment_intent.succeeded",
            "data": {"object": {"id": format!("pi_forged_{i}"), "amount_received": 1, "currency": "usd"}}});
        waves[0].push(stripe(body.to_string(), "whsec_not_the_secret"));
    }

    // Shopify: three snapshots of each order, sent out of order, each with its own webhook id.
    let statuses = ["pending", "authorized", "paid"];
    for o in 0..size / 2 + 1 {
        let order = format!("{}", 820_000 + o);
        for (v, status) in statuses.iter().enumerate() {
            let updated_at = format!("2026-11-30T08:{:02}:00Z", 10 * v + o % 10);
            let total = format!("{}.{:02}", 10 + o, 5 * v);
            let webhook_id = format!("wh_demo_{o}_{v}");
            expected.events.insert(("shopify".into(), webhook_id.clone()));
            if v == statuses.len() - 1 {
                expected.orders.insert(order.clone(), (updated_at.clone(), status.to_string(), total.clone()));
            }
            let body = json!({"id": order.parse::<u64>().unwrap(), "financial_status": status,
                "total_price": total, "updated_at": updated_at, "customer": {"id": 77}});
            send(rng, shopify(&webhook_id, "orders/updated", body.to_string()), &mut waves);
        }
    }

    // Marqeta: batches of 10 deposits to five accounts, a third of each batch repeating earlier items.
    let mut items: Vec<(String, String, i64)> = Vec::new();
    for b in 0..size / 5 + 1 {
        let mut batch = Vec::new();
        for k in 0..10 {
            let item = if !items.is_empty() && rng.below(3) == 0 {
                items[rng.below(items.len())].clone()
            } else {
                let token = format!("dep_{b}_{k}");
                let item = (token, format!("acct_demo_{}", rng.below(5)), 100 + rng.below(900) as i64);
                items.push(item.clone());
                item
            };
            expected.events.insert(("marqeta".into(), format!("transactions:{}", item.0)));
            expected.deposits.insert(item.0.clone(), (item.1.clone(), item.2));
            batch.push(json!({"token": item.0, "type": "gpa.credit", "state": "COMPLETION", "user_token": item.1,
                "amount": format!("{}.{:02}", item.2 / 100, item.2 % 100)}));
        }
        send(rng, marqeta(json!({"transactions": batch}).to_string()), &mut waves);
    }
    rng.shuffle(&mut waves[0]);
    rng.shuffle(&mut waves[1]);
    (waves, expected)
}

/// The relay's HTTP sink: a consumer that deduplicates on the key, and answers
/// 503 to every seventh request.
#[derive(Default)]
struct Consumer {
    requests: usize,
    refused: usize,
    /// message_key -> every body accepted under it (the relay may send one twice).
    accepted: HashMap<String, Vec<Bytes>>,
}

async fn start_sink() -> Result<(String, Arc<Mutex<Consumer>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/outbox", listener.local_addr()?);
    let sink = Arc::new(Mutex::new(Consumer::default()));
    let state = sink.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let state = state.clone();
                    async move {
                        let key = req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(String::from);
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let mut s = state.lock().expect("the consumer's state");
                        s.requests += 1;
                        // Every seventh request fails: the relay retries it later, under the same key.
                        let status = if s.requests % 7 == 0 {
                            s.refused += 1;
                            StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            s.accepted.entry(key.unwrap_or_default()).or_default().push(body);
                            StatusCode::OK
                        };
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok((url, sink))
}

impl Demo {
    /// Runs the demo on `config`'s database; true when every invariant holds.
    pub async fn run(&self, config: ReceiveConfig) -> Result<bool> {
        let pool = db::pool(&config.db)?;
        db::MIGRATOR.run(&pool).await.context("applying migrations")?;
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
        let receiver = Arc::new(Receiver::new(db::Connections::new(&receive.db)?, &receive));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}/webhooks", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::watch::channel(());
        let until = |mut stopped: tokio::sync::watch::Receiver<()>| async move {
            let _ = stopped.changed().await;
        };
        let server = tokio::spawn(server::serve(listener, receiver, until(stopped.clone())));
        let worker_config = WorkerConfig { poll: Duration::from_millis(50), ..WorkerConfig::default() };
        let worker = Worker::new(pool.clone(), Handlers::reference(), worker_config);
        let worker = tokio::spawn({
            let stopped = until(stopped.clone());
            async move { worker.run_until(Duration::from_millis(50), stopped).await }
        });
        let (sink_url, sink) = start_sink().await?;
        let relay_config = RelayConfig { retry_base: Duration::from_millis(50), ..RelayConfig::default() };
        let http_sink: Arc<dyn Sink> = Arc::new(HttpSink::new(&sink_url, Duration::from_secs(5))?);
        let relay = Relay::new(pool.clone(), vec![http_sink], relay_config);
        let relay = tokio::spawn({
            let stopped = until(stopped.clone());
            async move { relay.run_until(Duration::from_millis(50), stopped).await }
        });

        let started = Instant::now();
        let (waves, expected) = storm(self.payments, &mut Rng(0x5eed_1234_abcd_ef01));
        let client = http_client(Duration::from_secs(30))?;
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
        let settled = wait_settled(&pool, Duration::from_secs(60)).await?;
        let _ = stop.send(());
        let _ = tokio::join!(server, worker, relay);
        println!("settled in {:.1} s{}", started.elapsed().as_secs_f64(), if settled { "" } else { " (TIMED OUT)" });

        let held: (i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM webhook_inbox), (SELECT count(*) FROM webhook_inbox WHERE status = 'done'),
                    (SELECT count(*) FROM webhook_inbox WHERE status = 'failed'), (SELECT count(*) FROM payments),
                    (SELECT count(*) FROM orders), (SELECT count(*) FROM account_deposits),
                    (SELECT count(*) FROM transactional_outbox WHERE processed_at IS NOT NULL)",
        )
        .fetch_one(&pool)
        .await?;
        println!(
            "the database holds {} inbox rows ({} done, {} failed), {} payments, {} orders, {} deposits, {} outbox messages sent",
            held.0, held.1, held.2, held.3, held.4, held.5, held.6
        );
        let consumer = std::mem::take(&mut *sink.lock().expect("the consumer's state"));
        let checks = check(&pool, &expected, &consumer, &sent).await?;
        let mut all = settled;
        for (ok, what) in &checks {
            println!("{} {what}", if *ok { "ok  " } else { "FAIL" });
            all &= ok;
        }
        println!("{}", if all { "every invariant holds" } else { "SOME INVARIANT FAILED" });
        Ok(all)
    }
}

async fn wait_settled(pool: &PgPool, limit: Duration) -> Result<bool> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let inbox = inbox::gauges(pool).await?;
        let outbox = outbox::gauges(pool).await?;
        if inbox.pending == 0 && outbox.backlog == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// Each invariant, and whether it holds.
async fn check(
    pool: &PgPool,
    expected: &Expected,
    consumer: &Consumer,
    sent: &BTreeMap<(&str, u16), usize>,
) -> Result<Vec<(bool, String)>> {
    let mut checks = Vec::new();
    let rows: BTreeSet<(String, String)> =
        sqlx::query_as("SELECT provider, event_id FROM webhook_inbox").fetch_all(pool).await?.into_iter().collect();
    checks.push((
        rows == expected.events,
        format!("inbox rows = unique signed events: {} rows, {} expected", rows.len(), expected.events.len()),
    ));
    let forged_stored = expected.forged.intersection(&rows).count();
    let refused = sent.iter().filter(|((_, s), _)| *s == 401).map(|(_, n)| n).sum::<usize>();
    checks.push((
        forged_stored == 0 && refused == expected.forged.len(),
        format!("forged deliveries: {refused} refused with 401, {forged_stored} stored"),
    ));

    let payments: BTreeMap<String, i64> =
        sqlx::query_as("SELECT payment_id, amount FROM payments").fetch_all(pool).await?.into_iter().collect();
    checks.push((
        payments == expected.payments,
        format!("payments = unique PaymentIntents: {} payments, {} expected", payments.len(), expected.payments.len()),
    ));
    let poison: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, failure_reason FROM webhook_inbox WHERE provider = 'stripe' AND event_id = $1")
            .bind(&expected.poison)
            .fetch_optional(pool)
            .await?;
    checks.push((
        matches!(&poison, Some((s, Some(_))) if s == "failed"),
        format!("the poison event is failed with its reason: {poison:?}"),
    ));

    let orders: BTreeMap<String, (String, String, String)> = sqlx::query_as(
        "SELECT order_id, to_char(source_updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), status, total_amount::text FROM orders",
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(id, at, status, total): (String, String, String, String)| (id, (at, status, total)))
    .collect();
    checks.push((
        orders == expected.orders,
        format!("orders = their newest snapshot, whatever the arrival order: {} orders", orders.len()),
    ));

    let deposits: i64 = sqlx::query_scalar("SELECT count(*) FROM account_deposits").fetch_one(pool).await?;
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for (account, cents) in expected.deposits.values() {
        *want.entry(account.clone()).or_default() += cents;
    }
    let balances: BTreeMap<String, i64> =
        sqlx::query_as("SELECT account_id, (balance * 100)::bigint FROM accounts WHERE balance > 0")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    checks.push((
        deposits as usize == expected.deposits.len() && balances == want,
        format!(
            "balances = sum of unique deposits: {deposits} deposits credited, {} unique sent, {} accounts match",
            expected.deposits.len(),
            balances.iter().filter(|(a, b)| want.get(*a) == Some(b)).count()
        ),
    ));

    let keys: Vec<String> = sqlx::query_scalar("SELECT message_key FROM transactional_outbox").fetch_all(pool).await?;
    let unique: BTreeSet<&String> = keys.iter().collect();
    let effects = expected.payments.len() + expected.deposits.len();
    checks.push((
        keys.len() == effects && unique.len() == keys.len(),
        format!("one outbox message per effect: {} messages, {effects} effects", keys.len()),
    ));
    // The consumer applies the first body under each key and drops the rest, which is
    // safe only if every copy under a key is the same message.
    let delivered: BTreeSet<&String> = consumer.accepted.keys().collect();
    let copies = consumer.accepted.values().map(Vec::len).sum::<usize>() - delivered.len();
    let consistent = consumer.accepted.values().all(|bodies| bodies.iter().all(|b| b == &bodies[0]));
    checks.push((
        delivered == unique && consistent,
        format!(
            "every message delivered and applied once per key: {} keys from {} requests ({} refused by the sink and retried, {copies} repeats dropped)",
            delivered.len(),
            consumer.requests,
            consumer.refused
        ),
    ));
    Ok(checks)
}
