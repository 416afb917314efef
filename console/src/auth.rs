//! Who is signed in: passwords (Argon2id), session tokens (random, stored as
//! their SHA-256), and the CSRF token of each session.

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use argon2::{
    password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString},
    Argon2,
};
use axum::{
    extract::{ConnectInfo, FromRequestParts, OriginalUri},
    http::{request::Parts, HeaderMap},
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{
    page::{Nav, NavUser, PageError},
    State, SESSION_TTL,
};
use crate::store::{self, Ending, UserRole};

/// The session cookie's name; `__Host-inbox_console` where the console is
/// served at `/` over HTTPS (a cookie of that name is the host's alone: no
/// other host's page, nor a page of this host over plain HTTP, can set it).
pub(crate) const COOKIE: &str = "inbox_console";

/// The device cookie's name (prefixed as [`COOKIE`] is): a browser that signed
/// in as a name before is spared that name's back-off ([`super::limiter`]).
pub(crate) const DEVICE: &str = "inbox_console_device";

/// A cookie's name for this request: `__Host-` prefixed where it can be.
pub(crate) fn cookie_name(state: &State, headers: &HeaderMap, name: &'static str) -> String {
    if state.base.is_empty() && super::page::https(state, headers) {
        format!("__Host-{name}")
    } else {
        name.to_string()
    }
}

/// The longest password taken, in bytes: hashing is bounded work.
pub(crate) const MAX_PASSWORD_BYTES: usize = 1024;

/// `bytes` random bytes as URL-safe base64.
pub(crate) fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::getrandom(&mut buf).expect("the operating system's random numbers");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

fn sha256(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The Argon2id hash of a password, as a PHC string (its salt and parameters in it).
pub(crate) fn hash(password: &str) -> String {
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
pub(crate) async fn check_password(state: &State, name: &str, password: &str) -> Result<Option<UserRole>, sqlx::Error> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Ok(None);
    }
    let found = store::credentials(&state.db, name).await?;
    let password = password.to_string();
    let hash = found.as_ref().map(|(h, _)| h.clone());
    let ok = tokio::task::spawn_blocking(move || verify(&password, hash.as_deref())).await.unwrap_or(false);
    Ok(found.filter(|_| ok).map(|(_, role)| role))
}

/// Starts a session for `user` signed in from `client`, audited as
/// `sign_in`: the cookie to set (for the browser's session; the database ends
/// it after [`SESSION_TTL`], or after the idle timeout without use, whatever
/// the browser does).
pub(crate) async fn sign_in(
    state: &State,
    headers: &HeaderMap,
    user: &str,
    client: &store::Client<'_>,
) -> Result<Cookie<'static>, sqlx::Error> {
    let token = random_token(32);
    store::insert_session(&state.db, &sha256(&token), user, &random_token(32), SESSION_TTL, client).await?;
    Ok(Cookie::build((cookie_name(state, headers, COOKIE), token))
        .path(cookie_path(state))
        .secure(true)
        .http_only(true)
        .same_site(SameSite::Lax)
        .build())
}

/// Ends the session the browser held before it signed in again, if any: a
/// new sign-in never leaves the old one behind.
pub(crate) async fn replace(state: &State, headers: &HeaderMap, jar: &CookieJar) -> Result<(), sqlx::Error> {
    match jar.get(&cookie_name(state, headers, COOKIE)).filter(|c| !c.value().is_empty()) {
        Some(old) => store::delete_session(&state.db, &sha256(old.value())).await,
        None => Ok(()),
    }
}

/// The device cookie of a browser that signed in as `user`: it spares the
/// name's back-off to this browser ([`super::limiter`]), for 180 days.
pub(crate) fn device_cookie(state: &State, headers: &HeaderMap, user: &str) -> Cookie<'static> {
    let name = cookie_name(state, headers, DEVICE);
    // Max-Age through the parser: the builder's takes a type of the `time` crate.
    let mut cookie = Cookie::parse(format!("{name}={}; Max-Age={}", state.limiter.device(user), 180 * 86_400))
        .expect("a cookie of hex digits parses");
    cookie.set_path(cookie_path(state));
    cookie.set_secure(true);
    cookie.set_http_only(true);
    cookie.set_same_site(SameSite::Strict);
    cookie
}

/// Ends `signed`'s session, audited as `sign_out`: the cookie that removes it.
pub(crate) async fn sign_out(
    state: &State,
    headers: &HeaderMap,
    signed: &Signed,
) -> Result<Cookie<'static>, sqlx::Error> {
    store::end_sessions(&state.db, &signed.user, "sign_out", Ending::One(&signed.token_sha256)).await?;
    Ok(Cookie::build((cookie_name(state, headers, COOKIE), ""))
        .path(cookie_path(state))
        .secure(true)
        .http_only(true)
        .build())
}

fn cookie_path(state: &State) -> String {
    if state.base.is_empty() {
        "/".into()
    } else {
        state.base.clone()
    }
}

/// Where sign-in may lead back to: `next` as a path and query inside the
/// console at `base`, rebuilt from what a URL parser made of it, or `None`.
/// Refused: any byte that is a control character, a space or not ASCII (a
/// browser drops tabs and newlines while parsing, so `/\t/evil.example`
/// would be `//evil.example` to it), a backslash (a slash to a browser), and
/// whatever would read as another host (`//host`, `/.//host`; an empty
/// segment anywhere), or the sign-in page itself.
pub(super) fn inside(base: &str, next: &str) -> Option<String> {
    if !next.bytes().all(|b| b.is_ascii_graphic()) || next.contains('\\') {
        return None;
    }
    let prefix = format!("{base}/");
    if !next.starts_with(&prefix) || next.starts_with("//") {
        return None;
    }
    let origin = url::Url::parse("http://console.invalid/").expect("a valid URL");
    let parsed = origin.join(next).ok()?;
    if parsed.origin() != origin.origin() || parsed.username() != "" || parsed.password().is_some() {
        return None;
    }
    // The path as the parser normalised it (`/a/..//b` is `//b`: another host to a browser).
    let path = parsed.path();
    if !path.starts_with(&prefix) || path.contains("//") || path.trim_end_matches('/').ends_with("/signin") {
        return None;
    }
    Some(match parsed.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    })
}

/// A signed-in user, taken from the session cookie. A request without a
/// valid session is sent to the sign-in page (and back here afterwards).
pub(crate) struct Signed {
    pub user: String,
    pub role: UserRole,
    pub csrf: String,
    /// The SHA-256 of the session's token: what names this session.
    pub token_sha256: Vec<u8>,
}

impl Signed {
    /// Refuses a form whose CSRF token is not this session's.
    pub(crate) fn check_csrf(&self, csrf: &str) -> Result<(), PageError> {
        if csrf.is_empty() || !bool::from(csrf.as_bytes().ct_eq(self.csrf.as_bytes())) {
            return Err(PageError::Forbidden(
                "This form's CSRF token is missing or is not this session's: nothing was done. Reload the page and try again.",
            ));
        }
        Ok(())
    }

    /// Refuses a viewer, and a form whose CSRF token is not this session's.
    pub(crate) fn may_act(&self, csrf: &str) -> Result<(), PageError> {
        self.check_csrf(csrf)?;
        if self.role != UserRole::Operator {
            return Err(PageError::Forbidden("Viewers cannot act: nothing was done. An operator can."));
        }
        Ok(())
    }

    /// The header of a page this user is shown.
    pub(crate) fn nav(&self, state: &State) -> Nav {
        Nav {
            base: state.base.clone(),
            user: Some(NavUser { name: self.user.clone(), role: self.role, csrf: self.csrf.clone() }),
        }
    }

    /// The name the audit records an action under.
    pub(crate) fn actor(&self) -> String {
        format!("console:{}", self.user)
    }
}

impl FromRequestParts<Arc<State>> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        let jar = CookieJar::from_headers(&parts.headers);
        let name = cookie_name(state, &parts.headers, COOKIE);
        if let Some(cookie) = jar.get(&name).filter(|c| !c.value().is_empty()) {
            let token_sha256 = sha256(cookie.value());
            match store::session(&state.db, &token_sha256, state.settings.idle_timeout).await {
                Ok(Some(s)) => return Ok(Signed { user: s.user, role: s.role, csrf: s.csrf, token_sha256 }),
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
pub(crate) struct Peer(pub String);

impl Peer {
    /// The client of a request's head.
    pub(crate) fn of(parts: &Parts, state: &State) -> Peer {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
        Peer(state.settings.client_ip.client(&parts.headers, peer))
    }
}

impl FromRequestParts<Arc<State>> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        Ok(Peer::of(parts, state))
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
    fn sign_in_leads_back_only_to_a_path_inside_the_console_as_a_browser_would_read_it() {
        for base in ["", "/console"] {
            let at = |p: &str| format!("{base}{p}");
            for (next, to) in [
                (at("/events?status=failed"), Some(at("/events?status=failed"))),
                (at("/event?provider=stripe&id=evt_1"), Some(at("/event?provider=stripe&id=evt_1"))),
                (at("/events?q=%2F%2Fx#frag"), Some(at("/events?q=%2F%2Fx"))),
                (at("/%2F%2Fevil.example"), Some(at("/%2F%2Fevil.example"))),
                (at("/%5Cevil.example"), Some(at("/%5Cevil.example"))),
                (at("/a/../events"), Some(at("/events"))),
            ] {
                assert_eq!(inside(base, &next), to, "{next:?}");
            }
            // The WHATWG URL parser's ways to another host: control characters it strips, backslashes
            // it reads as slashes, dot segments that leave `//`, another scheme, and the sign-in page.
            for next in [
                "/\t/evil.example",
                "/\n/evil.example",
                "/\r/evil.example",
                "\t//evil.example",
                " /events",
                "/events\r\nSet-Cookie: x=1",
                "//evil.example",
                "///evil.example",
                "/\\evil.example",
                "\\\\evil.example",
                "/.//evil.example",
                "/..//evil.example",
                "/events/../..//evil.example",
                "https://evil.example/",
                "https:evil.example",
                "http://console.invalid/events",
                "javascript:alert(1)",
                "/signin",
                "/signin/",
                "/%0a/evil.example\u{7f}",
                "/ünïcode",
                "",
            ] {
                let next = if next.starts_with('/') && !next.starts_with("//") { at(next) } else { next.to_string() };
                assert_eq!(inside(base, &next), None, "{next:?}");
            }
        }
        assert_eq!(inside("/console", "/events"), None, "outside the console's base");
        assert_eq!(inside("/console", "/console/..//evil.example"), None);
        assert_eq!(inside("/console", "/consolex/events"), None);
    }
}
