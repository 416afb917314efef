//! Session timeouts: sent as startup parameters by default, or left to the
//! database role behind a proxy (`INBOX_DB_POOLER=proxy`), which refuses
//! startup parameters (PgBouncer) or pins the session on them (RDS Proxy).

use sqlx::{Connection, PgConnection};
use webhook_inbox::config::{DbConfig, Env};

fn server_url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL")
}

async fn show(config: &DbConfig) -> (String, String) {
    let pool = config.pool().unwrap();
    sqlx::query_as("SELECT current_setting('statement_timeout'), current_setting('application_name')")
        .fetch_one(&pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn timeouts_go_as_startup_parameters_or_come_from_the_role() {
    let role = format!("inbox_timeouts_{}", std::process::id());
    let mut admin = PgConnection::connect(&server_url()).await.unwrap();
    sqlx::query(&format!("DROP ROLE IF EXISTS {role}")).execute(&mut admin).await.unwrap();
    sqlx::query(&format!("CREATE ROLE {role} LOGIN")).execute(&mut admin).await.unwrap();
    sqlx::query(&format!("ALTER ROLE {role} SET statement_timeout = '1234ms'")).execute(&mut admin).await.unwrap();

    let mut url = url::Url::parse(&server_url()).unwrap();
    url.set_username(&role).unwrap();
    let startup = DbConfig::read(&Env::from_pairs(&[("DATABASE_URL", url.as_str())]), 1).unwrap();
    let on_role =
        DbConfig::read(&Env::from_pairs(&[("DATABASE_URL", url.as_str()), ("INBOX_DB_POOLER", "proxy")]), 1).unwrap();
    let by_startup = show(&startup).await;
    let by_role = show(&on_role).await;
    sqlx::query(&format!("DROP ROLE {role}")).execute(&mut admin).await.unwrap();

    assert_eq!(by_startup, ("5s".to_string(), "webhook-inbox".to_string()), "the startup parameter wins");
    assert_eq!(by_role, ("1234ms".to_string(), "webhook-inbox".to_string()), "the role's own setting");
    let err = DbConfig::read(&Env::from_pairs(&[("INBOX_DB_POOLER", "transaction")]), 1).unwrap_err();
    assert!(err.to_string().contains("INBOX_DB_POOLER"), "{err}");
}
