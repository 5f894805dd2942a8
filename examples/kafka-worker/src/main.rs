//! The worker service: consumes the handoff topic until SIGTERM or SIGINT,
//! then stops taking records, lets in-flight tasks finish within
//! `--shutdown-grace` (a second signal cuts it short), releases the ones
//! still running, commits only the safe offsets and exits 0.
//!
//! ```text
//! DATABASE_URL=postgres://app@db/app?sslmode=verify-full&sslrootcert=/etc/ssl/rds-ca.pem \
//! TASKFENCE_KAFKA_BOOTSTRAP=kafka-1:9092,kafka-2:9092 \
//! TASKFENCE_PROVIDER_URL=https://llm.example/v1/generate \
//!     kafka-worker
//! ```
//!
//! `kafka-worker --help` lists every option and its environment variable.

use std::sync::Arc;
use std::time::Duration;

use kafka_worker::config::{Positions, ProviderKind, Settings};
// Scaffolding: drop this import and the `Simulated` arm below when you copy main.rs.
use kafka_worker::sim::SimulatedLlm;
use kafka_worker::{HttpProvider, Provider, store, work_with};
use taskfence::runtime::ConsumerConfig;
use taskfence_kafka::{
    Dispatcher, Handoffs, Journal, KafkaConfig, PgPositions, ReplyConsumer, Results, TracingJournal,
};
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// After the grace, how long releasing the leases and the last saves may take.
const RELEASE_DEADLINE: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::load();
    // One line shape inside and outside the work (see `logs`).
    taskfence::logs::init(tracing_subscriber::EnvFilter::try_new(&settings.log)?);
    // Former names still work until 0.3; a variable no option reads is
    // reported, not silently ignored.
    for renamed in settings.deprecations() {
        tracing::warn!("{renamed}");
    }
    if let Some(unknown) = Settings::unknown_env() {
        tracing::warn!("{unknown}");
    }
    // Installed first, so a signal during start-up is not lost.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    // Start-up: every DDL the service runs, each step idempotent and under a
    // migration lock (the library's tables, then the positions table), so
    // workers starting at once on a fresh schema run them one after another.
    // Nothing is consumed or published before it succeeded.
    let pg = store::connect(&settings).await?;
    let positions = match settings.positions {
        Positions::Group => None,
        Positions::Postgres => Some(Arc::new(PgPositions::new(&pg, &settings.group).await?)),
    };
    let journal: Arc<dyn Journal> = Arc::new(TracingJournal);
    let provider: Arc<dyn Provider> = match settings.provider {
        ProviderKind::Http => Arc::new(HttpProvider {
            url: settings.provider_url.clone().unwrap_or_default(),
        }),
        ProviderKind::Simulated => {
            tracing::warn!("using the simulated provider: for local runs and tests only");
            Arc::new(
                SimulatedLlm::new(settings.sim_min_latency, settings.sim_max_latency)
                    .slow_latency(settings.sim_slow_latency),
            )
        }
    };
    let handoffs = match settings.dispatch {
        true => Some(Arc::new(Handoffs::with_records_per_batch(
            &settings.bootstrap,
            &settings.topic,
            Arc::clone(&journal),
            settings.producer_batch_records,
        )?)),
        false => None,
    };

    let mut kafka = KafkaConfig::new(
        &settings.bootstrap,
        &settings.group,
        &settings.topic,
        &settings.worker_id,
    );
    kafka.session_timeout = settings.session_timeout;
    if let Some(topic) = &settings.results_topic {
        let results = Results::new(&settings.bootstrap, topic, settings.producer_batch_records)?;
        kafka = kafka.publish_results(Arc::new(results));
    }
    let config = ConsumerConfig::new(&settings.worker_id, settings.lease)
        .concurrency(settings.concurrency)
        .min_retry_delay(settings.retry_delay)
        .stop_after(settings.shutdown_grace, RELEASE_DEADLINE);
    let work = work_with(provider, Arc::clone(&journal), &settings.worker_id);
    let consumer = match positions {
        None => ReplyConsumer::spawn(kafka, Arc::new(pg.clone()), config, journal, work)?,
        Some(positions) => ReplyConsumer::spawn_with_positions(
            kafka,
            config,
            Arc::new(pg.clone()),
            positions,
            journal,
            work,
        )?,
    };
    let stop = consumer.stop().clone();
    // Last: the dispatcher starts only once start-up succeeded and the
    // consumer runs, so a process that fails to start has published nothing.
    let dispatcher = handoffs.map(|handoffs| {
        let dispatcher = Dispatcher::new(pg, handoffs, settings.dispatch_batch);
        tokio::spawn(dispatcher.run(stop.clone(), settings.dispatch_idle))
    });
    tracing::info!(worker = %settings.worker_id, topic = %settings.topic, group = %settings.group, "consuming");

    // The first signal drains (the grace), a second releases at once.
    tokio::spawn({
        let (stop, grace) = (stop.clone(), settings.shutdown_grace);
        async move {
            loop {
                let signal = tokio::select! {
                    _ = sigterm.recv() => "SIGTERM",
                    _ = sigint.recv() => "SIGINT",
                };
                tracing::info!(signal, ?grace, "shutting down");
                stop.request();
            }
        }
    });
    stop.requested().await;
    let stopped = consumer.shutdown().await;
    if let Some(dispatcher) = dispatcher {
        let _ = dispatcher.await;
    }
    tracing::info!(
        completed = stopped.completed,
        failed = stopped.failed,
        released = stopped.released,
        lost = stopped.lost,
        "stopped"
    );
    Ok(())
}
