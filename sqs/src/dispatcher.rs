//! [`Dispatcher`]: the outbox → SQS publisher (the handoffs `submit` wrote
//! in the task's own transaction, ten per `SendMessageBatch`), and the
//! republishing of the tasks that need a worker again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskfence::republish::Published;
use taskfence::wire::Stamp;
use taskfence::{Outbox, TaskId, TaskStore};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::queue::{MAX_BATCH, SqsQueue};

type Hook = Arc<dyn Fn(&[TaskId]) -> std::result::Result<(), String> + Send + Sync>;
type RoundFuture = Pin<Box<dyn Future<Output = taskfence::Result<Published<Error>>> + Send>>;
type Round = Arc<dyn Fn(usize, Sender) -> RoundFuture + Send + Sync>;

/// What sends one batch of stamps: the queue, the counters, and the test hook.
#[derive(Clone)]
struct Sender {
    queue: SqsQueue,
    sent: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    after_send: Option<Hook>,
}

impl Sender {
    /// One `SendMessageBatch`; `Ok` only when every entry reached the queue.
    fn send(&self, stamps: Vec<Stamp>) -> impl Future<Output = Result<()>> + Send + use<> {
        let this = self.clone();
        async move {
            this.requests.fetch_add(1, Ordering::Relaxed);
            let batch = this.queue.publish_batch(&stamps).await?;
            this.sent.fetch_add(batch.sent as u64, Ordering::Relaxed);
            if !batch.failed.is_empty() {
                // Partly sent: the whole batch stays pending and goes again
                // (duplicates are harmless).
                return Err(Error::Refused {
                    failed: batch.failed,
                    of: stamps.len(),
                });
            }
            match &this.after_send {
                Some(hook) => {
                    let tasks: Vec<TaskId> = stamps.iter().map(|stamp| stamp.task_id).collect();
                    hook(&tasks).map_err(Error::Unconfirmed)
                }
                None => Ok(()),
            }
        }
    }
}

/// Moves pending handoffs from a store's outbox to the queue, and
/// republishes the tasks that are due.
///
/// **Dispatch** ([`round`](Self::round), [`run`](Self::run)): each round
/// takes up to `batch` pending handoffs, oldest first, and sends them ten
/// per `SendMessageBatch` ([`Outbox::dispatch_batches`]), each message with
/// the task's [`Stamp`] as attributes, marking each batch published once
/// SQS accepted all of it. A request with any failed entry counts as failed
/// whole: the round stops there and its ten stay pending, also the ones SQS
/// accepted. A send whose answer is lost, a partly failed request, or a
/// crash between sending and marking sends them again next round: the queue
/// sees duplicates, every copy names the same task, and the claim makes
/// them harmless. On PostgreSQL several dispatchers share the outbox (`FOR
/// UPDATE SKIP LOCKED`); on DynamoDB two may both send a handoff.
///
/// **Republish** ([`republish_round`](Self::republish_round),
/// [`run_republish`](Self::run_republish)): tasks that are
/// [`due`](TaskStore::due) — a backoff that passed, a lease that expired, a
/// task an operator reopened — get a new message, ten per request. The
/// queue already redelivers most of them (a failed attempt's message stays
/// hidden until its backoff ends, a crashed worker's until its lease ends);
/// this loop covers the ones whose message is gone: deleted after a
/// terminal failure and then reopened, dead-lettered, expired, purged.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore, queue: taskfence_sqs::SqsQueue) {
/// use std::time::Duration;
/// let (shutdown, stopping) = tokio::sync::watch::channel(false);
/// let dispatcher = taskfence_sqs::Dispatcher::new(store, queue, 100);
/// tokio::spawn(dispatcher.clone().run_republish(Duration::from_secs(30), stopping.clone()));
/// tokio::spawn(dispatcher.run(stopping));
/// // … on SIGTERM:
/// let _ = shutdown.send(true);
/// # }
/// ```
#[derive(Clone)]
pub struct Dispatcher {
    round: Round,
    queue: SqsQueue,
    batch: usize,
    idle: Duration,
    sent: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    due: Arc<dyn TaskStore>,
    republished: Arc<AtomicU64>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher from `outbox` (`PgStore`, `DynamoStore`) to `queue`,
    /// `batch` handoffs per round (`1..=1000`), waiting a second after a
    /// round that found nothing. Due tasks are read from `outbox` too
    /// (see [`due_from`](Self::due_from)).
    ///
    /// ```no_run
    /// # fn f(store: taskfence::DynamoStore, queue: taskfence_sqs::SqsQueue) {
    /// let dispatcher = taskfence_sqs::Dispatcher::new(store, queue, 100);
    /// # }
    /// ```
    pub fn new<O>(outbox: O, queue: SqsQueue, batch: usize) -> Self
    where
        O: Outbox + TaskStore + Clone + 'static,
    {
        let due: Arc<dyn TaskStore> = Arc::new(outbox.clone());
        let round: Round = Arc::new(move |limit, sender: Sender| {
            let outbox = outbox.clone();
            Box::pin(async move {
                outbox
                    .dispatch_batches(limit, MAX_BATCH, move |stamps| sender.send(stamps))
                    .await
            })
        });
        Self {
            round,
            queue,
            batch,
            idle: Duration::from_secs(1),
            sent: Arc::default(),
            requests: Arc::default(),
            due,
            republished: Arc::default(),
        }
    }

    /// Reads the [`due`](TaskStore::due) tasks of the republish round from
    /// `store` instead: a service passes its instrumented store (say
    /// `taskfence::metrics::Observed`), so the reads and the ids found count
    /// in its metrics. The same tasks as the outbox's store.
    ///
    /// ```no_run
    /// # fn f(dispatcher: taskfence_sqs::Dispatcher, observed: std::sync::Arc<dyn taskfence::TaskStore>) {
    /// let dispatcher = dispatcher.due_from(observed);
    /// # }
    /// ```
    pub fn due_from(mut self, store: Arc<dyn TaskStore>) -> Self {
        self.due = store;
        self
    }

    /// How long [`run`](Self::run) waits after a round that found nothing to
    /// publish (or failed): the latency from commit to queue when idle.
    ///
    /// ```no_run
    /// # fn f(dispatcher: taskfence_sqs::Dispatcher) {
    /// let dispatcher = dispatcher.idle(std::time::Duration::from_millis(200));
    /// # }
    /// ```
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// Messages that reached the queue so far (duplicates included).
    ///
    /// ```no_run
    /// # fn f(dispatcher: &taskfence_sqs::Dispatcher) {
    /// println!("{} sent in {} requests", dispatcher.sent(), dispatcher.requests());
    /// # }
    /// ```
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// `SendMessageBatch` requests made so far (failed ones included).
    ///
    /// ```no_run
    /// # fn f(dispatcher: &taskfence_sqs::Dispatcher) {
    /// assert!(dispatcher.requests() * 10 >= dispatcher.sent());
    /// # }
    /// ```
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Due tasks republished so far (duplicates included).
    ///
    /// ```no_run
    /// # fn f(dispatcher: &taskfence_sqs::Dispatcher) {
    /// println!("{} republished", dispatcher.republished());
    /// # }
    /// ```
    pub fn republished(&self) -> u64 {
        self.republished.load(Ordering::Relaxed)
    }

    fn sender(&self, after_send: Option<Hook>) -> Sender {
        Sender {
            queue: self.queue.clone(),
            sent: Arc::clone(&self.sent),
            requests: Arc::clone(&self.requests),
            after_send,
        }
    }

    /// One dispatch round; returns the tasks published and marked. A failed
    /// batch is not an error: it stays pending and the round ends there (an
    /// `Err` is the store failing).
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) -> taskfence_sqs::Result<()> {
    /// let published = dispatcher.round().await?;
    /// # Ok(()) }
    /// ```
    pub async fn round(&self) -> Result<Vec<TaskId>> {
        self.run_round(None).await
    }

    /// One round that asks `after_send(tasks)` once each `SendMessageBatch`
    /// got through: an `Err` is treated like a failed request (the round
    /// stops, those handoffs stay pending and the next round sends them
    /// again). Tests use it to lose the answer to a request that did reach
    /// the queue.
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) -> taskfence_sqs::Result<()> {
    /// let published = dispatcher.round_checked(|_tasks| Err("the answer was lost".into())).await?;
    /// assert!(published.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn round_checked(
        &self,
        after_send: impl Fn(&[TaskId]) -> std::result::Result<(), String> + Send + Sync + 'static,
    ) -> Result<Vec<TaskId>> {
        self.run_round(Some(Arc::new(after_send))).await
    }

    async fn run_round(&self, after_send: Option<Hook>) -> Result<Vec<TaskId>> {
        let round = (self.round)(self.batch, self.sender(after_send)).await?;
        if let Some((task_id, error)) = round.failed {
            // That batch stays pending; the next round sends it again.
            tracing::debug!(%task_id, %error, "publishing a batch of handoffs failed");
        }
        Ok(round.published)
    }

    /// One republish round: publishes up to `batch` tasks that are
    /// [`due`](TaskStore::due), ten per `SendMessageBatch`, and returns
    /// them. A failed request stops the round: the rest stay due and go
    /// next round. A task stays due until a worker claims it, so one still
    /// waiting for its (hidden or queued) message may be sent twice: the
    /// claim makes the copy harmless.
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) -> taskfence_sqs::Result<()> {
    /// let republished = dispatcher.republish_round().await?;
    /// # Ok(()) }
    /// ```
    pub async fn republish_round(&self) -> Result<Vec<TaskId>> {
        let due = self.due.due(self.batch).await?;
        // Each with its version for the stamp (a task purged meanwhile is skipped).
        let mut stamps = Vec::with_capacity(due.len());
        for task_id in due {
            if let Some(task) = self.due.get(task_id).await? {
                stamps.push(Stamp::from(&task));
            }
        }
        let sender = self.sender(None);
        let mut published = Vec::with_capacity(stamps.len());
        for chunk in stamps.chunks(MAX_BATCH) {
            if let Err(error) = sender.send(chunk.to_vec()).await {
                // They stay due: the next round sends them again.
                tracing::debug!(%error, "republishing due tasks failed");
                break;
            }
            published.extend(chunk.iter().map(|stamp| stamp.task_id));
        }
        self.republished
            .fetch_add(published.len() as u64, Ordering::Relaxed);
        Ok(published)
    }

    /// Runs [`republish_round`](Self::republish_round) every `every` until
    /// `shutdown` turns true (a full round goes again at once).
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) {
    /// let (_shutdown, stopping) = tokio::sync::watch::channel(false);
    /// dispatcher.run_republish(std::time::Duration::from_secs(30), stopping).await;
    /// # }
    /// ```
    pub async fn run_republish(self, every: Duration, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let wait = match self.republish_round().await {
                Ok(published) if published.len() >= self.batch => Duration::ZERO,
                Ok(published) => {
                    if !published.is_empty() {
                        tracing::info!(tasks = published.len(), "republished due tasks");
                    }
                    every
                }
                Err(error) => {
                    tracing::warn!(%error, "republish round failed");
                    every
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
    }

    /// Runs dispatch rounds until `shutdown` turns true; a round in
    /// progress finishes first (a crash inside one only means resends).
    ///
    /// ```no_run
    /// # async fn f(dispatcher: taskfence_sqs::Dispatcher) {
    /// let (_shutdown, stopping) = tokio::sync::watch::channel(false);
    /// dispatcher.run(stopping).await;
    /// # }
    /// ```
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let idle = self.idle;
        while !*shutdown.borrow() {
            let wait = match self.round().await {
                Ok(published) if !published.is_empty() => Duration::ZERO,
                Ok(_) => idle,
                Err(error) => {
                    tracing::warn!(%error, "dispatch round failed");
                    idle
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
    }
}
