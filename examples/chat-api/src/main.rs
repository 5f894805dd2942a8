//! `chat-api [--listen ADDR] [--no-worker | --worker-only]`
//!
//! Environment: `DATABASE_URL` (required), `CHAT_API_TOKENS` as
//! `token=user,token=user` (required unless `--worker-only`), `TASKFENCE_SCHEMA`
//! (default `taskfence`).

use std::collections::HashMap;
use std::process::ExitCode;

use chat_api::{Config, Mode, Service};
use sqlx::postgres::PgPoolOptions;

const USAGE: &str = "usage: chat-api [--listen 127.0.0.1:3000] [--no-worker | --worker-only]";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("chat-api: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let mut listen = "127.0.0.1:3000".to_owned();
    let mut mode = Mode::Both;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or(USAGE)?,
            "--no-worker" if mode == Mode::Both => mode = Mode::ApiOnly,
            "--worker-only" if mode == Mode::Both => mode = Mode::WorkerOnly,
            _ => return Err(USAGE.into()),
        }
    }
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let tokens = parse_tokens(&std::env::var("CHAT_API_TOKENS").unwrap_or_default())?;
    if mode.runs_api() && tokens.is_empty() {
        return Err("CHAT_API_TOKENS is empty: set it to token=user,token=user".into());
    }
    let mut config = Config::new(tokens);
    config.mode = mode;
    if let Ok(schema) = std::env::var("TASKFENCE_SCHEMA") {
        config.taskfence_schema = schema;
    }

    let pool = PgPoolOptions::new()
        .max_connections(32)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
    let listener = match mode.runs_api() {
        true => Some(
            tokio::net::TcpListener::bind(&listen)
                .await
                .map_err(|e| format!("cannot listen on {listen}: {e}"))?,
        ),
        false => None,
    };
    let service = Service::start(pool, config, listener)
        .await
        .map_err(|e| e.to_string())?;
    match service.local_addr() {
        Some(addr) => tracing::info!(%addr, ?mode, "chat-api started"),
        None => tracing::info!(?mode, "chat-api worker started"),
    }
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
    service.shutdown().await;
    Ok(())
}

fn parse_tokens(text: &str) -> Result<HashMap<String, String>, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((token, user)) if !token.trim().is_empty() && !user.trim().is_empty() => {
                Ok((token.trim().to_owned(), user.trim().to_owned()))
            }
            _ => Err(format!("CHAT_API_TOKENS: {pair:?} is not token=user")),
        })
        .collect()
}
