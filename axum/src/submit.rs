//! [`SubmitResponse`]: "submit, or return the task this key already names",
//! as an HTTP response; [`TaskBody`]: its default JSON body.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{self, HeaderValue};
use serde::{Deserialize, Serialize};
use taskfence::{Error, Response as SavedResponse, Submitted, Task, TaskId};

use crate::problem::{Problem, ProblemTypes};

/// The answer to a `POST` that submits a task under an `Idempotency-Key`:
///
/// - [`Submitted::Created`] → **201 Created**;
/// - [`Submitted::Existing`] (a replay: same key, same body) → **200 OK**;
/// - an error → its [`Problem`] ([`ProblemTypes::error`]): 422 for a key
///   reused with another body, naming the existing task; 400, 404, 503 for the rest.
///
/// The body is JSON: a [`TaskBody`] by default, or whatever
/// [`SubmitResponse::with_body`] renders from the task. `Location` is set when
/// [`SubmitResponse::location`] is given a path. The same task in the same
/// state renders the same bytes, so replays of one request are byte-identical
/// (the status code aside: 201 first, 200 after).
///
/// ```
/// use axum::{Json, Router, extract::State, routing::post};
/// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
/// use taskfence_axum::{IdempotencyKey, SubmitResponse};
///
/// async fn create(State(store): State<MemoryStore>, key: IdempotencyKey, body: String) -> SubmitResponse {
///     let new = NewTask::new(RequestKey::new("tenant-1", "report.render", key.as_str()), InputHash::of([&body]))
///         .payload(body);
///     SubmitResponse::new(store.submit(new).await).location("/jobs/{id}")
/// }
/// let app: Router = Router::new().route("/jobs", post(create)).with_state(MemoryStore::new());
/// ```
#[derive(Debug)]
#[must_use = "a SubmitResponse does nothing until it is returned from a handler"]
pub struct SubmitResponse<B = TaskBody> {
    outcome: Result<Accepted<B>, Error>,
    types: ProblemTypes,
}

#[derive(Debug)]
struct Accepted<B> {
    created: bool,
    id: TaskId,
    body: B,
    location: Option<String>,
}

impl SubmitResponse<TaskBody> {
    /// The outcome of [`TaskStore::submit`](taskfence::TaskStore::submit) with a [`TaskBody`].
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// use taskfence::{Error, TaskId};
    /// use taskfence_axum::SubmitResponse;
    /// let conflict = SubmitResponse::new(Err(Error::KeyConflict { existing: TaskId::new() }));
    /// assert_eq!(conflict.into_response().status(), StatusCode::UNPROCESSABLE_ENTITY);
    /// ```
    pub fn new(result: Result<Submitted, Error>) -> Self {
        Self::with_body(result, |task| TaskBody::from(task))
    }
}

impl<B: Serialize> SubmitResponse<B> {
    /// The outcome with a body of your own, rendered from the task now. Keep
    /// it a function of the task (no clock, no counter), or replays differ.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
    /// use taskfence_axum::SubmitResponse;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Job { job: String, href: String }
    ///
    /// let store = MemoryStore::new();
    /// let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]));
    /// let response = SubmitResponse::with_body(store.submit(new).await, |task| Job {
    ///     job: task.id.to_string(),
    ///     href: format!("/jobs/{}", task.id),
    /// })
    /// .into_response();
    /// assert_eq!(response.status(), StatusCode::CREATED);
    /// # Ok(()) }
    /// ```
    pub fn with_body(result: Result<Submitted, Error>, render: impl FnOnce(&Task) -> B) -> Self {
        let outcome = result.map(|submitted| {
            let created = submitted.is_created();
            let task = submitted.task();
            Accepted {
                created,
                id: task.id,
                body: render(task),
                location: None,
            }
        });
        Self {
            outcome,
            types: ProblemTypes::default(),
        }
    }

    /// Sets `Location` to `path` with every `{id}` replaced by the task id
    /// (on the 201 and on the 200 of a replay alike; not on a problem).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use axum::response::IntoResponse;
    /// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
    /// use taskfence_axum::SubmitResponse;
    /// let store = MemoryStore::new();
    /// let submitted = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await;
    /// let id = submitted.as_ref().unwrap().task().id;
    /// let response = SubmitResponse::new(submitted).location("/jobs/{id}").into_response();
    /// assert_eq!(response.headers()["location"], format!("/jobs/{id}"));
    /// # Ok(()) }
    /// ```
    pub fn location(mut self, path: &str) -> Self {
        if let Ok(accepted) = &mut self.outcome {
            accepted.location = Some(path.replace("{id}", &accepted.id.to_string()));
        }
        self
    }

    /// Renders a failure under these problem types instead of the default ones.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use taskfence::{Error, TaskId};
    /// use taskfence_axum::{ProblemTypes, SubmitResponse};
    /// let response = SubmitResponse::new(Err(Error::NotFound(TaskId::new())))
    ///     .problem_types(ProblemTypes::new("https://api.example.com/problems/"))
    ///     .into_response();
    /// assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
    /// ```
    pub fn problem_types(mut self, types: ProblemTypes) -> Self {
        self.types = types;
        self
    }

    /// `true` when the submission wrote a new task.
    ///
    /// ```
    /// use taskfence::{Error, TaskId};
    /// use taskfence_axum::SubmitResponse;
    /// assert!(!SubmitResponse::new(Err(Error::NotFound(TaskId::new()))).is_created());
    /// ```
    pub fn is_created(&self) -> bool {
        matches!(&self.outcome, Ok(accepted) if accepted.created)
    }

    /// The task's id, unless the submission failed.
    ///
    /// ```
    /// use taskfence::{Error, TaskId};
    /// use taskfence_axum::SubmitResponse;
    /// assert_eq!(SubmitResponse::new(Err(Error::NotFound(TaskId::new()))).task_id(), None);
    /// ```
    pub fn task_id(&self) -> Option<TaskId> {
        self.outcome.as_ref().ok().map(|accepted| accepted.id)
    }
}

impl<B: Serialize> IntoResponse for SubmitResponse<B> {
    fn into_response(self) -> Response {
        let accepted = match self.outcome {
            Ok(accepted) => accepted,
            Err(error) => return self.types.error(&error).into_response(),
        };
        let body = match serde_json::to_vec(&accepted.body) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(%error, task = %accepted.id, "the response body does not serialize");
                return Problem::new(StatusCode::INTERNAL_SERVER_ERROR)
                    .with_type(self.types.uri("internal"))
                    .with_detail("the response could not be rendered")
                    .into_response();
            }
        };
        let status = if accepted.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(location) = accepted.location.and_then(|l| HeaderValue::try_from(l).ok()) {
            headers.insert(header::LOCATION, location);
        }
        response
    }
}

/// The default body of a [`SubmitResponse`]: the task's id and status and,
/// once completed, its saved response — as text (`response`) when it is
/// UTF-8, as standard base64 (`response_base64`) otherwise. Nothing else: no
/// times, no attempt count, no error text, so the same state always renders
/// the same bytes and nothing internal leaks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
/// use taskfence_axum::TaskBody;
/// let store = MemoryStore::new();
/// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// let body = TaskBody::from(&task);
/// assert_eq!(body.status, "pending");
/// assert_eq!(
///     serde_json::to_string(&body).unwrap(),
///     format!(r#"{{"id":"{}","status":"pending"}}"#, task.id)
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskBody {
    /// The task id: where to ask for it later.
    pub id: String,
    /// `pending`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// The saved response, when there is one and it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// The saved response in standard base64, when there is one and it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_base64: Option<String>,
}

impl From<&Task> for TaskBody {
    fn from(task: &Task) -> Self {
        let (response, response_base64) = match task.response.as_ref().map(SavedResponse::as_str) {
            None => (None, None),
            Some(Some(text)) => (Some(text.to_owned()), None),
            Some(None) => (None, task.response.as_ref().map(|r| base64(r.as_bytes()))),
        };
        Self {
            id: task.id.to_string(),
            status: task.status.as_str().to_owned(),
            response,
            response_base64,
        }
    }
}

/// RFC 4648 base64, with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_test_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }
}
