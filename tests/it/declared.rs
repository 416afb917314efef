//! Declared providers through the real receive handler and PostgreSQL: a
//! provider added by configuration alone, batches, form bodies, URL-signing
//! providers, re-verification of what was stored, and hostile input.

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::Hmac;
use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{postgres::PgConnectOptions, PgPool};
use webhook_inbox::{config::Env, ReceiveConfig, Receiver};
use webhook_inbox_schemes::{verify_stored, Provider, Schemes};

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
    (Receiver::connect_with(opts.clone(), &cfg), cfg)
}

/// Signed here with the HMAC crate directly, as the provider would, not with our own signer.
fn acme_signature(secret: &str, t: i64, delivery: &str, body: &[u8]) -> String {
    let mac = hmac::<Hmac<sha2::Sha512>>(secret.as_bytes(), &[format!("{t}.{delivery}.").as_bytes(), body]);
    format!("t={t},v1=00,v1={}", hex::encode(mac))
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_batch_provider_claims_each_event_once_and_a_bad_event_fails_alone(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (receiver, _) = receiver(&opts, &[("GOCARDLESS_WEBHOOK_SECRET", "gc-secret")]);
    let sign = |body: &[u8]| hex::encode(hmac::<Hmac<sha2::Sha256>>(b"gc-secret", &[body]));
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn url_signing_providers_use_the_configured_url_never_the_request(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let url = "https://hooks.example.com/prod/webhooks/twilio";
    let (receiver, _) = receiver(&opts, &[("TWILIO_WEBHOOK_SECRET", "auth-token"), ("TWILIO_WEBHOOK_URL", url)]);
    let body = b"MessageSid=SM123&MessageStatus=delivered&To=%2B15005550006&Body=caf%C3%A9+%F0%9F%8D%B5";
    let sign = |url: &str| {
        let signed = format!("{url}Bodycafé 🍵MessageSidSM123MessageStatusdeliveredTo+15005550006");
        B64.encode(hmac::<Hmac<sha1::Sha1>>(b"auth-token", &[signed.as_bytes()]))
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn hostile_bodies_to_a_declared_provider_are_stored_as_failed_and_the_rest_flows(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (receiver, _) = receiver(&opts, &[("SLACK_WEBHOOK_SECRET", "slack-secret")]);
    let send = |body: Vec<u8>| {
        let t = now().to_string();
        let mac = hmac::<Hmac<sha2::Sha256>>(b"slack-secret", &[format!("v0:{t}:").as_bytes(), &body]);
        let sig = format!("v0={}", hex::encode(mac));
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn handshakes_are_answered_once_verified_and_never_stored(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let vars = [
        ("SLACK_WEBHOOK_SECRET", "slack-secret"),
        ("ZOOM_WEBHOOK_SECRET", "zoom-old, zoom-new"),
        ("TWITCH_WEBHOOK_SECRET", "twitch-secret-0123"),
    ];
    let (receiver, _) = receiver(&opts, &vars);
    let hmac_hex = |key: &str, parts: &[&[u8]]| hex::encode(hmac::<Hmac<sha2::Sha256>>(key.as_bytes(), parts));
    let answer = |response: http::Response<lambda_http::Body>| {
        let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
        (response.status(), content_type, String::from_utf8(response.body().to_vec()).unwrap())
    };

    // Slack: url_verification, the challenge back as text.
    let t = now().to_string();
    let body = br#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let sig = format!("v0={}", hmac_hex("slack-secret", &[format!("v0:{t}:").as_bytes(), body]));
    let signed = [("x-slack-signature", sig.as_str()), ("x-slack-request-timestamp", t.as_str())];
    let got = answer(receiver.handle(request("slack", &signed, body)).await);
    assert_eq!(
        got,
        (StatusCode::OK, "text/plain".into(), "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into())
    );
    let unsigned = [("x-slack-signature", "v0=00"), ("x-slack-request-timestamp", t.as_str())];
    assert_eq!(receiver.handle(request("slack", &unsigned, body)).await.status(), StatusCode::UNAUTHORIZED);

    // Zoom: endpoint.url_validation, answered with the token's HMAC under the secret that verified it
    // (Zoom's sample: createHmac('sha256', secretToken).update(plainToken).digest('hex')).
    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let sig = format!("v0={}", hmac_hex("zoom-new", &[format!("v0:{t}:").as_bytes(), body]));
    let signed = [("x-zm-signature", sig.as_str()), ("x-zm-request-timestamp", t.as_str())];
    let (status, content_type, text) = answer(receiver.handle(request("zoom", &signed, body)).await);
    assert_eq!((status, content_type.as_str()), (StatusCode::OK, "application/json"));
    let expected = hmac_hex("zoom-new", &[b"qgg8vlvZRS6UYooatFL8Aw"]);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw", "encryptedToken": expected})
    );

    // Twitch: webhook_callback_verification, the challenge back as text; a notification is stored.
    let ts = inbox_tests::rfc3339(now()).replace('Z', ".123456789Z"); // as Twitch writes them, to the nanosecond
    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"type":"channel.follow"}}"#;
    let sig = format!("sha256={}", hmac_hex("twitch-secret-0123", &[b"m-1", ts.as_bytes(), body]));
    let headers = [
        ("twitch-eventsub-message-id", "m-1"),
        ("twitch-eventsub-message-timestamp", ts.as_str()),
        ("twitch-eventsub-message-type", "webhook_callback_verification"),
        ("twitch-eventsub-message-signature", sig.as_str()),
    ];
    let got = answer(receiver.handle(request("twitch", &headers, body)).await);
    assert_eq!(got, (StatusCode::OK, "text/plain".into(), "pogchamp-kappa-360noscope-vohiyo".into()));
    assert_eq!(count(&pool).await, 0, "no handshake is stored");

    let mut notification = headers;
    notification[2].1 = "notification";
    let (status, answer) = post(&receiver, "twitch", &notification, body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    assert_eq!(row(&pool, "twitch", "m-1").await.0, "channel.follow");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn woocommerces_unsigned_ping_is_answered_and_never_stored_and_nothing_else_passes_unsigned(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let (receiver, _) = receiver(&opts, &[("WOOCOMMERCE_WEBHOOK_SECRET", "wc-secret")]);
    // As WC_Webhook::deliver_ping sends it on saving a webhook: a form, no signature; it wants exactly 200.
    let form = [("content-type", "application/x-www-form-urlencoded"), ("user-agent", "WooCommerce/9.4.2 Hookshot")];
    let (status, answer) = post(&receiver, "woocommerce", &form, b"webhook_id=17").await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "ping"})));
    assert_eq!(count(&pool).await, 0, "a ping is no event");

    let body = br#"{"id":5120,"status":"processing"}"#;
    let sig = B64.encode(hmac::<Hmac<sha2::Sha256>>(b"wc-secret", &[body]));
    let wrong = B64.encode(hmac::<Hmac<sha2::Sha256>>(b"not-the-secret", &[b"webhook_id=17"]));
    for (headers, body, why) in [
        (
            vec![("x-wc-webhook-signature", wrong.as_str())],
            &b"webhook_id=17"[..],
            "a ping's body with a forged signature",
        ),
        (form.to_vec(), b"webhook_id=17&order=5120", "a form with a field more"),
        (form.to_vec(), body, "an unsigned order"),
    ] {
        let (status, _) = post(&receiver, "woocommerce", &headers, body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}");
    }
    assert_eq!(count(&pool).await, 0);

    let signed =
        [("x-wc-webhook-signature", sig.as_str()), ("x-wc-webhook-id", "17"), ("x-wc-webhook-topic", "order.updated")];
    let (status, answer) = post(&receiver, "woocommerce", &signed, body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    assert_eq!(count(&pool).await, 1, "the webhook's deliveries then flow as before");
}

/// As an attacker would, with a captured delivery of every built-in declared
/// provider: the same signed bytes sent again with every header the event's id
/// is read from unsigned changed. Where the provider signs what identifies the
/// event, the id does not change; where it does not, the signed bytes are
/// deduplicated. Either way: no second event.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_captured_delivery_of_any_built_in_provider_replayed_under_changed_unsigned_headers_is_no_new_event(
    _: sqlx::postgres::PgPoolOptions,
    opts: PgConnectOptions,
) {
    use webhook_inbox_schemes::declared::{Algorithm, Part, Source, TimeFormat};
    let catalog = webhook_inbox::config::Catalog::builtin();
    let declared: Vec<(Provider, webhook_inbox_schemes::declared::Rules)> = catalog
        .entries()
        .filter_map(|e| match &e.kind {
            webhook_inbox_schemes::catalog::Kind::Declared(r) if r.algorithm != Algorithm::EcdsaP256Sha256 => {
                Some((e.provider, (**r).clone()))
            }
            _ => None,
        })
        .collect();
    assert!(declared.len() >= 18, "{}", declared.len());
    let mut vars: Vec<(String, String)> = Vec::new();
    for (p, rules) in &declared {
        let secret = if rules.secret_base64 { "a2V5LWtleS1rZXk=".to_string() } else { format!("key-{p}") };
        vars.push((format!("{}_WEBHOOK_SECRET", p.env_prefix()), secret));
        if rules.needs_url() {
            vars.push((format!("{}_WEBHOOK_URL", p.env_prefix()), format!("https://hooks.example.com/webhooks/{p}")));
        }
    }
    let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (r, cfg) = receiver(&opts, &pairs);
    let pool = PgPool::connect_with(opts).await.unwrap();
    let mut failures = Vec::new();
    for (p, rules) in &declared {
        let key = if rules.secret_base64 { b"key-key-key".to_vec() } else { format!("key-{p}").into_bytes() };
        let now = inbox_tests::now();
        let form = rules.signed.0.iter().any(|part| matches!(part, Part::Source(Source::FormSorted)));
        let mut object = json!({
            "id": "X1", "event_id": "X1", "eventId": 1, "messageId": "X1", "type": "t", "event": "e",
            "topic": "t", "subscriptionType": "t", "event_type": "t", "resource_type": "r", "action": "a",
            "subscription": {"type": "t"}, "payload": {"uri": "u"},
        });
        let (mut headers, mut ts): (Vec<(String, String)>, Option<String>) = (vec![], None);
        if let Some(t) = &rules.timestamp {
            let text = match t.format {
                TimeFormat::Unix => now.to_string(),
                TimeFormat::UnixMs => (now * 1000).to_string(),
                TimeFormat::Rfc3339 => inbox_tests::rfc3339(now),
            };
            match &t.from {
                Source::Header(h) => headers.push((h.clone(), text.clone())),
                Source::Json(pointer) => object[pointer.trim_start_matches('/')] = json!(now * 1000),
                _ => {}
            }
            ts = Some(text);
        }
        for part in &rules.signed.0 {
            if let Part::Source(Source::Header(h)) = part {
                if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(h)) {
                    headers.push((h.clone(), "signed-1".into()));
                }
            }
        }
        let body = match (&rules.batch, form) {
            (_, true) => "MessageSid=SM1&MessageStatus=delivered&CallSid=CA1&CallStatus=completed".to_string(),
            (Some(b), _) if b.is_empty() => json!([object]).to_string(),
            (Some(b), _) => json!({ b.trim_start_matches('/'): [object] }).to_string(),
            (None, _) => object.to_string(),
        };
        if form {
            headers.push(("Content-Type".into(), "application/x-www-form-urlencoded".into()));
        } else {
            headers.push(("Content-Type".into(), "application/json".into()));
        }
        let unsigned_id = rules.unsigned_id();
        let with_id = |value: &str| -> Vec<(String, String)> {
            let mut h = headers.clone();
            h.extend(unsigned_id.iter().map(|name| (name.clone(), value.to_string())));
            h
        };
        let sign = |h: &[(String, String)]| -> Vec<(String, String)> {
            let map = http::HeaderMap::from_iter(h.iter().map(|(k, v)| {
                (http::HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap())
            }));
            let d = webhook_inbox::schemes::Delivery { headers: &map, body: body.as_bytes(), now };
            let sig = rules.sign(&key, &d, cfg.catalog.url(*p), ts.as_deref()).unwrap();
            let mut signed = h.to_vec();
            signed.push((rules.headers[0].clone(), sig));
            signed
        };
        let count = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_inbox WHERE provider = $1")
                .bind(p.as_str())
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        for (attempt, value) in [("captured", "original-id"), ("replayed", "changed-id")] {
            let h = sign(&with_id(value));
            let pairs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let (status, answer) = post(&r, p.as_str(), &pairs, body.as_bytes()).await;
            let rows = count().await;
            if status != StatusCode::OK || rows != 1 {
                failures.push(format!(
                    "{p} {attempt} (unsigned id headers {unsigned_id:?}): {status} {answer}, {rows} rows"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
