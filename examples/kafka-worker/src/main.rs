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

use clap::CommandFactory;
use kafka_worker::config::{ProviderKind, Settings};
use kafka_worker::{HttpProvider, Provider, work_with};
use taskfence_kafka::{Journal, TracingJournal};
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::load();
    // One line shape inside and outside the work (see `logs`), first the
    // former names still read (until 0.3) and the variables no option reads.
    let warnings = taskfence::config::startup_warnings(&Settings::command(), settings.deprecations());
    taskfence::logs::start(&settings.log, warnings)?;
    // Installed first, so a signal during start-up is not lost.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    // Start-up: every DDL the service runs, each step idempotent and under a
    // migration lock (the library's tables here, the positions table in
    // `start`), so workers starting at once on a fresh schema run them one
    // after another. Nothing is consumed or published before it succeeded.
    let (url, schema) = (&settings.database_url, &settings.schema);
    let max = settings.db_max_connections;
    let pg = taskfence::config::connect_postgres(url, schema, max, &settings.worker_id).await?;
    pg.migrate().await?;
    let provider: Arc<dyn Provider> = match settings.provider {
        ProviderKind::Http => Arc::new(HttpProvider {
            url: settings.provider_url.clone().unwrap_or_default(),
        }),
        // Local runs and tests; delete this arm (and `sim`) in your copy.
        ProviderKind::Simulated => settings.sim.provider(),
    };
    let journal: Arc<dyn Journal> = Arc::new(TracingJournal);
    let work = work_with(provider, Arc::clone(&journal), &settings.worker_id);
    // The positions table, the producers, the consumer, and last the
    // dispatcher: a process that fails to start has published nothing.
    let worker = (settings.worker)
        .start(&pg, &settings.worker_id, settings.lease, journal, work)
        .await?;
    let stop = worker.stop().clone();
    tracing::info!(worker = %settings.worker_id, topic = %settings.worker.topic, group = %settings.worker.group, "consuming");

    // The first signal drains (the grace), a second releases at once.
    tokio::spawn({
        let (stop, grace) = (stop.clone(), settings.worker.shutdown_grace);
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
    let stopped = worker.shutdown().await;
    tracing::info!(
        completed = stopped.completed,
        failed = stopped.failed,
        released = stopped.released,
        lost = stopped.lost,
        "stopped"
    );
    Ok(())
}
