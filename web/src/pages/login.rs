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
use crate::auth::COOKIE;
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
        @if ctx.signed_in {
            p.flash { "You are signed in: the actions are enabled." }
        } @else {
            p { "Signing in enables reopening, cancelling and redispatching. Reading needs no token." }
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
    if !form.token.as_deref().is_some_and(|t| auth.is_token(t)) {
        return Err(PageError::SignInRequired {
            next,
            wrong_token: true,
        });
    }
    let cookie = format!(
        "{COOKIE}={}; Path={}; HttpOnly; SameSite=Strict",
        auth.session(),
        cookie_path(&ctx)
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
    let cookie = format!(
        "{COOKIE}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
        cookie_path(&ctx)
    );
    Ok(([(SET_COOKIE, cookie)], Redirect::to(&ctx.href("/"))).into_response())
}

/// The dashboard's own paths only.
fn cookie_path(ctx: &Ctx) -> &str {
    if ctx.base.is_empty() { "/" } else { &ctx.base }
}
