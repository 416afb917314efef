//! The `receive` binary, driven through a fake Lambda Runtime API with
//! `RUST_LOG=trace`: whatever the log filter, no secret, signature, Basic
//! credential or body reaches the logs (the Lambda runtime itself logs every
//! raw invocation event at trace), and whether the secrets come from the
//! environment or from Secrets Manager (whose SDK logs its calls at trace).

use std::time::Duration;

use inbox_tests::lambda::{answered, logs, runtime_api, spawn_function};
use serde_json::json;

const WEBHOOK_SECRET: &str = "whsec_LOGTEST_secret_value";
const BASIC: &str = "bWFycWV0YTpMT0dURVNULXBhc3N3b3Jk"; // marqeta:LOGTEST-password
const BODY_MARKER: &str = "LOGTEST-card-number-4242424242424242";
const DB_PASSWORD: &str = "LOGTEST-db-password";

#[tokio::test]
async fn at_trace_level_no_secret_signature_or_body_is_logged() {
    let unused_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    invoke_and_check_logs(&[
        ("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
        ("DATABASE_URL", format!("postgres://inbox:{DB_PASSWORD}@127.0.0.1:{unused_port}/inbox")),
    ])
    .await;
}

#[tokio::test]
async fn secrets_from_secrets_manager_verify_and_stay_out_of_the_logs() {
    let moto = inbox_tests::Moto::start();
    let sm = aws_sdk_secretsmanager::Client::new(&moto.aws().await);
    let create = |name: &'static str, value: String| {
        let sm = sm.clone();
        async move { sm.create_secret().name(name).secret_string(value).send().await.unwrap().arn().unwrap().to_string() }
    };
    let stripe = create("stripe", WEBHOOK_SECRET.into()).await;
    let db = create("db", format!(r#"{{"username":"inbox","password":"{DB_PASSWORD}"}}"#)).await;
    let unused_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // "claim failed" in the logs means the signature verified: the secret came from Secrets Manager.
    invoke_and_check_logs(&[
        ("STRIPE_WEBHOOK_SECRET_ARN", stripe),
        ("DATABASE_SECRET_ARN", db),
        ("DATABASE_URL", format!("postgres://127.0.0.1:{unused_port}/inbox")),
        ("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ])
    .await;
}

/// Runs the binary with `vars` for one signed Stripe delivery (with a Basic
/// credential too) to a database that is not there, and checks its logs.
async fn invoke_and_check_logs(vars: &[(&str, String)]) {
    let body = json!({"id": "evt_log", "type": "x", "card": BODY_MARKER}).to_string();
    let t = inbox_tests::now();
    let signature = inbox_tests::stripe_v1(WEBHOOK_SECRET, t, body.as_bytes());
    let mut event = inbox_tests::fixture("apigw-http-v2.json");
    event["headers"] = json!({
        "content-type": "application/json",
        "stripe-signature": format!("t={t},v1={signature}"),
        "authorization": format!("Basic {BASIC}"),
    });
    event["body"] = json!(body);
    event["isBase64Encoded"] = json!(false);
    let api = runtime_api("receive", event).await;
    let child = spawn_function(
        env!("CARGO_BIN_EXE_receive"),
        "receive",
        &api,
        &[&[("RUST_LOG", "trace".to_string())], vars].concat(),
    );
    let answered = answered(&api, Duration::from_secs(15)).await;
    let logs = logs(child);
    assert!(answered, "the function never answered the invocation; logs:\n{logs}");
    assert!(logs.contains("claim failed"), "the run logged (the database is unreachable on purpose):\n{logs}");
    for secret in [WEBHOOK_SECRET, &signature, BASIC, "LOGTEST-password", BODY_MARKER, DB_PASSWORD] {
        assert!(!logs.contains(secret), "{secret} reached the logs:\n{logs}");
    }
}
