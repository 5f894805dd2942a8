//! The layer's own answers, as problems. None names the task behind a key
//! or anything of the request that used it first: under a shared scope that
//! request may be another client's.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use taskfence::Error;

use crate::problem::ProblemTypes;

/// A store error as a problem; a key reused with another request without
/// the `existing_task_id` [`ProblemTypes::error`] adds.
pub(super) fn store_error(types: &ProblemTypes, error: &Error) -> Response {
    match error {
        Error::KeyConflict { .. } => types
            .problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "this Idempotency-Key was already used with a different request; use a new key for new work",
            )
            .into_response(),
        other => types.error(other).into_response(),
    }
}

pub(super) fn in_flight(types: &ProblemTypes) -> Response {
    types
        .problem(
            StatusCode::CONFLICT,
            "idempotency-key-in-flight",
            "a request with this Idempotency-Key is still being processed; retry it later",
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
        .into_response()
}

pub(super) fn exhausted(types: &ProblemTypes) -> Response {
    types
        .problem(
            StatusCode::GONE,
            "idempotency-key-exhausted",
            "the request with this Idempotency-Key ran out of runs without a response to keep, \
             or was cancelled; send it under a new key",
        )
        .into_response()
}

pub(super) fn request_too_large(types: &ProblemTypes, limit: usize) -> Response {
    let detail = format!("the request body is over {limit} bytes");
    types
        .problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large", detail)
        .into_response()
}

pub(super) fn request_unreadable(types: &ProblemTypes) -> Response {
    types
        .problem(
            StatusCode::BAD_REQUEST,
            "invalid-body",
            "the request body could not be read",
        )
        .into_response()
}

pub(super) fn response_too_large(types: &ProblemTypes, limit: usize) -> Response {
    let detail = format!(
        "the response is over {limit} bytes, more than this service keeps for a replay; \
         it was not sent and the key is closed"
    );
    types
        .problem(StatusCode::INTERNAL_SERVER_ERROR, "response-too-large", detail)
        .into_response()
}

pub(super) fn unavailable(types: &ProblemTypes) -> Response {
    types
        .problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the request could not be completed now; retry it with the same Idempotency-Key",
        )
        .into_response()
}

pub(super) fn internal(types: &ProblemTypes) -> Response {
    types
        .problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the response could not be rendered",
        )
        .into_response()
}
