//! [`Problem`]: RFC 9457 `application/problem+json` error responses, and
//! [`ProblemTypes`]: where this crate's problem types live.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use taskfence::Error;

/// The media type of every [`Problem`] body.
///
/// ```
/// assert_eq!(taskfence_axum::PROBLEM_JSON, "application/problem+json");
/// ```
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem detail: an error response with a status, a problem
/// `type` (a URI reference clients branch on), a `title` (the same for every
/// occurrence of the type), a `detail` (this occurrence, for people), an
/// optional `instance`, and extension members.
///
/// The body is serialized in a fixed member order (`type`, `title`, `status`,
/// `detail`, `instance`, then extensions in insertion order), so the same
/// problem always renders the same bytes. It is one pointer wide, so a
/// `Result<T, Problem>` stays small.
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use taskfence_axum::Problem;
///
/// let problem = Problem::new(StatusCode::CONFLICT)
///     .with_type("https://api.example.com/problems/out-of-stock")
///     .with_title("Out of stock")
///     .with_detail("item 42 is out of stock")
///     .with_instance("/orders/7")
///     .with_extension("item", 42);
/// assert_eq!(
///     problem.to_json(),
///     r#"{"type":"https://api.example.com/problems/out-of-stock","title":"Out of stock","status":409,"detail":"item 42 is out of stock","instance":"/orders/7","item":42}"#
/// );
///
/// assert_eq!(std::mem::size_of::<Problem>(), std::mem::size_of::<usize>());
///
/// let response = problem.into_response();
/// assert_eq!(response.status(), StatusCode::CONFLICT);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Problem(Box<Members>);

#[derive(Debug, Clone, PartialEq)]
struct Members {
    status: StatusCode,
    problem_type: String,
    title: String,
    detail: Option<String>,
    instance: Option<String>,
    extensions: Map<String, Value>,
    headers: HeaderMap,
}

/// The members RFC 9457 defines; an extension may not take their names.
const STANDARD_MEMBERS: [&str; 5] = ["type", "title", "status", "detail", "instance"];

impl Problem {
    /// A problem of type `about:blank` whose title is the status' reason
    /// phrase, as RFC 9457 asks for that type. Add a type, a detail and
    /// extensions with the `with_*` methods.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::NOT_FOUND);
    /// assert_eq!(p.problem_type(), "about:blank");
    /// assert_eq!(p.title(), "Not Found");
    /// assert_eq!(p.to_json(), r#"{"type":"about:blank","title":"Not Found","status":404}"#);
    /// ```
    pub fn new(status: StatusCode) -> Self {
        Self(Box::new(Members {
            status,
            problem_type: "about:blank".to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            detail: None,
            instance: None,
            extensions: Map::new(),
            headers: HeaderMap::new(),
        }))
    }

    /// Sets the `type` member: a URI reference that identifies the kind of
    /// problem (absolute, or relative with the full path, e.g. `/problems/x`).
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::BAD_REQUEST).with_type("/problems/invalid-wait");
    /// assert_eq!(p.problem_type(), "/problems/invalid-wait");
    /// ```
    pub fn with_type(mut self, uri: impl Into<String>) -> Self {
        self.0.problem_type = uri.into();
        self
    }

    /// Sets the `title` member (by default the status' reason phrase).
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::BAD_REQUEST).with_title("Bad wait");
    /// assert_eq!(p.title(), "Bad wait");
    /// ```
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.0.title = title.into();
        self
    }

    /// Sets the `detail` member: what went wrong this time, for a person.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::BAD_REQUEST).with_detail("wait=61s is too long");
    /// assert_eq!(p.detail(), Some("wait=61s is too long"));
    /// ```
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.0.detail = Some(detail.into());
        self
    }

    /// Sets the `instance` member: a URI reference for this occurrence.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::NOT_FOUND).with_instance("/tasks/7");
    /// assert_eq!(p.instance(), Some("/tasks/7"));
    /// ```
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.0.instance = Some(instance.into());
        self
    }

    /// Adds an extension member. A name RFC 9457 defines itself (`type`,
    /// `title`, `status`, `detail`, `instance`) is ignored: set those with
    /// their own methods.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::TOO_MANY_REQUESTS)
    ///     .with_extension("balance", 30)
    ///     .with_extension("status", 200); // ignored
    /// assert_eq!(p.extension("balance"), Some(&serde_json::json!(30)));
    /// assert_eq!(p.to_json(), r#"{"type":"about:blank","title":"Too Many Requests","status":429,"balance":30}"#);
    /// ```
    pub fn with_extension(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let name = name.into();
        if !STANDARD_MEMBERS.contains(&name.as_str()) {
            self.0.extensions.insert(name, value.into());
        }
        self
    }

    /// Adds a response header, e.g. `WWW-Authenticate` on a 401 or
    /// `Retry-After` on a 503. `Content-Type` is always `application/problem+json`.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use http::{HeaderValue, StatusCode, header};
    /// let response = taskfence_axum::Problem::new(StatusCode::UNAUTHORIZED)
    ///     .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
    ///     .into_response();
    /// assert_eq!(response.headers()["www-authenticate"], "Bearer");
    /// ```
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.0.headers.insert(name, value);
        self
    }

    /// The HTTP status.
    ///
    /// ```
    /// use http::StatusCode;
    /// assert_eq!(taskfence_axum::Problem::new(StatusCode::GONE).status(), StatusCode::GONE);
    /// ```
    pub fn status(&self) -> StatusCode {
        self.0.status
    }

    /// The `type` member.
    ///
    /// ```
    /// use http::StatusCode;
    /// assert_eq!(taskfence_axum::Problem::new(StatusCode::GONE).problem_type(), "about:blank");
    /// ```
    pub fn problem_type(&self) -> &str {
        &self.0.problem_type
    }

    /// The `title` member.
    ///
    /// ```
    /// use http::StatusCode;
    /// assert_eq!(taskfence_axum::Problem::new(StatusCode::GONE).title(), "Gone");
    /// ```
    pub fn title(&self) -> &str {
        &self.0.title
    }

    /// The `detail` member, if set.
    ///
    /// ```
    /// use http::StatusCode;
    /// assert_eq!(taskfence_axum::Problem::new(StatusCode::GONE).detail(), None);
    /// ```
    pub fn detail(&self) -> Option<&str> {
        self.0.detail.as_deref()
    }

    /// The `instance` member, if set.
    ///
    /// ```
    /// use http::StatusCode;
    /// assert_eq!(taskfence_axum::Problem::new(StatusCode::GONE).instance(), None);
    /// ```
    pub fn instance(&self) -> Option<&str> {
        self.0.instance.as_deref()
    }

    /// An extension member, if set.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::GONE).with_extension("since", "2026-01-01");
    /// assert_eq!(p.extension("since").and_then(|v| v.as_str()), Some("2026-01-01"));
    /// ```
    pub fn extension(&self, name: &str) -> Option<&Value> {
        self.0.extensions.get(name)
    }

    /// The body, as it is sent.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::Problem::new(StatusCode::GONE).with_detail("purged");
    /// assert_eq!(p.to_json(), r#"{"type":"about:blank","title":"Gone","status":410,"detail":"purged"}"#);
    /// ```
    pub fn to_json(&self) -> String {
        // Strings, numbers and `Value`s only: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 3
            + usize::from(self.0.detail.is_some())
            + usize::from(self.0.instance.is_some())
            + self.0.extensions.len();
        let mut map = serializer.serialize_map(Some(len))?;
        map.serialize_entry("type", &self.0.problem_type)?;
        map.serialize_entry("title", &self.0.title)?;
        map.serialize_entry("status", &self.0.status.as_u16())?;
        if let Some(detail) = &self.0.detail {
            map.serialize_entry("detail", detail)?;
        }
        if let Some(instance) = &self.0.instance {
            map.serialize_entry("instance", instance)?;
        }
        for (name, value) in &self.0.extensions {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0.status.as_u16(), self.0.problem_type)?;
        if let Some(detail) = &self.0.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problem {}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.to_json();
        let mut response = (self.0.status, body).into_response();
        let headers = response.headers_mut();
        headers.extend(self.0.headers);
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

/// A taskfence error as a problem, with the [default types](ProblemTypes::default):
/// see [`ProblemTypes::error`] for each status.
///
/// ```
/// use http::StatusCode;
/// use taskfence::{Error, TaskId};
/// use taskfence_axum::Problem;
/// let existing = TaskId::new();
/// let p = Problem::from(Error::KeyConflict { existing });
/// assert_eq!(p.status(), StatusCode::UNPROCESSABLE_ENTITY);
/// assert_eq!(p.problem_type(), "/problems/idempotency-key-reused");
/// assert_eq!(p.extension("existing_task_id"), Some(&serde_json::json!(existing.to_string())));
/// ```
impl From<Error> for Problem {
    fn from(error: Error) -> Self {
        ProblemTypes::default().error(&error)
    }
}

/// Where this crate's problem types live: each type is `{base}{slug}`, the
/// base `/problems/` unless you choose another (an absolute URI where your
/// API documents them, say).
///
/// | slug | status | raised by |
/// | --- | --- | --- |
/// | `idempotency-key-missing` | 400 | no `Idempotency-Key` header |
/// | `idempotency-key-malformed` | 400 | a bad key, or two headers |
/// | `idempotency-key-reused` | 422 | [`Error::KeyConflict`] |
/// | `invalid-request` | 400 | [`Error::InvalidInput`] |
/// | `not-found` | 404 | [`Error::NotFound`] |
/// | `unavailable` | 503 | [`Error::Storage`] and any other error |
///
/// Titles are the status' reason phrase; the detail says what happened.
///
/// ```
/// use http::StatusCode;
/// use taskfence_axum::ProblemTypes;
/// const TYPES: ProblemTypes = ProblemTypes::new("https://api.example.com/problems/");
/// assert_eq!(TYPES.uri("not-found"), "https://api.example.com/problems/not-found");
/// let p = TYPES.problem(StatusCode::BAD_REQUEST, "invalid-wait", "wait=61s is too long");
/// assert_eq!(p.problem_type(), "https://api.example.com/problems/invalid-wait");
/// assert_eq!(ProblemTypes::default().uri("not-found"), "/problems/not-found");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemTypes {
    base: Cow<'static, str>,
}

impl Default for ProblemTypes {
    /// `/problems/`: relative to the API, where its documentation would live.
    fn default() -> Self {
        Self::new("/problems/")
    }
}

impl ProblemTypes {
    /// Types under `base`, which should end with `/` (or whatever joins it to a slug).
    ///
    /// ```
    /// let types = taskfence_axum::ProblemTypes::new("urn:example:problem:");
    /// assert_eq!(types.uri("not-found"), "urn:example:problem:not-found");
    /// ```
    pub const fn new(base: &'static str) -> Self {
        Self {
            base: Cow::Borrowed(base),
        }
    }

    /// Types under a base known only at run time (from configuration).
    ///
    /// ```
    /// let types = taskfence_axum::ProblemTypes::owned(format!("https://{}/problems/", "api.example.com"));
    /// assert_eq!(types.uri("x"), "https://api.example.com/problems/x");
    /// ```
    pub fn owned(base: String) -> Self {
        Self {
            base: Cow::Owned(base),
        }
    }

    /// The base.
    ///
    /// ```
    /// assert_eq!(taskfence_axum::ProblemTypes::default().base(), "/problems/");
    /// ```
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The type URI of `slug`.
    ///
    /// ```
    /// assert_eq!(taskfence_axum::ProblemTypes::default().uri("unavailable"), "/problems/unavailable");
    /// ```
    pub fn uri(&self, slug: &str) -> String {
        format!("{}{slug}", self.base)
    }

    /// A problem of type `{base}{slug}` with the status' reason phrase as title.
    ///
    /// ```
    /// use http::StatusCode;
    /// let p = taskfence_axum::ProblemTypes::default().problem(StatusCode::NOT_FOUND, "not-found", "no such task");
    /// assert_eq!(p.to_json(), r#"{"type":"/problems/not-found","title":"Not Found","status":404,"detail":"no such task"}"#);
    /// ```
    pub fn problem(&self, status: StatusCode, slug: &str, detail: impl Into<String>) -> Problem {
        Problem::new(status).with_type(self.uri(slug)).with_detail(detail)
    }

    /// 500 `internal` for a failure of the service's own work (its own
    /// queries, say): the cause is logged (`tracing`, error level), never
    /// sent, and the detail tells the client to retry with the same key —
    /// nothing may be assumed written.
    ///
    /// ```
    /// let p = taskfence_axum::ProblemTypes::default().internal("connection reset");
    /// assert_eq!((p.status(), p.problem_type()), (http::StatusCode::INTERNAL_SERVER_ERROR, "/problems/internal"));
    /// assert!(!p.to_json().contains("connection reset"));
    /// ```
    pub fn internal(&self, cause: impl fmt::Display) -> Problem {
        tracing::error!(error = %cause, "request failed");
        self.problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the request could not be completed; retry it with the same Idempotency-Key",
        )
    }

    /// A refused request body (what axum's `JsonRejection` says, as its
    /// `status()` and `body_text()`), by status: 413 `body-too-large`, 415
    /// `unsupported-media-type`, anything else `invalid-body` (400 for
    /// unreadable JSON, 422 for JSON of the wrong shape).
    ///
    /// ```
    /// use http::StatusCode;
    /// let types = taskfence_axum::ProblemTypes::default();
    /// let p = types.rejected_body(StatusCode::PAYLOAD_TOO_LARGE, "length limit exceeded");
    /// assert_eq!(p.problem_type(), "/problems/body-too-large");
    /// let p = types.rejected_body(StatusCode::UNPROCESSABLE_ENTITY, "unknown field `role`");
    /// assert_eq!((p.status(), p.problem_type()), (StatusCode::UNPROCESSABLE_ENTITY, "/problems/invalid-body"));
    /// ```
    pub fn rejected_body(&self, status: StatusCode, detail: impl Into<String>) -> Problem {
        let slug = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "body-too-large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
            _ => "invalid-body",
        };
        self.problem(status, slug, detail)
    }

    /// The `?wait=` of a long-poll: absent is zero; otherwise a duration as
    /// every taskfence setting spells it (`30s`, `1500ms`, `30`,
    /// [`taskfence::config::parse_duration`]) of at most `max`. Anything
    /// else is a 400 `invalid-wait`: a server that waits must bound it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let types = taskfence_axum::ProblemTypes::default();
    /// let max = Duration::from_secs(60);
    /// assert_eq!(types.wait(Some("30s"), max).unwrap(), Duration::from_secs(30));
    /// assert_eq!(types.wait(None, max).unwrap(), Duration::ZERO);
    /// assert_eq!(types.wait(Some("61s"), max).unwrap_err().problem_type(), "/problems/invalid-wait");
    /// assert_eq!(types.wait(Some("soon"), max).unwrap_err().status(), 400);
    /// ```
    pub fn wait(&self, text: Option<&str>, max: Duration) -> Result<Duration, Problem> {
        let Some(text) = text else {
            return Ok(Duration::ZERO);
        };
        let bad = |detail: String| self.problem(StatusCode::BAD_REQUEST, "invalid-wait", detail);
        let wait = taskfence::config::parse_duration(text).map_err(|e| bad(format!("wait: {e}")))?;
        if wait > max {
            return Err(bad(format!(
                "wait={text} is longer than the limit of {}s",
                max.as_secs()
            )));
        }
        Ok(wait)
    }

    /// A taskfence error as a problem:
    ///
    /// - [`Error::KeyConflict`] → **422** `idempotency-key-reused`, with the
    ///   task the key is bound to as the extension member `existing_task_id`
    ///   (the IETF Idempotency-Key draft's status for a key reused with another
    ///   payload). Nothing was written. The id is the key's task: send this
    ///   only where the key's scope is the caller (as `RequestKey::new(caller,
    ///   …)`), never under a scope several clients share.
    /// - [`Error::InvalidInput`] → **400** `invalid-request`, the limit it broke
    ///   as the detail. 400, not 422: what taskfence checks (the key, its
    ///   scope, the payload's size) is the request's framing, not the meaning
    ///   of its body; and a 422 from a submission then always means "key
    ///   reused". Validate your own settings (retention, retry policy) at
    ///   start-up, so this never reports a server mistake.
    /// - [`Error::NotFound`] → **404** `not-found`.
    /// - [`Error::Storage`] (and any later variant) → **503** `unavailable`
    ///   with a generic detail: the cause is logged (`tracing`, error level),
    ///   never sent. The client retries with the same key: a submission that
    ///   did take effect is then found, not repeated.
    ///
    /// ```
    /// use std::io;
    /// use http::StatusCode;
    /// use taskfence::{Error, TaskId};
    /// use taskfence::error::InvalidInput;
    /// use taskfence_axum::ProblemTypes;
    /// let types = ProblemTypes::default();
    /// let invalid = types.error(&Error::from(InvalidInput::Blank { field: "key" }));
    /// assert_eq!((invalid.status(), invalid.problem_type()), (StatusCode::BAD_REQUEST, "/problems/invalid-request"));
    /// let missing = types.error(&Error::NotFound(TaskId::new()));
    /// assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    /// let down = types.error(&Error::storage(io::Error::other("password=hunter2")));
    /// assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    /// assert!(!down.to_json().contains("hunter2"));
    /// ```
    pub fn error(&self, error: &Error) -> Problem {
        match error {
            Error::KeyConflict { existing } => self
                .problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency-key-reused",
                    "this Idempotency-Key was already used with a different request body; use a new key for new work",
                )
                .with_extension("existing_task_id", existing.to_string()),
            Error::InvalidInput(invalid) => {
                self.problem(StatusCode::BAD_REQUEST, "invalid-request", invalid.to_string())
            }
            Error::NotFound(_) => self.problem(StatusCode::NOT_FOUND, "not-found", "no such task"),
            other => {
                tracing::error!(error = %other, "taskfence store failed");
                self.problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the request could not be completed now; retry it with the same Idempotency-Key",
                )
            }
        }
    }
}
