//! Receive's replay guard and the secret that verified: a signed body sent
//! again under another id, concurrent replays, a repeated signature header,
//! the secret recorded by fingerprint.

use std::sync::Arc;

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tokio::sync::Barrier;
use webhook_inbox::Receiver;
use webhook_inbox_schemes::Provider;

use crate::receive::stripe_body;

/// A signature header sent twice (a stale signature and a good one, as a
/// sender mid-rotation may) verified at receive; the kept headers must
/// re-verify the same way, each value on its own, not as one joined value.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_repeated_signature_header_re_verifies_as_receive_read_it(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let cfg = config(secrets(false));
    let r = Receiver::connect_with(opts, &cfg);
    let schemes = webhook_inbox_schemes::Schemes::new(&cfg.catalog, &cfg.secrets);
    let github = br#"{"action":"opened","number":1}"#;
    let stripe = stripe_body("evt_repeated");
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, String)>, &'a [u8]);
    let cases: [Case<'_>; 2] = [
        (
            "github",
            "gh-repeated",
            vec![
                ("X-Hub-Signature-256", format!("sha256={}", "00".repeat(32))),
                ("X-Hub-Signature-256", github_signature(GITHUB[1], github)),
                ("X-GitHub-Delivery", "gh-repeated".into()),
                ("X-GitHub-Event", "issues".into()),
            ],
            github,
        ),
        (
            "stripe",
            "evt_repeated",
            vec![
                ("Stripe-Signature", format!("t={},v1={}", now(), "00".repeat(32))),
                ("Stripe-Signature", stripe_header(STRIPE[0], &stripe)),
            ],
            &stripe,
        ),
    ];
    for (provider, id, headers, body) in cases {
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, answer) = post(&r, provider, &pairs, body).await;
        assert_eq!(status, StatusCode::OK, "{provider}: {answer}");
        let (kept, raw, epoch): (Value, Vec<u8>, i64) = sqlx::query_as(
            "SELECT headers, raw_body, extract(epoch FROM received_at)::bigint FROM webhook_inbox WHERE event_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let p = Provider::try_from(provider).unwrap();
        let verified = webhook_inbox_schemes::verify_stored(&schemes, p, &kept, &raw, epoch);
        assert!(verified.is_ok(), "{provider}: {verified:?} from {kept}");
    }
}

/// A receiver for the providers whose event id (or type) is an unsigned
/// header, with their secrets; and a signer for the declared ones.
fn guarded_receiver(opts: PgConnectOptions) -> (Receiver, webhook_inbox::ReceiveConfig) {
    let pairs = [
        ("GITHUB_WEBHOOK_SECRET", GITHUB[0]),
        ("SHOPIFY_WEBHOOK_SECRET", SHOPIFY[0]),
        ("RAZORPAY_WEBHOOK_SECRET", "razorpay-secret"),
        ("WOOCOMMERCE_WEBHOOK_SECRET", "woo-secret"),
        ("TWILIO_WEBHOOK_SECRET", "twilio-token"),
        ("TWILIO_WEBHOOK_URL", "https://hooks.example.com/webhooks/twilio"),
    ];
    let cfg = webhook_inbox::ReceiveConfig::read(&webhook_inbox::config::Env::from_pairs(&pairs), 4).unwrap();
    (Receiver::connect_with(opts, &cfg), cfg)
}

fn declared_signature(
    cfg: &webhook_inbox::ReceiveConfig,
    provider: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, String) {
    let p = Provider::try_from(provider).unwrap();
    let webhook_inbox_schemes::catalog::Kind::Declared(rules) = &cfg.catalog.get(p).unwrap().kind else {
        panic!("{provider}")
    };
    let h = http::HeaderMap::from_iter(
        headers.iter().map(|(k, v)| (http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap())),
    );
    let d = webhook_inbox::schemes::Delivery { headers: &h, body, now: 0 };
    (rules.headers[0].clone(), rules.sign(key.as_bytes(), &d, cfg.catalog.url(p), None).unwrap())
}

/// Where the id or type is read from a header the signature does not cover,
/// and nothing signed is dated, one signed body sent again under another id
/// is a duplicate, counted as a suspected replay, and a true redelivery is a
/// plain duplicate. Under another type it is another event: Shopify sends one
/// order's body under several topics.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_signed_body_sent_again_under_another_unsigned_id_is_a_duplicate(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (r, cfg) = guarded_receiver(opts);
    let github = br#"{"action":"opened","issue":{"id":1}}"#.to_vec();
    let shopify = br#"{"id":820982911946154508,"updated_at":"2026-12-01T10:00:00Z"}"#.to_vec();
    let razorpay = br#"{"entity":"event","event":"payment.captured","created_at":1767225600}"#.to_vec();
    let woo = br#"{"id":42,"status":"processing"}"#.to_vec();
    let twilio = b"MessageSid=SM1&MessageStatus=delivered".to_vec();
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let (rz_name, rz_sig) = declared_signature(&cfg, "razorpay", "razorpay-secret", &[], &razorpay);
    let (wc_name, wc_sig) = declared_signature(&cfg, "woocommerce", "woo-secret", &[], &woo);
    let (tw_name, tw_sig) = declared_signature(&cfg, "twilio", "twilio-token", &[form], &twilio);
    let gh_sig = github_signature(GITHUB[0], &github);
    let sh_sig = shopify_hmac(SHOPIFY[0], &shopify);
    /// A provider, its signed body, the captured delivery's headers and the replay's.
    type Replay<'a> = (&'a str, &'a [u8], Vec<(&'a str, &'a str)>, Vec<(&'a str, &'a str)>);
    let cases: Vec<Replay<'_>> = vec![
        (
            "github",
            &github,
            vec![("X-Hub-Signature-256", &gh_sig), ("X-GitHub-Delivery", "d-1"), ("X-GitHub-Event", "issues")],
            vec![("X-Hub-Signature-256", &gh_sig), ("X-GitHub-Delivery", "d-2"), ("X-GitHub-Event", "issues")],
        ),
        (
            "shopify",
            &shopify,
            vec![
                ("X-Shopify-Hmac-Sha256", &sh_sig),
                ("X-Shopify-Webhook-Id", "w-1"),
                ("X-Shopify-Topic", "orders/updated"),
            ],
            vec![
                ("X-Shopify-Hmac-Sha256", &sh_sig),
                ("X-Shopify-Webhook-Id", "w-2"),
                ("X-Shopify-Topic", "orders/updated"),
            ],
        ),
        (
            "razorpay",
            &razorpay,
            vec![(&rz_name, &rz_sig), ("X-Razorpay-Event-Id", "e-1")],
            vec![(&rz_name, &rz_sig), ("X-Razorpay-Event-Id", "e-2")],
        ),
        (
            "woocommerce",
            &woo,
            vec![(&wc_name, &wc_sig), ("X-WC-Webhook-ID", "7"), ("X-WC-Webhook-Topic", "order.updated")],
            vec![(&wc_name, &wc_sig), ("X-WC-Webhook-ID", "8"), ("X-WC-Webhook-Topic", "order.updated")],
        ),
        (
            "twilio",
            &twilio,
            vec![(&tw_name, &tw_sig), form, ("I-Twilio-Idempotency-Token", "t-1")],
            vec![(&tw_name, &tw_sig), form, ("I-Twilio-Idempotency-Token", "t-2")],
        ),
    ];
    for (provider, body, original, replayed) in cases {
        let (status, answer) = post(&r, provider, &original, body).await;
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})), "{provider}");
        let (response, metrics) = r.handle_counted(request(provider, &replayed, body)).await;
        assert_eq!(response.status(), StatusCode::OK, "{provider}");
        assert_eq!(response.body().as_ref(), br#"{"status":"duplicate"}"#, "{provider}: answered as any duplicate");
        let line = metrics.document(0);
        assert_eq!(
            (line["suspected_replay"].as_f64(), line["duplicate"].as_f64()),
            (Some(1.0), Some(1.0)),
            "{provider}: {line}"
        );
        let (_, metrics) = r.handle_counted(request(provider, &original, body)).await;
        let line = metrics.document(0);
        assert_eq!(
            (line["duplicate"].as_f64(), line.get("suspected_replay")),
            (Some(1.0), None),
            "{provider}: a true redelivery"
        );
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT event_id, event_type FROM webhook_inbox WHERE provider = $1")
                .bind(provider)
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(rows.len(), 1, "{provider}: {rows:?}");
    }
    // The same body under another topic is that topic's event (Shopify's orders/paid beside orders/updated).
    let paid = [
        ("X-Shopify-Hmac-Sha256", sh_sig.as_str()),
        ("X-Shopify-Webhook-Id", "w-3"),
        ("X-Shopify-Topic", "orders/paid"),
    ];
    assert_eq!(post(&r, "shopify", &paid, &shopify).await.1, json!({"status": "accepted"}));
    // Another body is another event, whatever its id.
    let other = br#"{"action":"closed","issue":{"id":1}}"#;
    let sig = github_signature(GITHUB[0], other);
    let headers = [("X-Hub-Signature-256", sig.as_str()), ("X-GitHub-Delivery", "d-3"), ("X-GitHub-Event", "issues")];
    assert_eq!(post(&r, "github", &headers, other).await.1, json!({"status": "accepted"}));
}

/// Sixteen copies of one signed body at once, each under its own delivery id:
/// one event.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn concurrent_replays_under_sixteen_ids_make_one_event(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (r, _) = guarded_receiver(opts);
    let r = Arc::new(r);
    let body = br#"{"action":"created","comment":{"id":99}}"#;
    let sig = github_signature(GITHUB[0], body);
    let barrier = Arc::new(Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (r, barrier, sig) = (r.clone(), barrier.clone(), sig.clone());
            tokio::spawn(async move {
                let id = format!("d-{i}");
                let headers = [
                    ("X-Hub-Signature-256", sig.as_str()),
                    ("X-GitHub-Delivery", id.as_str()),
                    ("X-GitHub-Event", "issue_comment"),
                ];
                barrier.wait().await;
                post(&r, "github", &headers, body).await
            })
        })
        .collect();
    let mut accepted = 0;
    for t in tasks {
        let (status, answer) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{answer}");
        accepted += usize::from(answer == json!({"status": "accepted"}));
    }
    assert_eq!(accepted, 1);
    assert_eq!(count(&pool).await, 1);
}

/// Receive records which secret verified a delivery by its fingerprint (the
/// position in the list is kept too, but a rotation may reorder the list).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_secret_that_verified_is_recorded_by_fingerprint(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let app = TestApp::spawn(opts, secrets(false)).await;
    for (id, secret) in [("evt_fp_old", STRIPE[0]), ("evt_fp_new", STRIPE[1])] {
        let body = stripe_body(id);
        let (status, _) = app.post("stripe", &[("Stripe-Signature", &stripe_header(secret, &body))], &body).await;
        assert_eq!(status, StatusCode::OK);
        let (index, fingerprint): (i16, Option<String>) =
            sqlx::query_as("SELECT secret_index, secret_fingerprint FROM webhook_inbox WHERE event_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let expected = webhook_inbox::config::Secret::new(secret).fingerprint();
        assert_eq!(
            (index, fingerprint.as_deref()),
            (STRIPE.iter().position(|s| *s == secret).unwrap() as i16, Some(expected.as_str()))
        );
    }
}
