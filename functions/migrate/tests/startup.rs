//! The `migrate` binary, driven through a fake Lambda Runtime API: when its
//! configuration cannot be read (here, a database secret Secrets Manager does
//! not have), CloudFormation still gets an answer at once, FAILED with the
//! reason, instead of waiting for a response that never comes.

use std::{
    process::{Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};
use wiremock::{
    matchers::{method, path, path_regex},
    Mock, MockServer, ResponseTemplate,
};

#[tokio::test]
async fn a_secret_it_cannot_read_is_answered_failed_with_the_variable_and_arn() {
    let moto = inbox_tests::Moto::start();
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:inbox/db-owner-AbCdEf";
    let cfn = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(200)).mount(&cfn).await;

    let api = MockServer::start().await;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut event = inbox_tests::fixture("cloudformation-custom-resource.json");
    event["ResponseURL"] = json!(format!("{}/response?X-Amz-Signature=presigned", cfn.uri()));
    let invocation = ResponseTemplate::new(200)
        .insert_header("lambda-runtime-aws-request-id", "req-1")
        .insert_header("lambda-runtime-deadline-ms", (now_ms + 300_000).to_string().as_str())
        .insert_header("lambda-runtime-invoked-function-arn", "arn:aws:lambda:us-east-1:123456789012:function:migrate")
        .set_body_json(event);
    Mock::given(method("GET"))
        .and(path("/2018-06-01/runtime/invocation/next"))
        .respond_with(invocation)
        .up_to_n_times(1)
        .mount(&api)
        .await;
    // Later polls hang: one invocation is enough.
    Mock::given(method("GET"))
        .and(path("/2018-06-01/runtime/invocation/next"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(120)))
        .mount(&api)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/2018-06-01/runtime/"))
        .respond_with(ResponseTemplate::new(202))
        .mount(&api)
        .await;

    let mut child = Command::new(env!("CARGO_BIN_EXE_migrate"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", api.address().to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "migrate")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "stream")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/migrate")
        .env("DATABASE_URL", "postgres://127.0.0.1:9/inbox")
        .env("DATABASE_SECRET_ARN", missing)
        .env("AWS_ENDPOINT_URL_SECRETS_MANAGER", &moto.url)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let mut answer = None;
    for _ in 0..600 {
        if let Some(r) = cfn.received_requests().await.unwrap_or_default().first() {
            answer = Some(serde_json::from_slice::<Value>(&r.body).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The invocation's own result comes just after the answer to CloudFormation.
    for _ in 0..100 {
        let posted = api.received_requests().await.unwrap_or_default();
        if posted.iter().any(|r| r.method.as_str() == "POST") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let logs = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let answer = answer.unwrap_or_else(|| panic!("CloudFormation got no answer; logs:\n{logs}"));
    assert_eq!(answer["Status"], "FAILED", "{answer}");
    assert_eq!(answer["RequestId"], "2c0a7f0e-3c5c-4c4e-9b5c-1d1f2f5c4b3a");
    let reason = answer["Reason"].as_str().unwrap();
    assert!(reason.starts_with("cannot start: DATABASE_SECRET_ARN"), "{reason}");
    assert!(reason.contains(missing), "the reason names the secret: {reason}");
    let posted = api.received_requests().await.unwrap();
    assert!(
        posted.iter().any(|r| r.method.as_str() == "POST" && r.url.path().ends_with("/req-1/response")),
        "the invocation succeeded: the answer was delivered; logs:\n{logs}"
    );
}
