//! The `migrate` binary as CloudFormation's custom resource, driven through a
//! stand-in Lambda Runtime API, against a real, empty database and a stand-in
//! for CloudFormation's pre-signed response URL (accepted as
//! `AWS_ENDPOINT_URL_S3` names an emulator's): every request is answered, the
//! schema is applied once, Delete never touches the database, and a request
//! whose `ResponseURL` is not CloudFormation's is neither acted on nor answered.

use std::time::Duration;

use inbox_tests::{
    fixture,
    history::{applied, sqlx_history, stock_history},
    lambda::{database_url, logs, result, runtime_api_each, spawn_function},
};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use webhook_inbox_migrations::INBOX as MIGRATIONS;
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

/// The one physical id: updates never replace the resource.
const PHYSICAL_ID: &str = "webhook-inbox-migrations";

async fn cloudformation() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    server
}

fn request(kind: &str, cfn: &MockServer) -> Value {
    let mut event = fixture("cloudformation-custom-resource.json");
    event["RequestType"] = json!(kind);
    event["ResponseURL"] = json!(format!("{}/response?X-Amz-Signature=presigned", cfn.uri()));
    if kind != "Create" {
        event["PhysicalResourceId"] = json!(PHYSICAL_ID);
        event["OldResourceProperties"] = json!({});
    }
    event
}

/// What CloudFormation received, in order.
async fn answers(cfn: &MockServer) -> Vec<Value> {
    let requests = cfn.received_requests().await.unwrap();
    for r in &requests {
        assert!(r.headers.get("content-type").is_none(), "the pre-signed URL is signed without a content type");
    }
    requests.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
}

/// Runs the binary on `requests` in turn, with `DATABASE_URL` `database` and
/// `cfn` as the S3 endpoint when given; what it answered each invocation
/// (`Ok` its result, the status it answered CloudFormation; `Err` its error).
async fn invoke(requests: Vec<Value>, database: String, cfn: Option<&MockServer>) -> Vec<Result<Value, Value>> {
    let n = requests.len();
    let api = runtime_api_each("migrate", requests).await;
    let mut vars = vec![("DATABASE_URL", database), ("AWS_REGION", "us-east-1".to_string())];
    vars.extend(cfn.map(|cfn| ("AWS_ENDPOINT_URL_S3", cfn.uri())));
    let child = spawn_function(env!("CARGO_BIN_EXE_migrate"), "migrate", &api, &vars);
    let mut results = Vec::new();
    for i in 1..=n {
        results.push(result(&api, &format!("req-{i}"), Duration::from_secs(60)).await);
    }
    let logs = logs(child);
    results.into_iter().map(|r| r.unwrap_or_else(|| panic!("an invocation not answered; logs:\n{logs}"))).collect()
}

#[sqlx::test(migrations = false)]
async fn create_applies_the_schema_and_update_is_a_no_op(pool_options: PgPoolOptions, options: PgConnectOptions) {
    let pool = pool_options.connect_lazy_with(options);
    let cfn = cloudformation().await;
    assert_eq!(invoke(vec![request("Create", &cfn)], database_url(&pool), Some(&cfn)).await, [Ok(json!("SUCCESS"))]);
    let latest = MIGRATIONS.iter().map(|m| m.version).max().unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE tablename IN ('webhook_inbox', 'transactional_outbox')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 2);
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);
    let stock: Vec<i64> = stock::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(stock_history(&pool).await, stock, "the stock domain's, after the inbox's");
    assert_eq!(sqlx_history(&pool).await, Vec::<i64>::new(), "sqlx's history is left to a team");

    assert_eq!(invoke(vec![request("Update", &cfn)], database_url(&pool), Some(&cfn)).await, [Ok(json!("SUCCESS"))]);
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64, "nothing applied twice");

    let answers = answers(&cfn).await;
    assert_eq!(answers.len(), 2);
    for a in &answers {
        assert_eq!(a["Status"], "SUCCESS");
        assert_eq!(a["PhysicalResourceId"], PHYSICAL_ID);
        assert_eq!(a["LogicalResourceId"], "Migrations");
        assert_eq!(a["RequestId"], "2c0a7f0e-3c5c-4c4e-9b5c-1d1f2f5c4b3a");
        assert_eq!(a["Data"]["Version"], latest.to_string());
    }
}

/// A database nobody listens on, with a password that must not reach CloudFormation.
fn unreachable() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("postgres://inbox:db-password-never-shown@127.0.0.1:{port}/inbox")
}

#[tokio::test]
async fn an_unreachable_database_fails_the_deploy_with_the_reason() {
    let cfn = cloudformation().await;
    assert_eq!(invoke(vec![request("Create", &cfn)], unreachable(), Some(&cfn)).await, [Ok(json!("FAILED"))]);
    let answer = &answers(&cfn).await[0];
    assert_eq!(answer["Status"], "FAILED");
    let reason = answer["Reason"].as_str().unwrap();
    assert!(reason.starts_with("cannot apply the migrations"), "{reason}");
    assert!(!reason.contains("db-password-never-shown"), "{reason}");
}

#[tokio::test]
async fn delete_succeeds_without_touching_the_database() {
    let cfn = cloudformation().await;
    assert_eq!(invoke(vec![request("Delete", &cfn)], unreachable(), Some(&cfn)).await, [Ok(json!("SUCCESS"))]);
    assert_eq!(answers(&cfn).await[0]["Status"], "SUCCESS");
}

/// The invocation fails when its answer could not be delivered (three tries),
/// and says so without the pre-signed URL (a credential).
#[tokio::test]
async fn an_answer_cloudformation_does_not_take_is_an_error() {
    let cfn = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(403)).mount(&cfn).await;
    let answered = invoke(vec![request("Delete", &cfn)], unreachable(), Some(&cfn)).await.remove(0);
    let err = answered.expect_err("the invocation fails");
    let message = err["errorMessage"].as_str().unwrap();
    assert!(message.starts_with("the answer could not be delivered"), "{err}");
    assert!(!message.contains("presigned"), "the URL is a credential: {err}");
    assert_eq!(cfn.received_requests().await.unwrap().len(), 3, "tried three times");
}

/// Only CloudFormation's pre-signed S3 URLs (and the S3 endpoint
/// `AWS_ENDPOINT_URL_S3` names) are answered: a request naming any other (an
/// invocation by someone else, pointing the answer at an internal host) is
/// not acted on, and nothing is sent there. (Which URLs are CloudFormation's:
/// `ResponseUrls`' unit test in `shared/src/migrate.rs`.)
#[sqlx::test(migrations = false)]
async fn a_response_url_that_is_not_cloudformations_is_neither_acted_on_nor_answered(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    let cfn = cloudformation().await;
    // Without AWS_ENDPOINT_URL_S3 the stand-in on 127.0.0.1 is no S3 host of us-east-1.
    let answered = invoke(vec![request("Create", &cfn)], database_url(&pool), None).await.remove(0);
    let err = answered.expect_err("the invocation fails");
    let message = err["errorMessage"].as_str().unwrap();
    assert!(message.starts_with("ResponseURL ") && message.ends_with("not acted on, and not answered"), "{err}");
    assert!(message.contains("127.0.0.1") && !message.contains("presigned"), "{err}");
    assert!(cfn.received_requests().await.unwrap().is_empty(), "nothing sent");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "no migration applied");
}

/// A function whose configuration cannot be read still answers every
/// request: Create and Update fail with the reason, Delete succeeds (so that
/// a stack with a broken configuration can be deleted).
#[tokio::test]
async fn a_function_that_could_not_start_fails_create_and_update_with_the_reason_and_deletes() {
    let cfn = cloudformation().await;
    let requests = ["Create", "Update", "Delete"].map(|kind| request(kind, &cfn)).to_vec();
    let results = invoke(requests, "mysql://inbox@127.0.0.1/inbox".into(), Some(&cfn)).await;
    assert_eq!(results, [Ok(json!("FAILED")), Ok(json!("FAILED")), Ok(json!("SUCCESS"))]);
    let why = "cannot start: DATABASE_URL: is a mysql: URL, not PostgreSQL's (postgres://user@host:5432/database)";
    let answers = answers(&cfn).await;
    let got: Vec<(&str, &str)> =
        answers.iter().map(|a| (a["Status"].as_str().unwrap(), a["Reason"].as_str().unwrap_or(""))).collect();
    assert_eq!(got, [("FAILED", why), ("FAILED", why), ("SUCCESS", "")]);
}
