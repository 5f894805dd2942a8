//! Scaffolding, not for copying: bearer tokens looked up in a fixed map
//! (`CHAT_API_TOKENS`), standing in for your authentication. Whatever
//! replaces it yields the user id that scopes every key and task.

use std::collections::HashMap;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use taskfence_axum::Problem;

use crate::api::AppState;

/// The authenticated caller: the scope of every key and task.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) String);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()?.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
        match bearer.and_then(|(_, token)| state.config.tokens.get(token.trim())) {
            Some(user) => Ok(Caller(user.clone())),
            None => Err(unauthenticated()),
        }
    }
}

/// 401 with `WWW-Authenticate: Bearer`.
///
/// ```
/// use axum::response::IntoResponse;
/// let response = chat_api::sim::auth::unauthenticated().into_response();
/// assert_eq!(response.status(), 401);
/// assert_eq!(response.headers()["www-authenticate"], "Bearer");
/// ```
pub fn unauthenticated() -> Problem {
    crate::PROBLEMS
        .problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send Authorization: Bearer <token> with a known token",
        )
        .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
}

/// Bearer token → user id, as parsed from `token=user,token=user`
/// (`CHAT_API_TOKENS`).
pub type Tokens = HashMap<String, String>;

/// `token=user,token=user` (blank entries ignored).
///
/// ```
/// let tokens = chat_api::sim::auth::parse_tokens("a-token=alice, b-token=bob,").unwrap();
/// assert_eq!(tokens["b-token"], "bob");
/// assert!(chat_api::sim::auth::parse_tokens("just-a-token").is_err());
/// ```
pub fn parse_tokens(text: &str) -> Result<Tokens, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((token, user)) if !token.trim().is_empty() && !user.trim().is_empty() => {
                Ok((token.trim().to_owned(), user.trim().to_owned()))
            }
            _ => Err(format!("{pair:?} is not token=user")),
        })
        .collect()
}
