//! The storm `inbox demo` and the fault suite fire: deliveries signed exactly as
//! each provider signs, with 1 to 3 concurrent copies and late retries, Stripe
//! twin events, Shopify snapshots out of order, Marqeta batches with repeated
//! items, forgeries and one poison event; what they should leave in the
//! database; and the checks of that.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use sqlx::PgPool;
use tokio::net::TcpListener;

use webhook_inbox::config::{DEV_MARQETA_PASSWORD, DEV_MARQETA_USERNAME, DEV_SHOPIFY, DEV_STRIPE};

/// A deterministic generator (xorshift64*): the same storm every run.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// One HTTP delivery as a provider would make it.
#[derive(Clone, Debug)]
pub(crate) struct Delivery {
    pub provider: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// Signed with the wrong secret on purpose: must get 401 and store nothing.
    pub forged: bool,
}

/// What the storm should leave behind.
#[derive(Default, Debug)]
pub(crate) struct Expected {
    /// Every validly signed event, by (provider, event_id).
    pub events: BTreeSet<(String, String)>,
    /// Events sent with a bad signature only.
    pub forged: BTreeSet<(String, String)>,
    /// PaymentIntent -> amount.
    pub payments: BTreeMap<String, i64>,
    /// The poison event's id.
    pub poison: String,
    /// Order -> (updated_at, status, total) of its newest snapshot.
    pub orders: BTreeMap<String, (String, String, String)>,
    /// Deposit token -> (account, amount in cents).
    pub deposits: BTreeMap<String, (String, i64)>,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn stripe(body: String, secret: &str) -> Delivery {
    let sig = webhook_inbox_service::dev::stripe_signature(secret, now(), body.as_bytes());
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
pub(crate) fn storm(size: usize, rng: &mut Rng) -> (Vec<Vec<Delivery>>, Expected) {
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

/// Waits until nothing is pending and nothing waits in the outbox; false after `limit`.
pub(crate) async fn wait_settled(pool: &PgPool, limit: Duration) -> Result<bool, sqlx::Error> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let gauges = webhook_inbox::ops::gauges(pool).await?;
        if gauges.inbox.pending == 0 && gauges.outbox.backlog == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

/// Each invariant of the database against what the storm should leave, and
/// whether it holds; `refused` is how many deliveries got 401.
pub(crate) async fn check(
    pool: &PgPool,
    expected: &Expected,
    refused: usize,
) -> Result<Vec<(bool, String)>, sqlx::Error> {
    let mut checks = Vec::new();
    let rows: BTreeSet<(String, String)> =
        sqlx::query_as("SELECT provider, event_id FROM webhook_inbox").fetch_all(pool).await?.into_iter().collect();
    checks.push((
        rows == expected.events,
        format!("inbox rows = unique signed events: {} rows, {} expected", rows.len(), expected.events.len()),
    ));
    let forged_stored = expected.forged.intersection(&rows).count();
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
        match &poison {
            Some((status, Some(reason))) => format!("the poison event is {status} with its reason: {reason}"),
            Some((status, None)) => format!("the poison event is {status}, without a reason"),
            None => "the poison event is missing".into(),
        },
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
    Ok(checks)
}

/// The relay's HTTP sink in the demo and the fault suite: a consumer that
/// keeps every body it accepts under its `Idempotency-Key` (a consumer that
/// deduplicates applies the first), and may refuse every n-th request with 503.
#[derive(Debug, Default)]
pub(crate) struct Consumer {
    pub requests: usize,
    pub refused: usize,
    /// message_key -> every body accepted under it (the relay may send one twice).
    pub accepted: HashMap<String, Vec<bytes::Bytes>>,
    /// Each message key, in the order it was first accepted.
    pub order: Vec<String>,
}

impl Consumer {
    /// Serves on a free loopback port; its URL, and its state as it fills.
    /// Each answer takes 0 to 19 ms (by its key), as a real consumer's does:
    /// the relay has messages in flight whenever it is stopped.
    pub(crate) async fn start(refuse_every: Option<usize>) -> std::io::Result<(String, Arc<Mutex<Consumer>>)> {
        use http_body_util::{BodyExt, Full};
        use hyper::{server::conn::http1, service::service_fn, Response, StatusCode};

        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/outbox", listener.local_addr()?);
        let consumer = Arc::new(Mutex::new(Consumer::default()));
        let state = consumer.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move {
                            let key =
                                req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(String::from);
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let spread =
                                key.as_deref().unwrap_or("").bytes().fold(0u64, |h, b| h.wrapping_mul(31) + b as u64);
                            tokio::time::sleep(std::time::Duration::from_millis(spread % 20)).await;
                            let mut s = state.lock().expect("the consumer's state");
                            s.requests += 1;
                            // A refused request is retried by the relay later, under the same key.
                            let status = if refuse_every.is_some_and(|n| s.requests % n == 0) {
                                s.refused += 1;
                                StatusCode::SERVICE_UNAVAILABLE
                            } else {
                                let key = key.unwrap_or_default();
                                if !s.accepted.contains_key(&key) {
                                    s.order.push(key.clone());
                                }
                                s.accepted.entry(key).or_default().push(body);
                                StatusCode::OK
                            };
                            let mut response = Response::new(Full::new(bytes::Bytes::new()));
                            *response.status_mut() = status;
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Ok((url, consumer))
    }
}
