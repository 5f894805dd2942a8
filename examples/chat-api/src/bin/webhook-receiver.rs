//! `webhook-receiver`: scaffolding, not for copying — a local receiver of the
//! "reply ready" notifications to point `--webhook-url` at when running the
//! service by hand (`chat_api::sim::webhook`). It logs each delivery and
//! serves its counts at `GET /stats`.
//!
//! ```sh
//! cargo run -p chat-api --bin webhook-receiver -- --listen 127.0.0.1:3001
//! CHAT_API_WEBHOOK_URL=http://127.0.0.1:3001/reply-ready cargo run -p chat-api
//! curl -s localhost:3001/stats    # {"requests":…,"effects":…,"honours_keys":true}
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use chat_api::sim::webhook::{self, Keys, Receiver};
use clap::Parser;

/// A local webhook receiver that counts deliveries and honours `Idempotency-Key`.
#[derive(Debug, Parser)]
#[command(name = "webhook-receiver", version)]
struct Args {
    /// Where to listen; notifications are POSTed to `/reply-ready`.
    #[arg(long, env = "WEBHOOK_RECEIVER_LISTEN", default_value = "127.0.0.1:3001")]
    listen: SocketAddr,
    /// Apply every request, repeated keys included (a receiver without
    /// idempotency keys).
    #[arg(long)]
    ignore_keys: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Logs to stderr, filtered by RUST_LOG (default info); no traces.
    let _telemetry = taskfence_axum::telemetry::init("webhook-receiver", None);
    // It reads no `TASKFENCE_*` variable: one set is a mistake, reported.
    if let Some(unknown) = taskfence::config::unknown_env(&[]) {
        tracing::warn!("{unknown}");
    }
    let keys = match args.ignore_keys {
        true => Keys::Ignore,
        false => Keys::Honour,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("webhook-receiver: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(addr = %args.listen, path = webhook::PATH, ?keys, "webhook receiver started");
    let app = webhook::router(Receiver::new(keys));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("webhook-receiver: {error}");
            ExitCode::FAILURE
        }
    }
}
