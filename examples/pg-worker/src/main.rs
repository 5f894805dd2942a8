//! The smallest taskfence service: PostgreSQL is the queue, no broker. An
//! HTTP handler submits a task (one row, deduplicated on the caller's
//! `Idempotency-Key`); the consumer in the same process runs it at once and
//! saves one response; SIGTERM stops it cleanly (running work finishes
//! within the grace, the rest is released for another process). With
//! `--sqlite PATH` the queue is a SQLite file instead (created if missing):
//! no server at all.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p pg-worker
//! cargo run -p pg-worker -- --sqlite tasks.db
//! # LISTEN (127.0.0.1:3000), WORK_MS (100: the pretend work), LEASE_SECS (30)
//! curl -s -XPOST localhost:3000/greetings -H 'Idempotency-Key: k1' -d '{"name":"Ada"}' -H 'content-type: application/json'
//! curl -s localhost:3000/greetings/<id>
//! ```

use std::{sync::Arc, time::Duration};

use axum::extract::{Json, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use taskfence::runtime::{ConsumerConfig, StoreQueue, WorkContext};
use taskfence::{
    Error, Failure, InputHash, NewTask, PgStore, RequestKey, Response, SqliteStore, TaskId, TaskStore,
};

const OPERATION: &str = "greet";

#[derive(serde::Deserialize)]
struct Greeting {
    name: String,
}

type Reply = (StatusCode, Json<serde_json::Value>);

fn reply(code: StatusCode, body: serde_json::Value) -> Reply {
    (code, Json(body))
}

fn error(code: StatusCode, message: impl ToString) -> Reply {
    reply(code, serde_json::json!({ "error": message.to_string() }))
}

/// POST /greetings: the task for this key, new or the one submitted before.
async fn submit(
    State(store): State<Arc<dyn TaskStore>>,
    headers: HeaderMap,
    Json(body): Json<Greeting>,
) -> Reply {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return error(StatusCode::BAD_REQUEST, "Idempotency-Key required");
    };
    // The key names the request; the input hash says what it asked for, so
    // the same key with another name is refused rather than answered wrongly.
    let input = InputHash::of([body.name.as_bytes()]);
    let task = NewTask::new(RequestKey::new("demo", OPERATION, key), input).payload(body.name);
    match store.submit(task.without_handoff()).await {
        Ok(submitted) => reply(
            StatusCode::ACCEPTED,
            serde_json::json!({ "id": submitted.task().id.to_string() }),
        ),
        Err(e @ (Error::KeyConflict { .. } | Error::InvalidInput(_))) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, e)
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// GET /greetings/{id}: where the task is, and its saved response.
async fn status(State(store): State<Arc<dyn TaskStore>>, Path(id): Path<String>) -> Reply {
    let Ok(id) = id.parse::<TaskId>() else {
        return error(StatusCode::BAD_REQUEST, "not a task id");
    };
    match store.get(id).await {
        Ok(Some(task)) => reply(
            StatusCode::OK,
            serde_json::json!({
                "status": task.status.as_str(),
                "attempts": task.attempts(),
                "response": task.response.as_ref().and_then(Response::as_str),
            }),
        ),
        Ok(None) => error(StatusCode::NOT_FOUND, "no such task"),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// The work: what a real service would do with a provider, here a pause.
async fn greet(ctx: WorkContext, work: Duration) -> Result<Response, Failure> {
    let name =
        std::str::from_utf8(&ctx.task().payload).map_err(|_| Failure::permanent("name is not UTF-8"))?;
    tokio::time::sleep(work).await;
    Ok(Response::from(format!("Hello, {name}!")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    // It reads no `TASKFENCE_*` variable: one set is a mistake, reported.
    if let Some(unknown) = taskfence::config::unknown_env(&[]) {
        eprintln!("pg-worker: warning: {unknown}");
    }
    let work = Duration::from_millis(env("WORK_MS", "100").parse()?);
    let lease = Duration::from_secs(env("LEASE_SECS", "30").parse()?);
    // `--sqlite PATH`: the queue in a file; otherwise PostgreSQL at DATABASE_URL.
    let store: Arc<dyn TaskStore> = match std::env::args().skip_while(|a| a != "--sqlite").nth(1) {
        Some(path) => {
            let store = SqliteStore::open(path).await?;
            store.migrate().await?;
            Arc::new(store)
        }
        None => {
            let url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres");
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(8)
                .connect(&url)
                .await?;
            let store = PgStore::new(pool);
            store.migrate().await?;
            Arc::new(store)
        }
    };

    let queue = StoreQueue::new(store).operation(OPERATION);
    // Submissions through the queue's submitter wake this consumer at once.
    let submitter = queue.submitter();
    let worker = format!("pg-worker-{}", std::process::id());
    let consumer = queue.consumer(ConsumerConfig::new(worker, lease).concurrency(16))?;
    // First SIGTERM: drain (and stop serving); a second: release what still runs, at once.
    let stop = consumer.stop().clone();
    tokio::spawn(stop.clone().on_signals());

    let app = axum::Router::new()
        .route("/greetings", post(submit))
        .route("/greetings/{id}", get(status))
        .with_state(submitter);
    let listener = tokio::net::TcpListener::bind(env("LISTEN", "127.0.0.1:3000")).await?;
    println!("listening on {}", listener.local_addr()?);
    let serving = axum::serve(listener, app).with_graceful_shutdown(async move { stop.requested().await });
    let server = tokio::spawn(async move { serving.await });

    let stopped = consumer.run(move |ctx| greet(ctx, work)).await?;
    server.await??;
    println!(
        "stopped: {} completed, {} released",
        stopped.completed, stopped.released
    );
    Ok(())
}
