//! A storm of ordinary and hostile deliveries over HTTP: every ordinary effect
//! applied, every hostile one answered and kept or refused.

use std::time::Duration;

use inbox_tests::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::Stage;

use crate::hostile::{nested, payment, payment_with, worker};

/// One HTTP/1.1 POST on its own connection; the status code and the body.
async fn http_post(addr: std::net::SocketAddr, path: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head =
        format!("POST {path} HTTP/1.1\r\nHost: inbox\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

#[derive(Clone)]
struct Post {
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    /// The status it must get.
    expect: u16,
}

fn stripe_post(body: String) -> Post {
    let sig = stripe_header(STRIPE[0], body.as_bytes());
    Post { path: "/webhooks/stripe", headers: vec![("Stripe-Signature", sig)], body: body.into_bytes(), expect: 200 }
}

fn shopify_post(delivery: &str, body: String) -> Post {
    let headers = vec![
        ("X-Shopify-Hmac-Sha256", shopify_hmac(SHOPIFY[0], body.as_bytes())),
        ("X-Shopify-Webhook-Id", delivery.to_string()),
        ("X-Shopify-Topic", "orders/create".to_string()),
    ];
    Post { path: "/webhooks/shopify", headers, body: body.into_bytes(), expect: 200 }
}

fn marqeta_post(body: String) -> Post {
    let headers = vec![("Authorization", marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]))];
    Post { path: "/webhooks/marqeta", headers, body: body.into_bytes(), expect: 200 }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_storm_of_ordinary_and_hostile_deliveries_applies_every_ordinary_effect(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id) VALUES ('acct_storm')").execute(&pool).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = std::sync::Arc::new(receiver(opts, secrets(false)));
    let timeouts = webhook_inbox_service::serve::Limits {
        header_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook_inbox_service::serve::webhooks(listener, receiver, timeouts, async {
        let _ = stopped.await;
    }));
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let w = worker(&pool);
    let worker_task = tokio::spawn(async move {
        w.run_until(Duration::from_millis(10), async {
            let _ = worker_stopped.await;
        })
        .await
    });

    // Ordinary: 150 payments, 100 orders, 50 deposits; a third of them sent twice.
    let mut posts = Vec::new();
    for i in 0..150 {
        posts.push(stripe_post(payment(&format!("evt_pay_{i}"), &format!("pi_storm_{i}"))));
    }
    for i in 0..100 {
        let order = json!({"id": 9000 + i, "customer": {"id": 7}, "financial_status": "paid", "total_price": "10.00", "updated_at": "2026-11-30T00:00:00Z"});
        posts.push(shopify_post(&format!("delivery-{i}"), order.to_string()));
    }
    for i in 0..50 {
        let item = json!({"token": format!("dep_storm_{i}"), "type": "gpa.credit", "state": "COMPLETION", "user_token": "acct_storm", "amount": 2});
        posts.push(marqeta_post(json!({ "transactions": [item] }).to_string()));
    }
    let resent: Vec<Post> = posts.iter().step_by(3).cloned().collect();
    posts.extend(resent);

    // Hostile, each class of issue 7 (signed, so they reach the claim).
    let (mut tiny, mut size) = (Vec::new(), 0);
    while size < 1_000_000 {
        let item = format!(r#"{{"token":"t{}"}}"#, tiny.len());
        size += item.len() + 1;
        tiny.push(item);
    }
    let hostile = vec![
        stripe_post(payment_with("evt_h_deep", "pi_h1", &nested(200))),
        stripe_post(payment_with("evt_h_abyss", "pi_h2", &nested(100_000))),
        stripe_post(payment_with("evt_h_huge", "pi_h3", r#"{"n":1e400}"#)),
        stripe_post(payment_with("evt_h_surrogate", "pi_h4", r#""\ud800""#)),
        stripe_post(payment_with("evt_h_nul", "pi_h5", r#""a\u0000b""#)),
        stripe_post("<xml>not json</xml>".into()),
        marqeta_post(format!(r#"{{"transactions":[{}]}}"#, tiny.join(","))),
        marqeta_post(format!(
            r#"{{"transactions":[{{"token":"h_ok","type":"authorization"}},{{"token":"h_bad","n":{}}}]}}"#,
            nested(300)
        )),
        Post {
            path: "/webhooks/stripe",
            headers: vec![("Stripe-Signature", "t=1,v1=00".into())],
            body: payment("evt_h_forged", "pi_h6").into_bytes(),
            expect: 401,
        },
        Post { path: "/webhooks/paypal", headers: vec![], body: b"{}".to_vec(), expect: 404 },
    ];
    let hostile_count = hostile.len();
    posts.extend(hostile);
    // Shuffle deterministically, so the hostile ones land among the ordinary.
    let n = posts.len();
    for i in 0..n {
        posts.swap(i, (i * 7919 + 13) % n);
    }

    // Slow clients hold connections meanwhile.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut s, b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        slow.push(s);
    }

    let queue = std::sync::Arc::new(tokio::sync::Mutex::new(posts));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let queue = queue.clone();
        clients.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            loop {
                let Some(p) = queue.lock().await.pop() else {
                    return wrong;
                };
                let (status, answer) = http_post(addr, p.path, &p.headers, &p.body).await;
                if status != p.expect {
                    wrong.push(format!("{} expected {} got {status}: {answer}", p.path, p.expect));
                }
            }
        }));
    }
    for c in clients {
        let wrong = c.await.unwrap();
        assert!(wrong.is_empty(), "{wrong:?}");
    }

    let settled = eventually(|| async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    assert!(settled, "every event ends done or failed");
    let (payments, orders, balance): (i64, i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM payments WHERE payment_id LIKE 'pi_storm_%'), (SELECT count(*) FROM orders),
                (SELECT balance::text FROM accounts WHERE account_id = 'acct_storm')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((payments, orders, balance.as_str()), (150, 100, "100.00"), "every ordinary effect, once");
    let failed: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, failure_reason FROM webhook_inbox WHERE status = 'failed' ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let ids: Vec<&str> = failed.iter().map(|f| f.0.as_str()).collect();
    for id in ["evt_h_abyss", "evt_h_deep", "evt_h_huge", "evt_h_nul", "evt_h_surrogate", "transactions:h_bad"] {
        assert!(ids.contains(&id), "{id} failed with its reason: {failed:?}");
    }
    assert_eq!(failed.len(), 8, "the six, the XML body and the oversized batch (by digest): {failed:?}");
    assert!(failed.iter().all(|(_, why)| !why.is_empty()));
    assert_eq!(hostile_count, 10);

    // Still up, and still answering whoever comes next.
    let (status, _) = http_post(
        addr,
        "/webhooks/stripe",
        &stripe_post(payment("evt_after", "pi_after")).headers,
        payment("evt_after", "pi_after").as_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    drop(slow);
    let _ = stop.send(());
    let _ = stop_worker.send(());
    server.await.unwrap().unwrap();
    worker_task.await.unwrap();
}
