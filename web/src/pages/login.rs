//! `GET`/`POST /login` and `POST /logout`: trading the action token for a
//! session cookie, and giving it back.

use axum::Form;
use axum::extract::Query;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::http::header::SET_COOKIE;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::{bad_query, given, local_path};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

#[derive(Debug, Deserialize)]
pub(crate) struct Params {
    next: Option<String>,
}

/// The sign-in page.
pub(crate) async fn show(
    ctx: Ctx,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    if !ctx.actions_enabled() {
        return Err(PageError::ReadOnly);
    }
    let next = local_path(given(&params.next));
    let body = html! {
        h1 { "Sign in" }
        @if ctx.signed_in() {
            p.flash { "You are signed in: the actions are enabled." }
        } @else {
            p { "Signing in shows the task data (payloads, responses, request keys, errors) and enables reopening, cancelling and redispatching." }
            (html::sign_in_form(&ctx, &next))
        }
    };
    Ok(html::page(&ctx, "Sign in", Nav::None, None, body))
}

#[derive(Debug, Deserialize)]
pub(crate) struct SignIn {
    token: Option<String>,
    next: Option<String>,
}

/// Checks the token; sets the session cookie and returns to `next`.
pub(crate) async fn sign_in(
    ctx: Ctx,
    form: Result<Form<SignIn>, FormRejection>,
) -> Result<Response, PageError> {
    let Some(auth) = &ctx.shared.auth else {
        return Err(PageError::ReadOnly);
    };
    let Form(form) =
        form.map_err(|e| PageError::BadRequest(format!("The form cannot be read: {}.", e.body_text())))?;
    let next = local_path(given(&form.next));
    // Locked out: refused before the token is even compared.
    auth.may_try(ctx.client).map_err(PageError::Throttled)?;
    if !form.token.as_deref().is_some_and(|t| auth.is_token(t)) {
        auth.failed(ctx.client);
        return Err(PageError::SignInRequired {
            next,
            wrong_token: true,
        });
    }
    auth.succeeded(ctx.client);
    if let Some(old) = &ctx.session {
        // A fresh session for each sign-in; the one it replaces ends.
        auth.close_session(old);
    }
    let cookie = format!(
        "{}={}; Max-Age={}; {}",
        ctx.shared.cookie_name(),
        auth.open_session(),
        auth.lifetime().as_secs().max(1),
        cookie_attributes(&ctx)
    );
    Ok(([(SET_COOKIE, cookie)], Redirect::to(&ctx.href(&next))).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct SignOut {
    csrf: Option<String>,
}

/// Clears the session cookie (a CSRF-checked form: no one signs you out from elsewhere).
pub(crate) async fn sign_out(
    ctx: Ctx,
    form: Result<Form<SignOut>, FormRejection>,
) -> Result<Response, PageError> {
    let csrf = form.ok().and_then(|Form(f)| f.csrf);
    ctx.authorize(csrf.as_deref(), "/")?;
    if let (Some(auth), Some(session)) = (&ctx.shared.auth, &ctx.session) {
        // Revoked here, not only forgotten by this browser: a copy of the
        // cookie is refused from now on.
        auth.close_session(session);
    }
    let cookie = format!(
        "{}=; Max-Age=0; {}",
        ctx.shared.cookie_name(),
        cookie_attributes(&ctx)
    );
    Ok(([(SET_COOKIE, cookie)], Redirect::to(&ctx.href("/"))).into_response())
}

/// The session cookie's attributes: script cannot read it, other sites'
/// requests do not carry it; over TLS it is `Secure` with `Path=/` (the
/// `__Host-` name requires both), else it covers the dashboard's own paths only.
fn cookie_attributes(ctx: &Ctx) -> String {
    if ctx.shared.tls {
        "Path=/; HttpOnly; SameSite=Strict; Secure".to_owned()
    } else {
        let path = if ctx.base.is_empty() { "/" } else { &ctx.base };
        format!("Path={path}; HttpOnly; SameSite=Strict")
    }
}
