//! `inbox_console_users` and `inbox_console_sessions`: who may sign in to the
//! console, as what, and the sessions signed in. Passwords and session tokens
//! are never stored: their hashes are. Every change of a user, sign-in (failed
//! too), sign-out and session ended is written to `inbox_audit` under the
//! user's name, in the statement that makes it.

use std::time::Duration;

use sqlx::PgPool;
use webhook_inbox::{query, query_as, query_scalar, Autocommit};

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UserRole {
    /// Reads everything the console shows; can act on nothing.
    Viewer,
    /// A viewer who can also replay, requeue and retry (each audited under the user's name).
    Operator,
}

impl UserRole {
    /// The name in the `role` column.
    pub fn as_str(self) -> &'static str {
        match self {
            UserRole::Viewer => "viewer",
            UserRole::Operator => "operator",
        }
    }

    /// The role of this name, if it is one.
    pub fn parse(name: &str) -> Option<UserRole> {
        [UserRole::Viewer, UserRole::Operator].into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for UserRole {
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
    pub role: UserRole,
    /// When the user was added (PostgreSQL's own text).
    pub created_at: String,
    /// Sessions signed in and not expired.
    pub sessions: i64,
}

/// The audit record of something done to or by a console user, a CTE named
/// `audited` of the statement it is part of: one record for each row of
/// `from` (once, unconditionally, without). `$1` is the actor, `$2` the
/// action, `$3` the user and `$4` the reason.
fn audited(from: Option<&str>) -> String {
    let from = from.map_or(String::new(), |f| format!(" FROM {f}"));
    format!("audited AS (INSERT INTO inbox_audit (actor, action, reason, console_user) SELECT $1, $2, $4, $3{from})")
}

/// Records something done by a console user, or tried as one (a failed sign-in).
pub(crate) async fn audit(
    pool: &PgPool,
    actor: &str,
    action: &str,
    user: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    query(&format!("WITH {} SELECT 1", audited(None)))
        .bind(actor)
        .bind(action)
        .bind(user)
        .bind(reason)
        .execute(Autocommit(pool))
        .await?;
    Ok(())
}

/// Adds a user unless the name is taken (`expires`: a user that ends by
/// itself after this long), audited as `user_add` by `actor`; whether it was added.
pub(crate) async fn insert_user(
    pool: &PgPool,
    actor: &str,
    name: &str,
    hash: &str,
    role: UserRole,
    expires: Option<Duration>,
) -> Result<bool, sqlx::Error> {
    let added: Option<String> = query_scalar(&format!(
        "WITH added AS (
             INSERT INTO inbox_console_users (name, password_hash, role, expires_at)
             VALUES ($3, $5, $6, now() + $7 * interval '1 millisecond')
             ON CONFLICT (name) DO NOTHING RETURNING name),
         {}
         SELECT name FROM added",
        audited(Some("added"))
    ))
    .bind(actor)
    .bind("user_add")
    .bind(name)
    .bind(format!("added as {role}"))
    .bind(hash)
    .bind(role.as_str())
    .bind(expires.map(|e| e.as_millis() as i64))
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(added.is_some())
}

/// Removes a user and its sessions, audited as `user_remove` by `actor`; whether there was one.
pub(crate) async fn delete_user(pool: &PgPool, actor: &str, name: &str) -> Result<bool, sqlx::Error> {
    let removed: Option<String> = query_scalar(&format!(
        "WITH removed AS (DELETE FROM inbox_console_users WHERE name = $3 RETURNING name),
         {}
         SELECT name FROM removed",
        audited(Some("removed"))
    ))
    .bind(actor)
    .bind("user_remove")
    .bind(name)
    .bind("removed, and signed out everywhere")
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(removed.is_some())
}

/// Every user, by name (the expired ones aside).
pub(crate) async fn list_users(pool: &PgPool) -> Result<Vec<User>, sqlx::Error> {
    let rows: Vec<(String, String, String, i64)> = query_as(
        "SELECT u.name, u.role, to_json(u.created_at)#>>'{}' AS created_at,
                (SELECT count(*) FROM inbox_console_sessions AS s WHERE s.user_name = u.name AND s.expires_at > now())
         FROM inbox_console_users AS u WHERE u.expires_at IS NULL OR u.expires_at > now() ORDER BY u.name",
    )
    .fetch_all(Autocommit(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, role, created_at, sessions)| User {
            name,
            role: UserRole::parse(&role).unwrap_or(UserRole::Viewer),
            created_at,
            sessions,
        })
        .collect())
}

/// A user's password hash and role, to check a sign-in against (none for an expired user).
pub(crate) async fn credentials(pool: &PgPool, name: &str) -> Result<Option<(String, UserRole)>, sqlx::Error> {
    let row: Option<(String, String)> = query_as(
        "SELECT password_hash, role FROM inbox_console_users
         WHERE name = $1 AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(name)
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(row.map(|(hash, role)| (hash, UserRole::parse(&role).unwrap_or(UserRole::Viewer))))
}

/// A signed-in session: whose, as what, and the CSRF token its forms carry.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub user: String,
    pub role: UserRole,
    pub csrf: String,
}

/// Where and in what a session was signed in.
pub(crate) struct Client<'a> {
    /// The client's address.
    pub address: &'a str,
    /// Its `User-Agent`, cut to 200 characters.
    pub agent: &'a str,
}

/// Starts a session for `ttl`, audited as `sign_in` (and ends the expired
/// sessions of every user, and the expired users).
pub(crate) async fn insert_session(
    pool: &PgPool,
    token_sha256: &[u8],
    user: &str,
    csrf: &str,
    ttl: Duration,
    client: &Client<'_>,
) -> Result<(), sqlx::Error> {
    query(&format!(
        "WITH expired AS (DELETE FROM inbox_console_sessions WHERE expires_at < now()),
              gone AS (DELETE FROM inbox_console_users WHERE expires_at < now()),
              {}
         INSERT INTO inbox_console_sessions (token_sha256, user_name, csrf, expires_at, client, user_agent)
         VALUES ($5, $3, $6, now() + $7 * interval '1 millisecond', $8, $9)",
        audited(None)
    ))
    .bind(format!("console:{user}"))
    .bind("sign_in")
    .bind(user)
    .bind(format!("from {}", client.address))
    .bind(token_sha256)
    .bind(csrf)
    .bind(ttl.as_millis() as i64)
    .bind(client.address)
    .bind(client.agent.chars().take(200).collect::<String>())
    .execute(Autocommit(pool))
    .await?;
    Ok(())
}

/// The session of this token's hash, if it is signed in, not expired and
/// used within `idle`; its use is recorded.
pub(crate) async fn session(
    pool: &PgPool,
    token_sha256: &[u8],
    idle: Duration,
) -> Result<Option<Session>, sqlx::Error> {
    let row: Option<(String, String, String)> = query_as(
        "WITH s AS (
             UPDATE inbox_console_sessions SET last_seen_at = now()
             WHERE token_sha256 = $1 AND expires_at > now() AND last_seen_at > now() - $2 * interval '1 millisecond'
             RETURNING user_name, csrf)
         SELECT u.name, u.role, s.csrf FROM s JOIN inbox_console_users AS u ON u.name = s.user_name
         WHERE u.expires_at IS NULL OR u.expires_at > now()",
    )
    .bind(token_sha256)
    .bind(idle.as_millis() as i64)
    .fetch_optional(Autocommit(pool))
    .await?;
    Ok(row.map(|(user, role, csrf)| Session { user, role: UserRole::parse(&role).unwrap_or(UserRole::Viewer), csrf }))
}

/// One of a user's sessions, as the user's list of them shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct SessionSeen {
    /// The SHA-256 of its token, in hex: what names it in a form (the token itself is never shown).
    pub id: String,
    pub created_at: String,
    pub last_seen_at: String,
    pub client: Option<String>,
    pub user_agent: Option<String>,
}

/// A user's sessions that are signed in and used within `idle`, the most recently used first.
pub(crate) async fn sessions_of(pool: &PgPool, user: &str, idle: Duration) -> Result<Vec<SessionSeen>, sqlx::Error> {
    query_as(
        "SELECT encode(token_sha256, 'hex') AS id, to_json(created_at)#>>'{}' AS created_at,
                to_json(last_seen_at)#>>'{}' AS last_seen_at, client, user_agent
         FROM inbox_console_sessions
         WHERE user_name = $1 AND expires_at > now() AND last_seen_at > now() - $2 * interval '1 millisecond'
         ORDER BY last_seen_at DESC",
    )
    .bind(user)
    .bind(idle.as_millis() as i64)
    .fetch_all(Autocommit(pool))
    .await
}

/// Ends a session, whoever's it is, unrecorded: the one a browser held when it signed in again.
pub(crate) async fn delete_session(pool: &PgPool, token_sha256: &[u8]) -> Result<(), sqlx::Error> {
    query("DELETE FROM inbox_console_sessions WHERE token_sha256 = $1")
        .bind(token_sha256)
        .execute(Autocommit(pool))
        .await?;
    Ok(())
}

/// Which of a user's sessions to end.
pub(crate) enum Ending<'a> {
    /// The session of this token hash (signing out, or one ended from the list).
    One(&'a [u8]),
    /// Every one but the session of this token hash.
    AllBut(&'a [u8]),
}

/// Ends a user's sessions, audited as `action` under the user's name (once,
/// if any ended). How many ended.
pub(crate) async fn end_sessions(
    pool: &PgPool,
    user: &str,
    action: &str,
    which: Ending<'_>,
) -> Result<u64, sqlx::Error> {
    let (only, keep, reason) = match which {
        Ending::One(hash) => (Some(hash), None, "one session ended"),
        Ending::AllBut(hash) => (None, Some(hash), "every other session ended"),
    };
    let ended: i64 = query_scalar(&format!(
        "WITH ended AS (
             DELETE FROM inbox_console_sessions
             WHERE user_name = $3 AND ($5::bytea IS NULL OR token_sha256 = $5)
               AND ($6::bytea IS NULL OR token_sha256 <> $6)
             RETURNING 1),
         {}
         SELECT count(*) FROM ended",
        audited(Some("(SELECT 1 FROM ended LIMIT 1) AS any_ended"))
    ))
    .bind(format!("console:{user}"))
    .bind(action)
    .bind(user)
    .bind(reason)
    .bind(only)
    .bind(keep)
    .fetch_one(Autocommit(pool))
    .await?;
    Ok(ended as u64)
}

/// One record of the audit about a console user, as the user's sessions page lists them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AccountRecord {
    pub at: String,
    pub actor: String,
    pub action: String,
    pub reason: String,
}

/// The last `limit` audit records about `user`, newest first.
pub(crate) async fn account_history(pool: &PgPool, user: &str, limit: i64) -> Result<Vec<AccountRecord>, sqlx::Error> {
    query_as(
        "SELECT to_json(at)#>>'{}' AS at, actor, action, reason FROM inbox_audit
         WHERE console_user = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(user)
    .bind(limit)
    .fetch_all(Autocommit(pool))
    .await
}
