//! [`Service`]: start the API and/or the worker on a pool, stop them.

use std::net::SocketAddr;
use std::sync::Arc;

use taskfence::PgStore;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::config::Config;
use crate::replies::{ReplyEvents, ReplyStore};
use crate::worker;

/// The app's tables (`schema.sql`), created in the pool's `search_path`.
const SCHEMA: &str = include_str!("../schema.sql");

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// taskfence's schema, migrations or configuration.
    #[error("taskfence: {0}")]
    Taskfence(#[from] taskfence::Error),
    /// The app's schema or the LISTEN connection.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The HTTP listener.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// `Mode::ApiOnly` or `Mode::Both` without a listener.
    #[error("the API needs a TCP listener")]
    NoListener,
}

/// A running API and/or worker. [`Service::shutdown`] stops everything it started.
#[derive(Debug)]
pub struct Service {
    addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Service {
    /// Prepares the schemas, then starts what `config.mode` asks for: the API
    /// on `listener` (with the LISTEN connection for long-polls) and the worker.
    ///
    /// The pool's connections decide where the app's tables are (their
    /// `search_path`); taskfence's are in `config.taskfence_schema`.
    pub async fn start(
        pool: sqlx::PgPool,
        config: Config,
        listener: Option<TcpListener>,
    ) -> Result<Self, StartError> {
        let store = PgStore::builder(pool.clone())
            .schema(config.taskfence_schema.clone())
            .build()?;
        store.migrate().await?;
        create_app_tables(&pool).await?;

        let (stop, stop_rx) = watch::channel(false);
        let wake_worker = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let mut addr = None;

        if config.mode.runs_api() {
            let listener = listener.ok_or(StartError::NoListener)?;
            addr = Some(listener.local_addr()?);
            let (events, listening) =
                ReplyEvents::listen(&pool, &config.reply_channel(), stop_rx.clone()).await?;
            tasks.push(listening);
            let state = AppState {
                pool: pool.clone(),
                store: store.clone(),
                tokens: Arc::new(config.tokens.clone()),
                policy: config.policy,
                key_retention: config.key_retention,
                limits: Arc::new(config.limits.clone()),
                events,
                wake_worker: Arc::clone(&wake_worker),
                stop: stop_rx.clone(),
            };
            let mut stop_serving = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                let shutdown = async move {
                    stopped(&mut stop_serving).await;
                };
                if let Err(error) = axum::serve(listener, api::router(state))
                    .with_graceful_shutdown(shutdown)
                    .await
                {
                    tracing::error!(%error, "HTTP server failed");
                }
            }));
        }
        if config.mode.runs_worker() {
            let replies = ReplyStore::new(store.clone(), config.reply_channel());
            tasks.push(tokio::spawn(worker::run(
                store,
                replies,
                config.worker.clone(),
                wake_worker,
                stop_rx,
            )));
        }
        Ok(Self { addr, stop, tasks })
    }

    /// The address the API listens on (`None` for `Mode::WorkerOnly`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Stops serving (long-polls answer at once with the current state),
    /// stops the worker (in-flight replies are abandoned to their leases) and
    /// waits for all of it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Creates the app's tables if needed, one replica at a time. A template
/// shortcut: a real app runs `schema.sql` with its migration tool.
async fn create_app_tables(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('chat-api schema'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
    tx.commit().await
}

/// Resolves once `stop` is true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
