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
    let telemetry = match taskfence_axum::telemetry::init("chat-api", settings.otlp_endpoint.as_deref()) {
        Ok(telemetry) => telemetry,
        Err(message) => {
            eprintln!("chat-api: {message}");
            return ExitCode::FAILURE;
        }
    };
    // A `TASKFENCE_*` variable no option reads is reported, not silently ignored.
    for warning in taskfence::config::startup_warnings(&Settings::command(), &[]) {
        tracing::warn!("{warning}");
    }
    let code = match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    };
    // The exporter sends from its own thread: off the runtime's.
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .ok();
    code
}

async fn run(settings: Settings) -> Result<(), String> {
    settings.validate()?;
    let config = settings.config();
    // "DATABASE_URL: …" or "connecting to PostgreSQL: …".
    let pool = settings.connect().await.map_err(|e| e.to_string())?;
    let listener = match config.mode.runs_api() {
        true => Some(
            tokio::net::TcpListener::bind(settings.listen)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?,
        ),
        false => None,
    };
    // The simulated provider: replace it with your model provider's client.
    let provider = Arc::new(chat_api::sim::SimulatedLlm::new(Duration::from_millis(50)));
    let mode = config.mode;
    let service = Service::start(pool, config, listener, provider)
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
