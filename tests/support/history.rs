//! What a database's migration histories hold: the inbox's, sqlx's (a
//! team's), the stock application's, and its tables.

use sqlx::PgPool;

/// The inbox's applied migrations, from its own history.
pub async fn applied(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM webhook_inbox_migrations").fetch_one(pool).await.unwrap()
}

/// The versions sqlx's own history holds (a team's); none when it has no such table.
pub async fn sqlx_history(pool: &PgPool) -> Vec<i64> {
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(pool).await.unwrap();
    if !exists {
        return vec![];
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The stock application's applied migrations, from its own history.
pub async fn stock_history(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM webhook_inbox_reference_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The tables of the schema `public`, by name.
pub async fn tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}
