//! [`PageError`]: everything a page can answer besides itself, each with its
//! status. A handler returns one; the context middleware renders it as a
//! page (`request::context`), so nothing reaches the browser as a bare
//! message, a panic or a stack trace.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use taskfence::{Rejection, TaskId};

/// Why a request did not get its page.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub(crate) enum PageError {
    /// 404: no such task or page.
    NotFound(String),
    /// 400: a malformed id, cursor, filter or form field; the text says which and why.
    BadRequest(String),
    /// 401: the action needs the token; `next` is where to return after signing in.
    SignInRequired {
        /// The page to return to.
        next: String,
        /// The token just offered was wrong.
        wrong_token: bool,
    },
    /// 403: the dashboard was started without an action token.
    ReadOnly,
    /// 403: the page shows task data, which needs sign-in, and no one can
    /// sign in (no action token, no open reads).
    TaskDataHidden,
    /// 429: too many wrong tokens; sign-in is closed for this long.
    Throttled(std::time::Duration),
    /// 403: the form's CSRF value is missing or forged.
    Csrf,
    /// 409: the store refused the change; the typed reason.
    Refused {
        /// `reopen` or `cancel`.
        action: &'static str,
        /// The task.
        id: TaskId,
        /// The store's reason.
        rejection: Box<Rejection>,
    },
    /// 503: the store did not answer (the cause is logged, not shown).
    Unavailable,
    /// 503 with `Retry-After`: too many pages are reading the store at
    /// once, or the store cancelled a read that ran past its time limit.
    Busy,
    /// 500: a bug of the dashboard's own.
    Internal(String),
}

impl PageError {
    /// The status it is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            PageError::NotFound(_) => StatusCode::NOT_FOUND,
            PageError::BadRequest(_) => StatusCode::BAD_REQUEST,
            PageError::SignInRequired { .. } => StatusCode::UNAUTHORIZED,
            PageError::ReadOnly | PageError::Csrf | PageError::TaskDataHidden => StatusCode::FORBIDDEN,
            PageError::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
            PageError::Refused { .. } => StatusCode::CONFLICT,
            PageError::Unavailable | PageError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            PageError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A store's error as a page: unknown task 404, bad input 400, the rest 503 (logged).
    pub(crate) fn store(err: taskfence::Error) -> Self {
        match err {
            taskfence::Error::NotFound(id) => {
                PageError::NotFound(format!("No task with id {id} in this store."))
            }
            taskfence::Error::InvalidInput(e) => {
                PageError::BadRequest(format!("The store refused the input: {e}."))
            }
            taskfence::Error::ReadTimeout { limit } => {
                tracing::warn!(?limit, "taskfence-web: a read ran past the store's time limit");
                PageError::Busy
            }
            other => {
                tracing::error!(error = %other, kind = other.label(), "taskfence-web: the store failed");
                PageError::Unavailable
            }
        }
    }
}

impl From<taskfence::Error> for PageError {
    fn from(err: taskfence::Error) -> Self {
        PageError::store(err)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let mut response = self.status().into_response();
        if matches!(self, PageError::SignInRequired { .. }) {
            // Not HTTP authentication: the page holds a sign-in form.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Form realm=\"taskfence\""),
            );
        }
        if matches!(self, PageError::Busy) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(crate::gate::RETRY_AFTER_SECS),
            );
        }
        if let PageError::Throttled(wait) = &self {
            // Whole seconds, rounded up: never "retry after 0".
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs.max(1)),
            );
        }
        response.extensions_mut().insert(self);
        response
    }
}
