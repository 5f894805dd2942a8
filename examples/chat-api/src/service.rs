//! [`Service`]: start the API and/or the worker on a pool, stop them.

use std::net::SocketAddr;
use std::sync::Arc;

use taskfence::PgStore;
use taskfence::runtime::{Stop, Wake};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::config::Config;
use crate::db::{self, MigrateError};
use crate::notify::{self, Notifier, ReadyNotices};
use crate::purge;
use crate::replies::{ReplyEvents, reply_store};
use crate::worker::{self, ReplyProvider};

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// taskfence's configuration (its schema name).
    #[error("taskfence: {0}")]
    Taskfence(#[from] taskfence::Error),
    /// taskfence's or the app's migrations.
    #[error("{0}")]
    Migrate(#[from] MigrateError),
    /// The LISTEN connection.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The HTTP listener.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// The webhook's HTTP client.
    #[error("webhook client: {0}")]
    Webhook(#[from] reqwest::Error),
    /// `Mode::ApiOnly` or `Mode::Both` without a listener.
    #[error("the API needs a TCP listener")]
    NoListener,
}

/// A running API and/or worker. [`Service::shutdown`] stops everything it started.
#[derive(Debug)]
pub struct Service {
    addr: Option<SocketAddr>,
    events: Option<ReplyEvents>,
    stop: watch::Sender<bool>,
    /// The workers' stop switch, shared by the reply and the notification
    /// consumers (one nothing watches without a worker).
    stop_worker: Stop,
    tasks: Vec<JoinHandle<()>>,
}

impl Service {
    /// Applies both migration histories ([`db::migrate`]), then starts what
    /// `config.mode` asks for: the API on `listener` (with the LISTEN
    /// connection for long-polls) and the worker, calling `provider`, with
    /// the retention sweep ([`purge`]) beside it and, when `config.webhook`
    /// is set, the "reply ready" notifications ([`notify`]).
    ///
    /// The pool's connections decide where the app's tables are (their
    /// `search_path`, see [`db::connect`]); taskfence's are in
    /// `config.taskfence_schema`.
    pub async fn start(
        pool: sqlx::PgPool,
        config: Config,
        listener: Option<TcpListener>,
        provider: Arc<dyn ReplyProvider>,
    ) -> Result<Self, StartError> {
        let store = PgStore::builder(pool.clone())
            .schema(config.taskfence_schema.clone())
            .build()?;
        db::migrate(&store).await?;

        // Built first: invalid worker settings fail the start, and the API
        // needs the consumer's wake-up.
        let (worker, notifier) = match config.mode.runs_worker() {
            true => {
                // With a webhook: a second consumer for the notification tasks,
                // stopped with the reply consumer, woken by each reply's commit.
                let stop = Stop::new();
                let notifier = match &config.webhook {
                    Some(webhook) => Some((
                        notify::consumer(store.clone(), &config.worker, webhook, stop.clone())
                            .map_err(taskfence::Error::from)?,
                        Notifier::new(webhook)?,
                    )),
                    None => None,
                };
                let ready = notifier.as_ref().map(|(consumer, _)| {
                    ReadyNotices::new(config.policy, config.key_retention, consumer.source().waker())
                });
                let replies = reply_store(store.clone(), config.reply_channel(), ready);
                let consumer = worker::consumer(replies, &config.worker).map_err(taskfence::Error::from)?;
                (Some(consumer.with_stop(stop)), notifier)
            }
            false => (None, None),
        };
        let stop_worker = worker.as_ref().map_or_else(Stop::new, |c| c.stop().clone());
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut addr = None;
        let mut api_events = None;

        if config.mode.runs_api() {
            let listener = listener.ok_or(StartError::NoListener)?;
            addr = Some(listener.local_addr()?);
            let (events, listening) =
                ReplyEvents::listen(&pool, &config.reply_channel(), stop_rx.clone()).await?;
            tasks.push(listening);
            api_events = Some(events.clone());
            let state = AppState {
                pool: pool.clone(),
                store: store.clone(),
                tokens: Arc::new(config.tokens.clone()),
                policy: config.policy,
                key_retention: config.key_retention,
                limits: Arc::new(config.limits.clone()),
                events,
                wake_worker: worker.as_ref().map_or_else(Wake::default, |c| c.source().waker()),
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
        if let Some(consumer) = worker {
            tasks.push(tokio::spawn(purge::run(store, config.purge.clone(), stop_rx)));
            tasks.push(tokio::spawn(worker::run(consumer, provider)));
        }
        if let Some((consumer, notifier)) = notifier {
            tasks.push(tokio::spawn(notify::run(consumer, notifier)));
        }
        Ok(Self {
            addr,
            events: api_events,
            stop,
            stop_worker,
            tasks,
        })
    }

    /// Long-polls (`GET /tasks/{id}?wait=`) in progress (0 without the API).
    pub fn long_polls(&self) -> usize {
        self.events.as_ref().map_or(0, ReplyEvents::waiting)
    }

    /// The address the API listens on (`None` for `Mode::WorkerOnly`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The worker's stop switch. [`shutdown`](Self::shutdown) drains it;
    /// [`Stop::now`] cuts the grace short, releasing the replies in flight at
    /// once (what a second SIGTERM does to the binary).
    ///
    /// ```no_run
    /// # async fn f(service: chat_api::Service) {
    /// let worker = service.worker_stop();
    /// let stopping = tokio::spawn(service.shutdown());
    /// // … the orchestrator is out of patience:
    /// worker.now();
    /// stopping.await.unwrap();
    /// # }
    /// ```
    pub fn worker_stop(&self) -> Stop {
        self.stop_worker.clone()
    }

    /// Stops serving (long-polls answer at once with the current state) and
    /// the sweep, and drains the worker: it claims nothing more, replies in
    /// flight get [`WorkerSettings::grace`](crate::WorkerSettings::grace) to
    /// finish, the rest are released for another process to claim at once.
    /// Waits for all of it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.stop_worker.drain();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Resolves once `stop` is true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
