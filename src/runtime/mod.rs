//! The worker runtime, at two levels:
//!
//! - [`Consumer`] is the whole worker loop: it fetches from a [`Source`]
//!   (the store itself, [`StoreQueue`], or a broker whose messages name task
//!   ids), runs the work function with a concurrency limit, renews what it
//!   holds in one request, group-commits completions and stops within a
//!   bound (see its docs and `examples/pg-worker`).
//! - [`Worker`] handles one delivery, for an adapter that keeps its own loop:
//!   give it a task id from any queue message, it runs the whole protocol
//!   and tells the adapter what to do with the message. The consumer runs
//!   each task by the same steps.
//!
//! A queue delivers "go work on task X" at least once; [`Worker::handle`] makes
//! every delivery safe:
//!
//! 1. **Claim.** A completed, failed or cancelled task is acknowledged without
//!    calling the work function (guarantee 6: done means done). A task held by
//!    a live lease, or waiting out a backoff, is retried after that wait.
//! 2. **Keep the lease alive.** While the work runs, a background loop renews
//!    the lease every [`WorkerConfig::renew_every`] (a third of the lease by
//!    default, so one slow renewal never lets it lapse) and calls
//!    [`LeaseHooks::on_renewed`], where the adapter extends its *own* message
//!    timer (an SQS visibility timeout, say). The two timers are different
//!    things: the lease is the right to work on the task, the message timer
//!    only hides the message from other consumers.
//! 3. **Signal loss.** If a renewal is refused (another worker took over after
//!    a pause, the task was cancelled…) or the store stays unreachable past the
//!    lease's expiry, [`WorkContext::lease_lost`] resolves; the work function
//!    should stop. After [`WorkerConfig::stop_grace`] the runtime drops it.
//! 4. **Complete or fail.** A response is saved by one fenced write; a failure
//!    goes to the task's [`RetryPolicy`](crate::RetryPolicy), stored with the
//!    task so a redelivery never resets the budget.
//!
//! The answer is one [`Disposition`]: [`Ack`](Disposition::Ack) (delete the
//! message: done, or terminal), [`RetryAfter`](Disposition::RetryAfter) (make
//! the message visible again after the delay: backoff, or another live lease),
//! or [`Leave`](Disposition::Leave) (do nothing: the lease was lost, the
//! message timer will bring the message back and the next claim decides).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use taskfence::runtime::{AckReason, Disposition, Worker, WorkerConfig};
//! use taskfence::*;
//!
//! let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
//! let task = store
//!     .submit(NewTask::new(RequestKey::new("user-1", "chat.reply", "req-1"), InputHash::of(["msg-1"])))
//!     .await?
//!     .into_task();
//! let worker = Worker::new(store, WorkerConfig::new("worker-a", Duration::from_secs(30)))?;
//!
//! // The queue adapter parsed `task.id` out of a message.
//! let disposition = worker
//!     .handle(task.id, &(), |ctx| async move {
//!         // call the provider here; stop early if `ctx.lease_lost()` resolves
//!         let _payload = ctx.task().payload.clone();
//!         Ok(Response::from("the one saved reply"))
//!     })
//!     .await?;
//! assert_eq!(disposition, Disposition::Ack(AckReason::Completed));
//!
//! // The same message delivered again: acknowledged, the work is not called.
//! let again = worker.handle(task.id, &(), |_ctx| async { unreachable!("done means done") }).await?;
//! assert_eq!(again, Disposition::Ack(AckReason::AlreadyCompleted));
//! # Ok(()) }
//! ```

mod commit;
mod consumer;
mod held;
mod source;
mod stop;

pub use consumer::{Consumer, ConsumerConfig, Stopped};
pub use source::{Delivery, Source, StoreQueue, Wake};
pub use stop::Stop;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::Instrument;

use crate::clock::{Clock, SystemClock};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::InvalidInput;
use crate::error::Result;
use crate::policy::Failure;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, Rejection, Retry, TaskStore};
use crate::task::{Response, Status, Task, TaskId};

/// What the queue adapter must do with the message that carried the task id.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::{AckReason, Disposition, RetryReason};
/// fn sqs_action(d: &Disposition) -> String {
///     match d {
///         Disposition::Ack(_) => "DeleteMessage".into(),
///         Disposition::RetryAfter { delay, .. } => format!("ChangeMessageVisibility({}s)", delay.as_secs()),
///         Disposition::Leave(_) => "nothing".into(),
///     }
/// }
/// let d = Disposition::RetryAfter { delay: Duration::from_secs(4), reason: RetryReason::Busy };
/// assert_eq!(sqs_action(&d), "ChangeMessageVisibility(4s)");
/// assert!(Disposition::Ack(AckReason::Completed).is_ack());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Remove the message: the task is done or terminal, so no delivery of it
    /// needs any more work. Only returned after the store durably says so.
    Ack(AckReason),
    /// Keep the message but redeliver it after `delay`: the task is waiting
    /// out a backoff, or another worker holds a live lease on it.
    RetryAfter {
        /// How long until the next claim can succeed (worker clock, at least
        /// [`WorkerConfig::min_retry_delay`]).
        delay: Duration,
        /// Why the task cannot be worked on now.
        reason: RetryReason,
    },
    /// Do nothing with the message: this worker no longer holds the task (or
    /// the store failed to answer). The message timer brings it back, and the
    /// next claim reads the durable task and decides.
    Leave(LeaveReason),
}

impl Disposition {
    /// `true` for [`Disposition::Ack`].
    pub fn is_ack(&self) -> bool {
        matches!(self, Disposition::Ack(_))
    }
}

/// Why a message is acknowledged.
///
/// ```
/// assert_ne!(taskfence::runtime::AckReason::Completed, taskfence::runtime::AckReason::AlreadyCompleted);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AckReason {
    /// This call's response was saved.
    Completed,
    /// The task was already completed when claimed; the work function was not called.
    AlreadyCompleted,
    /// The work ran, but another attempt's response had been saved first (a
    /// renewal or the completion was refused with
    /// [`Rejection::AlreadyCompleted`]).
    CompletedElsewhere,
    /// The task is terminally failed (permanent failure or budget exhausted),
    /// by this attempt or an earlier one.
    Failed,
    /// The task was cancelled.
    Cancelled,
    /// No such task in the store (never submitted, or purged after retention).
    NotFound,
}

/// Why a message is redelivered later.
///
/// ```
/// let r = taskfence::runtime::RetryReason::Scheduled { attempts_left: 2 };
/// assert!(matches!(r, taskfence::runtime::RetryReason::Scheduled { .. }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// Another assignment holds a live lease (a duplicate delivery while it works).
    Busy,
    /// The task is waiting out the backoff of an earlier failed attempt.
    Backoff,
    /// This attempt failed and the policy scheduled another one.
    Scheduled {
        /// Claims still allowed by the budget.
        attempts_left: u32,
    },
    /// A stopping consumer gave the task back (released its lease, or never
    /// started it): another process can take it at once.
    Released,
}

/// Why a message is left alone.
///
/// ```
/// use taskfence::{runtime::LeaveReason, Rejection};
/// let r = LeaveReason::LeaseLost(Some(Rejection::Superseded { current_version: 2 }));
/// assert!(matches!(r, LeaveReason::LeaseLost(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaveReason {
    /// The lease was lost while the work ran: a renewal was refused (with this
    /// rejection), or the store stayed unreachable past the lease's expiry
    /// (`None`). The work was told to stop and its result discarded.
    LeaseLost(Option<Rejection>),
    /// The final write (complete or fail) was refused: the assignment was
    /// superseded or its lease had expired.
    Rejected(Rejection),
    /// The store did not answer a claim, a completion or a failure report:
    /// the durable task decides at the next delivery (if the write happened,
    /// that delivery is acknowledged without work).
    StoreFailed,
}

/// Callbacks at the moments a lease is granted and extended, so the adapter can
/// keep its own message timer in step (for SQS: `ChangeMessageVisibility`).
///
/// They are awaited inline by the renewal loop: keep them short, and let them
/// log their own errors (a failed extension is not fatal: the worst case is a
/// duplicate delivery, which the claim makes harmless). `()` is the no-op.
///
/// ```
/// use async_trait::async_trait;
/// use taskfence::{runtime::LeaseHooks, Lease};
///
/// struct ExtendVisibility;
///
/// #[async_trait]
/// impl LeaseHooks for ExtendVisibility {
///     async fn on_renewed(&self, lease: &Lease) {
///         println!("keep the message hidden past {}", lease.expires_at());
///     }
/// }
/// ```
#[async_trait]
pub trait LeaseHooks: Send + Sync {
    /// The task was claimed: `lease` is the new assignment, before the work starts.
    async fn on_claimed(&self, _lease: &Lease) {}

    /// The lease was renewed: `lease.expires_at()` is the new expiry (store clock).
    async fn on_renewed(&self, _lease: &Lease) {}
}

/// No hooks.
#[async_trait]
impl LeaseHooks for () {}

/// How a [`Worker`] claims and keeps its leases.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::WorkerConfig;
/// let config = WorkerConfig::new("worker-1", Duration::from_secs(30));
/// assert_eq!(config.renew_every, Duration::from_secs(10)); // a third of the lease
/// assert!(config.validate().is_ok());
/// assert!(WorkerConfig::new("worker-1", Duration::from_secs(30)).renew_every(Duration::from_secs(30)).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Recorded with every attempt, for tracing.
    pub worker_id: String,
    /// Lease length asked for at claim and at every renewal (store clock).
    pub lease: Duration,
    /// Renewal interval: shorter than the lease, so a late renewal still lands
    /// in time. Defaults to a third of the lease.
    pub renew_every: Duration,
    /// After the lease is lost, how long the work function may take to notice
    /// [`WorkContext::lease_lost`] and return before it is dropped. Default 5 s.
    pub stop_grace: Duration,
    /// The shortest [`Disposition::RetryAfter`] delay, so that a wait already
    /// over (or clock skew between worker and store) never turns into a hot
    /// redelivery loop. Default 1 s.
    pub min_retry_delay: Duration,
}

impl WorkerConfig {
    /// A config for `worker_id` with leases of `lease`, renewed every third of it.
    pub fn new(worker_id: impl Into<String>, lease: Duration) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease,
            renew_every: lease / 3,
            stop_grace: Duration::from_secs(5),
            min_retry_delay: Duration::from_secs(1),
        }
    }

    /// Sets `renew_every`.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self
    }

    /// Sets `stop_grace`.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets `min_retry_delay`.
    pub fn min_retry_delay(mut self, delay: Duration) -> Self {
        self.min_retry_delay = delay;
        self
    }

    /// Checks the worker id and lease like a claim would, and that renewals
    /// come strictly before the lease runs out.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        ClaimRequest::new(self.worker_id.clone(), self.lease).validate()?;
        crate::limits::check_duration("renew_every", self.renew_every, self.lease)?;
        if self.renew_every >= self.lease {
            return Err(InvalidInput::Inconsistent(
                "renew_every must be shorter than the lease",
            ));
        }
        Ok(())
    }
}

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
        ClaimRequest::new(self.config.worker_id.clone(), self.config.lease)
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
            returned.unwrap_or_else(|payload| Err(consumer::panic_failure(payload)))
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
            Err(failure) => Ok(match self.store.fail(lease, failure).await? {
                Fenced::Accepted(Retry::Scheduled {
                    not_before,
                    attempts_left,
                }) => self.retry_at(not_before, RetryReason::Scheduled { attempts_left }),
                Fenced::Accepted(Retry::Exhausted(_)) => Disposition::Ack(AckReason::Failed),
                Fenced::Rejected(rejection) => rejected(rejection),
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
            match tokio::time::timeout(every, self.store.renew(lease, self.config.lease)).await {
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

/// A redelivery at `at` (store clock) as a delay on `clock`, at least `min`.
pub(crate) fn retry_at(
    clock: &dyn Clock,
    min: Duration,
    at: OffsetDateTime,
    reason: RetryReason,
) -> Disposition {
    let delay = Duration::try_from(at - clock.now()).unwrap_or(Duration::ZERO);
    Disposition::RetryAfter {
        delay: delay.max(min),
        reason,
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

/// A claim that needs no work: `Ok` with what to tell the queue; `Err` with
/// the lease when the task was acquired. `retry_at` turns a store instant into
/// a redelivery.
#[allow(clippy::result_large_err)] // a short-lived return value, matched at once
pub(crate) fn settled(
    claim: Claim,
    retry_at: impl Fn(OffsetDateTime, RetryReason) -> Disposition,
) -> std::result::Result<Disposition, Lease> {
    Ok(match claim {
        Claim::Acquired(lease) => return Err(lease),
        Claim::Completed(_) => Disposition::Ack(AckReason::AlreadyCompleted),
        Claim::Failed(_) => Disposition::Ack(AckReason::Failed),
        Claim::Cancelled(_) => Disposition::Ack(AckReason::Cancelled),
        Claim::NotFound => Disposition::Ack(AckReason::NotFound),
        Claim::Busy { until } => retry_at(until, RetryReason::Busy),
        Claim::Backoff { not_before } => retry_at(not_before, RetryReason::Backoff),
    })
}

/// A refused write that still settles the task for good: acknowledge.
pub(crate) fn terminal_ack(rejection: &Rejection) -> Option<Disposition> {
    match rejection {
        Rejection::AlreadyCompleted(_) | Rejection::NotRunning(Status::Completed) => {
            Some(Disposition::Ack(AckReason::CompletedElsewhere))
        }
        Rejection::NotRunning(Status::Failed) => Some(Disposition::Ack(AckReason::Failed)),
        Rejection::NotRunning(Status::Cancelled) => Some(Disposition::Ack(AckReason::Cancelled)),
        _ => None,
    }
}

/// The disposition of a refused complete or fail.
pub(crate) fn rejected(rejection: Rejection) -> Disposition {
    terminal_ack(&rejection).unwrap_or(Disposition::Leave(LeaveReason::Rejected(rejection)))
}

/// What the work function gets: the task, its lease, the lease-lost signal,
/// and a way to record the provider's operation id.
///
/// ```
/// use taskfence::{runtime::WorkContext, Failure, Response};
/// async fn work(ctx: WorkContext) -> Result<Response, Failure> {
///     tokio::select! {
///         // the provider call
///         answer = async { Ok(Response::from("…")) } => answer,
///         // another worker owns the task now: stop paying for this call
///         _ = ctx.lease_lost() => Err(Failure::retryable("lease lost")),
///     }
/// }
/// ```
#[derive(Clone)]
pub struct WorkContext {
    store: Arc<dyn TaskStore>,
    lease: Lease,
    lost: watch::Receiver<bool>,
}

impl std::fmt::Debug for WorkContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkContext")
            .field("lease", &self.lease)
            .field("lease_lost", &self.is_lease_lost())
            .finish_non_exhaustive()
    }
}

impl WorkContext {
    /// The task as claimed: payload, policy, attempts.
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// let input = &ctx.task().payload;
    /// # }
    /// ```
    pub fn task(&self) -> &Task {
        self.lease.task()
    }

    /// The lease as granted (its expiry is the first one; renewals move it on
    /// in the store).
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// println!("attempt {} of task {}", ctx.lease().attempt(), ctx.lease().task_id());
    /// # }
    /// ```
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Resolves once the lease is lost. Race the provider call against it.
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) {
    /// ctx.lease_lost().await;
    /// assert!(ctx.is_lease_lost());
    /// # }
    /// ```
    pub async fn lease_lost(&self) {
        let mut lost = self.lost.clone();
        // An error means the runtime dropped the sender: this work is abandoned too.
        let _ = lost.wait_for(|lost| *lost).await;
    }

    /// `true` once the lease is lost (check it between steps of a long job).
    ///
    /// ```
    /// # fn f(ctx: taskfence::runtime::WorkContext) {
    /// if ctx.is_lease_lost() { return; }
    /// # }
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Durably records the provider's operation id for this attempt, before the
    /// call when the provider lets you choose it (an idempotency key), right
    /// after otherwise, so a later attempt can look the operation up instead of
    /// paying for it twice. Fenced like every write of the lease.
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// let op_id = format!("{}-{}", ctx.task().id, ctx.lease().attempt());
    /// if ctx.record_operation(&op_id).await?.is_accepted() {
    ///     // call the provider with `op_id` as its idempotency key
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record_operation(&self, operation_id: &str) -> Result<Fenced<()>> {
        self.store.record_operation(&self.lease, operation_id).await
    }

    /// Records the intent to cause external effect `name` under this
    /// lease: [`TaskStore::begin_effect`].
    /// Call the provider with the key it hands out, then
    /// [`finish_effect`](Self::finish_effect).
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// use taskfence::effect::{EffectOutcome, EffectStart};
    /// match ctx.begin_effect("notify-user").await?.into_result() {
    ///     Ok(EffectStart::Call { key, .. }) => {
    ///         // POST the webhook with `Idempotency-Key: {key}`, then:
    ///         ctx.finish_effect("notify-user", EffectOutcome::done_without_reference()).await?;
    ///     }
    ///     Ok(EffectStart::Done(_)) => { /* an earlier attempt sent it */ }
    ///     Ok(EffectStart::Stop(effect)) => { /* return Err(effect.ambiguous_failure()) from the work */ }
    ///     Ok(_) => {}
    ///     Err(rejection) => { /* the lease is gone: stop working */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn begin_effect(&self, name: &str) -> Result<Fenced<EffectStart>> {
        self.store.begin_effect(&self.lease, name).await
    }

    /// Records the outcome of effect `name`, begun by this attempt:
    /// [`TaskStore::finish_effect`].
    ///
    /// ```
    /// # async fn f(ctx: taskfence::runtime::WorkContext) -> taskfence::Result<()> {
    /// use taskfence::effect::EffectOutcome;
    /// ctx.finish_effect("charge-card", EffectOutcome::done("ch_123")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn finish_effect(&self, name: &str, outcome: EffectOutcome) -> Result<Fenced<Effect>> {
        self.store.finish_effect(&self.lease, name, outcome).await
    }
}
