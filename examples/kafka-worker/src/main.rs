//! The worker service: consumes the handoff topic until SIGTERM or SIGINT,
//! then stops taking records, lets in-flight tasks finish within
//! `--shutdown-grace`, releases the ones still running, commits only the safe
//! offsets and exits 0.
//!
//! ```text
//! DATABASE_URL=postgres://app@db/app?sslmode=verify-full&sslrootcert=/etc/ssl/rds-ca.pem \
//! TASKFENCE_KAFKA_BOOTSTRAP=kafka-1:9092,kafka-2:9092 \
//! TASKFENCE_PROVIDER_URL=https://llm.example/v1/generate \
//!     kafka-worker
//! ```
//!
//! `kafka-worker --help` lists every option and its environment variable.

use std::io::IsTerminal;
use std::sync::Arc;

use kafka_worker::config::{Positions, ProviderKind, Settings};
// Scaffolding: drop this import and the `Simulated` arm below when you copy main.rs.
use kafka_worker::sim::SimulatedLlm;
use kafka_worker::{
    ConsumerConfig, Dispatcher, Handoffs, HttpProvider, Journal, PgPositions, Provider, ReplyConsumer,
    TracingJournal, store,
};
use taskfence::runtime::WorkerConfig;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::load();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&settings.log)?)
        // Colours only on a terminal: log collectors get plain text.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    // Installed first, so a signal during start-up is not lost.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    let pg = store::connect(&settings).await?;
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

    let (stop, stopped) = watch::channel(false);
    let dispatcher = if settings.dispatch {
        let handoffs = Arc::new(Handoffs::with_records_per_batch(
            &settings.bootstrap,
            &settings.topic,
            Arc::clone(&journal),
            settings.producer_batch_records,
        )?);
        let dispatcher = Dispatcher::new(pg.clone(), handoffs, settings.dispatch_batch);
        Some(tokio::spawn(dispatcher.run(stopped, settings.dispatch_idle)))
    } else {
        None
    };

    let mut config = ConsumerConfig::new(
        &settings.bootstrap,
        &settings.group,
        &settings.topic,
        &settings.worker_id,
    );
    config.per_partition = settings.per_partition;
    config.retry_delay = settings.retry_delay;
    config.session_timeout = settings.session_timeout;
    config.shutdown_grace = settings.shutdown_grace;
    let worker = WorkerConfig::new(&settings.worker_id, settings.lease).min_retry_delay(settings.retry_delay);
    let consumer = match settings.positions {
        Positions::Group => ReplyConsumer::spawn(config, Arc::new(pg.clone()), worker, provider, journal)?,
        Positions::Postgres => {
            let pg = Arc::new(pg);
            let positions = Arc::new(PgPositions::new(&pg, &settings.group).await?);
            ReplyConsumer::spawn_with_positions(config, worker, pg, positions, provider, journal)?
        }
    };
    tracing::info!(
        worker = %settings.worker_id,
        topic = %settings.topic,
        group = %settings.group,
        "consuming"
    );

    let signal = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    };
    tracing::info!(signal, grace = ?settings.shutdown_grace, "shutting down");
    let _ = stop.send(true);
    let report = consumer.shutdown().await;
    if let Some(dispatcher) = dispatcher {
        let _ = dispatcher.await;
    }
    tracing::info!(
        in_flight = report.in_flight,
        released = report.released,
        left_unfinished = report.left_unfinished,
        "stopped"
    );
    Ok(())
}
