//! `chat-api`: the API and/or the reply worker as a service.
//!
//! Every option is a flag and an environment variable (`chat-api --help`):
//! `DATABASE_URL` (required), `CHAT_API_TOKENS` as `token=user,token=user`
//! (required unless `--mode worker`), `TASKFENCE_LISTEN`, `CHAT_API_MODE`,
//! `TASKFENCE_SCHEMA`, `CHAT_API_SCHEMA`, `CHAT_API_WEBHOOK_URL` (the "reply
//! ready" notifications, off when unset), … Logs go to stderr, filtered by
//! `RUST_LOG` (default `info`); traces go to `OTEL_EXPORTER_OTLP_ENDPOINT`
//! when it is set (`taskfence_axum::telemetry`). Stops gracefully on SIGTERM or Ctrl-C; a
//! second one releases the replies still in flight at once.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chat_api::{Service, Settings};
use clap::{CommandFactory, Parser};

#[tokio::main]
async fn main() -> ExitCode {
    let settings = Settings::parse();
    let endpoint = settings.otlp_endpoint.clone();
    // A `TASKFENCE_*` variable no option reads is reported, not silently ignored.
    let warnings = taskfence::config::startup_warnings(&Settings::command(), &[]);
    // Logs (and traces), then `run`; its error is logged, the last spans sent.
    taskfence_axum::telemetry::run("chat-api", endpoint.as_deref(), warnings, run(settings)).await
}

async fn run(settings: Settings) -> Result<(), String> {
    settings.validate()?;
    let config = settings.service;
    // TLS as `DATABASE_URL`'s `sslmode` says; with `--app-schema`, the schema
    // created if missing and first in every connection's `search_path`, so
    // the app's unqualified SQL always means it. On failure: "DATABASE_URL:
    // …" or "connecting to PostgreSQL: …".
    let schema = settings.app_schema.as_deref();
    let pool = taskfence::config::connect_pool(
        &settings.database_url,
        schema,
        settings.max_connections,
        "chat-api",
    )
    .await
    .map_err(|e| e.to_string())?;
    // The simulated provider: replace it with your model provider's client.
    let provider = Arc::new(chat_api::sim::SimulatedLlm::new(Duration::from_millis(50)));
    let mode = config.mode;
    let service = Service::start(pool, config, provider)
        .await
        .map_err(|e| e.to_string())?;
    match service.local_addr() {
        Some(addr) => tracing::info!(%addr, ?mode, "chat-api started"),
        None => tracing::info!(?mode, "chat-api worker started"),
    }
    // The first SIGTERM (or Ctrl-C) drains, a second releases at once.
    let stop = service.stop();
    tokio::spawn(stop.clone().on_signals());
    stop.requested().await;
    tracing::info!("shutting down");
    service.shutdown().await;
    Ok(())
}
