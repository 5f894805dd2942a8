//! The worker service: consumes the SQS queue it is given until SIGTERM or
//! SIGINT, then stops receiving, lets the messages in hand finish within
//! `--shutdown-grace`, releases the tasks still running (their messages
//! become visible again) and exits 0, within `--shutdown-grace` +
//! `--release-deadline`. A second signal releases at once.
//!
//! ```sh
//! DATABASE_URL=postgres://… TASKFENCE_SQS_QUEUE_URL=https://sqs.…/queue \
//!     sqs-worker --provider-url https://api.example.com/v1/generate
//! # all AWS: tasks and handoffs in a DynamoDB table
//! TASKFENCE_STORE=dynamodb TASKFENCE_DYNAMODB_TABLE=taskfence TASKFENCE_SQS_QUEUE_URL=… \
//!     sqs-worker --provider-url https://api.example.com/v1/generate
//! sqs-worker --help     # every option and its environment variable
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqs_worker::config::{ProviderKind, Settings, StoreKind};
use sqs_worker::sim::{SimulatedConfig, SimulatedLlm};
use sqs_worker::{
    BoxError, Dispatcher, HttpProvider, Provider, SqsQueue, SqsWorker, aws, dynamo, store, work,
};
use taskfence::intercept::Intercepted;
use taskfence::metrics::{OPERATION_DURATION_SECONDS, Recorder};
use taskfence::runtime::Stop;
use taskfence::{DynamoStore, TaskStore};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// Latency as a histogram with buckets (seconds), which sum across replicas (a summary's quantiles do not).
#[rustfmt::skip]
const LATENCY_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[tokio::main]
async fn main() -> ExitCode {
    let settings = Settings::load();
    let filter = match EnvFilter::try_new(&settings.log) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("invalid log filter {:?}: {error}", settings.log);
            return ExitCode::from(2);
        }
    };
    // One line shape inside and outside the work (see `logs`).
    taskfence::logs::init(filter);
    // Former names still work until 0.3; a variable no option reads is
    // reported, not silently ignored.
    for renamed in settings.deprecations() {
        tracing::warn!("{renamed}");
    }
    if let Some(unknown) = Settings::unknown_env() {
        tracing::warn!("{unknown}");
    }
    match serve(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "sqs-worker stopped on an error");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> Result<(), BoxError> {
    // Listen before anything slow, so a signal during start-up is not lost:
    // the first signal drains within the grace, a second releases at once.
    let stop = Stop::new();
    tokio::spawn(stop.clone().on_signals());
    let provider: Arc<dyn Provider> = match settings.provider {
        ProviderKind::Http => {
            let url = settings
                .provider_url
                .clone()
                .ok_or("--provider http needs --provider-url")?;
            Arc::new(HttpProvider::connect(url)?)
        }
        // Local runs and tests; delete this arm (and `sim`) in your copy.
        ProviderKind::Simulated => Arc::new(SimulatedLlm::new(SimulatedConfig {
            min_latency: settings.sim_min_latency,
            max_latency: settings.sim_max_latency.max(settings.sim_min_latency),
            transient_rate: settings.sim_transient_rate,
            ..SimulatedConfig::default()
        })),
    };
    if let Some(addr) = settings.metrics_addr {
        let latency = Matcher::Full(OPERATION_DURATION_SECONDS.to_owned());
        PrometheusBuilder::new()
            .set_buckets_for_metric(latency, &LATENCY_BUCKETS)?
            .with_http_listener(addr)
            .install()
            .map_err(|e| format!("metrics endpoint on {addr}: {e}"))?;
        taskfence::metrics::describe();
    }
    // One AWS configuration for every AWS client.
    let aws = aws::aws_config().await;
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(&aws), &settings.queue_url);
    // Fail at start-up, not on the first message, when credentials, region or queue URL are wrong.
    let checked = queue.depth().await;
    checked.map_err(|e| format!("queue {}: {e}", settings.queue_url))?;
    // Clap made sure the chosen store's URL or table is there.
    let (store, outbox): (Arc<dyn TaskStore>, Dispatcher) = match settings.store {
        StoreKind::Postgres => {
            let url = settings.database_url.as_deref().unwrap_or_default();
            let pg = store::connect(url, &settings.schema, settings.db_max_connections).await?;
            if !settings.skip_migrations {
                pg.migrate().await?; // idempotent, serialized by an advisory lock
            }
            let outbox = Dispatcher::new(pg.clone(), queue.clone(), settings.dispatch_batch);
            (Arc::new(pg), outbox)
        }
        StoreKind::Dynamodb => {
            let table = settings.dynamodb_table.as_deref().unwrap_or_default();
            let client = aws_sdk_dynamodb::Client::new(&aws);
            dynamo::check_table(&client, table).await?;
            let store = DynamoStore::new(client, table)?;
            let outbox = Dispatcher::new(store.clone(), queue.clone(), settings.dispatch_batch);
            (Arc::new(store), outbox)
        }
    };
    // Every store call is counted and timed (without --metrics-addr nothing is recorded).
    let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(store, Recorder));
    let outbox = outbox.due_from(Arc::clone(&store)).idle(settings.dispatch_idle);
    let worker_id = settings.worker_id();
    let worker = SqsWorker::new(
        queue,
        store,
        &worker_id,
        settings.lease,
        &settings.worker_settings(),
    )?;
    let (stats, worker) = (Arc::clone(worker.stats()), worker.with_stop(stop.clone()));
    let consumer = tokio::spawn(worker.run(move |ctx| work(ctx, Arc::clone(&provider))));
    // Publishing needs sqs:SendMessage: the outbox and the republish loop run with --dispatch.
    let (shutdown, stopping) = watch::channel(false);
    let mut loops = Vec::new();
    if settings.dispatch {
        let republish = outbox
            .clone()
            .run_republish(settings.republish_every(), stopping.clone());
        loops.push(tokio::spawn(republish));
        loops.push(tokio::spawn(outbox.run(stopping)));
    }
    tracing::info!(%worker_id, queue = %settings.queue_url, store = ?settings.store, dispatch = settings.dispatch, "consuming");

    stop.requested().await;
    let stop_by = tokio::time::Instant::now() + settings.shutdown_grace + settings.release_deadline;
    let _ = shutdown.send(true);
    let stopped = consumer.await??;
    for task in loops {
        // A dispatch round cut short only means its handoffs are sent again later.
        if tokio::time::timeout_at(stop_by, task).await.is_err() {
            tracing::warn!("a dispatcher did not stop in time; abandoning it");
        }
    }
    let deliveries = stats.deliveries.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(?stopped, deliveries, dispositions = ?stats.dispositions(), "stopped");
    Ok(())
}
