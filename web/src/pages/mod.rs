//! The pages, one module each, and what they share: parsing ids and
//! durations from paths and query strings into clear 400s, and links that
//! keep a listing's filters.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use taskfence::TaskId;

use crate::age::AgeError;
use crate::error::PageError;
use crate::request::Ctx;

pub(crate) mod actions;
pub(crate) mod limits;
pub(crate) mod list;
pub(crate) mod login;
pub(crate) mod overview;
pub(crate) mod stranded;
pub(crate) mod task;

/// The fallback: any other path.
pub(crate) async fn not_found(uri: axum::http::Uri) -> PageError {
    PageError::NotFound(format!("There is no page at {}.", uri.path()))
}

/// `GET /health`: `200 ok` when the store answers a point read, else `503`.
pub(crate) async fn health(ctx: Ctx) -> impl IntoResponse {
    match ctx.shared.store.get(TaskId::new()).await {
        Ok(_) => (StatusCode::OK, "ok\n"),
        Err(e) => {
            tracing::warn!(error = %e, "taskfence-web: health check: the store failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable: the task store does not answer\n",
            )
        }
    }
}

/// A task id from a path or a form.
pub(crate) fn task_id(text: &str) -> Result<TaskId, PageError> {
    text.trim().parse().map_err(|_| {
        PageError::BadRequest(format!(
            "{:?} is not a task id: expected a UUID such as 0190b6a2-5c1e-7d3f-9a4b-1c2d3e4f5a6b.",
            crate::html::short(text, 80)
        ))
    })
}

/// A query string that could not be read at all (bad percent-encoding).
pub(crate) fn bad_query(rejection: QueryRejection) -> PageError {
    PageError::BadRequest(format!(
        "The query string cannot be read: {}.",
        rejection.body_text()
    ))
}

/// A form's or a query's field: absent and blank are the same.
pub(crate) fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A positive age such as `90s`, `15m`, `1h30m`, `2d` (the command line's),
/// at most [`MAX_AGE`](crate::age::MAX_AGE).
pub(crate) fn duration(field: &str, text: &str) -> Result<Duration, PageError> {
    crate::age::parse_age(text).map_err(|e| match e {
        AgeError::Zero => PageError::BadRequest(format!("{field} must be a positive duration.")),
        AgeError::NotADuration => PageError::BadRequest(format!(
            "{field}: {:?} is not a duration: expected e.g. 90s, 15m, 1h30m or 2d.",
            crate::html::short(text, 40)
        )),
        other => PageError::BadRequest(format!("{field}: {:?} is {other}.", crate::html::short(text, 40))),
    })
}

/// `now` minus the age in `text` (field `field`), as a 400 when it is not one.
pub(crate) fn cutoff(
    field: &str,
    text: &str,
    now: time::OffsetDateTime,
) -> Result<time::OffsetDateTime, PageError> {
    let age = duration(field, text)?;
    crate::age::cutoff(now, age).map_err(|e| PageError::BadRequest(format!("{field}: {e}.")))
}

/// `?a=1&b=2`, each value percent-encoded; empty when there are none.
pub(crate) fn query_string(pairs: &[(&str, String)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A path inside the dashboard to return to, or `/` when `next` is not one:
/// it must start with a single `/` (not `//` or `/\\`, which browsers read
/// as another host), and hold no backslash, control character or
/// whitespace (browsers drop tabs and newlines, so `/\t/evil.example`
/// would become `//evil.example`). Never send a browser off-site.
pub(crate) fn local_path(next: Option<&str>) -> String {
    match next {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.contains('\\')
                && !p.contains("://")
                && !p.chars().any(|c| c.is_control() || c.is_whitespace()) =>
        {
            p.to_owned()
        }
        _ => "/".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths() {
        assert_eq!(local_path(Some("/tasks/x/reopen")), "/tasks/x/reopen");
        assert_eq!(local_path(Some("//evil.example")), "/");
        assert_eq!(local_path(Some("https://evil.example")), "/");
        assert_eq!(local_path(Some("/\\evil")), "/");
        assert_eq!(local_path(Some("/\t/evil.example")), "/");
        assert_eq!(local_path(Some("/ /evil.example")), "/");
        assert_eq!(local_path(Some("/\u{a0}/evil.example")), "/");
        assert_eq!(local_path(None), "/");
    }

    #[test]
    fn query_strings() {
        assert_eq!(
            query_string(&[("scope", "a b/c".into()), ("status", String::new())]),
            "?scope=a%20b%2Fc"
        );
        assert_eq!(query_string(&[]), "");
    }
}
