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

use clap::CommandFactory;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqs_worker::config::{ProviderKind, Settings};
use sqs_worker::{BoxError, HttpProvider, Provider, SqsQueue, SqsWorker, aws, work};
use taskfence::TaskStore;
use taskfence::intercept::Intercepted;
use taskfence::metrics::{OPERATION_DURATION_SECONDS, Recorder};
use taskfence::runtime::Stop;

/// Latency as a histogram with buckets (seconds), which sum across replicas (a summary's quantiles do not).
#[rustfmt::skip]
const LATENCY_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[tokio::main]
async fn main() -> ExitCode {
    let settings = Settings::load();
    // One line shape inside and outside the work (see `logs`), first the
    // former names still read (until 0.3) and the variables no option reads.
    let warnings = taskfence::config::startup_warnings(&Settings::command(), settings.deprecations());
    if let Err(error) = taskfence::logs::start(&settings.log, warnings) {
        eprintln!("invalid log filter {:?}: {error}", settings.log);
        return ExitCode::from(2);
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
            let url = settings.provider_url.clone();
            Arc::new(HttpProvider::connect(
                url.ok_or("--provider http needs --provider-url")?,
            )?)
        }
        // Local runs and tests; delete this arm (and `sim`) in your copy.
        ProviderKind::Simulated => settings.sim.provider(),
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
    // PostgreSQL (migrated) or DynamoDB (its table checked), and its outbox.
    let dynamodb = || aws_sdk_dynamodb::Client::new(&aws);
    let batch = settings.dispatch.dispatch_batch;
    let opened = settings.store.open("sqs-worker", dynamodb, &queue, batch).await?;
    // Every store call is counted and timed (without --metrics-addr nothing is recorded).
    let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(opened.store, Recorder));
    let worker_id = settings.worker_id();
    let worker = SqsWorker::new(
        queue,
        Arc::clone(&store),
        &worker_id,
        settings.lease,
        &settings.worker,
    )?;
    let (stats, worker) = (Arc::clone(worker.stats()), worker.with_stop(stop.clone()));
    let consumer = tokio::spawn(worker.run(move |ctx| work(ctx, Arc::clone(&provider))));
    // Publishing needs sqs:SendMessage: the outbox and the republish loop run with --dispatch.
    let publishing = settings.dispatch.start(opened.outbox.due_from(store));
    tracing::info!(%worker_id, queue = %settings.queue_url, store = ?settings.store.store, dispatch = settings.dispatch.dispatch, "consuming");

    stop.requested().await;
    let stop_by = tokio::time::Instant::now() + settings.worker.stop_within();
    // The dispatcher stops at once; a round cut short only means its handoffs are sent again.
    let (stopped, ()) = tokio::join!(consumer, publishing.stop(stop_by));
    let stopped = stopped??;
    let deliveries = stats.deliveries.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(?stopped, deliveries, dispositions = ?stats.dispositions(), "stopped");
    Ok(())
}
