//! The `migrate` binary, driven through a fake Lambda Runtime API: when its
//! configuration cannot be read (here, a database secret Secrets Manager does
//! not have), CloudFormation still gets an answer at once, FAILED with the
//! reason, instead of waiting for a response that never comes.

use std::time::Duration;

use inbox_tests::lambda::{answered, logs, runtime_api, spawn_function};
use serde_json::{json, Value};
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn a_secret_it_cannot_read_is_answered_failed_with_the_variable_and_arn() {
    let moto = inbox_tests::Moto::start();
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:inbox/db-owner-AbCdEf";
    let cfn = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(200)).mount(&cfn).await;

    let mut event = inbox_tests::fixture("cloudformation-custom-resource.json");
    event["ResponseURL"] = json!(format!("{}/response?X-Amz-Signature=presigned", cfn.uri()));
    let api = runtime_api("migrate", event).await;
    let vars = [
        ("DATABASE_URL", "postgres://127.0.0.1:9/inbox".to_string()),
        ("DATABASE_SECRET_ARN", missing.to_string()),
        ("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ENDPOINT_URL_S3", cfn.uri()),
    ];
    let child = spawn_function(env!("CARGO_BIN_EXE_migrate"), "migrate", &api, &vars);
    // The invocation's own result comes just after the answer to CloudFormation.
    let invocation_answered = answered(&api, Duration::from_secs(30)).await;
    let logs = logs(child);
    let answer =
        cfn.received_requests().await.unwrap().first().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap());
    let answer = answer.unwrap_or_else(|| panic!("CloudFormation got no answer; logs:\n{logs}"));
    assert_eq!(answer["Status"], "FAILED", "{answer}");
    assert_eq!(answer["RequestId"], "2c0a7f0e-3c5c-4c4e-9b5c-1d1f2f5c4b3a");
    let reason = answer["Reason"].as_str().unwrap();
    assert!(reason.starts_with("cannot start: DATABASE_SECRET_ARN"), "{reason}");
    assert!(reason.contains(missing), "the reason names the secret: {reason}");
    assert!(invocation_answered, "the invocation succeeded: the answer was delivered; logs:\n{logs}");
}
