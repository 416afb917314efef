//! `inbox_api_tokens`: who may call the management API (tokens kept as their
//! SHA-256 only).

use sqlx::PgPool;
use webhook_inbox::{query, query_as, query_scalar, Autocommit};

use super::store::UserRole;

/// An API token, as listed (never the token, nor its hash).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct ApiToken {
    /// Its name: who calls, in the audit.
    pub name: String,
    /// `viewer` or `operator`.
    pub role: String,
    /// When it was made, and by whom.
    pub created_at: String,
    /// Who made it.
    pub created_by: String,
    /// When it was last used (to the minute).
    pub last_used_at: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
}

/// Makes a token `name` with `role` and this hash, audited as `token_add` by
/// `by`; false when the name is taken (revoked tokens keep theirs).
pub(crate) async fn add_token(
    pool: &PgPool,
    name: &str,
    role: UserRole,
    sha256: &[u8],
    by: &str,
) -> Result<bool, sqlx::Error> {
    let added: Option<i32> = query_scalar(
        "WITH added AS (
             INSERT INTO inbox_api_tokens (name, role, token_sha256, created_by) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING RETURNING name),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, api_token)
             SELECT $4, 'token_add', 'role ' || $2, name FROM added)
         SELECT 1 FROM added",
    )
    .bind(name)
    .bind(role.as_str())
    .bind(sha256)
    .bind(by)
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(added.is_some())
}

/// Revokes a token, audited as `token_revoke` by `by`; false when there is
/// no such token, or it was revoked already.
pub(crate) async fn revoke_token(pool: &PgPool, name: &str, by: &str) -> Result<bool, sqlx::Error> {
    let revoked: Option<i32> = query_scalar(
        "WITH revoked AS (
             UPDATE inbox_api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL RETURNING name),
         audited AS (
             INSERT INTO inbox_audit (actor, action, reason, api_token) SELECT $2, 'token_revoke', 'revoked', name FROM revoked)
         SELECT 1 FROM revoked",
    )
    .bind(name)
    .bind(by)
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(revoked.is_some())
}

/// Every token, revoked ones too, by name.
pub(crate) async fn list_tokens(pool: &PgPool) -> Result<Vec<ApiToken>, sqlx::Error> {
    query_as(
        "SELECT name, role, to_json(created_at)#>>'{}' AS created_at, created_by,
                to_json(last_used_at)#>>'{}' AS last_used_at, to_json(revoked_at)#>>'{}' AS revoked_at
         FROM inbox_api_tokens ORDER BY name",
    )
    .fetch_all(Autocommit(pool))
    .await
}

/// The live token of this hash: its name and role; its last use recorded (at
/// most once a minute, so that reads do not each write).
pub(crate) async fn token(pool: &PgPool, sha256: &[u8]) -> Result<Option<(String, UserRole)>, sqlx::Error> {
    let found: Option<(String, String, bool)> = query_as(
        "SELECT name, role, last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
         FROM inbox_api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(sha256)
    .fetch_optional(Autocommit(pool))
    .await?;
    let Some((name, role, stale)) = found else { return Ok(None) };
    if stale {
        query("UPDATE inbox_api_tokens SET last_used_at = now() WHERE name = $1")
            .bind(&name)
            .execute(Autocommit(pool))
            .await?;
    }
    Ok(UserRole::parse(&role).map(|role| (name, role)))
}
