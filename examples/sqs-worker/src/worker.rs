//! The SQS worker: taskfence's [`Consumer`] fed by the queue ([`SqsSource`])
//! and running [`work`]. The consumer claims each receive in one
//! `claim_many`, renews the leases, saves the responses and stops
//! gracefully; the source turns what became of each message into SQS calls.
//! Those go out ten per batch request from a task of their own, so a slow
//! SQS holds up neither the consumer nor its stop.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::error::InvalidInput;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::{
    Consumer, ConsumerConfig, Delivery, Disposition, RetryReason, Source, Stop, Stopped, WorkContext,
};
use taskfence::{ClaimRequest, Failure, Fenced, Lease, Response, TaskId, TaskStore};
use tokio::sync::{mpsc, watch};

use crate::provider::{Provider, ProviderError, ProviderRequest};
use crate::queue::{MAX_BATCH, SqsQueue};

/// Counters a worker fleet shares: what the queue delivered and what became
/// of each delivery.
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
    /// Deliveries of a message that this fleet was still handling: a visibility
    /// timeout ran out mid-work. Zero when the extensions keep up.
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
    pub fn dispositions(&self) -> BTreeMap<&'static str, u64> {
        self.dispositions.lock().unwrap().clone()
    }

    /// How many times each task's response was saved by this fleet (must be 1).
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
struct InFlight {
    stats: Arc<Stats>,
    message_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.in_flight.lock().unwrap().remove(&self.message_id);
    }
}

/// How one worker receives, hides and stops.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Tasks worked on at once.
    pub concurrency: usize,
    /// Long-poll wait of each receive (at most 20 s). A stop abandons a
    /// receive in flight: the messages it took come back after
    /// `lease + visibility_slack`.
    pub poll_wait: Duration,
    /// How long past the lease a held message stays hidden. When the worker
    /// dies, the message reappears about `lease + slack` later, when the lease
    /// has expired and a new claim can take over.
    pub visibility_slack: Duration,
    /// After a stop request, how long the work in hand may take to finish.
    /// The tasks still being worked on then are released (pending again, the
    /// attempt counted) and their messages made visible at once.
    pub shutdown_grace: Duration,
    /// After the grace, how long releasing and the last store and SQS calls
    /// may take: a stop never takes longer than grace + this.
    pub release_deadline: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            poll_wait: Duration::from_secs(1),
            visibility_slack: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(20),
            release_deadline: Duration::from_secs(5),
        }
    }
}

/// An SQS call waiting to be sent for one message. Ordered: of two calls
/// for one message in a batch, the greater is sent (a settlement beats a
/// renewal's extension from just before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Hidden this much longer (a renewed lease).
    Extend(Duration),
    /// Visible again after this delay (a retry's wait, 0 for a release).
    Show(Duration),
    Delete,
}

/// The store's answer to each release, by task, until the delivery of the
/// released task settles and says whether the store accepted it. Installed
/// by [`SqsWorker::new`] as an [`Intercept`] on the store.
#[derive(Clone, Default)]
struct Releases(Arc<Mutex<HashMap<TaskId, Result<(), String>>>>);

impl Releases {
    /// `(accepted, refusal)` of the release of `task`: the store's
    /// rejection or error when it did not accept it.
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
        let noted = match &answer {
            Ok(Fenced::Accepted(())) => Ok(()),
            Ok(Fenced::Rejected(rejection)) => Err(format!("refused: {rejection}")),
            Err(error) => Err(format!("store error: {error}")),
        };
        self.0.lock().unwrap().insert(task, noted);
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

/// An SQS queue whose messages name task ids, as the consumer's [`Source`].
pub struct SqsSource {
    queue: SqsQueue,
    poll_wait: Duration,
    slack: Duration,
    stats: Arc<Stats>,
    releases: Releases,
    actions: mpsc::UnboundedSender<(String, Action)>,
    stopping: watch::Receiver<bool>,
}

/// One delivery as [`SqsSource`] hands it to the consumer: the message's
/// receipt handle and task, and its in-flight mark.
#[derive(Clone)]
pub struct Receipt {
    handle: String,
    task: TaskId,
    _in_flight: Arc<InFlight>,
}

impl SqsSource {
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
        let messages = tokio::select! {
            received = self.queue.receive(max.min(MAX_BATCH), self.poll_wait, hide_for) => {
                received.map_err(taskfence::Error::Storage)?
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
async fn send_actions(
    queue: SqsQueue,
    mut actions: mpsc::UnboundedReceiver<(String, Action)>,
    stats: Arc<Stats>,
) {
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

/// An SQS worker: a taskfence [`Consumer`] of an [`SqsSource`], running
/// [`work`] with the provider on every task it acquires.
pub struct SqsWorker {
    consumer: Consumer<SqsSource>,
    provider: Arc<dyn Provider>,
    queue: SqsQueue,
    stats: Arc<Stats>,
    actions: mpsc::UnboundedReceiver<(String, Action)>,
    stopping: watch::Sender<bool>,
    stop_within: Duration,
}

impl SqsWorker {
    /// A worker `worker_id` consuming `queue`, holding leases of `lease` on
    /// the tasks of `store` and calling `provider`.
    pub fn new(
        queue: SqsQueue,
        store: Arc<dyn TaskStore>,
        provider: Arc<dyn Provider>,
        worker_id: impl Into<String>,
        lease: Duration,
        settings: &WorkerSettings,
        stats: Arc<Stats>,
    ) -> Result<Self, InvalidInput> {
        let config = ConsumerConfig::new(worker_id, lease)
            .concurrency(settings.concurrency)
            // Claim only what can start now: a claim is an attempt of the
            // task's budget, and an idle worker elsewhere could take it.
            .prefetch(0)
            .stop_after(settings.shutdown_grace, settings.release_deadline);
        let (sender, actions) = mpsc::unbounded_channel();
        let (stopping, stopping_rx) = watch::channel(false);
        let releases = Releases::default();
        let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(store, releases.clone()));
        let source = SqsSource {
            queue: queue.clone(),
            poll_wait: settings.poll_wait,
            slack: settings.visibility_slack,
            stats: Arc::clone(&stats),
            releases,
            actions: sender,
            stopping: stopping_rx,
        };
        Ok(Self {
            consumer: Consumer::new(store, source, config)?,
            provider,
            queue,
            stats,
            actions,
            stopping,
            stop_within: settings.shutdown_grace + settings.release_deadline,
        })
    }

    /// The stop switch: the first [`Stop::request`] stops receiving and lets
    /// the work in hand finish within the grace, then releases what remains;
    /// a second one releases at once.
    pub fn stop(&self) -> &Stop {
        self.consumer.stop()
    }

    /// Runs until stopped; returns within grace + release deadline of the
    /// stop request, the last deletes and visibility changes sent if SQS
    /// answers in time (else those messages come back on their own).
    /// Dropping it instead abandons the work in hand mid-flight.
    pub async fn run(self) -> taskfence::Result<Stopped> {
        let Self {
            consumer,
            provider,
            queue,
            stats,
            actions,
            stopping,
            stop_within,
        } = self;
        let mut sending = tokio::spawn(send_actions(queue, actions, stats));
        let stop = consumer.stop().clone();
        let run = consumer.run(move |ctx| work(ctx, Arc::clone(&provider)));
        tokio::pin!(run);
        let stop_by = tokio::select! {
            stopped = &mut run => return stopped,
            () = requested(&stop) => tokio::time::Instant::now() + stop_within,
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

/// Resolves once a stop is requested (`Stop` offers no wait of its own).
async fn requested(stop: &Stop) {
    while !stop.is_requested() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The work: record the operation id, call the provider, stop if the lease is lost.
pub async fn work(ctx: WorkContext, provider: Arc<dyn Provider>) -> Result<Response, Failure> {
    let task = ctx.task();
    let request = ProviderRequest {
        task_id: task.id,
        attempt: ctx.lease().attempt(),
        idempotency_key: task.id.to_string(),
        prompt: String::from_utf8_lossy(&task.payload).into_owned(),
    };
    // Save the operation id *before* the call: if this worker dies after the
    // provider accepted the request, the next attempt can find it in
    // `attempts()` and look the operation up (or reuse the key) instead of
    // paying twice. A refusal here means the lease is gone: do not call at all.
    match ctx.record_operation(&request.idempotency_key).await {
        Ok(Fenced::Accepted(())) => {}
        Ok(Fenced::Rejected(rejection)) => {
            return Err(Failure::retryable(format!(
                "not calling the provider: {rejection}"
            )));
        }
        Err(error) => {
            return Err(Failure::retryable(format!(
                "could not record the operation: {error}"
            )));
        }
    }
    tokio::select! {
        answer = provider.generate(&request) => answer.map(Response::from).map_err(ProviderError::into_failure),
        // Another worker owns the task now; our answer could not be saved anyway.
        _ = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
    }
}
