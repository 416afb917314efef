//! Receive over its transports and through failures: API Gateway's REST and
//! HTTP events, a Function URL, an ALB; the database down and back; a
//! connection killed between deliveries; what is not a route, a provider
//! configured or a method taken, refused with words.

use std::time::Duration;

use http::StatusCode;
use inbox_tests::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::Receiver;
use webhook_inbox_service::dev::EmbeddedPostgres;

use crate::receive::stripe_body;

#[tokio::test]
async fn the_database_down_answers_503_and_recovers_when_it_returns() {
    let mut pg = EmbeddedPostgres::start().await.expect("a throwaway cluster");
    let url = pg.url();
    let setup = PgPool::connect(&url).await.unwrap();
    webhook_inbox::App::default().migrate(&setup).await.unwrap();
    setup.close().await;
    let mut cfg = config(secrets(false));
    cfg.db.url = Some(url.clone());
    let r = Receiver::from_config(&cfg).unwrap();
    let send_event = |id: &'static str| {
        let body = stripe_body(id);
        let sig = stripe_header(STRIPE[0], &body);
        let r = &r;
        async move { post(r, "stripe", &[("Stripe-Signature", &sig)], &body).await }
    };
    assert_eq!(send_event("evt_before").await.0, StatusCode::OK);

    pg.pause().await.unwrap();
    let started = std::time::Instant::now();
    let (status, body) = send_event("evt_during").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(started.elapsed() < Duration::from_secs(10), "503 comes within the acquire timeout");
    assert_eq!(body["error"], "the inbox is unavailable; nothing was stored, retry later");

    pg.resume().await.unwrap();
    let (status, body) = send_event("evt_during").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("accepted")), "the retry is stored");
    let check = PgPool::connect(&url).await.unwrap();
    assert_eq!(count(&check).await, 2);
    check.close().await;
    pg.destroy().await.unwrap();
}

/// API Gateway REST (payload 1.0), a Function URL and an ALB, each as the real
/// event JSON that `lambda_http` parses, reach the same handler and the same row.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn rest_api_function_url_and_alb_events_reach_the_same_handler(_: PgPoolOptions, opts: PgConnectOptions) {
    use base64::Engine as _;
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);

    let body = stripe_body("evt_rest");
    let sig = stripe_header(STRIPE[0], &body);
    let mut rest = fixture("apigw-rest.json");
    rest["headers"]["Stripe-Signature"] = json!(sig);
    rest["multiValueHeaders"]["Stripe-Signature"] = json!([sig]);
    rest["body"] = json!(String::from_utf8(body.clone()).unwrap());

    let body_url = stripe_body("evt_url");
    let mut function_url = fixture("function-url.json");
    function_url["headers"]["stripe-signature"] = json!(stripe_header(STRIPE[1], &body_url));
    function_url["body"] = json!(b64(&body_url));

    let body_alb = stripe_body("evt_alb");
    let mut alb = fixture("alb.json");
    alb["headers"]["stripe-signature"] = json!(stripe_header(STRIPE[0], &body_alb));
    alb["body"] = json!(b64(&body_alb));

    for (name, event, id) in
        [("REST", rest, "evt_rest"), ("Function URL", function_url, "evt_url"), ("ALB", alb, "evt_alb")]
    {
        let req = lambda_http::request::from_str(&event.to_string()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(send(r, req).await, (StatusCode::OK, json!({"status": "accepted"})), "{name}");
        let raw: Vec<u8> = sqlx::query_scalar("SELECT raw_body FROM webhook_inbox WHERE event_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(raw, stripe_body(id), "{name}: the decoded bytes are what was verified and stored");
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_connection_killed_between_deliveries_is_replaced_without_a_503(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let (pool, r) = (app.pool.clone(), &app.receiver);
    for id in ["evt_k1", "evt_k2"] {
        let body = stripe_body(id);
        assert_eq!(
            post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await.0,
            StatusCode::OK
        );
    }
    // As a failover or an idle cut would: every connection the receiver holds dies.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'webhook-inbox' AND datname = current_database()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!killed.is_empty());
    let body = stripe_body("evt_k3");
    let (status, answer) = post(r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"status": "accepted"})));
    assert_eq!(count(&pool).await, 3);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn unknown_unconfigured_and_wrong_method_are_refused_with_words(_: PgPoolOptions, opts: PgConnectOptions) {
    let mut only_stripe = secrets(false);
    only_stripe.shopify.clear();
    let r = receiver(opts, only_stripe);
    let (status, body) = post(&r, "paypal", &[], b"{}").await;
    assert_eq!((status, body["error"].as_str().unwrap()), (StatusCode::NOT_FOUND, "unknown provider \"paypal\""));
    let (status, body) = post(&r, "shopify", &[], b"{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("no secret configured"));
    let mut req = request("stripe", &[], b"");
    *req.method_mut() = http::Method::GET;
    let response = r.handle(req).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()["allow"], "POST");
}
