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
use std::sync::atomic::Ordering;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqs_worker::config::{ProviderKind, Settings, StoreKind};
use sqs_worker::sim::{SimulatedConfig, SimulatedLlm};
use sqs_worker::{
    BoxError, Dispatcher, HttpProvider, Provider, SqsQueue, SqsWorker, Stats, dynamo, queue, store,
};
use taskfence::intercept::Intercepted;
use taskfence::metrics::Recorder;
use taskfence::{DynamoStore, TaskStore};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

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
    sqs_worker::logs::init(filter);
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
    // Listen before anything slow, so a signal during start-up is not lost.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;

    let provider: Arc<dyn Provider> = match settings.provider {
        ProviderKind::Http => {
            let url = settings
                .provider_url
                .clone()
                .ok_or("--provider-url (TASKFENCE_PROVIDER_URL) is required with --provider http")?;
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
        // The process-wide recorder; the store below records into it.
        // Latency as a histogram with buckets, which sum across replicas
        // (a summary's quantiles do not).
        PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(taskfence::metrics::OPERATION_DURATION_SECONDS.to_owned()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ],
            )
            .map_err(|e| format!("metrics buckets: {e}"))?
            .with_http_listener(addr)
            .install()
            .map_err(|e| format!("metrics endpoint on {addr}: {e}"))?;
        taskfence::metrics::describe();
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    // One AWS configuration for every AWS client.
    let aws = queue::aws_config().await;
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(&aws), &settings.queue_url);
    // Fail at start-up, not on the first message, when credentials, region or
    // queue URL are wrong.
    queue
        .depth()
        .await
        .map_err(|e| format!("queue {}: {e}", settings.queue_url))?;
    let (store, dispatcher): (Arc<dyn TaskStore>, Dispatcher) = match settings.store {
        StoreKind::Postgres => {
            let url = settings
                .database_url
                .as_deref()
                .ok_or("--database-url (DATABASE_URL) is required with --store postgres")?;
            let pg = store::connect(url, &settings.schema, settings.db_max_connections).await?;
            if !settings.skip_migrations {
                // Idempotent and serialized by an advisory lock: every replica may run them.
                pg.migrate().await?;
            }
            let dispatcher = Dispatcher::new(pg.clone(), queue.clone(), settings.dispatch_batch);
            (Arc::new(pg), dispatcher)
        }
        StoreKind::Dynamodb => {
            let table = settings
                .dynamodb_table
                .as_deref()
                .ok_or("--dynamodb-table (TASKFENCE_DYNAMODB_TABLE) is required with --store dynamodb")?;
            let client = aws_sdk_dynamodb::Client::new(&aws);
            dynamo::check_table(&client, table).await?;
            let store = DynamoStore::new(client, table)?;
            let dispatcher = Dispatcher::dynamodb(store.clone(), queue.clone(), settings.dispatch_batch);
            (Arc::new(store), dispatcher)
        }
    };

    // Every store call is counted and timed (taskfence::metrics); without
    // --metrics-addr nothing is recorded, at next to no cost.
    let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(store, Recorder));
    let dispatcher = dispatcher.due_from(Arc::clone(&store));
    let worker_id = settings.worker_id();
    let stats = Arc::new(Stats::default());
    let worker = SqsWorker::new(
        queue.clone(),
        store,
        provider,
        worker_id.clone(),
        settings.lease,
        &settings.worker_settings(),
        Arc::clone(&stats),
    )?;
    let stop = worker.stop().clone();
    let consumer = tokio::spawn(worker.run());
    let (shutdown, shutting_down) = watch::channel(false);
    // Publishing needs sqs:SendMessage: both loops run with --dispatch.
    let republisher = settings.dispatch.then(|| {
        tokio::spawn(
            dispatcher
                .clone()
                .run_republish(settings.republish_every(), shutting_down.clone()),
        )
    });
    let dispatcher = settings
        .dispatch
        .then(|| tokio::spawn(dispatcher.idle(settings.dispatch_idle).run(shutting_down)));
    tracing::info!(%worker_id, queue = %settings.queue_url, store = ?settings.store, dispatch = settings.dispatch, "consuming");

    let signal = tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    };
    tracing::info!(signal, grace = ?settings.shutdown_grace, "stopping");
    let stop_by = tokio::time::Instant::now() + settings.shutdown_grace + settings.release_deadline;
    stop.request();
    let _ = shutdown.send(true);
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("second signal: releasing the tasks in hand now");
        stop.now();
    });
    let stopped = consumer.await??;
    for task in [dispatcher, republisher].into_iter().flatten() {
        // A dispatch round is one transaction: cut short, its handoffs are sent again later.
        if tokio::time::timeout_at(stop_by, task).await.is_err() {
            tracing::warn!("a dispatcher did not stop in time; abandoning it");
        }
    }
    tracing::info!(
        ?stopped,
        deliveries = stats.deliveries.load(Ordering::Relaxed),
        dispositions = ?stats.dispositions(),
        "stopped"
    );
    Ok(())
}
