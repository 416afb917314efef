//! `inbox_console_users` and `inbox_console_sessions`: who may sign in to the
//! console, as what, and the sessions signed in. Passwords and session tokens
//! are never stored: their hashes are.

use std::time::Duration;

use sqlx::PgPool;

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads everything the console shows; can act on nothing.
    Viewer,
    /// A viewer who can also replay, requeue and retry (each audited under the user's name).
    Operator,
}

impl Role {
    /// The name in the `role` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// The role of this name, if it is one.
    pub fn parse(name: &str) -> Option<Role> {
        [Role::Viewer, Role::Operator].into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A console user, as listed (never with the password's hash).
#[derive(Debug, Clone, serde::Serialize)]
pub struct User {
    /// The name signed in with.
    pub name: String,
    /// What the user may do.
    pub role: Role,
    /// When the user was added (PostgreSQL's own text).
    pub created_at: String,
    /// Sessions signed in and not expired.
    pub sessions: i64,
}

/// Adds a user unless the name is taken; whether it was added.
pub(crate) async fn insert_user(pool: &PgPool, name: &str, hash: &str, role: Role) -> Result<bool, sqlx::Error> {
    let done = super::query(
        "INSERT INTO inbox_console_users (name, password_hash, role) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(hash)
    .bind(role.as_str())
    .execute(super::Autocommit(pool))
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a user's password hash and role, adding the user if need be; the
/// user's sessions end (a new password signs everyone out).
pub(crate) async fn upsert_user(pool: &PgPool, name: &str, hash: &str, role: Role) -> Result<(), sqlx::Error> {
    super::query(
        "WITH u AS (
             INSERT INTO inbox_console_users (name, password_hash, role) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET password_hash = excluded.password_hash, role = excluded.role
             RETURNING name)
         DELETE FROM inbox_console_sessions WHERE user_name IN (SELECT name FROM u)",
    )
    .bind(name)
    .bind(hash)
    .bind(role.as_str())
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

/// Removes a user and its sessions; whether there was one.
pub(crate) async fn delete_user(pool: &PgPool, name: &str) -> Result<bool, sqlx::Error> {
    let done = super::query("DELETE FROM inbox_console_users WHERE name = $1")
        .bind(name)
        .execute(super::Autocommit(pool))
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Every user, by name.
pub(crate) async fn list_users(pool: &PgPool) -> Result<Vec<User>, sqlx::Error> {
    let rows: Vec<(String, String, String, i64)> = super::query_as(
        "SELECT u.name, u.role, u.created_at::text,
                (SELECT count(*) FROM inbox_console_sessions AS s WHERE s.user_name = u.name AND s.expires_at > now())
         FROM inbox_console_users AS u ORDER BY u.name",
    )
    .fetch_all(super::Autocommit(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, role, created_at, sessions)| User {
            name,
            role: Role::parse(&role).unwrap_or(Role::Viewer),
            created_at,
            sessions,
        })
        .collect())
}

/// A user's password hash and role, to check a sign-in against.
pub(crate) async fn credentials(pool: &PgPool, name: &str) -> Result<Option<(String, Role)>, sqlx::Error> {
    let row: Option<(String, String)> =
        super::query_as("SELECT password_hash, role FROM inbox_console_users WHERE name = $1")
            .bind(name)
            .fetch_optional(super::Autocommit(pool))
            .await?;
    Ok(row.map(|(hash, role)| (hash, Role::parse(&role).unwrap_or(Role::Viewer))))
}

/// A signed-in session: whose, as what, and the CSRF token its forms carry.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub user: String,
    pub role: Role,
    pub csrf: String,
}

/// Starts a session for `ttl` (and ends the expired ones of every user).
pub(crate) async fn insert_session(
    pool: &PgPool,
    token_sha256: &[u8],
    user: &str,
    csrf: &str,
    ttl: Duration,
) -> Result<(), sqlx::Error> {
    super::query(
        "WITH expired AS (DELETE FROM inbox_console_sessions WHERE expires_at < now())
         INSERT INTO inbox_console_sessions (token_sha256, user_name, csrf, expires_at)
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')",
    )
    .bind(token_sha256)
    .bind(user)
    .bind(csrf)
    .bind(ttl.as_millis() as i64)
    .execute(super::Autocommit(pool))
    .await?;
    Ok(())
}

/// The session of this token's hash, if it is signed in and not expired.
pub(crate) async fn session(pool: &PgPool, token_sha256: &[u8]) -> Result<Option<Session>, sqlx::Error> {
    let row: Option<(String, String, String)> = super::query_as(
        "SELECT u.name, u.role, s.csrf FROM inbox_console_sessions AS s
         JOIN inbox_console_users AS u ON u.name = s.user_name
         WHERE s.token_sha256 = $1 AND s.expires_at > now()",
    )
    .bind(token_sha256)
    .fetch_optional(super::Autocommit(pool))
    .await?;
    Ok(row.map(|(user, role, csrf)| Session { user, role: Role::parse(&role).unwrap_or(Role::Viewer), csrf }))
}

/// Ends a session.
pub(crate) async fn delete_session(pool: &PgPool, token_sha256: &[u8]) -> Result<(), sqlx::Error> {
    super::query("DELETE FROM inbox_console_sessions WHERE token_sha256 = $1")
        .bind(token_sha256)
        .execute(super::Autocommit(pool))
        .await?;
    Ok(())
}
