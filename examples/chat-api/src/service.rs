//! [`Service`]: start the API and/or the worker on a pool, stop them.

use std::net::SocketAddr;
use std::sync::Arc;

use taskfence::postgres::listen_saved;
use taskfence::runtime::{SavedEvents, Stop, Wake, spawn_purge};
use taskfence::{PgStore, TaskStore, throttle::RateBucket};
use taskfence_axum::webhook::Webhook;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::api::{self, AppState, PROVIDER_BUCKET};
use crate::config::Config;
use crate::notify;
use crate::replies::reply_store;
use crate::worker::{self, ReplyProvider};

/// The app's migrations (`migrations/*.sql`), embedded at build time.
///
/// Two migrators share the database and never meet: taskfence's
/// ([`PgStore::migrate`]) writes its tables and its history table
/// `taskfence_migrations` into its own schema (`TASKFENCE_SCHEMA`), with
/// qualified names; the app's writes unqualified names, so its tables and its
/// `_sqlx_migrations` land in the first schema of the connection's
/// `search_path`: the app schema (`--app-schema`, set on every connection by
/// `taskfence::config::connect_pool`). Each takes its own lock (taskfence an
/// advisory lock per schema, sqlx one per database), so replicas starting at
/// once apply every file exactly once.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// taskfence's configuration, its migrations or a consumer's settings.
    #[error("taskfence: {0}")]
    Taskfence(#[from] taskfence::Error),
    /// The app's migrations (`migrations/`).
    #[error("app migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The LISTEN connection.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The HTTP listener: binding `config.listen` (the address is in the
    /// message) or reading its bound address.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// The webhook's HTTP client.
    #[error("webhook client: {0}")]
    Webhook(#[from] reqwest::Error),
}

/// A running API and/or worker. [`Service::shutdown`] stops everything it started.
#[derive(Debug)]
pub struct Service {
    addr: Option<SocketAddr>,
    events: Option<SavedEvents>,
    /// The one stop switch: the reply and notification consumers', which the
    /// HTTP server, the long-polls and the sweep watch too.
    stop: Stop,
    tasks: Vec<JoinHandle<()>>,
}

impl Service {
    /// Applies both migration histories (taskfence's, then [`MIGRATOR`];
    /// idempotent), then starts what `config.mode` asks for: the API on
    /// `config.listen` (with the LISTEN connection for long-polls) and the worker,
    /// calling `provider`, with the retention sweep
    /// ([`taskfence::runtime::purge_every`]) beside it and, when
    /// `config.webhook_url` is set, the "reply ready" notifications ([`notify`]).
    ///
    /// The pool's connections decide where the app's tables are (their
    /// `search_path`); taskfence's are in `config.taskfence_schema`.
    pub async fn start(
        pool: sqlx::PgPool,
        config: Config,
        provider: Arc<dyn ReplyProvider>,
    ) -> Result<Self, StartError> {
        let store = PgStore::builder(pool.clone())
            .schema(config.taskfence_schema.clone())
            .build()?;
        store.migrate().await?;
        MIGRATOR.run(&pool).await?;
        // The provider's rate, kept in the store for every worker (defining
        // it again keeps its schedule); a 429's Retry-After drains it.
        let rate = RateBucket::per_minute(PROVIDER_BUCKET, config.provider_rpm);
        store.define_bucket(rate).await?;

        // One switch for everything: both consumers, the server, the
        // long-polls and the sweep.
        let stop = Stop::new();
        let config = Arc::new(config);
        // The consumers are built before anything runs: invalid settings fail
        // the start, and the API needs the reply consumer's wake-up. With a
        // webhook, a second consumer delivers the notification tasks, woken
        // by each reply's commit.
        let (mut worker, mut notices) = (None, None);
        if config.mode.runs_worker() {
            if let Some(url) = &config.webhook_url {
                let hook = Webhook::new(url.clone(), config.webhook_timeout)?.reference("delivery_id");
                notices = Some((notify::consumer(store.clone(), &config, stop.clone())?, hook));
            }
            let ready = notices.as_ref().map(|(consumer, _)| {
                notify::follow_up(config.policy, config.key_retention, consumer.source().waker())
            });
            let replies = reply_store(store.clone(), config.reply_channel(), ready);
            worker = Some(worker::consumer(replies, &config.worker)?.with_stop(stop.clone()));
        }
        let mut tasks = Vec::new();
        let (mut addr, mut events) = (None, None);
        if config.mode.runs_api() {
            let bound = TcpListener::bind(config.listen).await;
            let listener =
                bound.map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", config.listen)))?;
            addr = Some(listener.local_addr()?);
            let (saved, listening) = listen_saved(&pool, &config.reply_channel(), stop.clone()).await?;
            tasks.push(listening);
            events = Some(saved.clone());
            let state = AppState {
                pool,
                store: store.clone(),
                config: Arc::clone(&config),
                events: saved,
                wake_worker: worker.as_ref().map_or_else(Wake::default, |c| c.source().waker()),
                stop: stop.clone(),
            };
            tasks.push(taskfence_axum::serve(listener, api::router(state), stop.clone()));
        }
        if let Some((consumer, webhook)) = notices {
            tasks.push(consumer.spawn("notification worker", webhook.work(notify::EFFECT)));
        }
        if let Some(consumer) = worker {
            let generate = move |ctx| worker::generate(Arc::clone(&provider), ctx);
            tasks.push(consumer.spawn("reply worker", generate));
            let purge = &config.purge;
            tasks.push(spawn_purge(store, purge.every, purge.batch, stop.clone()));
        }
        Ok(Self {
            addr,
            events,
            stop,
            tasks,
        })
    }

    /// Long-polls (`GET /tasks/{id}?wait=`) in progress (0 without the API).
    pub fn long_polls(&self) -> usize {
        self.events.as_ref().map_or(0, SavedEvents::waiting)
    }

    /// The address the API listens on (`None` for `Mode::WorkerOnly`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The service's stop switch. [`shutdown`](Self::shutdown) drains it;
    /// [`Stop::now`] cuts the grace short, releasing the replies in flight at
    /// once (what a second SIGTERM does to the binary, through
    /// [`Stop::on_signals`]).
    ///
    /// ```no_run
    /// # async fn f(service: chat_api::Service) {
    /// let stop = service.stop();
    /// let stopping = tokio::spawn(service.shutdown());
    /// // … the orchestrator is out of patience:
    /// stop.now();
    /// stopping.await.unwrap();
    /// # }
    /// ```
    pub fn stop(&self) -> Stop {
        self.stop.clone()
    }

    /// Stops serving (long-polls answer at once with the current state) and
    /// the sweep, and drains the worker: it claims nothing more, replies in
    /// flight get [`WorkerSettings::grace`](crate::WorkerSettings::grace) to
    /// finish, the rest are released for another process to claim at once.
    /// Waits for all of it.
    pub async fn shutdown(self) {
        self.stop.drain();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
