//! A stand-in for the Lambda Runtime API, to drive a function's own binary as
//! Lambda would: its invocations handed out in turn, every later poll held,
//! every result accepted (and kept, to read).

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use wiremock::{
    matchers::{method, path, path_regex},
    Mock, MockServer, ResponseTemplate,
};

/// Serves `event` once as invocation `req-1` of `function`, with a deadline a minute away.
pub async fn runtime_api(function: &str, event: Value) -> MockServer {
    runtime_api_each(function, [event]).await
}

/// Serves `events` in turn as invocations `req-1`, `req-2`, ... of
/// `function` (the next one when the function polls for it, after its answer
/// to the one before), each with a deadline a minute away.
pub async fn runtime_api_each(function: &str, events: impl IntoIterator<Item = Value>) -> MockServer {
    let api = MockServer::start().await;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let arn = format!("arn:aws:lambda:us-east-1:123456789012:function:{function}");
    // Mounted in order, each once: wiremock answers with the first that still matches.
    for (n, event) in events.into_iter().enumerate() {
        let invocation = ResponseTemplate::new(200)
            .insert_header("lambda-runtime-aws-request-id", format!("req-{}", n + 1).as_str())
            .insert_header("lambda-runtime-deadline-ms", (now_ms + 60_000).to_string().as_str())
            .insert_header("lambda-runtime-invoked-function-arn", arn.as_str())
            .insert_header(
                "lambda-runtime-trace-id",
                "Root=1-00000000-000000000000000000000000;Parent=0000000000000000;Sampled=0",
            )
            .set_body_json(event);
        Mock::given(method("GET"))
            .and(path("/2018-06-01/runtime/invocation/next"))
            .respond_with(invocation)
            .up_to_n_times(1)
            .mount(&api)
            .await;
    }
    // Later polls hang: the invocations given are enough.
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
    api
}

/// Starts the function binary `bin` against `api` with Lambda's environment and `vars`, nothing else.
pub fn spawn_function(bin: &str, function: &str, api: &MockServer, vars: &[(&str, String)]) -> Child {
    Command::new(bin)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", api.address().to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", function)
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "stream")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{function}"))
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether the function posted invocation `req-1`'s result, waiting up to `wait`.
pub async fn answered(api: &MockServer, wait: Duration) -> bool {
    matches!(result(api, "req-1", wait).await, Some(Ok(_)))
}

/// What the function posted for invocation `id` (`req-1`, ...), waiting up to
/// `wait`: `Ok` its result, `Err` the error it reported (`errorType`,
/// `errorMessage`); `None` when it posted neither.
pub async fn result(api: &MockServer, id: &str, wait: Duration) -> Option<Result<Value, Value>> {
    let (response, error) = (format!("/invocation/{id}/response"), format!("/invocation/{id}/error"));
    let until = std::time::Instant::now() + wait;
    loop {
        for r in api.received_requests().await.unwrap_or_default().iter().filter(|r| r.method.as_str() == "POST") {
            let body =
                || serde_json::from_slice(&r.body).unwrap_or_else(|_| Value::from(String::from_utf8_lossy(&r.body)));
            if r.url.path().ends_with(&response) {
                return Some(Ok(body()));
            }
            if r.url.path().ends_with(&error) {
                return Some(Err(body()));
            }
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops the function and returns what it printed.
pub fn logs(mut child: Child) -> String {
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The URL of a test's database (`#[sqlx::test]`'s pool), for a function's `DATABASE_URL`.
pub fn database_url(pool: &sqlx::PgPool) -> String {
    let o = pool.connect_options();
    format!("postgres://{}@{}:{}/{}", o.get_username(), o.get_host(), o.get_port(), o.get_database().unwrap_or(""))
}
