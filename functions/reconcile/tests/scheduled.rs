//! The `reconcile` binary, driven through a stand-in Lambda Runtime API, as
//! the schedule invokes it: a source whose API fails makes the invocation fail
//! (the alarm on the function's errors sees it), naming the source and why.

use std::time::Duration;

use inbox_tests::lambda::{database_url, logs, runtime_api, spawn_function};
use serde_json::{json, Value};
use sqlx::PgPool;
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_source_that_fails_fails_the_invocation_with_its_name_and_reason(pool: PgPool) {
    let stripe = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(500).set_body_string("down")).mount(&stripe).await;
    let api = runtime_api("reconcile", json!({"source": "aws.events"})).await;
    let url = database_url(&pool);
    let vars = [("DATABASE_URL", url), ("STRIPE_API_KEY", "sk_test_fake".into()), ("STRIPE_API_BASE", stripe.uri())];
    let child = spawn_function(env!("CARGO_BIN_EXE_reconcile"), "reconcile", &api, &vars);
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let error = loop {
        let requests = api.received_requests().await.unwrap_or_default();
        if let Some(r) = requests.iter().find(|r| r.url.path().ends_with("/req-1/error")) {
            break Some(serde_json::from_slice::<Value>(&r.body).unwrap());
        }
        if std::time::Instant::now() >= until || requests.iter().any(|r| r.url.path().ends_with("/req-1/response")) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let logs = logs(child);
    let error = error.unwrap_or_else(|| panic!("the invocation did not fail; logs:\n{logs}"));
    let message = error["errorMessage"].as_str().unwrap_or_default();
    assert!(message.contains("stripe events") && message.contains("HTTP 500"), "{error}");
}
