//! [`SqsWorker`]: taskfence's [`Consumer`] on an [`SqsSource`], with the
//! source's SQS calls sent beside it and a stop bounded however slow SQS is.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use taskfence::error::InvalidInput;
use taskfence::runtime::{Consumer, ConsumerConfig, Stop, Stopped, WorkContext};
use taskfence::{Failure, Response, TaskStore};

use crate::config::WorkerConfig;
use crate::queue::SqsQueue;
use crate::source::{Calls, SqsSource, Stats, send_actions};

/// An SQS worker: a taskfence [`Consumer`] of an [`SqsSource`].
///
/// The consumer claims each receive in one `claim_many`, renews the leases
/// (each renewal extends the messages' visibility), saves the responses and
/// stops gracefully; the source turns what became of each message into SQS
/// calls, sent ten per batch request from a task of their own.
///
/// It claims only what it can start now (no prefetch): a claim is an
/// attempt of the task's retry budget, and an idle worker elsewhere could
/// take the message instead.
///
/// ```no_run
/// # async fn f(queue: taskfence_sqs::SqsQueue, store: std::sync::Arc<dyn taskfence::TaskStore>) -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::Response;
/// let worker = taskfence_sqs::SqsWorker::new(queue, store, "worker-1", Duration::from_secs(30), &Default::default())?;
/// tokio::spawn(worker.stop().clone().on_signals());
/// let stopped = worker
///     .run(|ctx| async move { Ok(Response::from(format!("{} bytes", ctx.task().payload.len()))) })
///     .await?;
/// # Ok(()) }
/// ```
pub struct SqsWorker {
    consumer: Consumer<SqsSource>,
    calls: Calls,
    stats: Arc<Stats>,
    stop_within: Duration,
}

impl std::fmt::Debug for SqsWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsWorker")
            .field("source", self.consumer.source())
            .field("stop_within", &self.stop_within)
            .finish_non_exhaustive()
    }
}

impl SqsWorker {
    /// A worker `worker_id` consuming `queue`, holding leases of `lease` on
    /// the tasks of `store` (any [`TaskStore`]: `PgStore`, `DynamoStore`, or
    /// either wrapped in interceptors). Fails on settings the consumer
    /// refuses (a zero concurrency, a lease too short to renew).
    ///
    /// ```no_run
    /// # fn f(queue: taskfence_sqs::SqsQueue, store: taskfence::PgStore) -> Result<(), taskfence::error::InvalidInput> {
    /// let worker = taskfence_sqs::SqsWorker::new(
    ///     queue,
    ///     std::sync::Arc::new(store),
    ///     "worker-1",
    ///     std::time::Duration::from_secs(30),
    ///     &taskfence_sqs::WorkerConfig { concurrency: 16, ..Default::default() },
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn new(
        queue: SqsQueue,
        store: Arc<dyn TaskStore>,
        worker_id: impl Into<String>,
        lease: Duration,
        config: &WorkerConfig,
    ) -> Result<Self, InvalidInput> {
        Self::sharing_stats(queue, store, worker_id, lease, config, Arc::default())
    }

    /// [`new`](Self::new), counting into `stats`: the workers of a fleet
    /// (or of one process) sharing one.
    ///
    /// ```no_run
    /// # fn f(queue: taskfence_sqs::SqsQueue, store: std::sync::Arc<dyn taskfence::TaskStore>) -> Result<(), taskfence::error::InvalidInput> {
    /// let fleet = std::sync::Arc::new(taskfence_sqs::Stats::default());
    /// let lease = std::time::Duration::from_secs(30);
    /// let worker = taskfence_sqs::SqsWorker::sharing_stats(queue, store, "w-1", lease, &Default::default(), fleet)?;
    /// # Ok(()) }
    /// ```
    pub fn sharing_stats(
        queue: SqsQueue,
        store: Arc<dyn TaskStore>,
        worker_id: impl Into<String>,
        lease: Duration,
        config: &WorkerConfig,
        stats: Arc<Stats>,
    ) -> Result<Self, InvalidInput> {
        let consumer_config = ConsumerConfig::new(worker_id, lease)
            .concurrency(config.concurrency)
            // Claim only what can start now: a claim is an attempt of the
            // task's budget, and an idle worker elsewhere could take it.
            .prefetch(0)
            .stop_after(config.shutdown_grace, config.release_deadline);
        let (source, calls) = SqsSource::new(queue, config, Arc::clone(&stats));
        let store = source.watch_releases(store);
        Ok(Self {
            consumer: Consumer::new(store, source, consumer_config)?,
            calls,
            stats,
            stop_within: config.stop_within(),
        })
    }

    /// Uses `stop` as the worker's stop switch: one made before anything
    /// slow, so a signal during start-up is not lost.
    ///
    /// ```no_run
    /// # fn f(worker: taskfence_sqs::SqsWorker) {
    /// let stop = taskfence::runtime::Stop::new();
    /// tokio::spawn(stop.clone().on_signals());
    /// // … connect, migrate, build the worker …
    /// let worker = worker.with_stop(stop);
    /// # }
    /// ```
    pub fn with_stop(mut self, stop: Stop) -> Self {
        self.consumer = self.consumer.with_stop(stop);
        self
    }

    /// What the worker counted.
    ///
    /// ```no_run
    /// # fn f(worker: &taskfence_sqs::SqsWorker) {
    /// let stats = std::sync::Arc::clone(worker.stats());
    /// # }
    /// ```
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The stop switch: the first [`Stop::request`] stops receiving and lets
    /// the work in hand finish within the grace, then releases what remains;
    /// a second one releases at once.
    ///
    /// ```no_run
    /// # fn f(worker: &taskfence_sqs::SqsWorker) {
    /// tokio::spawn(worker.stop().clone().on_signals());
    /// # }
    /// ```
    pub fn stop(&self) -> &Stop {
        self.consumer.stop()
    }

    /// Runs `work` on every task it acquires until stopped, then returns
    /// within `shutdown_grace + release_deadline` of the stop request: the
    /// last SQS calls are sent if SQS answers in time (else those messages
    /// come back on their own). Dropping the future instead abandons the
    /// work in hand mid-flight (the messages come back after the lease).
    ///
    /// ```no_run
    /// # async fn f(worker: taskfence_sqs::SqsWorker) -> taskfence::Result<()> {
    /// let stopped = worker.run(|ctx| async move { Ok(taskfence::Response::from("done")) }).await?;
    /// println!("{stopped:?}");
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut>(self, work: F) -> taskfence::Result<Stopped>
    where
        F: Fn(WorkContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response, Failure>> + Send + 'static,
    {
        let Self {
            consumer,
            calls,
            stop_within,
            ..
        } = self;
        let stop = consumer.stop().clone();
        let Calls {
            queue,
            actions,
            stats,
            stopping,
        } = calls;
        let mut sending = tokio::spawn(send_actions(queue, actions, stats));
        let run = consumer.run(work);
        tokio::pin!(run);
        let stop_by = tokio::select! {
            stopped = &mut run => return stopped,
            () = stop.requested() => tokio::time::Instant::now() + stop_within,
        };
        // The consumer lets a fetch in flight finish; a long poll through a
        // slow SQS could outlast the grace, so it is abandoned.
        let _ = stopping.send(true);
        let stopped = run.await;
        // The consumer is gone with its source: the last calls go out, then `sending` ends.
        if tokio::time::timeout_at(stop_by, &mut sending).await.is_err() {
            sending.abort();
            tracing::warn!(
                "the last SQS calls did not finish in time; those messages come back on their own"
            );
        }
        stopped
    }
}
