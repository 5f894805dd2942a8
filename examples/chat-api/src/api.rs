//! The HTTP API: routes, authentication, handlers and representations.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Row};
use taskfence::runtime::Wake;
use taskfence::{
    Error, InputHash, NewTask, PgStore, RequestKey, RetryPolicy, Status, Submitted, Task, TaskId, TaskStore,
};
use taskfence_axum::{IdempotencyKey, Problem};
use tokio::sync::{broadcast, watch};
use uuid::Uuid;

use crate::config::Limits;
use crate::problem;
use crate::replies::{ReplyEvent, ReplyEvents};
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
    pub(crate) tokens: Arc<HashMap<String, String>>,
    pub(crate) policy: RetryPolicy,
    pub(crate) key_retention: Duration,
    pub(crate) limits: Arc<Limits>,
    pub(crate) events: ReplyEvents,
    /// Wakes the in-process worker after a commit (wakes nothing without one).
    pub(crate) wake_worker: Wake,
    pub(crate) stop: watch::Receiver<bool>,
}

/// The routes.
pub(crate) fn router(state: AppState) -> Router {
    let body_limit = state.limits.max_body_bytes;
    Router::new()
        .route("/conversations/{conversation_id}/messages", post(send))
        .route("/messages/{message_id}/regenerate", post(regenerate))
        .route("/tasks/{task_id}", get(task))
        .route("/healthz", get(healthz))
        .route_layer(axum::middleware::from_fn(request_span))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Each request in a server span named after its route (`POST
/// /conversations/{conversation_id}/messages`), with the OpenTelemetry HTTP
/// attributes: the span a reply task's trace starts from (see `telemetry`).
async fn request_span(
    route: axum::extract::MatchedPath,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use tracing::Instrument;
    let method = request.method().clone();
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format_args!("{method} {}", route.as_str()),
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    );
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// `GET /healthz`, for a load balancer's or an orchestrator's readiness probe:
/// 200 when PostgreSQL answers, 503 otherwise. No authentication: it reveals
/// nothing but that.
async fn healthz(State(state): State<AppState>) -> Result<Response, Problem> {
    match sqlx::query("SELECT 1").execute(&state.pool).await {
        Ok(_) => Ok(json(StatusCode::OK, br#"{"status":"ok"}"#.to_vec(), false)),
        Err(error) => {
            tracing::warn!(%error, "health check: PostgreSQL does not answer");
            Err(problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database does not answer",
            ))
        }
    }
}

/// The authenticated caller: the scope of every key and task.
#[derive(Debug, Clone)]
pub(crate) struct Caller(String);

impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    AppState: FromRef<S>,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let state = AppState::from_ref(state);
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token);
        match token.and_then(|t| state.tokens.get(t.trim())) {
            Some(user) => Ok(Caller(user.clone())),
            None => Err(problem::unauthenticated()),
        }
    }
}

/// `POST /conversations/{id}/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    content: String,
}

/// What Send and Regenerate return, built by one query from committed rows,
/// so the first response and every replay are byte-identical.
#[derive(Debug, Serialize)]
struct Accepted {
    message: MessageView,
    task: TaskLink,
}

#[derive(Debug, Serialize)]
struct MessageView {
    id: String,
    conversation_id: String,
    content: String,
    created_at: String,
}

#[derive(Debug, Serialize)]
struct TaskLink {
    id: String,
    href: String,
}

/// `GET /tasks/{id}`.
#[derive(Debug, Serialize)]
struct TaskView {
    id: String,
    status: &'static str,
    attempts: u32,
    max_attempts: u32,
    message_id: String,
    reply: Option<ReplyView>,
    error: Option<String>,
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
    check_conversation_id(&conversation_id, &state.limits)?;
    let Json(SendBody { content }) = body.map_err(json_problem)?;
    check_content(&content, &state.limits)?;

    let message_id = Uuid::now_v7();
    let payload = ReplyPayload {
        message_id,
        prompt: content.clone(),
    };
    let new = new_task(
        &state,
        &caller,
        &key,
        InputHash::of(["send", &conversation_id, &content]),
        &payload,
    )?;

    let mut tx = state.pool.begin().await.map_err(problem::internal)?;
    // Concurrent repeats of this key wait here, on the request key's unique
    // index, until the first commits; then they see Existing.
    match state.store.on(&mut tx).submit(new).await {
        Ok(Submitted::Created(task)) => {
            sqlx::query(
                "INSERT INTO messages (id, user_id, conversation_id, content) VALUES ($1, $2, $3, $4)",
            )
            .bind(message_id)
            .bind(&caller.0)
            .bind(&conversation_id)
            .bind(&content)
            .execute(&mut *tx)
            .await
            .map_err(problem::internal)?;
            created(state, tx, &caller, task.id, message_id).await
        }
        Ok(Submitted::Existing(task)) => {
            tx.rollback().await.map_err(problem::internal)?;
            replay(&state, &caller, task.id).await
        }
        Err(error) => Err(submit_problem(error)),
    }
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
    let payload = ReplyPayload { message_id, prompt };
    let input = InputHash::of(["regenerate".as_bytes(), message_id.as_bytes()]);
    let new = new_task(&state, &caller, &key, input, &payload)?;
    match state.store.on(&mut tx).submit(new).await {
        Ok(Submitted::Created(task)) => created(state, tx, &caller, task.id, message_id).await,
        Ok(Submitted::Existing(task)) => {
            tx.rollback().await.map_err(problem::internal)?;
            replay(&state, &caller, task.id).await
        }
        Err(error) => Err(submit_problem(error)),
    }
}

fn new_task(
    state: &AppState,
    caller: &Caller,
    key: &IdempotencyKey,
    input: InputHash,
    payload: &ReplyPayload,
) -> Result<NewTask, Problem> {
    let new = NewTask::new(RequestKey::new(&caller.0, OPERATION, key.as_str()), input)
        .payload(serde_json::to_vec(payload).map_err(problem::internal)?)
        .policy(state.policy)
        .retention(state.key_retention)
        // The worker claims from the store itself: no outbox row to publish.
        .without_handoff();
    new.validate().map_err(|e| submit_problem(e.into()))?;
    Ok(new)
}

/// Links the new task to its message, renders, commits, wakes the worker.
async fn created(
    state: AppState,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    caller: &Caller,
    task_id: TaskId,
    message_id: Uuid,
) -> Result<Response, Problem> {
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
    Ok(json(StatusCode::CREATED, body, false))
}

/// The first response to this key, rebuilt from the committed rows.
async fn replay(state: &AppState, caller: &Caller, task_id: TaskId) -> Result<Response, Problem> {
    let mut conn = state.pool.acquire().await.map_err(problem::internal)?;
    let body = accepted(&mut conn, caller, task_id).await?;
    Ok(json(StatusCode::CREATED, body, true))
}

async fn accepted(conn: &mut PgConnection, caller: &Caller, task_id: TaskId) -> Result<Vec<u8>, Problem> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT m.id, m.conversation_id, m.content, to_char(m.created_at AT TIME ZONE 'UTC', {TS}) AS created_at
         FROM reply_tasks AS rt JOIN messages AS m ON m.id = rt.message_id
         WHERE rt.task_id = $1 AND m.user_id = $2"
    )))
    .bind(task_id.as_uuid())
    .bind(&caller.0)
    .fetch_optional(conn)
    .await
    .map_err(problem::internal)?
    .ok_or_else(|| problem::internal(format!("reply task {task_id} has no message row")))?;
    let body = Accepted {
        message: MessageView {
            id: row.get::<Uuid, _>("id").to_string(),
            conversation_id: row.get("conversation_id"),
            content: row.get("content"),
            created_at: row.get("created_at"),
        },
        task: TaskLink {
            id: task_id.to_string(),
            href: format!("/tasks/{task_id}"),
        },
    };
    serde_json::to_vec(&body).map_err(problem::internal)
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
    let wait = match query.wait.as_deref() {
        None => Duration::ZERO,
        Some(text) => parse_wait(text, state.limits.max_wait)?,
    };
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribe before the first read: a reply committed after the read is heard.
    let mut events = state.events.subscribe();
    let mut stop = state.stop.clone();
    loop {
        let view = read_task(&state, &caller, task_id).await?;
        let settled = view.reply.is_some() || matches!(view.status, "failed" | "cancelled");
        if settled || tokio::time::Instant::now() >= deadline || *stop.borrow() {
            return Ok(json(
                StatusCode::OK,
                serde_json::to_vec(&view).map_err(problem::internal)?,
                false,
            ));
        }
        // Any wake-up only means "read again": the store is the truth.
        tokio::select! {
            () = wait_for(&mut events, task_id) => {}
            () = tokio::time::sleep_until(deadline) => {}
            () = crate::service::stopped(&mut stop) => {}
        }
    }
}

async fn wait_for(events: &mut broadcast::Receiver<ReplyEvent>, task_id: TaskId) {
    loop {
        match events.recv().await {
            Ok(ReplyEvent::Saved(id)) if id == task_id => return,
            Ok(ReplyEvent::Saved(_)) => {}
            // Missed events (lag, reconnect): read the store to be sure.
            Ok(ReplyEvent::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// The task and its reply from one snapshot (REPEATABLE READ), so the status
/// and the reply never disagree. Another user's task is "not found": its
/// existence is not revealed.
async fn read_task(state: &AppState, caller: &Caller, task_id: TaskId) -> Result<TaskView, Problem> {
    let mut tx = state.pool.begin().await.map_err(problem::internal)?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(problem::internal)?;
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
        id: task.id.to_string(),
        status: task.status.as_str(),
        attempts: task.attempts(),
        max_attempts: task.policy.max_attempts,
        message_id: row.get::<Uuid, _>("message_id").to_string(),
        reply,
        error: (task.status != Status::Completed)
            .then_some(task.last_error)
            .flatten(),
    })
}

fn task_not_found() -> Problem {
    problem::new(StatusCode::NOT_FOUND, "not-found", "no such task")
}

/// `30s`, `1500ms` or `30` (seconds), at most `max`.
fn parse_wait(text: &str, max: Duration) -> Result<Duration, Problem> {
    let bad = |detail: String| problem::new(StatusCode::BAD_REQUEST, "invalid-wait", detail);
    let (number, unit) = match text.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1000),
    };
    let ms = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| bad(format!("wait={text:?} is not a duration like 30s or 500ms")))?;
    let wait = Duration::from_millis(ms);
    if wait > max {
        return Err(bad(format!(
            "wait={text} is longer than the limit of {}s",
            max.as_secs()
        )));
    }
    Ok(wait)
}

fn check_conversation_id(id: &str, limits: &Limits) -> Result<(), Problem> {
    let ok = !id.is_empty()
        && id.len() <= limits.max_conversation_id_bytes
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        return Ok(());
    }
    Err(problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-conversation-id",
        format!(
            "a conversation id is 1 to {} bytes of ASCII letters, digits, '-', '_' or '.'",
            limits.max_conversation_id_bytes
        ),
    ))
}

fn check_content(content: &str, limits: &Limits) -> Result<(), Problem> {
    taskfence::limits::check_text("content", content, limits.max_content_bytes)
        .map_err(|e| problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-content", e.to_string()))
}

fn json_problem(rejection: JsonRejection) -> Problem {
    let status = rejection.status();
    let slug = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        _ => "invalid-body",
    };
    problem::new(status, slug, rejection.body_text())
}

/// taskfence-axum's problem for a submission that failed: a key reused with
/// another payload is the IETF draft's 422 `idempotency-key-reused` (nothing
/// was written), invalid input a 400 `invalid-request`, a storage failure a 503
/// `unavailable` (the cause logged, never sent).
fn submit_problem(error: Error) -> Problem {
    problem::TYPES.error(&error)
}

fn json(status: StatusCode, body: Vec<u8>, replayed: bool) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if replayed {
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}
