//! The chat API's problem types. Every error response is a
//! [`Problem`] (RFC 9457 `application/problem+json`)
//! from `taskfence-axum`, which also answers a missing or malformed
//! `Idempotency-Key` and converts taskfence's errors; this module names the
//! API's own types under the same `/problems/` base.

use std::fmt::Display;

use axum::http::StatusCode;
use taskfence_axum::{Problem, ProblemTypes};

/// Where the API's problem types live: `/problems/{slug}`, relative to the
/// API, where their documentation would be. `taskfence-axum`'s own problems
/// (`idempotency-key-missing`, `idempotency-key-malformed`,
/// `idempotency-key-reused`, `invalid-request`, `unavailable`) use the same base.
///
/// ```
/// use axum::http::StatusCode;
/// let p = chat_api::problem::TYPES.problem(StatusCode::BAD_REQUEST, "invalid-wait", "wait=61s is too long");
/// assert_eq!(p.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(p.problem_type(), "/problems/invalid-wait");
/// ```
pub const TYPES: ProblemTypes = ProblemTypes::new("/problems/");

/// A problem of type `/problems/{slug}`; clients branch on the type, never on the detail.
///
/// ```
/// use axum::http::StatusCode;
/// let p = chat_api::problem::new(StatusCode::NOT_FOUND, "not-found", "no such task");
/// assert_eq!(p.problem_type(), "/problems/not-found");
/// assert_eq!(p.title(), "Not Found");
/// ```
pub fn new(status: StatusCode, slug: &str, detail: impl Into<String>) -> Problem {
    TYPES.problem(status, slug, detail)
}

/// 500 for a failure of the app's own queries. The detail stays generic (the
/// cause is logged): nothing may be assumed written, and the client retries
/// with the same Idempotency-Key.
///
/// ```
/// let p = chat_api::problem::internal("connection reset");
/// assert_eq!(p.status(), 500);
/// assert!(!p.to_json().contains("connection reset"));
/// ```
pub fn internal(err: impl Display) -> Problem {
    TYPES.internal(err)
}
