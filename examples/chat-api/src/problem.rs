//! [`Problem`]: every error response, as RFC 9457 `application/problem+json`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error response: a status, a stable problem type and a human-readable
/// detail. Clients branch on `type`, never on `detail`.
///
/// ```
/// use axum::http::StatusCode;
/// let p = chat_api::Problem::new(StatusCode::BAD_REQUEST, "idempotency-key-missing", "send an Idempotency-Key");
/// assert_eq!(p.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(p.problem_type(), "/problems/idempotency-key-missing");
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    kind: String,
    title: &'static str,
    #[serde(serialize_with = "as_u16")]
    status: StatusCode,
    detail: String,
}

fn as_u16<S: serde::Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

impl Problem {
    /// A problem of type `/problems/{slug}` (a URI reference relative to the
    /// API, where its documentation would live).
    pub fn new(status: StatusCode, slug: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("/problems/{slug}"),
            title: status.canonical_reason().unwrap_or("Error"),
            status,
            detail: detail.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `type` member.
    pub fn problem_type(&self) -> &str {
        &self.kind
    }

    /// 500 for a storage failure. The detail stays generic (the cause is
    /// logged): nothing may be assumed written, and the client retries with the
    /// same Idempotency-Key.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the request could not be completed; retry it with the same Idempotency-Key",
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
