//! The HTTP API: routes, authentication, handlers and representations.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool};
use taskfence::limits::{check_name, check_text};
use taskfence::runtime::{SavedEvents, Stop, Wake};
use taskfence::{InputHash, NewTask, PgStore, RequestKey, Submitted, Task, TaskId, TaskStore};
use taskfence_axum::{IdempotencyKey, Problem, ProblemTypes, TaskStatus, json_response};
use uuid::Uuid;

use crate::config::Config;
// A stand-in for authentication: replace it with yours (see `sim::auth`).
use crate::sim::auth::Caller;
use crate::worker::ReplyPayload;

/// The operation of every reply task: one key space for Send and Regenerate,
/// so one Idempotency-Key names one reply task whichever endpoint it was sent to.
pub const OPERATION: &str = "chat.reply";

/// The taskfence rate bucket every reply task takes a token from: the model
/// provider's rate (`--provider-rpm`), shared by every worker.
pub const PROVIDER_BUCKET: &str = "chat-provider";

/// Set on a response that replays the first response to this Idempotency-Key
/// (the status and body are the first response's, byte for byte):
/// `taskfence-axum`'s header, so this API replays as its `SubmitResponse` and
/// `IdempotencyLayer` do — the first status (`201`) and `Idempotent-Replayed: true`.
pub const REPLAYED: HeaderName = HeaderName::from_static(taskfence_axum::IDEMPOTENT_REPLAYED);

/// The API's problem types, `/problems/{slug}`, where their documentation
/// would be. Every error response is a [`Problem`] (RFC 9457
/// `application/problem+json`); `taskfence-axum`'s own (`idempotency-key-missing`,
/// `idempotency-key-malformed`, `idempotency-key-reused`, `invalid-request`,
/// `unavailable`) use the same base. Clients branch on the type, never on the detail.
///
/// ```
/// use axum::http::StatusCode;
/// let p = chat_api::PROBLEMS.problem(StatusCode::NOT_FOUND, "not-found", "no such task");
/// assert_eq!((p.problem_type(), p.title()), ("/problems/not-found", "Not Found"));
/// ```
pub const PROBLEMS: ProblemTypes = ProblemTypes::new("/problems/");

/// 500 for a failure of the app's own queries. The detail stays generic (the
/// cause is logged): nothing may be assumed written, and the client retries
/// with the same Idempotency-Key.
fn internal(err: impl std::fmt::Display) -> Problem {
    PROBLEMS.internal(err)
}

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
    taskfence_axum::health(sqlx::query("SELECT 1").execute(&state.pool).await, &PROBLEMS)
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
    message_id: Uuid,
    reply: Option<ReplyView>,
}

#[derive(Debug, Serialize, Deserialize)]
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
    Path(conversation): Path<String>,
    body: Result<Json<SendBody>, JsonRejection>,
) -> Result<Response, Problem> {
    let max = &state.config.limits;
    // 1 to `max_conversation_id_bytes` of ASCII letters, digits, `-`, `_` or `.`.
    check_name("conversation_id", &conversation, max.max_conversation_id_bytes)
        .map_err(|e| PROBLEMS.problem(StatusCode::BAD_REQUEST, "invalid-conversation-id", e.to_string()))?;
    let Json(SendBody { content: prompt }) =
        body.map_err(|e| PROBLEMS.rejected_body(e.status(), e.body_text()))?;
    check_text("content", &prompt, max.max_content_bytes)
        .map_err(|e| PROBLEMS.problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid-content", e.to_string()))?;
    let message_id = Uuid::now_v7();
    let input = InputHash::of(["send", &conversation, &prompt]);
    let mut tx = state.pool.begin().await.map_err(internal)?;
    // Rolled back with the transaction when the key turns out to be a repeat
    // or the task invalid.
    sqlx::query("INSERT INTO messages (id, user_id, conversation_id, content) VALUES ($1, $2, $3, $4)")
        .bind(message_id)
        .bind(&caller.0)
        .bind(&conversation)
        .bind(&prompt)
        .execute(&mut *tx)
        .await
        .map_err(internal)?;
    let payload = ReplyPayload { message_id, prompt };
    accept(state, tx, &caller, &key, &conversation, input, payload).await
}

/// A new reply task for a message the caller owns.
async fn regenerate(
    State(state): State<AppState>,
    caller: Caller,
    key: IdempotencyKey,
    Path(message_id): Path<String>,
) -> Result<Response, Problem> {
    let not_found = || PROBLEMS.problem(StatusCode::NOT_FOUND, "not-found", "no such message");
    let message_id: Uuid = message_id.parse().map_err(|_| not_found())?;
    let mut tx = state.pool.begin().await.map_err(internal)?;
    let query = "SELECT content, conversation_id FROM messages WHERE id = $1 AND user_id = $2";
    let (prompt, conversation): (String, String) = sqlx::query_as(query)
        .bind(message_id)
        .bind(&caller.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(internal)?
        .ok_or_else(not_found)?;
    let input = InputHash::of(["regenerate".as_bytes(), message_id.as_bytes()]);
    let payload = ReplyPayload { message_id, prompt };
    accept(state, tx, &caller, &key, &conversation, input, payload).await
}

/// Submits the reply task in `tx`. A new task is linked to its message and
/// committed, and the worker woken; a repeat is rolled back and answered with
/// the first response, rebuilt from the committed rows; an invalid one is
/// rolled back and refused.
///
/// One conversation's replies run one at a time, in the order their
/// messages were sent (a concurrency key of limit 1, `{user}/{conversation}`:
/// a conversation id too long for a key is refused, nothing written); every
/// reply takes a token of the provider's rate.
async fn accept(
    state: AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    caller: &Caller,
    key: &IdempotencyKey,
    conversation: &str,
    input: InputHash,
    payload: ReplyPayload,
) -> Result<Response, Problem> {
    let new = NewTask::new(RequestKey::new(&caller.0, OPERATION, key.as_str()), input)
        .in_order(format!("{}/{conversation}", caller.0))
        .rate_bucket(PROVIDER_BUCKET)
        .payload(serde_json::to_vec(&payload).map_err(internal)?)
        .policy(state.config.policy)
        .retention(state.config.key_retention)
        // The worker claims from the store itself: no outbox row to publish.
        .without_handoff();
    // Concurrent repeats of this key wait here, on the request key's unique
    // index, until the first commits; then they see Existing.
    let submitted = state.store.on(&mut tx).submit(new).await;
    let task_id = match submitted.map_err(|e| PROBLEMS.error(&e))? {
        Submitted::Created(task) => task.id,
        Submitted::Existing(task) => {
            tx.rollback().await.map_err(internal)?;
            let body = accepted(&state.pool, caller, task.id).await?;
            return Ok(json_response(StatusCode::CREATED, body, true));
        }
    };
    sqlx::query("INSERT INTO reply_tasks (task_id, message_id) VALUES ($1, $2)")
        .bind(task_id.as_uuid())
        .bind(payload.message_id)
        .execute(&mut *tx)
        .await
        .map_err(internal)?;
    let body = accepted(&mut *tx, caller, task_id).await?;
    tx.commit().await.map_err(internal)?;
    // After the commit: woken earlier, the worker would not see the task yet.
    state.wake_worker.wake();
    Ok(json_response(StatusCode::CREATED, body, false))
}

/// What Send and Regenerate answer, rendered by the database from the
/// committed rows, so the first response and every replay are the same bytes.
async fn accepted(db: impl PgExecutor<'_>, caller: &Caller, task_id: TaskId) -> Result<Vec<u8>, Problem> {
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
    .fetch_optional(db)
    .await
    .map_err(internal)?;
    body.map(String::into_bytes)
        .ok_or_else(|| internal(format!("reply task {task_id} has no message row")))
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
        query.map_err(|e| PROBLEMS.problem(StatusCode::BAD_REQUEST, "invalid-query", e.body_text()))?;
    let wait = PROBLEMS.wait(query.wait.as_deref(), state.config.limits.max_wait)?;
    let read = || read_task(&state, &caller, task_id);
    let settled = |view: &TaskView| view.reply.is_some() || view.task.is_given_up();
    let (events, stop) = (&state.events, &state.stop);
    Ok(Json(events.wait_for(task_id, wait, stop, read, settled).await?).into_response())
}

/// The task and its reply from one snapshot (REPEATABLE READ), so the status
/// and the reply never disagree. Another user's task is "not found": its
/// existence is not revealed.
async fn read_task(state: &AppState, caller: &Caller, task_id: TaskId) -> Result<TaskView, Problem> {
    let snapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
    let mut tx = state.pool.begin_with(snapshot).await.map_err(internal)?;
    let task: Task = state
        .store
        .on(&mut tx)
        .get(task_id)
        .await
        .map_err(internal)?
        .filter(|t| t.key.scope == caller.0 && t.key.operation == OPERATION)
        .ok_or_else(task_not_found)?;
    let (message_id, reply): (Uuid, Option<sqlx::types::Json<ReplyView>>) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT rt.message_id, (SELECT jsonb_build_object('content', r.content, 'attempt', r.attempt,
                                        'saved_at', to_char(r.saved_at AT TIME ZONE 'UTC', {TS}))
                                    FROM replies AS r WHERE r.task_id = rt.task_id)
             FROM reply_tasks AS rt WHERE rt.task_id = $1"
        )))
        .bind(task_id.as_uuid())
        .fetch_optional(&mut *tx)
        .await
        .map_err(internal)?
        .ok_or_else(task_not_found)?;
    tx.commit().await.map_err(internal)?;
    let task = TaskStatus::from(&task);
    Ok(TaskView {
        task,
        message_id,
        reply: reply.map(|r| r.0),
    })
}

fn task_not_found() -> Problem {
    PROBLEMS.problem(StatusCode::NOT_FOUND, "not-found", "no such task")
}
