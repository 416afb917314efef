//! Signing in and out.

use std::sync::Arc;

use askama::Template;
use axum::{
    extract::State as Shared,
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use axum_extra::extract::{cookie::CookieJar, Query};
use serde::Deserialize;

use crate::store;
use crate::{
    auth::{self, Peer, Signed},
    limiter::Refused,
    page::{html, Nav, PageError, Posted},
    State,
};

#[derive(Template)]
#[template(path = "console/signin.html")]
struct SignInPage {
    nav: Nav,
    next: String,
    name: String,
    error: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct NextParam {
    next: String,
}

pub(super) async fn home(Shared(state): Shared<Arc<State>>, _: Signed) -> Redirect {
    Redirect::to(&format!("{}/events", state.base))
}

pub(super) async fn signin_page(
    Shared(state): Shared<Arc<State>>,
    Query(p): Query<NextParam>,
) -> Result<Response, PageError> {
    let next = auth::inside(&state.base, &p.next).unwrap_or_default();
    html(SignInPage { nav: Nav::anonymous(&state), next, name: String::new(), error: None })
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct SignInForm {
    name: String,
    password: String,
    next: String,
}

pub(super) async fn signin(
    Shared(state): Shared<Arc<State>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    jar: CookieJar,
    Posted(f): Posted<SignInForm>,
) -> Result<Response, PageError> {
    let name = f.name.trim();
    // What no user can have is refused before the limiter, the database or the log sees it.
    if crate::check_name(name).is_err() {
        return Err(PageError::BadRequest(
            "A user name is 1 to 64 letters, digits, '.', '_', '@' or '-': no user has this one.".into(),
        ));
    }
    if f.password.len() > auth::MAX_PASSWORD_BYTES {
        return Err(PageError::BadRequest(format!(
            "A password is at most {} bytes: no user has this one.",
            auth::MAX_PASSWORD_BYTES
        )));
    }
    // A password check at a time per slot; past them, at once: try again.
    let Ok(_hashing) = state.hashing.try_acquire() else { return Err(PageError::Busy) };
    let device = jar.get(&auth::cookie_name(&state, &headers, auth::DEVICE)).map(|c| c.value().to_string());
    let known_device = device.is_some_and(|d| state.limiter.knows(name, &d));
    // Counted as failed before the password is checked; taken back if it is right.
    state.limiter.attempt(name, &peer, known_device).map_err(|refused| match refused {
        Refused::Wait(wait) => PageError::TooMany(wait),
        Refused::Full => PageError::Busy,
    })?;
    let actor = format!("console:{name}");
    let Some(_role) = auth::check_password(&state, name, &f.password).await? else {
        tracing::warn!(user = %name, peer = %peer, "console sign-in refused");
        store::audit(&state.db, &actor, "sign_in_failed", name, &format!("from {peer}")).await?;
        let page = SignInPage {
            nav: Nav::anonymous(&state),
            next: auth::inside(&state.base, &f.next).unwrap_or_default(),
            name: name.to_string(),
            error: Some("That name and password do not match a user.".into()),
        };
        return Ok((StatusCode::UNAUTHORIZED, html(page)?).into_response());
    };
    state.limiter.succeeded(name, &peer);
    tracing::info!(user = %name, peer = %peer, "console sign-in");
    auth::replace(&state, &headers, &jar).await?;
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let cookie = auth::sign_in(&state, &headers, name, &store::Client { address: &peer, agent }).await?;
    let device = auth::device_cookie(&state, &headers, name);
    // Only back into the console, rebuilt from its path and query: never to another site.
    let to = auth::inside(&state.base, &f.next).unwrap_or_else(|| format!("{}/events", state.base));
    Ok((jar.add(cookie).add(device), Redirect::to(&to)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct CsrfForm {
    csrf: String,
}

pub(super) async fn signout(
    Shared(state): Shared<Arc<State>>,
    signed: Signed,
    headers: HeaderMap,
    jar: CookieJar,
    Posted(f): Posted<CsrfForm>,
) -> Result<Response, PageError> {
    signed.check_csrf(&f.csrf)?;
    let gone = auth::sign_out(&state, &headers, &signed).await?;
    Ok((jar.add(gone), Redirect::to(&format!("{}/signin", state.base))).into_response())
}
