//! What each request knows about where it is: the path the dashboard is
//! mounted at (so links work under any prefix), whether the browser is
//! signed in, the client's address; and the middleware that turns a
//! handler's [`PageError`] into a full page with that context and sets the
//! security headers on every answer.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, OriginalUri, Request, State};
use axum::http::HeaderValue;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, COOKIE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
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
    /// Signed in with the action token: the live session's cookie value.
    pub(crate) session: Option<String>,
    /// The session's CSRF value, when signed in.
    csrf: Option<String>,
    /// The client's address, when the server passes `ConnectInfo`.
    pub(crate) client: Option<IpAddr>,
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

    /// Whether the browser is signed in.
    pub(crate) fn signed_in(&self) -> bool {
        self.session.is_some()
    }

    /// The CSRF value for this browser's forms, when it is signed in.
    pub(crate) fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }

    /// Whether this request may see task data (payloads, responses, request
    /// keys, errors): signed in, or the dashboard opted into open reads.
    pub(crate) fn sees_task_data(&self) -> bool {
        self.shared.open_reads || self.signed_in()
    }

    /// Checks that task data may be shown: open reads or signed in (else
    /// 401 with the sign-in form, or 403 when no one can sign in).
    pub(crate) fn may_see_task_data(&self, next: &str) -> Result<(), PageError> {
        if self.sees_task_data() {
            return Ok(());
        }
        if self.shared.auth.is_none() {
            return Err(PageError::TaskDataHidden);
        }
        Err(PageError::SignInRequired {
            next: next.to_owned(),
            wrong_token: false,
        })
    }

    /// Checks that an action may run: actions enabled (else 403), signed
    /// in (else 401), and `csrf` is this session's value (else 403).
    pub(crate) fn authorize(&self, csrf: Option<&str>, next: &str) -> Result<(), PageError> {
        let Some(auth) = &self.shared.auth else {
            return Err(PageError::ReadOnly);
        };
        let Some(session) = &self.session else {
            return Err(PageError::SignInRequired {
                next: next.to_owned(),
                wrong_token: false,
            });
        };
        match csrf {
            Some(value) if auth.is_csrf(session, value) => Ok(()),
            _ => Err(PageError::Csrf),
        }
    }

    /// Checks that a confirmation page may be shown: actions enabled and signed in.
    pub(crate) fn may_confirm(&self, next: &str) -> Result<(), PageError> {
        if self.shared.auth.is_none() {
            return Err(PageError::ReadOnly);
        }
        if !self.signed_in() {
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
    let session = match &shared.auth {
        Some(auth) => request
            .headers()
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| auth::cookie(v, shared.cookie_name()))
            .find(|v| auth.is_session(v))
            .map(str::to_owned),
        None => None,
    };
    let csrf = match (&shared.auth, &session) {
        (Some(auth), Some(session)) => Some(auth.csrf(session)),
        _ => None,
    };
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let ctx = Ctx {
        shared,
        base,
        session,
        csrf,
        client,
    };
    request.extensions_mut().insert(ctx.clone());
    let mut response = next.run(request).await;
    let mut response = match response.extensions_mut().remove::<PageError>() {
        Some(error) => {
            let status = response.status();
            let mut page = (status, html::error_page(&ctx, &error)).into_response();
            page.headers_mut().extend(
                response
                    .headers()
                    .iter()
                    .filter(|(name, _)| name.as_str().starts_with("www-") || name.as_str() == "retry-after")
                    .map(|(n, v)| (n.clone(), v.clone())),
            );
            page
        }
        None => response,
    };
    secure_headers(response.headers_mut());
    response
}

/// What the browser may load and do on the dashboard's pages: only its own
/// stylesheet and script, forms posted to itself, never inside a frame.
pub(crate) const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; \
     frame-ancestors 'none'";

/// The security headers of every answer. Pages (they hold task data) are
/// never stored by the browser or a proxy; the assets keep their own
/// long-lived `Cache-Control`.
fn secure_headers(headers: &mut axum::http::HeaderMap) {
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if !headers.contains_key(CACHE_CONTROL) {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
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
