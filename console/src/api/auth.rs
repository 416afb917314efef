//! Who calls: an API token (`Authorization: Bearer inbox_...`, the scheme's
//! case as any), looked up by its SHA-256 on every request, and its rate.
//!
//! A valid token is always looked up and served, within its own rate
//! (`INBOX_API_RATE_PER_SECOND`, twice that in a burst). Only failing
//! requests are throttled: each client (its address, an IPv6 one by its /64)
//! has its own allowance of failed authentications, in a table apart from
//! the tokens', so a stranger's failures spend neither a token's allowance
//! nor another client's, and a valid token sent from a throttled address (a
//! balancer's, say) is served all the same. A request without a token's form
//! is refused by the listener before its body is read ([`unauthenticated`]).

use std::{sync::Arc, time::Duration};

use axum::{
    extract::FromRequestParts,
    http::{header, request::Parts},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use super::{Answer, Refused};
use crate::{client_key, State};
use crate::{store::UserRole, tokens as store};

/// The prefix every token starts with (a secret scanner can find one).
pub(crate) const TOKEN_PREFIX: &str = "inbox_";

/// The longest token looked up.
const MAX_TOKEN_CHARS: usize = 200;

/// Failed authentications a client may make at once, then one a second.
pub(crate) const FAILURES_BURST: f64 = 20.0;

/// A token's SHA-256: what is stored of it.
pub(crate) fn token_sha256(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The caller: a live token's name and role.
pub(crate) struct Caller {
    pub(super) name: String,
    role: UserRole,
}

impl Caller {
    pub(super) fn actor(&self) -> String {
        format!("api:{}", self.name)
    }

    pub(super) fn may_act(&self) -> Answer<()> {
        match self.role {
            UserRole::Operator => Ok(()),
            UserRole::Viewer => Err(Refused::Forbidden),
        }
    }
}

/// The token an `Authorization` header carries, or why it carries none: the
/// scheme `Bearer` in any case (RFC 7235), then a token of this inbox's form.
fn bearer(headers: &http::HeaderMap) -> Result<&str, &'static str> {
    const MISSING: &str = "send an API token: Authorization: Bearer <token>";
    let value = headers.get(header::AUTHORIZATION).ok_or(MISSING)?.to_str().map_err(|_| MISSING)?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(MISSING)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(MISSING);
    }
    let token = token.trim();
    if !token.starts_with(TOKEN_PREFIX) || token.len() > MAX_TOKEN_CHARS {
        return Err("this is not an API token of this inbox");
    }
    Ok(token)
}

/// Whether `path` is one of the API's routes (under the console's base)
/// that need a token: every one but the document.
fn needs_token(path: &str) -> bool {
    let path = path.strip_prefix(crate::PATH).unwrap_or(path);
    (path == "/api/v1" || path.starts_with("/api/v1/")) && path != "/api/v1/openapi.json"
}

/// The listener's gate: an API request without a token's form is answered
/// 401 from its head alone, before it takes a share of the console's
/// requests and before its body is read (a stranger's slow bodies hold nothing).
pub(crate) fn unauthenticated(parts: &Parts) -> Option<Response<axum::body::Body>> {
    if !needs_token(parts.uri.path()) {
        return None;
    }
    let why = bearer(&parts.headers).err()?;
    let mut r = Refused::Unauthorized(why).into_response();
    super::api_headers(&mut r);
    Some(r)
}

impl FromRequestParts<Arc<State>> for Caller {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Self::Rejection> {
        let failed = |why: &'static str| {
            let crate::auth::Peer(client) = crate::auth::Peer::of(parts, state);
            match state.api_failures.take(&client_key(&client)) {
                Ok(()) => Refused::Unauthorized(why),
                Err(wait) => Refused::TooManyFailures(seconds(wait)),
            }
        };
        let token = bearer(&parts.headers).map_err(failed)?;
        let Some((name, role)) = store::token(&state.db, &token_sha256(token)).await? else {
            return Err(failed("this API token is unknown or revoked"));
        };
        state.api_rate.take(&name).map_err(|wait| Refused::TooMany(seconds(wait)))?;
        Ok(Caller { name, role })
    }
}

/// A wait, in whole seconds (one at least), for `Retry-After`.
fn seconds(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_a_token_of_another_form_is_none() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        for v in ["Bearer inbox_abc", "bearer inbox_abc", "BEARER  inbox_abc ", " Bearer inbox_abc"] {
            assert_eq!(bearer(&with(v)), Ok("inbox_abc"), "{v:?}");
        }
        for v in ["Basic inbox_abc", "Bearerinbox_abc", "Bearer", "inbox_abc"] {
            assert!(bearer(&with(v)).unwrap_err().contains("Authorization: Bearer"), "{v:?}");
        }
        assert_eq!(bearer(&with("Bearer ghp_abc")), Err("this is not an API token of this inbox"));
        assert!(bearer(&with(&format!("Bearer inbox_{}", "a".repeat(200)))).is_err());
        assert!(bearer(&http::HeaderMap::new()).is_err());
    }

    #[test]
    fn every_route_but_the_document_needs_a_token_at_either_base() {
        for p in ["/api/v1/events", "/console/api/v1/erase", "/api/v1", "/api/v1/nothing"] {
            assert!(needs_token(p), "{p}");
        }
        for p in ["/api/v1/openapi.json", "/console/api/v1/openapi.json", "/events", "/console/signin", "/api/v10"] {
            assert!(!needs_token(p), "{p}");
        }
    }
}
