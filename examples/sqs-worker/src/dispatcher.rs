//! The dispatcher: publishes the handoffs that `submit` wrote to the outbox
//! in the same transaction as the task (taskfence's, on PostgreSQL and on
//! DynamoDB alike), so an accepted request can never
//! be lost between the database and the queue; and republishes the tasks
//! that need a worker again ([`Dispatcher::republish_round`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskfence::metrics::observe;
use taskfence::republish::republish_due;
use taskfence::wire::Stamp;
use taskfence::{DynamoStore, PgStore, TaskId, TaskStore};
use tokio::sync::watch;

use crate::queue::{BoxError, MAX_BATCH, SqsQueue};

/// Where the handoffs wait.
#[derive(Debug, Clone)]
enum Outbox {
    Postgres(PgStore),
    Dynamo(DynamoStore),
}

/// Moves pending handoffs from the outbox to the queue.
///
/// On PostgreSQL ([`new`](Self::new)) each round claims up to `batch` handoffs with `FOR UPDATE SKIP LOCKED` (so
/// several dispatchers share the outbox), sends them ten per `SendMessageBatch`
/// ([`PgStore::dispatch_batches`]), and marks the sent ones published in the
/// same transaction. A request with any failed entry counts as failed whole:
/// the round stops there and all ten stay pending, also the ones SQS accepted.
/// A send whose answer is lost, a partly failed request, or a crash after
/// sending and before the commit sends them again next round: the queue sees
/// duplicates, every copy names the same task, and the claim makes them harmless.
///
/// On DynamoDB ([`dynamodb`](Self::dynamodb)) the round is
/// [`DynamoStore::dispatch_batches`]: up to `batch` pending handoff items
/// (oldest first), ten per `SendMessageBatch`, each batch marked published
/// once it got through; a request with any failed entry stops the round and
/// its ten stay pending. There is no row lock to skip: two dispatchers on
/// one table may both send a handoff, a duplicate like any other.
///
/// It also republishes ([`republish_round`](Self::republish_round),
/// [`run_republish`](Self::run_republish)): tasks that are
/// [`due`](TaskStore::due) — a backoff that passed, a lease that expired,
/// a task an operator reopened with `reopen` — get a new message. The queue
/// already redelivers most of them (a failed attempt's message stays hidden
/// until its backoff ends, a crashed worker's until its lease ends); this
/// loop covers the ones whose message is gone: deleted after a terminal
/// failure and then reopened, dead-lettered, expired, purged.
#[derive(Clone)]
pub struct Dispatcher {
    outbox: Outbox,
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
            .field("outbox", &self.outbox)
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher from `store`'s outbox to `queue`, `batch` handoffs per
    /// round, waiting a second after a round that found nothing.
    pub fn new(store: PgStore, queue: SqsQueue, batch: usize) -> Self {
        Self::on(Outbox::Postgres(store), queue, batch)
    }

    /// A dispatcher from `store`'s outbox on DynamoDB to `queue`, `batch`
    /// handoffs per round, waiting a second after a round that found nothing.
    pub fn dynamodb(store: DynamoStore, queue: SqsQueue, batch: usize) -> Self {
        Self::on(Outbox::Dynamo(store), queue, batch)
    }

    fn on(outbox: Outbox, queue: SqsQueue, batch: usize) -> Self {
        let due: Arc<dyn TaskStore> = match &outbox {
            Outbox::Postgres(store) => Arc::new(store.clone()),
            Outbox::Dynamo(store) => Arc::new(store.clone()),
        };
        Self {
            outbox,
            queue,
            batch,
            idle: Duration::from_secs(1),
            sent: Arc::default(),
            requests: Arc::default(),
            due,
            republished: Arc::default(),
        }
    }

    /// The store the DynamoDB republish round reads [`due`](TaskStore::due)
    /// from: the service passes its instrumented store, so the reads and
    /// the ids count in the metrics. The same tasks as the outbox's store.
    /// (On PostgreSQL the round is [`republish_due`] on the observed store.)
    pub fn due_from(mut self, store: Arc<dyn TaskStore>) -> Self {
        self.due = store;
        self
    }

    /// Due tasks re-published so far (duplicates included).
    pub fn republished(&self) -> u64 {
        self.republished.load(Ordering::Relaxed)
    }

    /// How long [`run`](Self::run) waits after a round that found nothing to
    /// publish (or failed): the latency from commit to queue when idle.
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// Messages that reached the queue so far (duplicates included).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// `SendMessageBatch` requests made so far (failed ones included).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// One round; returns the tasks published and marked.
    pub async fn round(&self) -> Result<Vec<TaskId>, BoxError> {
        self.round_checked(|_| Ok(())).await
    }

    /// One round that asks `after_send(tasks)` once each `SendMessageBatch`
    /// got through: an `Err` is treated like a failed request (the round
    /// stops, those handoffs stay pending and the next round sends them
    /// again). The tests use it to lose the answer to a request that did
    /// reach the queue.
    pub async fn round_checked(
        &self,
        after_send: impl Fn(&[TaskId]) -> Result<(), BoxError> + Send + Sync,
    ) -> Result<Vec<TaskId>, BoxError> {
        let after_send = &after_send;
        let publish = |stamps: Vec<Stamp>| {
            let queue = self.queue.clone();
            let (sent, requests) = (Arc::clone(&self.sent), Arc::clone(&self.requests));
            async move {
                requests.fetch_add(1, Ordering::Relaxed);
                let batch = queue.publish_batch(&stamps).await?;
                let tasks: Vec<TaskId> = stamps.iter().map(|stamp| stamp.task_id).collect();
                sent.fetch_add(batch.sent as u64, Ordering::Relaxed);
                if !batch.failed.is_empty() {
                    // Partly sent: the whole batch stays pending and goes
                    // again next round (duplicates are harmless).
                    return Err(format!(
                        "{} of {} messages refused: {:?}",
                        batch.failed.len(),
                        tasks.len(),
                        batch.failed
                    )
                    .into());
                }
                after_send(&tasks)
            }
        };
        let round = match &self.outbox {
            Outbox::Postgres(store) => store.dispatch_batches(self.batch, MAX_BATCH, publish).await?,
            Outbox::Dynamo(store) => store.dispatch_batches(self.batch, MAX_BATCH, publish).await?,
        };
        if let Some((task_id, error)) = round.failed {
            // That batch stays pending; the next round sends it again.
            tracing::debug!(%task_id, %error, "publishing a batch of handoffs failed");
        }
        Ok(round.published)
    }

    /// One republish round: publishes up to `batch` tasks that are
    /// [`due`](TaskStore::due) and returns them. On PostgreSQL it is
    /// [`republish_due`] (one `SendMessage` per task); on DynamoDB,
    /// `due` then ten per `SendMessageBatch`. A failed send stops the round:
    /// the rest stay due and go next round. A task stays due until a worker
    /// claims it, so one still waiting for its (hidden or queued) message
    /// may be sent twice: the claim makes the copy harmless.
    pub async fn republish_round(&self) -> Result<Vec<TaskId>, BoxError> {
        let published = match &self.outbox {
            Outbox::Postgres(store) => {
                // Through the wrapper, so the metrics see what it re-published.
                let round = republish_due(&observe(store.clone()), self.batch, |stamp| {
                    let queue = self.queue.clone();
                    async move { queue.publish(stamp).await }
                })
                .await?;
                if let Some((task_id, error)) = round.failed {
                    tracing::debug!(%task_id, %error, "re-publishing a due task failed");
                }
                round.published
            }
            Outbox::Dynamo(_) => {
                let due = self.due.due(self.batch).await?;
                // Each with its version for the stamp (a task purged
                // meanwhile is skipped), as `republish_due` reads it.
                let mut stamps = Vec::with_capacity(due.len());
                for task_id in due {
                    if let Some(task) = self.due.get(task_id).await? {
                        stamps.push(Stamp::from(&task));
                    }
                }
                let mut published = Vec::with_capacity(stamps.len());
                for chunk in stamps.chunks(MAX_BATCH) {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    let batch = self.queue.publish_batch(chunk).await?;
                    if !batch.failed.is_empty() {
                        // They stay due: the next round sends them again.
                        tracing::debug!(failed = ?batch.failed, "re-publishing due tasks failed");
                        break;
                    }
                    published.extend(chunk.iter().map(|stamp| stamp.task_id));
                }
                published
            }
        };
        self.republished
            .fetch_add(published.len() as u64, Ordering::Relaxed);
        Ok(published)
    }

    /// Runs [`republish_round`](Self::republish_round) every `every` until
    /// `shutdown` turns true (a full round goes again at once).
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

    /// Runs rounds until `shutdown` turns true; a round in progress finishes
    /// first (it is one transaction, and a crash inside it only means resends).
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
