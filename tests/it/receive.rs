//! The receive handler against a real PostgreSQL: signatures, the claim,
//! concurrency, isolation, bad input and a database that goes away.

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::Receiver;
use webhook_inbox_schemes::Provider;

// ---------- the signature matrix, through the real handler ----------

struct Case {
    name: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    via_apigw_v2: bool,
    expect: StatusCode,
    secret_index: Option<i16>,
}

fn case(name: &'static str, headers: &[(&str, String)], body: Vec<u8>, expect: u16) -> Case {
    Case {
        name,
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        body,
        via_apigw_v2: false,
        expect: StatusCode::from_u16(expect).unwrap(),
        secret_index: None,
    }
}

impl Case {
    fn secret(mut self, index: i16) -> Self {
        self.secret_index = Some(index);
        self
    }
    fn via_v2(mut self) -> Self {
        self.via_apigw_v2 = true;
        self
    }
}

async fn run_matrix(pool: &PgPool, receiver: &Receiver, provider: &str, cases: Vec<Case>) {
    let mut accepted = 0;
    for c in &cases {
        let headers: Vec<(&str, &str)> = c.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let req = if c.via_apigw_v2 {
            apigw_v2_request(provider, &headers, &c.body)
        } else {
            request(provider, &headers, &c.body)
        };
        let (status, body) = send(receiver, req).await;
        assert_eq!(status, c.expect, "{provider} / {}: {body}", c.name);
        if status == StatusCode::OK {
            accepted += 1;
            let index: i16 =
                sqlx::query_scalar(
                    "SELECT w.secret_index FROM webhook_inbox AS w LEFT JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256
                     WHERE coalesce(w.raw_body, b.raw_body) = $1 LIMIT 1",
                )
                    .bind(&c.body)
                    .fetch_one(pool)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "{provider} / {}: no row with the exact raw bytes: {e}",
                            c.name
                        )
                    });
            if let Some(expected) = c.secret_index {
                assert_eq!(index, expected, "{provider} / {}: secret index", c.name);
            }
        } else {
            let reason = body["error"].as_str().unwrap_or_default();
            assert!(!reason.is_empty(), "{provider} / {}: a refusal says why", c.name);
            for secret in STRIPE.iter().chain(&SHOPIFY).chain(&GITHUB).chain(&MARQETA_PASSWORDS).chain(&MARQETA_SIGNING)
            {
                assert!(!reason.contains(secret), "{provider} / {}: the reason leaks a secret", c.name);
            }
            for key in STANDARD {
                assert!(
                    !reason.contains(std::str::from_utf8(key).unwrap()),
                    "{provider} / {}: the reason leaks a key",
                    c.name
                );
            }
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE provider = $1")
        .bind(provider)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, accepted, "{provider}: only accepted deliveries are stored");
}

pub(crate) fn stripe_body(id: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","object":"event","type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_{id}"}}}}}}"#
    )
    .into_bytes()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn stripe_signature_matrix(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [old, new] = STRIPE;
    let t = now();
    let sig = |secret: &str, t: i64, body: &[u8]| stripe_v1(secret, t, body);
    let h = |v: String| vec![("Stripe-Signature", v)];
    let b = stripe_body;
    let cases = vec![
        case("valid", &h(format!("t={t},v1={}", sig(old, t, &b("evt_valid")))), b("evt_valid"), 200).secret(0),
        case("rotated secret", &h(format!("t={t},v1={}", sig(new, t, &b("evt_rot")))), b("evt_rot"), 200).secret(1),
        case(
            "several v1, matching one first",
            &h(format!(
                "t={t},v1={},v1={},v0={}",
                sig(new, t, &b("evt_sev")),
                sig("whsec_x", t, &b("evt_sev")),
                "00".repeat(32)
            )),
            b("evt_sev"),
            200,
        )
        .secret(1),
        case("wrong secret", &h(format!("t={t},v1={}", sig("whsec_wrong", t, &b("evt_w")))), b("evt_w"), 401),
        case("missing header", &[], b("evt_m"), 401),
        case("empty signature", &h(format!("t={t},v1=")), b("evt_e"), 401),
        case("stale timestamp", &h(format!("t={},v1={}", t - 330, sig(old, t - 330, &b("evt_s")))), b("evt_s"), 401),
        case("future timestamp", &h(format!("t={},v1={}", t + 330, sig(old, t + 330, &b("evt_f")))), b("evt_f"), 401),
        case("v0 only", &h(format!("t={t},v0={}", sig(old, t, &b("evt_v0")))), b("evt_v0"), 401),
        case(
            "base64 body through a v2 event",
            &h(format!("t={t},v1={}", sig(old, t, &b("evt_b64")))),
            b("evt_b64"),
            200,
        )
        .via_v2(),
        case(
            "duplicated header",
            &[
                ("Stripe-Signature", format!("t={t},v1={}", "11".repeat(32))),
                ("Stripe-Signature", format!("t={t},v1={}", sig(new, t, &b("evt_dup")))),
            ],
            b("evt_dup"),
            200,
        )
        .secret(1),
        case(
            "duplicated header, neither valid",
            &[
                ("Stripe-Signature", format!("t={t},v1={}", "11".repeat(32))),
                ("Stripe-Signature", format!("t={t},v1={}", "22".repeat(32))),
            ],
            b("evt_dup2"),
            401,
        ),
    ];
    run_matrix(&pool, r, "stripe", cases).await;
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn shopify_signature_matrix(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [old, new] = SHOPIFY;
    let body = |id: &str| format!(r#"{{"id":{},"note":"{id}"}}"#, id.len()).into_bytes();
    let h = |id: &str, sig: String| {
        vec![
            ("X-Shopify-Webhook-Id", id.to_string()),
            ("X-Shopify-Topic", "orders/create".to_string()),
            ("X-Shopify-Hmac-Sha256", sig),
        ]
    };
    let cases = vec![
        case("valid", &h("w-valid", shopify_hmac(old, &body("w-valid"))), body("w-valid"), 200).secret(0),
        case("rotated secret", &h("w-rot", shopify_hmac(new, &body("w-rot"))), body("w-rot"), 200).secret(1),
        case("wrong secret", &h("w-wrong", shopify_hmac("other", &body("w-wrong"))), body("w-wrong"), 401),
        case("missing header", &h("w-miss", String::new())[..2], body("w-miss"), 401),
        case("empty signature", &h("w-empty", String::new()), body("w-empty"), 401),
        case("base64 body through a v2 event", &h("w-b64", shopify_hmac(old, &body("w-b64"))), body("w-b64"), 200)
            .via_v2(),
        case(
            "duplicated header",
            &[h("w-dup", "AAAA".into()), h("w-dup", shopify_hmac(new, &body("w-dup")))].concat(),
            body("w-dup"),
            200,
        ),
    ];
    run_matrix(&pool, r, "shopify", cases).await;
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn github_signature_matrix(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [old, new] = GITHUB;
    let body = |id: &str| format!(r#"{{"action":"opened","zen":"{id}"}}"#).into_bytes();
    let h = |id: &str, sig: String| {
        vec![
            ("X-GitHub-Delivery", id.to_string()),
            ("X-GitHub-Event", "issues".to_string()),
            ("X-Hub-Signature-256", sig),
        ]
    };
    let cases = vec![
        case("valid", &h("g-valid", github_signature(old, &body("g-valid"))), body("g-valid"), 200).secret(0),
        case("rotated secret", &h("g-rot", github_signature(new, &body("g-rot"))), body("g-rot"), 200).secret(1),
        case("wrong secret", &h("g-wrong", github_signature("other", &body("g-wrong"))), body("g-wrong"), 401),
        case("missing header", &h("g-miss", String::new())[..2], body("g-miss"), 401),
        case("empty signature", &h("g-empty", "sha256=".into()), body("g-empty"), 401),
        case("base64 body through a v2 event", &h("g-b64", github_signature(old, &body("g-b64"))), body("g-b64"), 200)
            .via_v2(),
        case(
            "duplicated header",
            &[h("g-dup", "sha256=00".into()), h("g-dup", github_signature(new, &body("g-dup")))].concat(),
            body("g-dup"),
            200,
        ),
    ];
    run_matrix(&pool, r, "github", cases).await;
}

/// Name, headers, event id, expected status, expected secret index, via API Gateway v2.
type StandardCase<'a> = (&'static str, Vec<(String, String)>, &'a str, u16, Option<i16>, bool);

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn standard_webhooks_signature_matrix(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [old, new] = STANDARD;
    let t = now();
    let body = |id: &str| format!(r#"{{"type":"invoice.paid","data":{{"id":"{id}"}}}}"#).into_bytes();
    let h = |prefix: &str, id: &str, t: i64, sig: String| {
        vec![
            (format!("{prefix}-id"), id.to_string()),
            (format!("{prefix}-timestamp"), t.to_string()),
            (format!("{prefix}-signature"), sig),
        ]
    };
    let s = |key: &[u8], id: &str, t: i64| standard_signature(key, id, t, &body(id));
    let owned = |v: Vec<(String, String)>| v;
    let cases: Vec<StandardCase> = vec![
        ("valid", owned(h("webhook", "m-valid", t, s(old, "m-valid", t))), "m-valid", 200, Some(0), false),
        ("rotated secret", h("webhook", "m-rot", t, s(new, "m-rot", t)), "m-rot", 200, Some(1), false),
        (
            "several v1",
            h("webhook", "m-sev", t, format!("{} {}", s(b"other-key", "m-sev", t), s(new, "m-sev", t))),
            "m-sev",
            200,
            Some(1),
            false,
        ),
        ("svix headers", h("svix", "m-svix", t, s(old, "m-svix", t)), "m-svix", 200, Some(0), false),
        ("wrong secret", h("webhook", "m-wrong", t, s(b"other-key", "m-wrong", t)), "m-wrong", 401, None, false),
        ("missing header", h("webhook", "m-miss", t, s(old, "m-miss", t))[..2].to_vec(), "m-miss", 401, None, false),
        ("empty signature", h("webhook", "m-empty", t, "v1,".into()), "m-empty", 401, None, false),
        ("stale timestamp", h("webhook", "m-stale", t - 330, s(old, "m-stale", t - 330)), "m-stale", 401, None, false),
        ("future timestamp", h("webhook", "m-fut", t + 330, s(old, "m-fut", t + 330)), "m-fut", 401, None, false),
        ("v1a only", h("webhook", "m-v1a", t, "v1a,c2lnbmF0dXJl".into()), "m-v1a", 401, None, false),
        ("base64 body through a v2 event", h("webhook", "m-b64", t, s(old, "m-b64", t)), "m-b64", 200, Some(0), true),
        (
            "duplicated header",
            [h("webhook", "m-dup", t, "v1,AAAA".into()), h("webhook", "m-dup", t, s(new, "m-dup", t))[2..].to_vec()]
                .concat(),
            "m-dup",
            200,
            Some(1),
            false,
        ),
    ];
    let cases = cases
        .into_iter()
        .map(|(name, headers, id, status, index, v2)| {
            let refs: Vec<(&str, String)> = headers.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            let mut c = case(name, &refs, body(id), status);
            c.secret_index = index;
            c.via_apigw_v2 = v2;
            c
        })
        .collect();
    run_matrix(&pool, r, "standard", cases).await;
}

fn marqeta_body(token: &str) -> Vec<u8> {
    format!(r#"{{"transactions":[{{"token":"{token}","type":"authorization","state":"PENDING","amount":5.5}}]}}"#)
        .into_bytes()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn marqeta_basic_auth_matrix(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [p0, p1] = MARQETA_PASSWORDS;
    let auth = |user: &str, password: &str| vec![("Authorization", marqeta_basic(user, password))];
    let b = marqeta_body;
    let cases = vec![
        case("valid", &auth(MARQETA_USER, p0), b("q-valid"), 200).secret(0),
        case("rotated password", &auth(MARQETA_USER, p1), b("q-rot"), 200).secret(1),
        case("wrong password", &auth(MARQETA_USER, "not-the-password-000"), b("q-wrong"), 401),
        case("wrong user", &auth("someone", p0), b("q-user"), 401),
        case("missing header", &[], b("q-miss"), 401),
        case("empty password", &auth(MARQETA_USER, ""), b("q-empty"), 401),
        case("base64 body through a v2 event", &auth(MARQETA_USER, p0), b("q-b64"), 200).via_v2(),
        case("duplicated header", &[auth("x", "y"), auth(MARQETA_USER, p0)].concat(), b("q-dup"), 401),
    ];
    run_matrix(&pool, r, "marqeta", cases).await;
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn marqeta_signature_matrix_when_a_secret_is_set(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(true)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let [old, new] = MARQETA_SIGNING;
    let b = marqeta_body;
    let with = |sig: String| {
        vec![("Authorization", marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0])), ("X-Marqeta-Signature", sig)]
    };
    let cases = vec![
        case("HMAC-SHA256", &with(marqeta_signature_sha256(old, &b("s-256"))), b("s-256"), 200).secret(0),
        case("legacy HMAC-SHA1", &with(marqeta_signature_sha1(old, &b("s-sha1"))), b("s-sha1"), 200).secret(0),
        case("rotated secret", &with(marqeta_signature_sha256(new, &b("s-rot"))), b("s-rot"), 200).secret(1),
        case("wrong secret", &with(marqeta_signature_sha256("other", &b("s-wrong"))), b("s-wrong"), 401),
        case("missing signature", &with(String::new())[..1], b("s-miss"), 401),
        case("empty signature", &with(String::new()), b("s-empty"), 401),
        case(
            "valid signature without Basic auth",
            &with(marqeta_signature_sha256(old, &b("s-noauth")))[1..],
            b("s-noauth"),
            401,
        ),
        case("base64 body through a v2 event", &with(marqeta_signature_sha256(new, &b("s-b64"))), b("s-b64"), 200)
            .via_v2(),
        case(
            "duplicated header",
            &[with("00".repeat(32)), with(marqeta_signature_sha256(new, &b("s-dup")))[1..].to_vec()].concat(),
            b("s-dup"),
            200,
        ),
    ];
    run_matrix(&pool, r, "marqeta", cases).await;
}

// ---------- the claim ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_stripe_delivery_is_stored_verbatim_then_answered_duplicate(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let body = stripe_body("evt_1");
    let sig = stripe_header(STRIPE[0], &body);
    let headers = [("Stripe-Signature", sig.as_str()), ("Content-Type", "application/json")];
    assert_eq!(post(r, "stripe", &headers, &body).await, (StatusCode::OK, json!({"status": "accepted"})));
    assert_eq!(post(r, "stripe", &headers, &body).await, (StatusCode::OK, json!({"status": "duplicate"})));

    let row: (String, String, Value, Vec<u8>, Value, String, i16) = sqlx::query_as(
        "SELECT event_id, event_type, payload, raw_body, headers, status, secret_index FROM webhook_inbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.0, "evt_1");
    assert_eq!(row.1, "payment_intent.succeeded");
    assert_eq!(row.2["data"]["object"]["id"], "pi_evt_1");
    assert_eq!(row.3, body, "the signed bytes are kept verbatim");
    assert_eq!(row.4, json!({"stripe-signature": sig, "content-type": "application/json"}));
    assert_eq!((row.5.as_str(), row.6), ("pending", 0));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn shopify_identifying_headers_are_kept(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let body = br#"{"id":450789469,"financial_status":"paid"}"#;
    let hmac = shopify_hmac(SHOPIFY[0], body);
    let headers = [
        ("X-Shopify-Hmac-Sha256", hmac.as_str()),
        ("X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        ("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
        ("X-Shopify-Topic", "orders/updated"),
        ("X-Shopify-Triggered-At", "2026-11-29T21:00:00.000Z"),
        ("X-Shopify-Shop-Domain", "example.myshopify.com"),
        ("X-Shopify-API-Version", "2026-10"),
        ("User-Agent", "Shopify-Captain-Hook"),
    ];
    assert_eq!(post(r, "shopify", &headers, body).await.0, StatusCode::OK);
    let (id, topic, kept): (String, String, Value) =
        sqlx::query_as("SELECT event_id, event_type, headers FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!((id.as_str(), topic.as_str()), ("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043", "orders/updated"));
    assert_eq!(kept["x-shopify-event-id"], "98880550-7158-44d4-b7cd-2c97c8a091b5");
    assert_eq!(kept["x-shopify-triggered-at"], "2026-11-29T21:00:00.000Z");
    assert_eq!(kept["x-shopify-shop-domain"], "example.myshopify.com");
    assert!(kept.get("user-agent").is_none(), "only the identifying headers are kept");
}

// ---------- bad input ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_body_over_the_limit_gets_413_and_nothing_is_stored(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let mut cfg = config(secrets(false));
    cfg.max_body_bytes = 1000;
    let r = Receiver::connect_with(opts, &cfg);
    let body = format!(r#"{{"id":"evt_big","type":"x","pad":"{}"}}"#, "x".repeat(1000)).into_bytes();
    let (status, answer) = post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer["error"], "body is larger than the 1000 byte limit");
    assert_eq!(count(&pool).await, 0);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn signed_but_unusable_bodies_are_stored_as_failed_and_answered_200(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let digest = |body: &[u8]| format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)));
    let cases: [(&str, &[u8], &str, Option<&str>); 4] = [
        ("nul", br#"{"id":"evt_nul","type":"x","note":"a\u0000b"}"#, "\\u0000", Some("evt_nul")),
        ("not json", b"<xml>not json</xml>", "not JSON", None),
        ("no id", br#"{"type":"payment_intent.succeeded"}"#, "no usable event id", None),
        ("not utf-8", b"\xff\xfe{}", "not UTF-8", None),
    ];
    for (name, body, reason, readable_id) in cases {
        let sig = stripe_header(STRIPE[0], body);
        let (status, answer) = post(r, "stripe", &[("Stripe-Signature", &sig)], body).await;
        assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})), "{name}");
        let (id, status, stored_reason, raw): (String, String, String, Vec<u8>) =
            sqlx::query_as("SELECT event_id, status, failure_reason, raw_body FROM webhook_inbox WHERE raw_body = $1")
                .bind(body)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(status, "failed", "{name}");
        assert!(stored_reason.contains(reason), "{name}: {stored_reason}");
        assert_eq!(raw, body, "{name}: the raw bytes are kept");
        let expected_id = readable_id.map(str::to_string).unwrap_or_else(|| digest(body));
        assert_eq!(id, expected_id, "{name}: the provider's id when it can be read, else the body's digest");
        // The same bytes again are a duplicate, not a second failed row.
        let sig = stripe_header(STRIPE[0], body);
        assert_eq!(post(r, "stripe", &[("Stripe-Signature", &sig)], body).await.1["status"], "duplicate", "{name}");
    }
    let null_payloads: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE payload IS NULL").fetch_one(&pool).await.unwrap();
    assert_eq!(null_payloads, 3, "only valid JSON (the one without an id) keeps its payload");
}

/// A lone surrogate, which neither `serde_json::Value` nor PostgreSQL's jsonb
/// takes: the event is still stored, as `failed`, with its raw bytes and its id.
/// (PostgreSQL refusing what our check let through is in `hostile.rs`.)
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_lone_surrogate_is_kept_as_failed_not_lost(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let body = br#"{"id":"evt_surrogate","type":"x","note":"\ud800"}"#;
    let sig = stripe_header(STRIPE[0], body);
    assert_eq!(
        post(r, "stripe", &[("Stripe-Signature", &sig)], body).await,
        (StatusCode::OK, json!({"status": "accepted"}))
    );
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    let batch = br#"{"transactions":[{"token":"ok","type":"authorization"},{"token":"bad","note":"\ud800"}]}"#;
    assert_eq!(
        post(r, "marqeta", &[("Authorization", &auth)], batch).await,
        (StatusCode::OK, json!({"accepted": 2, "duplicates": 0}))
    );
    let rows: Vec<(String, String, bool, Option<String>)> =
        sqlx::query_as("SELECT event_id, status, payload IS NULL, failure_reason FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let summary: Vec<(&str, &str, bool)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str(), r.2)).collect();
    assert_eq!(
        summary,
        [
            ("evt_surrogate", "failed", true),
            ("transactions:bad", "failed", true),
            ("transactions:ok", "pending", false)
        ]
    );
    assert!(rows[0].3.as_deref().unwrap().contains("not usable JSON"), "{:?}", rows[0].3);
}

// ---------- the database goes away ----------

// ---------- every Lambda event shape ----------

// ---------- a team's own scheme ----------

/// A provider the inbox does not know, as a team would write its scheme from
/// the public API only: `X-Acme-Signature: <hex HMAC-SHA256(secret, body)>`,
/// the event's id and type in the signed body.
struct Acme {
    secret: Vec<u8>,
}

impl webhook_inbox::schemes::Scheme for Acme {
    fn provider(&self) -> Provider {
        Provider::try_from("acme").unwrap()
    }

    fn verify(
        &self,
        d: &webhook_inbox::schemes::Delivery<'_>,
    ) -> Result<webhook_inbox::schemes::Verified, webhook_inbox::schemes::Rejected> {
        use hmac::Mac;
        use webhook_inbox::schemes::{Rejected, Verified};
        let sent = d.headers.get("x-acme-signature").ok_or_else(|| Rejected::missing("missing X-Acme-Signature"))?;
        let sent = hex::decode(sent.as_bytes()).map_err(|_| Rejected::malformed("X-Acme-Signature is not hex"))?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.secret).unwrap();
        mac.update(d.body);
        mac.verify_slice(&sent).map(|()| Verified { secret_index: 0 }).map_err(|_| Rejected::no_match("no match"))
    }

    fn events(&self, d: &webhook_inbox::schemes::Delivery<'_>) -> webhook_inbox::schemes::Events {
        let json: Option<Value> = serde_json::from_slice(d.body).ok();
        let field = |name: &str| json.as_ref().and_then(|j| j[name].as_str()).map(str::to_string);
        let kind = field("kind").unwrap_or_else(|| "unknown".into());
        webhook_inbox::schemes::Events::Single(webhook_inbox::schemes::NewEvent::from_json(d.body, field("id"), &kind))
    }

    fn kept_headers(&self) -> std::borrow::Cow<'_, [&str]> {
        std::borrow::Cow::Borrowed(&["x-acme-signature"])
    }
}

fn acme_signature(body: &[u8]) -> String {
    hex::encode(hmac::<hmac::Hmac<sha2::Sha256>>(b"acme-secret", &[body]))
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_scheme_of_the_teams_own_gets_a_route_and_claims_through_the_same_path(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use webhook_inbox::{
        schemes::{Delivery, RejectionKind, Scheme},
        App, Handlers,
    };
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let cfg = config(secrets(false));
    let app = App::new(Handlers::new()).with_scheme(Acme { secret: b"acme-secret".to_vec() });
    let r = Receiver::connect_with(opts, &cfg).with_app(&app);

    let body = br#"{"id":"acme_1","kind":"thing.made"}"#;
    let (status, answer) = post(&r, "acme", &[("X-Acme-Signature", &acme_signature(body))], body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, _) = post(&r, "acme", &[("X-Acme-Signature", &acme_signature(body))], body).await;
    assert_eq!(status, StatusCode::OK, "a redelivery is a duplicate");
    let (status, answer) = post(&r, "acme", &[("X-Acme-Signature", &acme_signature(b"{}"))], body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    // A body `jsonb` refuses, validly signed: kept as `failed`, never a 503 the provider retries for ever.
    let nul = br#"{"id":"acme_2","kind":"thing.made","note":"\u0000"}"#;
    let (status, answer) = post(&r, "acme", &[("X-Acme-Signature", &acme_signature(nul))], nul).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let rows: Vec<(String, String, String, String)> =
        sqlx::query_as("SELECT provider, event_id, event_type, status FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let rows: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|(p, i, t, s)| (p.as_str(), i.as_str(), t.as_str(), s.as_str())).collect();
    assert_eq!(rows, [("acme", "acme_1", "thing.made", "pending"), ("acme", "acme_2", "thing.made", "failed")]);

    // The stock providers are still there, and the team's refusals are matchable.
    let stripe = stripe_body("evt_beside_acme");
    let (status, _) = post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &stripe))], &stripe).await;
    assert_eq!(status, StatusCode::OK);
    let headers = http::HeaderMap::new();
    let refused = Acme { secret: vec![1] }.verify(&Delivery { headers: &headers, body, now: now() }).unwrap_err();
    assert_eq!(refused.kind(), RejectionKind::Missing);
}

// ---------- what `inbox show` re-verifies ----------

// ---------- a captured delivery sent again under another id ----------
