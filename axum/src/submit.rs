//! [`SubmitResponse`]: "submit, or return the task this key already names",
//! as an HTTP response; [`TaskBody`]: its default JSON body; [`json_response`]:
//! a body the service renders itself, first or replayed; [`health`]: a readiness probe's answer;
//! [`TaskStatus`]: the task's part of a `GET /tasks/{id}` view.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{self, HeaderValue};
use serde::{Deserialize, Serialize};
use taskfence::{Error, Response as SavedResponse, Submitted, Task, TaskId};

use crate::key::IDEMPOTENT_REPLAYED;
use crate::problem::{Problem, ProblemTypes};

/// The answer to a `POST` that submits a task under an `Idempotency-Key`:
///
/// - [`Submitted::Created`] → **201 Created**;
/// - [`Submitted::Existing`] (a replay: same key, same body) → **201 Created**
///   again, with [`Idempotent-Replayed: true`](crate::IDEMPOTENT_REPLAYED):
///   the first response's status, as [`IdempotencyLayer`](crate::IdempotencyLayer)
///   replays it, so a client sees one behaviour whichever the server uses;
/// - an error → its [`Problem`] ([`ProblemTypes::error`]): 422 for a key
///   reused with another body, naming the existing task; 400, 404, 503 for the rest.
///
/// The body is JSON: a [`TaskBody`] by default, or whatever
/// [`SubmitResponse::with_body`] renders from the task. `Location` is set when
/// [`SubmitResponse::location`] is given a path. The body describes the task
/// as it is *now* (pending, then completed with its response), so a client
/// that retries learns the outcome; the same task in the same state renders
/// the same bytes.
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
    /// (on the first response and on a replay alike; not on a problem).
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

    /// `true` when the submission wrote a new task (`false` for a replay).
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
        let mut response = json_response(StatusCode::CREATED, body, !accepted.created);
        let headers = response.headers_mut();
        if let Some(location) = accepted.location.and_then(|l| HeaderValue::try_from(l).ok()) {
            headers.insert(header::LOCATION, location);
        }
        response
    }
}

/// The task's part of a service's `GET /tasks/{id}` view, for the people
/// who operate it and the clients that poll it: the id, the status, the
/// attempts used out of the budget and, unless the task completed, its last
/// error. Every service on taskfence shows these the same way; it adds its
/// own fields beside them (`#[serde(flatten)]`), such as the saved result as
/// its own rows hold it.
///
/// Unlike [`TaskBody`] it shows the attempt count and the error text: it is
/// a status view for the task's owner, not a replayed response.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
/// use taskfence_axum::TaskStatus;
///
/// #[derive(serde::Serialize)]
/// struct View {
///     #[serde(flatten)]
///     task: TaskStatus,
///     message_id: String,
/// }
/// let store = MemoryStore::new();
/// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// let view = View { task: TaskStatus::from(&task), message_id: "m1".into() };
/// let json = serde_json::to_value(&view).unwrap();
/// assert_eq!(json["status"], "pending");
/// assert_eq!((json["attempts"].as_u64(), json["max_attempts"].as_u64()), (Some(0), Some(u64::from(task.policy.max_attempts))));
/// assert!(json["error"].is_null());
/// assert_eq!(json["message_id"], "m1");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskStatus {
    /// The task id.
    pub id: String,
    /// `pending`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// Attempts started so far.
    pub attempts: u32,
    /// The task's budget of attempts.
    pub max_attempts: u32,
    /// The last attempt's error, unless the task completed (`null` then).
    pub error: Option<String>,
}

impl TaskStatus {
    /// `true` once the task is failed or cancelled for good: no attempt will
    /// come. (A completed task is settled when the service's result is saved,
    /// which the service knows.)
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore};
    /// let store = MemoryStore::new();
    /// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
    /// assert!(!taskfence_axum::TaskStatus::from(&task).is_given_up());
    /// # Ok(()) }
    /// ```
    pub fn is_given_up(&self) -> bool {
        matches!(self.status.as_str(), "failed" | "cancelled")
    }
}

impl From<&Task> for TaskStatus {
    fn from(task: &Task) -> Self {
        Self {
            id: task.id.to_string(),
            status: task.status.as_str().to_owned(),
            attempts: task.attempts(),
            max_attempts: task.policy.max_attempts,
            error: (task.status != taskfence::Status::Completed)
                .then(|| task.last_error.clone())
                .flatten(),
        }
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
            Some(None) => (
                None,
                task.response.as_ref().map(|r| crate::b64::encode(r.as_bytes())),
            ),
        };
        Self {
            id: task.id.to_string(),
            status: task.status.as_str().to_owned(),
            response,
            response_base64,
        }
    }
}

/// A JSON body as it is (`Content-Type: application/json`), with
/// [`Idempotent-Replayed: true`](crate::IDEMPOTENT_REPLAYED) when `replayed`:
/// the response of a submission whose body the service renders itself (from
/// its own rows, say), first and replayed alike, as [`SubmitResponse`] does.
///
/// ```
/// use http::StatusCode;
/// let first = taskfence_axum::json_response(StatusCode::CREATED, br#"{"id":"1"}"#.to_vec(), false);
/// assert!(first.headers().get("idempotent-replayed").is_none());
/// let again = taskfence_axum::json_response(StatusCode::CREATED, br#"{"id":"1"}"#.to_vec(), true);
/// assert_eq!(again.status(), StatusCode::CREATED);
/// assert_eq!(again.headers()["content-type"], "application/json");
/// assert_eq!(again.headers()["idempotent-replayed"], "true");
/// ```
pub fn json_response(status: StatusCode, body: Vec<u8>, replayed: bool) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// A readiness probe's answer (`GET /healthz`) from the check of what the
/// service needs (`SELECT 1` on its pool, say): 200 `{"status":"ok"}`, or 503
/// `unavailable` with the cause logged (`tracing`, warn level), never sent.
/// No key, no caller: it reveals nothing but that.
///
/// ```
/// use taskfence_axum::{ProblemTypes, health};
/// let types = ProblemTypes::default();
/// assert_eq!(health(Ok::<_, std::io::Error>(()), &types).status(), 200);
/// assert_eq!(health(Err::<(), _>("connection refused"), &types).status(), 503);
/// ```
pub fn health<T, E: std::fmt::Display>(check: Result<T, E>, types: &ProblemTypes) -> Response {
    match check {
        Ok(_) => json_response(StatusCode::OK, br#"{"status":"ok"}"#.to_vec(), false),
        Err(error) => {
            tracing::warn!(%error, "health check: a dependency does not answer");
            types
                .problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "a dependency of the service does not answer",
                )
                .into_response()
        }
    }
}
