//! What each request knows about where it is: the path the dashboard is
//! mounted at (so links work under any prefix), whether the browser is
//! signed in; and the middleware that turns a handler's [`PageError`] into a
//! full page with that context.

use std::sync::Arc;

use axum::extract::{FromRequestParts, OriginalUri, Request, State};
use axum::http::header::COOKIE;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth;
use crate::dashboard::Shared;
use crate::error::PageError;
use crate::html;

/// The request's context, for handlers and layouts.
#[derive(Clone)]
pub(crate) struct Ctx {
    /// The store and settings.
    pub(crate) shared: Arc<Shared>,
    /// The prefix the dashboard is mounted at: `""` at the root, `/ops` under `nest("/ops", …)`.
    pub(crate) base: String,
    /// Signed in with the action token.
    pub(crate) signed_in: bool,
}

impl Ctx {
    /// `path` (starting with `/`) under the mount prefix.
    pub(crate) fn href(&self, path: &str) -> String {
        // Under a prefix the overview is `/ops`, not `/ops/` (which axum's
        // `nest` does not route).
        match path.strip_prefix('/') {
            Some(rest) if !self.base.is_empty() && (rest.is_empty() || rest.starts_with('?')) => {
                format!("{}{rest}", self.base)
            }
            _ => format!("{}{path}", self.base),
        }
    }

    /// Whether this dashboard was started with an action token.
    pub(crate) fn actions_enabled(&self) -> bool {
        self.shared.auth.is_some()
    }

    /// The CSRF value for this browser's forms, when it is signed in.
    pub(crate) fn csrf(&self) -> Option<&str> {
        match &self.shared.auth {
            Some(auth) if self.signed_in => Some(auth.csrf()),
            _ => None,
        }
    }

    /// Checks that an action may run: actions enabled (else 403), signed
    /// in (else 401), and `csrf` is this session's value (else 403).
    pub(crate) fn authorize(&self, csrf: Option<&str>, next: &str) -> Result<(), PageError> {
        let Some(auth) = &self.shared.auth else {
            return Err(PageError::ReadOnly);
        };
        if !self.signed_in {
            return Err(PageError::SignInRequired {
                next: next.to_owned(),
                wrong_token: false,
            });
        }
        match csrf {
            Some(value) if auth.is_csrf(value) => Ok(()),
            _ => Err(PageError::Csrf),
        }
    }

    /// Checks that a confirmation page may be shown: actions enabled and signed in.
    pub(crate) fn may_confirm(&self, next: &str) -> Result<(), PageError> {
        if self.shared.auth.is_none() {
            return Err(PageError::ReadOnly);
        }
        if !self.signed_in {
            return Err(PageError::SignInRequired {
                next: next.to_owned(),
                wrong_token: false,
            });
        }
        Ok(())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Ctx {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Ctx>()
            .cloned()
            .ok_or_else(|| PageError::Internal("the dashboard's context is missing".into()))
    }
}

/// The middleware around every route: works out the [`Ctx`], runs the
/// handler, and renders a [`PageError`] it returned as a page.
pub(crate) async fn context(State(shared): State<Arc<Shared>>, mut request: Request, next: Next) -> Response {
    let inner = request.uri().path().to_owned();
    let original = request
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| inner.clone(), |o| o.0.path().to_owned());
    let base = mount_prefix(&original, &inner);
    let signed_in = match &shared.auth {
        Some(auth) => request
            .headers()
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| auth::cookie(v, auth::COOKIE))
            .any(|v| auth.is_session(v)),
        None => false,
    };
    let ctx = Ctx {
        shared,
        base,
        signed_in,
    };
    request.extensions_mut().insert(ctx.clone());
    let mut response = next.run(request).await;
    match response.extensions_mut().remove::<PageError>() {
        Some(error) => {
            let status = response.status();
            let mut page = (status, html::error_page(&ctx, &error)).into_response();
            page.headers_mut().extend(
                response
                    .headers()
                    .iter()
                    .filter(|(name, _)| {
                        name.as_str().starts_with("www-") || *name == axum::http::header::RETRY_AFTER
                    })
                    .map(|(n, v)| (n.clone(), v.clone())),
            );
            page
        }
        None => response,
    }
}

/// The prefix `original` has before `inner` (the path the nested router sees).
fn mount_prefix(original: &str, inner: &str) -> String {
    let prefix = if inner == "/" {
        original.strip_suffix('/').unwrap_or(original)
    } else {
        original.strip_suffix(inner).unwrap_or("")
    };
    prefix.to_owned()
}

#[cfg(test)]
mod tests {
    use super::mount_prefix;

    #[test]
    fn prefixes() {
        assert_eq!(mount_prefix("/tasks", "/tasks"), "");
        assert_eq!(mount_prefix("/", "/"), "");
        assert_eq!(mount_prefix("/ops/tasks", "/tasks"), "/ops");
        assert_eq!(mount_prefix("/ops", "/"), "/ops");
        assert_eq!(mount_prefix("/ops/", "/"), "/ops");
    }
}
