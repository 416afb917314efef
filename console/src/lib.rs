//! The operator's console: a web page over [`webhook_inbox::ops`] to find any
//! event, see why it failed, and replay it; requeue what a filter selects;
//! retry dead outbox messages; and the inbox's health at a glance.
//!
//! [`router`] is the console, to serve as a team likes: `inbox console`
//! serves it on its own (`webhook_inbox_service::console::run`), `inbox dev`
//! (a team's own `webhook_inbox_service::dev::run` too) at [`PATH`]. Sign-in is required:
//! each user has a password kept only as its Argon2id hash, and a role
//! ([`UserRole`]): a viewer reads, an operator also acts, each action with a
//! confirmation and an audit record under the user's name. Sessions live in
//! the database (a cookie that is `Secure`, `HttpOnly` and `SameSite=Lax`
//! holds only a random token); every form that acts carries the session's
//! CSRF token; every page is sent under a strict Content-Security-Policy
//! (no inline script: the one script is the console's own, which keeps the
//! Events page live and which no page needs), and everything a stranger sent (payloads, headers,
//! ids, reasons) is escaped by the templates. Sign-in is rate-limited per
//! name and per client.
//!
//! Users are managed with `inbox console user add|remove|list`, or from code
//! with [`add_user`], [`remove_user`] and [`list_users`]; each change, each
//! sign-in (failed ones too), sign-out and session ended is recorded in
//! `inbox_audit` under the user's name. Sessions end after 30 minutes without
//! use (`INBOX_CONSOLE_IDLE_TIMEOUT_MS`) and after 12 hours whatever their
//! use; each user sees their sessions, and ends any of them, on the
//! console's Sessions page.

mod api;
mod auth;
mod client;
mod health;
mod limiter;
mod page;
mod quota;
mod screens;
pub(crate) mod store;
pub(crate) mod tokens;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::Router;
use sqlx::PgPool;

pub use crate::store::{User, UserRole};
pub use client::{client_key, ClientIp};
use webhook_inbox::config::{Catalog, DbConfig, Env, Secrets};

/// What the pages need, shared by every request.
pub(crate) struct State {
    /// Sessions and actions.
    db: PgPool,
    /// What the pages show: `INBOX_CONSOLE_READ_DATABASE_URL`'s read-only role
    /// where the deployment provides one, else `db`.
    read: PgPool,
    /// The providers and their secrets, to re-check an event's kept bytes.
    catalog: Catalog,
    secrets: Secrets,
    /// Where the console is mounted: `""` (its own server) or `/console` (`inbox dev`).
    base: String,
    limiter: limiter::Limiter,
    /// Password checks running at once: each takes Argon2's 19 MiB, and
    /// past this many an attempt is answered 503 at once, not queued.
    hashing: tokio::sync::Semaphore,
    settings: Settings,
    /// The management API's requests per token.
    api_rate: quota::Buckets,
    /// The management API's failed authentications per client.
    api_failures: quota::Buckets,
    /// Payload searches at once: one per caller, half the read pool in all.
    searches: quota::Searches,
    /// Live listings open at once ([`LIVE_AT_ONCE`]): each reads a page every 2 s.
    live: Arc<tokio::sync::Semaphore>,
}

/// Live listings (the Events page's stream) open at once: past this many a
/// new one is answered 503, and the page stays as it was sent.
const LIVE_AT_ONCE: usize = 16;

/// How the console is reached and how long its sessions last, from the
/// environment ([`Settings::read`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where a client's address comes from, for the sign-in limit.
    client_ip: ClientIp,
    /// `INBOX_CONSOLE_IDLE_TIMEOUT_MS`, default 30 minutes: a session not used
    /// for this long ends (and after [`SESSION_TTL`] whatever its use).
    idle_timeout: Duration,
    /// `INBOX_CONSOLE_HTTPS`: the console is reached over HTTPS (a balancer in
    /// front ends TLS), so its pages are sent with HSTS and, served at `/`,
    /// its cookies with the `__Host-` prefix. Without it, a balancer trusted
    /// for the client's address says so per request in `X-Forwarded-Proto`.
    https: bool,
    /// `INBOX_API_RATE_PER_SECOND`, default 20: the management API's requests
    /// per second and token (twice that in a burst).
    api_rate: u32,
}

impl Settings {
    /// `INBOX_CONSOLE_CLIENT_IP`, `INBOX_CONSOLE_IDLE_TIMEOUT_MS`,
    /// `INBOX_CONSOLE_HTTPS` and `INBOX_API_RATE_PER_SECOND`.
    pub fn read(env: &Env) -> Result<Settings, webhook_inbox_schemes::ConfigError> {
        let https = match env.var("INBOX_CONSOLE_HTTPS").as_deref() {
            None | Some("false" | "0" | "no") => false,
            Some("true" | "1" | "yes") => true,
            Some(other) => {
                return Err(webhook_inbox_schemes::ConfigError::Invalid {
                    var: "INBOX_CONSOLE_HTTPS".into(),
                    reason: format!("{:?} is neither true nor false", webhook_inbox_schemes::text::escape(other)),
                })
            }
        };
        let idle: u64 = env.positive("INBOX_CONSOLE_IDLE_TIMEOUT_MS", 30 * 60 * 1000)?;
        Ok(Settings {
            client_ip: ClientIp::read(env)?,
            idle_timeout: Duration::from_millis(idle),
            https,
            api_rate: env.positive("INBOX_API_RATE_PER_SECOND", 20u32)?,
        })
    }
}

/// Where `inbox dev` and `inbox serve` mount the console beside the webhooks.
pub const PATH: &str = "/console";

/// Password checks at once (see [`State::hashing`]).
const HASHING_AT_ONCE: usize = 2;

/// How long a session lasts after sign-in.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The console's pages and its management API (`/api/v1`) at `base` (`""`
/// for the root, `/console` in `inbox dev`), on `db` (reads on `read`),
/// checking kept bytes against `catalog` and `secrets`: a router to serve
/// as it is or beside routes of a team's own.
pub fn router(db: PgPool, read: PgPool, catalog: Catalog, secrets: Secrets, base: &str, settings: Settings) -> Router {
    let base = base.trim_end_matches('/').to_string();
    let searches = quota::Searches::new(read.options().get_max_connections() as usize / 2);
    let state = Arc::new(State {
        db,
        read,
        catalog,
        secrets,
        base,
        limiter: limiter::Limiter::default(),
        hashing: tokio::sync::Semaphore::new(HASHING_AT_ONCE),
        api_rate: quota::Buckets::new(settings.api_rate as f64, 2.0 * settings.api_rate as f64),
        api_failures: quota::Buckets::new(1.0, api::FAILURES_BURST),
        searches,
        live: Arc::new(tokio::sync::Semaphore::new(LIVE_AT_ONCE)),
        settings,
    });
    screens::router(state)
}

/// A listener's head check for the console: an API request without a token's
/// form, answered (401) before its body is read.
pub fn unauthenticated_api(parts: &http::request::Parts) -> Option<axum::response::Response> {
    api::unauthenticated(parts)
}

/// A read-only pool on `INBOX_CONSOLE_READ_DATABASE_URL`, if it is set.
pub fn read_pool(env: &Env, db: &DbConfig) -> anyhow::Result<Option<PgPool>> {
    let Some(url) = env.var("INBOX_CONSOLE_READ_DATABASE_URL") else { return Ok(None) };
    let config = DbConfig { url: Some(url), ..db.clone() };
    Ok(Some(config.pool().context("INBOX_CONSOLE_READ_DATABASE_URL")?))
}

/// Why a user could not be added.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The name is not 1 to 64 of `A-Z a-z 0-9 . _ @ -`.
    #[error("a user name is 1 to 64 letters, digits, '.', '_', '@' or '-'")]
    BadName,
    /// The password is shorter than 12 characters or longer than 1024 bytes.
    #[error("a password has at least 12 characters (and at most 1024 bytes)")]
    BadPassword,
    /// A user of this name exists.
    #[error("there is a user of this name already (remove it first to change its role or password)")]
    Exists,
    /// The database refused or did not answer.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Adds a console user with this role and password (kept as its Argon2id
/// hash), audited as `user_add` by `by` (who adds it: `INBOX_OPERATOR` for
/// the CLI); refuses a name that is taken.
pub async fn add_user(pool: &PgPool, name: &str, role: UserRole, password: &str, by: &str) -> Result<(), UserError> {
    insert_user(pool, name, role, password, None, by).await
}

/// Adds a user that ends by itself after `expires` (and refuses a name
/// that is taken: an existing user is never changed). `inbox dev`'s own.
pub async fn add_expiring_user(
    pool: &PgPool,
    name: &str,
    role: UserRole,
    password: &str,
    expires: Duration,
    by: &str,
) -> Result<(), UserError> {
    insert_user(pool, name, role, password, Some(expires), by).await
}

async fn insert_user(
    pool: &PgPool,
    name: &str,
    role: UserRole,
    password: &str,
    expires: Option<Duration>,
    by: &str,
) -> Result<(), UserError> {
    check_name(name)?;
    let hash = hash_password(password).await?;
    if !store::insert_user(pool, by, name, &hash, role, expires).await? {
        return Err(UserError::Exists);
    }
    Ok(())
}

/// Removes a console user and signs it out everywhere, audited as
/// `user_remove` by `by`; whether there was one.
pub async fn remove_user(pool: &PgPool, name: &str, by: &str) -> Result<bool, sqlx::Error> {
    store::delete_user(pool, by, name).await
}

/// Every console user, by name (never a password's hash).
pub async fn list_users(pool: &PgPool) -> Result<Vec<User>, sqlx::Error> {
    store::list_users(pool).await
}

pub use crate::tokens::ApiToken;

/// Makes an API token `name` for the management API (`/api/v1`), with a
/// console role, audited as `token_add` by `by`; returns the token, the one
/// time it is ever seen (only its SHA-256 is kept). Refuses a name taken
/// (a revoked token's too: names in the audit stay unambiguous).
pub async fn add_token(pool: &PgPool, name: &str, role: UserRole, by: &str) -> Result<String, UserError> {
    check_name(name)?;
    let token = format!("{}{}", api::TOKEN_PREFIX, auth::random_token(32));
    match tokens::add_token(pool, name, role, &api::token_sha256(&token), by).await? {
        true => Ok(token),
        false => Err(UserError::Exists),
    }
}

/// Revokes an API token at once, audited as `token_revoke` by `by`; false when
/// there is no live token of that name.
pub async fn revoke_token(pool: &PgPool, name: &str, by: &str) -> Result<bool, sqlx::Error> {
    tokens::revoke_token(pool, name, by).await
}

/// Every API token, revoked ones too, by name, with its last use.
pub async fn list_tokens(pool: &PgPool) -> Result<Vec<ApiToken>, sqlx::Error> {
    tokens::list_tokens(pool).await
}

/// A password good for a user: random, 24 characters (what `inbox console
/// user add` prints when none is given).
pub fn generate_password() -> String {
    auth::random_token(18)
}

pub(crate) fn check_name(name: &str) -> Result<(), UserError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(UserError::BadName)
    }
}

async fn hash_password(password: &str) -> Result<String, UserError> {
    if password.chars().count() < 12 || password.len() > auth::MAX_PASSWORD_BYTES {
        return Err(UserError::BadPassword);
    }
    let password = password.to_string();
    Ok(tokio::task::spawn_blocking(move || auth::hash(&password)).await.expect("hashing does not panic"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_address_comes_from_the_connection_unless_told_and_a_mistake_is_named() {
        let read = |v: &'static str| {
            let pairs = [("INBOX_CONSOLE_CLIENT_IP", v)];
            let read = ClientIp::read(&Env::from_pairs(&pairs));
            read
        };
        assert_eq!(ClientIp::read(&Env::from_pairs(&[])).unwrap(), ClientIp::Peer);
        assert_eq!(read("peer").unwrap(), ClientIp::Peer);
        assert_eq!(read("x-forwarded-for").unwrap(), ClientIp::ForwardedFor);
        let err = read("X-Real-IP\u{1b}[31m").unwrap_err().to_string();
        assert!(err.contains("INBOX_CONSOLE_CLIENT_IP") && !err.contains('\u{1b}'), "{err}");
    }

    #[test]
    fn user_names_and_passwords_are_checked_before_anything_is_stored() {
        assert!(check_name("alice.b@example-1_x").is_ok());
        for bad in ["", "a b", "émile", "<script>", &"x".repeat(65)] {
            assert!(matches!(check_name(bad), Err(UserError::BadName)), "{bad:?}");
        }
    }
}
