//! Declared providers through the real receive handler and PostgreSQL: a
//! provider added by configuration alone, batches, form bodies, URL-signing
//! providers, re-verification of what was stored, and hostile input.

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::{Hmac, Mac};
use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{postgres::PgConnectOptions, PgPool};
use webhook_inbox::{
    config::{Env, ReceiveConfig},
    db,
    ingest::providers::{verify_stored, Provider, Schemes},
    Receiver,
};

const ACME: &str = r#"
[acme]
signature = { header = "X-Acme-Signature", items = ",", key = "v1" }
algorithm = "sha512"
encoding = "hex"
signed = "{timestamp}.{header:X-Acme-Delivery}.{body}"
timestamp = { from = "{signature:t}", tolerance_secs = 300 }
event_id = "{header:X-Acme-Delivery}"
event_type = "{json:/kind}"
redelivery_days = 2
"#;

/// A receiver configured as a user would: environment variables only.
fn receiver(opts: &PgConnectOptions, vars: &[(&str, &str)]) -> (Receiver, ReceiveConfig) {
    let mut cfg = ReceiveConfig::read(&Env::from_pairs(vars), 4).expect("valid configuration");
    cfg.db.pool_size = 4;
    (Receiver::new(db::Connections::from_options(opts.clone(), &cfg.db), &cfg), cfg)
}

/// Signed here with the HMAC crate directly, as the provider would, not with our own signer.
fn acme_signature(secret: &str, t: i64, delivery: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha512>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.{delivery}.").as_bytes());
    mac.update(body);
    format!("t={t},v1=00,v1={}", hex::encode(mac.finalize().into_bytes()))
}

async fn row(pool: &PgPool, provider: &str, id: &str) -> (String, String, Value, Option<Value>) {
    sqlx::query_as(
        "SELECT event_type, status, headers, payload FROM webhook_inbox WHERE provider = $1 AND event_id = $2",
    )
    .bind(provider)
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "webhook_inbox::db::MIGRATOR")]
async fn a_provider_added_by_configuration_alone_is_verified_claimed_and_deduplicated(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let vars = [("INBOX_PROVIDERS", ACME), ("ACME_WEBHOOK_SECRET", "old-secret, new-secret")];
    let (receiver, cfg) = receiver(&opts, &vars);
    let body = br#"{"kind":"invoice.paid","amount":10}"#;
    let sig = acme_signature("new-secret", now(), "dlv_1", body);
    let headers =
        [("x-acme-signature", sig.as_str()), ("x-acme-delivery", "dlv_1"), ("content-type", "application/json")];

    let (status, answer) = post(&receiver, "acme", &headers, body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    let (status, answer) = post(&receiver, "acme", &headers, body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "duplicate"})));
    let (kind, status, kept, payload) = row(&pool, "acme", "dlv_1").await;
    assert_eq!((kind.as_str(), status.as_str()), ("invoice.paid", "pending"));
    assert_eq!(payload, Some(json!({"kind": "invoice.paid", "amount": 10})));
    assert_eq!(kept["x-acme-delivery"], "dlv_1");

    // What was stored re-verifies (`inbox show`), judged at its arrival time.
    let schemes = Schemes::new(&cfg.catalog, &cfg.secrets);
    let (raw, epoch): (Vec<u8>, i64) = sqlx::query_as(
        "SELECT raw_body, extract(epoch FROM received_at)::bigint FROM webhook_inbox WHERE event_id = 'dlv_1'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let acme = Provider::try_from("acme").unwrap();
    assert_eq!(verify_stored(&schemes, acme, &kept, &raw, epoch).unwrap().secret_index, 1);

    for (what, headers, body, expect) in [
        ("another body", headers.to_vec(), &br#"{"kind":"invoice.paid","amount":1000}"#[..], "does not match"),
        (
            "an unknown secret",
            vec![("x-acme-signature", &*acme_signature("guess", now(), "dlv_2", body)), ("x-acme-delivery", "dlv_2")],
            body,
            "does not match",
        ),
        (
            "a stale timestamp",
            vec![
                ("x-acme-signature", &*acme_signature("new-secret", now() - 301, "dlv_3", body)),
                ("x-acme-delivery", "dlv_3"),
            ],
            body,
            "outside the 300 s tolerance",
        ),
        ("no delivery header", vec![("x-acme-signature", sig.as_str())], body, "missing X-Acme-Delivery header"),
        ("no signature", vec![("x-acme-delivery", "dlv_1")], body, "missing X-Acme-Signature header"),
    ] {
        let (status, answer) = post(&receiver, "acme", &headers, body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(expect), "{what}: {answer}");
    }
    let (status, answer) = post(&receiver, "zoom", &headers, body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(answer["error"], "provider zoom has no secret configured, so it has no endpoint");
    let (status, answer) = post(&receiver, "acme2", &headers, body).await;
    assert_eq!((status, answer["error"].as_str()), (StatusCode::NOT_FOUND, Some("unknown provider \"acme2\"")));
    assert_eq!(count(&pool).await, 1, "nothing refused was stored");
}

#[sqlx::test(migrator = "webhook_inbox::db::MIGRATOR")]
async fn a_batch_provider_claims_each_event_once_and_a_bad_event_fails_alone(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (receiver, _) = receiver(&opts, &[("GOCARDLESS_WEBHOOK_SECRET", "gc-secret")]);
    let sign = |body: &[u8]| {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"gc-secret").unwrap();
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    };
    let body = br#"{"events":[{"id":"EV1","resource_type":"payments","action":"confirmed"},{"id":"EV2","resource_type":"mandates","action":"created","n":1e999},{"id":"EV3","resource_type":"payouts","action":"paid"}]}"#;
    let sig = sign(body);
    let (status, answer) = post(&receiver, "gocardless", &[("webhook-signature", &sig)], body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"accepted": 3, "duplicates": 0})));
    let (status, answer) = post(&receiver, "gocardless", &[("webhook-signature", &sig)], body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"accepted": 0, "duplicates": 3})));
    assert_eq!(row(&pool, "gocardless", "EV1").await.0, "payments.confirmed");
    assert_eq!(row(&pool, "gocardless", "EV2").await.1, "failed", "a number out of range fails its own event");
    assert_eq!(row(&pool, "gocardless", "EV3").await.1, "pending", "the events around it flow");

    // Thousands of events: kept whole as one failed row, answered at once.
    let many = format!(
        "{{\"events\":[{}]}}",
        (0..5000).map(|i| format!("{{\"id\":\"M{i}\",\"resource_type\":\"payments\"}}")).collect::<Vec<_>>().join(",")
    );
    let (status, answer) =
        post(&receiver, "gocardless", &[("webhook-signature", &sign(many.as_bytes()))], many.as_bytes()).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"accepted": 1, "duplicates": 0})));
    let failed: i64 =
        scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE failure_reason LIKE '5000 events in one delivery%'")
            .await;
    assert_eq!(failed, 1);
}

#[sqlx::test(migrator = "webhook_inbox::db::MIGRATOR")]
async fn url_signing_providers_use_the_configured_url_never_the_request(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let url = "https://hooks.example.com/prod/webhooks/twilio";
    let (receiver, _) = receiver(&opts, &[("TWILIO_WEBHOOK_SECRET", "auth-token"), ("TWILIO_WEBHOOK_URL", url)]);
    let body = b"MessageSid=SM123&MessageStatus=delivered&To=%2B15005550006&Body=caf%C3%A9+%F0%9F%8D%B5";
    let sign = |url: &str| {
        let mut mac = Hmac::<sha1::Sha1>::new_from_slice(b"auth-token").unwrap();
        mac.update(format!("{url}Bodycafé 🍵MessageSidSM123MessageStatusdeliveredTo+15005550006").as_bytes());
        B64.encode(mac.finalize().into_bytes())
    };
    let form = ("content-type", "application/x-www-form-urlencoded");
    // The request itself reaches us as https://example.test/webhooks/twilio: only the configured URL counts.
    let (status, answer) = post(&receiver, "twilio", &[form, ("x-twilio-signature", &sign(url))], body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    let (kind, status, _, payload) = row(&pool, "twilio", "SM123:delivered").await;
    assert_eq!((kind.as_str(), status.as_str()), ("message.delivered", "pending"));
    assert_eq!(payload.unwrap()["Body"], "café 🍵");
    let (status, _) =
        post(&receiver, "twilio", &[form, ("x-twilio-signature", &sign("https://example.test/webhooks/twilio"))], body)
            .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "webhook_inbox::db::MIGRATOR")]
async fn hostile_bodies_to_a_declared_provider_are_stored_as_failed_and_the_rest_flows(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (receiver, _) = receiver(&opts, &[("SLACK_WEBHOOK_SECRET", "slack-secret")]);
    let send = |body: Vec<u8>| {
        let t = now().to_string();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"slack-secret").unwrap();
        mac.update(format!("v0:{t}:").as_bytes());
        mac.update(&body);
        let sig = format!("v0={}", hex::encode(mac.finalize().into_bytes()));
        let receiver = &receiver;
        async move {
            let headers = [("x-slack-signature", sig.as_str()), ("x-slack-request-timestamp", t.as_str())];
            post(receiver, "slack", &headers, &body).await
        }
    };
    let deep = format!("{{\"event_id\":\"Ev_deep\",\"x\":{}1{}}}", "[".repeat(10_000), "]".repeat(10_000));
    let huge_id = format!("{{\"event_id\":\"{}\"}}", "9".repeat(100_000));
    for body in [
        deep.into_bytes(),
        huge_id.into_bytes(),
        b"\xff\xfe not utf-8".to_vec(),
        b"{\"event_id\":\"Ev_nul\\u0000\"}".to_vec(),
    ] {
        let (status, answer) = send(body).await;
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    }
    let (status, _) = send(br#"{"event_id":"Ev_ok","event":{"type":"app_mention"}}"#.to_vec()).await;
    assert_eq!(status, StatusCode::OK);
    let failed: i64 = scalar(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'failed'").await;
    assert_eq!(failed, 4);
    assert_eq!(row(&pool, "slack", "Ev_ok").await.1, "pending", "the row after them flows");
}
