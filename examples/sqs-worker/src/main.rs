//! Runs the whole template against an SQS endpoint: submits tasks, publishes
//! every handoff twice, drains the queue with a fleet of workers, prints what
//! happened.
//!
//! ```sh
//! moto_server -H 127.0.0.1 -p 5000 &
//! TASKFENCE_SQS_ENDPOINT=http://127.0.0.1:5000 DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run -p sqs-worker
//! ```
//!
//! Environment: `DATABASE_URL` (required), `TASKFENCE_SQS_ENDPOINT` (unset:
//! real AWS, region from `AWS_REGION`), `TASKS` (default 50), `WORKERS` (default 4).
//! The tables go to the `taskfence` schema (created by the embedded migrations).

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqs_worker::provider::SimulatedConfig;
use sqs_worker::scenario::{self, Scenario};
use sqs_worker::{BoxError, SqsQueue, SqsSettings};
use taskfence::PgStore;

fn env_number(name: &str, default: usize) -> Result<usize, BoxError> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v}: {e}"))?),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let settings = match std::env::var("TASKFENCE_SQS_ENDPOINT") {
        Ok(endpoint) => SqsSettings::local(endpoint),
        Err(_) => SqsSettings {
            endpoint: None,
            region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
            access_key: std::env::var("AWS_ACCESS_KEY_ID")?,
            secret_key: std::env::var("AWS_SECRET_ACCESS_KEY")?,
        },
    };
    let scenario = Scenario {
        tasks: env_number("TASKS", 50)?,
        workers: env_number("WORKERS", 4)?,
        provider: SimulatedConfig {
            min_latency: Duration::from_millis(2500),
            max_latency: Duration::from_millis(3500),
            transient_rate: 0.1,
            crash_after_answer_rate: 0.03,
            ..SimulatedConfig::default()
        },
        ..Scenario::default()
    };
    let queue_name = format!("taskfence-demo-{}", uuid::Uuid::now_v7());
    let queue = SqsQueue::create(settings.client(), &queue_name, scenario.queue_visibility).await?;
    let pool = PgPoolOptions::new()
        .max_connections(30)
        .test_before_acquire(false) // one round trip per store operation
        .connect(&std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is required")?)
        .await?;
    let store = PgStore::new(pool);
    store.migrate().await?;
    let (report, _llm) = scenario::run(&scenario, store, queue.clone()).await?;
    println!("{report}");
    queue.delete_queue().await?;
    Ok(())
}
