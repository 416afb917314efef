//! Who is signed in: passwords (Argon2id), session tokens (random, stored as
//! their SHA-256), the CSRF token of each session, and the sign-in rate limit.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use argon2::{
    password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString},
    Argon2,
};
use axum::{
    extract::{ConnectInfo, FromRequestParts, OriginalUri},
    http::request::Parts,
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{pages::PageError, ClientIp, State, SESSION_TTL};
use crate::db::console::{self, Role};

/// The session cookie's name.
pub const COOKIE: &str = "inbox_console";

/// The longest password taken, in bytes: hashing is bounded work.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// `bytes` random bytes as URL-safe base64.
pub fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::getrandom(&mut buf).expect("the operating system's random numbers");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

fn sha256(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The Argon2id hash of a password, as a PHC string (its salt and parameters in it).
pub fn hash(password: &str) -> String {
    let mut salt = [0u8; 16];
    getrandom::getrandom(&mut salt).expect("the operating system's random numbers");
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    Argon2::default().hash_password(password.as_bytes(), &salt).expect("the default parameters hash").to_string()
}

/// Whether `password` is the one `hash` was made of. A user that does not
/// exist is checked against a hash of nothing anyone knows, so that the
/// answer takes as long either way.
fn verify(password: &str, hash: Option<&str>) -> bool {
    static NOBODY: OnceLock<String> = OnceLock::new();
    let known = hash.is_some();
    let hash = hash.unwrap_or_else(|| NOBODY.get_or_init(|| self::hash(&random_token(32))));
    let matches = PasswordHash::new(hash)
        .map(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
        .unwrap_or(false);
    known && matches
}

/// Checks a sign-in: the user's role when the password is right.
pub async fn check_password(state: &State, name: &str, password: &str) -> Result<Option<Role>, sqlx::Error> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Ok(None);
    }
    let found = console::credentials(&state.db, name).await?;
    let password = password.to_string();
    let hash = found.as_ref().map(|(h, _)| h.clone());
    let ok = tokio::task::spawn_blocking(move || verify(&password, hash.as_deref())).await.unwrap_or(false);
    Ok(found.filter(|_| ok).map(|(_, role)| role))
}

/// Starts a session for `user`: the cookie to set (for the browser's session;
/// the database ends it after [`SESSION_TTL`] whatever the browser does).
pub async fn sign_in(state: &State, user: &str) -> Result<Cookie<'static>, sqlx::Error> {
    let token = random_token(32);
    console::insert_session(&state.db, &sha256(&token), user, &random_token(32), SESSION_TTL).await?;
    Ok(Cookie::build((COOKIE, token))
        .path(cookie_path(state))
        .secure(true)
        .http_only(true)
        .same_site(SameSite::Lax)
        .build())
}

/// Ends the session in `jar`, if any: the cookie that removes it.
pub async fn sign_out(state: &State, jar: &CookieJar) -> Result<Cookie<'static>, sqlx::Error> {
    if let Some(c) = jar.get(COOKIE) {
        console::delete_session(&state.db, &sha256(c.value())).await?;
    }
    Ok(Cookie::build((COOKIE, "")).path(cookie_path(state)).secure(true).http_only(true).build())
}

fn cookie_path(state: &State) -> String {
    if state.base.is_empty() {
        "/".into()
    } else {
        state.base.clone()
    }
}

/// A signed-in user, taken from the session cookie. A request without a
/// valid session is sent to the sign-in page (and back here afterwards).
pub struct Signed {
    pub user: String,
    pub role: Role,
    pub csrf: String,
}

impl Signed {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, csrf: &str) -> Result<(), PageError> {
        if csrf.is_empty() || !bool::from(csrf.as_bytes().ct_eq(self.csrf.as_bytes())) {
            return Err(PageError::Forbidden(
                "This form's CSRF token is missing or is not this session's: nothing was done. Reload the page and try again.",
            ));
        }
        Ok(())
    }

    /// Refuses a viewer, and a form whose CSRF token is not this session's.
    pub fn may_act(&self, csrf: &str) -> Result<(), PageError> {
        self.check_csrf(csrf)?;
        if self.role != Role::Operator {
            return Err(PageError::Forbidden("Viewers cannot act: nothing was done. An operator can."));
        }
        Ok(())
    }

    /// The name the audit records an action under.
    pub fn actor(&self) -> String {
        format!("console:{}", self.user)
    }
}

impl FromRequestParts<Arc<State>> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        let jar = CookieJar::from_headers(&parts.headers);
        if let Some(cookie) = jar.get(COOKIE).filter(|c| !c.value().is_empty()) {
            match console::session(&state.db, &sha256(cookie.value())).await {
                Ok(Some(s)) => return Ok(Signed { user: s.user, role: s.role, csrf: s.csrf }),
                Ok(None) => {}
                Err(e) => return Err(PageError::Database(e).into_response()),
            }
        }
        // Back to this page after signing in (a GET's own path; after a POST, the page it came from is gone).
        // The path as requested (a nested router sees its own part only).
        let uri = parts.extensions.get::<OriginalUri>().map_or(&parts.uri, |o| &o.0);
        let next = match parts.method {
            axum::http::Method::GET => uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
            _ => "",
        };
        let mut to = format!("{}/signin", state.base);
        if !next.is_empty() {
            to.push_str("?next=");
            to.extend(form_urlencoded::byte_serialize(next.as_bytes()));
        }
        Err(Redirect::to(&to).into_response())
    }
}

/// The client's address ([`ClientIp`]): the connection's, or the last of
/// `X-Forwarded-For` (what a load balancer in front appended).
pub struct Peer(pub String);

impl FromRequestParts<Arc<State>> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        let forwarded = (state.client_ip == ClientIp::ForwardedFor)
            .then(|| {
                let all = parts.headers.get_all("x-forwarded-for");
                let last = all.iter().filter_map(|v| v.to_str().ok()).next_back()?;
                Some(last.rsplit(',').next()?.trim().chars().take(64).collect::<String>())
            })
            .flatten()
            .filter(|a| !a.is_empty());
        let addr =
            forwarded.or_else(|| parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string()));
        Ok(Peer(addr.unwrap_or_else(|| "unknown".into())))
    }
}

/// Failed sign-ins counted per user name and per client over a window: past
/// the limit, sign-in is refused (429) until the window ends, whatever the
/// password. In memory: per process (each instance of a service counts its own).
#[derive(Default)]
pub struct Limiter {
    failures: Mutex<HashMap<String, (u32, Instant)>>,
}

/// The window failures are counted over.
const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Failed sign-ins per user name in a window.
const PER_NAME: u32 = 5;
/// Failed sign-ins per client address in a window.
const PER_PEER: u32 = 20;
/// Keys kept at most; past it the expired ones go (and, if that is not enough, all).
const MAX_KEYS: usize = 10_000;

impl Limiter {
    fn keys(name: &str, peer: &str) -> [(String, u32); 2] {
        [(format!("name:{name}"), PER_NAME), (format!("peer:{peer}"), PER_PEER)]
    }

    /// How long until a sign-in as `name` from `peer` may be tried, if it may not be now.
    pub fn blocked(&self, name: &str, peer: &str) -> Option<Duration> {
        let failures = self.failures.lock().expect("the limiter's lock");
        Self::keys(name, peer)
            .iter()
            .filter_map(|(key, limit)| {
                let (n, since) = failures.get(key)?;
                let left = WINDOW.checked_sub(since.elapsed())?;
                (*n >= *limit).then_some(left)
            })
            .max()
    }

    /// Counts a failed sign-in.
    pub fn failed(&self, name: &str, peer: &str) {
        let mut failures = self.failures.lock().expect("the limiter's lock");
        if failures.len() >= MAX_KEYS {
            failures.retain(|_, (_, since)| since.elapsed() < WINDOW);
            if failures.len() >= MAX_KEYS {
                failures.clear();
            }
        }
        for (key, _) in Self::keys(name, peer) {
            let entry = failures.entry(key).or_insert((0, Instant::now()));
            if entry.1.elapsed() >= WINDOW {
                *entry = (0, Instant::now());
            }
            entry.0 += 1;
        }
    }

    /// Forgets a name's failures after it signed in.
    pub fn succeeded(&self, name: &str) {
        self.failures.lock().expect("the limiter's lock").remove(&format!("name:{name}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_against_its_own_hash_only() {
        let h = hash("correct horse battery");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify("correct horse battery", Some(&h)));
        assert!(!verify("correct horse batterY", Some(&h)));
        assert!(!verify("correct horse battery", None), "no user, no sign-in");
        assert!(!verify("x", Some("not a hash")));
    }

    #[test]
    fn the_limiter_stops_a_name_after_its_failures_and_forgets_them_on_success() {
        let l = Limiter::default();
        for _ in 0..PER_NAME {
            assert_eq!(l.blocked("alice", "1.2.3.4"), None);
            l.failed("alice", "1.2.3.4");
        }
        assert!(l.blocked("alice", "5.6.7.8").is_some(), "the name is blocked from anywhere");
        assert_eq!(l.blocked("bob", "5.6.7.8"), None, "another name from elsewhere is not");
        l.succeeded("alice");
        assert_eq!(l.blocked("alice", "5.6.7.8"), None);
        for i in 0..PER_PEER {
            l.failed(&format!("user{i}"), "9.9.9.9");
        }
        assert!(l.blocked("carol", "9.9.9.9").is_some(), "a client guessing many names is blocked");
    }
}
