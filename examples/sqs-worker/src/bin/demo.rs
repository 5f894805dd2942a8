//! The simulated scenario (scaffolding, not the service): submits tasks,
//! publishes every handoff twice, drains a fresh queue with a fleet of
//! in-process workers fed by the simulated LLM, prints what happened.
//!
//! ```sh
//! moto_server -H 127.0.0.1 -p 5000 &
//! TASKFENCE_SQS_ENDPOINT=http://127.0.0.1:5000 DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run -p sqs-worker --bin sqs-worker-demo
//! ```
//!
//! Environment: `DATABASE_URL` (required), `TASKFENCE_SQS_ENDPOINT` (a local
//! endpoint with dummy credentials; unset: the standard AWS configuration),
//! `TASKS` (default 50), `WORKERS` (default 4). The tables go to the
//! `taskfence` schema (created by the embedded migrations).

use std::time::Duration;

use sqs_worker::sim::SimulatedConfig;
use sqs_worker::sim::scenario::{self, Scenario, StoreChoice};
use sqs_worker::{BoxError, SqsQueue, aws, sim};

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
    if let Some(unknown) = taskfence::config::unknown_env(&["TASKFENCE_SQS_ENDPOINT"]) {
        tracing::warn!("{unknown}");
    }
    let client = match std::env::var("TASKFENCE_SQS_ENDPOINT") {
        Ok(endpoint) => sim::local_sqs_client(&endpoint).await,
        Err(_) => aws_sdk_sqs::Client::new(&aws::aws_config().await),
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
    let queue = SqsQueue::create(client, &queue_name, scenario.queue_visibility).await?;
    let database_url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is required")?;
    let store = taskfence::config::connect_postgres(&database_url, "taskfence", 30, "sqs-worker").await?;
    store.migrate().await?;
    let (report, _llm) = scenario::run(&scenario, StoreChoice::Postgres(store), queue.clone()).await?;
    println!("{report}");
    queue.delete_queue().await?;
    Ok(())
}
