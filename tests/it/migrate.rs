//! The `migrate` custom resource against a real, empty database and a stand-in
//! for CloudFormation's pre-signed response URL: every request is answered,
//! the schema is applied once, Delete never touches the database.

use std::time::{Duration, Instant};

use aws_lambda_events::event::cloudformation::{
    CloudFormationCustomResourceRequest as Request, CloudFormationCustomResourceResponseStatus as Status,
};
use inbox_tests::fixture;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{core::http::http_client, db::MIGRATOR, migrate};
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

async fn cloudformation() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
    server
}

fn request(kind: &str, cfn: &MockServer) -> Request {
    let mut event = fixture("cloudformation-custom-resource.json");
    event["RequestType"] = json!(kind);
    event["ResponseURL"] = json!(format!("{}/response?X-Amz-Signature=presigned", cfn.uri()));
    if kind != "Create" {
        event["PhysicalResourceId"] = json!(migrate::PHYSICAL_ID);
        event["OldResourceProperties"] = json!({});
    }
    serde_json::from_value(event).expect("the fixture is a custom resource request")
}

/// What CloudFormation received, in order.
async fn answers(cfn: &MockServer) -> Vec<Value> {
    let requests = cfn.received_requests().await.unwrap();
    for r in &requests {
        assert!(r.headers.get("content-type").is_none(), "the pre-signed URL is signed without a content type");
    }
    requests.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect()
}

async fn run(kind: &str, pool: &PgPool, cfn: &MockServer) -> Status {
    let http = http_client(Duration::from_secs(5)).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    migrate::on_custom_resource(request(kind, cfn), Ok(pool), &http, until).await.expect("answered")
}

async fn applied(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success").fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn create_applies_the_schema_and_update_is_a_no_op(pool_options: PgPoolOptions, options: PgConnectOptions) {
    let pool = pool_options.connect_lazy_with(options);
    let cfn = cloudformation().await;
    assert_eq!(run("Create", &pool, &cfn).await, Status::Success);
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE tablename IN ('webhook_inbox', 'transactional_outbox')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 2);
    assert_eq!(applied(&pool).await, MIGRATOR.iter().count() as i64);

    assert_eq!(run("Update", &pool, &cfn).await, Status::Success);
    assert_eq!(applied(&pool).await, MIGRATOR.iter().count() as i64, "nothing applied twice");

    let answers = answers(&cfn).await;
    assert_eq!(answers.len(), 2);
    for a in &answers {
        assert_eq!(a["Status"], "SUCCESS");
        assert_eq!(a["PhysicalResourceId"], migrate::PHYSICAL_ID);
        assert_eq!(a["LogicalResourceId"], "Migrations");
        assert_eq!(a["RequestId"], "2c0a7f0e-3c5c-4c4e-9b5c-1d1f2f5c4b3a");
        assert_eq!(a["Data"]["Version"], latest.to_string());
    }
}

/// Our migrations apply all or nothing, and take the lock `sqlx migrate run`
/// takes: neither applies half of the other's work.
#[sqlx::test(migrations = false)]
async fn migrations_apply_all_or_nothing_and_wait_for_sqlx_s_lock(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    use sqlx::{migrate::Migrate, Connection};
    let pool = pool_options.connect_lazy_with(options.clone());

    // The last migration's table exists already: that migration fails, and takes the others with it.
    sqlx::query("CREATE TABLE inbox_audit (id int)").execute(&pool).await.unwrap();
    let err = webhook_inbox::db::migrate(&pool).await.unwrap_err();
    assert!(err.to_string().contains("inbox_audit"), "{err}");
    let tables: Vec<String> = sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(tables, ["inbox_audit"], "only the table made by hand is there");
    sqlx::query("DROP TABLE inbox_audit").execute(&pool).await.unwrap();

    let mut sqlx_cli = sqlx::PgConnection::connect_with(&options).await.unwrap();
    sqlx_cli.lock().await.unwrap();
    let ours = tokio::spawn({
        let pool = pool.clone();
        async move { webhook_inbox::db::migrate(&pool).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ours.is_finished(), "migrated while sqlx's lock was held");
    sqlx_cli.unlock().await.unwrap();
    ours.await.unwrap().unwrap();
    assert_eq!(applied(&pool).await, MIGRATOR.iter().count() as i64);
}

/// A database nobody listens on, with a password that must not reach CloudFormation.
fn unreachable() -> PgPool {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://inbox:db-password-never-shown@127.0.0.1:{port}/inbox");
    PgPoolOptions::new().acquire_timeout(Duration::from_secs(2)).connect_lazy(&url).unwrap()
}

#[tokio::test]
async fn an_unreachable_database_fails_the_deploy_with_the_reason() {
    let cfn = cloudformation().await;
    assert_eq!(run("Create", &unreachable(), &cfn).await, Status::Failed);
    let answer = &answers(&cfn).await[0];
    assert_eq!(answer["Status"], "FAILED");
    let reason = answer["Reason"].as_str().unwrap();
    assert!(reason.starts_with("cannot apply the migrations"), "{reason}");
    assert!(!reason.contains("db-password-never-shown"), "{reason}");
}

#[tokio::test]
async fn delete_succeeds_without_touching_the_database() {
    let cfn = cloudformation().await;
    assert_eq!(run("Delete", &unreachable(), &cfn).await, Status::Success);
    assert_eq!(answers(&cfn).await[0]["Status"], "SUCCESS");
}

#[tokio::test]
async fn an_answer_cloudformation_does_not_take_is_an_error() {
    let cfn = MockServer::start().await;
    Mock::given(method("PUT")).respond_with(ResponseTemplate::new(403)).mount(&cfn).await;
    let http = http_client(Duration::from_secs(5)).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let err = migrate::on_custom_resource(request("Delete", &cfn), Ok(&unreachable()), &http, until).await.unwrap_err();
    assert!(!err.to_string().contains("presigned"), "the URL is a credential: {err}");
    assert_eq!(cfn.received_requests().await.unwrap().len(), 3, "tried three times");
}

#[tokio::test]
async fn a_function_that_could_not_start_fails_create_and_update_with_the_reason_and_deletes() {
    let cfn = cloudformation().await;
    let http = http_client(Duration::from_secs(5)).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let why = "cannot start: DATABASE_SECRET_ARN: cannot read secret arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf: AccessDeniedException";
    for (kind, expected) in [("Create", Status::Failed), ("Update", Status::Failed), ("Delete", Status::Success)] {
        let status = migrate::on_custom_resource(request(kind, &cfn), Err(why), &http, until).await.expect("answered");
        assert_eq!(status, expected, "{kind}");
    }
    let answers = answers(&cfn).await;
    let got: Vec<(&str, &str)> =
        answers.iter().map(|a| (a["Status"].as_str().unwrap(), a["Reason"].as_str().unwrap_or(""))).collect();
    assert_eq!(got, [("FAILED", why), ("FAILED", why), ("SUCCESS", "")]);
}
