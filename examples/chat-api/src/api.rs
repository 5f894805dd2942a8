//! The HTTP API: routes, authentication, handlers and representations.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Row};
use taskfence::runtime::{SavedEvents, Stop, Wake};
use taskfence::{InputHash, NewTask, PgStore, RequestKey, Submitted, Task, TaskId, TaskStore};
use taskfence_axum::{IdempotencyKey, Problem, TaskStatus, json_response};
use uuid::Uuid;

use crate::config::{Config, Limits};
// A stand-in for authentication: replace it with yours (see `sim::auth`).
use crate::problem;
use crate::sim::auth::Caller;
use crate::worker::ReplyPayload;

/// The operation of every reply task: one key space for Send and Regenerate,
/// so one Idempotency-Key names one reply task whichever endpoint it was sent to.
pub const OPERATION: &str = "chat.reply";

/// Set on a response that replays the first response to this Idempotency-Key
/// (the status and body are the first response's, byte for byte):
/// `taskfence-axum`'s header, so this API replays as its `SubmitResponse` and
/// `IdempotencyLayer` do — the first status (`201`) and `Idempotent-Replayed: true`.
pub const REPLAYED: HeaderName = HeaderName::from_static(taskfence_axum::IDEMPOTENT_REPLAYED);

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) pool: PgPool,
    pub(crate) store: PgStore,
    pub(crate) config: Arc<Config>,
    pub(crate) events: SavedEvents,
    /// Wakes the in-process worker after a commit (wakes nothing without one).
    pub(crate) wake_worker: Wake,
    pub(crate) stop: Stop,
}

/// The routes.
pub(crate) fn router(state: AppState) -> Router {
    let body_limit = state.config.limits.max_body_bytes;
    Router::new()
        .route("/conversations/{conversation_id}/messages", post(send))
        .route("/messages/{message_id}/regenerate", post(regenerate))
        .route("/tasks/{task_id}", get(task))
        .route("/healthz", get(healthz))
        // The server span each reply task's trace starts from (see `taskfence_axum::telemetry`).
        .route_layer(axum::middleware::from_fn(taskfence_axum::trace::request_span))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `GET /healthz`, for a load balancer's or an orchestrator's readiness probe:
/// 200 when PostgreSQL answers, 503 otherwise. No authentication: it reveals
/// nothing but that.
async fn healthz(State(state): State<AppState>) -> Response {
    taskfence_axum::health(
        sqlx::query("SELECT 1").execute(&state.pool).await,
        &problem::TYPES,
    )
}

/// `POST /conversations/{id}/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    content: String,
}

/// `GET /tasks/{id}`: the task's status (id, status, attempts, error) and the
/// message it answers, with its saved reply.
#[derive(Debug, Serialize)]
struct TaskView {
    #[serde(flatten)]
    task: TaskStatus,
    message_id: String,
    reply: Option<ReplyView>,
}

#[derive(Debug, Serialize)]
struct ReplyView {
    content: String,
    attempt: i32,
    saved_at: String,
}

/// Timestamps as RFC 3339 UTC text, formatted by the database: the same row
/// always renders the same bytes.
const TS: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"#;

/// Saves the user's message and submits its reply task in one transaction.
async fn send(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    Path(conversation_id): Path<String>,
    body: Result<Json<SendBody>, JsonRejection>,
) -> Result<Response, Problem> {
    check_conversation_id(&conversation_id, &state.config.limits)?;
    let Json(SendBody { content }) =
        body.map_err(|e| problem::TYPES.rejected_body(e.status(), e.body_text()))?;
    check_content(&content, &state.config.limits)?;
    let message_id = Uuid::now_v7();
    let input = InputHash::of(["send", &conversation_id, &content]);
    let new = new_task(&state, &caller, &key, input, message_id, &content)?;
    let mut tx = state.pool.begin().await.map_err(problem::internal)?;
    // Rolled back with the transaction when the key turns out to be a repeat.
    sqlx::query("INSERT INTO messages (id, user_id, conversation_id, content) VALUES ($1, $2, $3, $4)")
        .bind(message_id)
        .bind(&caller.0)
        .bind(&conversation_id)
        .bind(&content)
        .execute(&mut *tx)
        .await
        .map_err(problem::internal)?;
    accept(state, tx, &caller, new, message_id).await
}

/// A new reply task for a message the caller owns.
async fn regenerate(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    Path(message_id): Path<String>,
) -> Result<Response, Problem> {
    let not_found = || problem::new(StatusCode::NOT_FOUND, "not-found", "no such message");
    let message_id: Uuid = message_id.parse().map_err(|_| not_found())?;
    let mut tx = state.pool.begin().await.map_err(problem::internal)?;
    let prompt: String = sqlx::query_scalar("SELECT content FROM messages WHERE id = $1 AND user_id = $2")
        .bind(message_id)
        .bind(&caller.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(problem::internal)?
        .ok_or_else(not_found)?;
    let input = InputHash::of(["regenerate".as_bytes(), message_id.as_bytes()]);
    let new = new_task(&state, &caller, &key, input, message_id, &prompt)?;
    accept(state, tx, &caller, new, message_id).await
}

fn new_task(
    state: &AppState,
    caller: &Caller,
    key: &IdempotencyKey,
    input: InputHash,
    message_id: Uuid,
    prompt: &str,
) -> Result<NewTask, Problem> {
    let payload = ReplyPayload {
        message_id,
        prompt: prompt.to_owned(),
    };
    let new = NewTask::new(RequestKey::new(&caller.0, OPERATION, key.as_str()), input)
        .payload(serde_json::to_vec(&payload).map_err(problem::internal)?)
        .policy(state.config.policy)
        .retention(state.config.key_retention)
        // The worker claims from the store itself: no outbox row to publish.
        .without_handoff();
    new.validate().map_err(|e| problem::TYPES.error(&e.into()))?;
    Ok(new)
}

/// Submits the reply task in `tx`. A new task is linked to its message and
/// committed, and the worker woken; a repeat is rolled back and answered with
/// the first response, rebuilt from the committed rows.
async fn accept(
    state: AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    caller: &Caller,
    new: NewTask,
    message_id: Uuid,
) -> Result<Response, Problem> {
    // Concurrent repeats of this key wait here, on the request key's unique
    // index, until the first commits; then they see Existing.
    let task_id = match state
        .store
        .on(&mut tx)
        .submit(new)
        .await
        .map_err(|e| problem::TYPES.error(&e))?
    {
        Submitted::Created(task) => task.id,
        Submitted::Existing(task) => {
            tx.rollback().await.map_err(problem::internal)?;
            let mut conn = state.pool.acquire().await.map_err(problem::internal)?;
            let body = accepted(&mut conn, caller, task.id).await?;
            return Ok(json_response(StatusCode::CREATED, body, true));
        }
    };
    sqlx::query("INSERT INTO reply_tasks (task_id, message_id) VALUES ($1, $2)")
        .bind(task_id.as_uuid())
        .bind(message_id)
        .execute(&mut *tx)
        .await
        .map_err(problem::internal)?;
    let body = accepted(&mut tx, caller, task_id).await?;
    tx.commit().await.map_err(problem::internal)?;
    // After the commit: woken earlier, the worker would not see the task yet.
    state.wake_worker.wake();
    Ok(json_response(StatusCode::CREATED, body, false))
}

/// What Send and Regenerate answer, rendered by the database from the
/// committed rows, so the first response and every replay are the same bytes.
async fn accepted(conn: &mut PgConnection, caller: &Caller, task_id: TaskId) -> Result<Vec<u8>, Problem> {
    let body: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT jsonb_build_object(
             'message', jsonb_build_object('id', m.id, 'conversation_id', m.conversation_id, 'content', m.content,
                                           'created_at', to_char(m.created_at AT TIME ZONE 'UTC', {TS})),
             'task', jsonb_build_object('id', rt.task_id, 'href', '/tasks/' || rt.task_id::text))::text
         FROM reply_tasks AS rt JOIN messages AS m ON m.id = rt.message_id
         WHERE rt.task_id = $1 AND m.user_id = $2"
    )))
    .bind(task_id.as_uuid())
    .bind(&caller.0)
    .fetch_optional(conn)
    .await
    .map_err(problem::internal)?;
    body.map(String::into_bytes)
        .ok_or_else(|| problem::internal(format!("reply task {task_id} has no message row")))
}

/// `?wait=` of `GET /tasks/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskQuery {
    wait: Option<String>,
}

/// The task's status and saved reply; with `?wait=`, long-polls until the task
/// is settled (reply saved, failed or cancelled) or the wait ends.
async fn task(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    query: Result<Query<TaskQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let task_id: TaskId = task_id.parse().map_err(|_| task_not_found())?;
    let Query(query) =
        query.map_err(|e| problem::new(StatusCode::BAD_REQUEST, "invalid-query", e.body_text()))?;
    let wait = problem::TYPES.wait(query.wait.as_deref(), state.config.limits.max_wait)?;
    let read = || read_task(&state, &caller, task_id);
    let settled = |view: &TaskView| view.reply.is_some() || view.task.is_given_up();
    let view = state
        .events
        .wait_for(task_id, wait, &state.stop, read, settled)
        .await?;
    Ok(Json(view).into_response())
}

/// The task and its reply from one snapshot (REPEATABLE READ), so the status
/// and the reply never disagree. Another user's task is "not found": its
/// existence is not revealed.
async fn read_task(state: &AppState, caller: &Caller, task_id: TaskId) -> Result<TaskView, Problem> {
    let snapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
    let mut tx = state.pool.begin_with(snapshot).await.map_err(problem::internal)?;
    let task: Task = state
        .store
        .on(&mut tx)
        .get(task_id)
        .await
        .map_err(problem::internal)?
        .filter(|t| t.key.scope == caller.0 && t.key.operation == OPERATION)
        .ok_or_else(task_not_found)?;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT rt.message_id, r.content, r.attempt,
                to_char(r.saved_at AT TIME ZONE 'UTC', {TS}) AS saved_at
         FROM reply_tasks AS rt LEFT JOIN replies AS r ON r.task_id = rt.task_id
         WHERE rt.task_id = $1"
    )))
    .bind(task_id.as_uuid())
    .fetch_optional(&mut *tx)
    .await
    .map_err(problem::internal)?
    .ok_or_else(task_not_found)?;
    tx.commit().await.map_err(problem::internal)?;
    let reply = row.get::<Option<String>, _>("content").map(|content| ReplyView {
        content,
        attempt: row.get("attempt"),
        saved_at: row.get("saved_at"),
    });
    Ok(TaskView {
        task: TaskStatus::from(&task),
        message_id: row.get::<Uuid, _>("message_id").to_string(),
        reply,
    })
}

fn task_not_found() -> Problem {
    problem::new(StatusCode::NOT_FOUND, "not-found", "no such task")
}

/// 1 to `max_conversation_id_bytes` of ASCII letters, digits, `-`, `_` or `.`.
fn check_conversation_id(id: &str, limits: &Limits) -> Result<(), Problem> {
    let max = limits.max_conversation_id_bytes;
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if !id.is_empty() && id.len() <= max && id.bytes().all(allowed) {
        return Ok(());
    }
    let detail = format!("a conversation id is 1 to {max} bytes of ASCII letters, digits, '-', '_' or '.'");
    Err(problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-conversation-id",
        detail,
    ))
}

fn check_content(content: &str, limits: &Limits) -> Result<(), Problem> {
    taskfence::limits::check_text("content", content, limits.max_content_bytes)
        .map_err(|e| problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-content", e.to_string()))
}
