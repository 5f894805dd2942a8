//! The queue as the source of taskfence's [`Consumer`](taskfence::runtime::Consumer):
//! [`SqsSource`] turns receives into deliveries and what became of each
//! delivery into SQS calls, which go out ten per batch request from a task
//! of their own ([`Calls::send`]), so a slow SQS holds up neither the
//! consumer nor its stop. [`Stats`] counts what happened.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{Delivery, Disposition, RetryReason, Source};
use taskfence::{ClaimRequest, Fenced, Lease, Response, TaskId, TaskStore};
use tokio::sync::{mpsc, watch};

use crate::queue::{MAX_BATCH, SqsQueue};

/// Counters a worker (or a fleet of them sharing one) keeps: what the queue
/// delivered and what became of each delivery. For logs, metrics and tests.
///
/// ```
/// use std::sync::atomic::Ordering;
/// let stats = taskfence_sqs::Stats::default();
/// assert_eq!(stats.deliveries.load(Ordering::Relaxed), 0);
/// assert!(stats.dispositions().is_empty());
/// ```
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages received (every redelivery counts).
    pub deliveries: AtomicU64,
    /// Second copies of a task in one receive: the consumer acknowledges them
    /// without a claim (the first copy stands for both).
    pub copies: AtomicU64,
    /// Visibility extensions made after lease renewals.
    pub extensions: AtomicU64,
    /// Visibility extensions SQS refused or that failed.
    pub extension_errors: AtomicU64,
    /// Deliveries of a message that this worker (or fleet) was still
    /// handling: a visibility timeout ran out mid-work. Zero when the
    /// extensions keep up.
    pub redelivered_in_flight: AtomicU64,
    /// Deliveries left because the store failed (`leave.store_failed`).
    pub store_errors: AtomicU64,
    /// Messages whose body is not a task id (deleted).
    pub malformed: AtomicU64,
    /// Releases at a stop that the store refused (the lease was superseded
    /// or had expired, the task cancelled) or did not answer: each is logged
    /// (`released … accepted=false refusal=…`); its lease runs out on its own.
    pub releases_refused: AtomicU64,
    dispositions: Mutex<BTreeMap<&'static str, u64>>,
    saved_by_task: Mutex<HashMap<TaskId, u32>>,
    in_flight: Mutex<HashSet<String>>,
}

impl Stats {
    /// Count of each disposition, by name (`ack.completed`, `retry.busy`,
    /// `retry.released`, `leave.lease_lost`…).
    ///
    /// ```
    /// let stats = taskfence_sqs::Stats::default();
    /// assert_eq!(stats.dispositions().get("ack.completed"), None);
    /// ```
    pub fn dispositions(&self) -> BTreeMap<&'static str, u64> {
        self.dispositions.lock().unwrap().clone()
    }

    /// How many times each task's response was saved through these stats
    /// (one saved response per task: never more than 1).
    ///
    /// ```
    /// let stats = taskfence_sqs::Stats::default();
    /// assert!(stats.saved_by_task().values().all(|&n| n == 1));
    /// ```
    pub fn saved_by_task(&self) -> HashMap<TaskId, u32> {
        self.saved_by_task.lock().unwrap().clone()
    }

    fn count(&self, disposition: &Disposition, task: TaskId) {
        use taskfence::runtime::{AckReason as A, Disposition as D, LeaveReason as L, RetryReason as R};
        let name = match disposition {
            D::Ack(A::Completed) => "ack.completed",
            D::Ack(A::AlreadyCompleted) => "ack.already_completed",
            D::Ack(A::CompletedElsewhere) => "ack.completed_elsewhere",
            D::Ack(A::Failed) => "ack.failed",
            D::Ack(A::Cancelled) => "ack.cancelled",
            D::Ack(A::NotFound) => "ack.not_found",
            D::Ack(_) => "ack.other",
            D::RetryAfter { reason: R::Busy, .. } => "retry.busy",
            D::RetryAfter {
                reason: R::Backoff, ..
            } => "retry.backoff",
            D::RetryAfter {
                reason: R::Scheduled { .. },
                ..
            } => "retry.scheduled",
            D::RetryAfter {
                reason: R::Released, ..
            } => "retry.released",
            D::RetryAfter { .. } => "retry.other",
            D::Leave(L::LeaseLost(_)) => "leave.lease_lost",
            D::Leave(L::Rejected(_)) => "leave.rejected",
            D::Leave(L::StoreFailed) => "leave.store_failed",
            D::Leave(_) => "leave.other",
        };
        *self.dispositions.lock().unwrap().entry(name).or_default() += 1;
        match disposition {
            D::Ack(A::Completed) => *self.saved_by_task.lock().unwrap().entry(task).or_default() += 1,
            D::Leave(L::StoreFailed) => {
                self.store_errors.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Marks `message_id` as being handled until the mark drops.
    fn track(self: &Arc<Self>, message_id: &str) -> InFlight {
        if !self.in_flight.lock().unwrap().insert(message_id.to_owned()) {
            self.redelivered_in_flight.fetch_add(1, Ordering::Relaxed);
        }
        InFlight {
            stats: Arc::clone(self),
            message_id: message_id.to_owned(),
        }
    }
}

/// A message being handled; dropped with the last copy of its [`Receipt`]
/// (settled, or dropped by a consumer that stopped or was killed).
#[derive(Debug)]
struct InFlight {
    stats: Arc<Stats>,
    message_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.in_flight.lock().unwrap().remove(&self.message_id);
    }
}

/// An SQS call waiting to be sent for one message. Ordered: of two calls
/// for one message in a batch, the greater is sent (a settlement beats a
/// renewal's extension from just before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Action {
    /// Hidden this much longer (a renewed lease).
    Extend(Duration),
    /// Visible again after this delay (a retry's wait, 0 for a release).
    Show(Duration),
    Delete,
}

/// The store's answer to each release, by task, until the delivery of the
/// released task settles and says whether the store accepted it. Installed
/// on the store by [`SqsSource::watch_releases`].
#[derive(Debug, Clone, Default)]
struct Releases(Arc<Mutex<HashMap<TaskId, Result<(), String>>>>);

impl Releases {
    /// `(accepted, refusal)` of the release of `task`: the store's
    /// rejection or error when it did not accept it.
    /// Keeps the store's answer to the release of `task`.
    fn note(&self, task: TaskId, answer: &taskfence::Result<Fenced<()>>) {
        let noted = match answer {
            Ok(Fenced::Accepted(())) => Ok(()),
            Ok(Fenced::Rejected(rejection)) => Err(format!("refused: {rejection}")),
            Err(error) => Err(format!("store error: {error}")),
        };
        self.0.lock().unwrap().insert(task, noted);
    }

    fn take(&self, task: TaskId) -> (bool, Option<String>) {
        match self.0.lock().unwrap().remove(&task) {
            Some(Ok(())) => (true, None),
            Some(Err(refusal)) => (false, Some(refusal)),
            None => (false, Some("the store gave no answer".to_owned())),
        }
    }
}

#[async_trait]
impl Intercept for Releases {
    async fn release(&self, inner: &dyn TaskStore, lease: Lease) -> taskfence::Result<Fenced<()>> {
        let task = lease.task_id();
        let answer = inner.release(lease).await;
        self.note(task, &answer);
        answer
    }
    // A claim given back before its work began: its answer is reported alike.
    async fn release_unstarted(&self, inner: &dyn TaskStore, lease: Lease) -> taskfence::Result<Fenced<()>> {
        let task = lease.task_id();
        let answer = inner.release_unstarted(lease).await;
        self.note(task, &answer);
        answer
    }
    // The store's native batches, not `Intercept`'s one-by-one defaults.
    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> taskfence::Result<Vec<taskfence::Claim>> {
        inner.claim_many(ids, request).await
    }
    async fn complete_many(
        &self,
        inner: &dyn TaskStore,
        completions: Vec<(Lease, Response)>,
    ) -> taskfence::Result<Vec<taskfence::Result<Fenced<taskfence::Task>>>> {
        inner.complete_many(completions).await
    }
    async fn renew_many(
        &self,
        inner: &dyn TaskStore,
        leases: &mut [Lease],
        extend_by: Duration,
    ) -> taskfence::Result<Vec<Fenced<()>>> {
        inner.renew_many(leases, extend_by).await
    }
}

/// The queue of SQS calls from the source to [`send_actions`].
pub(crate) type Actions = mpsc::UnboundedReceiver<(String, Action)>;

/// An SQS queue whose messages name task ids, as the consumer's [`Source`].
///
/// What it does with each delivery:
///
/// - **receive**: up to ten messages, hidden for the lease plus the slack
///   from the receive on (so the claim and the first renewal come well
///   within it); a body that is not a task id is deleted (`malformed`).
/// - **acknowledged** (the store durably settled the task: saved, failed
///   for good, cancelled, gone): deleted. Only then, so a crash before the
///   save never loses the work.
/// - **retry after a delay** (backoff, another worker's lease, a release):
///   made visible after that delay.
/// - **left** (the lease was lost, the store failed): nothing; the
///   message's own timer brings it back and the next claim decides.
/// - **renewed**: hidden for the lease plus the slack from now.
///
/// Build it with [`SqsWorker`](crate::SqsWorker), which also sends its calls
/// and bounds its stop; use it alone only with a consumer of your own:
///
/// ```no_run
/// # fn f(queue: taskfence_sqs::SqsQueue) {
/// let (source, calls) = taskfence_sqs::SqsSource::new(queue, &taskfence_sqs::WorkerConfig::default(), Default::default());
/// // Consumer::new(store, source, config)… and, beside it:
/// tokio::spawn(calls.send());
/// # }
/// ```
#[derive(Debug)]
pub struct SqsSource {
    queue: SqsQueue,
    poll_wait: Duration,
    slack: Duration,
    stats: Arc<Stats>,
    releases: Releases,
    actions: mpsc::UnboundedSender<(String, Action)>,
    stopping: watch::Receiver<bool>,
}

/// The SQS calls an [`SqsSource`] queued, to be sent by [`send`](Self::send)
/// beside the consumer; and the switch that abandons a receive in flight
/// ([`abandon_receive`](Self::abandon_receive)).
///
/// ```no_run
/// # fn f(queue: taskfence_sqs::SqsQueue) {
/// let (source, calls) = taskfence_sqs::SqsSource::new(queue, &Default::default(), Default::default());
/// calls.abandon_receive();
/// # }
/// ```
#[derive(Debug)]
pub struct Calls {
    pub(crate) queue: SqsQueue,
    pub(crate) actions: Actions,
    pub(crate) stats: Arc<Stats>,
    pub(crate) stopping: watch::Sender<bool>,
}

impl Calls {
    /// Makes the source's receive in flight (and every later one) return
    /// no messages at once: a long poll through a slow SQS could otherwise
    /// outlast a stop's grace. The messages it took come back on their own.
    ///
    /// ```no_run
    /// # fn f(calls: taskfence_sqs::source::Calls) {
    /// calls.abandon_receive();
    /// # }
    /// ```
    pub fn abandon_receive(&self) {
        let _ = self.stopping.send(true);
    }

    /// Sends the queued calls, up to ten per batch request, until the
    /// source is gone (dropped with its consumer) and every call went out.
    ///
    /// ```no_run
    /// # fn f(calls: taskfence_sqs::source::Calls) {
    /// let sending = tokio::spawn(calls.send());
    /// # }
    /// ```
    pub async fn send(self) {
        send_actions(self.queue, self.actions, self.stats).await;
    }
}

/// One delivery as [`SqsSource`] hands it to the consumer: the message's
/// receipt handle and task, and its in-flight mark.
///
/// ```no_run
/// # fn f(receipt: taskfence_sqs::Receipt) {
/// println!("{}", receipt.task());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Receipt {
    handle: String,
    task: TaskId,
    _in_flight: Arc<InFlight>,
}

impl Receipt {
    /// The task the message names.
    ///
    /// ```no_run
    /// # fn f(receipt: taskfence_sqs::Receipt) -> taskfence::TaskId {
    /// receipt.task()
    /// # }
    /// ```
    pub fn task(&self) -> TaskId {
        self.task
    }
}

impl SqsSource {
    /// The source on `queue`, counting into `stats`, and the [`Calls`] it
    /// queues (spawn [`Calls::send`] beside the consumer).
    ///
    /// ```no_run
    /// # fn f(queue: taskfence_sqs::SqsQueue) {
    /// use std::sync::Arc;
    /// let stats = Arc::new(taskfence_sqs::Stats::default());
    /// let (source, calls) = taskfence_sqs::SqsSource::new(queue, &Default::default(), stats);
    /// # }
    /// ```
    pub fn new(queue: SqsQueue, config: &crate::WorkerConfig, stats: Arc<Stats>) -> (Self, Calls) {
        let (sender, actions) = mpsc::unbounded_channel();
        let (stopping, stopping_rx) = watch::channel(false);
        let source = Self {
            queue: queue.clone(),
            poll_wait: config.poll_wait,
            slack: config.visibility_slack,
            stats: Arc::clone(&stats),
            releases: Releases::default(),
            actions: sender,
            stopping: stopping_rx,
        };
        let calls = Calls {
            queue,
            actions,
            stats,
            stopping,
        };
        (source, calls)
    }

    /// `store` as the consumer must see it for this source to learn whether
    /// each release at a stop was accepted (logged, and counted in
    /// [`Stats::releases_refused`] when not). [`SqsWorker`](crate::SqsWorker)
    /// does this itself.
    ///
    /// ```no_run
    /// # fn f(source: &taskfence_sqs::SqsSource, store: std::sync::Arc<dyn taskfence::TaskStore>) {
    /// let store = source.watch_releases(store);
    /// # }
    /// ```
    pub fn watch_releases(&self, store: Arc<dyn TaskStore>) -> Arc<dyn TaskStore> {
        Arc::new(Intercepted::new(store, self.releases.clone()))
    }

    fn act(&self, receipt: String, action: Action) {
        // Fails only once the worker has stopped: the message's timer decides.
        let _ = self.actions.send((receipt, action));
    }
}

#[async_trait]
impl Source for SqsSource {
    type Receipt = Receipt;

    async fn fetch(&self, max: usize, claim: &ClaimRequest) -> taskfence::Result<Vec<Delivery<Receipt>>> {
        // Hidden for the lease (and the slack) from the receive on, so the
        // claim and the first renewal come well within it.
        let hide_for = claim.lease_duration + self.slack;
        let mut stopping = self.stopping.clone();
        if *stopping.borrow() {
            return Ok(Vec::new());
        }
        let messages = tokio::select! {
            received = self.queue.receive(max.min(MAX_BATCH), self.poll_wait, hide_for) => {
                received.map_err(|e| taskfence::Error::Storage(Box::new(e)))?
            }
            _ = stopping.wait_for(|stopping| *stopping) => return Ok(Vec::new()),
        };
        let mut seen = HashSet::new();
        let mut deliveries = Vec::with_capacity(messages.len());
        for message in messages {
            self.stats.deliveries.fetch_add(1, Ordering::Relaxed);
            let Some(task) = message.task_id() else {
                // A poison message: no retry makes it a task id. (With a
                // redrive policy you could leave it for the dead-letter queue.)
                tracing::warn!(body = %message.body, "message body is not a task id; deleting it");
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                self.act(message.receipt, Action::Delete);
                continue;
            };
            if !seen.insert(task) {
                self.stats.copies.fetch_add(1, Ordering::Relaxed);
            }
            let receipt = Receipt {
                _in_flight: Arc::new(self.stats.track(&message.id)),
                handle: message.receipt,
                task,
            };
            deliveries.push(Delivery::Task(task, receipt));
        }
        Ok(deliveries)
    }

    async fn settle(&self, receipt: Receipt, disposition: Disposition) -> taskfence::Result<()> {
        tracing::debug!(task_id = %receipt.task, ?disposition, "settled");
        self.stats.count(&disposition, receipt.task);
        if let Disposition::RetryAfter {
            reason: RetryReason::Released,
            ..
        } = disposition
        {
            // Whether the store took the task back: a refused release is
            // logged and counted, never invisible.
            let (accepted, refusal) = self.releases.take(receipt.task);
            if accepted {
                tracing::info!(task_id = %receipt.task, accepted, "released");
            } else {
                self.stats.releases_refused.fetch_add(1, Ordering::Relaxed);
                let refusal = refusal.unwrap_or_default();
                tracing::warn!(task_id = %receipt.task, accepted, refusal, "released");
            }
        }
        match disposition {
            // The store durably settled the task (saved or terminal): now, and
            // only now, the message may go.
            Disposition::Ack(_) => self.act(receipt.handle, Action::Delete),
            // Hidden until a claim can succeed (backoff over, the other lease
            // run out), or visible at once for another worker (released).
            Disposition::RetryAfter { delay, .. } => self.act(receipt.handle, Action::Show(delay)),
            // This worker no longer holds the task: the message's own timer
            // brings it back and the next claim decides.
            Disposition::Leave(_) => {}
        }
        Ok(())
    }

    async fn renewed(&self, receipts: Vec<&Receipt>, lease_duration: Duration) {
        for receipt in receipts {
            self.act(
                receipt.handle.clone(),
                Action::Extend(lease_duration + self.slack),
            );
        }
    }
}

/// Sends the queued SQS calls, up to ten per batch request, until the source
/// is gone. A failed call is harmless: the message comes back and its claim
/// answers from the durable task.
pub(crate) async fn send_actions(queue: SqsQueue, mut actions: Actions, stats: Arc<Stats>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while actions.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut calls: HashMap<&str, Action> = HashMap::new();
        for (handle, action) in &batch {
            calls
                .entry(handle.as_str())
                .and_modify(|call| *call = (*call).max(*action))
                .or_insert(*action);
        }
        let (mut deletes, mut changes) = (Vec::new(), Vec::new());
        for (handle, action) in calls {
            match action {
                Action::Delete => deletes.push(handle),
                Action::Show(after) => changes.push((handle, after, false)),
                Action::Extend(by) => changes.push((handle, by, true)),
            }
        }
        if !deletes.is_empty() {
            match queue.delete_batch(&deletes).await {
                Ok(failed) if failed.is_empty() => {}
                Ok(failed) => tracing::warn!(failed = failed.len(), "SQS refused some deletes"),
                Err(error) => tracing::warn!(%error, "deleting messages failed"),
            }
        }
        if !changes.is_empty() {
            let entries: Vec<_> = changes.iter().map(|&(handle, hide, _)| (handle, hide)).collect();
            let failed = match queue.change_visibility(&entries).await {
                Ok(failed) if failed.is_empty() => failed,
                Ok(failed) => {
                    tracing::warn!(failed = failed.len(), "SQS refused some visibility changes");
                    failed
                }
                Err(error) => {
                    tracing::warn!(%error, "changing visibility failed");
                    (0..changes.len()).collect()
                }
            };
            let extensions = changes.iter().filter(|c| c.2).count() as u64;
            let failed = failed
                .iter()
                .filter(|&&i| changes.get(i).is_some_and(|c| c.2))
                .count() as u64;
            stats.extensions.fetch_add(extensions - failed, Ordering::Relaxed);
            stats.extension_errors.fetch_add(failed, Ordering::Relaxed);
        }
        batch.clear();
    }
}
