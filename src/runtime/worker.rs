//! [`Worker`]: runs one queue delivery through the task protocol — claim,
//! keep the lease alive, work, complete or fail — and says what to do with
//! the message.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::Instrument;

use super::disposition::{rejected, retry_at, settled, terminal_ack};
use super::failure::panic_failure;
use super::{AckReason, Disposition, LeaseHooks, LeaveReason, RetryReason, WorkContext, WorkerConfig};
use crate::clock::{Clock, SystemClock};
use crate::error::InvalidInput;
use crate::error::Result;
use crate::policy::Failure;
use crate::store::{ClaimRequest, Fenced, Lease, Rejection, Retry, TaskStore};
use crate::task::{Response, TaskId};

/// Runs queue deliveries through the task protocol. Cheap to clone; one per
/// process is enough, [`handle`](Worker::handle) calls run concurrently.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use taskfence::runtime::{Worker, WorkerConfig};
/// use taskfence::MemoryStore;
/// use taskfence::error::InvalidInput;
/// let store = Arc::new(MemoryStore::new());
/// assert!(Worker::new(store.clone(), WorkerConfig::new("w", Duration::from_secs(30))).is_ok());
/// let bad = Worker::new(store, WorkerConfig::new("", Duration::from_secs(30)));
/// assert!(matches!(bad, Err(InvalidInput::Blank { field: "worker" })));
/// ```
#[derive(Clone)]
pub struct Worker {
    store: Arc<dyn TaskStore>,
    config: Arc<WorkerConfig>,
    clock: Arc<dyn Clock>,
}

impl Worker {
    /// A worker on `store`, after checking `config`.
    pub fn new(store: Arc<dyn TaskStore>, config: WorkerConfig) -> Result<Self, InvalidInput> {
        config.validate()?;
        Ok(Self {
            store,
            config: Arc::new(config),
            clock: Arc::new(SystemClock),
        })
    }

    /// Uses `clock` to turn the store's instants (lease expiry, backoff) into
    /// delays, and to notice an unreachable store outliving the lease. It is the
    /// *worker's* clock: skew only shifts those delays, never a safety decision,
    /// which the store makes on its own clock. Tests pass a manual clock.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use taskfence::{clock::ManualClock, error::InvalidInput, runtime::*, *};
    /// let clock = ManualClock::default();
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let worker = Worker::new(store, WorkerConfig::new("w", Duration::from_secs(30)))?.with_clock(clock);
    /// # Ok::<(), InvalidInput>(())
    /// ```
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The configuration in force.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use taskfence::{error::InvalidInput, runtime::*, *};
    /// let worker = Worker::new(Arc::new(MemoryStore::new()), WorkerConfig::new("w", Duration::from_secs(30)))?;
    /// assert_eq!(worker.config().worker_id, "w");
    /// # Ok::<(), InvalidInput>(())
    /// ```
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Handles one delivery of `task_id`: claim, keep the lease alive while
    /// `work` runs, complete or fail, and say what to do with the message.
    ///
    /// `work` is called only when this call acquired the task. It returns the
    /// response to save, or a [`Failure`] for the task's retry policy to judge.
    /// A panic in `work` (in the call or in its future) is a retryable
    /// failure, recorded under the lease like any other.
    ///
    /// An `Err` means the store failed at some step (or the input was invalid,
    /// e.g. a failure message over the limit): treat it like
    /// [`Disposition::Leave`]. Nothing is lost: the next delivery reads the
    /// durable task, which says whether the write happened.
    ///
    /// Dropping the returned future (a worker shutting down hard) abandons the
    /// lease; it expires and another delivery takes over, counting an attempt.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # use std::{sync::Arc, time::Duration};
    /// use taskfence::runtime::{Disposition, RetryReason, Worker, WorkerConfig};
    /// use taskfence::*;
    /// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    /// let policy = RetryPolicy::default().jitter(0.0).initial_backoff(Duration::from_secs(8));
    /// let task = store
    ///     .submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])).policy(policy))
    ///     .await?
    ///     .into_task();
    /// let worker = Worker::new(store, WorkerConfig::new("w", Duration::from_secs(30)))?;
    /// let d = worker
    ///     .handle(task.id, &(), |_ctx| async { Err(Failure::retryable("provider returned 503")) })
    ///     .await?;
    /// let Disposition::RetryAfter { delay, reason } = d else { panic!("{d:?}") };
    /// assert_eq!(reason, RetryReason::Scheduled { attempts_left: 4 });
    /// assert!(delay <= Duration::from_secs(8));
    /// # Ok(()) }
    /// ```
    pub async fn handle<H, F, Fut>(&self, task_id: TaskId, hooks: &H, work: F) -> Result<Disposition>
    where
        H: LeaseHooks + ?Sized,
        F: FnOnce(WorkContext) -> Fut,
        Fut: Future<Output = std::result::Result<Response, Failure>>,
    {
        let claim = self.store.claim(task_id, self.claim_request()).await?;
        match settled(claim, |at, reason| self.retry_at(at, reason)) {
            Ok(disposition) => Ok(disposition),
            Err(lease) => self.work_on(lease, hooks, work).await,
        }
    }

    /// Handles a batch of deliveries (an SQS receive, a Kafka poll): one
    /// [`claim_many`](TaskStore::claim_many) for all of them, then `work` for
    /// every task this call acquired, side by side, each with its own lease
    /// renewal and its own completion as soon as it finishes. The answers are
    /// in the order of `task_ids`, each exactly what [`handle`](Self::handle)
    /// would have answered for that delivery.
    ///
    /// Task ids must be distinct (a queue may deliver one twice in a batch:
    /// handle the copy on its own, or acknowledge it after the first).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # use std::{sync::Arc, time::Duration};
    /// use taskfence::runtime::{AckReason, Disposition, Worker, WorkerConfig};
    /// use taskfence::*;
    /// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    /// let mut ids = Vec::new();
    /// for k in ["a", "b", "c"] {
    ///     let new = NewTask::new(RequestKey::new("u", "op", k), InputHash::of([k]));
    ///     ids.push(store.submit(new).await?.into_task().id);
    /// }
    /// let worker = Worker::new(store, WorkerConfig::new("w", Duration::from_secs(30)))?;
    /// let answers = worker
    ///     .handle_batch(&ids, &(), |ctx| async move { Ok(Response::from(ctx.task().key.key.clone())) })
    ///     .await?;
    /// assert!(answers.iter().all(|d| *d == Disposition::Ack(AckReason::Completed)));
    /// # Ok(()) }
    /// ```
    pub async fn handle_batch<H, F, Fut>(
        &self,
        task_ids: &[TaskId],
        hooks: &H,
        work: F,
    ) -> Result<Vec<Disposition>>
    where
        H: LeaseHooks + ?Sized,
        F: Fn(WorkContext) -> Fut,
        Fut: Future<Output = std::result::Result<Response, Failure>>,
    {
        let mut answers: Vec<Option<Result<Disposition>>> = task_ids.iter().map(|_| None).collect();
        self.handle_batch_each(task_ids, hooks, work, |i, answer| answers[i] = Some(answer))
            .await?;
        answers
            .into_iter()
            .map(|answer| answer.expect("every delivery of the batch settles"))
            .collect()
    }

    /// [`handle_batch`](Self::handle_batch), telling `on_settled` what to do
    /// with each delivery *as soon as it settles* — `(index in task_ids,
    /// answer)` — rather than once the whole batch has: a queue adapter can
    /// delete a finished message while a slow batch-mate still works, and put
    /// a busy one back at once. An answer is `Err` when the store failed for
    /// that delivery (treat it as [`Disposition::Leave`]). The call itself
    /// fails only when the batch could not be claimed; then `on_settled` is
    /// never called.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// # use std::{sync::Arc, time::Duration};
    /// use taskfence::runtime::{Worker, WorkerConfig};
    /// use taskfence::*;
    /// let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    /// let new = NewTask::new(RequestKey::new("u", "op", "a"), InputHash::of(["a"]));
    /// let ids = [store.submit(new).await?.into_task().id];
    /// let worker = Worker::new(store, WorkerConfig::new("w", Duration::from_secs(30)))?;
    /// let mut settled = Vec::new();
    /// worker
    ///     .handle_batch_each(&ids, &(), |_ctx| async { Ok(Response::from("hi")) }, |i, answer| {
    ///         settled.push((i, answer)); // e.g. delete message `i` now
    ///     })
    ///     .await?;
    /// assert!(settled[0].1.as_ref().is_ok_and(|d| d.is_ack()));
    /// # Ok(()) }
    /// ```
    pub async fn handle_batch_each<H, F, Fut, S>(
        &self,
        task_ids: &[TaskId],
        hooks: &H,
        work: F,
        mut on_settled: S,
    ) -> Result<()>
    where
        H: LeaseHooks + ?Sized,
        F: Fn(WorkContext) -> Fut,
        Fut: Future<Output = std::result::Result<Response, Failure>>,
        S: FnMut(usize, Result<Disposition>),
    {
        use futures_util::StreamExt as _;
        let claims = self.store.claim_many(task_ids, self.claim_request()).await?;
        let mut runs: futures_util::stream::FuturesUnordered<_> = claims
            .into_iter()
            .enumerate()
            .map(|(i, claim)| {
                let work = &work;
                async move {
                    let answer = match settled(claim, |at, reason| self.retry_at(at, reason)) {
                        Ok(disposition) => Ok(disposition),
                        Err(lease) => self.work_on(lease, hooks, work).await,
                    };
                    (i, answer)
                }
            })
            .collect();
        while let Some((i, answer)) = runs.next().await {
            on_settled(i, answer);
        }
        Ok(())
    }

    fn claim_request(&self) -> ClaimRequest {
        ClaimRequest::new(self.config.worker_id.clone(), self.config.lease_duration)
    }

    /// The protocol once the task is acquired: keep the lease alive while
    /// `work` runs, then complete or fail.
    async fn work_on<H, F, Fut>(&self, lease: Lease, hooks: &H, work: F) -> Result<Disposition>
    where
        H: LeaseHooks + ?Sized,
        F: FnOnce(WorkContext) -> Fut,
        Fut: Future<Output = std::result::Result<Response, Failure>>,
    {
        let span = crate::trace::process_span(&lease);
        let answer = self
            .work_in_span(lease, hooks, work, &span)
            .instrument(span.clone())
            .await;
        if answer.is_err() {
            crate::trace::record_error(&span, "store_error");
        }
        answer
    }

    /// [`work_on`](Self::work_on) inside the task's `process` span, which it marks with the outcome.
    async fn work_in_span<H, F, Fut>(
        &self,
        mut lease: Lease,
        hooks: &H,
        work: F,
        span: &tracing::Span,
    ) -> Result<Disposition>
    where
        H: LeaseHooks + ?Sized,
        F: FnOnce(WorkContext) -> Fut,
        Fut: Future<Output = std::result::Result<Response, Failure>>,
    {
        let task_id = lease.task_id();
        tracing::debug!(%task_id, version = lease.version(), "claimed");
        hooks.on_claimed(&lease).await;

        let (lost_tx, lost_rx) = watch::channel(false);
        let ctx = WorkContext {
            store: Arc::clone(&self.store),
            lease: lease.clone(),
            lost: lost_rx,
        };
        // A panic of the work function, in the call or in its future, is a
        // retryable failure like any other, reported under the lease.
        let work = async move {
            let called = std::panic::catch_unwind(AssertUnwindSafe(move || work(ctx)));
            let returned = match called {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(payload) => Err(payload),
            };
            returned.unwrap_or_else(|payload| Err(panic_failure(payload)))
        };
        tokio::pin!(work);
        let outcome = tokio::select! {
            biased;
            result = &mut work => Ok(result),
            loss = self.keep_alive(&mut lease, hooks) => Err(loss),
        };
        let result = match outcome {
            Ok(result) => result,
            Err(loss) => {
                tracing::info!(%task_id, version = lease.version(), ?loss, "lease lost while working");
                crate::trace::record_error(span, "lease_lost");
                let _ = lost_tx.send(true);
                if tokio::time::timeout(self.config.stop_grace, &mut work)
                    .await
                    .is_err()
                {
                    tracing::warn!(%task_id, "work ignored the lease-lost signal; dropped after the grace");
                }
                return Ok(match loss {
                    Some(rejection) => terminal_ack(&rejection)
                        .unwrap_or(Disposition::Leave(LeaveReason::LeaseLost(Some(rejection)))),
                    None => Disposition::Leave(LeaveReason::LeaseLost(None)),
                });
            }
        };

        if let Err(failure) = &result {
            crate::trace::record_error(span, failure.kind.as_str());
        }
        match result {
            Ok(response) => Ok(match self.store.complete(lease, response).await? {
                Fenced::Accepted(_) => {
                    crate::trace::record_ok(span);
                    Disposition::Ack(AckReason::Completed)
                }
                Fenced::Rejected(rejection) => {
                    crate::trace::record_error(span, "refused");
                    rejected(rejection)
                }
            }),
            Err(failure) => Ok({
                super::failure::drain_bucket(&*self.store, &lease, &failure).await;
                match self.store.fail(lease, failure).await? {
                    Fenced::Accepted(Retry::Scheduled {
                        not_before,
                        attempts_left,
                    }) => self.retry_at(not_before, RetryReason::Scheduled { attempts_left }),
                    Fenced::Accepted(Retry::Exhausted(_)) => Disposition::Ack(AckReason::Failed),
                    Fenced::Rejected(rejection) => rejected(rejection),
                }
            }),
        }
    }

    /// Renews `lease` until a renewal is refused (`Some(rejection)`) or the
    /// store stays unreachable past the lease's expiry (`None`). Never returns
    /// while the lease is held; the caller drops it when the work is done.
    async fn keep_alive<H: LeaseHooks + ?Sized>(&self, lease: &mut Lease, hooks: &H) -> Option<Rejection> {
        let every = self.config.renew_every;
        loop {
            tokio::time::sleep(every).await;
            match tokio::time::timeout(every, self.store.renew(lease, self.config.lease_duration)).await {
                Ok(Ok(Fenced::Accepted(()))) => hooks.on_renewed(lease).await,
                Ok(Ok(Fenced::Rejected(rejection))) => return Some(rejection),
                Ok(Err(error)) => {
                    tracing::warn!(task_id = %lease.task_id(), %error, "lease renewal failed");
                }
                Err(_) => tracing::warn!(task_id = %lease.task_id(), "lease renewal timed out"),
            }
            if self.clock.now() >= lease.expires_at() {
                return None;
            }
        }
    }

    /// A redelivery at `at` (store clock), as a delay on the worker's clock.
    fn retry_at(&self, at: OffsetDateTime, reason: RetryReason) -> Disposition {
        retry_at(&*self.clock, self.config.min_retry_delay, at, reason)
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
